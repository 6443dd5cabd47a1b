"""psRL solvers: the subtree-affinity / prefix-split greedy, an exact CP-SAT placement, and the baselines.

psrl (paper)        LPT over subtrees of the prefix forest: the largest unassigned subtree goes whole to
                    the worker where it finishes first if that stays under the balanced target
                    (subtree affinity, M1); otherwise it is split at its root and its children (and the
                    samples ending at the root) go back into the queue (prefix split, M2), each worker
                    that gets a piece paying min(recompute, K/V + dK/dV exchange) for the shared prefix.
                    Then a local search moves (and on small batches swaps) subtrees and samples off the
                    most loaded worker while the makespan drops. Micro-batches in DFS order.
exact               CP-SAT over sample -> worker, node computed / received per worker (beyond.md 3.2)
karmarkar-karp      verl's seqlen balancing: largest differencing over sequence lengths across k ranks,
                    prefix-oblivious (every sample trained alone)
subtree-greedy      AReaL-DTA style: whole task trees (groups) by LPT, shared prefixes reused only inside
                    a worker (recomputed on every worker that needs them, never exchanged, never split)
no-sharing          every sample trained alone, LPT over their costs (the floor)
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from gpuplan.errors import InfeasibleError
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.models.psrl import PsrlPlan, PsrlProblem, finish_plan
from gpuplan.option_rules import MAX_WORKERS, flag, integer
from gpuplan.registry import Progress, no_progress, register_solver

EXACT_MAX_SAMPLES = 40
HINT_MAX_S = 5.0      # the most the greedy hint of `exact` may take (s)
MIN_CPSAT_S = 0.05    # CP-SAT always gets this long (s), even when the hint used the whole budget
EXACT_MAX_WORKERS = 8
EXACT_MAX_CELLS = 4_000  # used nodes x workers
SMALL_BATCH = 64         # at most this many samples: the local search also moves and swaps single samples
MULTI_START_TOLERANCES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)
LARGE_TOLERANCES = (0.02, 0.1, 0.5)  # larger batches: fewer starts (each greedy + local search takes seconds)
LS_TARGETS = 8           # large batches: the local search tries moves to the 8 least loaded workers
COMPOUND_UNITS = 12      # compound moves: the largest units of the most loaded worker tried, and partners per unit
COMPOUND_KICK_MAX = 24   # at most this many samples: the seeded kicks' local searches also try compound moves
TIME_UNITS_PER_S = 1e6   # CP-SAT's integer time unit: microseconds (scaled further for long makespans)


# ---------------------------------------------------------------- shared state

class Placement:
    """A sample -> worker assignment with per-node use counts, each node's load contributions under the
    owner rule, and per-worker loads (s). Owner rule: a node used by one worker is computed there; used
    by several, the one with the most samples through it (lowest index on ties) computes it and each
    other user pays min(recompute, exchange) (recompute only when `exchange` is False)."""

    def __init__(self, problem: PsrlProblem, exchange: bool = True) -> None:
        self.p = problem
        self.f = problem.built
        self.exchange = exchange
        self.W = len(problem.rates)
        self.cnt: list[dict[int, int]] = [{} for _ in range(self.f.n_nodes)]
        self.contrib: list[dict[int, tuple[float, str]]] = [{} for _ in range(self.f.n_nodes)]
        self.assign = [-1] * self.f.n_samples
        self.loads = [0.0] * self.W
        self.paths = [self.f.sample_path(s) for s in range(self.f.n_samples)]
        self.owner = [-1] * self.f.n_nodes  # a chosen owner per node (-1: the rule's)

    def node_contrib(self, v: int, cnt: dict[int, int], owner: int | None = None) -> dict[int, tuple[float, str]]:
        """Return {worker: (seconds, 'c' computed | 'r' received)} of node v for use counts `cnt` (and
        owner, default the node's chosen one when it is a user, else the rule's)."""
        users = [w for w, c in cnt.items() if c > 0]
        if not users:
            return {}
        p = self.p
        owner = self.owner[v] if owner is None else owner
        if owner not in users:
            owner = min(users, key=lambda w: (-cnt[w], w))
        out = {owner: (p.flops[v] / p.rates[owner], "c")}
        for w in users:
            if w != owner:
                rc = p.flops[v] / p.rates[w]
                out[w] = (p.comm_s[v], "r") if self.exchange and p.comm_s[v] < rc else (rc, "c")
        return out

    def counts_of(self, samples: list[int]) -> dict[int, int]:
        """Return {node: samples of `samples` whose path passes through it}."""
        k: dict[int, int] = {}
        for s in samples:
            for v in self.paths[s]:
                k[v] = k.get(v, 0) + 1
        return k

    def delta(self, k: dict[int, int], src: int, dst: int) -> dict[int, float]:
        """Return the load change per worker if samples with node counts `k` move from src (-1: nowhere)
        to dst (-1: nowhere)."""
        d: dict[int, float] = {}
        for v, n in k.items():
            cnt = dict(self.cnt[v])
            if src >= 0:
                cnt[src] = cnt.get(src, 0) - n
            if dst >= 0:
                cnt[dst] = cnt.get(dst, 0) + n
            new = self.node_contrib(v, cnt)
            for w, (sec, _) in self.contrib[v].items():
                d[w] = d.get(w, 0.0) - sec
            for w, (sec, _) in new.items():
                d[w] = d.get(w, 0.0) + sec
        return d

    def owner_delta(self, v: int, owner: int) -> dict[int, float]:
        """Return the load change per worker if `owner` (a user of v) computes node v instead."""
        d: dict[int, float] = {}
        for w, (sec, _) in self.contrib[v].items():
            d[w] = d.get(w, 0.0) - sec
        for w, (sec, _) in self.node_contrib(v, self.cnt[v], owner).items():
            d[w] = d.get(w, 0.0) + sec
        return d

    def set_owner(self, v: int, owner: int) -> None:
        """Make `owner` (a user of v) the worker computing node v."""
        for w, (sec, _) in self.contrib[v].items():
            self.loads[w] -= sec
        self.owner[v] = owner
        self.contrib[v] = self.node_contrib(v, self.cnt[v])
        for w, (sec, _) in self.contrib[v].items():
            self.loads[w] += sec

    def move(self, samples: list[int], dst: int, k: dict[int, int] | None = None) -> None:
        """Move `samples` (all on one worker, or unassigned) to worker dst."""
        src = self.assign[samples[0]]
        k = k if k is not None else self.counts_of(samples)
        for v, n in k.items():
            cnt = self.cnt[v]
            if src >= 0:
                cnt[src] -= n
                if cnt[src] == 0:
                    del cnt[src]
            cnt[dst] = cnt.get(dst, 0) + n
            for w, (sec, _) in self.contrib[v].items():
                self.loads[w] -= sec
            self.contrib[v] = self.node_contrib(v, cnt)
            for w, (sec, _) in self.contrib[v].items():
                self.loads[w] += sec
        for s in samples:
            self.assign[s] = dst

    def sets(self) -> tuple[list[set[int]], list[set[int]]]:
        """Return (computed, received) node sets per worker."""
        comp: list[set[int]] = [set() for _ in range(self.W)]
        recv: list[set[int]] = [set() for _ in range(self.W)]
        for v, c in enumerate(self.contrib):
            for w, (_, role) in c.items():
                (comp if role == "c" else recv)[w].add(v)
        return comp, recv


def _fits(problem: PsrlProblem) -> list[list[bool]]:
    """Return fits[s][w]: whether sample s's path fits in worker w's memory next to the model state."""
    return [[problem.static_bytes + b <= m for m in problem.memory] for b in problem.sample_bytes]


def _need_fit(problem: PsrlProblem) -> list[list[bool]]:
    """Return _fits, raising InfeasibleError naming the first worker that cannot hold the model state (every
    worker holds it, training or not) or the first sample no worker can hold."""
    small = [w for w, m in enumerate(problem.memory) if problem.static_bytes > m]
    if small:
        w = small[0]
        raise InfeasibleError(
            f"worker {problem.worker_names()[w]} has {problem.memory[w] / 2**30:.1f} GiB; the model state every "
            f"worker holds takes {problem.static_bytes / 2**30:.1f} GiB: give it more memory or leave it out")
    fits = _fits(problem)
    for s, row in enumerate(fits):
        if not any(row):
            raise InfeasibleError(
                f"sample {s} ({problem.built.sample_tokens(s):,} tokens) needs {problem.sample_bytes[s] / 2**30:.1f} GiB "
                f"for its path plus {problem.static_bytes / 2**30:.1f} GiB of model state; the largest worker "
                f"has {max(problem.memory) / 2**30:.1f} GiB")
    return fits


def _plan(problem: PsrlProblem, pl: Placement, sharing: str = "prefix", status: Status = Status.FEASIBLE,
          stats: dict[str, Any] | None = None) -> PsrlPlan:
    comp, recv = pl.sets()
    if sharing == "none":
        recv = [set() for _ in comp]
        comp = [set() for _ in comp]
        for s, w in enumerate(pl.assign):
            comp[w].update(pl.paths[s])
    plan = PsrlPlan(kind="psrl", status=status, sharing=sharing)
    plan = finish_plan(problem, plan, pl.assign, comp, recv)
    if stats is not None:
        plan.solver = SolverInfo(name="", stats=stats)
    return plan


# ---------------------------------------------------------------- the paper's greedy

def _subtree_tables(problem: PsrlProblem) -> tuple[list[float], list[list[int]], list[list[int]]]:
    """Return (subtree FLOPs of used nodes, samples in each subtree, samples ending at each node)."""
    f = problem.built
    used = f.used()
    sub = [problem.flops[v] if used[v] else 0.0 for v in range(f.n_nodes)]
    for v in range(f.n_nodes - 1, 0, -1):
        if f.parent[v] >= 0:
            sub[f.parent[v]] += sub[v]
    below = f.samples_below()
    at: list[list[int]] = [[] for _ in range(f.n_nodes)]
    for s, e in enumerate(f.end):
        at[e].append(s)
    return sub, below, at


def greedy_assign(problem: PsrlProblem, pl: Placement, fits: list[list[bool]], tolerance: float = 0.02) -> int:
    """Place every sample by the subtree-affinity / prefix-split LPT greedy; return the number of splits."""
    f = problem.built
    rates = problem.rates
    sub, below, at = _subtree_tables(problem)
    total = sum(problem.flops[v] for v, u in enumerate(f.used()) if u)
    target = total / sum(rates)
    heap: list[tuple[float, int, int, int]] = []  # (-flops, kind 0 subtree / 1 samples at node, node)
    seq = 0
    for v in range(f.n_nodes):
        if f.parent[v] < 0 and below[v]:
            heapq.heappush(heap, (-sub[v], seq, 0, v))
            seq += 1
    splits = 0
    while heap:
        negc, _, kind, v = heapq.heappop(heap)
        samples = below[v] if kind == 0 else at[v]
        if not samples:
            continue
        k = pl.counts_of(samples)
        best: tuple[float, int] | None = None
        for w in range(pl.W):
            if not all(fits[s][w] for s in samples):
                continue
            d = pl.delta(k, -1, w)
            finish = max(pl.loads[u] + d.get(u, 0.0) for u in set(d) | {w})
            if best is None or (finish, w) < best:
                best = (finish, w)
        splittable = kind == 0 and (f.children[v] or False) and (best is None or best[0] > target * (1 + tolerance))
        if splittable:
            splits += 1
            for c in f.children[v]:
                if below[c]:
                    heapq.heappush(heap, (-sub[c], seq, 0, c))
                    seq += 1
            if at[v]:
                heapq.heappush(heap, (-problem.flops[v], seq, 1, v))
                seq += 1
            continue
        if best is None:  # a sample set no single worker holds: place sample by sample
            for s in samples:
                w = min((w for w in range(pl.W) if fits[s][w]), key=lambda w: (pl.loads[w], w))
                pl.move([s], w)
            continue
        pl.move(samples, best[1], k)
    return splits


def _candidate_units(pl: Placement, m: int, below: list[list[int]], limit: int, sub: list[float] | None = None,
                     cap_flops: float = 0.0) -> list[list[int]]:
    """Return sample sets on worker m to try moving: its maximal subtrees and their children, and single
    samples on small batches; largest first, at most `limit`. With `sub` (subtree FLOPs) and `cap_flops`,
    also the largest exclusive subtrees at any depth whose FLOPs are at most cap_flops (the pieces that fit
    the gap between the most and the least loaded worker), up to `limit` more."""
    f = pl.f
    total = {v: n for v, n in ((v, len(below[v])) for v in range(f.n_nodes))}
    exclusive = [v for v in range(f.n_nodes) if total[v] and pl.cnt[v].get(m, 0) == total[v]]
    ex = set(exclusive)
    units: list[tuple[int, list[int]]] = []
    for v in exclusive:
        p = f.parent[v]
        if p < 0 or p not in ex or (f.parent[p] < 0 or f.parent[p] not in ex):
            units.append((len(below[v]), below[v]))
    if f.n_samples <= SMALL_BATCH:
        units += [(1, [s]) for s, w in enumerate(pl.assign) if w == m]
    seen, out = set(), []
    for _, u in sorted(units, key=lambda t: (-t[0], t[1][0])):
        key = tuple(u)
        if key not in seen:
            seen.add(key)
            out.append(u)
    out = out[:limit]
    if sub is not None and cap_flops > 0:
        fitting = sorted((v for v in exclusive if sub[v] <= cap_flops), key=lambda v: (-sub[v], v))
        extra = 0
        for v in fitting:
            key = tuple(below[v])
            if key in seen:
                continue
            seen.add(key)
            out.append(below[v])
            extra += 1
            if extra >= limit:
                break
    return out


def local_search(problem: PsrlProblem, pl: Placement, fits: list[list[bool]], deadline: float,
                 max_rounds: int = 200, max_units: int = 48, compound: bool = True) -> int:
    """Move (and on small batches swap) sample sets off the most loaded worker while the makespan drops,
    on small batches also by compound moves when `compound`; return the number of accepted changes.
    Deterministic: bounded by rounds and candidates (the deadline only stops it early)."""
    sub, below, _ = _subtree_tables(problem)
    changes = 0
    small = pl.f.n_samples <= SMALL_BATCH
    for _ in range(max_rounds):
        if time.perf_counter() > deadline:
            break
        cur = max(pl.loads)
        m = min(range(pl.W), key=lambda w: (-pl.loads[w], w))
        gap_flops = (cur - min(pl.loads)) * problem.rates[m]
        units = _candidate_units(pl, m, below, max_units, sub, gap_flops)
        # large batches: only the least loaded workers are tried as targets
        targets = list(range(pl.W)) if small else sorted(range(pl.W), key=lambda w: (pl.loads[w], w))[:LS_TARGETS]
        best: tuple[float, float, int, list[int], list[int] | None, int] | None = None
        for u in units:
            k = pl.counts_of(u)
            for t in targets:
                if t == m or not all(fits[s][t] for s in u):
                    continue
                d = pl.delta(k, m, t)
                new = max(pl.loads[w] + d.get(w, 0.0) for w in range(pl.W))
                key = (new, pl.loads[t] + d.get(t, 0.0))
                if new < cur * (1 - 1e-9) and (best is None or key < best[:2]):
                    best = (new, key[1], t, u, None, 0)
        if best is None:  # hand the computing of a shared node to another of its users
            for v in sorted((v for v, c in enumerate(pl.contrib) if c.get(m, (0, ""))[1] == "c" and len(c) > 1),
                            key=lambda v: (-problem.flops[v], v))[:max_units]:
                for t in sorted(pl.contrib[v]):
                    if t == m:
                        continue
                    d = pl.owner_delta(v, t)
                    new = max(pl.loads[w] + d.get(w, 0.0) for w in range(pl.W))
                    if new < cur * (1 - 1e-9) and (best is None or (new, 0.0) < best[:2]):
                        best = (new, 0.0, t, [], None, v + 1)
        settle = False
        if best is None and small:
            for u in units:
                for t in range(pl.W):
                    if t == m or not all(fits[s][t] for s in u):
                        continue
                    pl.move(u, t)
                    for u2 in _candidate_units(pl, t, below, max_units):
                        if set(u2) & set(u) or not all(fits[s][m] for s in u2):
                            continue
                        d = pl.delta(pl.counts_of(u2), t, m)
                        new = max(pl.loads[w] + d.get(w, 0.0) for w in range(pl.W))
                        if new < cur * (1 - 1e-9) and (best is None or (new, 0.0) < best[:2]):
                            best = (new, 0.0, t, u, u2, 0)
                    pl.move(u, m)
        if best is None and small and compound and time.perf_counter() < deadline:
            # compound moves: a move (or swap) that pays off only once the shared nodes it touches change
            # owner (e.g. the worker keeping a prefix's computing after its other users left)
            best = _best_compound(pl, m, units[:COMPOUND_UNITS], fits, below, cur, COMPOUND_UNITS)
            settle = best is not None
        if best is None:
            break
        _, _, t, u, u2, node = best
        if node:
            pl.set_owner(node - 1, t)
            changes += 1
            continue
        _apply_compound(pl, m, t, u, u2, settle)
        changes += 1
    return changes


def _touched(pl: Placement, samples: list[int]) -> list[int]:
    """Return the nodes on the paths of `samples` (sorted)."""
    return sorted({v for s in samples for v in pl.paths[s]})


def settle_owners(pl: Placement, nodes: list[int], rounds: int = 2) -> None:
    """Give each shared node of `nodes` (largest FLOPs first) to the user under which the loads are
    lexicographically best (makespan, then sum of squared loads), `rounds` passes."""
    p = pl.p
    shared = sorted((v for v in nodes if len(pl.cnt[v]) > 1), key=lambda v: (-p.flops[v], v))
    for _ in range(rounds):
        changed = False
        for v in shared:
            cur_owner = next(w for w, (_, role) in pl.contrib[v].items() if role == "c")
            best_key, best_o = None, cur_owner
            for o in sorted(pl.cnt[v]):
                d = pl.owner_delta(v, o)
                loads = [pl.loads[w] + d.get(w, 0.0) for w in range(pl.W)]
                key = (round(max(loads), 12), round(sum(x * x for x in loads), 18), o != cur_owner, o)
                if best_key is None or key < best_key:
                    best_key, best_o = key, o
            if best_o != cur_owner:
                pl.set_owner(v, best_o)
                changed = True
        if not changed:
            break


def _apply_compound(pl: Placement, m: int, t: int, u: list[int], u2: list[int] | None, settle: bool) -> None:
    """Move u from m to t (and u2 from t to m); with `settle`, re-choose the owners of the nodes touched."""
    pl.move(u, t)
    if u2 is not None:
        pl.move(u2, m)
    if settle:
        settle_owners(pl, _touched(pl, u + (u2 or [])))


def _snapshot(pl: Placement) -> tuple:
    """Return a copy of pl's mutable state."""
    return ([dict(c) for c in pl.cnt], [dict(c) for c in pl.contrib], list(pl.assign), list(pl.loads),
            list(pl.owner))


def _restore(pl: Placement, snap: tuple) -> None:
    """Put back a state taken by _snapshot."""
    cnt, contrib, assign, loads, owner = snap
    pl.cnt = [dict(c) for c in cnt]
    pl.contrib = [dict(c) for c in contrib]
    pl.assign, pl.loads, pl.owner = list(assign), list(loads), list(owner)


def _best_compound(pl: Placement, m: int, units: list[list[int]], fits: list[list[bool]], below: list[list[int]],
                   cur: float, max_units: int) -> tuple | None:
    """Return the best (makespan, 0, t, u, u2, 0) among moves of a unit off worker m and swaps with a unit
    of the target, each followed by settle_owners on the touched nodes, if one lowers the makespan."""
    snap = _snapshot(pl)
    best = None
    for u in units:
        for t in range(pl.W):
            if t == m or not all(fits[s][t] for s in u):
                continue
            options: list[list[int] | None] = [None]
            pl.move(u, t)
            options += [u2 for u2 in _candidate_units(pl, t, below, max_units)
                        if not set(u2) & set(u) and all(fits[s][m] for s in u2)]
            _restore(pl, snap)
            for u2 in options:
                _apply_compound(pl, m, t, u, u2, True)
                new = max(pl.loads)
                _restore(pl, snap)
                if new < cur * (1 - 1e-9) and (best is None or new < best[0]):
                    best = (new, 0.0, t, u, u2, 0)
    return best


def solve_psrl(problem: PsrlProblem, *, time_limit_s: float | None = None, seed: int = 0,
               progress: Progress = no_progress, search: bool = True, max_rounds: int = 200,
               perturb_rounds: int = 40) -> PsrlPlan:
    """Return the subtree-affinity / prefix-split greedy's plan, improved by local search when `search`.
    The greedy restarts from several split tolerances (how far over the balanced target a whole subtree may
    go: six on small batches of <= SMALL_BATCH samples, LARGE_TOLERANCES on larger ones; a loose tolerance
    splits less and leaves the balancing to the local search's smaller pieces), the best plan after local
    search is kept, and on small batches
    `perturb_rounds` seeded kicks (two samples moved, local search again) try to leave its local optimum."""
    fits = _need_fit(problem)
    deadline = time.perf_counter() + (time_limit_s if time_limit_s is not None else 60.0)
    tolerances = MULTI_START_TOLERANCES if problem.built.n_samples <= SMALL_BATCH else LARGE_TOLERANCES
    best: tuple[float, Placement, dict[str, Any]] | None = None
    for i, tol in enumerate(tolerances):
        progress(i / len(tolerances), f"greedy (tolerance {tol})")
        pl = Placement(problem, exchange=True)
        splits = greedy_assign(problem, pl, fits, tol)
        stats: dict[str, Any] = {"splits": splits, "greedy_makespan_s": max(pl.loads), "tolerance": tol}
        if search:
            stats["local_search_moves"] = local_search(problem, pl, fits, deadline, max_rounds=max_rounds)
        if best is None or max(pl.loads) < best[0] * (1 - 1e-12):
            best = (max(pl.loads), pl, stats)
        if time.perf_counter() > deadline:
            break
    assert best is not None
    kicks = 0
    if search and problem.built.n_samples <= SMALL_BATCH:
        progress(None, "perturbed restarts")
        pl, kicks = _perturbed_search(problem, best[1], fits, deadline, seed, rounds=perturb_rounds)
        best = (max(pl.loads), pl, best[2])
    stopped = time.perf_counter() > deadline
    plan = _plan(problem, best[1], stats={**best[2], "starts": len(tolerances), "improving_kicks": kicks,
                                          "stopped_by_time_limit": stopped})
    if stopped and time_limit_s is not None:
        plan.status = Status.TIME_LIMIT
        plan.message = (f"time limit {time_limit_s:g} s: the search stopped early (restarts, local search or "
                        "kicks cut short); the best plan in hand is shown")
    return plan


def _copy(problem: PsrlProblem, pl: Placement) -> Placement:
    """Return a fresh Placement with pl's assignment and chosen owners."""
    out = Placement(problem, exchange=pl.exchange)
    for s, w in enumerate(pl.assign):
        out.move([s], w)
    for v, o in enumerate(pl.owner):
        if o >= 0 and o in out.cnt[v]:
            out.set_owner(v, o)
    return out


def _perturbed_search(problem: PsrlProblem, start: Placement, fits: list[list[bool]], deadline: float, seed: int,
                      rounds: int) -> tuple[Placement, int]:
    """Iterated local search for small batches: `rounds` times, move two random samples to random workers
    that hold them (seeded), run the local search, keep the result when the makespan drops. Returns the
    best placement and the number of improving kicks."""
    import random

    r = random.Random(seed)
    best = start
    kicks = 0
    S = problem.built.n_samples
    for _ in range(rounds):
        if time.perf_counter() > deadline:
            break
        pl = _copy(problem, best)
        for _ in range(2):
            s = r.randrange(S)
            ok = [w for w in range(pl.W) if fits[s][w] and w != pl.assign[s]]
            if ok:
                pl.move([s], r.choice(ok))
        local_search(problem, pl, fits, deadline, max_rounds=50, compound=S <= COMPOUND_KICK_MAX)
        if max(pl.loads) < max(best.loads) * (1 - 1e-12):
            best, kicks = pl, kicks + 1
    return best, kicks


# ---------------------------------------------------------------- baselines

def karmarkar_karp(values: list[float], k: int, equal_size: bool) -> list[list[int]]:
    """Return k lists of indices partitioning `values` by the largest differencing method as verl's
    seqlen_balancing implements it: each item (or, with equal_size, each run of k consecutive items in
    sorted order) starts a k-set state; the two states of largest spread are merged, largest set with
    smallest, until one state remains."""

    class State:
        __slots__ = ("sets",)

        def __init__(self, sets: list[tuple[float, list[int]]]) -> None:
            self.sets = sorted(sets, key=lambda t: (t[0], len(t[1]), t[1]), reverse=True)

        @property
        def spread(self) -> float:
            return self.sets[0][0] - self.sets[-1][0]

        def __lt__(self, other: "State") -> bool:  # heapq pops the largest spread first
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0][0] > other.sets[0][0]

        def merge(self, other: "State") -> "State":
            return State([(a[0] + b[0], a[1] + b[1]) for a, b in zip(self.sets, other.sets[::-1])])

    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    heap: list[State] = []
    if equal_size:
        for off in range(0, len(order), k):
            heap.append(State([(values[i], [i]) for i in order[off:off + k]] + [(0.0, [])] *
                              (k - len(order[off:off + k]))))
    else:
        heap = [State([(values[i], [i])] + [(0.0, [])] * (k - 1)) for i in order]
    heapq.heapify(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        heapq.heappush(heap, a.merge(b))
    return [sorted(s[1]) for s in heap[0].sets]


def solve_karmarkar_karp(problem: PsrlProblem, *, time_limit_s: float | None = None, seed: int = 0,
                         progress: Progress = no_progress) -> PsrlPlan:
    """Return verl's prefix-oblivious plan: sequence lengths balanced by Karmarkar-Karp over the workers
    (equal counts when they divide the batch, as verl's balance_batch asks), each sample trained alone;
    the heaviest partition goes to the fastest worker."""
    fits = _need_fit(problem)
    f = problem.built
    W = len(problem.rates)
    lengths = [float(f.sample_tokens(s)) for s in range(f.n_samples)]
    parts = karmarkar_karp(lengths, W, equal_size=f.n_samples % W == 0)
    parts.sort(key=lambda p: (-sum(lengths[i] for i in p), p[:1]))
    workers = sorted(range(W), key=lambda w: (-problem.rates[w], -problem.memory[w], w))
    holds = [[w for w in workers if all(fits[s][w] for s in part)] for part in parts]
    match = match_parts(holds)
    if match is None:
        raise InfeasibleError(f"karmarkar-karp's {W} partitions cannot be matched to workers whose memory holds "
                              "every path of their partition")
    pl = Placement(problem, exchange=False)
    for part, w in zip(parts, match):
        if part:
            pl.move(part, w)
    return _plan(problem, pl, "none")


def match_parts(holds: list[list[int]]) -> list[int] | None:
    """Return a worker per partition (distinct workers) with partition i on one of holds[i], or None when
    no such matching exists. holds[i] lists the workers that can take partition i, most preferred first;
    partitions come heaviest first and each takes its most preferred free worker; only when none is free
    does it displace earlier ones along an augmenting path (Kuhn's algorithm, iterative), so without memory
    limits the heaviest partition gets the fastest worker."""
    owner: dict[int, int] = {}
    for i, ws in enumerate(holds):
        free = next((w for w in ws if w not in owner), None)
        if free is not None:
            owner[free] = i
        elif not _augment(i, holds, owner):
            return None
    out = [-1] * len(holds)
    for w, i in owner.items():
        out[i] = w
    return out


def _augment(i: int, holds: list[list[int]], owner: dict[int, int]) -> bool:
    """Give partition i a worker by moving earlier partitions along an augmenting path; return whether one
    exists (owner, worker -> partition, is updated in place only when it does)."""
    stack = [[i, 0]]
    seen: set[int] = set()
    while stack:
        top = stack[-1]
        if top[1] == len(holds[top[0]]):
            stack.pop()
            continue
        w = holds[top[0]][top[1]]
        top[1] += 1
        if w in seen:
            continue
        seen.add(w)
        if w not in owner:
            for q, k in stack:
                owner[holds[q][k - 1]] = q
            return True
        stack.append([owner[w], 0])
    return False


def _lpt(problem: PsrlProblem, units: list[list[int]], cost: list[float], fits: list[list[bool]],
         pl: Placement) -> None:
    """Assign units (sample lists) largest cost first to the worker where they finish first (by cost)."""
    est = [0.0] * pl.W
    for i in sorted(range(len(units)), key=lambda i: (-cost[i], i)):
        ok = [w for w in range(pl.W) if all(fits[s][w] for s in units[i])]
        if not ok:
            raise InfeasibleError(f"no worker holds every sample of unit {i} in memory")
        w = min(ok, key=lambda w: (est[w] + cost[i] / problem.rates[w], w))
        est[w] += cost[i] / problem.rates[w]
        pl.move(units[i], w)


def solve_no_sharing(problem: PsrlProblem, *, time_limit_s: float | None = None, seed: int = 0,
                     progress: Progress = no_progress) -> PsrlPlan:
    """Return the no-sharing floor: every sample trained alone, LPT over their FLOPs."""
    fits = _need_fit(problem)
    pl = Placement(problem, exchange=False)
    _lpt(problem, [[s] for s in range(problem.built.n_samples)], problem.sample_flops, fits, pl)
    return _plan(problem, pl, "none")


def solve_subtree_greedy(problem: PsrlProblem, *, time_limit_s: float | None = None, seed: int = 0,
                         progress: Progress = no_progress) -> PsrlPlan:
    """Return the AReaL-DTA-style plan: each group's (task's) tree whole on one worker by LPT over the
    groups' deduplicated FLOPs; a worker reuses the prefixes its own samples share, recomputes what it
    needs, exchanges nothing."""
    fits = _need_fit(problem)
    f = problem.built
    groups: dict[int, list[int]] = {}
    for s, g in enumerate(f.group):
        groups.setdefault(g, []).append(s)
    units = [groups[g] for g in sorted(groups)]
    pl = Placement(problem, exchange=False)
    cost = []
    for u in units:
        cost.append(sum(problem.flops[v] for v in pl.counts_of(u)))
    _lpt(problem, units, cost, fits, pl)
    return _plan(problem, pl)


# ---------------------------------------------------------------- exact

def exact_applicable(problem: PsrlProblem) -> str | None:
    """Return None when the CP-SAT placement applies, else why not (too many samples, workers, cells)."""
    f = problem.built
    W = len(problem.rates)
    cells = sum(f.used()) * W
    if f.n_samples > EXACT_MAX_SAMPLES or W > EXACT_MAX_WORKERS or cells > EXACT_MAX_CELLS:
        return (f"exact takes at most {EXACT_MAX_SAMPLES} samples, {EXACT_MAX_WORKERS} workers and "
                f"{EXACT_MAX_CELLS:,} node x worker cells; this batch has {f.n_samples} samples, {W} workers, "
                f"{cells:,} cells")
    return None


def hint_time_limit_s(budget_s: float) -> float:
    """Return the seconds the greedy hint of `exact` may take out of its whole budget `budget_s` (s): at
    most HINT_MAX_S and half the budget, so CP-SAT keeps the rest and the two together hold the limit."""
    return min(HINT_MAX_S, budget_s / 2)


def solve_exact(problem: PsrlProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress = no_progress, workers: int = 1) -> PsrlPlan:
    """Return the CP-SAT optimum of the placement model: x[s,w] sample on worker, y[v,w] node computed,
    t[v,w] node received (some other worker computes it), y[v,w] only where one of w's samples passes
    through v (no helper computing for others), min Z >= every worker's load; memory by forbidding x
    where a sample's path does not fit. Hinted with the greedy's plan, which is returned (time_limit) when
    what it left of `time_limit_s` is shorter than OR-Tools' first import (`backends.cold_import_outlasts`)."""
    from gpuplan.solvers.backends import CP_MODEL, cold_import_outlasts, solve_cpsat

    budget_s = time_limit_s if time_limit_s is not None else 30.0
    started = time.perf_counter()
    hint = solve_psrl(problem, time_limit_s=hint_time_limit_s(budget_s))
    if time_limit_s is not None and (why := cold_import_outlasts(CP_MODEL, budget_s - (time.perf_counter() - started))):
        hint.status, hint.message = Status.TIME_LIMIT, f"{why}; the greedy's plan is shown"
        hint.solver = SolverInfo(name="exact", stats={"greedy_makespan_s": hint.objective})
        return hint
    from ortools.sat.python import cp_model

    fits = _need_fit(problem)
    f = problem.built
    W = len(problem.rates)
    used = [v for v, u in enumerate(f.used()) if u]
    scale = TIME_UNITS_PER_S
    while hint.objective is not None and hint.objective * scale > 1e9:
        scale /= 10
    cy = {(v, w): max(1, round(problem.flops[v] / problem.rates[w] * scale)) for v in used for w in range(W)}
    ct = {v: max(1, round(problem.comm_s[v] * scale)) for v in used}
    m = cp_model.CpModel()
    x = {(s, w): m.NewBoolVar(f"x{s}_{w}") for s in range(f.n_samples) for w in range(W)}
    y = {(v, w): m.NewBoolVar(f"y{v}_{w}") for v in used for w in range(W)}
    t = {(v, w): m.NewBoolVar(f"t{v}_{w}") for v in used for w in range(W)}
    for s in range(f.n_samples):
        m.AddExactlyOne(x[s, w] for w in range(W))
        for w in range(W):
            if not fits[s][w]:
                m.Add(x[s, w] == 0)
            for v in f.sample_path(s):
                m.Add(y[v, w] + t[v, w] >= x[s, w])
    through: dict[int, list[int]] = {v: [] for v in used}
    for s in range(f.n_samples):
        for v in f.sample_path(s):
            through[v].append(s)
    for v in used:
        for w in range(W):
            m.Add(y[v, w] + t[v, w] <= 1)
            # a worker computes only nodes on its own samples' paths (no helper computing for others)
            m.Add(y[v, w] <= sum(x[s, w] for s in through[v]))
            m.Add(t[v, w] <= sum(y[v, u] for u in range(W) if u != w))
    horizon = sum(max(cy[v, w] for w in range(W)) + ct[v] for v in used)
    Z = m.NewIntVar(0, horizon, "Z")
    for w in range(W):
        m.Add(Z >= sum(cy[v, w] * y[v, w] + ct[v] * t[v, w] for v in used))
    m.Minimize(Z)
    names = {n: i for i, n in enumerate(problem.worker_names())}
    hint_assign = [names[n] for n in hint.sample_worker]
    for (s, w), var in x.items():
        m.AddHint(var, int(hint_assign[s] == w))
    progress(None, "CP-SAT")
    left_s = max(budget_s - (time.perf_counter() - started), MIN_CPSAT_S)
    res = solve_cpsat(m, time_limit_s=left_s, seed=seed, workers=workers)
    val = res.solver.Value
    assign = [next(w for w in range(W) if val(x[s, w])) for s in range(f.n_samples)]
    comp = [{v for v in used if val(y[v, w])} for w in range(W)]
    recv = [{v for v in used if val(t[v, w])} for w in range(W)]
    # drop what nobody needs: a node computed on w is kept when w's samples need it or a receiver needs it
    need = [set() for _ in range(W)]
    for s, w in enumerate(assign):
        need[w].update(f.sample_path(s))
    recv = [r & need[w] for w, r in enumerate(recv)]
    comp = [{v for v in c if v in need[w] or any(v in recv[u] and not any(v in comp[z] and v in need[z]
                                                                             for z in range(W) if z != u)
                                                  for u in range(W) if u != w)} for w, c in enumerate(comp)]
    plan = PsrlPlan(kind="psrl", status=res.status)
    plan = finish_plan(problem, plan, assign, comp, recv)
    greedy = hint.objective or 0.0
    plan.solver = SolverInfo(name="exact", stats={**res.stats, "cpsat_objective": res.objective,
                                                  "cpsat_bound": res.bound, "time_units_per_s": scale,
                                                  "greedy_makespan_s": greedy,
                                                  "greedy_over_exact": greedy / plan.objective
                                                  if plan.objective else None})
    if hint.objective is not None and hint.objective < plan.objective * (1 - 1e-9):
        # the integer model's rounding can rank two plans apart; keep the one the float model prefers
        hint.status = res.status
        hint.solver = plan.solver
        return hint
    return plan


register_solver("psrl", "psrl", solve_psrl, role="paper", default=True,
                description="subtree-affinity / prefix-split LPT greedy charging min(recompute, K/V exchange), "
                            "local search, DFS micro-batches, block-size DP and Belady eviction",
                # max_rounds: rounds of the local search (`search` false turns it off); perturb_rounds: kicks, 0: none
                option_rules={"search": flag(), "perturb_rounds": integer(0),
                              "max_rounds": integer(1, special={0: "no local-search round (the kicks' own still run)"})})
register_solver("psrl", "exact", solve_exact, role="exact", applicable=exact_applicable,
                description=f"CP-SAT placement (<= {EXACT_MAX_SAMPLES} samples, <= {EXACT_MAX_WORKERS} workers)",
                option_rules={"workers": integer(1, MAX_WORKERS)})  # CP-SAT search workers
register_solver("psrl", "karmarkar-karp", solve_karmarkar_karp, role="baseline",
                description="verl's prefix-oblivious sequence-length balancing (largest differencing), no sharing")
register_solver("psrl", "subtree-greedy", solve_subtree_greedy, role="baseline",
                description="AReaL-DTA style: whole task trees by LPT, prefixes shared inside a worker only")
register_solver("psrl", "no-sharing", solve_no_sharing, role="baseline",
                description="every sample trained alone, LPT over its FLOPs")
