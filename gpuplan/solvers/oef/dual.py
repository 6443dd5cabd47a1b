"""A certified upper bound on the envy-free OEF LP without its n^2 envy rows: a Lagrangian dual.

The LP (solvers/oef/ef.py): maximise sum_k s_k V_k . x_k (s_k = size: GPUs of the row) subject to
x_k >= 0 on usable types, sum_j x_kj <= 1, capacity sum_k s_k x_k <= C, sharing incentive
V_k . x_k >= r_k and envy-freeness theta_ik V_i . x_k <= V_i . x_i for all ordered pairs.

**Relaxation.** Jobs are grouped (solvers/oef/groups.group_jobs: equal rho = weight / gpus, equal
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

**Pairs within groups.** The averaged rows leave one loophole: within a group, the relaxation may
give one member a large bundle and the others little, since only the group's average is envied.
So each job also keeps a few of its own envy rows theta_ik V_i . x_k <= V_i . x_i against other
members k of its group (`pairs_per_job`, drawn at random with the seed; rows of the full LP, so
still a relaxation), with multipliers B >= 0: c_k gains sum_{pairs (k, .)} B V_k and loses
sum_{pairs (i, k)} B theta_ik V_i. Measured at load 1-2 with the market's bundles in the grouping
and 100 groups: 1,000 x 8 in 1.5 s 5,984 -> 5,920 (+4.3% -> +3.1% above the optimum 5,739.6;
3 or 10 pairs per job: 5,926 / 5,933); 10,000 x 8 in 15 s 60,617 -> 59,224 (-2.3%).

**Short shares.** With few steps, fewer groups bound better (step_groups: the groups are cut, not
under MIN_GROUPS, to what leaves MIN_STEPS steps), and the n x groups multipliers and their Adam
state are float32 (half the memory traffic); D is evaluated in float64 at whatever numbers they
hold, so every D is still exact weak duality.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SAFETY = 1e-9          # relative margin added to the bound for floating-point rounding
# Seconds of one step per (row x group) entry: measured on a 2-core machine at load 0.3 with
# OPENBLAS_NUM_THREADS=1 (10,000 x 8 with 101 groups and 5 pairs per job: 11.6 ms a step); a step
# makes about 15 passes over the rows x groups arrays (Adam's state and the gradient).
STEP_ENTRY_S = 1.2e-8
# The fewest steps a time-limited bound should get: with fewer, fewer groups bound better. Measured
# at 10,000 x 8 with 5 pairs per job: in 0.9 s 101 groups took 72 steps to 61,709, 50 groups 122
# steps to 60,920; in 9 s 101 groups (827 steps) 59,265 against 50 (1,280 steps) 59,465.
MIN_STEPS = 150
MIN_GROUPS = 20


def dual_value(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, si_ref: np.ndarray,
               labels: np.ndarray, theta: np.ndarray, pi: np.ndarray, sigma: np.ndarray, A: np.ndarray, *,
               pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, B: np.ndarray | None = None
               ) -> tuple[float, np.ndarray]:
    """Return (D(pi, sigma, A, B), the inner maximiser P: each row's chosen type at full time, or
    nothing) for the group relaxation above; D is in the objective's units (slowest-GPU
    equivalents when size is GPUs). theta: rows x groups, labels: each row's group; pairs: (I, K,
    theta_IK) of the single envy rows kept beside the group rows, B their multipliers (>= 0)."""
    n, m = V.shape
    A = np.asarray(A, dtype=float)                                  # float32 multipliers: D in float64
    count = np.bincount(labels, minlength=A.shape[1]).astype(float)
    W = (A * theta).T @ V                                           # groups x m
    own = size + sigma + A.sum(axis=1)
    if pairs is not None and B is not None and len(B):
        I, K, th = pairs
        own = own + np.bincount(I, weights=B, minlength=n)
    c = own[:, None] * V - size[:, None] * pi[None, :] - W[labels] / count[labels, None]
    if pairs is not None and B is not None and len(B):
        w = B * th
        for q in range(m):                                         # inflow of pair rows to each bundle
            c[:, q] -= np.bincount(K, weights=w * V[I, q], minlength=n)
    c = np.where(usable, c, -np.inf)
    j = c.argmax(axis=1)
    top = c[np.arange(n), j]
    take = top > 0
    P = np.zeros((n, m))
    P[np.nonzero(take)[0], j[take]] = 1.0
    return float(pi @ capacity - sigma @ si_ref + top[take].sum()), P


def group_pairs(labels: np.ndarray, per_job: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return pairs (I, K): each job i with up to `per_job` other members k of its group, drawn at
    random (seeded, so deterministic)."""
    rng = np.random.default_rng(seed)
    I, K = [], []
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(np.r_[-1, labels[order], -1]))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        members = order[lo:hi]
        size = len(members)
        if size < 2 or per_job < 1:
            continue
        t = min(per_job, size - 1)
        # offsets 1..size-1 without repeats per job: a random permutation of them, the first t
        shift = np.argsort(rng.random((size, size - 1)), axis=1)[:, :t] + 1
        I.append(np.repeat(members, t))
        K.append(members[(np.arange(size)[:, None] + shift) % size].ravel())
    if not I:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    return np.concatenate(I), np.concatenate(K)


def step_groups(groups: int, rows: int, time_limit_s: float | None) -> int:
    """Return the number of groups to use: `groups`, or fewer (not under MIN_GROUPS) when the time
    limit would give the dual under MIN_STEPS steps of STEP_ENTRY_S x rows x groups seconds each."""
    if time_limit_s is None:
        return groups
    fit = int(time_limit_s / (MIN_STEPS * STEP_ENTRY_S * max(rows, 1)))
    return max(min(groups, MIN_GROUPS), min(groups, fit))


def group_dual_bound(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray,
                     si_ref: np.ndarray, *, groups: int = 100, time_limit_s: float | None = None,
                     max_iter: int = 100_000, seed: int = 0, features: np.ndarray | None = None,
                     pairs_per_job: int = 5) -> tuple[float, dict[str, Any]]:
    """Return (an upper bound on the envy-free OEF LP's optimum, stats), in the objective's units.

    Rows are jobs (or classes: any row weights give a valid relaxation). The bound is the smallest
    Lagrangian value D over the iterations (see the module docstring), plus a 1e-9 relative margin
    for rounding; it stops after max_iter steps or at time_limit_s. groups: at most this many (fewer
    when time_limit_s would give under MIN_STEPS steps: step_groups). stats: dual_iterations,
    dual_groups, dual_seconds. features (rows x anything, optional): extra k-means coordinates for
    the grouping (group_jobs), e.g. an envy-free plan's rows: jobs holding similar bundles there
    share a group, so averaging their bundles loses less near the optimum (any grouping is a valid
    relaxation; only the bound's limit changes). pairs_per_job: single envy rows kept per job
    against members of its own group (see the module docstring; 0: none).
    """
    from gpuplan.solvers.oef.groups import group_jobs

    started = time.perf_counter()
    n, m = V.shape
    groups = step_groups(groups, n, time_limit_s)
    labels = group_jobs(V, usable, rho, max(1, min(groups, n)), seed=seed, features=features)
    G = int(labels.max()) + 1
    count = np.bincount(labels, minlength=G).astype(float)
    group_rho = np.zeros(G)
    group_rho[labels] = rho                                         # equal within a group
    theta = np.minimum(1.0, rho[:, None] / group_rho[None, :])      # rows x groups
    Vu = np.where(usable, V, 0.0)
    pi = np.array([float(Vu[usable[:, j], j].mean()) if usable[:, j].any() else 0.0 for j in range(m)])
    I, K = group_pairs(labels, pairs_per_job, seed=seed)
    pairs = (I, K, np.minimum(1.0, rho[I] / np.maximum(rho[K], 1e-300)))
    VI = Vu[I]
    # the rows x groups multipliers and their Adam state in float32 (half the memory traffic of a
    # step); D itself is evaluated in float64 at whatever multipliers they hold, so it stays exact
    params = [pi, np.zeros(n), np.zeros((n, G), dtype=np.float32), np.zeros(len(I))]
    Vu32, theta32 = Vu.astype(np.float32), theta.astype(np.float32)
    first = [np.zeros_like(p) for p in params]
    second = [np.zeros_like(p) for p in params]
    lr0 = 0.05 * float(Vu[usable].mean()) if usable.any() else 1.0
    best = np.inf
    it = 0
    for it in range(1, max_iter + 1):
        value, P = dual_value(Vu, usable, size, capacity, si_ref, labels, theta, *params[:3], pairs=pairs,
                              B=params[3])
        best = min(best, value)
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            break
        UP = (Vu * P).sum(axis=1)
        avg = np.stack([np.bincount(labels, weights=P[:, j], minlength=G) for j in range(m)], axis=1)
        avg /= count[:, None]
        gA = Vu32 @ avg.T.astype(np.float32)
        gA *= theta32
        np.subtract(UP[:, None].astype(np.float32), gA, out=gA)    # dD/dA: minus the group rows' envy
        grads = [capacity - (size[:, None] * P).sum(axis=0),       # dD/dpi
                 UP - si_ref,                                       # dD/dsigma
                 gA,
                 UP[I] - pairs[2] * (VI * P[K]).sum(axis=1)]              # dD/dB: minus the pair rows' envy
        lr = lr0 / np.sqrt(it / 20 + 1)
        c1, c2 = 1 - 0.9 ** it, 1 - 0.999 ** it
        for q in range(4):                  # Adam, in place: the n x groups arrays dominate a step
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
    return bound, {"dual_iterations": it, "dual_groups": G, "dual_pairs": int(len(I)),
                   "dual_seconds": time.perf_counter() - started}
