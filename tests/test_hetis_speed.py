"""The solvers reuse their own max-rate searches (Stage A's for the chosen layout, the baselines' for the
candidate they keep) instead of searching again in finish_plan: the stated rates must equal a fresh,
independent search of the same layout on the same trace."""

from __future__ import annotations

import pytest

from gpuplan import api
from gpuplan.models.hetis import rate_search
from gpuplan.solvers.hetis import stage_a_candidates


def _problem():
    doc = api.load_problem("examples/hetis/small.yaml").document()
    doc["trace"]["requests"] = 60
    return api.load_problem(doc)


@pytest.mark.parametrize("solver", ["hetis", "hexgen"])
def test_stated_rates_equal_a_fresh_search(solver: str) -> None:
    problem = _problem()
    plan = api.solve(problem, solver=solver)
    fresh = rate_search(problem, plan)
    assert plan.predicted["max_rate_per_s"] == fresh[0]
    assert plan.predicted["first_failing_rate_per_s"] == fresh[1]
    assert plan.objective == fresh[0]


@pytest.mark.parametrize("solver", ["hetis", "hexgen", "splitwise", "heads-by-memory"])
def test_a_time_limit_returns_a_checked_plan_of_the_candidates_simulated(solver: str) -> None:
    """A limit too short for more than one candidate stops the search there: status time_limit, a message
    saying how many were simulated, and a plan that passes check (its rates are its own layout's)."""
    from gpuplan.solvers import hetis as H

    problem = _problem()
    H._STAGE_A_RATED.clear()  # no ratings left by an earlier test's searches
    H._STATIC_CACHE.clear()
    plan = api.solve(problem, solver=solver, time_limit_s=1e-3)
    assert plan.status.value == "time_limit"
    assert "1 of " in plan.message
    assert api.check(None, plan) == []


def test_stage_a_resumes_where_a_deadline_stopped_it() -> None:
    """A later search without a limit rates the candidates a deadline left out and ends with the same
    table as one search run through."""
    from gpuplan.solvers import hetis as H
    from gpuplan.solvers.backends import Deadline

    doc = _problem().document()
    doc["trace"]["requests"] = 40  # a short trace: this test runs Stage A three times
    problem = api.load_problem(doc)
    H._STAGE_A_RATED.pop(H.stage_a_key(problem), None)
    cut = H.stage_a_search(problem, deadline=Deadline(0.0))
    assert cut.simulated == 1 and not cut.complete
    whole = H.stage_a_search(problem)
    assert whole.complete and whole.simulated == len(stage_a_candidates(problem))
    H._STAGE_A_RATED.pop(H.stage_a_key(problem), None)
    again = H.stage_a_search(problem)
    assert again.table == whole.table
