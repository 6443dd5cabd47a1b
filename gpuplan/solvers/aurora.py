"""AuroraRL solvers: bandwidth-aware relay trees and rollout splits, an exact CP-SAT reference, baselines.

aurora (paper)     sparse delta; relay trees: one relay per region, the star, and (while time
                   allows) built greedily (earliest arrival; best objective); each improved by local search (re-parent,
                   drop or swap workers) on the objective with the water-filled rollout split, ties
                   broken by the earlier arrival of the weights; fewest
                   streams per edge that reach its share of the uplink
exact              CP-SAT over tree, shared rates (uplink fan-out, inter-region crossings) and the
                   integer split (small instances)
dense-broadcast    full checkpoint from the trainer to every worker, one stream each, split by throughput
dense-multistream  the same with the most streams per link
dense-relay        the strongest deployed dense design: one copy per region, fan-out inside it,
                   streams to each share, overlapped under the staleness bound, water-filled split
dense-tree         the full checkpoint down the relay tree AuroraRL's own search picks for it
delta-naive        sparse delta from the trainer to every worker, most streams, split by throughput
                   (delta transfer without bandwidth-aware assignment)
"""

from __future__ import annotations

import math
import time
from typing import Any

from gpuplan.errors import InfeasibleError, InputError, SolverError
from gpuplan.models.aurora import (TRAINER, AuroraPlan, AuroraProblem, arrival_times, best_split, edge_rate,
                                   extraction, finish_plan, metrics, objective_value, tree_edges)
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.option_rules import MAX_WORKERS, flag, integer, one_of
from gpuplan.registry import Progress, no_progress, register_solver

EXACT_MAX_WORKERS = 8
MAX_CANDIDATES = 20_000  # trees the heuristic's local search evaluates at most


def _plan(problem: AuroraProblem, tree: dict[str, str], payload: str, split: dict[str, int] | None = None,
          streams: int | None = None, status: Status = Status.FEASIBLE) -> AuroraPlan:
    """Return a finished plan for a tree; the split is water-filled unless given."""
    edges = tree_edges(problem, tree, streams)
    D = problem.payload_bytes(payload)
    if split is None:
        try:
            _, split = best_split(problem, arrival_times(problem, edges, D), problem.max_staleness)
        except ValueError as exc:
            raise InfeasibleError(str(exc)) from None
    plan = AuroraPlan(kind="aurora", status=status, payload=payload, payload_bytes=D, edges=edges,
                      rollout=split, staleness=problem.max_staleness)
    return finish_plan(problem, plan)


def _score(problem: AuroraProblem, tree: dict[str, str], payload: str = "delta") -> tuple[float, float]:
    """Return (objective, latest arrival in s) of a tree shipping `payload` ("delta" or "dense") with the
    water-filled split; (inf, inf) when it cannot take the batch. The arrival breaks ties: among equal
    step times, ship the weights sooner."""
    if not tree:
        return math.inf, math.inf
    D = problem.payload_bytes(payload)
    edges = tree_edges(problem, tree)
    arrival = arrival_times(problem, edges, D)
    try:
        t, split = best_split(problem, arrival, problem.max_staleness)
    except ValueError:
        return math.inf, math.inf
    latest = max(arrival[w] for w in split)
    if problem.objective == "step_time":
        return t, latest
    plan = AuroraPlan(kind="aurora", status=Status.FEASIBLE, payload_bytes=D, edges=edges, rollout=split,
                      staleness=problem.max_staleness)
    return objective_value(problem, metrics(problem, plan)), latest


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when score a beats b: a clearly smaller objective, or an equal one with an earlier arrival."""
    tol = 1e-9 * max(1.0, abs(b[0])) if math.isfinite(b[0]) else 0.0
    return a[0] < b[0] - tol or (abs(a[0] - b[0]) <= tol and a[1] < b[1] - 1e-9 * max(1.0, b[1]))


def _swap(tree: dict[str, str], u: str, v: str) -> dict[str, str]:
    """Return the tree with workers u and v exchanging their places (parents and children)."""
    sigma = {u: v, v: u}
    out = {sigma.get(c, c): sigma.get(p, p) for c, p in tree.items()}
    return out


def _subtree(tree: dict[str, str], root: str) -> set[str]:
    out, frontier = {root}, [root]
    while frontier:
        node = frontier.pop()
        kids = [c for c, p in tree.items() if p == node]
        out.update(kids)
        frontier += kids
    return out


def greedy_tree(problem: AuroraProblem, by_objective: bool = False,
                deadline: float = math.inf, payload: str = "delta") -> dict[str, str] | None:
    """Return a relay tree (child -> parent) built greedily: repeatedly attach the worker (at the
    parent) that keeps the latest arrival among attached workers smallest, or with `by_objective`
    the one that keeps the step objective (water-filled split over attached workers) smallest.
    Returns None when the deadline (perf_counter seconds) passes first."""
    D = problem.payload_bytes(payload)
    tree: dict[str, str] = {}
    left = list(problem.worker_names())
    while left:
        if time.perf_counter() > deadline:
            return None
        best: tuple[float, float, int, str, str] | None = None
        for w in left:
            for p in [TRAINER] + list(tree):
                trial = {**tree, w: p}
                arr = arrival_times(problem, tree_edges(problem, trial), D)
                first = _score(problem, trial, payload)[0] if by_objective else max(arr.values())
                key = (first, arr[w], left.index(w), p, w)
                if best is None or key < best:
                    best = key
        assert best is not None
        tree[best[4]] = best[3]
        left.remove(best[4])
    return tree


def region_relay_tree(problem: AuroraProblem) -> dict[str, str]:
    """Return a tree where the trainer feeds one relay per region (the worker with the widest
    uplink, fastest rollout first) and each relay feeds the rest of its region."""
    tree: dict[str, str] = {}
    by_region: dict[str, list[str]] = {}
    for n, w in problem.nodes():
        by_region.setdefault(w.region, []).append(n)
    for region, members in by_region.items():
        members = sorted(members, key=lambda n: (-problem.uplink(n), problem.seconds_per_sample(n), n))
        relay = members[0]
        tree[relay] = TRAINER
        for m in members[1:]:
            tree[m] = relay
    return tree


def local_search(problem: AuroraProblem, tree: dict[str, str], deadline: float, stats: dict[str, Any],
                 max_candidates: int = MAX_CANDIDATES, payload: str = "delta") -> dict[str, str]:
    """Improve a tree while the score improves: re-parent one worker (with its subtree), drop a leaf,
    or swap two workers' places (which also promotes a child above its parent). Stops after
    `max_candidates` evaluations in all (deterministic) or at the deadline (a safety net)."""
    best = _score(problem, tree, payload)
    improved = True

    def spent() -> bool:
        return stats["candidates"] >= max_candidates or time.perf_counter() >= deadline

    while improved and not spent():
        improved = False
        names = problem.worker_names()
        for w in names:
            if spent():
                break
            below = _subtree(tree, w) if w in tree else {w}
            options: list[dict[str, str]] = []
            for p in [TRAINER] + [n for n in tree if n not in below]:
                if tree.get(w) != p:
                    options.append({**tree, w: p})
            if w in tree and not any(p == w for p in tree.values()) and len(tree) > 1:
                options.append({c: p for c, p in tree.items() if c != w})
            options += [_swap(tree, w, v) for v in names if v > w and v in tree and w in tree]
            for trial in options:
                if spent():
                    break
                stats["candidates"] += 1
                score = _score(problem, trial, payload)
                if _better(score, best):
                    tree, best, improved = trial, score, True
                    stats["improvements"] += 1
                    break
    return tree


def solve_aurora(problem: AuroraProblem, *, time_limit_s: float | None = None, seed: int = 0,
                 progress: Progress = no_progress, search: bool = True, payload: str = "delta",
                 name: str = "aurora") -> AuroraPlan:
    """Return the AuroraRL plan: relay-tree starts, water-filled split, local search.

    `payload` "dense" runs the same bandwidth-aware search for the full checkpoint (the dense-tree
    baseline). The work is bounded by a count of evaluated candidates (so the same input gives the
    same plan on any machine); the time limit is only a safety net.
    """
    for option, value, allowed in (("payload", payload, ("delta", "dense")), ("name", name, ("aurora", "dense-tree"))):
        if value not in allowed:
            raise InputError.at(None, f"option.{option}", value, " or ".join(allowed))
    started = time.perf_counter()
    deadline = started + (time_limit_s if time_limit_s is not None else 60.0)
    stats: dict[str, Any] = {"candidates": 0, "improvements": 0}
    progress(0.0, "building relay trees")
    # cheap starts first; a greedy one only when its ~W^3/6 evaluations fit the budget
    starts = [region_relay_tree(problem), _star(problem)]
    n = len(problem.worker_names())
    for by_objective, share in ((False, 0.5), (True, 0.1)):
        if n ** 3 / 6 <= share * MAX_CANDIDATES:
            tree = greedy_tree(problem, by_objective, deadline=deadline, payload=payload)
            if tree is not None:
                starts.append(tree)
    stats["starts"] = len(starts)
    stats["start_objectives"] = [_score(problem, t, payload)[0] for t in starts]
    best_tree, best = starts[0], (math.inf, math.inf)
    for i, tree in enumerate(starts):
        if search:
            progress(0.1 + 0.9 * i / len(starts), "local search")
            tree = local_search(problem, tree, deadline, stats, payload=payload)
        score = _score(problem, tree, payload)
        if _better(score, best):
            best_tree, best = tree, score
    plan = _plan(problem, best_tree, payload)
    plan.solver = SolverInfo(name=name, stats=stats)
    progress(1.0, "done")
    return plan


def _star(problem: AuroraProblem) -> dict[str, str]:
    return {w: TRAINER for w in problem.worker_names()}


def _proportional_split(problem: AuroraProblem) -> dict[str, int]:
    """Split the batch in proportion to rollout throughput (largest remainder), ignoring bandwidth."""
    rates = {n: w.tokens_per_s for n, w in problem.nodes()}
    total = sum(rates.values())
    exact = {n: problem.batch_samples * r / total for n, r in rates.items()}
    split = {n: int(math.floor(v)) for n, v in exact.items()}
    rest = problem.batch_samples - sum(split.values())
    for n in sorted(exact, key=lambda n: (-(exact[n] - split[n]), n))[:rest]:
        split[n] += 1
    return {n: v for n, v in split.items() if v}


def solve_dense_relay(problem: AuroraProblem, *, time_limit_s: float | None = None, seed: int = 0,
                      progress: Progress = no_progress) -> AuroraPlan:
    """Return the strongest dense design a team deploys (PrimeRL-Full with its async and multi-stream
    variants): the full checkpoint crosses once into each region, to the relay with the widest uplink,
    which fans it out inside the region; each edge gets the streams that reach its share of the
    bandwidth; transfer overlaps rollout under the problem's staleness bound; the batch is
    water-filled over the arrival times (s)."""
    plan = _plan(problem, region_relay_tree(problem), "dense")
    plan.solver = SolverInfo(name="dense-relay")
    return plan


def solve_dense_tree(problem: AuroraProblem, *, time_limit_s: float | None = None, seed: int = 0,
                     progress: Progress = no_progress) -> AuroraPlan:
    """Return the full checkpoint shipped down the relay tree that AuroraRL's own bandwidth-aware search
    (same starts, local search and water-filled split) picks for the dense payload."""
    return solve_aurora(problem, time_limit_s=time_limit_s, seed=seed, progress=progress, payload="dense",
                        name="dense-tree")


DENSE_BASELINES = ("dense-broadcast", "dense-multistream", "dense-relay", "dense-tree")


def _baseline(payload: str, multistream: bool):
    def fn(problem: AuroraProblem, *, time_limit_s: float | None = None, seed: int = 0,
           progress: Progress = no_progress) -> AuroraPlan:
        streams = problem.max_streams if multistream else 1
        return _plan(problem, _star(problem), payload, _proportional_split(problem), streams=streams)
    return fn


# ---------------------------------------------------------------- exact (CP-SAT)

def exact_applicable(problem: AuroraProblem) -> str | None:
    """Return why the exact solver does not apply (too many workers, or a price objective), else None."""
    n = len(problem.worker_names())
    if n > EXACT_MAX_WORKERS:
        return f"{n} workers; the exact CP-SAT model is for at most {EXACT_MAX_WORKERS}"
    if problem.objective != "step_time":
        return "the exact model minimises step time only"
    return None


# seconds below which CP-SAT is not started under a time limit (its own start-up is a few ms); the
# heuristic's plan, the CP-SAT hint, is returned instead with status time_limit
MIN_CPSAT_S = 0.01


def solve_exact(problem: AuroraProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress = no_progress, workers: int = 2) -> AuroraPlan:
    """Return the step-time-optimal plan of the CP-SAT model (tree, fan-out-shared rates, integer split).

    Times are integers in microseconds; every rate an edge can take (link/stream cap or uplink/f)
    is one of a finite set of levels, so D/R and b/r are table look-ups. Under `time_limit_s` (wall s)
    the heuristic's hint gets at most half of it and CP-SAT what is left; when CP-SAT stops before a
    proof with a plan slower than its hint (or with none), the hint's plan is returned (time_limit), as
    it is at once under a limit shorter than OR-Tools' first import when no solve has imported it yet
    (`backends.cold_import_outlasts`).
    """
    from gpuplan.solvers.backends import CP_MODEL, cold_import_outlasts, solve_cpsat

    started = time.perf_counter()
    if (why := cold_import_outlasts(CP_MODEL, time_limit_s)) is not None:
        hint = solve_aurora(problem, time_limit_s=time_limit_s / 2 if time_limit_s else None, search=True)
        plan = hint.model_copy(update={"status": Status.TIME_LIMIT,
                                       "message": f"{why}; the heuristic's plan is shown"})
        plan.solver = SolverInfo(name="exact", stats={"heuristic_step_s": hint.predicted["step_time_s"]})
        return plan
    from ortools.sat.python import cp_model

    US = 1e6
    names = problem.worker_names()
    W = len(names)
    nodes = [TRAINER] + names
    D = problem.delta_bytes()
    first_s, Xp, b = extraction(problem, D)
    X = Xp / 1e9  # extraction rate in payload GB/s: the trainer's level
    region = [problem.region_of(n) for n in nodes]
    rate = {(p, c, f, k): edge_rate(problem, nodes[p], nodes[c], f, k)
            for p in range(W + 1) for c in range(1, W + 1) if p != c
            for f in range(1, W + 1) for k in range(1, W + 1)}
    levels = sorted(set(rate.values()) | {X})
    li = {v: i for i, v in enumerate(levels)}
    tail_us = [round((D - b) / (v * 1e9) * US) for v in levels]
    hop_us = [round(b / (v * 1e9) * US) for v in levels]
    lat_us = {(p, c): round(problem.link(problem.region_of(nodes[p]), problem.region_of(nodes[c])).latency_s * US)
              for p in range(W + 1) for c in range(1, W + 1) if p != c}
    spc_us = [round(problem.seconds_per_sample(n) * US) for n in names]
    train_us = round(problem.trainer.train_time_s * US)
    B, s = problem.batch_samples, problem.max_staleness
    horizon = train_us + max(tail_us) + W * (max(hop_us) + max(lat_us.values(), default=0)) + \
        B * max(spc_us) + round(first_s * US) + 1

    m = cp_model.CpModel()
    x = {(p, c): m.NewBoolVar(f"x{p}_{c}") for p in range(W + 1) for c in range(1, W + 1) if p != c}
    intree = [None] + [m.NewBoolVar(f"in{c}") for c in range(1, W + 1)]
    depth = [m.NewConstant(0)] + [m.NewIntVar(0, W, f"d{c}") for c in range(1, W + 1)]
    fan = [m.NewIntVar(0, W, f"f{p}") for p in range(W + 1)]
    R = [m.NewConstant(li[X])] + [m.NewIntVar(0, len(levels) - 1, f"R{c}") for c in range(1, W + 1)]
    path = [m.NewConstant(round(first_s * US))] + [m.NewIntVar(0, horizon, f"P{c}") for c in range(1, W + 1)]
    F = [None] + [m.NewIntVar(0, 2 * horizon, f"F{c}") for c in range(1, W + 1)]
    n = [None] + [m.NewIntVar(0, B, f"n{c}") for c in range(1, W + 1)]
    act = [None] + [m.NewBoolVar(f"a{c}") for c in range(1, W + 1)]
    T = m.NewIntVar(train_us, 2 * horizon, "T")
    for c in range(1, W + 1):
        m.Add(sum(x[p, c] for p in range(W + 1) if p != c) == intree[c])
    for p in range(W + 1):
        m.Add(fan[p] == sum(x[p, c] for c in range(1, W + 1) if p != c))
    cross = {}  # edges crossing each inter-region pair
    for pair in {frozenset((region[p], region[c])) for (p, c) in x if region[p] != region[c]}:
        cross[pair] = m.NewIntVar(0, W, f"m{'-'.join(sorted(pair))}")
        m.Add(cross[pair] == sum(v for (p, c), v in x.items() if frozenset((region[p], region[c])) == pair))
    for (p, c), var in x.items():
        lvl = m.NewIntVar(0, len(levels) - 1, f"l{p}_{c}")
        if region[p] == region[c]:
            m.AddElement(fan[p], [li[rate[p, c, max(1, f), 1]] for f in range(W + 1)], lvl)
        else:  # the rate depends on the parent's fan-out and on the edges crossing the region pair
            key = m.NewIntVar(0, (W + 1) ** 2 - 1, f"k{p}_{c}")
            m.Add(key == fan[p] * (W + 1) + cross[frozenset((region[p], region[c]))])
            m.AddElement(key, [li[rate[p, c, max(1, f), max(1, k)]] for f in range(W + 1) for k in range(W + 1)], lvl)
        hop = m.NewIntVar(0, max(hop_us), f"h{p}_{c}")
        m.AddElement(lvl, hop_us, hop)
        if p:
            m.AddImplication(var, intree[p])
        m.Add(depth[c] >= depth[p] + 1).OnlyEnforceIf(var)
        m.Add(R[c] <= R[p]).OnlyEnforceIf(var)
        m.Add(R[c] <= lvl).OnlyEnforceIf(var)
        m.Add(path[c] >= path[p] + hop + lat_us[p, c]).OnlyEnforceIf(var)
    for c in range(1, W + 1):
        tail = m.NewIntVar(0, max(tail_us), f"t{c}")
        m.AddElement(R[c], tail_us, tail)
        m.Add(F[c] >= path[c] + tail)
        m.Add(n[c] >= 1).OnlyEnforceIf(act[c])
        m.Add(n[c] == 0).OnlyEnforceIf(act[c].Not())
        m.AddImplication(act[c], intree[c])
        gen = spc_us[c - 1] * n[c]
        m.Add(T >= gen)
        m.Add(T >= F[c]).OnlyEnforceIf(act[c])
        m.Add((s + 1) * T >= train_us + F[c] + gen).OnlyEnforceIf(act[c])
    m.Add(sum(n[1:]) == B)
    m.Minimize(T)

    # hint: the heuristic's tree and split
    hint = solve_aurora(problem, time_limit_s=5.0 if time_limit_s is None else min(5.0, time_limit_s / 2),
                        search=True)
    parent = {e.child: e.parent for e in hint.edges}
    for (p, c), var in x.items():
        m.AddHint(var, int(parent.get(names[c - 1]) == nodes[p]))
    for c in range(1, W + 1):
        m.AddHint(n[c], hint.rollout.get(names[c - 1], 0))

    progress(None, "CP-SAT")
    left = 60.0 if time_limit_s is None else time_limit_s - (time.perf_counter() - started)
    try:
        if left < MIN_CPSAT_S:  # the hint and the model took the limit: CP-SAT could not even start
            raise SolverError(f"the time limit was spent on the hint and the model ({left:.3g} s left)")
        # less 5% for reading the solution and assembling the plan, as Tessel's exact does
        res = solve_cpsat(m, time_limit_s=left if time_limit_s is None else 0.95 * left, seed=seed, workers=workers)
    except SolverError as exc:  # no solution in the limit: the heuristic's plan stands, unproven
        if time_limit_s is None:
            raise
        plan = hint.model_copy(update={"status": Status.TIME_LIMIT,
                                       "message": f"{exc}; the heuristic's plan (its CP-SAT hint) is shown"})
        plan.solver = SolverInfo(name="exact", stats={"heuristic_step_s": hint.predicted["step_time_s"]})
        return plan
    val = res.solver.Value
    tree = {names[c - 1]: nodes[p] for (p, c), var in x.items() if val(var)}
    split = {names[c - 1]: int(val(n[c])) for c in range(1, W + 1) if val(n[c]) > 0}
    plan = _plan(problem, tree, "delta", split, status=res.status)
    # the integer-microsecond model can tie; keep the plan the float cost model prefers
    polished = _plan(problem, tree, "delta", status=res.status)
    if polished.predicted["step_time_s"] < plan.predicted["step_time_s"]:
        plan = polished
    if res.status is not Status.OPTIMAL and hint.predicted["step_time_s"] < plan.predicted["step_time_s"]:
        # stopped before a proof with a worse incumbent than the hint CP-SAT started from: the hint stands
        slower = plan.predicted["step_time_s"]
        plan = hint.model_copy(update={"status": Status.TIME_LIMIT, "message": (
            f"CP-SAT stopped by the time limit at a {slower:.6g} s step, slower than its hint; the heuristic's "
            "plan (its CP-SAT hint) is shown")})
    gap = plan.predicted["step_time_s"] / hint.predicted["step_time_s"]
    plan.solver = SolverInfo(name="exact", stats={**res.stats, "cpsat_objective_us": res.objective,
                                                  "cpsat_bound_us": res.bound,
                                                  "heuristic_step_s": hint.predicted["step_time_s"],
                                                  "heuristic_over_exact": 1 / gap if gap else None})
    return plan


register_solver("aurora", "aurora", solve_aurora, role="paper", default=True,
                description="sparse delta, bandwidth-aware relay tree and rollout split, local search",
                option_rules={"search": flag(), "payload": one_of("delta", "dense"),
                              "name": one_of("aurora", "dense-tree")})
register_solver("aurora", "exact", solve_exact, role="exact", applicable=exact_applicable,
                description="CP-SAT over relay tree, shared rates and integer split (<= 8 workers)",
                option_rules={"workers": integer(1, MAX_WORKERS)})  # CP-SAT search workers
register_solver("aurora", "dense-broadcast", _baseline("dense", False), role="baseline",
                description="full checkpoint from the trainer, one stream per worker, split by throughput")
register_solver("aurora", "dense-multistream", _baseline("dense", True), role="baseline",
                description="full checkpoint from the trainer, most streams per link, split by throughput")
register_solver("aurora", "dense-relay", solve_dense_relay, role="baseline",
                description="full checkpoint once per region, relay fan-out inside it, streams to each share, "
                            "overlapped under the staleness bound, water-filled split (PrimeRL-Full at its best)")
register_solver("aurora", "dense-tree", solve_dense_tree, role="baseline",
                description="full checkpoint down the relay tree chosen by AuroraRL's bandwidth-aware search")
register_solver("aurora", "delta-naive", _baseline("delta", True), role="baseline",
                description="sparse delta from the trainer to all, split by throughput (no bandwidth awareness)")

