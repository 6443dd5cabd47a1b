"""A fast envy-free plan for a time limit: the EF LP restricted to one shared bundle per group.

Jobs are grouped by (rho = weight / gpus, usable types) and, within that, by the direction of their
speedup vectors (k-means on log V, seeded, so deterministic). Every job of a group gets the same
bundle y_G (time fractions). That is a *restriction* of the EF LP, so its optimum is a feasible
envy-free, SI plan of the full problem (a lower bound on its optimum):

* jobs with the same bundle never envy each other (theta_ik <= 1);
* job i in G does not envy any job of group H iff min(1, rho_i / min_{k in H} rho_k) V_i . y_H <=
  V_i . y_G: n x groups rows, added on demand by the same exact oracle idea (all pairs checked);
* the equal split E is of this form (jobs of equal rho and usable types have equal E rows), so the
  restricted LP is feasible.

The LP has groups x types columns, so it solves in seconds where the full one does not.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def group_jobs(V: np.ndarray, usable: np.ndarray, rho: np.ndarray, groups: int, seed: int = 0,
               features: np.ndarray | None = None) -> np.ndarray:
    """Return a group label per job: blocks of equal (rho, usable types), each split by k-means on
    log speedup direction (and the columns of `features`, rows x anything, when given: e.g. each
    job's bundle in a good plan) into a share of `groups` proportional to its size (at least 1)."""
    n = len(V)
    key = np.column_stack([np.round(rho, 12), usable])
    _, block = np.unique(key, axis=0, return_inverse=True)
    block = block.ravel()
    L = np.log(np.where(usable, V, 1.0))
    L = np.where(usable, L - L.mean(axis=1, keepdims=True), 0.0)
    if features is not None:
        L = np.column_stack([L, features])
    labels = np.zeros(n, dtype=int)
    rng = np.random.default_rng(seed)
    nxt = 0
    for b in range(block.max() + 1):
        members = np.nonzero(block == b)[0]
        k = max(1, min(len(members), int(round(groups * len(members) / n))))
        pts = L[members]
        centres = pts[rng.choice(len(members), size=k, replace=False)]
        assign = np.zeros(len(members), dtype=int)
        for _ in range(8):
            # squared distances up to the per-point constant |p|^2: one matrix product
            d = (centres ** 2).sum(axis=1)[None, :] - 2.0 * pts @ centres.T
            assign = d.argmin(axis=1)
            sums = np.zeros_like(centres)
            np.add.at(sums, assign, pts)
            size = np.bincount(assign, minlength=k)
            centres[size > 0] = sums[size > 0] / size[size > 0, None]
        _, assign = np.unique(assign, return_inverse=True)
        labels[members] = nxt + assign.ravel()
        nxt += int(assign.max()) + 1
    return labels


def grouped_ef_lp(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray,
                  si_ref: np.ndarray, labels: np.ndarray, *, time_limit_s: float | None = None,
                  top: int = 3, max_rounds: int = 200) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Return (job rows n x m of the restricted EF LP's optimum, or None if it did not finish, stats).

    Raises nothing on a time limit: None says no plan was finished.
    """
    import highspy
    from scipy.sparse import coo_matrix, csr_matrix, vstack

    from gpuplan.solvers.backends import _silence_highs_banner
    from gpuplan.solvers.oef.ef import add_rows

    _silence_highs_banner()
    started = time.perf_counter()
    n, m = V.shape
    G = int(labels.max()) + 1
    N = G * m
    allowed = np.ones((G, m), dtype=bool)
    np.logical_and.at(allowed, labels, usable)
    rho_min = np.full(G, np.inf)
    np.minimum.at(rho_min, labels, rho)
    obj = np.zeros((G, m))
    np.add.at(obj, labels, size[:, None] * V)
    gsize = np.bincount(labels, weights=size, minlength=G)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.addVars(N, np.zeros(N), allowed.ravel().astype(float))
    h.changeColsCost(N, np.arange(N, dtype=np.int32), -obj.ravel())

    j = np.arange(m)
    time_rows = coo_matrix((np.ones(N), (np.repeat(np.arange(G), m), np.arange(N))), shape=(G, N))
    cap_rows = coo_matrix((np.repeat(gsize, m), (np.tile(j, G), np.arange(N))), shape=(m, N))
    si_rows = coo_matrix((-V.ravel(), (np.repeat(np.arange(n), m), (labels[:, None] * m + j).ravel())),
                         shape=(n, N))
    add_rows(h, vstack([time_rows, cap_rows, si_rows]), np.concatenate([np.ones(G), capacity, -si_ref]))
    have: set[int] = set()
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - started)
            if left <= 0:
                return None, {"groups": G, "group_lp_rounds": rounds - 1}
            h.setOptionValue("time_limit", float(h.getRunTime() + left))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None, {"groups": G, "group_lp_rounds": rounds}
        Y = np.asarray(h.getSolution().col_value).reshape(G, m)
        U = (V * Y[labels]).sum(axis=1)
        gap = np.minimum(1.0, rho[:, None] / rho_min[None, :]) * (V @ Y.T) - U[:, None]
        gap[np.arange(n), labels] = -np.inf
        tol = 1e-9 * np.maximum(U, 1.0)
        t = min(top, G)
        hh = np.argpartition(-gap, t - 1, axis=1)[:, :t]
        vv = np.take_along_axis(gap, hh, axis=1)
        r, s = np.nonzero(vv > tol[:, None])
        I, H = r, hh[r, s]
        key = I.astype(np.int64) * G + H
        new = np.array([q not in have for q in key.tolist()], dtype=bool)
        I, H = I[new], H[new]
        if not len(I):
            return Y[labels], {"groups": G, "group_lp_rounds": rounds}
        have.update((I.astype(np.int64) * G + H).tolist())
        theta = np.minimum(1.0, rho[I] / rho_min[H])
        rr = np.repeat(np.arange(len(I)), m)
        data = np.concatenate([(theta[:, None] * V[I]).ravel(), -V[I].ravel()])
        cols = np.concatenate([(H[:, None] * m + j).ravel(), (labels[I][:, None] * m + j).ravel()])
        A = csr_matrix((data, (np.concatenate([rr, rr]), cols)), shape=(len(I), N))
        A.sum_duplicates()
        add_rows(h, A, np.zeros(len(I)))
    return None, {"groups": G, "group_lp_rounds": rounds}
