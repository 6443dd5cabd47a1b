"""Hetis Stage B references: the head dispatch of a batch by LP relaxation + rounding, and exactly by CP-SAT.

Both solve gpuplan.models.hetis.dispatch's instance (min max_g T_g, every request's H heads placed,
per-device memory); the water-filling heuristic there is what the simulator runs online, these
measure how far from optimal it is.
"""

from __future__ import annotations

import numpy as np

from gpuplan.models.hetis.dispatch import DispatchInstance, largest_remainder_rounding
from gpuplan.models.plan import Status
from gpuplan.solvers.backends import solve_cpsat, solve_cvxpy

CPSAT_SCALE_S = 1e-8  # CP-SAT works in integer units of 10 ns


def lp_dispatch(inst: DispatchInstance, *, time_limit_s: float | None = None) -> tuple[np.ndarray, float]:
    """Return (R x G integer head counts, LP lower bound in s): the LP relaxation (each replica's fixed
    message cost on a device relaxed by y_kg in [0, 1] with x_rg <= H y_{k_r g}) solved by cvxpy, rounded
    by largest remainder."""
    import cvxpy as cp

    R, G, H = len(inst.ctx_tokens), inst.devices, inst.heads
    S, c0, c1, bh = inst.per_group()
    grp = inst.groups
    K = S.shape[0]
    x = cp.Variable((R, G), nonneg=True)
    y = cp.Variable((K, G), nonneg=True)
    z = cp.Variable()
    onehot = np.zeros((K, R))
    onehot[grp, np.arange(R)] = 1.0
    heads = bh + onehot @ x                                   # K x G: each replica's heads per device
    per = S[grp] * inst.ctx_tokens[:, None]                   # R x G: s per head of request r on g
    t = inst.base_s + cp.sum(cp.multiply(per, x), axis=0) + cp.sum(cp.multiply(c0, y) + cp.multiply(c1, heads),
                                                                     axis=0)
    cons = [cp.sum(x, axis=1) == H, y <= 1, t <= z, inst.mem_tokens @ x <= inst.free_head_tokens]
    cons += [x[r, g] <= H * y[grp[r], g] for r in range(R) for g in range(G)]
    cons += [y[k, g] == 1 for k in range(K) for g in range(G) if bh[k, g] > 0]
    prob = cp.Problem(cp.Minimize(z), cons)
    solve_cvxpy(prob, time_limit_s=time_limit_s)
    frac = np.clip(np.asarray(x.value, dtype=float), 0, H)
    return largest_remainder_rounding(frac, inst), float(z.value)


def cpsat_dispatch(inst: DispatchInstance, *, time_limit_s: float | None = 10.0, seed: int = 0,
                   hint: np.ndarray | None = None) -> tuple[np.ndarray, Status, float]:
    """Return (R x G head counts, status, lower bound in s) of the exact dispatch by CP-SAT: integer
    n_rg, a used-flag per replica and device for its message latency, times in integer units of CPSAT_SCALE_S
    (each coefficient rounded up, so the model's optimum is within rounding of the true one)."""
    from ortools.sat.python import cp_model

    R, G, H = len(inst.ctx_tokens), inst.devices, inst.heads
    S, c0s, c1, bh = inst.per_group()
    grp = inst.groups
    K = S.shape[0]
    q = CPSAT_SCALE_S
    m = cp_model.CpModel()
    n = [[m.NewIntVar(0, H, f"n{r}_{g}") for g in range(G)] for r in range(R)]
    used = [[m.NewBoolVar(f"u{k}_{g}") for g in range(G)] for k in range(K)]
    per = [[int(np.ceil(S[grp[r], g] * inst.ctx_tokens[r] / q + c1[grp[r], g] / q))
            for g in range(G)] for r in range(R)]
    base = [int(np.ceil(inst.base_s[g] / q + float(c1[:, g] @ bh[:, g]) / q)) for g in range(G)]
    c0 = [[int(np.ceil(c0s[k, g] / q)) for g in range(G)] for k in range(K)]
    horizon = sum(max(p) for p in per) * H + max(base, default=0) + sum(max(c, default=0) for c in c0) + 1
    z = m.NewIntVar(0, horizon, "z")
    for r in range(R):
        m.Add(sum(n[r]) == H)
    for g in range(G):
        for k in range(K):
            mine = [r for r in range(R) if grp[r] == k]
            if bh[k, g] > 0:
                m.Add(used[k][g] == 1)
            elif mine:
                m.Add(sum(n[r][g] for r in mine) <= H * len(mine) * used[k][g])
            else:
                m.Add(used[k][g] == 0)
        m.Add(base[g] + sum(c0[k][g] * used[k][g] for k in range(K)) + sum(per[r][g] * n[r][g] for r in range(R))
              <= z)
        m.Add(sum(int(np.floor(inst.mem_tokens[r])) * n[r][g] for r in range(R))
              <= int(np.floor(inst.free_head_tokens[g])))
    if hint is not None:
        for r in range(R):
            for g in range(G):
                m.AddHint(n[r][g], int(hint[r, g]))
    m.Minimize(z)
    res = solve_cpsat(m, time_limit_s=time_limit_s, seed=seed, workers=1)
    out = np.array([[res.solver.Value(n[r][g]) for g in range(G)] for r in range(R)], dtype=np.int64)
    return out, res.status, float(res.bound or 0.0) * q
