"""Tessel on valid inputs no shipped example covers (found by an outside-style sweep of random placements):
the repetend a plan reports must be a cyclic schedule whatever the schedule it was read from."""

from __future__ import annotations

from gpuplan import api
from gpuplan.models.tessel import TesselProblem
from gpuplan.solvers import tessel as solvers

GiB = 2**30


def _problem(n: int, shape: dict) -> TesselProblem:
    """Return the tessel problem of a generated shape over n micro-batches (no memory limit)."""
    return TesselProblem.model_validate({"kind": "tessel", "microbatches": n,
                                         "shape": {"activation_bytes": GiB, **shape}})


def test_baseline_repetend_is_a_cyclic_schedule() -> None:
    """Where a baseline meets the lower bound Tessel returns it with the repetend its steady state repeats.
    Two micro-batches a period apart do not make that steady state cyclic: on 2 devices, F = 1.5, B = 1,
    W = 0.3, N = 12, ZB-H2's first such pair gave F0 and B0 the same offset on device 0 and check
    rejected the plan. The repetend must now pass check (or be left out)."""
    prob = _problem(12, {"name": "1f1b", "devices": 2, "forward_s": 1.5, "backward_s": 1.0,
                         "backward_weight_s": 0.3})
    plan = api.solve(prob, solver="tessel", time_limit_s=5)
    assert plan.solver is not None and "search_skipped" in plan.solver.stats
    assert api.check(prob, plan) == []


def test_pattern_from_schedule_rejects_overlap_modulo_period() -> None:
    """pattern_from_schedule returns only patterns whose blocks do not overlap modulo the period on any
    device (the cyclic model's constraint), on the same ZB-H2 schedule."""
    prob = _problem(12, {"name": "1f1b", "devices": 2, "forward_s": 1.5, "backward_s": 1.0,
                         "backward_weight_s": 0.3})
    t = solvers.integerize(prob)
    sched = api.solve(prob, solver="zb-h2").schedule
    busy = max(solvers._busy(prob, t))
    pat = solvers.pattern_from_schedule(prob, solvers.grouped_ticks(t, 1), sched, 1, busy)
    assert pat is not None
    for d in range(prob.devices):
        names = [f"{b.name}@0" for b in prob.blocks if d in b.devices]
        spans = sorted((pat.start[n], pat.start[n] + t.dur[n.split("@")[0]]) for n in names)
        for (_, end), (nxt, _) in zip(spans, spans[1:] + [(spans[0][0] + pat.period, 0)]):
            assert end <= nxt
