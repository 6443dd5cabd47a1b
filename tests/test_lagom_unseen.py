"""Lagom on valid inputs no shipped example covers (found by an outside-style sweep): every catalog GPU
modelled with its own architecture, and the baselines and the exhaustive search held to a time limit."""

from __future__ import annotations

import pytest

from gpuplan import api
from gpuplan.models.catalog import catalog_entry, catalog_names
from gpuplan.models.lagom import GPU_EXTRA, LagomProblem
from gpuplan.models.lagom.problem import Hardware
from gpuplan.models.plan import Status


@pytest.mark.parametrize("gpu", catalog_names())
def test_every_catalog_gpu_has_its_architecture(gpu: str) -> None:
    """A catalog GPU without SM / L2 figures fell back to an Ampere with 100 SMs and 40 MiB L2: GH200
    (Hopper, NVLS on its NVSwitch) got Ampere's tables and no NVLS, K80 and P100 LL128."""
    hw = Hardware(gpu=gpu)
    assert gpu in GPU_EXTRA
    assert hw.architecture() == catalog_entry(gpu)["arch"]  # type: ignore[index]


def test_gh200_node_offers_nvls() -> None:
    """Eight GH200 on one NVSwitch node: NCCL's default for a large all-reduce is NVLS, as on H100."""
    doc = {"kind": "lagom", "hardware": {"gpu": "GH200"}, "groups": {"dp": {"ranks": 8}},
           "ops": [{"name": "o", "collective": "all_reduce", "size_bytes": 256 * 2**20, "group": "dp"}]}
    plan = api.solve(doc, solver="nccl-default")
    assert plan.settings[0].algo == "nvls"


def _large() -> LagomProblem:
    """Return a 400-op workload (Llama-2-70B, TP 4 x DP 4 over PCIe A10 nodes)."""
    return LagomProblem.model_validate({"kind": "lagom", "hardware": {"gpu": "A10"}, "from_model": {
        "model": "llama2-70b", "dp": 4, "tp": 4, "gpus_per_node": 8, "intra": "pcie", "nics": 4,
        "inter_GBps": "25 Gbps"}})


@pytest.mark.parametrize("solver", ["autoccl", "exhaustive"])
def test_search_baselines_hold_a_time_limit(solver: str) -> None:
    """autoccl and exhaustive ignored time_limit_s (autoccl took 36.9 s under a 2 s limit on this input):
    under a limit too short for every op they stop, keep NCCL's default for the rest, say time_limit,
    and the plan passes check."""
    prob = _large()
    plan = api.solve(prob, solver=solver, time_limit_s=0.001)
    assert plan.status is Status.TIME_LIMIT
    assert "time limit" in plan.message
    assert api.check(prob, plan) == []


def test_the_search_leaves_room_for_building_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the plan after the search (make_plan: whole-iteration evaluations, the timeline, emit)
    was not reserved, so lagom ran 2.47-2.96 s under a 2 s limit on 400 ops: the search's budget is now
    the limit less PLAN_EVALUATIONS evaluations timed at the start, and make_plan makes no more."""
    import time

    from gpuplan.models.lagom import Compiled, make_plan
    from gpuplan.solvers import lagom as sl

    prob = _large()
    comp = prob.compiled
    default = [comp.nccl_default(i) for i in range(len(comp.ops))]
    calls: list[int] = []
    real = Compiled.iteration_us
    monkeypatch.setattr(Compiled, "iteration_us", lambda self, s: calls.append(1) or real(self, s))
    base = {k: [sl.OpSetting(op=o.name, **vars(t)) for o, t in zip(comp.ops, default)] for k in ("a", "b")}
    make_plan(prob, default, baselines=base)
    assert len(calls) <= sl.PLAN_EVALUATIONS
    monkeypatch.setattr(Compiled, "iteration_us", lambda self, s: time.sleep(0.1) or 0.0)
    assert sl.search_budget_s(prob, 1.0) <= 1.0 - sl.PLAN_EVALUATIONS * 0.1
    assert sl.search_budget_s(prob, None) is None
