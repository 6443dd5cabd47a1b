"""OEF at a time limit: the equal-incomes market (envy-free and SI at any prices), the per-job mix
LP over candidates, and the certified gap, against the full LP with all n(n-1) envy rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from test_oef_scale import distinct_doc, full_lp

from gpuplan import api
from gpuplan.models.oef import arrays, efficiency, envy_pairs, equal_share, utilities
from gpuplan.models.plan import Status
from gpuplan.solvers.oef.ef import solve_ef_lp
from gpuplan.solvers.oef.hull import hull_ef_lp
from gpuplan.solvers.oef.market import best_market, budgets, capacity_mix, demand, market_allocation

SMALL = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def within_capacity(a, X) -> bool:
    """Capacity as models/oef.check holds it (LP solutions meet rows within HiGHS's tolerance)."""
    return bool(((a.gpus[:, None] * X).sum(axis=0) <= a.capacity * (1 + 1e-6) + 1e-7).all())


def is_si(a, X, ref) -> bool:
    return bool((utilities(a, X) >= ref * (1 - 1e-7) - 1e-9).all())


@SMALL
@given(seed=st.integers(0, 100_000), m=st.integers(1, 6))
def test_demand_is_each_buyers_best_bundle(seed: int, m: int) -> None:
    rng = np.random.default_rng(seed)
    n = 12
    V = rng.uniform(0.5, 10, (n, m))
    usable = rng.random((n, m)) < 0.8
    usable[:, 0] = True
    price = rng.uniform(0.01, 3, m)
    if rng.random() < 0.3:
        price[:] = price[0]                               # ties between types
    budget = rng.uniform(0.1, 5, n)
    gpus = rng.choice([1.0, 2.0, 4.0, 8.0], n)
    Z = demand(V, usable, price, budget, gpus)
    assert (Z >= -1e-12).all() and (Z[~usable] == 0).all()
    assert (Z @ price <= budget * (1 + 1e-9)).all() and (Z.sum(axis=1) <= gpus * (1 + 1e-9)).all()
    for i in range(n):                                    # the buyer's LP, solved independently
        res = linprog(-V[i], A_ub=np.vstack([price, np.ones(m)]), b_ub=[budget[i], gpus[i]],
                      bounds=[(0, None if u else 0) for u in usable[i]], method="highs")
        assert V[i] @ Z[i] == pytest.approx(-res.fun, rel=1e-9, abs=1e-9)


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(2, 25), m=st.integers(2, 5),
       exponent=st.sampled_from([1.0, 0.5, 0.0]), scale=st.floats(0.05, 1.0))
def test_any_prices_give_an_envy_free_demand_and_si_when_budgets_are_weights(
        seed: int, n: int, m: int, exponent: float, scale: float) -> None:
    rng = np.random.default_rng(seed)
    a = arrays(api.load_problem(distinct_doc(rng, n, m)))
    b = budgets(a.weight, a.gpus, exponent)
    price = rng.uniform(0.1, 1.0, m)
    price *= scale * b.sum() / (price @ a.capacity)        # p . C <= sum of budgets
    X = demand(a.V, a.usable, price, b, a.gpus) / a.gpus[:, None]
    assert envy_pairs(a, X)[0] == 0                        # the model's own check, every pair
    if exponent == 1.0:
        assert is_si(a, X, utilities(a, equal_share(a)))


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(2, 25), m=st.integers(2, 5))
def test_market_plan_is_envy_free_si_within_capacity_and_below_the_optimum(seed: int, n: int, m: int) -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(seed), n, m)))
    E = equal_share(a)
    ref = utilities(a, E)
    X, recent, stats = best_market(a.V, a.usable, a.weight, a.gpus, a.gpus, a.capacity, E, ref)
    assert envy_pairs(a, X)[0] == 0 and is_si(a, X, ref) and within_capacity(a, X)
    assert stats["market_budget_exponent"] in (1.0, 0.75, 0.5, 0.25, 0.0)
    opt = full_lp(a)
    assert efficiency(a, E) - 1e-6 <= efficiency(a, X) <= opt * (1 + 1e-7) + 1e-7
    assert stats["market_efficiency"] == pytest.approx(efficiency(a, X))
    for D in recent:                                       # candidates: time rows, usable types
        assert (D.sum(axis=1) <= 1 + 1e-9).all() and (D[~a.usable] == 0).all()


def test_capacity_mix_is_the_smallest_that_fits() -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(4), 30, 4)))
    E = equal_share(a)
    X, _, _ = market_allocation(a.V, a.usable, a.weight, a.gpus, a.gpus, a.capacity, E, iterations=1)
    raw = demand(a.V, a.usable, np.full(4, a.weight.sum() / a.capacity.sum()), a.weight, a.gpus) / a.gpus[:, None]
    t = capacity_mix(raw, E, a.gpus, a.capacity)
    assert 0 <= t <= 1 and within_capacity(a, (1 - t) * raw + t * E)
    if t > 1e-6:
        assert not within_capacity(a, (1 - 0.99 * t) * raw + 0.99 * t * E)


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(2, 20), m=st.integers(2, 4))
def test_per_job_mix_lp_is_envy_free_and_between_its_anchor_and_the_optimum(seed: int, n: int, m: int) -> None:
    rng = np.random.default_rng(seed)
    a = arrays(api.load_problem(distinct_doc(rng, n, m)))
    E = equal_share(a)
    ref = utilities(a, E)
    rho = a.weight / a.gpus
    wild = rng.dirichlet(np.ones(m), n) * a.usable          # envious, over capacity: a candidate only
    X, stats = hull_ef_lp(a.V, a.gpus, a.capacity, rho, ref, [E, wild])
    assert stats["hull_finished"]
    assert envy_pairs(a, X)[0] == 0 and is_si(a, X, ref) and within_capacity(a, X)
    assert efficiency(a, E) - 1e-6 <= efficiency(a, X) <= full_lp(a) * (1 + 1e-7) + 1e-7


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n=st.integers(6, 30), m=st.integers(2, 5), rounds=st.integers(1, 3))
def test_certified_gap_is_a_true_bound(seed: int, n: int, m: int, rounds: int) -> None:
    """A plan stopped after a few rounds: envy-free, SI, and its certified gap is never below its
    true gap to the optimum of the full LP (all n(n-1) envy rows)."""
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(seed), n, m)))
    E = equal_share(a)
    ref = utilities(a, E)
    res = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, a.weight / a.gpus, ref, E, max_rounds=rounds,
                      weight=a.weight, gpus=a.gpus)
    opt = full_lp(a)
    X = np.clip(res.Y, 0, None)
    eff = efficiency(a, X)
    assert envy_pairs(a, X)[0] == 0 and is_si(a, X, ref) and within_capacity(a, X)
    assert eff <= opt * (1 + 1e-7) + 1e-7 <= res.upper_bound * (1 + 1e-6) + 1e-6
    if res.status is Status.TIME_LIMIT:
        true_gap = (opt - eff) / opt
        assert res.stats["certified_gap"] >= true_gap - 1e-6
        assert res.stats["efficiency"] == pytest.approx(eff)
    else:
        assert eff == pytest.approx(opt, rel=1e-6, abs=1e-7)


def test_a_time_limited_solve_passes_check_and_says_where_its_plan_comes_from() -> None:
    problem = api.load_problem(distinct_doc(np.random.default_rng(21), 300, 5))
    plan = api.solve(problem, solver="oef", time_limit_s=0.3)
    assert api.check(problem, plan) == []
    if plan.status is Status.TIME_LIMIT:
        stats = plan.solver.stats
        assert "market" in stats["plan_from"] or "equal split" in stats["plan_from"]
        assert stats["certified_gap"] is None or 0 <= stats["certified_gap"] < 1
        assert plan.objective >= efficiency(arrays(problem), equal_share(arrays(problem))) - 1e-6


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(2, 40), m=st.integers(1, 5))
def test_capacity_price_bound_is_above_max_throughput_and_near_it(seed: int, n: int, m: int) -> None:
    from gpuplan.solvers.oef.market import capacity_price_bound

    problem = api.load_problem(distinct_doc(np.random.default_rng(seed), n, m))
    a = arrays(problem)
    bound = capacity_price_bound(a.V, a.usable, a.gpus, a.capacity, iterations=400)
    best = api.solve(problem, solver="max-throughput").objective      # the LP the bound relaxes to
    assert bound >= best * (1 - 1e-9) - 1e-9
    assert bound >= full_lp(a) * (1 - 1e-9)
    assert bound <= best * 1.5 + 1e-9                 # the prices do work (1.0 at convergence)
