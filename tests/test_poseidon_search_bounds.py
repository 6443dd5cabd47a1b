"""The search's newer pruning keeps the optimum: the integer range test (`Structure.cannot_beat`) never
prunes a structure with a layer mapping faster than the cutoff, the greedy min-max is the exact integer
min-max, the type-order bound with the sends stays below every layer mapping, the pruned search equals
the unpruned one on 3-4 types, and a fixed configuration evaluates to the time of the plan the search
returns for it."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models import poseidon as P
from gpuplan.models.plan import Status
from gpuplan.models.poseidon.config import evaluate_config
from gpuplan.registry import no_progress
from gpuplan.solvers import poseidon as SP
from gpuplan.solvers.poseidon.bounds import list_combos
from test_poseidon_speed import TYPES, placed_structures, small


def exact_times(prob: P.PoseidonProblem) -> list[tuple[SP.Structure, float]]:
    """Every feasible structure of the space with its best time over EVERY cut set."""
    cm = P.CostModel(prob)
    out = []
    for s in SP.structures(prob, cm, interleaved=True):
        if s.feasible():
            out.append((s, SP.all_cuts_map(s, SP.Stats())[0]))
    return out


# ---- the integer range test ----------------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=3, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([1, 2]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b"]),
       schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_cannot_beat_never_prunes_a_structure_faster_than_the_cutoff(types, counts, layers, batch, model,
                                                                     schedule) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule,
                 max_stages=4, max_interleave=2)
    rows = exact_times(prob)
    if not rows:
        return
    best = min(t for _, t in rows)
    for s, t in rows:
        # just above its own optimum, a structure is never pruned
        assert not s.cannot_beat(t * (1 + 1e-7)), (s.shapes, s.m, s.v, t)
        # at the space's optimum, what is pruned cannot beat it
        if s.cannot_beat(best):
            assert t >= best * (1 - 1e-9)


@pytest.mark.slow
def test_cannot_beat_prunes_most_structures_at_the_optimum_and_more_than_the_lp() -> None:
    prob = small({"A100-80GB": 2, "V100": 2, "T4": 2, "L4": 2}, layers=6, batch=16, max_stages=4)
    rows = exact_times(prob)
    best = min(t for _, t in rows)
    ranged = sum(s.cannot_beat(best) for s, _ in rows)
    lp = sum(s.lp_bound() >= best for s, _ in rows)
    assert all(t >= best for s, t in rows if s.cannot_beat(best))
    assert ranged >= lp and ranged > len(rows) // 2, (ranged, lp, len(rows))


# ---- the exact min-max ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), S=st.integers(1, 4), v=st.sampled_from([1, 1, 2]))
def test_the_greedy_min_max_is_the_exact_integer_min_max(data, S: int, v: int) -> None:
    prob = small({"A100-80GB": 4}, layers=8, batch=16)
    cm = P.CostModel(prob)
    s = next(x for x in SP.structures(prob, cm) if x.S == 1)
    L = prob.model.num_layers
    s.S, s.v = S, v
    s.nmax = [data.draw(st.integers(1, L)) * v for _ in range(S)]
    weight = [data.draw(st.floats(0.01, 5.0)) for _ in range(S)]
    const = [data.draw(st.floats(0.0, 3.0)) for _ in range(S)]
    best = math.inf
    for n in itertools.product(*[range(v, k + 1, v) for k in s.nmax]):
        if sum(n) == L:
            best = min(best, max(x * w + c for x, w, c in zip(n, weight, const)))
    W, n = s.minmax_partition(weight, const)
    if best == math.inf:
        assert W == math.inf
        return
    assert W == pytest.approx(best, rel=1e-8) and W <= best
    assert sum(n) == L and all(v <= x <= k and x % v == 0 for x, k in zip(n, s.nmax))
    assert max(x * w + c for x, w, c in zip(n, weight, const)) == pytest.approx(best, rel=1e-8)


# ---- the type-order bound with the sends ---------------------------------------------------------

@settings(max_examples=6, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=2, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([2, 4]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "llama2-7b"]))
def test_the_order_bound_with_the_sends_is_below_every_layer_mapping(types, counts, layers, batch, model) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, max_stages=4)
    cm = P.CostModel(prob)
    table = list_combos(prob, cm, SP.type_options(prob), None, math.inf)
    for e in table.entries:
        S = sum(o.stages for o in e.used)
        vs = [1] + SP.interleaves(prob, S, e.m)
        inner, across = SP._combo_sends(cm, e.m, e.used)
        for i, order in enumerate(itertools.permutations(range(len(e.used)))):
            sends = inner + sum(across[a][b] for a, b in zip(order, order[1:]))
            for j, v in enumerate(vs):
                s = SP._structure_at(prob, cm, (e.m, e.used), i * len(vs) + j)
                assert sends == pytest.approx(sum(s.p2p), rel=1e-12)
                exact, _ = SP.all_cuts_map(s, SP.Stats()) if s.feasible() else (math.inf, [])
                assert e.order_bound(order, v, sends) <= exact * (1 + 1e-12)


# ---- bound (1) at each stage's position, before the structure is built ------------------------------

@settings(max_examples=6, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=3, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([1, 2]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_the_placed_w1_test_never_prunes_a_structure_faster_than_the_cutoff(types, counts, layers, batch, model,
                                                                           schedule) -> None:
    """`_PlacedW1.cannot_beat` (before building) and `Structure.w1_exceeds` (built) never prune a
    structure just above its best time over every cut set, and at the space's optimum prune only
    structures that cannot beat it; the placed test prunes no more than the built one; the placed
    fill-and-drain path (`_PlacedW1.fill_drain`) is at most the best time over every cut set."""
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule,
                 max_stages=4, max_interleave=2)
    rows = []
    for placed, order, v, s in placed_structures(prob):
        t = SP.all_cuts_map(s, SP.Stats())[0] if s.feasible() else math.inf
        rows.append((placed, order, v, s, t))
        if s.S > 1 and s.feasible():  # the placed fill-and-drain path is below every cut set
            sends = sum(s.p2p)
            assert placed.fill_drain(order, v, sends) * (1 - 1e-9) <= t * (1 + 1e-12), (s.shapes, s.m, v)
    finite = [t for *_, t in rows if t < math.inf]
    if not finite:
        return
    best = min(finite)
    for placed, order, v, s, t in rows:
        for cut in ([t * (1 + 1e-7)] if t < math.inf else []) + [best]:
            pre, built = placed.cannot_beat(order, v, cut), s.S > 1 and s.w1_exceeds(cut)
            assert not pre or built or not s.feasible(), (s.shapes, s.m, v, cut)
            if pre or built:
                assert t >= cut * (1 - 1e-9), (s.shapes, s.m, v, t, cut)
            if pre or built:  # then the lower bound at the cutoff prunes too
                assert not s.feasible() or s.lower_bound(cut) >= cut


# ---- the search against the unpruned one, on 3-4 types ---------------------------------------------

@settings(max_examples=6, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=3, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([1, 2]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_the_search_equals_the_unpruned_one_on_three_and_four_types(types, counts, layers, batch, model,
                                                                    schedule) -> None:
    _same_as_unpruned(small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule,
                            max_stages=4), workers=1)


@pytest.mark.slow
def test_the_pooled_search_equals_the_unpruned_one_on_four_types() -> None:
    _same_as_unpruned(small({"A100-80GB": 2, "V100": 2, "T4": 2, "L4": 2}, layers=8, batch=16, max_stages=4),
                      workers=2)


def _same_as_unpruned(prob: P.PoseidonProblem, workers: int) -> None:
    try:
        full = SP.solve_poseidon(prob, progress=no_progress, prune=False, workers=1)
    except Exception as exc:  # nothing fits: the pruned search says the same
        with pytest.raises(type(exc)):
            SP.solve_poseidon(prob, progress=no_progress, workers=workers)
        return
    pruned = SP.solve_poseidon(prob, progress=no_progress, workers=workers)
    assert pruned.status is Status.OPTIMAL
    assert pruned.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    assert api.check(prob, pruned) == []
    s = pruned.solver.stats
    assert s["evaluated"] + s["pruned"] + s["infeasible"] + s["unvisited"] == s["structures"]


# ---- a fixed configuration and the search's plan ---------------------------------------------------

def test_a_fixed_configuration_evaluates_to_the_time_of_the_searched_plan() -> None:
    prob = small({"A100-80GB": 8}, layers=8, batch=16, per_node=8, max_stages=4)
    plan = api.solve(prob, solver="poseidon")
    first = plan.stages[0]
    dp = len(first.gpu_ids) // first.tp
    cfg = {"tp": first.tp, "pp": len(plan.stages), "dp": dp,
           "micro_batch": prob.global_batch // (plan.num_microbatches * dp),
           "layers": [s.last_layer - s.first_layer for s in plan.stages],
           "recompute": [s.recompute for s in plan.stages], "interleave": plan.interleave}
    fixed = evaluate_config(prob, cfg)
    assert fixed.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-9)
