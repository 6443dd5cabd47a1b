"""psRL solvers: greedy within 5% of CP-SAT, the exact optimum against exhaustive search, baselines as
their sources define them, determinism, infeasibility."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models.psrl import PsrlProblem
from gpuplan.solvers.psrl import Placement, karmarkar_karp

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "psrl"
GAP = 0.05  # the stated greedy-vs-exact gap on small instances


def small(seed: int) -> PsrlProblem:
    """A random small batch: step-wise or tree rollouts, 2-4 workers, slow to fast K/V exchange."""
    r = random.Random(seed)
    gen = {"shape": r.choice(["stepwise", "tree"]), "tasks": r.randint(1, 2), "rollouts": r.randint(1, 3),
           "turns_min": 1, "turns_max": 3, "depth": 1, "branching_min": 2, "branching_max": 3,
           "system_tokens": r.choice([0, 500]), "prompt_tokens_min": 100, "prompt_tokens_max": 2000,
           "turn_tokens_min": 50, "turn_tokens_max": 800, "seed": seed}
    return api.load_problem({"kind": "psrl", "model": "qwen3-0.6b", "generate": gen,
                             "workers": [{"name": "g", "count": r.randint(2, 4)}],
                             "exchange_GBps": r.choice([0.5, 5.0, 50.0])}, "psrl")


def _within_gap(seed: int) -> None:
    p = small(seed)
    exact = api.solve(p, solver="exact", time_limit_s=20)
    greedy = api.solve(p, solver="psrl")
    assert api.check(None, exact) == [] and api.check(None, greedy) == []
    if exact.status.value == "optimal":
        assert exact.objective <= greedy.objective * (1 + 1e-9)
    assert greedy.objective <= exact.objective * (1 + GAP)


@pytest.mark.parametrize("seed", [53, 754, 783])
def test_greedy_within_gap_of_exact_known_hard(seed: int) -> None:
    """The hardest seeds found so far: 783 (8.9% off before the seeded kicks), 53 (3.0% before the compound
    moves), 754 (7.7% before the compound moves: the optimum moves one sample, swaps another and hands a
    shared prefix's computing to the worker that keeps one of its users, three steps no single move pays for)."""
    _within_gap(seed)


def test_compound_move_settles_owners() -> None:
    """Seed 754's optimum needs a swap followed by an owner change; the local search finds it in one step."""
    from gpuplan.solvers.psrl import _need_fit, local_search
    import time

    p = small(754)
    pl = Placement(p)
    for s, w in enumerate([0, 0, 1, 1]):  # the greedy's old local optimum
        pl.move([s], w)
    before = max(pl.loads)
    local_search(p, pl, _need_fit(p), time.perf_counter() + 30)
    exact = api.solve(p, solver="exact", time_limit_s=20)
    assert max(pl.loads) < before * 0.95
    assert max(pl.loads) == pytest.approx(exact.objective, rel=1e-6)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=not os.environ.get("GPUPLAN_PSRL_RANDOM"))
@given(seed=st.integers(0, 100_000))
def test_greedy_within_gap_of_exact(seed: int) -> None:
    """CI replays a fixed set of seeds; GPUPLAN_PSRL_RANDOM=1 explores new ones (seed 754 was found so)."""
    _within_gap(seed)


def _best_by_enumeration(p: PsrlProblem) -> float:
    """The best makespan over every sample -> worker assignment and every owner choice per shared node."""
    f = p.built
    W = len(p.rates)
    best = float("inf")
    for assign in itertools.product(range(W), repeat=f.n_samples):
        if assign[0] != 0:  # identical workers: fix the first sample's worker
            continue
        pl = Placement(p)
        for s, w in enumerate(assign):
            pl.move([s], w)
        shared = [v for v in range(f.n_nodes) if len(pl.cnt[v]) > 1]
        for owners in itertools.product(*[sorted(pl.cnt[v]) for v in shared]):
            for v, o in zip(shared, owners):
                pl.set_owner(v, o)
            best = min(best, max(pl.loads))
    return best


@pytest.mark.parametrize("seed", [1, 4, 7])
def test_exact_equals_exhaustive_search(seed: int) -> None:
    r = random.Random(seed)
    gen = {"shape": "stepwise", "tasks": 2, "rollouts": 1, "turns_min": 1, "turns_max": 3, "system_tokens": 300,
           "prompt_tokens_min": 100, "prompt_tokens_max": 1500, "turn_tokens_min": 50, "turn_tokens_max": 900,
           "seed": seed}
    p = api.load_problem({"kind": "psrl", "model": "qwen3-0.6b", "generate": gen, "workers": [{"name": "g", "count": 2}],
                          "exchange_GBps": r.choice([1.0, 50.0])}, "psrl")
    assert p.built.n_samples <= 6
    exact = api.solve(p, solver="exact", time_limit_s=20)
    assert exact.status.value == "optimal"
    # CP-SAT rounds times to integer microseconds: agree within that
    assert exact.objective == pytest.approx(_best_by_enumeration(p), rel=1e-3)


def test_karmarkar_karp_matches_verl() -> None:
    """verl's documented behaviour: k-way largest differencing; equal_size gives equal counts."""
    parts = karmarkar_karp([8, 7, 6, 5, 4], 2, equal_size=False)
    sums = sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in parts)
    assert sums == [14, 16]  # LDM: {8,6}|{7,5,4}... differencing gives 16 / 14 on this classic example
    vals = [random.Random(3).randint(1, 100) for _ in range(24)]
    parts = karmarkar_karp(vals, 4, equal_size=True)
    assert sorted(len(p) for p in parts) == [6, 6, 6, 6]
    assert sorted(i for p in parts for i in p) == list(range(24))
    spread = max(sum(vals[i] for i in p) for p in parts) - min(sum(vals[i] for i in p) for p in parts)
    assert spread <= max(vals)


def test_baselines_follow_their_definitions() -> None:
    p = api.load_problem(EXAMPLES / "agents-generated.yaml")
    f = p.built
    kk = api.solve(p, solver="karmarkar-karp")
    ns = api.solve(p, solver="no-sharing")
    dta = api.solve(p, solver="subtree-greedy")
    ps = api.solve(p, solver="psrl")
    for plan in (kk, ns, dta, ps):
        assert api.check(None, plan) == []
    # prefix-oblivious: every sample's whole path is computed, i.e. the raw tokens
    assert kk.predicted["computed_tokens"] == kk.predicted["raw_tokens"]
    assert kk.sharing == "none" and not kk.received
    # karmarkar-karp balances sequence lengths, not costs: its token spread is small
    names = p.worker_names()
    toks = {w: 0 for w in names}
    for s, w in enumerate(kk.sample_worker):
        toks[w] += f.sample_tokens(s)
    assert max(toks.values()) - min(toks.values()) <= max(f.sample_tokens(s) for s in range(f.n_samples))
    # subtree-greedy: every group whole on one worker, nothing exchanged
    where: dict[int, set[str]] = {}
    for s, w in enumerate(dta.sample_worker):
        where.setdefault(f.group[s], set()).add(w)
    assert all(len(ws) == 1 for ws in where.values()) and not dta.received
    # the paper's ordering of the methods on a step-wise trace
    assert ps.objective < dta.objective < kk.objective
    assert ps.objective * 3 <= kk.objective


def test_deterministic() -> None:
    p = api.load_problem(EXAMPLES / "agents-generated.yaml")
    a, b = api.solve(p, seed=3), api.solve(p, seed=3)
    assert a.sample_worker == b.sample_worker and a.computed == b.computed and a.objective == b.objective


def test_exact_refuses_large_batches() -> None:
    from gpuplan.errors import InputError

    p = api.load_problem(EXAMPLES / "agents-generated.yaml")
    with pytest.raises(InputError, match="exact takes at most"):
        api.solve(p, solver="exact")


def test_infeasible_names_the_sample() -> None:
    problem = api.load_problem(EXAMPLES / "small-agent.yaml")
    doc = problem.document()
    room = problem.static_bytes + min(problem.sample_bytes) / 2   # the model state, and half the smallest path
    doc["workers"] = [{"name": "g", "gpu": "H100", "count": 2, "memory_bytes": room}]
    plan = api.solve(doc)
    assert plan.status.value == "infeasible"
    assert "sample" in plan.message and "GiB" in plan.message


@pytest.mark.parametrize("solver", ["psrl", "karmarkar-karp", "subtree-greedy", "no-sharing"])
def test_a_worker_that_cannot_hold_the_model_state_is_named(solver: str) -> None:
    # every worker holds the model state, training or not: one too small makes the problem infeasible
    # (the solvers left it idle or gave it samples, and the plan said feasible while check refused it)
    doc = api.load_problem(EXAMPLES / "small-agent.yaml").document()
    static = api.load_problem(doc).static_bytes
    doc["workers"] = [{"name": "big", "gpu": "H100", "count": 2},
                      {"name": "small", "gpu": "T4", "count": 1, "memory_bytes": static / 2}]
    plan = api.solve(doc, solver=solver)
    assert plan.status.value == "infeasible"
    assert "small" in plan.message and "model state" in plan.message
