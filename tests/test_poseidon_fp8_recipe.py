"""fp8 scaling recipes: delayed scaling takes each tensor's scale from earlier iterations' amax history;
current scaling (Megatron-LM's --fp8-recipe tensorwise, Megatron-Bridge's FP8-CS, torchao's float8)
reads each fp8 GEMM input once more for its amax before the cast. Checked against the bytes of that
pass, in the blocks and in the optimizer step's weight casts, and through the CLI, check and export."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon import cost as C


def _problem(**extra: object) -> P.PoseidonProblem:
    return gpuplan.load_problem({"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8},
                                 "model": "llama2-13b", "global_batch": 64, "seq_len": 4096, "dtype": "fp8",
                                 **extra})  # type: ignore[return-value]


def _ops(problem: P.PoseidonProblem, tp: int = 2) -> dict[str, C.OpTime]:
    cm = P.CostModel(problem)
    dev = cm.dev("H100")
    return {o.name: o for o in C.layer_ops(cm.cfg, dev, "fp8", tp, 1, 4096, cm.opts, lambda op, s: 0.0)}


def test_current_scaling_adds_one_read_of_each_linear_input_and_output_gradient() -> None:
    delayed, current = _problem(), _problem(fp8_recipe="current")
    d, c = _ops(delayed), _ops(current)
    cfg = delayed.model
    dev = P.CostModel(delayed).dev("H100")
    T, tp = 4096, 2
    qkv = (cfg.heads + 2 * cfg.kv) * cfg.dhead // tp
    ffn = cfg.ffn_hidden // tp
    # (input width, output width) of the four linears on one TP rank, without sequence parallelism's split
    widths = {"QKV GEMM": (cfg.hidden, qkv), "attention output GEMM": (cfg.heads * cfg.dhead // tp, cfg.hidden),
              "MLP in GEMM": (cfg.hidden, 2 * ffn), "MLP out GEMM": (ffn, cfg.hidden)}
    for name, (n_in, n_out) in widths.items():
        assert c[name].forward_s - d[name].forward_s == pytest.approx(C.memory_s(dev, T * n_in * C.FP8_AMAX_BYTES))
        assert c[name].backward_s - d[name].backward_s == pytest.approx(
            C.memory_s(dev, T * n_out * C.FP8_AMAX_BYTES))
    for name in d.keys() - widths.keys():  # attention, norms, activations, collectives: no fp8 cast
        assert (c[name].forward_s, c[name].backward_s) == (d[name].forward_s, d[name].backward_s)


def test_current_scaling_reads_the_weights_once_more_in_the_step_and_costs_time_not_memory() -> None:
    delayed, current = P.CostModel(_problem()), P.CostModel(_problem(fp8_recipe="current"))
    shape = P.StageShape("H100", 2, 8, tuple(range(16)), ("H100-0", "H100-1"))
    extra = current.optimizer_step_s(shape, 10, False, False, 2) - delayed.optimizer_step_s(shape, 10, False, False, 2)
    params = 10 * delayed.cfg.layer_params() / 2
    assert extra == pytest.approx(C.memory_s(delayed.dev("H100"), params * C.FP8_AMAX_BYTES), rel=1e-9)
    config = {"tp": 2, "pp": 2, "dp": 4, "mb": 1, "recompute": "none"}
    slow = gpuplan.evaluate_config(_problem(fp8_recipe="current"), config)
    fast = gpuplan.evaluate_config(_problem(), config)
    assert slow.iteration_time_s > fast.iteration_time_s
    assert [s.memory_bytes for s in slow.stages] == [s.memory_bytes for s in fast.stages]


def test_the_recipe_needs_fp8() -> None:
    with pytest.raises(gpuplan.InputError, match="fp8_recipe"):
        _problem(dtype="bf16", fp8_recipe="current")
    with pytest.raises(gpuplan.InputError, match="fp8_recipe"):
        _problem(fp8_recipe="mxfp8")


def test_cli_solve_check_evaluate_and_the_assumptions_line(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["solve", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq", "4096",
                                  "--dtype", "fp8", "--fp8-recipe", "current", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["problem"]["fp8_recipe"] == "current"
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0
    e = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq", "4096",
                                  "--dtype", "fp8", "--fp8-recipe", "current", "--config", "tp=2,pp=2,dp=4,mb=1"])
    assert e.exit_code == 0, e.output
    assert "current scaling" in e.output


def test_megatron_export_names_the_recipe(tmp_path: Path) -> None:
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import megatron
    from gpuplan.export.common import training_job

    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "gpt3-1.3b",
           "global_batch": 16, "seq_len": 1024, "dtype": "fp8", "fp8_recipe": "current"}
    write_bundle(tmp_path / "b", compose(gpuplan.evaluate_config(doc, "tp=2,pp=1,dp=2,mb=1"), time_limit_s=3))
    args = megatron.export(tmp_path / "b")["args"]
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    job = training_job(tmp_path / "b", "Megatron-LM")
    delayed = megatron.job_args(dataclasses.replace(job, fp8_recipe="delayed"))
    assert delayed[delayed.index("--fp8-recipe") + 1] == "delayed"
