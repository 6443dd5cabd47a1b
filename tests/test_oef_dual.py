"""OEF's Lagrangian dual bound (solvers/oef/dual.py) and the deadline of time-limited solves: the
bound is never below the full EF LP's optimum (all n(n-1) envy rows, scipy/HiGHS), the plan a
time limit returns is envy-free and SI with its status, and the certified gap is an honest one."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models.oef import EF, SI, arrays, efficiency, envy_pairs, equal_share, utilities
from gpuplan.models.plan import Status
from gpuplan.solvers.oef.dual import dual_value, group_dual_bound
from gpuplan.solvers.oef.ef import Budget, solve_ef_lp
from test_oef_scale import distinct_doc, full_lp


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n=st.integers(2, 25), m=st.integers(2, 5), groups=st.integers(1, 30),
       iters=st.integers(1, 300))
def test_dual_bound_is_never_below_the_full_lp(seed: int, n: int, m: int, groups: int, iters: int) -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(seed), n, m)))
    ref = utilities(a, equal_share(a))
    bound, stats = group_dual_bound(a.V, a.usable, a.gpus.astype(float), a.capacity, a.weight / a.gpus, ref,
                                    groups=groups, max_iter=iters)
    assert np.isfinite(bound) and stats["dual_iterations"] == iters
    assert bound >= full_lp(a) * (1 - 1e-9) - 1e-9


def test_every_dual_point_bounds_the_lp_and_the_search_improves_on_the_capacity_prices() -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(4), 40, 4)))
    ref = utilities(a, equal_share(a))
    rho = a.weight / a.gpus
    opt = full_lp(a)
    labels = np.arange(40)                                  # one job per group: the full LP's dual
    theta = np.minimum(1.0, rho[:, None] / rho[None, :])
    rng = np.random.default_rng(0)
    for _ in range(20):                                     # weak duality at random multipliers
        pi, sig, A = rng.uniform(0, 3, 4), rng.uniform(0, 2, 40), rng.uniform(0, 1, (40, 40))
        value, _ = dual_value(a.V * a.usable, a.usable, a.gpus.astype(float), a.capacity, ref, labels, theta,
                              pi, sig, A)
        assert value >= opt * (1 - 1e-12)
    from gpuplan.solvers.oef.market import capacity_price_bound

    prices = capacity_price_bound(a.V, a.usable, a.gpus.astype(float), a.capacity)
    bound, _ = group_dual_bound(a.V, a.usable, a.gpus.astype(float), a.capacity, rho, ref, groups=40, max_iter=400)
    assert opt * (1 - 1e-9) <= bound < prices               # envy multipliers tighten the bound


def test_dual_bound_is_deterministic() -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(9), 60, 4)))
    ref = utilities(a, equal_share(a))
    args = (a.V, a.usable, a.gpus.astype(float), a.capacity, a.weight / a.gpus, ref)
    assert group_dual_bound(*args, groups=10, max_iter=50)[0] == group_dual_bound(*args, groups=10, max_iter=50)[0]


def test_budget_estimates_an_oracle_pass_from_its_last_measurement() -> None:
    b = Budget(None)
    assert b.left() is None
    b.measured(2.0, 1000, 1000, 8)
    assert b.oracle_s(2000, 2000, 8) == pytest.approx(8.0)
    assert Budget(5.0).left() == pytest.approx(5.0, abs=0.5)


@pytest.mark.parametrize("limit", [0.3, 1.5])
def test_time_limited_solve_returns_an_envy_free_si_plan_with_an_honest_gap(limit: float) -> None:
    """A limit far below what the exact LP needs: the plan keeps SI and EF, its status says
    time_limit, and (plan efficiency, bound) bracket the exact optimum."""
    problem = api.load_problem(distinct_doc(np.random.default_rng(21), 200, 5))
    a = arrays(problem)
    started = time.perf_counter()
    plan = api.solve(problem, solver="oef", time_limit_s=limit)
    wall = time.perf_counter() - started
    assert wall < limit + 5                                 # loose: a shared machine; the bench measures
    assert plan.status in (Status.TIME_LIMIT, Status.OPTIMAL)
    assert api.check(problem, plan) == []
    X = plan.matrix()
    assert envy_pairs(a, X)[0] == 0 and plan.guarantees == [SI, EF]
    if plan.status is Status.TIME_LIMIT:
        stats = plan.solver.stats
        E = equal_share(a)
        exact = solve_ef_lp(a.V, a.usable, a.gpus.astype(float), a.capacity, a.weight / a.gpus,
                            utilities(a, E), E)
        assert exact.status is Status.OPTIMAL
        assert efficiency(a, X) <= exact.upper_bound * (1 + 1e-7) <= stats["upper_bound"] * (1 + 1e-7)
        assert stats["certified_gap"] == pytest.approx(
            (stats["upper_bound"] - plan.objective) / stats["upper_bound"], rel=1e-6, abs=1e-9)


def test_dual_bound_tightens_a_stopped_solve() -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(13), 150, 5)))
    E = equal_share(a)
    ref = utilities(a, E)
    rho = a.weight / a.gpus
    # a stopped solve's dual iterations run until the limit (or their cap): 2 s leave thousands, any count bounds
    kw = dict(max_rounds=1, hull=False, market=False, time_limit_s=2.0)
    without = solve_ef_lp(a.V, a.usable, a.gpus.astype(float), a.capacity, rho, ref, E, dual=False, **kw)
    with_dual = solve_ef_lp(a.V, a.usable, a.gpus.astype(float), a.capacity, rho, ref, E, **kw)
    assert with_dual.status is Status.TIME_LIMIT and "dual_iterations" in with_dual.stats
    assert with_dual.upper_bound <= without.upper_bound * (1 + 1e-12)
    exact = solve_ef_lp(a.V, a.usable, a.gpus.astype(float), a.capacity, rho, ref, E)
    assert with_dual.upper_bound >= exact.upper_bound * (1 - 1e-9)


def test_dual_groups_option_turns_the_bound_off_and_refuses_bad_counts() -> None:
    from gpuplan.errors import InputError

    problem = api.load_problem(distinct_doc(np.random.default_rng(31), 120, 5))
    off = api.solve(problem, solver="oef", time_limit_s=0.2, dual_groups=0)
    assert "dual_iterations" not in off.solver.stats and api.check(problem, off) == []
    few = api.solve(problem, solver="oef", time_limit_s=0.2, dual_groups=7)
    if few.status is Status.TIME_LIMIT:
        assert few.solver.stats["dual_groups"] >= 7 and api.check(problem, few) == []
    for bad in (-1, 10_001):
        with pytest.raises(InputError, match="dual_groups"):
            api.solve(problem, solver="oef", time_limit_s=0.2, dual_groups=bad)


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_cvxpy_route_at_a_time_limit_returns_the_equal_split_with_its_status() -> None:
    problem = api.load_problem(distinct_doc(np.random.default_rng(17), 40, 3))
    plan = api.solve(problem, solver="oef", time_limit_s=1e-4, method="cvxpy")
    assert plan.status in (Status.TIME_LIMIT, Status.OPTIMAL)
    if plan.status is Status.TIME_LIMIT:
        assert "equal split" in plan.message
        assert np.allclose(plan.matrix(), equal_share(arrays(problem)))
    assert api.check(problem, plan) == []
