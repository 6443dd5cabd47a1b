"""A stage's memory by part (`memory_parts`): the parts add up to what the plan states for every
configuration, none is negative, and the parameter parts follow Megatron-LM's own count; `evaluate`
and `show` print them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan import api
from gpuplan.cli import main
from gpuplan.models import poseidon as P
from gpuplan.models.workload import model_config, scaled


def problem(**extra: object) -> P.PoseidonProblem:
    cfg = scaled(model_config("llama2-7b"), num_layers=8)
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8}, "model": cfg.model_dump(),
           "global_batch": 64, "seq_len": 2048, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), mb=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full", "full:2"]), v=st.sampled_from([1, 2]),
       sharding=st.sampled_from(["none", "distopt", "fsdp"]), dtype=st.sampled_from(["bf16", "fp8"]),
       fp8_params=st.booleans(), grads32=st.sampled_from([None, True, False]))
def test_the_parts_add_up_to_the_stated_memory(tp: int, pp: int, mb: int, recompute: str, v: int, sharding: str,
                                               dtype: str, fp8_params: bool, grads32: bool | None) -> None:
    if v > 1 and pp == 1:
        v = 1
    fp8_params = fp8_params and dtype == "fp8" and sharding != "none"
    prob = problem(dtype=dtype, distributed_optimizer=sharding == "distopt", fsdp=sharding == "fsdp",
                   fp8_params=fp8_params, grad_reduce_in_fp32=grads32)
    config = {"tp": tp, "pp": pp, "dp": 16 // (tp * pp), "mb": mb, "recompute": recompute, "interleave": v}
    plan = gpuplan.evaluate_config(prob, config, check_memory=False)
    cm, shapes = P.CostModel(api.plan_problem(plan)), P.shapes_of(plan)  # type: ignore[arg-type]
    for k, (s, sh) in enumerate(zip(plan.stages, shapes)):
        parts = P.memory_parts(cm, sh, s.num_layers, s.micro_batch_size, k, len(shapes), plan.num_microbatches,
                               s.recompute, plan.interleave)
        assert list(parts) == list(P.MEMORY_PARTS)
        assert all(x >= 0 for x in parts.values()), parts
        assert sum(parts.values()) == pytest.approx(s.memory_bytes, rel=1e-12)


@pytest.mark.parametrize("distopt", [False, True])
def test_the_parameter_parts_are_megatrons_count(distopt: bool) -> None:
    plan = gpuplan.evaluate_config(problem(distributed_optimizer=distopt), "tp=2,pp=2,dp=4,mb=1,recompute=full")
    cm, shapes = P.CostModel(api.plan_problem(plan)), P.shapes_of(plan)  # type: ignore[arg-type]
    for k, (s, sh) in enumerate(zip(plan.stages, shapes)):
        params = cm.stage_params(s.num_layers, k == 0, k == len(shapes) - 1, len(shapes)) / sh.tp
        parts = P.memory_parts(cm, sh, s.num_layers, 1, k, len(shapes), plan.num_microbatches, "full")
        state = parts["weights"] + parts["gradients"] + parts["optimizer states"]
        assert state == pytest.approx(params * (6 + 12 / 4 if distopt else 18), rel=1e-12)  # bf16, fp32 gradients


def test_evaluate_and_show_print_the_parts(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--batch", "64", "--seq", "4096",
                                  "--distributed-optimizer", "--config", "tp=2,pp=2,dp=4,mb=1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "memory per device by part" in r.output and "optimizer states" in r.output
    assert "the execution assumptions the prediction rests on" in r.output
    j = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--batch", "64", "--seq", "4096",
                                  "--config", "tp=2,pp=2,dp=4,mb=1", "--json"])
    doc = json.loads(j.output)
    assert "gradients held and reduced in fp32" in doc["assumptions"]
    assert any(t["title"].startswith("memory per device by part") for t in doc["tables"])
    shown = CliRunner().invoke(main, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "memory per device by part" in shown.output


def test_a_configuration_that_does_not_fit_says_where_its_memory_goes() -> None:
    with pytest.raises(gpuplan.InfeasibleError) as err:
        gpuplan.evaluate_config({"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8},
                                 "model": "llama3-8b", "global_batch": 64, "seq_len": 8192},
                                "tp=1,pp=1,dp=16,mb=1,recompute=none")
    text = str(err.value)
    assert "needs" in text and "optimizer states" in text and "activations" in text
