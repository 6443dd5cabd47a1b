"""A lower bound on the weighted flowtime of a stragglers instance: a time-indexed LP relaxation (cvxpy).

Time from the first arrival is cut into K intervals of length D. For each job j and phase p (map, reduce)
of nominal work W_jp (sum of task sizes, s) and k_jp tasks, y_jpt >= 0 is the slot capacity the phase holds
in interval t and z_jpt >= 0 the work it does there:
  sum_jp y_jpt <= N                                  (slot capacity)
  z_jpt <= D f_jt g_jp(y_jpt)                        (speedup; f_jt the part of t after the arrival)
  sum_t z_jpt = W_jp                                 (all work done)
  sum_{u<=t} z_jru / W_jr <= sum_{u<=t} z_jmu / W_jm  (map before reduce, fractions)
  F_j >= sum_t (z_jLt / W_jL) start_t - a_j          (completion after the mean busy start of the last phase)
  F_j >= (max map size + max reduce size) / h_sup    (critical path at the fastest copy speed)
  minimise sum_j w_j F_j
g(y) = min(y, k) h_sup with h_sup = sup_r h(r) (the `limit` speedup: no copy, however many a task runs,
progresses faster than 1/floor times its nominal rate) is a relaxation of every realisation of every policy:
the bound never exceeds a simulated flowtime. g(y) = k h(y/k) for y >= k (and y below) with the expected
speedup h is the fluid model of the redundancy papers: reported beside it, but not a bound for policies that
pick fast copies by restarting (Mantri, ESE).
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import numpy as np

from gpuplan.models.stragglers import StragglersProblem, critical_paths_s

LP_MAX_JOBS = 60
LP_MAX_TASKS = 2_000
LP_INTERVALS = 80
MAX_SEGMENTS = 8


def lp_applicable(problem: StragglersProblem) -> str | None:
    """Return None when the LP is small enough to solve, else why not."""
    n = len(problem.arrays[0])
    if n > LP_MAX_JOBS or problem.tasks() > LP_MAX_TASKS:
        return f"{n} jobs / {problem.tasks()} tasks; the LP bound is solved for at most {LP_MAX_JOBS} jobs and {LP_MAX_TASKS} tasks"
    return None


def lower_bound(problem: StragglersProblem, speedup: Literal["limit", "h"] = "limit",
                intervals: int = LP_INTERVALS, time_limit_s: float | None = None) -> float:
    """Return the LP's optimal weighted flowtime (s): a lower bound on every policy's weighted flowtime with
    speedup 'limit'; the fluid relaxation with the expected speedup h when 'h'. Raises ValueError when the
    instance is over the LP's size limits or the LP solver fails or stops at `time_limit_s` (s, the HiGHS
    solve; None: no limit). Optimal values are cached per instance, so a second call costs nothing."""
    why = lp_applicable(problem)
    if why:
        raise ValueError(why)
    key = (problem.model_dump_json(), speedup, intervals)
    if key not in _LP_CACHE:
        if len(_LP_CACHE) >= LP_CACHE_SIZE:
            _LP_CACHE.pop(next(iter(_LP_CACHE)))
        _LP_CACHE[key] = _solve_lp(*key, time_limit_s=time_limit_s)  # only an optimum is stored
    return _LP_CACHE[key]


LP_CACHE_SIZE = 64
# by hand rather than functools.lru_cache: the time limit is not part of the key (an optimum found under
# any limit is the optimum), and a call that fails under a short limit must leave nothing behind
_LP_CACHE: dict[tuple[str, str, int], float] = {}


def _solve_lp(doc: str, speedup: str, intervals: int, time_limit_s: float | None = None) -> float:
    """Return the LP's optimum (s, shaded by the solver tolerance); `time_limit_s` counts from this call:
    building and canonicalising the LP spend it too, and HiGHS gets what is left. Raises ValueError when
    nothing is left for HiGHS or it does not reach the optimum."""
    from gpuplan.solvers.backends import cold_import_outlasts

    started = time.perf_counter()
    if (why := cold_import_outlasts("cvxpy", time_limit_s)) is not None:
        raise ValueError(why)
    import cvxpy as cp

    problem = StragglersProblem.model_validate_json(doc)
    arr, w, maps, reds = problem.arrays
    var = problem.variability.build()
    N = problem.slots
    h_sup = var.h_limit()
    crit = critical_paths_s(problem)
    phases: list[tuple[int, int, float, int]] = []  # (job, phase, work, tasks)
    for j in range(len(arr)):
        phases.append((j, 0, float(maps[j].sum()), int(maps[j].size)))
        if reds[j].size:
            phases.append((j, 1, float(reds[j].sum()), int(reds[j].size)))
    t0 = float(arr.min())
    rate_one = 1.0 if speedup == "h" else h_sup
    serial = sum(W / (min(k, N) * rate_one) for _, _, W, k in phases)
    end = float(arr.max()) + serial + 1e-9
    K = intervals
    D = (end - t0) / K
    starts = t0 + D * np.arange(K)
    P = len(phases)
    y = cp.Variable((P, K), nonneg=True)
    z = cp.Variable((P, K), nonneg=True)
    F = cp.Variable(len(arr), nonneg=True)
    cons = [cp.sum(y, axis=0) <= N]
    job_of = np.array([j for j, _, _, _ in phases])
    k_col = np.array([[k] for _, _, _, k in phases], dtype=float)
    cap = D * np.clip((starts[None, :] + D - arr[job_of][:, None]) / D, 0.0, 1.0)  # (P, K) usable seconds
    if speedup == "limit":
        cons += [z <= h_sup * cp.multiply(cap, y), z <= h_sup * cap * k_col]
    else:  # k H(y/k), H the least concave majorant of (0, 0), (1, h(1)), ..., (R, h(R)); flat after
        hull = concave_majorant([(0.0, 0.0)] + [(float(r), var.h(r)) for r in range(1, MAX_SEGMENTS + 1)])
        for (x1, g1), (x2, g2) in zip(hull[:-1], hull[1:]):
            slope = (g2 - g1) / (x2 - x1)  # per unit of y / k, so per unit of y
            cons.append(z <= cp.multiply(cap, k_col * g1 + slope * (y - k_col * x1)))
        cons.append(z <= cap * k_col * hull[-1][1])
    cons.append(cp.sum(z, axis=1) == np.array([W for _, _, W, _ in phases]))
    index = {(j, ph): i for i, (j, ph, _, _) in enumerate(phases)}
    for j in range(len(arr)):
        last = index.get((j, 1), index[(j, 0)])
        W_last = phases[last][2]
        if (j, 1) in index:
            m, r = index[(j, 0)], index[(j, 1)]
            cons.append(cp.cumsum(z[r]) / phases[r][2] <= cp.cumsum(z[m]) / phases[m][2])
        cons += [F[j] >= (z[last] @ starts) / W_last - arr[j], F[j] >= crit[j]]
    prob = cp.Problem(cp.Minimize(w @ F), cons)
    from gpuplan.errors import GpuplanError
    from gpuplan.models.plan import Status
    from gpuplan.solvers.backends import solve_cvxpy

    left = None
    if time_limit_s is not None:
        prob.get_problem_data(cp.HIGHS)  # canonicalise now (cvxpy keeps it for the solve), on the clock
        left = time_limit_s - (time.perf_counter() - started)
        if left <= 0:
            raise ValueError(f"building the LP took the whole {time_limit_s:.3g} s left")
    try:
        # under a time limit only HiGHS (which honours it) is tried: a fallback solver would run unbounded
        status, _ = solve_cvxpy(prob, time_limit_s=left,
                                **({"preferred": ("HIGHS",)} if time_limit_s is not None else {}))
    except GpuplanError as exc:
        raise ValueError(f"the LP bound did not solve: {exc}") from None
    if status is not Status.OPTIMAL or prob.value is None or not math.isfinite(prob.value):
        raise ValueError(f"the LP bound did not solve to optimality (status {prob.status})")
    return float(prob.value) * (1 - 1e-6)  # solver tolerance, so the bound stays below


def concave_majorant(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Return the vertices of the least concave majorant of `points` (sorted by x): the upper hull. h is
    concave for the uniform model but not always from r = 0 to 2 for heavy Pareto tails (alpha = 1.2:
    h(2) = 3.5), so the LP uses this envelope, which only relaxes it."""
    hull: list[tuple[float, float]] = []
    for p in sorted(points):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):  # the middle point is not above the chord
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def bound_stats(problem: StragglersProblem, time_limit_s: float | None = None) -> dict[str, Any]:
    """Return {lp_bound_s, lp_fluid_s} (s) for the solver stats of a plan: empty when the LP does not apply;
    with `time_limit_s` (s, None: no limit) both LPs together stay within it, and one that cannot is left
    out, with `lp_bound_note` saying so."""
    if lp_applicable(problem):
        return {}
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    out: dict[str, Any] = {}
    for key, speedup in (("lp_bound_s", "limit"), ("lp_fluid_s", "h")):
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            out["lp_bound_note"] = f"{key} left out: the time limit was spent before it could be solved"
            break
        try:
            out[key] = lower_bound(problem, speedup, time_limit_s=left)
        except ValueError as exc:
            out["lp_bound_note"] = f"{key} left out: {exc}"
            break
    return out
