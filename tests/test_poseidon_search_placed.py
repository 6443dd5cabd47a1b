"""The search's cheaper steps give the same numbers: a structure built from a combo's cached placed
terms (`_PlacedW1.structure`) equals the one built from its shapes, the round trips and dense path rows
(now from suffix sums and numpy) equal a direct sum of their terms, and those rows stay below every
layer mapping's time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.models import poseidon as P
from gpuplan.solvers import poseidon as SP
from test_poseidon_speed import TYPES, placed_structures, small

CASES = dict(types=st.lists(st.sampled_from(TYPES), min_size=2, max_size=4, unique=True),
             counts=st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4), layers=st.integers(4, 8),
             batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "llama2-7b"]),
             schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]), block=st.booleans())


def problem(types: list[str], counts: list[int], layers: int, batch: int, model: str, schedule: str,
            block: bool) -> P.PoseidonProblem:
    return small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule,
                 max_stages=4, max_interleave=2, blocking_p2p=block)


def reference_round_trip(s: SP.Structure, exchanges: bool) -> list[tuple[list[float], float]]:
    """`Structure.round_trip` written out term by term, one stage q at a time."""
    S, m, v = s.S, s.m, s.v
    out = []
    for q in range(S):
        kf = s._kf()[q]
        own = kf * s.f[q] + m * s.g[q] + s.a[q]
        coef = [s.f[k] + (s.g[k] / v if k > q else 0.0) for k in range(S)]
        coef[q] += own
        if exchanges:
            _, fmin, bwd = s.exchange_terms()
            sends = sum(s.vxch) + sum(s.vxch[(v - 1) * S + q:]) + kf * v * fmin[q] + m * bwd[q]
        else:
            sends = sum(s.vp2p) + sum(s.p2p[q:])
        const = (sum(s.ef) + sum(s.eg[q + 1:]) + (kf * s.ef[q] if v == 1 else 0.0) + m * s.eg[q] + s.a0[q]
                 + sends)
        out.append((coef, const))
    return out


@settings(max_examples=8, deadline=None)
@given(**CASES)
def test_a_structure_from_the_placed_terms_equals_the_one_from_its_shapes(types, counts, layers, batch, model,
                                                                          schedule, block) -> None:
    prob = problem(types, counts, layers, batch, model, schedule, block)
    for placed, order, v, s in placed_structures(prob):
        built = placed.structure(order, v)
        for key in ("shapes", "m", "v", "b", "f", "g", "ef", "eg", "a", "a0", "caps", "nmax", "c", "e",
                    "p2p", "vp2p"):
            assert getattr(built, key) == getattr(s, key), key
        if s.feasible():
            even = [v * n for n in SP.uniform_layers(layers // v, s.S)] if layers % v == 0 else None
            if even and s.fits(even):
                assert built.time(even) == s.time(even)


@settings(max_examples=8, deadline=None)
@given(**CASES)
def test_the_round_trips_and_path_rows_equal_their_terms_and_stay_below_every_mapping(
        types, counts, layers, batch, model, schedule, block) -> None:
    prob = problem(types, counts, layers, batch, model, schedule, block)
    cm = P.CostModel(prob)
    for s in SP.structures(prob, cm, interleaved=True):
        for exchanges in (False, True):
            for (coef, const), (rc, rk) in zip(s.round_trip(exchanges), reference_round_trip(s, exchanges)):
                assert coef == rc
                assert const == pytest.approx(rk, rel=1e-13)
        if not s.feasible():
            continue
        rows = s.dense_paths()
        assert len(rows) == s.S + (s.S - 1 if s.v == 1 and s.S > 1 else 1)
        for n in mappings(s):
            t = s.time(n)
            if t < math.inf:
                for coef, const in rows:
                    assert const + sum(c * k for c, k in zip(coef, n)) <= t * (1 + 1e-12), (s.shapes, s.m, s.v, n)


def mappings(s: SP.Structure) -> list[list[int]]:
    """A few layer mappings of a structure that fit: the even split and the time-balanced one."""
    v, L = s.v, s.cm.p.model.num_layers
    out = [s.balanced()[1]]
    if L % v == 0 and L // v >= s.S:
        out.append([v * n for n in SP.uniform_layers(L // v, s.S)])
    return [n for n in out if s.fits(n)]
