"""A better envy-free plan from a few candidate allocations: the EF LP restricted to per-job mixes.

Given K allocations C^1..C^K (n x m time fractions each; C^1 envy-free and SI, e.g. the equal
split or the grouped restriction), every job i gets its own convex combination
x_i = sum_q lam_iq C^q_i of its K candidate rows. That set of allocations is a *restriction* of the
EF LP (it lies inside time and usable-type limits; capacity, SI and envy are imposed as rows), so
its optimum is a feasible envy-free, SI plan whose efficiency is at least C^1's. Its variables
number n x K (K = 2-4), and an envy row (i, k) has 2K non-zeros, so HiGHS solves it far faster
than the full LP (n x m variables, rows with 2m non-zeros, heavily degenerate). Envy rows are
generated on demand with the same exact all-pairs oracle as the full LP (solvers/oef/ef.py), so
the result is envy-free on every pair, not sampled ones.

Typical use: at a time limit, the last relaxed optimum of the full LP is nearly envy-free but not
quite; mixing it with the equal split by one global t often ends at the equal split itself (E is
tight between jobs of equal rho and usable types), while a per-job mix keeps most of it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

MIX_TOL = 1e-7        # envy a finished LP may keep (relative to max(U_i, 1)): HiGHS's tolerance; check allows 1e-6


def hull_ef_lp(V: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray, si_ref: np.ndarray,
               candidates: list[np.ndarray], *, time_limit_s: float | None = None, top: int = 3,
               max_rounds: int = 200, oracle_s: float = 0.0) -> tuple[np.ndarray, dict[str, Any]]:
    """Return (job rows n x m, stats) of max efficiency over per-job mixes of `candidates` s.t.
    capacity, SI (U >= si_ref) and envy-freeness on every pair.

    candidates[0] must be envy-free and SI; the result is never below its efficiency (in the units
    of size x V: slowest-GPU equivalents). When the time limit stops the rounds, the last LP point
    is mixed with candidates[0] by the smallest envy-free t (ef.envy_free_mix), so the rows
    returned are always envy-free and SI (the same mix removes envy that HiGHS's feasibility
    tolerance leaves on rows already in the LP: then t is tiny). stats: hull_rounds, hull_rows,
    hull_finished, hull_mix_back (t). oracle_s: the expected seconds of one all-pairs oracle pass,
    left free after each LP so the rounds end within time_limit_s.
    """
    import highspy
    from scipy.sparse import coo_matrix, csr_matrix, vstack

    from gpuplan.solvers.backends import _silence_highs_banner
    from gpuplan.solvers.oef.ef import add_rows, envy_free_mix, violated_envy

    _silence_highs_banner()
    started = time.perf_counter()
    base = candidates[0]
    C = np.stack(candidates, axis=1)                         # n x K x m
    n, K, m = C.shape
    UC = np.einsum("ij,iqj->iq", V, C)                       # each candidate's own utility
    N = n * K
    cols = np.arange(N)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.addVars(N, np.zeros(N), np.ones(N))
    h.changeColsCost(N, cols.astype(np.int32), -(size[:, None] * UC).ravel())
    conv = coo_matrix((np.ones(N), (np.repeat(np.arange(n), K), cols)), shape=(n, N)).tocsr()
    h.addRows(n, np.ones(n), np.ones(n), conv.nnz, conv.indptr[:-1].astype(np.int32),
              conv.indices.astype(np.int32), conv.data)
    cap = coo_matrix(((size[:, None, None] * C).transpose(2, 0, 1).ravel(),
                      (np.repeat(np.arange(m), N), np.tile(cols, m))), shape=(m, N))
    si = coo_matrix((-UC.ravel(), (np.repeat(np.arange(n), K), cols)), shape=(n, N))
    add_rows(h, vstack([cap, si]), np.concatenate([capacity, -si_ref]))
    X_last: np.ndarray | None = None
    added = 0
    have = np.zeros(0, dtype=np.int64)                       # i * n + k of the envy rows in the LP
    finished = False
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - started) - oracle_s
            if left <= 0:
                break
            h.setOptionValue("time_limit", float(h.getRunTime() + left))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        lam = np.clip(np.asarray(h.getSolution().col_value).reshape(n, K), 0.0, None)
        X_last = np.einsum("iq,iqj->ij", lam / lam.sum(axis=1, keepdims=True), C)
        I, Kk, _, _ = violated_envy(V, X_last, rho, top=top)
        key = I.astype(np.int64) * n + Kk
        new = ~np.isin(key, have)
        I, Kk = I[new], Kk[new]
        if not len(I):     # none, or only rows already in the LP (violated within HiGHS's tolerance)
            finished = True
            break
        have = np.concatenate([have, key[new]])
        theta = np.minimum(1.0, rho[I] / rho[Kk])
        other = theta[:, None] * np.einsum("rj,rqj->rq", V[I], C[Kk])     # theta V_i . C^q_k
        r = np.repeat(np.arange(len(I)), K)
        A = csr_matrix((np.concatenate([other.ravel(), -UC[I].ravel()]),
                        (np.concatenate([r, r]), np.concatenate([(Kk[:, None] * K + np.arange(K)).ravel(),
                                                                 (I[:, None] * K + np.arange(K)).ravel()]))),
                       shape=(len(I), N))
        A.sum_duplicates()
        add_rows(h, A, np.zeros(len(I)))
        added += len(I)
    stats = {"hull_rounds": rounds, "hull_rows": added, "hull_finished": finished}
    if X_last is None:
        return base, stats
    t = envy_free_mix(V, X_last, base, rho, tol=MIX_TOL)     # 0 when the rows hold to MIX_TOL
    stats["hull_mix_back"] = t
    return (1 - t) * X_last + t * base, stats
