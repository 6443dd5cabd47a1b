"""`backends.small_lp` (HiGHS without scipy's set-up) against `scipy.optimize.linprog` on random dense LPs
of the shape Poseidon's path-bound LP has: minimise t over real layer counts in boxes that sum to L,
with t above every row."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from gpuplan.solvers.backends import small_lp


@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 10), rows=st.integers(1, 30), L=st.integers(1, 80), seed=st.integers(0, 2**31 - 1))
def test_small_lp_equals_linprog(S: int, rows: int, L: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    A = np.hstack([rng.random((rows, S)) * rng.choice([0.0, 1.0], (rows, S)), -np.ones((rows, 1))])
    b = -rng.random(rows) * 3
    lower, upper = [1.0] * S + [0.0], [float(k) for k in rng.integers(1, 20, S)] + [np.inf]
    cost = np.zeros(S + 1)
    cost[S] = 1.0
    ref = linprog(cost, A_ub=A, b_ub=b, A_eq=[[1.0] * S + [0.0]], b_eq=[float(L)],
                  bounds=list(zip(lower, [None if u == np.inf else u for u in upper])), method="highs")
    got = small_lp(cost, A, b, [[1.0] * S + [0.0]], [float(L)], lower, upper)
    if ref.status == 2:  # infeasible: the boxes cannot sum to L
        assert got is None
        return
    assert ref.status == 0 and got is not None
    value, x = got
    assert abs(value - ref.fun) <= 1e-9 * max(1.0, abs(ref.fun))
    assert abs(sum(x[:S]) - L) <= 1e-7 * L
    assert all(lo - 1e-9 <= v <= hi + 1e-9 for v, lo, hi in zip(x, lower, upper))
    assert (A @ np.asarray(x) <= b + 1e-7).all()
