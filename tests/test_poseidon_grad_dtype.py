"""The data-parallel gradients' dtype (`grad_reduce_in_fp32`): Megatron-LM's defaults and memory formula,
what the field moves (memory, reductions, the weight-gradient epilogue, the step), its refusals, the CLI
and the exports that carry it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import gpuplan
from gpuplan import api
from gpuplan.cli import main
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon import StageShape

CONFIG = "tp=2,pp=2,dp=4,mb=1,recompute=full"


def problem(**extra: object) -> P.PoseidonProblem:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8}, "model": "llama2-7b",
           "global_batch": 64, "seq_len": 2048, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


def megatron_weight_and_optimizer_bytes(distributed_optimizer: bool, dp: int) -> float:
    """Megatron-LM's theoretical_memory_usage.compute_weight_and_optimizer_memory, bytes per parameter of
    the most loaded shard: 18 (bf16 weight, fp32 gradient, fp32 main weight and two moments), or 6 + 12 / dp
    with the distributed optimizer."""
    return 6 + 12 / dp if distributed_optimizer else 18


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("distributed", [False, True])
@pytest.mark.parametrize("dp", [1, 4, 32])
def test_megatrons_default_holds_what_its_memory_formula_counts(dtype: str, distributed: bool, dp: int) -> None:
    cm = P.CostModel(problem(dtype=dtype, distributed_optimizer=distributed))
    assert cm.grad_bytes == 4.0
    assert cm.param_bytes(dp) == pytest.approx(megatron_weight_and_optimizer_bytes(distributed, dp), rel=1e-12)


@pytest.mark.parametrize("dtype, fsdp, field, want", [
    ("bf16", False, None, 4.0), ("fp8", False, None, 4.0), ("fp16", False, None, 2.0), ("fp32", False, None, 4.0),
    ("bf16", True, None, 4.0), ("fp16", True, None, 4.0),
    ("bf16", False, False, 2.0), ("fp8", True, False, 2.0), ("fp16", False, True, 4.0), ("fp32", False, True, 4.0)])
def test_the_default_follows_the_trainer(dtype: str, fsdp: bool, field: bool | None, want: float) -> None:
    assert P.grad_reduce_bytes(dtype, fsdp, field) == want


def test_16_bit_gradients_halve_the_buffer_the_reduction_and_the_accumulation() -> None:
    fp32 = problem(distributed_optimizer=True, overlap_dp_allreduce=False)
    bf16 = problem(distributed_optimizer=True, overlap_dp_allreduce=False, grad_reduce_in_fp32=False)
    a, b = gpuplan.evaluate_config(fp32, CONFIG), gpuplan.evaluate_config(bf16, CONFIG)
    cm32, cm16 = P.CostModel(fp32), P.CostModel(bf16)
    assert (cm32.grad_bytes, cm16.grad_bytes) == (4.0, 2.0)
    assert (cm32.opts.wgrad_out_bytes, cm16.opts.wgrad_out_bytes) == (8.0, 4.0)  # read + write per element
    shapes = P.shapes_of(a)
    for s, (x, y) in enumerate(zip(a.stages, b.stages)):
        params = cm32.stage_params(x.num_layers, s == 0, s == len(a.stages) - 1, len(a.stages)) / shapes[s].tp
        assert x.memory_bytes - y.memory_bytes == pytest.approx(2.0 * params, rel=1e-9)
        # the reduce-scatter moves half the bytes; the weights' all-gather is the same
        sh = shapes[s]
        rs32 = cm32.dp_collective_s(sh, "reduce_scatter", 4.0 * params, 4)
        rs16 = cm16.dp_collective_s(sh, "reduce_scatter", 2.0 * params, 2)
        tied32, tied16 = (cm32.tied_s(shapes), cm16.tied_s(shapes)) if s in (0, len(a.stages) - 1) else (0.0, 0.0)
        assert x.allreduce_s - y.allreduce_s == pytest.approx(rs32 - rs16 + tied32 - tied16, rel=1e-9)
        assert rs16 < rs32
        # the weight-gradient epilogue moves 4 B instead of 8 (hidden under the math on Hopper's large GEMMs)
        assert y.backward_s <= x.backward_s
        assert y.optimizer_s > 0
    assert b.iteration_time_s < a.iteration_time_s
    assert api.check(None, a) == [] and api.check(None, b) == []


def test_the_accumulation_costs_on_amperes_serial_epilogue() -> None:
    a100 = {"cluster": {"gpus": {"A100-80GB": 16}, "gpus_per_node": 8}}
    fp32 = gpuplan.evaluate_config(problem(**a100), CONFIG)
    bf16 = gpuplan.evaluate_config(problem(**a100, grad_reduce_in_fp32=False), CONFIG)
    assert all(y.backward_s < x.backward_s for x, y in zip(fp32.stages, bf16.stages))


def test_fp16_copies_its_16_bit_gradients_into_fp32_in_the_step() -> None:
    fp16, fp16_fp32 = P.CostModel(problem(dtype="fp16")), P.CostModel(problem(dtype="fp16", grad_reduce_in_fp32=True))
    # the copy (read 2, write 4) and zeroing 2 instead of 4: 4 B more per parameter
    assert fp16.optimizer_step_bytes_per_param() - fp16_fp32.optimizer_step_bytes_per_param() == pytest.approx(4.0)
    assert fp16.param_bytes(1) == 2 + 2 + 12 and fp16_fp32.param_bytes(1) == 2 + 4 + 12


def test_fsdp_reduces_in_the_fields_dtype_and_keeps_its_shards() -> None:
    shape = StageShape("H100", 1, 16, tuple(range(16)), ("n0", "n1"))
    fp32, bf16 = P.CostModel(problem(fsdp=True)), P.CostModel(problem(fsdp=True, grad_reduce_in_fp32=False))
    elems = fp32.cfg.layer_params()
    assert fp32.fsdp_layer_s(shape)[1] == pytest.approx(fp32.dp_collective_s(shape, "reduce_scatter", 4 * elems, 4))
    assert bf16.fsdp_layer_s(shape)[1] == pytest.approx(bf16.dp_collective_s(shape, "reduce_scatter", 2 * elems, 2))
    assert fp32.param_bytes(16) == bf16.param_bytes(16)  # FSDP2's fp32 shard keeps an fp32 gradient either way
    assert fp32.fsdp_working_bytes(1) - bf16.fsdp_working_bytes(1) == pytest.approx(2 * elems)


def test_fp32_training_cannot_reduce_in_16_bits() -> None:
    with pytest.raises(gpuplan.InputError, match="grad_reduce_in_fp32"):
        problem(dtype="fp32", grad_reduce_in_fp32=False)


def _bundle(tmp: Path, doc: dict, config: str) -> Path:
    from gpuplan.compose import compose, write_bundle

    write_bundle(tmp / "bundle", compose(gpuplan.evaluate_config(doc, config), time_limit_s=3))
    return tmp / "bundle"


DOC = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 8}}]}, "model": "llama3-8b",
       "global_batch": 32, "seq_len": 2048, "distributed_optimizer": True, "overlap_dp_allreduce": True}


@pytest.mark.parametrize("extra, flag", [({}, None), ({"grad_reduce_in_fp32": False}, "--grad-reduce-in-bf16"),
                                         ({"dtype": "fp16"}, None),
                                         ({"dtype": "fp16", "grad_reduce_in_fp32": True},
                                          "--accumulate-allreduce-grads-in-fp32")])
def test_the_megatron_export_states_the_gradients_and_reads_back(tmp_path: Path, extra: dict, flag: str | None) -> None:
    from gpuplan.export import megatron

    doc = {**DOC, **extra}
    plan = gpuplan.evaluate_config(doc, "tp=2,pp=1,dp=4,mb=1,recompute=full")
    args = megatron.export(_bundle(tmp_path, doc, "tp=2,pp=1,dp=4,mb=1,recompute=full"))["args"]
    stated = [a for a in args if a in ("--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32")]
    assert stated == ([flag] if flag else [])
    (tmp_path / "megatron.args").write_text("\n".join(args) + "\n")
    (tmp_path / "problem.yaml").write_text(yaml.safe_dump({k: v for k, v in doc.items()
                                                           if k not in ("global_batch", "seq_len")}))
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(tmp_path / "problem.yaml"), "--megatron-args",
                                  str(tmp_path / "megatron.args"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["iteration_time_s"] == plan.iteration_time_s


def test_the_cli_takes_the_gradients_dtype_and_states_it() -> None:
    base = ["evaluate", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq", "2048",
            "--distributed-optimizer", "--config", "tp=2,pp=2,dp=4,mb=1", "--json"]
    out = {}
    for flag in ("--grad-reduce-in-fp32", "--grad-reduce-in-16bit"):
        r = CliRunner().invoke(main, [*base, flag])
        assert r.exit_code == 0, r.output
        out[flag] = json.loads(r.output)
    assert "gradients held and reduced in fp32" in out["--grad-reduce-in-fp32"]["assumptions"]
    assert "gradients held and reduced in bf16" in out["--grad-reduce-in-16bit"]["assumptions"]
    assert out["--grad-reduce-in-16bit"]["iteration_time_s"] < out["--grad-reduce-in-fp32"]["iteration_time_s"]


def test_torchtitan_notes_a_plan_that_reduces_in_16_bits(tmp_path: Path) -> None:
    from gpuplan.export import torchtitan

    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "llama3-8b",
           "global_batch": 16, "seq_len": 1024, "fsdp": True}
    notes = {}
    for fp32 in (True, False):
        bundle = _bundle(tmp_path / str(fp32), {**doc, "grad_reduce_in_fp32": fp32}, "tp=1,pp=1,dp=4,mb=1,recompute=full")
        notes[fp32] = torchtitan.export(bundle, tmp_path / f"tt{fp32}")["notes"]
    assert [n for n in notes[False] if n not in notes[True]] == [
        n for n in notes[False] if "16 bits" in n and "mixed_precision_reduce" in n]
    assert any("mixed_precision_reduce" in n for n in notes[False])
