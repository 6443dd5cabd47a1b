"""Tests before a structure is built: the least all-reduce slope cached by a stage shape's layout
equals a fresh computation, and the placed range test (`_PlacedW1.ranged_paths`) never prunes a
structure whose optimum is below the cutoff, nor one its own range test keeps."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.models import poseidon as P
from gpuplan.solvers import poseidon as SP
from test_poseidon_speed import TYPES, placed_structures, small

CASES = dict(types=st.lists(st.sampled_from(TYPES), min_size=2, max_size=4, unique=True),
             counts=st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4), layers=st.integers(4, 8),
             batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "llama2-7b"]),
             schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]), block=st.booleans())


def random_shapes(prob: P.PoseidonProblem, rng: random.Random, count: int) -> list[P.StageShape]:
    """Stage shapes of random devices of one type each (any ids, so equal layouts recur with other ids)."""
    cl, out = prob.cluster, []
    by_type: dict[str, list] = {}
    for d in cl.devices:
        by_type.setdefault(d.type, []).append(d)
    for _ in range(count):
        devs = by_type[rng.choice(sorted(by_type))]
        tp = rng.choice([t for t in (1, 2, 4) if t <= len(devs)])
        dp = rng.randint(1, len(devs) // tp)
        group = rng.sample(devs, tp * dp)
        out.append(P.StageShape(group[0].type, tp, dp, tuple(d.id for d in group),
                                tuple(dict.fromkeys(d.node for d in group))))
    return out


@settings(max_examples=12, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES + ["H200", "L40S"]), min_size=1, max_size=3, unique=True),
       counts=st.lists(st.sampled_from([2, 4, 6, 8, 16]), min_size=3, max_size=3),
       per_node=st.sampled_from([2, 4, 8]), seed=st.integers(0, 10 ** 6))
def test_the_least_slope_cached_by_layout_equals_a_fresh_computation(types, counts, per_node, seed) -> None:
    prob = small(dict(zip(types, counts)), layers=6, per_node=per_node, model="llama2-7b")
    rng = random.Random(seed)
    cm = P.CostModel(prob)  # shared: shapes of equal layout read each other's cached slope
    L = prob.model.num_layers
    shapes = random_shapes(prob, rng, 40) + [sh for opts in SP.type_options(prob).values()
                                             for o in opts for sh in o.shapes]
    for sh in shapes:
        first, last, S = rng.random() < 0.3, rng.random() < 0.3, rng.choice([1, 2, 3])
        a0 = cm.tail_s(sh, 0, first, last, S)
        fresh_cm = P.CostModel(prob)
        fresh_a0 = fresh_cm.tail_s(sh, 0, first, last, S)
        fresh = min((fresh_cm.tail_s(sh, n, first, last, S) - fresh_a0) / n for n in range(1, L + 1))
        assert SP._min_slope(cm, sh, first, last, S, a0) == fresh, sh
    assert len(cm.__dict__["_min_slope"]) <= len(shapes)


def combo_sends(placed: SP._PlacedW1, order: tuple[int, ...]) -> float:
    """The sends of a type order as `_combo_structures` sums them (seconds)."""
    inner, across = SP._combo_sends(placed.cm, placed.m, placed.used)
    return inner + sum(across[a][b] for a, b in zip(order, order[1:]))


def check_ranged_paths(prob: P.PoseidonProblem) -> int:
    """Assert, for every structure of `prob` at interleave 1, that `ranged_paths` keeps it at its
    exact optimum (all cuts), and that wherever it prunes (at a few cutoffs around the optimum) the
    optimum is at least the cutoff and the structure's own `cannot_beat` prunes too; return the
    number of prunes."""
    pruned = 0
    for placed, order, v, s in placed_structures(prob):
        if v != 1 or s.S < 2:
            continue
        sends = combo_sends(placed, order)
        exact = SP.all_cuts_map(s, SP.Stats())[0] if s.feasible() else math.inf
        if exact < math.inf:
            assert not placed.ranged_paths(order, exact, sends), (s.shapes, s.m, exact)
            cutoffs = [exact * k for k in (0.5, 0.8, 0.9, 0.95, 0.99, 1.0, 1.01, 1.1)]
        else:
            cutoffs = [1.0, 10.0]
        for cut in cutoffs:
            if placed.ranged_paths(order, cut, sends):
                pruned += 1
                assert exact >= cut, (s.shapes, s.m, cut, exact)
                assert s.cannot_beat(cut), (s.shapes, s.m, cut)
    return pruned


@settings(max_examples=10, deadline=None)
@given(**CASES)
def test_the_placed_range_test_never_prunes_below_the_optimum(types, counts, layers, batch, model, schedule,
                                                              block) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule,
                 max_stages=4, max_interleave=2, blocking_p2p=block)
    check_ranged_paths(prob)


def test_the_placed_range_test_prunes_on_a_four_type_cluster() -> None:
    for block in (True, False):
        prob = small({"A100-80GB": 2, "V100": 2, "T4": 2, "H100": 2}, layers=8, model="llama2-7b",
                     max_stages=4, blocking_p2p=block)
        assert check_ranged_paths(prob) > 0
