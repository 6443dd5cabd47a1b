"""The data-parallel gradient all-reduce with and without overlap (`overlap_dp_allreduce`): Megatron's
local DDP all-reduces after the backward; PyTorch DDP (and --overlap-grad-reduce) all-reduces buckets
during the last micro-batch's backward, leaving exposed what outlasts it, at least the last bucket, and
the compute's slowdown beside the others.
The search's walk mirrors evaluate, and its bounds stay below it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan import api
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon.config import config_problem, parse_config
from gpuplan.models.workload import model_config, scaled
from test_poseidon_fidelity import assert_walk_equals_evaluate


def problem(overlap: bool, gpus: int = 16, layers: int = 8, hidden: int = 1024, batch: int = 16,
            **extra: object) -> P.PoseidonProblem:
    cfg = scaled(model_config("gpt3-1.3b"), num_layers=layers, hidden=hidden)
    doc = {"kind": "poseidon", "cluster": {"gpus": {"A100-80GB": gpus}, "gpus_per_node": 8,
                                           "inter_node": {"bandwidth_GBps": "100 Gbps", "nics_per_node": 1}},
           "model": cfg.model_dump(), "global_batch": batch, "seq_len": 1024, "max_stages": 4,
           "max_microbatches": 16, "overlap_dp_allreduce": overlap, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


@pytest.mark.parametrize("config", ["tp=2,pp=2,dp=4,mb=1", "tp=1,pp=1,dp=16,mb=1", "tp=2,pp=2,dp=4,mb=1,interleave=2"])
def test_overlap_leaves_what_outlasts_the_last_backward(config: str) -> None:
    serial = gpuplan.evaluate_config(problem(False), config)
    over = gpuplan.evaluate_config(problem(True), config)
    cm = P.CostModel(problem(True))
    v = parse_config(config).interleave
    S = len(over.stages)
    for s, (a, b) in enumerate(zip(serial.stages, over.stages)):
        sh = P.shapes_of(over)[s]
        size = cm.stage_params(b.num_layers, s == 0, s == S - 1, S) / sh.tp * cm.grad_bytes
        full, bucket = cm.dp_allreduce_s(sh, size), cm.dp_allreduce_s(sh, min(size, P.DDP_BUCKET_BYTES))
        tied = a.allreduce_s - full  # the tied-embedding all-reduce is not a DDP bucket
        assert tied == pytest.approx(cm.tied_s(P.shapes_of(over)) if s in (0, S - 1) else 0.0, abs=1e-12)
        # the buckets but the last run beside the backward and slow its compute (Lagom's interference)
        slow, _ = cm.dp_slowdowns(sh, "all_reduce", min(size, P.DDP_BUCKET_BYTES))
        assert slow > 1.0
        hidden = full - bucket
        want = bucket + max(hidden - b.backward_s / v, hidden * (1 - 1 / slow))
        assert b.allreduce_s == pytest.approx(want + tied, rel=1e-12)
        assert bucket - 1e-15 <= b.allreduce_s - tied <= full + 1e-15
        assert (b.forward_s, b.backward_s, b.optimizer_s) == (a.forward_s, a.backward_s, a.optimizer_s)
    assert over.iteration_time_s <= serial.iteration_time_s
    assert api.check(None, over) == [] and api.check(None, serial) == []


def test_check_rejects_the_serial_all_reduce_stated_for_an_overlapping_problem() -> None:
    over = gpuplan.evaluate_config(problem(True), "tp=1,pp=1,dp=16,mb=1")
    serial = gpuplan.evaluate_config(problem(False), "tp=1,pp=1,dp=16,mb=1")
    assert serial.stages[0].allreduce_s > over.stages[0].allreduce_s
    tampered = over.model_copy(deep=True)
    tampered.stages[0].allreduce_s = serial.stages[0].allreduce_s
    assert any("allreduce_s" in str(v) for v in api.check(None, tampered))


def test_config_override_and_aliases() -> None:
    base = problem(False)
    for text in ("tp=2,pp=2,dp=4,ddp_overlap=true", "tp=2,pp=2,dp=4,overlap_grad_reduce=true"):
        assert config_problem(base, parse_config(text)).overlap_dp_allreduce is True
    assert config_problem(base, parse_config("tp=2,pp=2,dp=4")).overlap_dp_allreduce is False


def test_fixed_configuration_equals_the_searched_plan_with_overlap() -> None:
    prob = problem(True, gpus=8, batch=16)
    plan = api.solve(prob)
    s0 = plan.stages[0]
    config = {"tp": s0.tp, "pp": len(plan.stages), "dp": s0.dp, "mb": s0.micro_batch_size,
              "interleave": plan.interleave, "recompute": [s.recompute for s in plan.stages],
              "layers": [s.num_layers for s in plan.stages]}
    fixed = gpuplan.evaluate_config(prob, config)
    assert fixed.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-12)
    assert api.check(None, fixed) == [] and api.check(prob, plan) == []


@settings(max_examples=20, deadline=None)
@given(v=st.sampled_from([1, 2]), data=st.data())
def test_search_walk_equals_evaluate_with_overlapped_all_reduce(v: int, data: st.DataObject) -> None:
    prob = api.load_problem({"kind": "poseidon", "cluster": {"gpus": {"A100-80GB": 8, "V100": 8}, "gpus_per_node": 4,
                                                             "inter_node": {"bandwidth_GBps": "25 Gbps"}},
                             "model": scaled(model_config("gpt3-350m"), num_layers=8).model_dump(),
                             "global_batch": 16, "seq_len": 1024, "max_stages": 4, "max_microbatches": 8,
                             "overlap_dp_allreduce": True}, "poseidon")
    assert_walk_equals_evaluate(prob, v, data)
