"""OEF at scale: the EF row generation against the full LP, its oracle, the time-limit plan, and
solve-then-check on random inputs with multi-GPU jobs on small nodes."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix, vstack

from gpuplan import api
from gpuplan.models.oef import EF, PE, SI, arrays, efficiency, envy_pairs, equal_share, utilities
from gpuplan.models.plan import Status
from gpuplan.solvers.oef.ef import envy_free_mix, solve_ef_lp, violated_envy

TYPES = ["K80", "P100", "V100", "A100-80GB", "H100"]
POWER = np.array([1.0, 2.6, 4.5, 9.0, 18.0])


def distinct_doc(rng: np.random.Generator, n: int, m: int, *, rounds: int = 0, sizes=(1, 2, 4),
                 node: int = 8, load: float = 1.6) -> dict:
    """n single-job tenants, each with its own speedup vector (power^alpha x noise), weights 1-2."""
    types = TYPES[:m]
    gpus = rng.choice(sizes, size=n)
    per = max(node, int(round(gpus.sum() / load / m / node)) * node)
    tenants = []
    for i in range(n):
        speed = POWER[:m] ** rng.uniform(0.1, 1.1) * np.exp(rng.normal(0, 0.2, m))
        if m > 2 and rng.random() < 0.15:
            speed[rng.integers(1, m)] = 0.0          # a type this job cannot use
        tenants.append({"name": f"u{i}", "weight": float(rng.choice([1.0, 2.0])),
                        "jobs": [{"name": "j", "gpus": int(gpus[i]),
                                  "throughput": {t: round(float(s), 4) for t, s in zip(types, speed)}}]})
    return {"kind": "oef", "cluster": {"gpus": {t: per for t in types}, "gpus_per_node": node},
            "tenants": tenants, "rounds": rounds}


def full_lp(a) -> float:
    """Max efficiency s.t. time, capacity, SI and ALL n(n-1) envy rows, built here with scipy."""
    n, m = a.V.shape
    N = n * m
    idx = np.arange(N).reshape(n, m)
    cap = coo_matrix((np.repeat(a.gpus, m), (np.tile(np.arange(m), n), idx.ravel())), shape=(m, N))
    time_rows = coo_matrix((np.ones(N), (np.repeat(np.arange(n), m), idx.ravel())), shape=(n, N))
    si = coo_matrix((-a.V.ravel(), (np.repeat(np.arange(n), m), idx.ravel())), shape=(n, N))
    rho = a.weight / a.gpus
    rows, cols, vals = [], [], []
    r = 0
    for i in range(n):
        for k in range(n):
            if i == k:
                continue
            theta = min(1.0, rho[i] / rho[k])
            rows += [r] * (2 * m)
            cols += list(idx[k]) + list(idx[i])
            vals += list(theta * a.V[i]) + list(-a.V[i])
            r += 1
    envy = csr_matrix((vals, (rows, cols)), shape=(r, N))
    A = vstack([cap, time_rows, si, envy]).tocsr()
    b = np.concatenate([a.capacity, np.ones(n), -utilities(a, equal_share(a)), np.zeros(r)])
    bounds = np.column_stack([np.zeros(N), a.usable.ravel().astype(float)])
    res = linprog(-(a.gpus[:, None] * a.V).ravel(), A_ub=A, b_ub=b, bounds=bounds, method="highs")
    assert res.status == 0
    return -res.fun


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n=st.integers(2, 30), m=st.integers(2, 5))
def test_row_generation_matches_the_full_lp_on_distinct_jobs(seed: int, n: int, m: int) -> None:
    problem = api.load_problem(distinct_doc(np.random.default_rng(seed), n, m))
    plan = api.solve(problem, solver="oef")
    assert plan.status is Status.OPTIMAL
    assert plan.objective == pytest.approx(full_lp(arrays(problem)), rel=1e-6, abs=1e-7)
    assert api.check(problem, plan) == []


def test_oracle_finds_every_violated_job_and_the_largest_envy() -> None:
    rng = np.random.default_rng(3)
    n, m = 60, 4
    V = rng.uniform(1, 5, (n, m))
    X = rng.dirichlet(np.ones(m), n) * rng.uniform(0, 1, (n, 1))
    X[:10] = X[10]                                        # identical bundles are tested once
    rho = rng.choice([0.25, 0.5, 1.0], n)
    I, K, G, worst = violated_envy(V, X, rho, top=2)
    U = (V * X).sum(axis=1)
    brute = np.minimum(1.0, rho[:, None] / rho[None, :]) * (V @ X.T) - U[:, None]
    np.fill_diagonal(brute, -np.inf)
    envious = np.nonzero((brute > 1e-9 * np.maximum(U, 1)[:, None]).any(axis=1))[0]
    assert set(I.tolist()) == set(envious.tolist())
    assert np.allclose(G, brute[I, K])
    for i in envious:                                     # each envious job's largest gap is among its rows
        assert brute[i].max() == pytest.approx(G[I == i].max())
    assert worst == pytest.approx((brute / np.maximum(U, 1e-9)[:, None]).max())


@pytest.mark.parametrize("hull", [False, True])
def test_stopped_rounds_return_an_envy_free_plan_with_a_certified_bound(hull: bool) -> None:
    problem = api.load_problem(distinct_doc(np.random.default_rng(11), 80, 4))
    a = arrays(problem)
    E = equal_share(a)
    ref = utilities(a, E)
    rho = a.weight / a.gpus
    res = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E, max_rounds=1, hull=hull, market=False)
    assert res.status is Status.TIME_LIMIT and "time limit" in res.message
    X = np.clip(res.Y, 0, None)
    assert envy_pairs(a, X)[0] == 0
    assert (utilities(a, X) >= ref * (1 - 1e-7) - 1e-9).all()
    full = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E)
    assert full.status is Status.OPTIMAL
    assert efficiency(a, E) - 1e-6 <= efficiency(a, X) <= full.upper_bound * (1 + 1e-9) <= res.upper_bound * (1 + 1e-9)
    t = res.stats["mix_with_equal_share"]
    if not hull and 0 < t < 1:                            # the mix is the smallest envy-free one
        raw = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E, max_rounds=1, hull=False, market=False)
        Y = (1 - t) * raw.Y + t * E
        assert np.allclose(Y, res.Y)
    if hull:                                              # the per-job mixes contain the global mix
        mixed = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E, max_rounds=1, hull=False, market=False)
        assert efficiency(a, X) >= efficiency(a, mixed.Y) * (1 - 1e-6) - 1e-6


def test_mix_is_zero_for_an_envy_free_allocation_and_one_when_the_split_is_tight() -> None:
    a = arrays(api.load_problem(distinct_doc(np.random.default_rng(5), 12, 3)))
    E = equal_share(a)
    rho = a.weight / a.gpus
    assert envy_free_mix(a.V, E, E, rho) == 0.0
    X = np.zeros_like(E)
    X[0] = a.usable[0] / a.usable[0].sum()                 # one job holds everything: the rest envy it
    t = envy_free_mix(a.V, X, E, rho)
    assert 0 < t <= 1
    assert envy_pairs(a, (1 - t) * X + t * E)[0] == 0


def test_time_limit_plan_passes_check() -> None:
    problem = api.load_problem(distinct_doc(np.random.default_rng(2), 150, 5))
    plan = api.solve(problem, solver="oef", time_limit_s=1e-4)
    assert plan.status in (Status.TIME_LIMIT, Status.OPTIMAL)
    if plan.status is Status.TIME_LIMIT:
        assert plan.guarantees == [SI, EF] and "time limit" in plan.message
    assert api.check(problem, plan) == []


SOLVERS = ["oef", "oef-si", "gavel-maxmin", "max-throughput", "equal-share", "maxmin-agnostic"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n=st.integers(2, 9))
def test_solve_then_check_holds_or_the_status_says_what_is_missed(seed: int, n: int) -> None:
    """4-GPU jobs on 4-GPU nodes: shares a whole-GPU round cannot pack make the plan 'feasible'
    with a message; nothing else may fail check."""
    rng = np.random.default_rng(seed)
    doc = distinct_doc(rng, n, 3, rounds=20, sizes=(1, 2, 4, 4), node=4, load=rng.uniform(0.8, 2.5))
    problem = api.load_problem(doc)
    for solver in SOLVERS:
        plan = api.solve(problem, solver=solver)
        violations = api.check(problem, plan)
        if plan.status is Status.OPTIMAL:
            assert violations == [], solver
        else:
            assert plan.status is Status.FEASIBLE and "round" in plan.message, solver
            assert {v.code for v in violations} <= {"round_share"}, (solver, violations)
        if PE in plan.guarantees:
            assert plan.status in (Status.OPTIMAL, Status.FEASIBLE)


@pytest.mark.slow
def test_rounds_for_ten_thousand_jobs_are_fast() -> None:
    from gpuplan.solvers.oef.rounds import schedule

    problem = api.load_problem(distinct_doc(np.random.default_rng(0), 10_000, 5, sizes=(1, 1, 2, 4, 8)))
    a = arrays(problem)
    X = equal_share(a)
    started = time.perf_counter()
    rounds = schedule(problem, a, X, 20)
    assert time.perf_counter() - started < 20          # about 3 s on a shared 2-core machine
    used = [sum(len(ids) for _, _, ids in rnd) for rnd in rounds]
    assert max(used) <= a.capacity.sum()


def test_grouped_restriction_is_envy_free_and_below_the_optimum() -> None:
    from gpuplan.solvers.oef.groups import group_jobs, grouped_ef_lp

    problem = api.load_problem(distinct_doc(np.random.default_rng(8), 120, 4))
    a = arrays(problem)
    E = equal_share(a)
    ref = utilities(a, E)
    rho = a.weight / a.gpus
    labels = group_jobs(a.V, a.usable, rho, 12)
    assert 12 <= labels.max() + 1 <= 120
    X, stats = grouped_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, labels)
    assert X is not None and stats["groups"] == labels.max() + 1
    assert envy_pairs(a, X)[0] == 0
    assert (utilities(a, X) >= ref * (1 - 1e-7) - 1e-9).all()
    assert ((a.gpus[:, None] * X).sum(axis=0) <= a.capacity * (1 + 1e-9)).all()
    best = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E)
    assert efficiency(a, E) - 1e-6 <= efficiency(a, X) <= best.upper_bound * (1 + 1e-9)
    stopped = solve_ef_lp(a.V, a.usable, a.gpus, a.capacity, rho, ref, E, max_rounds=1, groups=12,
                          time_limit_s=600, market=False, dual=False)
    assert stopped.status is Status.TIME_LIMIT
    assert "group" in stopped.stats["plan_from"]
    assert envy_pairs(a, np.clip(stopped.Y, 0, None))[0] == 0
    assert efficiency(a, stopped.Y) >= efficiency(a, X) - 1e-6
