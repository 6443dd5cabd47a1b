"""Every upper bound OEF certifies a gap with is a proven one, and every time-limited plan is envy-free
and SI: each bound (the capacity prices, the group dual with and without the market's bundles in the
grouping, an LP relaxation stopped after a few rounds, and whatever a time-limited solve reports)
is compared with the exact LP optimum (all n(n-1) envy rows, scipy/HiGHS) on small random
distinct-job instances; a bound below it fails. The market's convex combination of demands is
checked the same way from below (envy-free, SI, within capacity, never above the optimum)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models.oef import arrays, efficiency, envy_pairs, equal_share, utilities
from gpuplan.models.plan import Status
from gpuplan.solvers.oef.dual import dual_value, group_dual_bound, group_pairs
from gpuplan.solvers.oef.groups import group_jobs
from gpuplan.solvers.oef.ef import solve_ef_lp
from gpuplan.solvers.oef.market import MarketPoints, best_market, capacity_price_bound, combine_demands
from test_oef_scale import distinct_doc, full_lp

SMALL = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _instance(seed: int, n: int, m: int):
    """Return (arrays, equal split, SI levels, rho, exact EF LP optimum) of a random distinct-job input."""
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(seed), n, m)))
    E = equal_share(a)
    return a, E, utilities(a, E), a.weight / a.gpus, full_lp(a)


def _below(bound: float, opt: float) -> bool:
    """Return whether `bound` falls below the optimum beyond the LP solvers' tolerance."""
    return bound < opt * (1 - 1e-7) - 1e-7


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(3, 25), m=st.integers(2, 5), groups=st.integers(1, 12),
       iters=st.integers(1, 200), pairs=st.integers(0, 6))
def test_each_bound_is_at_least_the_exact_optimum(seed: int, n: int, m: int, groups: int, iters: int,
                                                  pairs: int) -> None:
    a, E, ref, rho, opt = _instance(seed, n, m)
    size = a.gpus.astype(float)
    M, _, _ = best_market(a.V, a.usable, a.weight, size, size, a.capacity, E, ref)
    bounds = {
        "capacity prices": capacity_price_bound(a.V, a.usable, size, a.capacity, iterations=iters),
        "group dual": group_dual_bound(a.V, a.usable, size, a.capacity, rho, ref, groups=groups,
                                       max_iter=iters, pairs_per_job=0)[0],
        "group dual, market bundles, pairs": group_dual_bound(a.V, a.usable, size, a.capacity, rho, ref,
                                                              groups=groups, max_iter=iters, features=M,
                                                              pairs_per_job=pairs)[0],
    }
    for rounds in (1, 2):                          # an LP relaxation stopped early (a subset of envy rows)
        res = solve_ef_lp(a.V, a.usable, size, a.capacity, rho, ref, E, max_rounds=rounds, hull=False,
                          market=False, dual=False)
        bounds[f"LP relaxation after {rounds} round(s)"] = res.upper_bound
    low = {name: b for name, b in bounds.items() if _below(b, opt)}
    assert not low, f"bounds below the exact optimum {opt}: {low}"
    assert efficiency(a, M) <= opt * (1 + 1e-7) + 1e-7


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(3, 25), m=st.integers(2, 5),
       limit=st.sampled_from([0.02, 0.1, 0.5]))
def test_a_time_limited_solve_reports_a_true_bound_and_an_envy_free_si_plan(seed: int, n: int, m: int,
                                                                            limit: float) -> None:
    """Short limits take the market-and-dual path (no LP round), longer ones the rounds first."""
    a, E, ref, rho, opt = _instance(seed, n, m)
    size = a.gpus.astype(float)
    res = solve_ef_lp(a.V, a.usable, size, a.capacity, rho, ref, E, time_limit_s=limit, weight=a.weight,
                      gpus=size)
    assert not _below(res.upper_bound, opt), (res.upper_bound, opt, res.stats.get("bound_from"))
    X = res.Y
    assert envy_pairs(a, X)[0] == 0
    assert (utilities(a, X) >= ref * (1 - 1e-6) - 1e-7).all()
    assert ((a.gpus[:, None] * X).sum(axis=0) <= a.capacity * (1 + 1e-6) + 1e-7).all()
    assert efficiency(a, X) <= opt * (1 + 1e-7) + 1e-7
    if res.status is Status.TIME_LIMIT:
        gap = res.stats["certified_gap"]
        assert gap >= (opt - efficiency(a, X)) / max(opt, 1e-12) - 1e-6      # never claims more than is true


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(3, 25), m=st.integers(2, 5))
def test_the_combination_of_market_demands_is_envy_free_si_and_beats_each_single_market(seed: int, n: int,
                                                                                        m: int) -> None:
    a, E, ref, rho, opt = _instance(seed, n, m)
    size = a.gpus.astype(float)
    single, _, single_stats = best_market(a.V, a.usable, a.weight, size, size, a.capacity, E, ref, combine=False)
    plan, _, stats = best_market(a.V, a.usable, a.weight, size, size, a.capacity, E, ref)
    for X in (single, plan):
        assert envy_pairs(a, X)[0] == 0
        assert (utilities(a, X) >= ref * (1 - 1e-9)).all()
        assert ((a.gpus[:, None] * X).sum(axis=0) <= a.capacity * (1 + 1e-9) + 1e-12).all()
        assert efficiency(a, X) <= opt * (1 + 1e-7) + 1e-7
    assert efficiency(a, plan) >= efficiency(a, single) * (1 - 1e-9)
    assert stats["market_efficiency"] == efficiency(a, plan) or abs(stats["market_efficiency"] - efficiency(a, plan)) \
        <= 1e-9 * max(1.0, efficiency(a, plan))


def test_combine_demands_without_demands_returns_none() -> None:
    a, E, ref, _, _ = _instance(3, 6, 3)
    size = a.gpus.astype(float)
    X, stats = combine_demands(MarketPoints(), a.V, a.usable, size, size, a.capacity, E, ref)
    assert X is None and stats["market_demands"] == 0


@SMALL
@given(seed=st.integers(0, 100_000), n=st.integers(3, 25), m=st.integers(2, 5), groups=st.integers(1, 8),
       pairs=st.integers(1, 6))
def test_every_multiplier_with_pair_rows_bounds_the_lp(seed: int, n: int, m: int, groups: int, pairs: int) -> None:
    """Weak duality: D at random non-negative multipliers on capacity, SI, group rows and pair rows."""
    a, E, ref, rho, opt = _instance(seed, n, m)
    size = a.gpus.astype(float)
    labels = group_jobs(a.V, a.usable, rho, groups)
    I, K = group_pairs(labels, pairs, seed=seed)
    assert (labels[I] == labels[K]).all() and (I != K).all() and len(set(zip(I, K))) == len(I)
    G = int(labels.max()) + 1
    group_rho = np.zeros(G)
    group_rho[labels] = rho
    theta = np.minimum(1.0, rho[:, None] / group_rho[None, :])
    rng = np.random.default_rng(seed)
    for q in range(6):                       # float32 group multipliers too, as group_dual_bound keeps them
        A = rng.uniform(0, 1, (n, G)).astype(np.float32 if q % 2 else np.float64)
        value, _ = dual_value(a.V * a.usable, a.usable, size, a.capacity, ref, labels, theta,
                              rng.uniform(0, 3, m), rng.uniform(0, 2, n), A,
                              pairs=(I, K, np.minimum(1.0, rho[I] / rho[K])), B=rng.uniform(0, 2, len(I)))
        assert not _below(value, opt)
    # D at float32 multipliers is D at those same numbers in float64 (no float32 arithmetic in it)
    pi, sigma, B = rng.uniform(0, 3, m), rng.uniform(0, 2, n), rng.uniform(0, 2, len(I))
    A32 = rng.uniform(0, 1, (n, G)).astype(np.float32)
    args = (a.V * a.usable, a.usable, size, a.capacity, ref, labels, theta, pi, sigma)
    pr = (I, K, np.minimum(1.0, rho[I] / rho[K]))
    assert dual_value(*args, A32, pairs=pr, B=B)[0] == dual_value(*args, A32.astype(np.float64), pairs=pr, B=B)[0]


def test_step_groups_shrinks_only_under_a_short_limit() -> None:
    """Fewer groups only when the limit would give under MIN_STEPS steps; never under MIN_GROUPS."""
    from gpuplan.solvers.oef.dual import MIN_GROUPS, MIN_STEPS, STEP_ENTRY_S, step_groups

    assert step_groups(100, 10_000, None) == 100
    assert step_groups(100, 1_000, 10.0) == 100
    roomy = MIN_STEPS * STEP_ENTRY_S * 10_000 * 100
    assert step_groups(100, 10_000, roomy) == 100
    assert step_groups(100, 10_000, roomy / 2) == 50
    assert step_groups(100, 10_000, 1e-6) == MIN_GROUPS
    assert step_groups(5, 10_000, 1e-6) == 5
