"""The path bounds with Megatron's blocking exchanges held by the ops (`Structure.exchange_terms`) stay
below the DAG time of EVERY layer mapping, on random small 3-4-type instances with tensor parallelism
(so the exchanges include the all-gather across TP) and with interleaving; the range test built on
them never prunes a structure just above its own optimum, and at the space's optimum prunes only
structures that cannot beat it."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.models import poseidon as P
from gpuplan.solvers import poseidon as SP
from test_poseidon_speed import TYPES, placed_structures, small


def mappings(s: SP.Structure) -> list[list[int]]:
    """Every contiguous layer mapping of structure s (counts multiples of its interleave)."""
    L = s.cm.p.model.num_layers
    out = []
    for cuts in itertools.combinations(range(1, L), s.S - 1):
        b = (0,) + cuts + (L,)
        n = [b[i + 1] - b[i] for i in range(s.S)]
        if all(x % s.v == 0 for x in n):
            out.append(n)
    return out


def chain_bound(s: SP.Structure, n: list[int]) -> float:
    """Bound (1) with the exchanges for mapping n: every stage's chain, then its all-reduce."""
    chain = s.exchange_terms()[0]
    return max(s.m * (k * c + e + x) + k * a + a0 for k, c, e, x, a, a0 in zip(n, s.c, s.e, chain, s.a, s.a0))


@settings(max_examples=10, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=3, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       per_node=st.sampled_from([2, 4]), schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_exchange_path_bounds_are_below_every_layer_mapping(types, counts, layers, batch, model, per_node,
                                                            schedule) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, per_node=per_node,
                 schedule=schedule, max_stages=4, max_interleave=2)
    assert prob.blocking_p2p
    cm = P.CostModel(prob)
    rows = []
    for s in SP.structures(prob, cm, interleaved=True):
        if not s.feasible():
            continue
        times = [(s.time(n), n) for n in mappings(s)]
        for t, n in times:
            if t == math.inf:
                continue
            assert chain_bound(s, n) <= t * (1 + 1e-12), (s.shapes, s.m, s.v, n)
            for coef, const in s.dense_paths():
                assert const + sum(c * k for c, k in zip(coef, n)) <= t * (1 + 1e-12), (s.shapes, s.m, s.v, n)
        best = min(times)[0] if times else math.inf
        if best < math.inf:
            assert s.lower_bound() <= best * (1 + 1e-12)
            assert not s.cannot_beat(best * (1 + 1e-7)), (s.shapes, s.m, s.v, best)
        rows.append((s, best))
    finite = [t for _, t in rows if t < math.inf]
    if finite:
        opt = min(finite)
        for s, t in rows:
            if s.cannot_beat(opt) or s.lower_bound(opt) >= opt:
                assert t >= opt * (1 - 1e-9), (s.shapes, s.m, s.v, t, opt)


def test_exchanges_make_the_bounds_tighter_where_they_block() -> None:
    """On a 4-type instance with TP > 1 the exchange-aware lower bound exceeds the one with the
    exchanges treated as non-blocking sends on some structures (it cuts more) and is never below it;
    without blocking exchanges every exchange term is zero."""
    prob = small({"A100-80GB": 4, "V100": 4, "T4": 2, "L4": 2}, layers=8, per_node=4, max_stages=4)
    cm = P.CostModel(prob)
    tighter = 0
    for s in itertools.islice((x for x in SP.structures(prob, cm, interleaved=True) if x.feasible() and x.S > 1), 200):
        plain = SP.Structure(s.cm, s.shapes, s.m, s.v)
        plain.block = False
        assert s.lower_bound() >= plain.lower_bound() * (1 - 1e-12)
        tighter += s.lower_bound() > plain.lower_bound() * (1 + 1e-9)
    assert tighter > 0
    loose = small({"A100-80GB": 4, "V100": 4}, layers=8, per_node=4, blocking_p2p=False)
    for s in itertools.islice(SP.structures(loose, P.CostModel(loose), interleaved=True), 50):
        assert s.exchange_terms() == ([0.0] * s.S,) * 3


@settings(max_examples=8, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=3, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4), layers=st.integers(4, 8),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       per_node=st.sampled_from([2, 4]), schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_placed_tests_with_exchanges_never_prune_a_structure_faster_than_the_cutoff(types, counts, layers, batch,
                                                                                  model, per_node,
                                                                                  schedule) -> None:
    """Before a structure is built: the placed exchanges equal the built structure's, and bound (1)
    with them (`_PlacedW1.cannot_beat`) and the fill-and-drain path over the ranges it leaves
    (`_PlacedW1.ranged_fill_drain`) never prune a structure just above its best time over every cut
    set, and at the space's optimum prune only structures that cannot beat it."""
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, per_node=per_node,
                 schedule=schedule, max_stages=4, max_interleave=2)
    rows = []
    for placed, order, v, s in placed_structures(prob):
        chains = [x for k, start, prev, nxt in placed._placed(order, v)
                  for x in placed._chains(k, start, v, prev, nxt)]
        assert chains == s.exchange_terms()[0]
        if s.S > 1:
            sends = placed._path_sends(order, v, sum(s.p2p))
            assert math.isclose(sends, s._fill_drain_sends(), rel_tol=1e-12)
        t = SP.all_cuts_map(s, SP.Stats())[0] if s.feasible() else math.inf
        rows.append((placed, order, v, s, t))
    finite = [t for *_, t in rows if t < math.inf]
    if not finite:
        return
    best = min(finite)
    for placed, order, v, s, t in rows:
        sends = sum(s.p2p)
        for cut in ([t * (1 + 1e-7)] if t < math.inf else []) + [best]:
            if placed.cannot_beat(order, v, cut) or placed.ranged_fill_drain(order, v, cut, sends):
                assert t >= cut * (1 - 1e-9), (s.shapes, s.m, v, t, cut)
