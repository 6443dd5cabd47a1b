"""The vectorised engine of the time-shared policies (fair-r, laps-r, hesrpt, fair) against the event-queue
engine: the same rules and random draws, so the same completions, machine time, copy counts and segments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan.models.stragglers import StragglersProblem
from gpuplan.sim.tasks import SHARED_POLICIES, simulate


def _both(problem: StragglersProblem, policy: str, seed: int) -> tuple[Any, Any, Any]:
    wl, var = problem.sim_workload(), problem.variability.build()
    fast = simulate(wl, problem.slots, var, policy, seed=seed, record=True)
    slow = simulate(wl, problem.slots, var, policy, seed=seed, record=True, engine="events")
    return wl, fast, slow


def _same(wl: Any, fast: Any, slow: Any, counts: bool) -> None:
    np.testing.assert_allclose(fast.completion_s, slow.completion_s, rtol=1e-9, atol=1e-9)
    assert fast.figures(wl)["machine_time_s"] == pytest.approx(slow.figures(wl)["machine_time_s"], rel=1e-9, abs=1e-9)
    if counts:
        assert (fast.copies_started, fast.copies_killed) == (slow.copies_started, slow.copies_killed)
        key = lambda r: (r[0], r[1], round(r[3], 9), round(r[4], 9))  # noqa: E731
        a, b = sorted(fast.schedule, key=key), sorted(slow.schedule, key=key)
        assert len(a) == len(b)
        for ra, rb in zip(a, b):
            assert ra[:3] == rb[:3] and ra[6] == rb[6]
            assert ra[3:6] == pytest.approx(rb[3:6], rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("policy", SHARED_POLICIES)
@pytest.mark.parametrize("var", [{"model": "pareto", "alpha": 1.5}, {"model": "uniform", "a": 0.5}])
def test_engines_agree_on_a_generated_workload(policy: str, var: dict[str, Any]) -> None:
    problem = StragglersProblem(slots=8, variability=var,
                                workload={"jobs": 120, "load": 0.7, "seed": 3, "max_map_tasks": 12})
    _same(*_both(problem, policy, 1), counts=True)


@st.composite
def instances(draw: st.DrawFn) -> StragglersProblem:
    """1-5 jobs of 1-4 map and 0-2 reduce tasks on 1-4 slots; arrivals may coincide."""
    n = draw(st.integers(1, 5))
    size = st.floats(0.2, 3.0, allow_nan=False)
    jobs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 1.3]))
        jobs.append({"id": i, "arrival_s": t, "weight": 1.0, "map_s": draw(st.lists(size, min_size=1, max_size=4)),
                     "reduce_s": draw(st.lists(size, min_size=0, max_size=2))})
    var = draw(st.sampled_from([{"model": "pareto", "alpha": 1.5}, {"model": "pareto", "alpha": 1.2},
                                {"model": "uniform", "a": 0.5}]))
    return StragglersProblem(slots=draw(st.integers(1, 4)), variability=var, jobs=jobs)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(SHARED_POLICIES), st.integers(0, 3))
def test_engines_agree_on_random_instances(problem: StragglersProblem, policy: str, seed: int) -> None:
    _same(*_both(problem, policy, seed), counts=True)


def test_unknown_engine_is_refused() -> None:
    problem = StragglersProblem(slots=2, jobs=[{"id": 0, "arrival_s": 0, "map_s": [1.0]}])
    with pytest.raises(ValueError, match="engine"):
        simulate(problem.sim_workload(), 2, problem.variability.build(), "fair", engine="gpu")
