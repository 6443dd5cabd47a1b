"""Poseidon plans executed with torch.distributed.pipelining on CPU processes (gloo)."""

from __future__ import annotations

import pytest

from gpuplan.models import poseidon as P
from gpuplan.models.workload import TransformerConfig

TINY = TransformerConfig(name="tiny", num_layers=4, hidden=64, heads=4, ffn_hidden=128, vocab=256, gated_mlp=False)


def two_stage(schedule: str = "1f1b") -> tuple[P.PoseidonProblem, P.PoseidonPlan]:
    doc = {"kind": "poseidon", "cluster": {
        "device_types": {"cpu": {"name": "cpu", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                                 "peak_tflops": {"fp32": 0.05}},
                         "cpu-slow": {"name": "cpu-slow", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                                      "peak_tflops": {"fp32": 0.025}}},
        "nodes": [{"name": "n0", "gpus": {"cpu": 1, "cpu-slow": 1}}]},
        "model": TINY.model_dump(), "global_batch": 8, "seq_len": 16, "dtype": "fp32", "schedule": schedule}
    prob = P.PoseidonProblem.model_validate(doc)
    shapes = [P.StageShape("cpu", 1, 1, (0,), ("n0",)), P.StageShape("cpu-slow", 1, 1, (1,), ("n0",))]
    return prob, P.make_plan(prob, shapes, [3, 1], 4)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_pipeline_gradients_match_one_process(schedule: str) -> None:
    import torch

    from gpuplan.runtime import gpt
    from gpuplan.runtime.poseidon import run_plan

    prob, plan = two_stage(schedule)
    assert P.check(prob, plan) == []
    # the sharing rates given: the probes that measure them are tested in test_run_stage_speed.py
    out = run_plan(prob, plan, steps=2, warmup=0, return_grads=True, timeout_s=120, calibrate=0, sharing=[1.0, 0.5])
    # the slow type has half the peak but the same memory bandwidth: its layers are slower by the
    # model's own time ratio, which lies between 1 (all memory-bound) and 2 (all compute-bound)
    cm = P.CostModel(prob)
    ratio = sum(cm.layer("cpu-slow", 1, 2)) / sum(cm.layer("cpu", 1, 2))
    assert out["stage1_slowdown"] == pytest.approx(ratio) and 1.0 < ratio <= 2.0
    model = gpt.model(TINY, seed=0)
    tokens, targets = gpt.synthetic_batch(TINY, 8, 16, seed=0)
    gpt.lm_loss(model(tokens), targets).backward()
    ref = {n: p.grad for n, p in model.named_parameters()}
    assert set(out["grads"]) == set(ref)
    for name, g in out["grads"].items():
        torch.testing.assert_close(g, ref[name], rtol=1e-4, atol=1e-6)
    assert len(out["losses"]) == 2 and out["losses"][1] < out["losses"][0] + 1e-3
    assert out["measured_iteration_s"] > 0
    assert out["predicted_cpu_iteration_s"] >= out["predicted_iteration_s"] * 0.5 > 0
    assert len(out["core_sharing_rates"]) == 2 and all(r > 0 for r in out["core_sharing_rates"])


def test_runner_refuses_tensor_parallel_stages() -> None:
    from gpuplan.errors import InputError
    from gpuplan.runtime.poseidon import run_plan

    prob, plan = two_stage()
    bad = plan.model_copy(update={"stages": [plan.stages[0].model_copy(update={"tp": 2}), plan.stages[1]]})
    with pytest.raises(InputError, match="tensor parallelism"):
        run_plan(prob, bad)


@pytest.mark.slow
def test_fewer_microbatches_than_stages_runs_the_plans_order() -> None:
    """1F1B with m = 2 < S = 3 (torch's Schedule1F1B refuses it) runs the plan's own DAG order through
    the action-list runtime, with the gradients of one process."""
    import torch

    from gpuplan.runtime import gpt
    from gpuplan.runtime.poseidon import order_actions, run_plan

    prob, _ = two_stage()
    doc = prob.document()
    doc["cluster"]["nodes"] = [{"name": "n0", "gpus": {"cpu": 2, "cpu-slow": 1}}]
    prob = P.PoseidonProblem.model_validate(doc)
    shapes = [P.StageShape("cpu", 1, 1, (0,), ("n0",)), P.StageShape("cpu", 1, 1, (1,), ("n0",)),
              P.StageShape("cpu-slow", 1, 1, (2,), ("n0",))]
    plan = P.make_plan(prob, shapes, [2, 1, 1], 2)
    assert P.check(prob, plan) == [] and plan.num_microbatches == 2
    assert order_actions("1f1b", 3, 2)[2][:4] == ["2RECV_F0", "2F0", "2B0", "2SEND_B0"]
    out = run_plan(prob, plan, steps=1, warmup=0, return_grads=True, timeout_s=120, sharing=[1.0, 1.0, 1.0])
    model = gpt.model(TINY, seed=0)
    tokens, targets = gpt.synthetic_batch(TINY, 8, 16, seed=0)
    gpt.lm_loss(model(tokens), targets).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(out["grads"][name], p.grad, rtol=1e-4, atol=1e-6)
