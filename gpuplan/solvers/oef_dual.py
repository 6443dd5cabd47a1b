"""A certified upper bound on the envy-free OEF LP without its n^2 envy rows: a Lagrangian dual.

The LP (solvers/oef_ef.py): maximise sum_k s_k V_k . x_k (s_k = size: GPUs of the row) subject to
x_k >= 0 on usable types, sum_j x_kj <= 1, capacity sum_k s_k x_k <= C, sharing incentive
V_k . x_k >= r_k and envy-freeness theta_ik V_i . x_k <= V_i . x_i for all ordered pairs.

**Relaxation.** Jobs are grouped (solvers/oef_groups.group_jobs: equal rho = weight / gpus, equal
usable types, k-means on speedup direction), so theta_ik = theta_iG is the same for every k of a
group G. Averaging i's envy rows over k in G gives the *group rows*
theta_iG V_i . avg_G(x) <= V_i . x_i (for k = i the row holds trivially: theta <= 1), n x groups
rows that every envy-free allocation satisfies: a relaxation of the LP.

**Dual.** For multipliers pi >= 0 (capacity), sigma >= 0 (SI) and A >= 0 (group rows, n x groups),
the Lagrangian keeps x's own limits (usable types, time <= 1), so its maximum over x splits per
job: D(pi, sigma, A) = pi . C - sigma . r + sum_k max(0, max_j usable c_kj) with
c_k = (s_k + sigma_k + sum_G A_kG) V_k - s_k pi - (1 / |G(k)|) sum_i A_iG(k) theta_iG(k) V_i.
By weak duality **every** D(pi, sigma, A) is an upper bound on the relaxation, hence on the full
EF LP's optimum: the bound returned is the smallest D evaluated, valid however far the
minimisation got. D is convex and piecewise linear; it is minimised by projected subgradient steps
with Adam-style scaling (deterministic; each step costs O(n x groups x m) flops: three small
matrix products). Its limit is the group relaxation's optimum (more groups: a tighter limit, slower
steps); it never reaches the full LP's optimum unless every group is a single job.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SAFETY = 1e-9          # relative margin added to the bound for floating-point rounding


def dual_value(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, si_ref: np.ndarray,
               labels: np.ndarray, theta: np.ndarray, pi: np.ndarray, sigma: np.ndarray, A: np.ndarray
               ) -> tuple[float, np.ndarray]:
    """Return (D(pi, sigma, A), the inner maximiser P: each row's chosen type at full time, or
    nothing) for the group relaxation above; D is in the objective's units (slowest-GPU
    equivalents when size is GPUs). theta: rows x groups, labels: each row's group."""
    n, m = V.shape
    count = np.bincount(labels, minlength=A.shape[1]).astype(float)
    W = (A * theta).T @ V                                           # groups x m
    c = (size + sigma + A.sum(axis=1))[:, None] * V - size[:, None] * pi[None, :] - W[labels] / count[labels, None]
    c = np.where(usable, c, -np.inf)
    j = c.argmax(axis=1)
    top = c[np.arange(n), j]
    take = top > 0
    P = np.zeros((n, m))
    P[np.nonzero(take)[0], j[take]] = 1.0
    return float(pi @ capacity - sigma @ si_ref + top[take].sum()), P


def group_dual_bound(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray,
                     si_ref: np.ndarray, *, groups: int = 100, time_limit_s: float | None = None,
                     max_iter: int = 100_000, seed: int = 0, features: np.ndarray | None = None
                     ) -> tuple[float, dict[str, Any]]:
    """Return (an upper bound on the envy-free OEF LP's optimum, stats), in the objective's units.

    Rows are jobs (or classes: any row weights give a valid relaxation). The bound is the smallest
    Lagrangian value D over the iterations (see the module docstring), plus a 1e-9 relative margin
    for rounding; it stops after max_iter steps or at time_limit_s. stats: dual_iterations,
    dual_groups, dual_seconds. features (rows x anything, optional): extra k-means coordinates for
    the grouping (group_jobs), e.g. an envy-free plan's rows: jobs holding similar bundles there
    share a group, so averaging their bundles loses less near the optimum (any grouping is a valid
    relaxation; only the bound's limit changes).
    """
    from gpuplan.solvers.oef_groups import group_jobs

    started = time.perf_counter()
    n, m = V.shape
    labels = group_jobs(V, usable, rho, max(1, min(groups, n)), seed=seed, features=features)
    G = int(labels.max()) + 1
    count = np.bincount(labels, minlength=G).astype(float)
    group_rho = np.zeros(G)
    group_rho[labels] = rho                                         # equal within a group
    theta = np.minimum(1.0, rho[:, None] / group_rho[None, :])      # rows x groups
    Vu = np.where(usable, V, 0.0)
    pi = np.array([float(Vu[usable[:, j], j].mean()) if usable[:, j].any() else 0.0 for j in range(m)])
    params = [pi, np.zeros(n), np.zeros((n, G))]
    first = [np.zeros_like(p) for p in params]
    second = [np.zeros_like(p) for p in params]
    lr0 = 0.05 * float(Vu[usable].mean()) if usable.any() else 1.0
    best = np.inf
    it = 0
    for it in range(1, max_iter + 1):
        value, P = dual_value(Vu, usable, size, capacity, si_ref, labels, theta, *params)
        best = min(best, value)
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            break
        UP = (Vu * P).sum(axis=1)
        avg = np.stack([np.bincount(labels, weights=P[:, j], minlength=G) for j in range(m)], axis=1)
        avg /= count[:, None]
        gA = Vu @ avg.T
        gA *= theta
        np.subtract(UP[:, None], gA, out=gA)                        # dD/dA: minus the group rows' envy
        grads = [capacity - (size[:, None] * P).sum(axis=0),       # dD/dpi
                 UP - si_ref,                                       # dD/dsigma
                 gA]
        lr = lr0 / np.sqrt(it / 20 + 1)
        c1, c2 = 1 - 0.9 ** it, 1 - 0.999 ** it
        for q in range(3):                  # Adam, in place: the n x groups arrays dominate a step
            g, f, s, x = grads[q], first[q], second[q], params[q]
            tmp = np.multiply(g, 0.1)
            f *= 0.9
            f += tmp
            np.multiply(g, g, out=tmp)
            tmp *= 0.001
            s *= 0.999
            s += tmp
            np.multiply(s, 1.0 / c2, out=tmp)
            np.sqrt(tmp, out=tmp)
            tmp += 1e-12
            np.divide(f, tmp, out=tmp)
            tmp *= lr / c1
            x -= tmp
            np.maximum(x, 0.0, out=x)
    bound = best + SAFETY * abs(best)
    return bound, {"dual_iterations": it, "dual_groups": G, "dual_seconds": time.perf_counter() - started}
