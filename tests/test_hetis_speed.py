"""The solvers reuse their own max-rate searches (Stage A's for the chosen layout, the baselines' for the
candidate they keep) instead of searching again in finish_plan: the stated rates must equal a fresh,
independent search of the same layout on the same trace."""

from __future__ import annotations

import pytest

from gpuplan import api
from gpuplan.models.hetis import rate_search
from gpuplan.solvers.hetis import hetis_layout_plan, stage_a, stage_a_candidates, static_search


def _problem():
    doc = api.load_problem("examples/hetis/small.yaml").document()
    doc["trace"]["requests"] = 120
    return api.load_problem(doc)


@pytest.mark.parametrize("solver", ["hetis", "hexgen"])
def test_stated_rates_equal_a_fresh_search(solver: str) -> None:
    problem = _problem()
    plan = api.solve(problem, solver=solver)
    fresh = rate_search(problem, plan)
    assert plan.predicted["max_rate_per_s"] == fresh[0]
    assert plan.predicted["first_failing_rate_per_s"] == fresh[1]
    assert plan.objective == fresh[0]


def test_stage_a_table_rates_are_fresh_searches() -> None:
    problem = _problem()
    _, table = stage_a(problem)
    rates = [max(rate_search(problem, hetis_layout_plan(problem, reps))[0], static_search(problem, reps)[0])
             for _, reps in stage_a_candidates(problem)]
    assert [row["max_rate_per_s"] for row in table] == rates

