"""Properties of every straggler policy on random small instances (hypothesis): the recorded schedule keeps
map before reduce, slot capacity and one winning copy per task, and passes check; the LP lower bound never
exceeds any policy's weighted flowtime."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan import api, registry
from gpuplan.models.stragglers import StragglersProblem, schedule_violations
from gpuplan.solvers.stragglers_lp import lower_bound

POLICIES = [s.name for s in registry.solvers("stragglers")]
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MORE = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw: st.DrawFn) -> StragglersProblem:
    """A random instance: 1-5 jobs of 1-4 map and 0-2 reduce tasks on 1-4 slots, Pareto or uniform."""
    n = draw(st.integers(1, 5))
    size = st.floats(0.2, 3.0, allow_nan=False)
    jobs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0.0, 2.0, allow_nan=False))
        jobs.append({"id": i, "arrival_s": round(t, 3), "weight": draw(st.sampled_from([1.0, 2.0, 3.0])),
                     "map_s": draw(st.lists(size, min_size=1, max_size=4)),
                     "reduce_s": draw(st.lists(size, min_size=0, max_size=2))})
    var = draw(st.sampled_from([{"model": "pareto", "alpha": 1.5}, {"model": "pareto", "alpha": 1.2},
                                {"model": "uniform", "a": 0.5}, {"model": "uniform", "a": 0.0}]))
    return StragglersProblem(slots=draw(st.integers(1, 4)), variability=var, jobs=jobs,
                             monitoring=draw(st.sampled_from(["elapsed", "progress"])))


@SETTINGS
@given(problem=instances(), seed=st.integers(0, 1000))
def test_every_policy_keeps_map_before_reduce_and_capacity(problem: StragglersProblem, seed: int) -> None:
    for name in POLICIES:
        plan = api.solve(problem, solver=name, seed=seed)
        assert plan.schedule is not None, name
        assert schedule_violations(problem, plan.schedule, plan.completion_s) == [], name
        assert api.check(problem, plan) == [], name


@SETTINGS
@given(problem=instances(), seed=st.integers(0, 1000))
def test_lp_bound_never_exceeds_any_policy(problem: StragglersProblem, seed: int) -> None:
    bound = lower_bound(problem, "limit")
    assert bound > 0
    for name in POLICIES:
        plan = api.solve(problem, solver=name, seed=seed)
        assert plan.objective is not None and bound <= plan.objective * (1 + 1e-9), (name, bound, plan.objective)


@pytest.mark.slow
@MORE
@given(problem=instances(), seed=st.integers(0, 1000))
def test_more_instances_keep_the_rules_and_the_bound(problem: StragglersProblem, seed: int) -> None:
    bound = lower_bound(problem, "limit")
    for name in POLICIES:
        plan = api.solve(problem, solver=name, seed=seed)
        assert plan.schedule is not None and api.check(problem, plan) == [], name
        assert bound <= plan.objective * (1 + 1e-9), name
