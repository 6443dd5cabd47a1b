"""Hetis solvers: the paper's layout (Stage A + water-filling dispatch + re-dispatch), its dispatch
variants, and the baselines the paper compares with, all judged by the shared serving engine.

hetis            Stage A: primary set and dense configuration over the extended layout space (a TP
                 degree per server type that divides its GPU count, so a server may hold several
                 replicas or stages; every multiset of replica pipelines, found by a knapsack over the
                 dense proxy, see layout_table; HexGen's configurations included); the best few by the
                 proxy and the best per primary count simulated for their max rate under the SLOs, each
                 with head-wise dispatch over all GPUs and with its static engine (the better kept);
                 the fewest primaries within (1 + delta) of the best rate. Decode attention of every
                 request water-filled over all GPUs; periodic re-dispatch
hetis-lp         the same layout; the snapshot's heads placed by the LP relaxation + rounding
exact            the same layout; the snapshot's heads placed by CP-SAT (small instances)
uniform-tp       one replica over every GPU: TP inside each node, the layers split evenly over the
                 nodes (uniform shards, so the smallest GPU bounds every device's KV)
hexgen           HexGen-style static asymmetric TP/PP: the same extended space (TP per stage, servers
                 may be split), stages fastest first, layers balanced by speed under memory, requests
                 by throughput share; the same candidates as Stage A simulated, the best kept
splitwise        Splitwise-style phase split: TP groups split into a prefill pool and a decode pool
                 (every split of every TP assignment's groups; pools need not be whole servers), each
                 pool its best replicas by the proxy, KV shipped between them; the best simulated
heads-by-memory  Hetis' primaries; every request's heads split over all GPUs in proportion to their
                 KV capacity (static), no re-dispatch
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.errors import InfeasibleError
from gpuplan.models.hetis import (HeadAssignment, HetisPlan, HetisProblem, Replica, Stage, finish_plan,
                                  rate_search, snapshot_instance)
from gpuplan.models.hetis.cost import gpus_of, pipeline_step_s, stage_costs, stage_weight_bytes
from gpuplan.models.hetis.dispatch import proportional_split, water_filling
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.registry import Progress, no_progress, register_solver
from gpuplan.solvers.backends import Deadline

EXACT_MAX_DEVICES = 16
EXACT_MAX_HEADS = 64
SIMULATED_CANDIDATES = 3        # HexGen-style: candidates ranked by the dense proxy that are simulated
STAGE_A_SIMULATED = 3           # Stage A: the same top candidates by the proxy (plus the best per primary count)
SPLITWISE_SIMULATED = 12        # Splitwise-style: pool splits simulated (all of them up to this many)
MAX_STAGES = 12                 # pipeline stages of one replica in the extended space
KEEP_PER_CELL = 3               # best multisets kept per (groups used, primary GPUs) in the knapsack


# ---------------------------------------------------------------- Stage A pieces


def split_layers(problem: HetisProblem, groups: list[list[int]]) -> list[int] | None:
    """Return layers per stage for a pipeline over `groups` (in order): proportional to the stage's
    compute, capped by what its memory holds (weights within memory * (1 - reserve)), rest
    water-filled; None when the model does not fit."""
    cfg = problem.config
    L = cfg.num_layers
    S = len(groups)
    if S > L:
        return None
    g = {x.id: x for x in gpus_of(problem)}
    speed = np.array([min(g[d].peak_flops for d in ids) * len(ids) for ids in groups])
    caps = []
    for k, ids in enumerate(groups):
        room = min(g[d].memory_bytes for d in ids) * (1 - problem.memory_reserve_fraction) * 0.9  # KV keeps >= 10%
        fixed = stage_weight_bytes(cfg, problem.dtype, 0, len(ids), k == 0, k == S - 1)
        per = stage_weight_bytes(cfg, problem.dtype, 1, len(ids), False, False)
        caps.append(int(max(0, (room - fixed) // per)))
    caps = np.array(caps)
    if np.any(caps < 1) or caps.sum() < L:
        return None
    layers = np.minimum(np.maximum(1, np.floor(speed / speed.sum() * L)).astype(int), caps)
    while layers.sum() < L:  # give a layer to the stage with the lowest load per speed that has room
        load = np.where(layers < caps, (layers + 1) / speed, np.inf)
        layers[int(np.argmin(load))] += 1
    while layers.sum() > L:
        load = np.where(layers > 1, layers / speed, -np.inf)
        layers[int(np.argmax(load))] -= 1
    return layers.tolist()


def pipeline(problem: HetisProblem, groups: list[list[int]]) -> list[Stage] | None:
    """Return the stages of a pipeline over `groups` (fastest first), or None when it does not fit."""
    layers = split_layers(problem, groups)
    if layers is None:
        return None
    return [Stage(devices=list(ids), layers=n) for ids, n in zip(groups, layers)]


def dense_step(problem: HetisProblem, stages: list[Stage], tokens: float | None = None) -> float:
    """Return a pipeline's dense step (s) for `tokens` (default: the token budget) split over its pp
    virtual engines: max(sum of stage times, pp * slowest)."""
    n = problem.token_budget if tokens is None else tokens
    sc = stage_costs(problem, stages)
    return pipeline_step_s([c.time_s(n / len(sc)) for c in sc])


def dp_layout(problem: HetisProblem, blocks: list[list[list[int]]]) -> list[Replica] | None:
    """Return data-parallel replicas, one pipeline per block of node groups, with request shares in
    proportion to their dense throughput at the token budget; None when a block cannot hold the model."""
    reps = []
    for block in blocks:
        stages = pipeline(problem, block)
        if stages is None:
            return None
        reps.append((_replica_rate_proxy(problem, stages), stages))
    tot = sum(r for r, _ in reps)
    replicas = [Replica(stages=st, share=r / tot) for r, st in reps]
    _fix_shares(replicas)
    return replicas


def dp_dense_step(problem: HetisProblem, replicas: list[Replica]) -> float:
    """Return the dense step (s) of data-parallel replicas sharing a full token budget by their shares."""
    return max(dense_step(problem, r.stages, problem.token_budget * r.share) for r in replicas)


def configurations(problem: HetisProblem) -> list[tuple[float, list[Replica]]]:
    """Return the dense configurations Stage A (and the HexGen-style search) ranks, as (dense throughput
    proxy in tokens/s at the token budget, replicas), best proxy first: over the extended space (every
    symmetric TP assignment, every multiset of replica shapes; see layout_table), for every assignment
    and primary-GPU count the KEEP_PER_CELL best by the proxy. Groups left out stay attention workers
    (Hetis) or idle (HexGen-style). Deduplicated."""
    out: list[tuple[float, list[Replica]]] = []
    seen: set[str] = set()
    for kinds, shapes, table in _space(problem):
        by_gpus: dict[int, list[tuple[float, tuple[int, ...]]]] = {}
        for (_, gpus), entries in table.items():
            by_gpus.setdefault(gpus, []).extend(entries)
        for gpus in sorted(by_gpus):
            for _, mult in sorted(by_gpus[gpus], key=lambda e: -e[0])[:KEEP_PER_CELL]:
                reps = realise(problem, kinds, shapes, mult)
                if reps is None:
                    continue
                key = _layout_key(reps)
                if key not in seen:
                    seen.add(key)
                    out.append((sum(_replica_rate_proxy(problem, r.stages) for r in reps), reps))
    order = sorted(range(len(out)), key=lambda k: (-out[k][0], k))
    return [out[k] for k in order]


# ---------------------------------------------------------------- the extended layout space
#
# A server of n GPUs of one type may be split into n / t tensor-parallel groups of t GPUs, for every t
# that divides n (and the model's heads and KV heads). The choice is symmetric per server type (every
# server of a type uses the same t): a "tp assignment". Under one assignment, groups of the same kind
# (type, t) are interchangeable, so a replica is a *shape* (how many groups of each kind it pipelines,
# stages fastest first) and a configuration is a multiset of shapes whose groups fit in the cluster's
# (groups not used are idle, or attention workers under Hetis). The ranking proxy (dense tokens/s at the
# token budget) is additive over replicas, so the best configurations by the proxy, per primary-GPU
# count and per set of groups used, are found exactly by a knapsack over the vector of groups used
# (layout_table); the proxy of a shape is computed once on the first groups of each kind (stated
# approximation: a group's cost depends on its type, its t and its server's links, which are the same
# for every group of a kind; the link between stages is that of the first groups).


def server_types(problem: HetisProblem) -> dict[tuple[str, int], list[list[int]]]:
    """Return the servers grouped by server type (device type, GPUs of that type in the server): for each,
    the device ids of every server of that type, in cluster order."""
    per: dict[tuple[str, str], list[int]] = {}
    for d in problem.cluster.devices:
        per.setdefault((d.node, d.type), []).append(d.id)
    out: dict[tuple[str, int], list[list[int]]] = {}
    types = {d.id: d.type for d in problem.cluster.devices}
    for ids in per.values():
        out.setdefault((types[ids[0]], len(ids)), []).append(ids)
    return out


def tp_degrees(problem: HetisProblem, n: int) -> list[int]:
    """Return the TP degrees a server of n GPUs may be split into: t divides n and the model's heads and
    KV heads (the head-wise split of attention over a TP group must be even)."""
    cfg = problem.config
    return [t for t in range(1, n + 1) if n % t == 0 and cfg.kv % t == 0 and cfg.heads % t == 0]


def tp_assignments(problem: HetisProblem) -> list[dict[tuple[str, int], int]]:
    """Return every symmetric TP assignment: one TP degree per server type (see server_types)."""
    st = server_types(problem)
    keys = list(st)
    return [dict(zip(keys, ts)) for ts in itertools.product(*(tp_degrees(problem, k[1]) for k in keys))]


def kinds_of(problem: HetisProblem, assignment: dict[tuple[str, int], int]) -> list[list[list[int]]]:
    """Return, per group kind under `assignment`, its concrete device groups (each server of the type cut
    into consecutive groups of t GPUs), kinds fastest first (peak flop/s x t)."""
    g = {x.id: x for x in gpus_of(problem)}
    out = []
    for key, servers in server_types(problem).items():
        t = assignment[key]
        out.append([ids[k:k + t] for ids in servers for k in range(0, len(ids), t)])
    return sorted(out, key=lambda grp: (-g[grp[0][0]].peak_flops * len(grp[0]), grp[0][0]))


@dataclass
class Shape:
    """One replica under a TP assignment: groups of each kind (counts), its proxy tokens/s, its GPUs."""

    counts: tuple[int, ...]
    proxy: float
    gpus: int


def shapes_of(problem: HetisProblem, kinds: list[list[list[int]]]) -> list[Shape]:
    """Return every replica shape that holds the model (a pipeline over counts[k] groups of kind k, stages
    fastest first, layers by speed under memory), with its dense proxy (tokens/s at the token budget) on
    the first groups of each kind. At most MAX_STAGES stages."""
    out = []
    for counts in itertools.product(*(range(len(kd) + 1) for kd in kinds)):
        if not any(counts) or sum(counts) > MAX_STAGES:
            continue
        stages = pipeline(problem, [grp for kd, c in zip(kinds, counts) for grp in kd[:c]])
        if stages is not None:
            out.append(Shape(tuple(counts), _replica_rate_proxy(problem, stages),
                             sum(len(s.devices) for s in stages)))
    return out


def layout_table(shapes: list[Shape], limit: tuple[int, ...], keep: int
                 ) -> dict[tuple[tuple[int, ...], int], list[tuple[float, tuple[int, ...]]]]:
    """Return, for every vector of groups used (<= limit per kind) and primary-GPU count, the `keep`
    best multisets of shapes using exactly those groups, by total proxy (tokens/s): a bounded knapsack
    over the shapes (each multiset built once: shapes taken in list order), exact for the additive
    proxy. Entries are (proxy, multiplicity per shape)."""
    K = len(limit)
    table: dict[tuple[tuple[int, ...], int], list[tuple[float, tuple[int, ...]]]] = {
        ((0,) * K, 0): [(0.0, (0,) * len(shapes))]}
    for j, sh in enumerate(shapes):
        new = dict(table)
        for (used, gpus), entries in sorted(table.items()):
            for m in range(1, 1 + min((limit[k] - used[k]) // c for k, c in enumerate(sh.counts) if c)):
                key = (tuple(u + m * c for u, c in zip(used, sh.counts)), gpus + m * sh.gpus)
                add = [(p + m * sh.proxy, mult[:j] + (m,) + mult[j + 1:]) for p, mult in entries]
                new[key] = sorted(new.get(key, []) + add, key=lambda e: -e[0])[:keep]
        table = new
    table.pop(((0,) * K, 0))
    return table


def realise(problem: HetisProblem, kinds: list[list[list[int]]], shapes: list[Shape], mult: tuple[int, ...],
            phase: str = "both", start: tuple[int, ...] | None = None) -> list[Replica] | None:
    """Return the replicas of a multiset of shapes on concrete groups (each replica takes the next unused
    groups of each kind, from `start`), shares by dense throughput; None when a replica does not fit."""
    nxt = list(start) if start is not None else [0] * len(kinds)
    reps = []
    for sh, m in zip(shapes, mult):
        for _ in range(m):
            groups = []
            for k, c in enumerate(sh.counts):
                groups += kinds[k][nxt[k]:nxt[k] + c]
                nxt[k] += c
            stages = pipeline(problem, groups)
            if stages is None:
                return None
            reps.append((_replica_rate_proxy(problem, stages), stages))
    tot = sum(r for r, _ in reps)
    replicas = [Replica(stages=st, share=r / tot, phase=phase) for r, st in reps]  # type: ignore[arg-type]
    _fix_shares(replicas)
    return replicas


def _space(problem: HetisProblem) -> list[tuple[list[list[list[int]]], list[Shape], dict]]:
    """Return, per TP assignment, (kinds, shapes, layout_table) of the extended space (cached)."""
    key = problem.model_dump_json()
    if key not in _SPACE_CACHE:
        out = []
        for assignment in tp_assignments(problem):
            kinds = kinds_of(problem, assignment)
            shapes = shapes_of(problem, kinds)
            out.append((kinds, shapes, layout_table(shapes, tuple(len(kd) for kd in kinds), KEEP_PER_CELL)))
        if len(_SPACE_CACHE) >= 8:
            _SPACE_CACHE.pop(next(iter(_SPACE_CACHE)))
        _SPACE_CACHE[key] = out
    return _SPACE_CACHE[key]


_SPACE_CACHE: dict[str, list] = {}


def primaries_of(replicas: list[Replica]) -> int:
    """Return how many GPUs the replicas use as primaries (dense workers)."""
    return sum(len(s.devices) for r in replicas for s in r.stages)


def _proxy_picks(cands: list[tuple[float, list[Replica]]]) -> list[tuple[float, list[Replica]]]:
    """Return the candidates worth simulating: the STAGE_A_SIMULATED best by the dense proxy and, for every
    primary-GPU count, the best of that count by the proxy (cands best first)."""
    order = sorted(range(len(cands)), key=lambda k: (-cands[k][0], k))
    pick = order[:STAGE_A_SIMULATED]
    best_of: dict[int, int] = {}
    for k in order:
        best_of.setdefault(primaries_of(cands[k][1]), k)
    pick += [k for k in best_of.values() if k not in pick]
    return [cands[k] for k in pick]


def stage_a_candidates(problem: HetisProblem) -> list[tuple[float, list[Replica]]]:
    """Return the configurations Stage A simulates, as (dense proxy tokens/s, replicas): the
    STAGE_A_SIMULATED best by the dense proxy and, for every primary-GPU count, the best configuration of
    that count by the proxy, over the extended space (configurations). The HexGen-style search simulates
    the same candidates."""
    cands = configurations(problem)
    if not cands:
        raise InfeasibleError(_why_not(problem))
    return _proxy_picks(cands)


def hetis_layout_plan(problem: HetisProblem, replicas: list[Replica], dispatch: str = "water-filling") -> HetisPlan:
    """Return the Hetis layout over `replicas`: decode attention dispatched over every GPU with KV room
    (primaries and attention workers), re-dispatch when water-filled. No figures filled."""
    from gpuplan.models.hetis import capacity

    if dispatch == "tensor-parallel":  # the layout's static engine (Stage A: where pooling does not pay)
        return HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=[r.model_copy(deep=True) for r in replicas])
    plan = HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=[r.model_copy(deep=True) for r in replicas],
                     attention_devices=[d.id for d in problem.cluster.devices], dispatch=dispatch,
                     redispatch=dispatch == "water-filling")
    cap, _ = capacity(problem, plan)
    plan.attention_devices = [d for d in plan.attention_devices if cap.get(d, 0.0) > 0]
    return plan


@dataclass
class StageA:
    """What Stage A found: the chosen primary replicas, the candidate table (one row per candidate
    simulated), the chosen layout's rate_search (max rate, first failing rate; requests/s), how it
    serves decode attention ("water-filling" or "tensor-parallel") and whether every candidate was
    simulated (`complete`; else a deadline cut the list short and the choice is over those simulated)."""

    replicas: list[Replica]
    table: list[dict[str, Any]]
    searched: tuple[float, float]
    dispatch: str
    simulated: int
    candidates: int

    @property
    def complete(self) -> bool:
        """True when every candidate was simulated."""
        return self.simulated == self.candidates

    def cut_short(self) -> str:
        """Return what the deadline left in, for a time-limited plan's message."""
        return f"{self.simulated} of {self.candidates} Stage A candidates"


@dataclass
class _Rating:
    """One Stage A candidate rated: its rate_search (max rate, first failing rate; requests/s), dense proxy
    (tokens/s), replicas, how it serves decode attention, and whether its static engine was searched too
    (`full`; a rating without it is not kept for later searches)."""

    found: tuple[float, float]
    proxy: float
    replicas: list[Replica]
    dispatch: str
    full: bool


# per problem (but its threshold delta, which only picks among the ratings): Stage A's candidates and the
# ratings in full so far, in candidate order (a later call with more time resumes)
_STAGE_A_RATED: dict[str, tuple[list[tuple[float, list[Replica]]], list[_Rating]]] = {}


def stage_a_key(problem: HetisProblem) -> str:
    """Return the key of `problem`'s Stage A ratings: its document without delta (the threshold only picks
    among the ratings, so problems that differ in it share them)."""
    return problem.model_dump_json(exclude={"delta"})


def stage_a(problem: HetisProblem) -> tuple[list[Replica], list[dict[str, Any]]]:
    """Return (primary replicas, candidate table). Every candidate configuration (stage_a_candidates)
    gets Hetis' head-wise dispatch over all GPUs and is judged by the serving objective: the largest
    request rate (requests/s) whose P-percentile TTFT and TPOT meet the SLOs in the shared engine. The
    paper's threshold rule on that objective: the fewest primary GPUs whose max rate is within
    (1 + delta) of the best (a larger primary set is kept only when it gains more than delta). Raises
    InfeasibleError when no configuration holds the model."""
    found = stage_a_search(problem)
    return [r.model_copy(deep=True) for r in found.replicas], [dict(row) for row in found.table]


def stage_a_dispatch(problem: HetisProblem) -> str:
    """Return how Stage A's chosen layout serves decode attention: "water-filling" (head-wise dispatch over
    all GPUs) or "tensor-parallel" (its static engine, where head-wise dispatch served a lower max rate)."""
    return stage_a_search(problem).dispatch


def _rate_candidate(problem: HetisProblem, proxy: float, reps: list[Replica], deadline: Deadline) -> _Rating:
    """Return one Stage A candidate rated, searched with head-wise water-filling dispatch and with its
    static engine (static_search), the better kept (Hetis never serves less than the static layout it
    dispatches over); the static search only while `deadline` has not passed (else the candidate is
    rated by its water-filling search alone, not in full)."""
    found = rate_search(problem, hetis_layout_plan(problem, reps))
    if not deadline.allows(0.0):
        return _Rating(found, proxy, reps, "water-filling", False)
    static = deadline.attempt(static_search, problem, reps)
    if static is None:  # the solve's time limit: rated by its water-filling search alone
        return _Rating(found, proxy, reps, "water-filling", False)
    if static[0] > found[0]:  # pooling does not pay on this layout: keep its static engine
        return _Rating(static, proxy, reps, "tensor-parallel", True)
    return _Rating(found, proxy, reps, "water-filling", True)


def stage_a_search(problem: HetisProblem, deadline: Deadline | None = None) -> StageA:
    """Return Stage A's result (StageA) over the candidates (stage_a_candidates, in their order) rated
    until `deadline` (none: all): a candidate starts only when the longest so far still fits before it,
    and the first always runs to its end (a plan needs one); the solve's time limit stops a later one's
    simulations (gpuplan.sim.core.solve_clock: they keep room for the chosen plan's own). The ratings are
    kept per problem (the solvers that share Stage
    A, and a later call with more time, reuse them instead of repeating the simulations)."""
    key = stage_a_key(problem)
    if key not in _STAGE_A_RATED:
        if len(_STAGE_A_RATED) >= 8:
            _STAGE_A_RATED.pop(next(iter(_STAGE_A_RATED)))
        _STAGE_A_RATED[key] = (stage_a_candidates(problem), [])
    cands, kept = _STAGE_A_RATED[key]
    deadline = deadline or Deadline()
    rated = list(kept)
    for proxy, reps in deadline.paced(cands[len(kept):], first_free=not kept):
        # the first is rated in full whatever the limit (a plan needs one); the solve's time limit
        # stops a later one's simulations (SimulationCut, Deadline.attempt)
        rating = deadline.attempt(_rate_candidate, problem, proxy, reps, deadline) if rated else \
            _rate_candidate(problem, proxy, reps, deadline)
        if rating is None:
            break
        rated.append(rating)
        if rated[-1].full:
            kept.append(rated[-1])
    best = max(r.found[0] for r in rated)
    ok = [(primaries_of(r.replicas), -r.found[0], k) for k, r in enumerate(rated)
          if r.found[0] * (1 + problem.delta) >= best]
    _, _, pick = min(ok)
    types = {d.id: d.type for d in problem.cluster.devices}
    table = [{"primaries": " | ".join("+".join(f"{len(s.devices)}x{types[s.devices[0]]}" for s in rep.stages)
                                      for rep in r.replicas),
              "primary_gpus": primaries_of(r.replicas), "dense_proxy_tokens_per_s": r.proxy,
              "max_rate_per_s": r.found[0], "dispatch": r.dispatch,
              "vs_best": r.found[0] / best if best > 0 else 0.0, "chosen": k == pick}
             for k, r in enumerate(rated)]
    chosen = rated[pick]
    return StageA([r.model_copy(deep=True) for r in chosen.replicas], table, chosen.found, chosen.dispatch,
                  len(rated), len(cands))


_STATIC_CACHE: dict[tuple[str, str], tuple[float, float]] = {}


def static_search(problem: HetisProblem, replicas: list[Replica]) -> tuple[float, float]:
    """Return rate_search (max rate, first failing rate; requests/s) of the static engine on `replicas`
    (tensor-parallel KV, no head-wise dispatch), cached per problem and layout: the HexGen-style search
    simulates the same candidates, and Stage A compares each layout's dispatch with its static engine."""
    key = (problem.model_dump_json(), _layout_key(replicas))
    if key not in _STATIC_CACHE:
        if len(_STATIC_CACHE) >= 256:
            _STATIC_CACHE.pop(next(iter(_STATIC_CACHE)))
        _STATIC_CACHE[key] = rate_search(problem, HetisPlan(kind="hetis", status=Status.FEASIBLE,
                                                            replicas=[r.model_copy(deep=True) for r in replicas]))
    return _STATIC_CACHE[key]


def _why_not(problem: HetisProblem) -> str:
    cfg = problem.config
    total = cfg.total_params() * {"fp16": 2, "bf16": 2, "fp32": 4}[problem.dtype]
    room = sum(x.memory_bytes for x in gpus_of(problem)) * (1 - problem.memory_reserve_fraction)
    return (f"no set of node groups holds {cfg.name}'s {total / 1e9:.1f} GB of weights with room for KV "
            f"(the whole cluster has {room / 1e9:.1f} GB after the reserve)")


# ---------------------------------------------------------------- plans


def _head_map(problem: HetisProblem, plan: HetisPlan, method: str, seed: int, time_limit_s: float | None) -> HetisPlan:
    """Fill the snapshot head map by `method` (water-filling, lp, cp-sat, memory-proportional)."""
    inst = snapshot_instance(problem, plan)
    devs = sorted(plan.attention_devices)
    stats: dict[str, Any] = {}
    if method == "memory-proportional":
        vec = np.array([plan.static_heads.get(str(d), 0) for d in devs])
        n = np.tile(vec, (len(inst.ctx_tokens), 1))
    elif method == "lp":
        from gpuplan.solvers.hetis_dispatch import lp_dispatch

        started = time.perf_counter()
        n, bound = lp_dispatch(inst, time_limit_s=time_limit_s)
        stats = {"lp_bound_s": bound, "dispatch_s": time.perf_counter() - started}
    elif method == "cp-sat":
        from gpuplan.solvers.hetis_dispatch import cpsat_dispatch

        started = time.perf_counter()
        hint = water_filling(inst)
        n, status, bound = cpsat_dispatch(inst, time_limit_s=time_limit_s or 10.0, seed=seed, hint=hint)
        stats = {"cpsat_status": status.value, "cpsat_bound_s": bound, "dispatch_s": time.perf_counter() - started}
    else:
        started = time.perf_counter()
        n = water_filling(inst)
        stats = {"dispatch_s": time.perf_counter() - started}
        if n is None:
            raise InfeasibleError("the snapshot's requests do not fit the attention devices' KV memory")
    plan.snapshot_dispatch = method
    plan.head_map = [HeadAssignment(request=r, heads={str(d): int(c) for d, c in zip(devs, n[r]) if c})
                     for r in range(len(n))]
    plan.solver = SolverInfo(name="", stats=stats)
    return plan


def _hetis_layout(problem: HetisProblem, dispatch: str = "water-filling", deadline: Deadline | None = None
                  ) -> tuple[HetisPlan, StageA]:
    """Return (the layout plan over Stage A's primaries with `dispatch`, or Stage A's own where
    "water-filling" is asked for; Stage A's result), Stage A rated until `deadline` (stage_a_search)."""
    found = stage_a_search(problem, deadline)
    if dispatch == "water-filling":
        dispatch = found.dispatch
    plan = hetis_layout_plan(problem, found.replicas, dispatch)
    plan.stage_a = [dict(row) for row in found.table]
    return plan, found


HEAD_MAP_SHARE = 0.2  # of a time limit kept for the snapshot head map (LP or CP-SAT) after Stage A


def solve_hetis(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress = no_progress, snapshot: str = "water-filling") -> HetisPlan:
    """Return the Hetis plan: Stage A primaries, water-filling dispatch with re-dispatch; the snapshot
    head map by `snapshot` (water-filling, lp or cp-sat). Under `time_limit_s` Stage A rates its
    candidates until 1 - HEAD_MAP_SHARE of it (an LP or CP-SAT head map) or all of it, and the plan's
    status is time_limit when some were not simulated."""
    whole = Deadline.after(time_limit_s)
    deadline = Deadline.after(time_limit_s, 1.0 if snapshot == "water-filling" else 1.0 - HEAD_MAP_SHARE)
    progress(0.0, "Stage A")
    plan, found = _hetis_layout(problem, deadline=deadline)
    if plan.dispatch == "water-filling":  # a static engine (pooling did not pay) has no head map
        plan = _head_map(problem, plan, snapshot, seed, None if time_limit_s is None else max(0.1, whole.left_s()))
    stats = plan.solver.stats if plan.solver else {}
    stats = {**stats, "dispatch": plan.dispatch, "stage_a_simulated": found.simulated}
    progress(0.3, "simulating")
    # the same layout and dispatch Stage A searched (the head map does not enter the simulation)
    plan = finish_plan(problem, plan, found.searched)
    plan.solver = SolverInfo(name="hetis", stats=stats)
    return deadline.mark(plan, found.cut_short())


def solve_hetis_paper(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                      progress: Progress = no_progress) -> HetisPlan:
    """Return the Hetis plan with the snapshot's heads water-filled (the paper's dispatch; hetis-lp and
    exact place them by LP or CP-SAT)."""
    return solve_hetis(problem, time_limit_s=time_limit_s, seed=seed, progress=progress)


def solve_hetis_lp(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                   progress: Progress = no_progress) -> HetisPlan:
    """Return the Hetis plan with the snapshot's heads placed by LP relaxation + largest-remainder rounding."""
    return solve_hetis(problem, time_limit_s=time_limit_s, seed=seed, progress=progress, snapshot="lp")


def solve_exact(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress = no_progress) -> HetisPlan:
    """Return the Hetis plan with the snapshot's heads placed exactly by CP-SAT."""
    plan = solve_hetis(problem, time_limit_s=time_limit_s, seed=seed, progress=progress, snapshot="cp-sat")
    if plan.status is not Status.TIME_LIMIT and plan.solver and plan.solver.stats.get("cpsat_status") == "optimal":
        plan.status = Status.OPTIMAL
    return plan


def exact_applicable(problem: HetisProblem) -> str | None:
    """Return why CP-SAT dispatch does not apply (too many devices or heads), or None."""
    n = len(problem.cluster.devices)
    if n > EXACT_MAX_DEVICES or problem.config.kv > EXACT_MAX_HEADS or problem.head_map_requests > 16:
        return (f"exact dispatch is for at most {EXACT_MAX_DEVICES} GPUs, {EXACT_MAX_HEADS} KV heads and 16 "
                f"snapshot requests (this problem: {n} GPUs, {problem.config.kv} heads, "
                f"{problem.head_map_requests} requests)")
    return None


def solve_heads_by_memory(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                          progress: Progress = no_progress) -> HetisPlan:
    """Return the heads-proportional-to-memory baseline: Hetis' primaries, every request's heads split by
    one static vector proportional to each GPU's KV capacity, no re-dispatch."""
    from gpuplan.models.hetis import capacity

    # its own rate search follows Stage A's and costs about as much as one candidate's: half the limit each
    deadline = Deadline.after(time_limit_s, 0.5)
    plan, found = _hetis_layout(problem, "memory-proportional", deadline)
    cap, _ = capacity(problem, plan)
    devs = sorted(plan.attention_devices)
    vec = proportional_split(np.array([cap[d] for d in devs]), problem.config.kv)
    plan.static_heads = {str(d): int(v) for d, v in zip(devs, vec) if v}
    plan.attention_devices = [d for d in devs if str(d) in plan.static_heads]
    plan = _head_map(problem, plan, "memory-proportional", seed, time_limit_s)
    plan.stage_a = []
    return deadline.mark(finish_plan(problem, plan), found.cut_short())


def solve_uniform_tp(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                     progress: Progress = no_progress) -> HetisPlan:
    """Return uniform TP over all GPUs: TP inside each node (the largest head-dividing count), the layers
    split evenly over the nodes in order."""
    cfg = problem.config
    groups: dict[str, list[int]] = {}
    for d in problem.cluster.devices:
        groups.setdefault(d.node, []).append(d.id)
    stages_dev = []
    for ids in groups.values():
        tp = max(t for t in range(1, len(ids) + 1) if cfg.kv % t == 0 and cfg.heads % t == 0)
        stages_dev.append(ids[:tp])
    S = len(stages_dev)
    if S > cfg.num_layers:
        raise InfeasibleError(f"{S} nodes for {cfg.num_layers} layers: uniform pipeline stages need a layer each")
    base, rest = divmod(cfg.num_layers, S)
    stages = [Stage(devices=ids, layers=base + (1 if k >= S - rest else 0)) for k, ids in enumerate(stages_dev)]
    plan = HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=[Replica(stages=stages)])
    _refuse_overflow(problem, plan)
    return finish_plan(problem, plan)


def _refuse_overflow(problem: HetisProblem, plan: HetisPlan) -> None:
    from gpuplan.models.hetis import layout_violations

    bad = [v for v in layout_violations(problem, plan) if v.code == "memory"]
    if bad:
        raise InfeasibleError(bad[0].message)


def _replica_rate_proxy(problem: HetisProblem, stages: list[Stage]) -> float:
    """Return a replica's dense throughput (tokens/s) at the token budget: the ranking proxy."""
    return problem.token_budget / dense_step(problem, stages)


def _best_by_simulation(problem: HetisProblem, cands: list[tuple[float, HetisPlan]], progress: Progress,
                        limit: int = SIMULATED_CANDIDATES, deadline: Deadline | None = None) -> HetisPlan:
    """Return the plan of the candidate (proxy, plan) with the largest simulated max rate among the
    `limit` best by the proxy, simulated in that order until `deadline` (a candidate starts only when
    the longest so far still fits and the solve's time limit does not stop its simulations; the first
    always runs to its end; status time_limit when some were left out)."""
    if not cands:
        raise InfeasibleError(_why_not(problem))
    cands.sort(key=lambda c: -c[0])
    deadline = deadline or Deadline()
    best, best_found = None, (-1.0, 0.0)
    todo = cands[:limit]
    done = 0
    for k, (_, plan) in enumerate(deadline.paced(todo)):
        progress(k / limit, f"simulating candidate {k + 1}")
        search = static_search if plan.dispatch == "tensor-parallel" else rate_search
        arg = plan.replicas if plan.dispatch == "tensor-parallel" else plan
        # the first is rated in full whatever the limit (a plan needs one); the solve's time limit stops
        # a later one's simulations
        found = deadline.attempt(search, problem, arg) if best is not None else search(problem, arg)
        if found is None:
            break
        done += 1
        if found[0] > best_found[0]:
            best, best_found = plan, found
    assert best is not None
    return deadline.mark(finish_plan(problem, best, best_found), f"{done} of {len(todo)} candidates")


def hexgen_configurations(problem: HetisProblem) -> list[tuple[float, list[Replica]]]:
    """Return the HexGen-style search's configurations as (dense throughput proxy tokens/s, replicas), best
    proxy first: HexGen picks the TP degree per stage and may split a server, so its space is the extended
    one (configurations): data-parallel replicas, each an asymmetric pipeline of TP groups (stages fastest
    first, layers by speed under memory), shares by dense throughput; groups left out stay idle."""
    return configurations(problem)


def solve_hexgen(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                 progress: Progress = no_progress) -> HetisPlan:
    """Return the HexGen-style plan: data-parallel replicas, each an asymmetric pipeline over node groups
    (TP in a group, layers by speed under memory), shares by dense throughput; every grouping is
    enumerated over the extended space (TP per server type, see layout_table), ranked by the dense proxy;
    the best few and the best per primary-GPU count simulated (as Stage A's)."""
    deadline = Deadline.after(time_limit_s)   # the enumeration counts against the limit too
    cands = [(t, HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=reps))
             for t, reps in _proxy_picks(hexgen_configurations(problem))]
    return _best_by_simulation(problem, cands, progress, limit=len(cands), deadline=deadline)


def _fix_shares(replicas: list[Replica]) -> None:
    tot = sum(r.share for r in replicas)
    for r in replicas:
        r.share = r.share / tot
    replicas[-1].share = 1.0 - sum(r.share for r in replicas[:-1])


def _layout_key(replicas: list[Replica]) -> str:
    return repr(sorted([(r.phase, [(tuple(s.devices), s.layers) for s in r.stages]) for r in replicas]))


def _dedupe(cands: list[tuple[float, HetisPlan]]) -> list[tuple[float, HetisPlan]]:
    seen, out = set(), []
    for c in cands:
        key = _layout_key(c[1].replicas)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def splitwise_configurations(problem: HetisProblem) -> list[tuple[float, list[Replica]]]:
    """Return the Splitwise-style candidates as (proxy in requests/s, replicas), best first: for every
    symmetric TP assignment and every split of its groups between a prompt (prefill) pool and a token
    (decode) pool (q groups of each kind prompt, the rest decode; pools need not be whole servers), each
    pool's best multiset of replicas by dense throughput (layout_table); the proxy is the smaller of the
    request rates the pools' dense throughput sustains (prompt tokens/s / mean prompt, decode tokens/s /
    mean output). Deduplicated."""
    p, o, _ = problem.lengths()
    out: list[tuple[float, list[Replica]]] = []
    seen: set[str] = set()
    for kinds, shapes, table in _space(problem):
        limit = tuple(len(kd) for kd in kinds)
        best: dict[tuple[int, ...], tuple[float, tuple[int, ...]]] = {}
        for (used, _), entries in table.items():
            if used not in best or entries[0][0] > best[used][0]:
                best[used] = entries[0]
        vectors = list(itertools.product(*(range(n + 1) for n in limit)))
        within = {q: max((best[u] for u in best if all(a <= b for a, b in zip(u, q))), default=None,
                         key=lambda e: e[0]) for q in vectors}
        for q in vectors:
            rest = tuple(n - a for n, a in zip(limit, q))
            a, b = within[q], within[rest]
            if a is None or b is None:
                continue
            pre = realise(problem, kinds, shapes, a[1], "prefill")
            dec = realise(problem, kinds, shapes, b[1], "decode", start=q)
            if pre is None or dec is None:
                continue
            reps = pre + dec
            key = _layout_key(reps)
            if key in seen:
                continue
            seen.add(key)
            tok_pre = sum(_replica_rate_proxy(problem, r.stages) for r in pre)
            tok_dec = sum(_replica_rate_proxy(problem, r.stages) for r in dec)
            out.append((min(tok_pre / float(np.mean(p)), tok_dec / float(np.mean(o))), reps))
    order = sorted(range(len(out)), key=lambda k: (-out[k][0], k))
    return [out[k] for k in order]


def solve_splitwise(problem: HetisProblem, *, time_limit_s: float | None = None, seed: int = 0,
                    progress: Progress = no_progress) -> HetisPlan:
    """Return the Splitwise-style plan: TP groups split into a prompt (prefill) pool and a token (decode)
    pool, the prompt's KV shipped over the link between them (splitwise_configurations); the
    SPLITWISE_SIMULATED best by the pools' balance proxy are simulated and the one with the largest max
    rate under the SLOs wins."""
    deadline = Deadline.after(time_limit_s)   # the enumeration counts against the limit too
    cands = [(t, HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=reps))
             for t, reps in splitwise_configurations(problem)]
    return _best_by_simulation(problem, cands, progress, limit=SPLITWISE_SIMULATED, deadline=deadline)


register_solver("hetis", "hetis", solve_hetis_paper, role="paper", default=True,
                description="Stage A primaries (5% rule), head-wise water-filling dispatch over all GPUs, re-dispatch")
register_solver("hetis", "hetis-lp", solve_hetis_lp, role="variant",
                description="Hetis with the snapshot's heads placed by LP relaxation + largest-remainder rounding")
register_solver("hetis", "exact", solve_exact, role="exact", applicable=exact_applicable,
                description="Hetis with the snapshot's heads placed exactly by CP-SAT (small instances)")
register_solver("hetis", "uniform-tp", solve_uniform_tp, role="baseline",
                description="uniform TP over all GPUs (TP in a node, even layers per node): the smallest GPU bounds KV")
register_solver("hetis", "hexgen", solve_hexgen, role="baseline",
                description="HexGen-style static asymmetric TP/PP replicas over node groups, best simulated")
register_solver("hetis", "splitwise", solve_splitwise, role="baseline",
                description="Splitwise-style prefill pool / decode pool with KV transfer, best simulated")
register_solver("hetis", "heads-by-memory", solve_heads_by_memory, role="baseline",
                description="Hetis' primaries, every request's heads split in proportion to GPU KV capacity")
