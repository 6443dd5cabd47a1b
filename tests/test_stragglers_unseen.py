"""stragglers on valid inputs unlike the shipped ones (the outside-style sweep): the LP bound under a time limit."""

from __future__ import annotations

from typing import Any

import pytest

import gpuplan
from gpuplan.solvers import stragglers_lp as L
from gpuplan.solvers.backends import COLD_IMPORT_S


def _jobs(n: int) -> dict[str, Any]:
    return {"kind": "stragglers", "name": "lp-limit", "slots": 3, "variability": {"model": "pareto", "alpha": 1.5},
            "jobs": [{"id": i, "arrival_s": 0.5 * i, "map_s": [1.0, 2.0], "reduce_s": [1.0]} for i in range(n)]}


def test_lp_bound_gets_what_is_left_of_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: the LP bound ignored the solver's time limit (srptms-c took 14 s at a 5 s limit on 50 jobs)."""
    limits: list[float | None] = []
    import gpuplan.solvers.backends as B
    real = B.solve_cvxpy

    def spy(prob: Any, **kw: Any) -> Any:
        limits.append(kw.get("time_limit_s"))
        return real(prob, **kw)

    monkeypatch.setattr(B, "solve_cvxpy", spy)
    L._LP_CACHE.clear()
    problem = gpuplan.load_problem(_jobs(4))
    plan = gpuplan.solve(problem, solver="fifo", time_limit_s=30.0, seed=0)
    assert len(limits) == 2 and all(x is not None and 0 < x <= 30.0 for x in limits)
    assert plan.solver.stats["lp_bound_s"] <= plan.objective
    assert gpuplan.check(problem, plan) == []


def test_spent_time_limit_leaves_the_bound_out_and_says_so() -> None:
    L._LP_CACHE.clear()
    problem = gpuplan.load_problem(_jobs(3))
    stats = L.bound_stats(problem, time_limit_s=0.0)
    assert "lp_bound_s" not in stats and "time limit" in stats["lp_bound_note"]
    plan = gpuplan.solve(problem, solver="fifo", time_limit_s=0.0, seed=0)
    assert gpuplan.check(problem, plan) == []


def test_building_the_lp_spends_the_limit_too() -> None:
    """Was: building and canonicalising the LP (and cvxpy's first import) ran outside the limit; HiGHS
    alone had it. Now HiGHS gets what the build left, and a limit the build outlasts leaves the bound out."""
    import cvxpy  # noqa: F401  (warm: the cold-import rule is not what this test is about)

    L._LP_CACHE.clear()
    problem = gpuplan.load_problem(_jobs(4))
    with pytest.raises(ValueError, match="building the LP took the whole"):
        L.lower_bound(problem, "limit", time_limit_s=1e-6)
    assert L.lower_bound(problem, "limit", time_limit_s=30.0) > 0  # a real limit still solves it


def test_a_cold_cvxpy_import_is_not_started_under_a_short_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "cvxpy", raising=False)  # as if never imported (restored after)
    L._LP_CACHE.clear()
    with pytest.raises(ValueError, match="first import"):
        L.lower_bound(gpuplan.load_problem(_jobs(3)), "limit", time_limit_s=COLD_IMPORT_S["cvxpy"] / 2)
