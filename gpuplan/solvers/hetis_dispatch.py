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
    """Return (R x G integer head counts, LP lower bound in s): the LP relaxation (fixed message costs
    relaxed by y_g in [0, 1] with x_rg <= H y_g) solved by cvxpy, rounded by largest remainder."""
    import cvxpy as cp

    R, G, H = len(inst.ctx_tokens), inst.devices, inst.heads
    x = cp.Variable((R, G), nonneg=True)
    y = cp.Variable(G, nonneg=True)
    z = cp.Variable()
    heads = inst.base_heads + cp.sum(x, axis=0)
    t = inst.base_s + cp.multiply(inst.s_per_head_token, inst.ctx_tokens @ x) + \
        cp.multiply(inst.c0_s, y) + cp.multiply(inst.c1_s_per_head, heads)
    cons = [cp.sum(x, axis=1) == H, y <= 1, t <= z, inst.mem_tokens @ x <= inst.free_head_tokens]
    cons += [x[:, g] <= H * y[g] for g in range(G)]
    cons += [y[g] == 1 for g in range(G) if inst.base_heads[g] > 0]
    prob = cp.Problem(cp.Minimize(z), cons)
    solve_cvxpy(prob, time_limit_s=time_limit_s)
    frac = np.clip(np.asarray(x.value, dtype=float), 0, H)
    return largest_remainder_rounding(frac, inst), float(z.value)


def cpsat_dispatch(inst: DispatchInstance, *, time_limit_s: float | None = 10.0, seed: int = 0,
                   hint: np.ndarray | None = None) -> tuple[np.ndarray, Status, float]:
    """Return (R x G head counts, status, lower bound in s) of the exact dispatch by CP-SAT: integer
    n_rg, a used-flag per device for its message latency, times in integer units of CPSAT_SCALE_S
    (each coefficient rounded up, so the model's optimum is within rounding of the true one)."""
    from ortools.sat.python import cp_model

    R, G, H = len(inst.ctx_tokens), inst.devices, inst.heads
    q = CPSAT_SCALE_S
    m = cp_model.CpModel()
    n = [[m.NewIntVar(0, H, f"n{r}_{g}") for g in range(G)] for r in range(R)]
    used = [m.NewBoolVar(f"u{g}") for g in range(G)]
    per = [[int(np.ceil(inst.s_per_head_token[g] * inst.ctx_tokens[r] / q + inst.c1_s_per_head[g] / q))
            for g in range(G)] for r in range(R)]
    base = [int(np.ceil(inst.base_s[g] / q + inst.c1_s_per_head[g] * inst.base_heads[g] / q)) for g in range(G)]
    c0 = [int(np.ceil(inst.c0_s[g] / q)) for g in range(G)]
    horizon = sum(max(p) for p in per) * H + max(base, default=0) + max(c0, default=0) + 1
    z = m.NewIntVar(0, horizon, "z")
    for r in range(R):
        m.Add(sum(n[r]) == H)
    for g in range(G):
        total = sum(n[r][g] for r in range(R))
        if inst.base_heads[g] > 0:
            m.Add(used[g] == 1)
        else:
            m.Add(total <= H * R * used[g])
        m.Add(base[g] + c0[g] * used[g] + sum(per[r][g] * n[r][g] for r in range(R)) <= z)
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
