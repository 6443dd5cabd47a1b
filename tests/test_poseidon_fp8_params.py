"""fp8 parameters (Megatron-LM's --fp8-param-gather) and the fused cross-entropy (--cross-entropy-loss-
fusion on Transformer Engine's kernel), as Megatron-Bridge's FP8-CS recipes run them. Checked against
their bytes: the 16-bit block weights not held, the weight gathers in 1 byte per element, the 16-bit
logits with their gradient written over them; then through the CLI, check, Lagom's workload and the
Megatron-LM export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon import cost as C

CONFIG = {"tp": 2, "pp": 2, "dp": 4, "mb": 1, "recompute": "none"}


def _problem(**extra: object) -> P.PoseidonProblem:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8}, "model": "llama2-13b",
           "global_batch": 64, "seq_len": 4096, "dtype": "fp8", "distributed_optimizer": True}
    return gpuplan.load_problem({**doc, **extra})  # type: ignore[return-value]


def _shape(dp: int = 4) -> P.StageShape:
    return P.StageShape("H100", 2, dp, tuple(range(2 * dp)), ("H100-0",))


@pytest.mark.parametrize("fsdp", [False, True])
def test_fp8_params_hold_no_16_bit_block_weights(fsdp: bool) -> None:
    extra = {"fsdp": True, "distributed_optimizer": False} if fsdp else {}
    plain, fp8 = _problem(**extra), _problem(fp8_params=True, **extra)
    cfg, dp, tp = plain.model, 4, 2
    blocks = cfg.num_layers // 2 * cfg.layer_params() / tp  # block parameters on one device of a stage
    if fsdp:  # fp8 shards instead of 16-bit ones, and no fp8 copy of every block (only the gathered ones)
        saved = blocks * ((2 - 1) / dp + 2)
    else:  # the fp8 copies (weight + transpose) stay, the 16-bit weights beside them go
        saved = blocks * 2
    a = gpuplan.evaluate_config(plain, CONFIG, check_memory=False)
    b = gpuplan.evaluate_config(fp8, CONFIG, check_memory=False)
    for x, y in zip(a.stages, b.stages):
        assert x.memory_bytes - y.memory_bytes == pytest.approx(saved, rel=1e-9)
    assert P.CostModel(fp8).fp8_params_saved_bytes(_shape(), cfg.num_layers // 2) == pytest.approx(saved, rel=1e-12)


def test_the_distributed_optimizers_weight_gather_moves_one_byte_per_block_element() -> None:
    plain, fp8 = P.CostModel(_problem()), P.CostModel(_problem(fp8_params=True))
    sh, n = _shape(), 20
    size = plain.stage_params(n, False, False, 2) / 2 * 2
    blocks = n * plain.cfg.layer_params() / 2
    # the gradients' reduce-scatter in fp32 (Megatron's default with bf16 storage), the same in both
    reduce = plain.dp_collective_s(sh, "reduce_scatter", 2 * size, 4)
    assert plain.dp_exposed_s(sh, n, False, False, 2, 0.0) == pytest.approx(
        reduce + plain.dp_collective_s(sh, "all_gather", size))
    assert fp8.dp_exposed_s(sh, n, False, False, 2, 0.0) == pytest.approx(
        reduce + plain.dp_collective_s(sh, "all_gather", size - blocks))
    assert fp8.fsdp_layer_s(sh) == (0.0, 0.0)
    f_plain = P.CostModel(_problem(fsdp=True, distributed_optimizer=False))
    f_fp8 = P.CostModel(_problem(fsdp=True, distributed_optimizer=False, fp8_params=True))
    elems = plain.cfg.layer_params() / 2
    assert f_fp8.fsdp_layer_s(sh)[0] == pytest.approx(f_plain.dp_collective_s(sh, "all_gather", elems * 1.0))
    assert f_plain.fsdp_layer_s(sh)[0] == pytest.approx(f_plain.dp_collective_s(sh, "all_gather", elems * 2.0))
    assert f_fp8.fsdp_layer_s(sh)[1] == f_plain.fsdp_layer_s(sh)[1]  # the gradients stay as they were
    # FSDP2's copy-out moves the gathered fp8 weights (read 1 + write 1), and the backward transposes them
    dev = plain.dev("H100")
    assert f_fp8.fsdp_copies_s(sh) == pytest.approx((C.memory_s(dev, elems * 2.0),
                                                     C.memory_s(dev, elems * 2.0) + C.memory_s(dev, elems * 8.0)))
    assert f_plain.fsdp_copies_s(sh) == pytest.approx((C.memory_s(dev, elems * 4.0),
                                                       C.memory_s(dev, elems * 4.0) + C.memory_s(dev, elems * 6.0)))


def test_the_step_casts_the_shard_into_fp8_and_transposes_the_gathered_weights() -> None:
    plain, fp8 = P.CostModel(_problem()), P.CostModel(_problem(fp8_params=True))
    sh, n = _shape(), 20
    dev = plain.dev("H100")
    blocks = n * plain.cfg.layer_params() / 2
    # without: the 16-bit weights cast into fp8 copy + transpose (read 2, write 2); with: the fp32 shard
    # writes 1 B instead of 2, then the gathered fp8 weight's transpose (read 1, write 1)
    delta = blocks / 4 * (1 - 2) + blocks * 2 - blocks * (2 + 2)
    assert fp8.optimizer_step_s(sh, n, False, False, 2) - plain.optimizer_step_s(sh, n, False, False, 2) == \
        pytest.approx(C.memory_s(dev, delta), rel=1e-9, abs=1e-12)
    # FSDP: the shard's cast only (its gathers transpose their weights, `fsdp_copies_s`)
    f_plain = P.CostModel(_problem(fsdp=True, distributed_optimizer=False))
    f_fp8 = P.CostModel(_problem(fsdp=True, distributed_optimizer=False, fp8_params=True))
    delta = blocks / 4 * (1 - 2) - blocks * (2 + 2)
    assert f_fp8.optimizer_step_s(sh, n, False, False, 2) - f_plain.optimizer_step_s(sh, n, False, False, 2) == \
        pytest.approx(C.memory_s(dev, delta), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("extra, field", [({"dtype": "bf16"}, "fp8_params"),
                                          ({"distributed_optimizer": False}, "fp8_params")])
def test_fp8_params_need_fp8_and_a_sharded_optimizer(extra: dict[str, object], field: str) -> None:
    with pytest.raises(gpuplan.InputError, match=field):
        _problem(fp8_params=True, **extra)


def test_the_fused_cross_entropy_reads_and_writes_the_16_bit_logits_only() -> None:
    assert C.ce_bytes_per_logit(2, fused=True) == (6.0, 4.0)
    assert C.ce_bytes_per_logit(2) == (38.0, 14.0)
    plain, fused = P.CostModel(_problem()), P.CostModel(_problem(fused_cross_entropy=True))
    assert fused.logits_bytes(2, 1) * 4 == plain.logits_bytes(2, 1)
    logits = 4096 * plain.cfg.vocab / 2
    dev = plain.dev("H100")
    (pf, pb), (ff, fb) = plain.extras("H100", 2, 1, False, True), fused.extras("H100", 2, 1, False, True)
    assert pf - ff == pytest.approx(C.memory_s(dev, logits * 38.0) - C.memory_s(dev, logits * 6.0), rel=1e-9)
    assert pb - fb == pytest.approx(C.memory_s(dev, logits * 14.0) - C.memory_s(dev, logits * 4.0), rel=1e-9)
    a = gpuplan.evaluate_config(_problem(), CONFIG)
    b = gpuplan.evaluate_config(_problem(fused_cross_entropy=True), CONFIG)
    assert b.iteration_time_s < a.iteration_time_s
    assert b.stages[0].memory_bytes == a.stages[0].memory_bytes  # the first stage holds no logits
    assert a.stages[-1].memory_bytes - b.stages[-1].memory_bytes == pytest.approx(logits * 6.0)


def test_lagoms_workload_gathers_the_fp8_weights() -> None:
    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    def ops(**extra: object) -> dict[str, dict[str, object]]:
        plan = gpuplan.evaluate_config(_problem(**extra), CONFIG).model_dump(mode="json")
        return {o["name"]: o for o in workload_from_poseidon(plan)["ops"]}

    plain, fp8 = ops(), ops(fp8_params=True)
    assert fp8["dp-params"]["size_bytes"] * 2 == plain["dp-params"]["size_bytes"]
    assert fp8["dp-grads"]["size_bytes"] == plain["dp-grads"]["size_bytes"]
    fsdp = ops(fsdp=True, distributed_optimizer=False, fp8_params=True)
    assert fsdp["fsdp-gather-fwd-mb0"]["size_bytes"] * 4 == plain["dp-grads"]["size_bytes"]  # fp8 vs fp32


def test_cli_solve_check_evaluate_and_the_megatron_export(tmp_path: Path) -> None:
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import megatron

    flags = ["--dtype", "fp8", "--distributed-optimizer", "--fp8-params", "--fused-cross-entropy"]
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["solve", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq", "4096",
                                  *flags, "-o", str(out)])
    assert r.exit_code == 0, r.output
    problem = json.loads(out.read_text())["problem"]
    assert problem["fp8_params"] is True and problem["fused_cross_entropy"] is True
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0
    e = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq",
                                  "4096", *flags, "--config", "tp=2,pp=2,dp=4,mb=1"])
    assert e.exit_code == 0, e.output
    assert "gathered in fp8" in e.output and "fused cross-entropy" in e.output
    bad = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq",
                                    "4096", "--fp8-params", "--config", "tp=2,pp=2,dp=4,mb=1"])
    assert bad.exit_code == 2 and "fp8_params" in bad.output
    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "gpt3-1.3b",
           "global_batch": 16, "seq_len": 1024, "dtype": "fp8", "distributed_optimizer": True, "fp8_params": True,
           "fused_cross_entropy": True}
    write_bundle(tmp_path / "b", compose(gpuplan.evaluate_config(doc, "tp=2,pp=1,dp=2,mb=1"), time_limit_s=3))
    args = megatron.export(tmp_path / "b")["args"]
    assert "--fp8-param-gather" in args and "--cross-entropy-loss-fusion" in args
    assert args[args.index("--cross-entropy-fusion-impl") + 1] == "te"


def test_torchtitan_export_notes_the_unfused_loss(tmp_path: Path) -> None:
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import torchtitan

    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "llama3-8b",
           "global_batch": 16, "seq_len": 1024}
    notes = {}
    for fused in (False, True):
        write_bundle(tmp_path / f"b{fused}", compose(gpuplan.evaluate_config(
            {**doc, "fused_cross_entropy": fused}, "tp=2,pp=1,dp=2,mb=1,recompute=full"), time_limit_s=3))
        notes[fused] = torchtitan.export(tmp_path / f"b{fused}", tmp_path / f"tt{fused}")["notes"]
    assert [n for n in notes[True] if n not in notes[False]] == [
        n for n in notes[True] if "fused cross-entropy" in n and "fp32 logits" in n]
    assert any("fused cross-entropy" in n for n in notes[True])


def test_plan_train_takes_every_execution_setting_solve_poseidon_takes(tmp_path: Path) -> None:
    from gpuplan.commands.poseidon import EXECUTION_FIELDS

    def names(*path: str) -> set[str]:
        cmd = main
        for p in path:
            cmd = cmd.commands[p]  # type: ignore[attr-defined]
        return {p.name for p in cmd.params if p.name}

    assert set(EXECUTION_FIELDS) <= names("plan", "train")
    assert set(EXECUTION_FIELDS) <= names("solve", "poseidon") and set(EXECUTION_FIELDS) <= names("evaluate", "poseidon")
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["plan", "train", "dgx-h100x2", "llama3-8b", "--batch", "32", "--seq", "2048",
                                  "--dtype", "fp8", "--distributed-optimizer", "--fp8-recipe", "current",
                                  "--fp8-params", "--fused-cross-entropy", "--time-limit", "5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    problem = json.loads((out / "poseidon.json").read_text())["problem"]
    assert (problem["fp8_recipe"], problem["fp8_params"], problem["fused_cross_entropy"]) == ("current", True, True)
