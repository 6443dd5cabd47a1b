"""Solvers for Lagom: the priority-based search, exhaustive search, NCCL's default, AutoCCL-style descent.

Every solver returns one theta = (algo, proto, channels, threads, chunk) per op. `evaluations`
counts cost-model evaluations of a window (one per candidate theta; a vectorized 1-D search over a
grid counts one per grid point).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpuplan.models.lagom import cost
from gpuplan.models.lagom import Compiled, LagomPlan, LagomProblem, OpSetting, Theta, make_plan
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.option_rules import flag, integer
from gpuplan.registry import Progress, register_solver
from gpuplan.solvers.backends import Deadline

DIMS = ("proto", "algo", "channels", "chunk_bytes", "threads")  # Lagom: implementation first, NC and C before NT


@dataclass
class Space:
    """The grid of one op: allowed algorithms, protocols, channel counts, thread counts, chunks."""

    algos: list[str]
    protos: list[str]
    channels: list[int]
    threads: list[int]
    chunks: list[int]

    def values(self, dim: str) -> list[Any]:
        """Return the grid of dimension `dim`."""
        return {"algo": self.algos, "proto": self.protos, "channels": self.channels,
                "threads": self.threads, "chunk_bytes": self.chunks}[dim]

    def sum_sizes(self) -> int:
        """Return the sum of the dimension sizes."""
        return sum(len(self.values(d)) for d in DIMS)

    def pass_bound(self) -> int:
        """Return the most evaluations one pass spends on an op: every other protocol and algorithm
        once plus its re-tuned resources (channels + chunks + threads), then one 1-D search over each
        resource dimension."""
        res = sum(len(self.values(d)) for d in RESOURCE_DIMS)
        alternatives = len(self.protos) - 1 + len(self.algos) - 1
        return alternatives * (1 + res) + res


def space(problem: LagomProblem, i: int) -> Space:
    """Return op i's search grid: the algorithms NCCL allows for its collective and group, every protocol,
    and the problem's grid with the op's default values (Grid.around)."""
    comp = problem.compiled
    op, link = comp.ops[i], comp.links[i]
    algos = [a for a in cost.ALGOS if cost.algo_allowed(a, op.collective, link) is None]
    values = problem.grid.around(comp.nccl_default(i))
    return Space(algos, list(cost.PROTOS), values["channels"], values["threads"], values["chunk_bytes"])


def repair(comp: Compiled, i: int, t: Theta) -> Theta | None:
    """Return t made valid for op i by the smallest change (NVLS -> Simple, threads into range), or None."""
    link, coll = comp.links[i], comp.ops[i].collective
    if cost.algo_allowed(t.algo, coll, link):
        return None
    if cost.proto_allowed(t.algo, t.proto, link):
        if t.algo != "nvls":
            return None
        t = replace(t, proto="Simple")
    lo, hi = cost.thread_range(t.algo, t.proto)
    t = replace(t, threads=min(hi, max(lo, t.threads)), channels=max(t.channels, 2 if t.algo == "nvls" else 1))
    return t if not comp.valid(i, t) else None


def _valid_values(comp: Compiled, i: int, t: Theta, dim: str, values: list[Any]) -> list[Any]:
    if dim == "threads":
        lo, hi = cost.thread_range(t.algo, t.proto)
        return [v for v in values if lo <= v <= hi]
    if dim == "channels" and t.algo == "nvls":
        return [v for v in values if v >= 2]
    return values


def one_d(comp: Compiled, settings: list[Theta], i: int, dim: str, values: list[Any]) -> tuple[Theta, float, int]:
    """Search dimension `dim` of op i over `values` with the others fixed; return (best theta, its window
    time in us, evaluations). The current theta is the incumbent and is not re-evaluated."""
    w = comp.window_of[i]
    cur = settings[i]
    best_t, best = cur, float(comp.window_us(w, settings))
    if dim in ("channels", "threads", "chunk_bytes"):
        vals = [v for v in _valid_values(comp, i, cur, dim, values) if v != getattr(cur, dim)]
        if not vals:
            return best_t, best, 0
        arr = np.asarray(vals, dtype=float)
        args = [None, None, None]
        args[("channels", "threads", "chunk_bytes").index(dim)] = arr
        times = np.broadcast_to(comp.window_us(w, settings, override=(i, cur), arrays=tuple(args)), arr.shape)
        k = int(np.argmin(times))
        if times[k] < best * (1 - 1e-12):
            best_t, best = replace(cur, **{dim: int(vals[k])}), float(times[k])
        return best_t, best, len(vals)
    evals = 0
    for v in values:
        cand = repair(comp, i, replace(cur, **{dim: v}))
        if cand is None or cand == cur:
            continue
        evals += 1
        t = float(comp.window_us(w, settings, override=(i, cand)))
        if t < best * (1 - 1e-12):
            best_t, best = cand, t
    return best_t, best, evals


RESOURCE_DIMS = ("channels", "chunk_bytes", "threads")


def implementation_step(comp: Compiled, settings: list[Theta], i: int, dim: str, sp: Space
                        ) -> tuple[Theta, float, int]:
    """Search the categorical dimension `dim` (protocol or algorithm) of op i: every other value is
    judged with its resources re-tuned (one 1-D search each over channels, chunk and threads, in that
    order), since a protocol or algorithm is only as good as the resources it runs with (Simple needs
    smaller chunks than LL128 on a chain, a tree more channels than a ring); return (best theta, its
    window time in us, evaluations)."""
    w = comp.window_of[i]
    cur = settings[i]
    best_t, best = cur, float(comp.window_us(w, settings))
    evals = 0
    for v in sp.values(dim):
        cand = repair(comp, i, replace(cur, **{dim: v}))
        if cand is None or cand == cur:
            continue
        trial = list(settings)
        trial[i] = cand
        evals += 1
        t_us = float(comp.window_us(w, trial))
        for rdim in RESOURCE_DIMS:
            t, t_us, e = one_d(comp, trial, i, rdim, sp.values(rdim))
            trial[i] = t
            evals += e
        if t_us < best * (1 - 1e-12):
            best_t, best = trial[i], t_us
    return best_t, best, evals


def joint_step(comp: Compiled, settings: list[Theta], i: int, sp: Space) -> tuple[Theta, float, int]:
    """Search channels and chunk of op i together (threads fixed; one vectorized evaluation of their
    grid): the two trade the same thing (a chain's fill shrinks with more channels or smaller chunks,
    flow control and per-step sync grow with smaller chunks), so a 1-D step on either alone can stop
    where only a joint move improves. Return (best theta, its window time in us, evaluations)."""
    w = comp.window_of[i]
    cur = settings[i]
    best = float(comp.window_us(w, settings))
    ncs = _valid_values(comp, i, cur, "channels", sp.channels)
    if not ncs or not sp.chunks:  # no valid channel count on the grid for this algorithm
        return cur, best, 0
    NC, C = np.meshgrid(np.asarray(ncs, dtype=float), np.asarray(sp.chunks, dtype=float), indexing="ij")
    NT = np.full_like(NC, float(cur.threads))
    times = np.broadcast_to(comp.window_us(w, settings, override=(i, cur), arrays=(NC, NT, C)), NC.shape)
    k = np.unravel_index(int(np.argmin(times)), times.shape)
    if times[k] < best * (1 - 1e-12):
        return replace(cur, channels=int(NC[k]), chunk_bytes=int(C[k])), float(times[k]), int(times.size)
    return cur, best, int(times.size)


def impact(comp: Compiled, settings: list[Theta], i: int) -> float:
    """Return op i's effect on the critical path (us): its time when its window is bound by communication
    or it is exposed, else the computation time its interference adds, d (1 - 1/s)."""
    win = comp.windows[comp.window_of[i]]
    d = float(comp.comm_us(i, settings[i])) * comp.ops[i].count
    if win.compute_us == 0:
        return d
    s = float(comp.slowdown(i, settings[i]))
    comm = sum(float(comp.comm_us(j, settings[j])) * comp.ops[j].count for j in win.ops) * (1 + comp.consts.psi)
    return d if comm >= win.compute_us else d * (1 - 1 / s)


def priority_search(problem: LagomProblem, passes: int = 3, progress: Progress | None = None,
                    polish: bool = True, deadline: Deadline | None = None) -> tuple[list[Theta], dict[str, Any]]:
    """Return Lagom's settings and search statistics.

    From NCCL's default, rank ops by their effect on the critical path, then tune one parameter at a
    time in priority order (protocol, algorithm, channels, chunk, threads): the implementation
    (protocol, algorithm) by trying each alternative with its resources re-tuned
    (`implementation_step`), the resources by a 1-D search over their grid, the others fixed; re-rank
    and repeat while a pass improves (at most `passes`). Evaluations per op and pass stay linear in the
    grid sizes (`Space.pass_bound`), not their product. With `polish`, a last step per op searches
    channels and chunk jointly (`joint_step`, channels x chunks evaluations) and then threads.
    Each op's step starts only while `deadline` allows one more of the longest so far; every step
    keeps or improves the settings, so a search stopped there returns valid, no slower settings
    (`deadline.cut` says it stopped).
    """
    deadline = deadline or Deadline()
    comp = problem.compiled
    n = len(comp.ops)
    settings = [comp.nccl_default(i) for i in range(n)]
    spaces = [space(problem, i) for i in range(n)]
    evals, per_pass, done = 0, [], 0
    for p in range(passes):
        order = sorted(range(n), key=lambda i: -impact(comp, settings, i))
        pass_evals, improved = 0, False
        for k, i in enumerate(deadline.paced(order, first_free=p == 0)):
            for dim in DIMS:
                if dim in ("proto", "algo"):
                    t, _, e = implementation_step(comp, settings, i, dim, spaces[i])
                else:
                    t, _, e = one_d(comp, settings, i, dim, spaces[i].values(dim))
                pass_evals += e
                if t != settings[i]:
                    settings[i], improved = t, True
            if progress and k % 16 == 0:
                progress((p + k / n) / passes, f"pass {p + 1}: op {k + 1}/{n}")
        evals += pass_evals
        per_pass.append(pass_evals)
        done = p + 1
        if not improved or deadline.cut:
            break
    # polish: channels and chunk together, then threads, for every op (once)
    polish_evals = 0
    ranked = sorted(range(n), key=lambda i: -impact(comp, settings, i)) if polish and not deadline.cut else []
    for i in deadline.paced(ranked, first_free=False):
        t, _, e = joint_step(comp, settings, i, spaces[i])
        settings[i] = t
        t, _, e2 = one_d(comp, settings, i, "threads", spaces[i].values("threads"))
        settings[i] = t
        polish_evals += e + e2
    evals += polish_evals
    stats = {"evaluations": evals, "evaluations_per_pass": per_pass, "passes": done,
             "polish_evaluations": polish_evals,
             "ranking_evaluations": done * n, "sum_of_dimension_sizes": sum(s.sum_sizes() for s in spaces),
             "pass_bound": sum(s.pass_bound() for s in spaces)}
    return settings, stats


def subspaces(problem: LagomProblem, i: int) -> list[tuple[Theta, list[int], list[int], list[int]]]:
    """Return op i's valid (algo, proto) subspaces: a representative theta and its channel, thread and
    chunk grids (their product is what exhaustive search evaluates)."""
    comp = problem.compiled
    sp = space(problem, i)
    out = []
    for a in sp.algos:
        for p in sp.protos:
            base = Theta(a, p, 2, 640 if a == "tree" else 256, sp.chunks[0])
            if cost.proto_allowed(a, p, comp.links[i]) or comp.valid(i, base):
                continue
            ncs, nts = _valid_values(comp, i, base, "channels", sp.channels), _valid_values(comp, i, base, "threads", sp.threads)
            if ncs and nts and sp.chunks:  # a grid can hold no valid value (NVLS's 2 channels above max_channels 1)
                out.append((base, ncs, nts, sp.chunks))
    return out


def grid_size(problem: LagomProblem, i: int) -> int:
    """Return the number of valid thetas in op i's full product grid."""
    return sum(len(ncs) * len(nts) * len(cs) for _, ncs, nts, cs in subspaces(problem, i))


def exhaustive_op(problem: LagomProblem, settings: list[Theta], i: int) -> tuple[Theta, int]:
    """Return the best theta for op i over its whole grid (and NCCL's default), others fixed; and the
    number of evaluations."""
    comp = problem.compiled
    w = comp.window_of[i]
    default = comp.nccl_default(i)
    best_t, best = default, float(comp.window_us(w, settings, override=(i, default)))
    evals = 1
    for base, ncs, nts, cs in subspaces(problem, i):
        NC, NT, C = np.meshgrid(np.asarray(ncs, dtype=float), np.asarray(nts, dtype=float),
                                np.asarray(cs, dtype=float), indexing="ij")
        times = np.broadcast_to(comp.window_us(w, settings, override=(i, base), arrays=(NC, NT, C)), NC.shape)
        evals += times.size
        k = np.unravel_index(int(np.argmin(times)), times.shape)
        if times[k] < best * (1 - 1e-12):
            best = float(times[k])
            best_t = Theta(base.algo, base.proto, int(NC[k]), int(NT[k]), int(C[k]))
    return best_t, evals


def exhaustive(problem: LagomProblem, deadline: Deadline | None = None) -> tuple[list[Theta], dict[str, Any]]:
    """Return the optimum over the full product grid of every op (exact when no window holds two ops:
    windows are then independent). Identical windows are solved once. When `deadline` stops it (an op
    starts while one more of the longest so far fits) the ops not reached keep NCCL's default and
    `deadline.cut` says so."""
    comp = problem.compiled
    deadline = deadline or Deadline()
    settings = [comp.nccl_default(i) for i in range(len(comp.ops))]
    memo: dict[Any, Theta] = {}
    evals = 0
    for i in deadline.paced(range(len(comp.ops)), first_free=False):
        op, win = comp.ops[i], comp.windows[comp.window_of[i]]
        key = (op.collective, op.size_bytes, op.count, comp.links[i], win.compute_us, win.memory_bound)
        if key not in memo:
            memo[key], e = exhaustive_op(problem, settings, i)
            evals += e
        settings[i] = memo[key]
    return settings, {"evaluations": evals, "distinct_windows": len(memo)}


def exhaustive_applicable(problem: LagomProblem) -> str | None:
    """Return None when exhaustive search is exact here (at most one op per window), else why not."""
    crowded = [w.name for w in problem.compiled.windows if len(w.ops) > 1]
    if crowded:
        return f"windows {crowded[:3]} overlap several ops; their joint grid is a product of products"
    return None


def autoccl_op(problem: LagomProblem, i: int) -> tuple[Theta, int]:
    """Return the AutoCCL-style setting of op i: per (algo, proto) subspace, coordinate descent over
    (channels, threads, chunk) from NCCL's default, both directions, minimizing communication time
    alone; the best subspace wins. Also the number of evaluations."""
    comp = problem.compiled
    sp = space(problem, i)
    default = comp.nccl_default(i)
    best_t, best = default, float(comp.comm_us(i, default))
    evals = 1
    for a in sp.algos:
        for p in sp.protos:
            start = repair(comp, i, replace(default, algo=a, proto=p))
            if start is None:
                continue
            grids = {d: _valid_values(comp, i, start, d, sp.values(d)) for d in ("channels", "threads", "chunk_bytes")}
            if not all(grids.values()):  # no grid value is valid here (Tree's 640 threads off a coarse thread grid)
                continue
            cur = replace(start, **{d: min(g, key=lambda v: abs(v - getattr(start, d))) for d, g in grids.items()})
            cur_t = float(comp.comm_us(i, cur))
            evals += 1
            failures = 0
            while failures < 6:
                for d in ("channels", "threads", "chunk_bytes"):
                    g = grids[d]
                    k = g.index(getattr(cur, d))
                    moved = False
                    for step in (1, -1):
                        if 0 <= k + step < len(g):
                            cand = replace(cur, **{d: g[k + step]})
                            t = float(comp.comm_us(i, cand))
                            evals += 1
                            if t < cur_t * (1 - 1e-12):
                                cur, cur_t, moved = cand, t, True
                                break
                    failures = 0 if moved else failures + 1
                    if failures >= 6:
                        break
            if cur_t < best * (1 - 1e-12):
                best_t, best = cur, cur_t
    return best_t, evals


def autoccl(problem: LagomProblem, deadline: Deadline | None = None,
            partial: bool = False) -> tuple[list[Theta] | None, dict[str, Any]]:
    """Return AutoCCL-style settings for every op (communication time alone) and the evaluations; when
    `deadline` stopped it before the last op (an op starts while the deadline allows one more of the
    longest so far) None for the settings, or with `partial` NCCL's default for the ops not reached.
    Its objective is an op's communication time alone, which depends on the collective, size and link
    only: ops alike (one per layer) are tuned once, their evaluations counted for each."""
    deadline = deadline or Deadline()
    comp = problem.compiled
    out, evals = [], 0
    memo: dict[Any, tuple[Theta, int]] = {}
    for i in deadline.paced(range(len(comp.ops)), first_free=False):
        key = (comp.ops[i].collective, comp.ops[i].size_bytes, comp.links[i])
        if key not in memo:
            memo[key] = autoccl_op(problem, i)
        t, e = memo[key]
        out.append(t)
        evals += e
    if deadline.cut and not partial:
        return None, {"evaluations": evals}
    return out + [comp.nccl_default(i) for i in range(len(out), len(comp.ops))], {"evaluations": evals}


SEARCH_SHARE = 0.75  # of the search budget for Lagom's own search; the AutoCCL-style baseline in the plan gets the rest
PLAN_SHARE = 0.8  # of a time limit for a search, at most; the rest (or more: search_budget_s) builds the plan
PLAN_EVALUATIONS = 6  # what building a plan costs, in whole-iteration evaluations (make_plan: one for the
# settings, one per baseline, the timeline's per-window pass and emit), kept free of the search


def search_budget_s(problem: LagomProblem, time_limit_s: float | None) -> float | None:
    """Return the seconds from now a search may take so that building its plan still fits in
    `time_limit_s` (None without a limit): the limit less PLAN_EVALUATIONS times one whole-iteration
    evaluation timed now (NCCL's defaults), at most PLAN_SHARE of it, less the time this call took (the
    problem's first compilation included; on 400 ops a plan took 1.1 s, half a 2 s limit)."""
    if time_limit_s is None:
        return None
    entered = time.perf_counter()
    comp = problem.compiled
    started = time.perf_counter()
    comp.iteration_us([comp.nccl_default(i) for i in range(len(comp.ops))])
    now = time.perf_counter()
    reserve = PLAN_EVALUATIONS * (now - started)
    return max(0.0, min(PLAN_SHARE * time_limit_s, time_limit_s - reserve) - (now - entered))


def _plan(problem: LagomProblem, name: str, settings: list[Theta], stats: dict[str, Any], status: Status,
          baselines: dict[str, list[Theta]] | None = None) -> LagomPlan:
    names = [o.name for o in problem.compiled.ops]
    base = {k: [OpSetting(op=n, **vars(t)) for n, t in zip(names, v)] for k, v in (baselines or {}).items()}
    plan = make_plan(problem, settings, status=status, baselines=base)
    plan.solver = SolverInfo(name=name, stats=stats)
    return plan


def solve_lagom(problem: LagomProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress | None = None, passes: int = 3, polish: bool = True, **_: Any) -> LagomPlan:
    """Lagom's priority-based search; the plan also carries NCCL's default and the AutoCCL-style settings.
    Under `time_limit_s` the search gets SEARCH_SHARE of `search_budget_s` and the AutoCCL-style baseline
    the rest of it (left out of the plan when it does not finish); the status is then time_limit if the
    search stopped early."""
    comp = problem.compiled
    budget = search_budget_s(problem, time_limit_s)
    whole = Deadline.after(budget)
    search_deadline = Deadline.after(budget, SEARCH_SHARE)
    settings, stats = priority_search(problem, passes=int(passes), progress=progress, polish=bool(polish),
                                      deadline=search_deadline)
    auto, auto_stats = autoccl(problem, whole)
    stats["autoccl_evaluations"] = auto_stats["evaluations"]
    default = [comp.nccl_default(i) for i in range(len(comp.ops))]
    baselines = {"nccl-default": default, **({"autoccl": auto} if auto is not None else {})}
    plan = _plan(problem, "lagom", settings, stats, Status.TIME_LIMIT if search_deadline.cut else Status.FEASIBLE,
                 baselines)
    notes = ([f"the time limit stopped the search after {stats['passes']} pass(es); every step kept or improved "
              "the settings"] if search_deadline.cut else []) + \
            (["the AutoCCL-style baseline did not finish within the time limit and is left out"] if auto is None else [])
    if notes:
        plan.message = "; ".join(notes)
    return plan


def solve_exhaustive(problem: LagomProblem, *, time_limit_s: float | None = None, seed: int = 0,
                     progress: Progress | None = None, **_: Any) -> LagomPlan:
    """The optimum over the full grid, window by window. Under `time_limit_s` (s) the windows the limit
    leaves out keep NCCL's default and the plan is time_limit instead of optimal."""
    deadline = Deadline.after(search_budget_s(problem, time_limit_s))
    settings, stats = exhaustive(problem, deadline)
    plan = _plan(problem, "exhaustive", settings, stats, Status.TIME_LIMIT if deadline.cut else Status.OPTIMAL)
    if deadline.cut:
        plan.message = "the time limit stopped the search: the ops not reached keep NCCL's default"
    return plan


def solve_default(problem: LagomProblem, *, time_limit_s: float | None = None, seed: int = 0,
                  progress: Progress | None = None, **_: Any) -> LagomPlan:
    """NCCL's own choice: its analytic model, communication time alone."""
    comp = problem.compiled
    return _plan(problem, "nccl-default", [comp.nccl_default(i) for i in range(len(comp.ops))],
                 {"evaluations": 0}, Status.FEASIBLE)


def solve_autoccl(problem: LagomProblem, *, time_limit_s: float | None = None, seed: int = 0,
                  progress: Progress | None = None, **_: Any) -> LagomPlan:
    """AutoCCL-style coordinate descent on communication time alone, ignoring the compute slowdown. Under
    `time_limit_s` (s) the ops the limit leaves out keep NCCL's default and the plan is time_limit."""
    deadline = Deadline.after(search_budget_s(problem, time_limit_s))
    settings, stats = autoccl(problem, deadline, partial=True)
    assert settings is not None  # partial: every op has a setting
    plan = _plan(problem, "autoccl", settings, stats, Status.TIME_LIMIT if deadline.cut else Status.FEASIBLE)
    if deadline.cut:
        plan.message = "the time limit stopped the descent: the ops not reached keep NCCL's default"
    return plan


register_solver("lagom", "lagom", solve_lagom, role="paper", default=True,
                description="priority-based 1-D searches over (proto, algo, channels, chunk, threads), re-ranked",
                # passes: at most this many priority passes (priority_search stops early when one improves nothing)
                option_rules={"passes": integer(1, special={0: "no priority pass: NCCL's default, then the polish"}),
                              "polish": flag()})
register_solver("lagom", "exhaustive", solve_exhaustive, role="exact", applicable=exhaustive_applicable,
                description="every theta of the grid, window by window (exact with one op per window)")
register_solver("lagom", "nccl-default", solve_default, role="baseline",
                description="NCCL's analytic model: fastest (algo, proto) alone, default resources")
register_solver("lagom", "autoccl", solve_autoccl, role="baseline",
                description="AutoCCL-style coordinate descent on communication time alone")
