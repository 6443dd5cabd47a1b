"""Poseidon's search and its references: stage-structure enumeration with proven lower-bound pruning
and ridge layer mapping; an exhaustive reference on the same space; Megatron-style, Metis-style and
classic 3D-parallel baselines. Every plan is scored by the same DAG model (gpuplan.models.poseidon).

Search space (shared by `poseidon` and `exhaustive`): every device type is either unused or split
into `k` equal stages of consecutive devices with one TP degree `t` per type (a power of two, at most
max_tp, TP groups inside one node); the types used are ordered in every permutation along the
pipeline; the number of micro-batches `m` is a divisor of the global batch (at most
max_microbatches) that every stage's data-parallel degree divides evenly; 1 <= stages <= max_stages.

Modules: this one (the search, the layer mapping, the exhaustive reference and the baselines),
bounds.py (the combo bounds listed before the search), config.py (the "config" name of fixed
configurations, evaluated by gpuplan.models.poseidon.config).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from gpuplan.errors import InfeasibleError, SolverError
from gpuplan.models.base import COUNT_LIMITS
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.models.poseidon import (CostModel, PoseidonPlan, PoseidonProblem, StageShape, auto_recompute,
                                     exchanges_s, in_flight, iteration_time_fast, make_plan, p2p_s,
                                     recompute_block_s, stage_memory, tp_fits)
from gpuplan.models.poseidon.cost import RECOMPUTE_MODES, blocking_exchanges
from gpuplan.option_rules import MAX_WORKERS, flag, integer, one_of
from gpuplan.registry import Progress, register_solver
from gpuplan.solvers.poseidon.bounds import SHAVE, ComboEntry, list_combos
from gpuplan.solvers.backends import small_lp

INF = math.inf


# ------------------------------------------------------------------------------------------------
# The space
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TypeOption:
    """One way to use a device type: `stages` equal stages of tp x dp devices each."""

    device_type: str
    stages: int
    tp: int
    dp: int
    shapes: tuple[StageShape, ...]


def type_options(problem: PoseidonProblem) -> dict[str, list[TypeOption]]:
    """Return, per device type, every (stages, tp) split of its devices allowed by the space."""
    cl = problem.cluster
    out: dict[str, list[TypeOption]] = {}
    for dtype in cl.capacity():
        devs = [d for d in cl.devices if d.type == dtype]
        node_counts = [sum(1 for d in devs if d.node == node) for node in {d.node for d in devs}]
        opts = []
        for k in range(1, len(devs) + 1):
            if len(devs) % k:
                continue
            n = len(devs) // k
            t = 1
            while t <= min(n, problem.max_tp):
                groups = [devs[i:i + t] for i in range(0, len(devs), t)]
                if n % t == 0 and all(len({d.node for d in g}) == 1 for g in groups) and not tp_fits(
                        problem, t, node_counts):
                    shapes = tuple(StageShape(dtype, t, n // t, tuple(d.id for d in devs[i * n:(i + 1) * n]),
                                              tuple(dict.fromkeys(d.node for d in devs[i * n:(i + 1) * n])))
                                   for i in range(k))
                    opts.append(TypeOption(dtype, k, t, n // t, shapes))
                t *= 2
        out[dtype] = opts
    return out


def interleaves(problem: PoseidonProblem, S: int, m: int) -> list[int]:
    """Return the interleave degrees v > 1 (model chunks per stage) the space allows for S stages and m
    micro-batches: Megatron's interleaved 1F1B needs at least 2 stages, m a multiple of S, and every
    stage's layer count divisible by v (so L too, with at least v layers per stage), v <= max_interleave."""
    L = problem.model.num_layers
    if problem.schedule != "1f1b" or S < 2 or m % S:
        return []
    return [v for v in range(2, problem.max_interleave + 1) if L % v == 0 and L // v >= S]


def microbatch_counts(problem: PoseidonProblem) -> list[int]:
    """Return the candidate numbers of micro-batches: divisors of the global batch, ascending."""
    G = problem.global_batch
    return [m for m in range(1, min(G, problem.max_microbatches) + 1) if G % m == 0]


@dataclass
class Stats:
    """Search counters: structures enumerated / pruned by a bound / evaluated / infeasible / left
    unvisited when the time limit cut the search short (structures = the four together), DAG
    evaluations, classic seed configurations evaluated, where the returned plan came from, and the
    `perf_counter` instant (seconds) the layer mapping stops at (`deadline`, inf: none)."""

    structures: int = 0
    pruned: int = 0
    evaluated: int = 0
    dag_evaluations: int = 0
    cuts_pruned: int = 0
    infeasible: int = 0
    unvisited: int = 0
    seeds: int = 0
    best_from: str = "search"
    deadline: float = field(default=INF, repr=False)

    def as_dict(self) -> dict[str, int | str]:
        """Return the counters as a plain mapping (plan.solver.stats), without the deadline."""
        return {k: v for k, v in self.__dict__.items() if k != "deadline"}

    def out_of_time(self) -> bool:
        """True when the deadline has passed."""
        return time.perf_counter() > self.deadline


# ------------------------------------------------------------------------------------------------
# Per-structure quantities and lower bounds
# ------------------------------------------------------------------------------------------------

def _stage_terms(cm: CostModel, sh: StageShape, b: int, first: bool, last: bool, flight: float, index: int,
                 S: int, m: int, v: int = 1
                 ) -> tuple[float, float, float, float, float, float, tuple[int, ...]]:
    """Return (f, g, ef, eg, a, a0, caps) of a stage (see Structure), cached on the cost model: caps[i]
    the most blocks that fit (a multiple of the interleave v) under the i-th recomputation mode the
    problem allows (auto: none, selective, full; what recomputation adds at each block count is
    `_recompute_extra`'s)."""
    key = (sh, b, first, last, flight, S == 1, v)
    cache = cm.__dict__.setdefault("_terms", {})
    if key not in cache:
        f, g = cm.stage_layer(sh, b)
        ef, eg = cm.stage_extras(sh, b, first, last)
        a0 = cm.tail_s(sh, 0, first, last, S)
        cap = cm.dev(sh.device_type).memory_bytes * cm.p.memory_fraction
        modes = RECOMPUTE_MODES if cm.p.recompute == "auto" else (cm.p.recompute,)
        caps = []
        for mode in modes:
            base = stage_memory(cm, sh, 0, b, index, S, m, mode, v)
            per = stage_memory(cm, sh, 1, b, index, S, m, mode, v) - base
            most = min(cm.p.model.num_layers, int((cap - base) // per)) if cap >= base + per else 0
            caps.append(most // v * v)
        slope = _min_slope(cm, sh, first, last, S, a0)
        cache[key] = (f, g, ef, eg, max(0.0, slope), a0, tuple(caps))
    return cache[key]


def _min_slope(cm: CostModel, sh: StageShape, first: bool, last: bool, S: int, a0: float) -> float:
    """Return the per-block all-reduce + optimizer coefficient a = min over n in 1..L of
    (tail(n) - tail(0)) / n, so n a + tail(0) <= tail(n) at every block count (collective times are
    piecewise in the message size: NCCL switches protocol), which keeps the bounds valid."""
    L = cm.p.model.num_layers
    cache = cm.__dict__.setdefault("_min_slope", {})
    key = _tail_layout(cm, sh, first, last, S)
    if key not in cache:
        cache[key] = min((cm.tail_s(sh, n, first, last, S) - a0) / n for n in range(1, L + 1))
    return cache[key]  # type: ignore[no-any-return]


def _tail_layout(cm: CostModel, sh: StageShape, first: bool, last: bool, S: int) -> tuple[Any, ...]:
    """Return a key that determines cm.tail_s(sh, n, first, last, S) at every n (and so `_min_slope`):
    the optimizer step reads the device type, tp and the stage's parameters (n, first, last, S == 1);
    the all-reduce (none when dp = 1) reads its data-parallel group only through the collective
    model's group shape (nodes spanned, ranks per node, links, NICs, device types: what
    `collective_time_s` reads without a calibration). Shapes of equal layout share it, whatever
    their device ids."""
    group = (None if sh.dp <= 1 else
             cm._coll.group_shape(cm.p.cluster, tuple(sh.gpu_ids[r * sh.tp] for r in range(sh.dp))))
    return (sh.device_type, sh.tp, sh.dp, group, first, last, S == 1)


def _tail_s(cm: CostModel, sh: StageShape, n: int, first: bool, last: bool, S: int) -> float:
    """Return cm.tail_s(sh, n, first, last, S) (seconds), cached on the cost model across structures
    (tail_s reads S only as S == 1); at most TAIL_CACHE entries, then the cache starts over."""
    cache = cm.__dict__.setdefault("_tail_s", {})
    key = (sh, n, first, last, S == 1)
    out = cache.get(key)
    if out is None:
        if len(cache) >= TAIL_CACHE:
            cache.clear()
        out = cache[key] = cm.tail_s(sh, n, first, last, S)
    return out  # type: ignore[no-any-return]


TAIL_CACHE = 1 << 20


def _recompute_extra(cm: CostModel, sh: StageShape, b: int, index: int, S: int, m: int, v: int, n: int,
                     none_cap: int) -> float:
    """Return the recomputation seconds one block's backward gains, on average, in stage `index` of `S`
    holding `n` blocks: `recompute_block_s` of the problem's mode, or under "auto" of `auto_recompute`'s
    choice (none up to `none_cap` blocks, the most that fit without recomputation), exactly as
    `stage_cost` computes it; cached on the cost model (at most TAIL_CACHE entries)."""
    want = cm.p.recompute
    if want != "auto":
        return recompute_block_s(cm, sh, b, want, n)
    if n <= none_cap:
        return 0.0
    cache = cm.__dict__.setdefault("_recompute_extra", {})
    key = (sh, b, index == 0, index == S - 1, in_flight(cm.p.schedule, index, S, m, v), S == 1, v, n)
    out = cache.get(key)
    if out is None:
        if len(cache) >= TAIL_CACHE:
            cache.clear()
        out = cache[key] = recompute_block_s(cm, sh, b, auto_recompute(cm, sh, n, b, index, S, m, v)[0], n)
    return out  # type: ignore[no-any-return]


def _p2p(cm: CostModel, a: StageShape, b: StageShape, micro_batch: int) -> float:
    """Return p2p_s(cm, a, b, micro_batch), cached on the cost model."""
    cache = cm.__dict__.setdefault("_p2p", {})
    key = (a, b, micro_batch)
    if key not in cache:
        cache[key] = p2p_s(cm, a, b, micro_batch)
    return cache[key]

# ------------------------------------------------------------------------------------------------

class Structure:
    """A candidate stage structure (shapes in pipeline order, m) with the per-layer coefficients
    its bounds and layer mapping use. Attributes are lists indexed by stage:

    c: forward+backward seconds of one block for one micro-batch (no recomputation);
    e: forward+backward seconds the embedding/head add; a: all-reduce + optimizer seconds per block;
    a0: all-reduce + optimizer seconds of the embedding/head parameters; nmax: most blocks that fit
    in memory (with recomputation); p2p: send seconds between stage s and s+1.

    `v` > 1 runs Megatron's interleaved 1F1B with v model chunks per stage (see `interleaves`): layer
    counts are multiples of v, memory holds the interleaved schedule's in-flight chunks, and the
    bounds follow the interleaved DAG's paths (docs/poseidon.md, "Interleaving").
    """

    def __init__(self, cm: CostModel, shapes: list[StageShape], m: int, v: int = 1,
                 terms: list[Any] | None = None, p2p: list[float] | None = None) -> None:
        """`terms` (each stage's `_stage_terms`) and `p2p` (the sends between consecutive stages,
        seconds) may be passed in when the caller has them cached; they are computed otherwise."""
        self.cm, self.shapes, self.m, self.v = cm, shapes, m, v
        S, G = len(shapes), cm.p.global_batch
        self.S = S
        self.b = [G // (m * sh.dp) for sh in shapes]
        if terms is None:
            terms = [_stage_terms(cm, sh, self.b[s], s == 0, s == S - 1, in_flight(cm.p.schedule, s, S, m, v), s,
                                  S, m, v) for s, sh in enumerate(shapes)]
        self.f, self.g, self.ef, self.eg, self.a, self.a0, self.caps = (list(x) for x in zip(*terms))
        self.nmax = [max(c) for c in self.caps]
        tied = self._tied = cm.tied_s(shapes)
        self._tails: dict[tuple[int, int], float] = {}
        if tied:
            for s in {0, S - 1}:
                self.a0[s] += tied
        self.c = [f + g for f, g in zip(self.f, self.g)]
        self.e = [f + g for f, g in zip(self.ef, self.eg)]
        self.p2p = p2p if p2p is not None else [_p2p(cm, shapes[s], shapes[s + 1], self.b[s]) for s in range(S - 1)]
        # sends between virtual stages k and k + 1 (k = chunk * S + stage); = p2p when v = 1
        self.vp2p = self.p2p if v == 1 else [_p2p(cm, shapes[k % S], shapes[(k + 1) % S], self.b[k % S])
                                             for k in range(S * v - 1)]
        # blocking exchanges (`exchanges_s`: send + TP all-gather), folded into the sending ops by
        # `_time` when the problem says Megatron's exchanges block (as `evaluate` does)
        self.block = cm.p.blocking_p2p
        self._xch: list[float] | None = None  # built on the first DAG walk (most structures are pruned before)
        self._vxch: list[float] | None = None
        self._rt_cache: list[tuple[list[float], float]] | None = None
        self._extra_at: list[list[float | None]] | None = None
        self._balanced: tuple[float, list[int]] | None = None

    @property
    def xch(self) -> list[float]:
        """Seconds of each blocking exchange between stages s and s + 1 (`exchanges_s`; = p2p when
        the exchanges do not block), built on first use."""
        if self._xch is None:
            self._xch = exchanges_s(self.cm, self.shapes, self.b, self.p2p) if self.block else self.p2p
        return self._xch

    @property
    def vxch(self) -> list[float]:
        """Seconds of each blocking exchange between virtual stages k and k + 1 (= xch when v = 1)."""
        if self._vxch is None:
            self._vxch = (self.xch if self.v == 1 or not self.block
                          else exchanges_s(self.cm, self.shapes, self.b, self.vp2p))
        return self._vxch

    @property
    def _rt(self) -> list[tuple[list[float], float]]:
        """The round trips (`round_trip`), built on first use (most structures are pruned before)."""
        if self._rt_cache is None:
            self._rt_cache = self.round_trip()
        return self._rt_cache

    @property
    def _rtx(self) -> list[tuple[list[float], float]]:
        """The round trips with the blocking exchanges in their ops (`round_trip(exchanges=True)`; the
        same as `_rt` when the exchanges do not block), built on first use."""
        if getattr(self, "_rtx_cache", None) is None:
            self._rtx_cache = self.round_trip(exchanges=True) if self.block else self._rt
        return self._rtx_cache

    def exchange_terms(self) -> tuple[list[float], list[float], list[float]]:
        """Return per stage (chain, fwd_min, bwd) seconds of blocking exchanges (`vxch`) held by its
        ops, all zero when the exchanges do not block: chain = what one micro-batch's forwards and
        backwards over all v chunks hold (each forward of virtual stage k < V-1 holds exchange k,
        each backward of k > 0 exchange k-1, as `blocking_exchanges` folds them), fwd_min = the
        least one chunk forward holds, bwd = what one micro-batch's chunk backwards hold. Cached."""
        if getattr(self, "_xterms", None) is None:
            S, v = self.S, self.v
            V = S * v
            if not self.block or V == 1:
                self._xterms = ([0.0] * S, [0.0] * S, [0.0] * S)
            elif v == 1:  # stage q's forward holds exchange q, its backward exchange q - 1
                vx = self.vxch
                fwd1, bwd1 = vx + [0.0], [0.0] + vx
                self._xterms = ([f + b for f, b in zip(fwd1, bwd1)], fwd1, bwd1)
            else:
                vx = self.vxch
                fwd = [[vx[c * S + q] if c * S + q < V - 1 else 0.0 for c in range(v)] for q in range(S)]
                bwd = [sum(vx[c * S + q - 1] for c in range(v) if c * S + q > 0) for q in range(S)]
                self._xterms = ([sum(f) + b for f, b in zip(fwd, bwd)], [min(f) for f in fwd], bwd)
        return self._xterms

    def _fill_drain_sends(self) -> float:
        """Return the send (or blocking exchange) seconds on bound (2)'s path: micro-batch 0 forward
        through the first chunks of stages 0..S-2, the last stage's chain, micro-batch m-1 backward
        down to stage 0 (2 sum p2p without blocking; with it, the exchanges those ops hold)."""
        if not self.block or self.S == 1:
            return 2 * sum(self.p2p)
        vx, S = self.vxch, self.S
        return sum(vx[:S - 1]) + self.m * self.exchange_terms()[0][S - 1] + sum(vx[:S - 2])

    def _hourglass_sends(self) -> list[float]:
        """Return per stage q in 1..S-2 the send (or blocking exchange) seconds on the hourglass path
        through q (v = 1, see `dense_paths`): micro-batch 0 forward to q, q's chain, micro-batch m-1
        back to stage 0."""
        S = self.S
        if not self.block:
            before = [0.0] + list(itertools.accumulate(self.p2p))  # before[q] = sum(p2p[:q])
            return [2 * before[q] for q in range(1, S - 1)]
        x, chain = self.xch, self.exchange_terms()[0]
        before = [0.0] + list(itertools.accumulate(x))
        return [before[q] + self.m * chain[q] + before[max(0, q - 1)] for q in range(1, S - 1)]

    def tail(self, s: int, n: int) -> float:
        """Return stage s's exact all-reduce + optimizer seconds with n blocks (the tied-embedding
        gradient all-reduce included on the first and last stage), cached (`_tail_s`)."""
        key = (s, n)
        if key not in self._tails:
            sh = self.shapes[s]
            self._tails[key] = (_tail_s(self.cm, sh, n, s == 0, s == self.S - 1, self.S)
                                + (self._tied if s in (0, self.S - 1) else 0.0))
        return self._tails[key]

    def feasible(self) -> bool:
        """True when the stages can hold all layers in memory, one or more each."""
        L, v = self.cm.p.model.num_layers, self.v
        return min(self.nmax) >= v and sum(self.nmax) >= L and self.S * v <= L and L % v == 0

    def minmax_partition(self, weight: list[float], const: list[float]) -> tuple[float, list[int]]:
        """Return (W, layers): W the smallest max_s(n_s weight_s + const_s) over integer counts
        v <= n_s <= nmax_s (multiples of the interleave v) summing to L, shaved by 1e-9 relative (a
        lower bound), and counts that reach it: the most layers each stage holds within W, the
        surplus trimmed from the stages with the most time first, keeping every count >= v.

        W is exact: the greedy that gives the next v layers to the stage whose time grows the least
        reaches the min-max, since every stage's time is increasing in its count."""
        import heapq

        L, S, v = self.cm.p.model.num_layers, self.S, self.v
        n = [v] * S
        heap = [((v + v) * weight[s] + const[s], s) for s in range(S) if v + v <= self.nmax[s]]
        heapq.heapify(heap)
        W = max(v * weight[s] + const[s] for s in range(S))
        for _ in range((L - S * v) // v):
            if not heap:  # the caps cannot hold L layers
                return INF, list(self.nmax)
            t, s = heapq.heappop(heap)
            n[s] += v
            W = max(W, t)
            if n[s] + v <= self.nmax[s]:
                heapq.heappush(heap, ((n[s] + v) * weight[s] + const[s], s))
        n = [min(self.nmax[s], int(math.floor((W - const[s]) / weight[s] + 1e-9)) // v * v) if weight[s] > 0
             else self.nmax[s] for s in range(S)]
        n = [max(x, v) for x in n]
        # trim the surplus from the stages with the most slack, keeping every count >= v
        extra = sum(n) - L
        for s in sorted(range(S), key=lambda s: n[s] * weight[s] + const[s], reverse=True):
            take = min(extra, n[s] - v)
            n[s] -= take
            extra -= take
        return W * (1 - 1e-9), n

    def balanced(self) -> tuple[float, list[int]]:
        """Return `minmax_partition` of each stage's m micro-batches plus its all-reduce (bound (1) of
        `lower_bound`: seconds, and the time-balanced layer counts `quick_map` starts from), cached."""
        if self._balanced is None:
            m = self.m
            self._balanced = self.minmax_partition([m * c + a for c, a in zip(self.c, self.a)],
                                                   [m * e + a0 for e, a0 in zip(self.e, self.a0)])
        return self._balanced[0], list(self._balanced[1])

    def round_trip(self, exchanges: bool = False) -> list[tuple[list[float], float]]:
        """Return, per stage q, (coef, const) of the round-trip path bound T >= sum_s coef[s] n_s + const:
        micro-batch 0 forward through every stage and backward down to stage q, then the rest of q's
        chain (k_F forwards and m-1 backwards), then q's all-reduce + optimizer (see docs).

        With interleave v: micro-batch 0 forward through every virtual stage, backward down to stage
        q's last chunk (1/v of each later stage's blocks), then q's other chunk-ops: k_F chunk
        forwards (1/v of its blocks each; the warm-up is 2 (S-1-q) + (v-1) S) and every backward.

        With `exchanges` (blocking exchanges, `exchange_terms`) the ops on the path hold their
        exchanges instead of the sends: micro-batch 0's forwards every forward exchange, the
        backwards down to q's last chunk theirs, q's k_F chunk forwards at least fwd_min each and its
        m micro-batches' backwards bwd each."""
        S, m, v = self.S, self.m, self.v
        f, g, ef, eg = self.f, self.g, self.ef, self.eg
        kf = self._kf()
        self._own = own = [k * f[q] + m * g[q] + self.a[q] for q, k in enumerate(kf)]
        later = [x + y / v for x, y in zip(f, g)]  # a stage after q: its forward and 1/v of its backward
        eg_after = _suffix_sums(eg)[1:]  # sum(eg[q + 1:])
        if exchanges:
            _, fmin, bwd = self.exchange_terms()
            vx = self.vxch
            tail, total = _suffix_sums(vx), sum(vx)
            sends = [total + tail[min((v - 1) * S + q, len(vx))] + kf[q] * v * fmin[q] + m * bwd[q]
                     for q in range(S)]
        else:
            fwd_p2p, tail = sum(self.vp2p), _suffix_sums(self.p2p)
            sends = [fwd_p2p + tail[q] for q in range(S)]
        base = sum(ef)
        return [(f[:q] + [f[q] + own[q]] + later[q + 1:],
                 base + eg_after[q] + (kf[q] * ef[q] if v == 1 else 0.0) + m * eg[q] + self.a0[q] + sends[q])
                for q in range(S)]

    def _kf(self) -> list[float]:
        """Return per stage q the forwards (chunk forwards / v with interleave v) q runs after
        micro-batch 0's backward reaches it: the k_F of `round_trip`."""
        S, m, v = self.S, self.m, self.v
        if v > 1:
            return [max(0, m * v - (m * v if m == S else min(m * v, 2 * (S - 1 - q) + (v - 1) * S)) - 1) / v
                    for q in range(S)]
        if self.cm.p.schedule == "gpipe":
            return [0.0] * S
        return [float(max(0, m - min(S - 1 - q, m) - 1)) for q in range(S)]

    def _min_linear(self, coef: list[float], const: float) -> float:
        """Return min over counts v <= n_s <= nmax_s (multiples of v) summing to L of sum_s coef_s n_s + const."""
        v = self.v
        spare = self.cm.p.model.num_layers - self.S * v
        total = const + v * sum(coef)
        for s in sorted(range(self.S), key=lambda s: coef[s]):
            k = min(spare, self.nmax[s] - v)
            total += k * coef[s]
            spare -= k
        return total

    def lower_bound(self, cutoff: float = INF) -> float:
        """Return a lower bound (seconds) on the iteration time of every layer mapping of this structure.

        Paths of the DAG that exist whatever the cuts are (see docs/poseidon.md), each a lower bound
        on the longest path, minimised over the cuts:
        (1) stage q's whole chain of m forwards and backwards, then its all-reduce + optimizer:
            T >= m*(n_q c_q + e_q + x_q) + n_q a_q + a0_q for every q (x_q the blocking exchanges its
            ops hold per micro-batch, `exchange_terms`; 0 when they do not block); min over cuts of
            the max, exactly;
        (2) micro-batch 0 forward through stages 0..S-2, the last stage's whole chain, micro-batch m-1
            backward down to stage 0 (with interleave v: through their first chunks, 1/v of the blocks);
            with v = 1 then stage 0's all-reduce + optimizer (the last op on stage 0 is that backward);
            the sends, or with blocking exchanges the exchanges its ops hold (`_fill_drain_sends`);
        (3) the round trips of `round_trip` (with the blocking exchanges), combined with weights pi
            (uniform, and 1/own weight):
            T >= sum_q pi_q RT_q(n) for every cut, and the weighted sum is minimised exactly.
        With a finite `cutoff` it returns as soon as one bound reaches it (still a lower bound).
        """
        m = self.m
        last = self.S - 1
        per = [self.c[s] / self.v if s < last else m * self.c[s] for s in range(self.S)]
        base = sum(self.e[s] for s in range(last)) + m * self.e[last] + self._fill_drain_sends()
        if self.v == 1:  # then stage 0's all-reduce + optimizer (the hourglass (4) at q = last)
            per[0] += self.a[0]
            base += self.a0[0]
        w2 = self._min_linear(per, base)
        if w2 >= cutoff:  # the caller prunes at `cutoff`: the rest cannot change that
            return w2
        if cutoff < INF:
            # bound (1) as a test: its exact min-max (`balanced`, a heap greedy) only matters when it
            # reaches the cutoff, and then the cutoff itself is a lower bound; otherwise w2 stands in
            if self.w1_exceeds(cutoff):
                return cutoff
            w1 = w2
        else:
            chain = self.exchange_terms()[0]
            w1, _ = self.minmax_partition([m * c + a for c, a in zip(self.c, self.a)],
                                          [m * (e + x) + a0 for e, x, a0 in zip(self.e, chain, self.a0)])
        rt = self._rtx
        best = max(w1, w2)
        for pi in ([1.0] * self.S, [1.0 / coef[q] for q, (coef, _) in enumerate(rt)]):
            tot = sum(pi)
            coef = [sum(pi[q] * rt[q][0][s] for q in range(self.S)) / tot for s in range(self.S)]
            const = sum(pi[q] * rt[q][1] for q in range(self.S)) / tot
            best = max(best, self._min_linear(coef, const))
        return best

    def w1_exceeds(self, cutoff: float) -> bool:
        """True when bound (1) is above `cutoff` seconds: within the cutoff (raised by 1e-9 relative,
        so a tie never counts) stage q can run at most hi_q blocks (a multiple of v, capped by its
        memory), and the hi_q sum below L or one is below v. Exact for the integer min-max: when the
        caps hold L layers, a mapping with every stage's chain within the cutoff exists."""
        T = cutoff * (1 + 1e-9)
        if T == INF:
            return False
        hi = self.stage_caps(T)
        return min(hi) < self.v or sum(hi) < self.cm.p.model.num_layers

    def stage_caps(self, T: float) -> list[int]:
        """Return per stage the most blocks (a multiple of v, within its memory cap) whose chain of
        bound (1) (blocking exchanges included) fits within T seconds; below v when not even v fit."""
        m, v = self.m, self.v
        chain = self.exchange_terms()[0]
        hi = []
        for s in range(self.S):
            w = m * self.c[s] + self.a[s]
            room = T - m * (self.e[s] + chain[s]) - self.a0[s]
            k = self.nmax[s] if w <= 0 else min(self.nmax[s], int(math.floor(room / w)) if room >= 0 else -1)
            hi.append(k // v * v)
        return hi

    def dense_paths(self) -> list[tuple[list[float], float]]:
        """Return the path bounds that involve several stages as (coef, const), T >= sum_s coef_s n_s +
        const for every layer mapping n (seconds): every round trip (`round_trip`), the fill-and-drain
        path (2) (with v = 1 then stage 0's all-reduce + optimizer) and, with v = 1, every hourglass
        through an inner stage q (see `lp_bound`), each with the blocking exchanges its ops hold when
        the exchanges block. Cached; every coefficient is >= 0."""
        coef, const, _, _ = self._dense_arrays()
        return list(zip(coef.tolist(), const.tolist()))

    def _path_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Return `dense_paths` as arrays: coefficients (R x S) and constants (R), seconds."""
        S, m, v, last = self.S, self.m, self.v, self.S - 1
        rows = list(self._rtx)
        c = self.c
        e_before = [0.0, *itertools.accumulate(self.e)]  # e_before[q] = sum(e[:q])
        if v == 1:  # the hourglass through each inner stage q
            for q, sends in zip(range(1, last), self._hourglass_sends()):
                row = c[:q] + [m * c[q]] + [0.0] * (S - q - 1)
                row[0] += self.a[0]
                rows.append((row, e_before[q] + m * self.e[q] + sends + self.a0[0]))
        per = [x / v for x in c[:last]] + [m * c[last]]
        base = e_before[last] + m * self.e[last] + self._fill_drain_sends()
        if v == 1:  # then stage 0's all-reduce + optimizer (the hourglass at q = last)
            per[0] += self.a[0]
            base += self.a0[0]
        rows.append((per, base))
        return np.array([r for r, _ in rows]), np.array([k for _, k in rows])

    def _dense_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return `dense_paths` as arrays (coefficients R x S, constants R) and the same rows with
        their uniform and 1/largest-coefficient weighted means appended (R + 2 rows); cached."""
        if getattr(self, "_dense_np", None) is None:
            coef, const = self._path_rows()
            means, consts = [coef], [const]
            for pi in (np.ones(len(const)), 1.0 / np.maximum(coef.max(axis=1), 1e-300)):
                means.append((pi @ coef / pi.sum())[None, :])
                consts.append(np.array([pi @ const / pi.sum()]))
            self._dense_np = (coef, const, np.vstack(means), np.concatenate(consts))
        return self._dense_np

    def cannot_beat(self, cutoff: float, rounds: int = 3) -> bool:
        """True when no integer layer mapping of this structure can run faster than `cutoff` seconds
        (then it may be pruned); False when that is not proven.

        A mapping n faster than the cutoff has every path bound below it (each bound is at most the
        iteration time). Bound (1) gives each stage at most hi_q blocks; then, for a few rounds, the
        sum sum_s n_s = L narrows each count from both sides, and each multi-stage path (`dense_paths`,
        coefficients >= 0) caps each count given the others at their least: n_s <= lo_s +
        (cutoff - path(lo)) / coef_s. Counts are multiples of v, so every cap is rounded down to one
        and every floor up. An empty range proves it; else each multi-stage path, and their uniform
        and 1/largest-coefficient weighted means, minimised over the narrowed ranges under the sum,
        must stay below the cutoff. The integer ranges make this stronger than `lp_bound` on most
        structures. The cutoff is raised by 1e-9 relative for float rounding (never prunes a tie)."""
        S, v = self.S, self.v
        L = self.cm.p.model.num_layers
        T = cutoff * (1 + 1e-9)
        if T == INF:
            return False
        hi = self.stage_caps(T)
        lo = [v] * S
        if min(hi) < v or sum(hi) < L:
            return True
        coef, const, means, mean_consts = self._dense_arrays()
        for _ in range(rounds):
            changed = _narrow_by_sum(lo, hi, L, v)
            if changed is None:
                return True
            # every path caps each count given the others at their least (coef >= 0; base <= T below)
            lo_a = np.array(lo, dtype=float)
            base = const + coef @ lo_a
            if (base > T).any():
                return True
            with np.errstate(divide="ignore", invalid="ignore"):
                caps = lo_a + np.floor(np.floor((T - base)[:, None] / coef + 1e-9) / v) * v
            caps = np.where(coef > 0, caps, INF).min(axis=0)
            for s in range(S):
                if caps[s] < hi[s]:
                    hi[s], changed = int(caps[s]), True
            if sum(hi) < L:
                return True
            if not changed:
                break
        return bool((_min_in_ranges_rows(means, mean_consts, lo, hi, L) > T).any())

    def lp_bound(self) -> float:
        """Return the tightest of the path bounds together: min over REAL layer counts in [1, nmax_s]
        summing to L of the max of bound (1) for every q, bound (2), every round trip and, with v = 1,
        (4) every hourglass: micro-batch 0 forward through stages 0..q-1, stage q's whole chain,
        micro-batch m-1 backward down to stage 0, then stage 0's all-reduce + optimizer (an LP,
        HiGHS). A relaxation of the minimum over integer cuts of the same maximum, hence a lower
        bound on the iteration time of every cut set; shaved by 1e-7 for the solver's tolerance."""
        return self.lp_solution()[0]

    def lp_solution(self) -> tuple[float, list[float]]:
        """Return (`lp_bound`, the real layer counts that reach it; [] when the LP fails); cached."""
        if getattr(self, "_lp", None) is None:
            self._lp = self._solve_lp()
        return self._lp

    def _solve_lp(self) -> tuple[float, list[float]]:
        S, m, last = self.S, self.m, self.S - 1
        rows, rhs = [], []
        for q in range(S):
            row = np.zeros(S + 1)
            row[q], row[S] = m * self.c[q] + self.a[q], -1.0
            rows.append(row)
            rhs.append(-(m * self.e[q] + self.a0[q]))
        for coef, const in self._rt:
            rows.append(np.append(np.asarray(coef), -1.0))
            rhs.append(-const)
        rows.append(np.append(np.asarray([self.c[s] / self.v if s < last else m * self.c[s] for s in range(S)]), -1.0))
        rhs.append(-(sum(self.e[:last]) + m * self.e[last] + 2 * sum(self.p2p)))
        if self.v == 1:  # (4) the hourglass through stage q's chain, then stage 0's all-reduce
            for q in range(1, S):
                row = np.zeros(S + 1)
                row[:q] = self.c[:q]
                row[q], row[S] = m * self.c[q], -1.0
                row[0] += self.a[0]
                rows.append(row)
                rhs.append(-(sum(self.e[:q]) + m * self.e[q] + 2 * sum(self.p2p[:q]) + self.a0[0]))
        cost = np.zeros(S + 1)
        cost[S] = 1.0
        res = small_lp(cost, rows, rhs, [[1.0] * S + [0.0]], [float(self.cm.p.model.num_layers)],
                       [self.v] * S + [0.0], list(self.nmax) + [INF])
        return (res[0] * (1 - 1e-7), res[1][:S]) if res is not None else (0.0, [])

    def cut_bound(self, layers: list[int]) -> float:
        """Return the path bounds (1), (2) and every round trip for one layer mapping (seconds;
        cheaper than the DAG walk)."""
        m, last, v = self.m, self.S - 1, self.v
        E = [n * c + e for n, c, e in zip(layers, self.c, self.e)]
        b1 = max(m * E[s] + layers[s] * self.a[s] + self.a0[s] for s in range(self.S))
        b2 = sum(n * c / v + e for n, c, e in zip(layers[:last], self.c, self.e)) + 2 * sum(self.p2p) + m * E[last]
        # round trips in O(S): sum_s f_s n_s + sum_{s>q} g_s n_s + own_q n_q + const_q
        rt = self._rt  # builds _own too
        own = self._own
        fsum = sum(f * n for f, n in zip(self.f, layers))
        gsuf, b3 = 0.0, 0.0
        for q in range(last, -1, -1):
            b3 = max(b3, fsum + gsuf + own[q] * layers[q] + rt[q][1])
            gsuf += self.g[q] * layers[q] / v
        return max(b1, b2, b3)

    def cut_bounds(self, rows: list[list[int]]) -> list[float]:
        """Return `cut_bound` (seconds) of every layer mapping in `rows`, equal to the last bit: the
        same float operations in the same order, one stage at a time across all rows (numpy)."""
        if len(rows) < CUT_BATCH_MIN:
            return [self.cut_bound(n) for n in (rows.tolist() if hasattr(rows, "tolist") else rows)]

        m, last, v, S = self.m, self.S - 1, self.v, self.S
        rt = self._rt
        own = self._own
        N = np.asarray(rows, dtype=np.int64)
        cols = [N[:, s] for s in range(S)]
        E = [cols[s] * self.c[s] + self.e[s] for s in range(S)]
        b1 = m * E[0] + cols[0] * self.a[0] + self.a0[0]
        for s in range(1, S):
            b1 = np.maximum(b1, m * E[s] + cols[s] * self.a[s] + self.a0[s])
        b2 = np.zeros(len(rows))
        for s in range(last):
            b2 = b2 + (cols[s] * self.c[s] / v + self.e[s])
        b2 = b2 + 2 * sum(self.p2p) + m * E[last]
        fsum = np.zeros(len(rows))
        for s in range(S):
            fsum = fsum + self.f[s] * cols[s]
        gsuf = np.zeros(len(rows))
        b3 = np.zeros(len(rows))
        for q in range(last, -1, -1):
            b3 = np.maximum(b3, fsum + gsuf + own[q] * cols[q] + rt[q][1])
            gsuf = gsuf + self.g[q] * cols[q] / v
        return np.maximum(np.maximum(b1, b2), b3).tolist()  # type: ignore[no-any-return]

    def time(self, layers: list[int]) -> float:
        """Return the DAG iteration time (seconds) of a layer mapping; inf when it does not fit.

        The same figure as gpuplan.models.poseidon.evaluate, from the cached per-layer terms: a
        stage recomputes exactly when its layers exceed what fits without recomputation. With
        interleave v each chunk runs 1/v of the stage's blocks; the embedding sits on the first
        virtual stage, the head on the last (gpuplan.models.poseidon.chunk_lists).
        """
        key = tuple(layers)
        memo = self.__dict__.setdefault("_times", {})
        if key not in memo:  # the descent revisits mappings
            memo[key] = self._time(layers)
        return memo[key]  # type: ignore[no-any-return]

    def fits(self, layers: list[int]) -> bool:
        """True when the layer mapping fits: every stage holds v blocks or more, a multiple of v, within
        its memory cap (`time` is finite exactly then)."""
        v = self.v
        return not any(n < v or n > k or n % v for n, k in zip(layers, self.nmax))

    def _time(self, layers: list[int]) -> float:
        if not self.fits(layers):
            return INF
        v = self.v
        fwd = [n * f for n, f in zip(layers, self.f)]
        if self._extra_at is None:  # per stage and block count: the recomputation seconds per block
            self._extra_at = [[None] * (nmax + 1) for nmax in self.nmax]
        bwd = []
        for s, (n, g, row) in enumerate(zip(layers, self.g, self._extra_at)):
            x = row[n]
            if x is None:
                none_cap = self.caps[s][0] if self.cm.p.recompute == "auto" else -1
                x = row[n] = _recompute_extra(self.cm, self.shapes[s], self.b[s], s, self.S, self.m, v, n, none_cap)
            bwd.append(n * (g + x))
        tail = [self.tail(s, n) for s, n in enumerate(layers)]
        if self.cm.p.overlap_dp_allreduce:  # as stage_cost: what outlasts the last backward (one chunk's)
            tail = [t + self.cm.dp_overlap_extra_s(sh, n, s == 0, s == self.S - 1, self.S, (x + e) / v)
                    for s, (t, sh, n, x, e) in enumerate(zip(tail, self.shapes, layers, bwd, self.eg))]
        if v == 1:
            fwd = [x + e for x, e in zip(fwd, self.ef)]
            bwd = [x + e for x, e in zip(bwd, self.eg)]
            sends = self.p2p
            if self.block:
                fwd, bwd, sends = blocking_exchanges(fwd, bwd, self.xch)
            return iteration_time_fast(fwd, bwd, sends, tail, self.m, self.cm.p.schedule)
        S = self.S
        vf = [fwd[k % S] / v for k in range(S * v)]
        vb = [bwd[k % S] / v for k in range(S * v)]
        vf[0] += self.ef[0]
        vb[0] += self.eg[0]
        vf[-1] += self.ef[-1]
        vb[-1] += self.eg[-1]
        sends = self.vp2p
        if self.block:
            vf, vb, sends = blocking_exchanges(vf, vb, self.vxch)
        return iteration_time_fast(vf, vb, sends, tail, self.m, self.cm.p.schedule, None, v)


# ------------------------------------------------------------------------------------------------
# Layer mapping
# ------------------------------------------------------------------------------------------------

def _suffix_sums(x: list[float]) -> list[float]:
    """Return [sum(x[k:]) for k in range(len(x) + 1)] (the last is 0), in O(len(x))."""
    out = [0.0] * (len(x) + 1)
    for k in range(len(x) - 1, -1, -1):
        out[k] = out[k + 1] + x[k]
    return out


def _narrow_by_sum(lo: list[int], hi: list[int], total: int, v: int) -> bool | None:
    """Narrow in place each count's range lo_s <= n_s <= hi_s (multiples of v) by sum_s n_s = total
    (each at least total minus the others' hi, at most total minus the others' lo); return None when
    a range empties (no counts fit), else whether a range changed."""
    changed = False
    total_hi, total_lo = sum(hi), sum(lo)
    for s in range(len(lo)):
        floor_s = max(lo[s], -(-(total - (total_hi - hi[s])) // v) * v)
        cap_s = min(hi[s], (total - (total_lo - lo[s])) // v * v)
        if floor_s > cap_s:
            return None
        if floor_s != lo[s] or cap_s != hi[s]:
            total_hi += cap_s - hi[s]
            total_lo += floor_s - lo[s]
            lo[s], hi[s], changed = floor_s, cap_s, True
    return changed


def _suffix_mins(x: list[float]) -> list[float]:
    """Return out[i] = min(x[i:]) for i in 0..len(x), out[len(x)] = inf (the units of x)."""
    out = [INF] * (len(x) + 1)
    for i in range(len(x) - 1, -1, -1):
        out[i] = min(x[i], out[i + 1])
    return out


def _min_in_ranges(coef: list[float], const: float, lo: list[int], hi: list[int], total: int) -> float:
    """Return min over real counts lo_s <= n_s <= hi_s summing to `total` of sum_s coef_s n_s + const
    (greedy: the spare goes to the cheapest stages first; exact), inf when no counts fit."""
    spare = total - sum(lo)
    if spare < 0 or sum(hi) < total:
        return INF
    out = const + sum(c * x for c, x in zip(coef, lo))
    for s in sorted(range(len(coef)), key=lambda s: coef[s]):
        k = min(spare, hi[s] - lo[s])
        out += k * coef[s]
        spare -= k
    return out


def _min_in_ranges_rows(coef: np.ndarray, const: np.ndarray, lo: list[int], hi: list[int], total: int
                        ) -> np.ndarray:
    """Return `_min_in_ranges` of every row of `coef` (R x S) with constants `const` (R) at once
    (seconds per row; inf for every row when no counts fit)."""
    lo_a, room = np.array(lo, dtype=float), np.array(hi, dtype=float) - np.array(lo, dtype=float)
    spare = total - sum(lo)
    if spare < 0 or sum(hi) < total:
        return np.full(len(const), INF)
    order = np.argsort(coef, axis=1, kind="stable")
    room_sorted = room[order]
    before = np.cumsum(room_sorted, axis=1) - room_sorted
    take = np.clip(spare - before, 0.0, room_sorted)
    return const + coef @ lo_a + (np.take_along_axis(coef, order, axis=1) * take).sum(axis=1)


def _round_counts(x: list[float], cap: list[int], total: int) -> list[int] | None:
    """Return integer counts in [1, cap_s] summing to `total` closest to the real counts x (floors,
    then one more to the largest remainders with room); None when x is empty or they cannot sum."""
    if not x:
        return None
    n = [min(k, max(1, math.floor(v + 1e-9))) for v, k in zip(x, cap)]
    order = sorted(range(len(x)), key=lambda s: n[s] - x[s])
    while sum(n) > total and any(v > 1 for v in n):
        s = max((s for s in order if n[s] > 1), key=lambda s: n[s] - x[s])
        n[s] -= 1
    for s in itertools.cycle(order):
        if sum(n) >= total or all(v >= k for v, k in zip(n, cap)):
            break
        if n[s] < cap[s]:
            n[s] += 1
    return n if sum(n) == total else None


CUT_BATCH_MIN = 12  # from this many mappings on, `Structure.cut_bounds` runs column-wise in numpy


def _descend(st: Structure, cur: list[int], stats: Stats) -> tuple[float, list[int]]:
    """Return (time, layers) where steepest descent from `cur` stops. Neighbourhoods, each tried
    when the one before has no improving move (after a step, from the first again): one layer
    across one boundary (steepest step); one layer between any two stages; two of those single
    moves at once, paired from the 2S single moves with the lowest path bounds
    (`Structure.cut_bound`), of which the 2S with the lowest bounds are walked. In the two wide
    ones, moves are tried in order of their path bound and the first that improves is taken. A move
    whose path bound already reaches the best time so far is skipped without walking the DAG (it
    cannot improve). Moves are integer arrays (`_move_deltas`) and their bounds are computed
    together (`Structure.cut_bounds`, equal to `cut_bound` to the last bit)."""
    S, v = st.S, st.v

    adjacent, singles = _move_deltas(S)
    cap = np.asarray(st.nmax)
    cur_t = st.time(cur)
    stats.dag_evaluations += 1
    level = 0
    while True:
        here = np.asarray(cur)
        if level < 2:
            deltas = adjacent if level == 0 else singles
        else:  # pairs of the most promising single moves
            moved = here + v * singles
            moved[~((moved >= v) & (moved <= cap)).all(axis=1)] = cap
            keys = np.asarray(st.cut_bounds(moved))
            ranked = np.argsort(keys, kind="stable")[:2 * S]
            pairs = [(x, y) for i, x in enumerate(ranked) for y in ranked[i:]
                     if _SINGLE[S][x][0] != _SINGLE[S][y][1] and _SINGLE[S][x][1] != _SINGLE[S][y][0]]
            deltas = (singles[[x for x, _ in pairs]] + singles[[y for _, y in pairs]] if pairs
                      else np.zeros((0, S), dtype=np.int64))
        rows = here + v * deltas
        rows = rows[((rows >= v) & (rows <= cap)).all(axis=1)]
        bounds = np.asarray(st.cut_bounds(rows))
        order = np.argsort(bounds, kind="stable")
        step_t, step = cur_t, None
        if level == 2:  # a budget of 2S DAG walks, the pairs with the lowest bounds first
            stats.cuts_pruned += max(0, len(order) - 2 * S)
            order = order[:2 * S]
        for k, o in enumerate(order.tolist()):
            if bounds[o] >= step_t:  # every later move's bound is larger still
                stats.cuts_pruned += len(order) - k
                break
            if stats.out_of_time():  # anytime: the best mapping walked so far
                return (step_t, step) if step is not None else (cur_t, cur)
            n = rows[o].tolist()
            t = st.time(n)
            stats.dag_evaluations += 1
            if t < step_t - 1e-12 * step_t:
                step_t, step = t, n
                if level:  # first improvement in the wide neighbourhoods
                    stats.cuts_pruned += len(order) - k - 1
                    break
        if step is not None:
            cur_t, cur, level = step_t, step, 0
            if stats.out_of_time():
                return cur_t, cur
        elif level < 2 and S > 2:
            level += 1
        else:
            return cur_t, cur


_SINGLE: dict[int, list[tuple[int, int]]] = {}  # per stage count: the single moves (from, to), in order


def _move_deltas(S: int) -> tuple[Any, Any]:
    """Return (adjacent, singles): integer arrays (moves x S) of the layer-count changes of moving one
    unit across one boundary ((i, i+1) for every i, then (i+1, i)) and between any two stages
    ((a, b), a != b, in order), as `_descend` tries them; cached per S."""

    if S not in _MOVES:
        adj = [(i, i + 1) for i in range(S - 1)] + [(i + 1, i) for i in range(S - 1)]
        single = [(a, b) for a in range(S) for b in range(S) if a != b]

        def matrix(moves: list[tuple[int, int]]) -> Any:
            d = np.zeros((len(moves), S), dtype=np.int64)
            for r, (a, b) in enumerate(moves):
                d[r, a] -= 1
                d[r, b] += 1
            return d

        _SINGLE[S] = single
        _MOVES[S] = (matrix(adj), matrix(single))
    return _MOVES[S]


_MOVES: dict[int, tuple[Any, Any]] = {}


def ridge_map(st: Structure, stats: Stats) -> tuple[float, list[int]]:
    """Return (iteration time, layers per stage) found by walking the ridge of the time surface.

    It starts from the fastest of three splits: the time-balanced one (integer min-max of each
    stage's m micro-batches plus its all-reduce, under the memory caps), the rounded minimiser of
    the LP over all path bounds (`Structure.lp_solution`, which weighs the pipeline fill and drain
    that dominate at few micro-batches) and the even split (`quick_map`), then follows `_descend`.
    Nothing depends on the incumbent, so the mapping of a structure is the same whether or not the
    search prunes.
    """
    L = st.cm.p.model.num_layers
    t, start = quick_map(st, stats)
    if stats.out_of_time():
        return t, start
    v = st.v
    lp = _round_counts([x / v for x in st.lp_solution()[1]], [k // v for k in st.nmax], L // v)
    lp = None if lp is None else [x * v for x in lp]
    if lp is not None and lp != start:
        stats.dag_evaluations += 2
        start = min((start, lp), key=st.time)
    return _descend(st, start, stats)


def quick_map(st: Structure, stats: Stats) -> tuple[float, list[int]]:
    """Return (iteration time, layers) of the faster of the time-balanced split (see `ridge_map`)
    and the even split (`uniform_layers`): two DAG walks, the search's first look at a structure."""
    _, balanced = st.balanced()
    even = [st.v * n for n in uniform_layers(st.cm.p.model.num_layers // st.v, st.S)]
    stats.dag_evaluations += 2
    return min(((st.time(n), n) for n in (balanced, even)), key=lambda x: x[0])


def all_cuts_map(st: Structure, stats: Stats) -> tuple[float, list[int]]:
    """Return (iteration time, layers per stage): the best of EVERY contiguous layer mapping."""
    L = st.cm.p.model.num_layers
    best_t, best_n = INF, list(st.nmax)
    for cuts in itertools.combinations(range(1, L), st.S - 1):
        bounds = (0,) + cuts + (L,)
        n = [bounds[i + 1] - bounds[i] for i in range(st.S)]
        if any(x % st.v for x in n):
            continue
        t = st.time(n)
        stats.dag_evaluations += 1
        if t < best_t:
            best_t, best_n = t, n
    return best_t, best_n


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------

Combo = tuple[int, tuple[TypeOption, ...]]


def combos(problem: PoseidonProblem, num_stages: int | None = None,
           opts: dict[str, list[TypeOption]] | None = None) -> Iterator[Combo]:
    """Yield every (m, options of the types used) of the space, before the types are ordered
    (only those with exactly `num_stages` stages when given), from `opts` (type_options) when given.

    One solve passes the same `opts` everywhere: cost caches key options by id()."""
    opts = type_options(problem) if opts is None else opts
    limit = min(problem.max_stages, problem.model.num_layers)
    for m in microbatch_counts(problem):
        for combo in itertools.product(*[[None] + o for o in opts.values()]):
            used = tuple(o for o in combo if o is not None)
            S = sum(o.stages for o in used)
            if used and S <= limit and (num_stages is None or S == num_stages) and not any(
                    problem.global_batch % (m * o.dp) for o in used):
                yield m, used


def structures(problem: PoseidonProblem, cm: CostModel, combo: Combo | None = None,
               interleaved: bool = False) -> Iterator[Structure]:
    """Yield every stage structure of the space (or of one combo): each combo in every type order;
    with `interleaved`, each order also at every interleave `interleaves` allows (after v = 1)."""
    for m, used in ([combo] if combo else combos(problem)):
        S = sum(o.stages for o in used)
        vs = [1] + (interleaves(problem, S, m) if interleaved else [])
        for order in itertools.permutations(used):
            shapes = [sh for o in order for sh in o.shapes]
            for v in vs:
                yield Structure(cm, shapes, m, v)


def _structure_at(problem: PoseidonProblem, cm: CostModel, combo: Combo, index: int) -> Structure:
    """Return the `index`-th structure `structures(problem, cm, combo, interleaved=True)` yields,
    without building the ones before it."""
    m, used = combo
    vs = [1] + interleaves(problem, sum(o.stages for o in used), m)
    order = next(itertools.islice(itertools.permutations(used), index // len(vs), None))
    return Structure(cm, [sh for o in order for sh in o.shapes], m, vs[index % len(vs)])


def combo_size(problem: PoseidonProblem, combo: Combo) -> int:
    """Return the number of structures of a combo: type orders x (1 + its interleave degrees)."""
    m, used = combo
    return math.factorial(len(used)) * (1 + len(interleaves(problem, sum(o.stages for o in used), m)))


def count_structures(problem: PoseidonProblem) -> int:
    """Return the number of stage structures in the space, interleaved ones included (without
    building them)."""
    return sum(combo_size(problem, c) for c in combos(problem))


def _option_terms(cm: CostModel, o: TypeOption, m: int) -> tuple[float, int, float, float, float]:
    """Return (w, cap, f, g, a) of every stage of option `o` at m micro-batches: the per-layer weight
    w = m (f + g) + a (a the smallest per-layer all-reduce + optimizer time over its stages) and the
    most layers a stage of it can hold at ANY pipeline position (one micro-batch in flight, no
    embedding or head), cached."""
    cache = cm.__dict__.setdefault("_option_terms", {})
    key = (id(o), m)
    if key not in cache:
        b = cm.p.global_batch // (m * o.dp)
        f, g = cm.layer(o.device_type, o.tp, b)
        a = min(_min_slope(cm, x, False, False, 3, cm.tail_s(x, 0, False, False, 3)) for x in o.shapes)
        cap_bytes = cm.dev(o.device_type).memory_bytes * cm.p.memory_fraction
        sh = o.shapes[0]
        thrifty = "full" if cm.p.recompute == "auto" else cm.p.recompute  # the mode that needs least memory
        base = stage_memory(cm, sh, 0, b, 1, 3, 1, thrifty)
        per = stage_memory(cm, sh, 1, b, 1, 3, 1, thrifty) - base
        cap = min(cm.p.model.num_layers, int((cap_bytes - base) // per)) if cap_bytes >= base + per else 0
        cache[key] = (m * (f + g) + max(0.0, a), cap, f, g, max(0.0, a))
    return cache[key]


def combo_bound(cm: CostModel, combo: Combo) -> float:
    """Return a lower bound (seconds) on every structure of a combo, whatever the type order and cuts.

    Relaxes bound (1) of Structure.lower_bound: per-layer weight w_q = m c_q + a_q, no embedding
    or head terms, layer counts real in [0, cap_q] with cap_q the most layers stage q could hold at
    any position: the smallest W with sum_q min(cap_q, W / w_q) >= L (inf when sum cap_q < L).
    """
    m, used = combo
    L = cm.p.model.num_layers
    terms = [(_option_terms(cm, o, m), o.stages) for o in used]
    stages = [(t[0], t[1], k) for t, k in terms]
    if sum(cap * k for _, cap, k in stages) < L or min(cap for _, cap, _ in stages) < 1:
        return INF
    # water-filling: raise W through the breakpoints cap_q * w_q, stages saturating in order
    rest, rate = float(L), sum(k / w for w, _, k in stages)
    w1 = INF
    for w, cap, k in sorted(stages, key=lambda x: x[0] * x[1]):
        if rest / rate <= cap * w or rest <= k * cap:
            w1 = min(rest / rate, cap * w)
            break
        rest -= k * cap
        rate -= k / w
    # the uniform-weight round-trip bound with position-dependent terms at their smallest: k_F / v
    # chunk forwards of 1/v of the blocks after the first backward (v = 1: at least m - S; v > 1:
    # at least (m v - (v + 1) S + 1) / v, the warm-up being at most 2 (S - 1) + (v - 1) S)
    S = sum(k for _, k in terms)
    kf = min([max(0, m - S)] + [max(0, m * v - (v + 1) * S + 1) / v for v in interleaves(cm.p, S, m)])
    per = sorted((f + (kf * f + m * g + a) / S, cap, k) for (_, cap, f, g, a), k in terms)
    rest2, w2 = L, 0.0
    for coef, cap, k in per:
        take = min(rest2, cap * k)
        w2 += take * coef
        rest2 -= take
    return max(w1, w2)


def _finish(problem: PoseidonProblem, best: tuple[float, Structure | None, list[int]], stats: Stats,
            name: str, status: Status = Status.OPTIMAL) -> PoseidonPlan:
    t, st, layers = best
    if st is None or t == INF:
        raise InfeasibleError(_why_infeasible(problem))
    plan = make_plan(problem, st.shapes, layers, st.m, status=status, interleave=st.v)
    plan.solver = SolverInfo(name=name, stats=stats.as_dict())
    if status is Status.TIME_LIMIT:
        plan.message = _time_limit_message(stats, name)
    return plan


def _time_limit_message(stats: Stats, name: str) -> str:
    """Return the message of a plan cut by the time limit: what the search covered, what it left, and
    that the plan is not proven optimal."""
    if name == "metis":
        return (f"time limit: the Metis-style search stopped after {stats.structures} type orders "
                f"({stats.evaluated} fitting configurations scored); the plan is the best of those, not proven "
                f"the best of the Metis space; raise --time-limit to search the rest")
    if stats.structures == 0 and stats.unvisited == 0:
        searched = (f"the search stopped while listing the stage structures, so none was searched beyond the "
                    f"{stats.seeds} classic seed configurations")
    else:
        searched = (f"the search stopped after {stats.structures} stage structures: {stats.evaluated} mapped, "
                    f"{stats.pruned} pruned by the lower bound, {stats.infeasible} infeasible, "
                    f"{stats.unvisited} left unvisited (and {stats.seeds} classic seed configurations)")
    return (f"time limit: {searched}; the plan (from {stats.best_from}) is the best found, not proven "
            f"optimal; raise --time-limit to search the rest")


def _check_depth(problem: PoseidonProblem, num_stages: int | None, opts: dict[str, list[TypeOption]]) -> None:
    """Raise InfeasibleError naming the option when no split of the devices has `num_stages` stages (the
    space holds none, whatever the memory); return None otherwise (or when num_stages is None)."""
    if num_stages is None or next(combos(problem, num_stages, opts), None) is not None:
        return
    depths = sorted({sum(o.stages for o in used) for _, used in combos(problem, None, opts)})
    shown = ", ".join(map(str, depths[:12])) + (", ..." if len(depths) > 12 else "")
    devices, layers = len(problem.cluster.devices), problem.model.num_layers
    bound = min(devices, problem.max_stages, layers)
    why = (f"{devices} devices" if bound == devices else f"max_stages {problem.max_stages}"
           if bound == problem.max_stages else f"{layers} layers")
    raise InfeasibleError(
        f"option 'num_stages': got {num_stages}; expected a pipeline depth this problem allows "
        f"({shown or 'none'}): a stage needs at least one device and one layer, so at most {bound} stages "
        f"({why}), and each device type's devices split evenly into its stages")


def _smallest_microbatch(problem: PoseidonProblem) -> int:
    """Return the smallest per-replica micro-batch (sequences) the space allows: G / (m dp) over the
    micro-batch counts m (divisors of G up to max_microbatches) and the data-parallel degrees."""
    G = problem.global_batch
    dps = {o.dp for os in type_options(problem).values() for o in os} or {1}
    return min(G // (m * dp) for m in microbatch_counts(problem) for dp in dps if G % (m * dp) == 0)


def _why_infeasible(problem: PoseidonProblem) -> str:
    b = _smallest_microbatch(problem)
    cm = CostModel(problem)
    states = problem.model.layer_params() * problem.model.num_layers * cm.param_bytes(1)
    room = sum(problem.cluster.type_of(d.type).memory_bytes for d in problem.cluster.devices) * problem.memory_fraction
    if b > 1 and states < room:  # the micro-batch space, not the model's size, is what no stage can hold
        G, M = problem.global_batch, problem.max_microbatches
        counts = microbatch_counts(problem)
        return (f"no plan of the search space fits because of the micro-batch space: global_batch {G} splits "
                f"into micro-batch counts {counts[:8]}{' ...' if len(counts) > 8 else ''} (the divisors of {G} "
                f"up to max_microbatches {M}), so every stage holds micro-batches of at least {b} sequences "
                f"({b} x {problem.seq_len} tokens of activations per in-flight micro-batch); use a global batch "
                f"with more divisors or raise max_microbatches (to {G} for micro-batches of one sequence)")
    cfg = problem.model
    per_layer = cfg.layer_params() * cm.param_bytes(1)
    best_cap = max(problem.cluster.type_of(t).memory_bytes for t in problem.cluster.capacity()) * problem.memory_fraction
    total_devices = len(problem.cluster.devices)
    return (f"no plan of the search space fits: {cfg.num_layers} layers of {cfg.layer_params() / 1e6:.1f} M parameters "
            f"need {per_layer * cfg.num_layers / 2**30:.1f} GiB of weights, gradients and optimizer states in all "
            f"({per_layer / 2**30:.2f} GiB per layer before tensor parallelism), plus activations of "
            f"{cfg.layer_activation_bytes(1, problem.seq_len) / 2**30:.2f} GiB per layer per sample; the {total_devices} "
            f"devices offer at most {best_cap / 2**30:.1f} GiB each (max_stages {problem.max_stages}, "
            f"max_tp {problem.max_tp})")


# ------------------------------------------------------------------------------------------------
# Classic configurations: the seeds of the search and the Megatron-style baseline
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Classic:
    """A classic configuration of the space: `options` (one per type used, in pipeline order) at
    `m` micro-batches, layers split as evenly as possible; `label` names its family."""

    label: str
    m: int
    options: tuple[TypeOption, ...]

    @property
    def stages(self) -> int:
        """Number of pipeline stages."""
        return sum(o.stages for o in self.options)


def _with_microbatches(problem: PoseidonProblem, label: str, used: tuple[TypeOption, ...]) -> list[Classic]:
    """Return `used` at every micro-batch count whose per-replica micro-batch is whole, within the
    space's stage limit ([] beyond it)."""
    if sum(o.stages for o in used) > min(problem.model.num_layers, problem.max_stages):
        return []
    G = problem.global_batch
    return [Classic(label, m, used) for m in microbatch_counts(problem) if not any(G % (m * o.dp) for o in used)]


def grid_configs(problem: PoseidonProblem, opts: dict[str, list[TypeOption]] | None = None) -> list[Classic]:
    """Return the classic 3D grids: each device type alone as TP x PP x DP (every (stages, tp) split
    of its devices, TP groups inside a node) at every micro-batch count that divides the batch."""
    opts = type_options(problem) if opts is None else opts
    return [c for os in opts.values() for o in os for c in _with_microbatches(problem, "3d-grid", (o,))]


def megatron_configs(problem: PoseidonProblem, opts: dict[str, list[TypeOption]] | None = None) -> list[Classic]:
    """Return the Megatron-style configurations: every type split into stages of the SAME size and
    TP, the types in cluster order, at every micro-batch count that divides the batch."""
    opts = type_options(problem) if opts is None else opts
    out: list[Classic] = []
    for n in sorted({o.tp * o.dp for os in opts.values() for o in os}):
        for t in sorted({o.tp for os in opts.values() for o in os}):
            chosen = [next((o for o in os if o.tp * o.dp == n and o.tp == t), None) for os in opts.values()]
            if all(o is not None for o in chosen):
                out += _with_microbatches(problem, "megatron", tuple(o for o in chosen if o is not None))
    return out


def classic_layers(L: int, S: int, v: int = 1) -> list[int]:
    """Return the even split of L layers over S stages in multiples of the interleave v."""
    return [v * n for n in uniform_layers(L // v, S)]


def classic_bound(cm: CostModel, c: Classic, v: int = 1) -> float:
    """Return a lower bound (seconds) on the DAG time of config `c` at interleave `v` with layers
    split evenly (`classic_layers`), from the per-block compute times alone (no all-reduce,
    embedding, head, sends or recomputation, so no collective model is consulted): the busiest
    stage's m forwards and backwards, and micro-batch 0's forward and backward through every
    stage (1/v of the blocks with interleave v: its first chunks) plus the last stage's other m-1."""
    L, G = cm.p.model.num_layers, cm.p.global_batch
    per = [sum(cm.layer(o.device_type, o.tp, G // (c.m * o.dp))) for o in c.options for _ in range(o.stages)]
    n = classic_layers(L, len(per), v)
    busy = c.m * max(k * x for k, x in zip(n, per))
    return max(busy, sum(k * x for k, x in zip(n, per)) / v + (c.m - 1) * n[-1] * per[-1])


def best_classic(cm: CostModel, configs: list[Classic],
                 best: tuple[float, Structure | None, list[int]] = (INF, None, []), interleaved: bool = False,
                 ) -> tuple[tuple[float, Structure | None, list[int]], str, int]:
    """Return ((seconds, structure, layers) of the fastest config with layers split evenly, or `best`
    when none is faster; its label ("" when `best` stands); the number of DAG walks. With
    `interleaved`, every config is also tried at each interleave `interleaves` allows.

    Configs are visited in order of `classic_bound` and those whose bound, or whose path bound for
    the even split (`Structure.cut_bound`), reaches the best time are skipped without a DAG walk:
    both are lower bounds on that time, so the result equals walking every config. (The cheap
    bound keeps the collective model, which `combo_bound` needs for every stage, off the configs
    that are skipped: at 3,000 GPUs that is most of the cost.)"""
    L = cm.p.model.num_layers
    label, walks = "", 0
    tries = [(i, v) for i, c in enumerate(configs)
             for v in [1] + (interleaves(cm.p, c.stages, c.m) if interleaved else [])]
    for lb, i, v in sorted((classic_bound(cm, configs[i], v), i, v) for i, v in tries):
        if lb >= best[0]:
            break
        c = configs[i]
        st = Structure(cm, [sh for o in c.options for sh in o.shapes], c.m, v)
        layers = classic_layers(L, st.S, v)
        if st.cut_bound(layers) >= best[0]:
            continue
        t = st.time(layers)
        walks += 1
        if t < best[0]:
            best, label = (t, st, layers), c.label
    return best, label, walks


def _seed(problem: PoseidonProblem, cm: CostModel, stats: Stats, num_stages: int | None,
          opts: dict[str, list[TypeOption]]) -> tuple[float, Structure | None, list[int]]:
    """Return the best classic baseline (seconds, structure, layers) in the space (with exactly
    `num_stages` stages when given): the classic 3D grids and Megatron-style mixes, always to the end
    (a few hundred configs, most skipped by bound), from `opts` (type_options). Records the count and
    the winner in `stats`."""
    configs = grid_configs(problem, opts) + (megatron_configs(problem, opts) if len(opts) > 1 else [])
    configs = [c for c in configs if num_stages is None or c.stages == num_stages]
    best, label, walks = best_classic(cm, configs, interleaved=True)
    stats.seeds += walks
    stats.best_from = label or stats.best_from
    return best


def _metis_floor(problem: PoseidonProblem, cm: CostModel, stats: Stats, num_stages: int | None,
                 deadline: float, opts: dict[str, list[TypeOption]],
                 best: tuple[float, Structure | None, list[int]]) -> tuple[float, Structure | None, list[int]]:
    """Return the better of `best` and the Metis-style search's pick (seconds, structure, layers),
    that search stopping at the `perf_counter` `deadline`. Records its evaluations and, when it wins,
    "metis" in `stats`."""
    metis_stats = Stats()
    found, _ = _metis_search(problem, cm, metis_stats, deadline, num_stages, opts)
    stats.seeds += metis_stats.evaluated
    if found is not None and found[0] < best[0]:
        best, stats.best_from = found, "metis"
    return best


SEED_SHARE = 0.1  # the share of a time limit kept for the Metis-style floor when the search is cut short


def solve_poseidon(problem: PoseidonProblem, *, time_limit_s: float | None = None, seed: int = 0,
                   progress: Progress, cuts: str = "ridge", prune: bool = True, num_stages: int | None = None,
                   workers: int | None = None, **_: Any) -> PoseidonPlan:
    """Return the best plan of the space by best-first branch and bound, anytime.

    The incumbent is first seeded with the best classic baseline on the same input (`_seed`: every
    classic TP x PP x DP configuration and the Megatron-style mixes, always to the end). With a time
    limit the search stops at 1 - SEED_SHARE of it; when it has not proven its optimum by then, the
    Metis-style search runs in the rest (`_finish_search`), so the plan is never slower than any of
    them. (A proven optimum is at least as fast as every Metis pick: those are in the space.)
    The combos (m and the per-type stage splits) are bounded block by block before any is listed
    (`solvers.poseidon.bounds.list_combos`: W1, W2 and RT0 relaxed over every type order) and only those
    below the seed are kept, in bound order.
    Pass 1 (breadth) visits them best bound first and gives every structure of a combo (its type
    orders and interleaves) whose order bound (`ComboEntry.order_bound`, before it is built) and
    `Structure.lower_bound` are below the best time a first look: `quick_map`, two DAG walks.
    Pass 2 (depth) maps the layers of the structures left (`ridge_map`), fastest first look first,
    after `Structure.lp_bound`. Pass 1 stops at the first combo whose bound reaches the best time.
    The bounds are lower bounds on every layer mapping, so pruning never loses a structure that
    could beat the incumbent. The clock is read before every block of combos, between combos,
    between structures and inside the layer mapping; when
    `time_limit_s` runs out the best plan seen is returned with status TIME_LIMIT (OPTIMAL only
    when every combo was visited or pruned). With prune=False every structure is evaluated (the
    exhaustive reference); cuts="all" maps layers by trying every cut set instead of the ridge
    walk; num_stages fixes the pipeline depth (seeds included). `workers` > 1 (default: every core
    when the combos kept hold POOL_MIN_STRUCTURES structures or more) searches the combos in a
    process pool sharing the best time as the pruning bound (`_solve_pooled`); 1 searches in this
    process.
    """
    started = time.perf_counter()
    deadline = INF if time_limit_s is None else started + time_limit_s
    stats = Stats(deadline=INF if time_limit_s is None else started + (1 - SEED_SHARE) * time_limit_s)
    cm = CostModel(problem)
    opts = type_options(problem)  # one set of options for the whole solve (caches key them by id)
    _check_depth(problem, num_stages, opts)
    best = _seed(problem, cm, stats, num_stages, opts)
    progress(0.0, f"seeded with {stats.best_from}: {best[0]:.4g} s")
    mapper = ridge_map if cuts == "ridge" else all_cuts_map
    status = Status.OPTIMAL
    entries = _listed_combos(problem, cm, opts, num_stages, best[0] if prune else None, stats)
    if entries is None:  # the deadline passed while listing: the seed stands
        status, entries = Status.TIME_LIMIT, []
    sizes = [combo_size(problem, (e.m, e.used)) for e in entries]
    progress(0.0, f"{len(entries)} combos")
    n_workers = _pool_size(workers, sum(sizes))
    if prune and status is Status.OPTIMAL and n_workers > 1 and entries:
        best, status = _solve_pooled(problem, cm, entries, best, stats, mapper, n_workers)
        return _finish_search(problem, cm, opts, num_stages, best, stats, status, deadline)

    # pass 1, breadth: every combo in bound order, each structure bounded and given a first look
    pending: list[tuple[float, float, int, int]] = []  # (first-look seconds, bound, combo, structure index)
    for k, e in enumerate(entries):
        if prune and e.bound >= best[0]:
            stats.pruned += sum(sizes[k:])
            break
        if stats.out_of_time():
            status = Status.TIME_LIMIT
            stats.unvisited += sum(sizes[k:])
            break
        handled, tally = 0, OrderTally()
        for index, lb, st in _combo_structures(problem, cm, e, (lambda: best[0]) if prune else (lambda: INF), tally):
            handled += 1
            if not st.feasible():
                stats.infeasible += 1
                continue
            # the range test first: on the unseen 4-type instance it prunes every structure the
            # lower bound does and 19,000 more, so the lower bound is only computed for the few left
            if prune and st.cannot_beat(best[0]):
                stats.pruned += 1
                continue
            lb = max(lb, st.lower_bound(best[0])) if prune else 0.0
            if prune and lb >= best[0]:
                stats.pruned += 1
                continue
            t, layers = quick_map(st, stats)
            if prune and t < best[0] - 1e-12 * t and not stats.out_of_time():
                # a new incumbent is mapped at once (depth first), so the bounds prune against its
                # mapped time for the rest of pass 1; the mapping does not depend on the incumbent
                t, layers = mapper(st, stats)
                stats.evaluated += 1
                if stats.out_of_time():  # the mapping may have been cut short: not proven
                    status = Status.TIME_LIMIT
            else:
                pending.append((t, lb, k, index))
            if t < best[0] - 1e-12 * t:
                best, stats.best_from = (t, st, layers), "search"
            if stats.out_of_time():
                break
        stats.pruned, stats.infeasible = stats.pruned + tally.pruned, stats.infeasible + tally.infeasible
        stats.unvisited += sizes[k] - handled - tally.pruned - tally.infeasible
        if k % 100 == 0:
            progress(0.5 * k / len(entries), f"{len(pending)} structures to map, best {best[0]:.4g} s")
    if stats.unvisited:  # the last combo's orders were cut short
        status = Status.TIME_LIMIT
    # pass 2, depth: the layer mapping of each structure left, most promising first look first
    pending.sort()
    for c, (_, lb, k, index) in enumerate(pending):
        if stats.out_of_time():
            status = Status.TIME_LIMIT
            stats.unvisited += len(pending) - c
            break
        if prune and lb >= best[0]:
            stats.pruned += 1
            continue
        st = _structure_at(problem, cm, (entries[k].m, entries[k].used), index)
        if prune and best[0] < INF and (st.cannot_beat(best[0]) or st.lp_bound() >= best[0]):
            stats.pruned += 1
            continue
        t, layers = mapper(st, stats)  # cut short inside when the deadline passes
        stats.evaluated += 1
        if t < best[0] - 1e-12 * t:
            best, stats.best_from = (t, st, layers), "search"
        if stats.out_of_time():  # this mapping may have been cut short: not proven
            status = Status.TIME_LIMIT
        if c % 20 == 0:
            progress(0.5 + 0.5 * c / len(pending), f"{stats.evaluated} mapped, best {best[0]:.4g} s")
    return _finish_search(problem, cm, opts, num_stages, best, stats, status, deadline)


def _finish_search(problem: PoseidonProblem, cm: CostModel, opts: dict[str, list[TypeOption]],
                   num_stages: int | None, best: tuple[float, Structure | None, list[int]], stats: Stats,
                   status: Status, deadline: float) -> PoseidonPlan:
    """Return the plan of `best` (seconds, structure, layers) with `status`; when the search was cut
    short, first the better of it and the Metis-style floor (`_metis_floor`) searched until the
    `perf_counter` `deadline` (the solve's whole time limit)."""
    if status is Status.TIME_LIMIT and deadline < INF:
        best = _metis_floor(problem, cm, stats, num_stages, deadline, opts, best)
    if best[1] is None and status is Status.TIME_LIMIT:
        raise SolverError(f"no plan found within the time limit: no classic or Metis-style configuration "
                          f"fits, and the search stopped after {stats.structures - stats.unvisited} structures "
                          f"({stats.unvisited} left unvisited); not a proof of infeasibility: raise the time limit (--time-limit, or time_limit_s in the API)")
    return _finish(problem, best, stats, "poseidon", status)


def _listed_combos(problem: PoseidonProblem, cm: CostModel, opts: dict[str, list[TypeOption]],
                   num_stages: int | None, cutoff: float | None, stats: Stats) -> list[ComboEntry] | None:
    """Return the combos to search, in the order to visit them, and count the structures of the space
    (and, with a `cutoff`, those its combo bounds prune or show infeasible) in `stats`; None when the
    deadline passed while listing (then every structure is counted unvisited). cutoff None: every
    combo, unbounded, in listing order (the exhaustive reference)."""
    if cutoff is not None:
        table = list_combos(problem, cm, opts, num_stages, cutoff, stats.deadline)
        stats.structures += table.structures
        if table.cut:
            stats.unvisited += table.structures
            return None
        stats.pruned += table.pruned
        stats.infeasible += table.infeasible
        return table.entries
    entries = []
    for m, used in combos(problem, num_stages, opts):
        if stats.out_of_time():
            stats.unvisited += sum(combo_size(problem, (e.m, e.used)) for e in entries)
            stats.structures += stats.unvisited
            return None
        entries.append(ComboEntry(0.0, m, used))
    stats.structures += sum(combo_size(problem, (e.m, e.used)) for e in entries)
    return entries


@dataclass
class OrderTally:
    """Structures of a combo that `_combo_structures` settled in bulk, without yielding them: pruned
    by a bound, or infeasible (the order bound is inf)."""

    pruned: int = 0
    infeasible: int = 0


def _combo_structures(problem: PoseidonProblem, cm: CostModel, entry: ComboEntry, incumbent: Any,
                      tally: OrderTally) -> Iterator[tuple[int, float, Structure]]:
    """Yield (index, order bound, structure) for the structures of a combo (`structures` order,
    `_structure_at` indices) that its order tests do not prune, counting the rest in `tally`: the
    order bound (`ComboEntry.order_bound`, seconds; inf: it cannot fit), bound (1) at the real
    positions (`_PlacedW1.cannot_beat`), the fill-and-drain path and its ranged minimum, each
    against `incumbent()`. A structure that passes is built from the cached placed terms."""
    m, used = entry.m, entry.used
    vs = [1] + interleaves(problem, sum(o.stages for o in used), m)
    inner, across = _combo_sends(cm, m, used)
    w1 = _PlacedW1(cm, m, used)
    for oi, order in enumerate(itertools.permutations(range(len(used)))):
        sends = inner + sum(across[a][b] for a, b in zip(order, order[1:]))
        for vi, v in enumerate(vs):
            lb = entry.order_bound(order, v, sends)
            cut = incumbent()
            if lb >= cut:
                tally.infeasible += lb == INF
                tally.pruned += lb < INF
            elif w1.cannot_beat(order, v, cut):
                tally.pruned += 1
            elif w1.S > 1 and (w2 := w1.fill_drain(order, v, sends) * SHAVE) >= cut:
                tally.infeasible += w2 == INF
                tally.pruned += w2 < INF
            elif w1.ranged_fill_drain(order, v, cut, sends):
                tally.pruned += 1
            elif v == 1 and w1.ranged_paths(order, cut, sends):
                tally.pruned += 1
            else:
                yield oi * len(vs) + vi, lb, w1.structure(order, v)


class _PlacedW1:
    """Bound (1) of `Structure.lower_bound` (every stage's m micro-batches, then its all-reduce) as a
    test against a cutoff, per type order of one combo, with each stage's memory cap, all-reduce and
    embedding/head at its real position, before any `Structure` is built. An option's stages start at
    a position fixed by the options before it, so their terms are looked up once per (option, start,
    v) and shared by every order (a combo of u types has u! orders but at most u 2^(u-1) starts), and
    by every combo of the solve with the same m and stage count (cached on the cost model, options
    keyed by id: one solve passes one set of options everywhere).
    With blocking exchanges each stage's chain also holds its exchanges (`Structure.exchange_terms`),
    which depend on the options beside it: the held counts are then looked up per (option, start, v,
    option before, option after), the neighbours cyclic with interleaving (chunks wrap around), and
    shared solve-wide like the terms, at the last cutoff asked (it changes only when the incumbent
    improves). The fill-and-drain path (`fill_drain`) and its minimum over the ranges bound (1) leaves
    (`ranged_fill_drain`) prune further before building."""

    def __init__(self, cm: CostModel, m: int, used: tuple[TypeOption, ...]) -> None:
        self.cm, self.m, self.used = cm, m, used
        self.S = sum(o.stages for o in used)
        self.L = cm.p.model.num_layers
        self._ids = [id(o) for o in used]
        self._gterms = cm.__dict__.setdefault("_placed_terms", {})
        self._gchain = cm.__dict__.setdefault("_placed_chain", {})
        self._gheld = cm.__dict__.setdefault("_placed_held", {})
        self._gx = cm.__dict__.setdefault("_placed_exchanges", {})
        self._gfree = cm.__dict__.setdefault("_placed_free", {})
        self._graw = cm.__dict__.setdefault("_placed_raw", {})
        self._free: dict[tuple[int, int, int], tuple[float, int, int]] = {}
        self._terms: dict[tuple[int, int, int], list[tuple[float, float, int, float, float, float, float]]] = {}
        self._chain: dict[tuple[int, int, int, int, int], list[float]] = {}
        self._held: dict[tuple[int, int, int, int, int], tuple[float, int, int, list[int]]] = {}
        self._inner_x: dict[int, list[float]] = {}
        self._across_x: dict[tuple[int, int], float] = {}
        self._row: tuple[tuple[int, ...], int, float, Any] | None = None

    def _raw(self, j: int, start: int, v: int) -> list[Any]:
        """Return `_stage_terms` of option j's stages placed from position `start` at interleave v,
        cached solve-wide (what `Structure` computes for those stages)."""
        gkey = (self._ids[j], start, v, self.m, self.S)
        out = self._graw.get(gkey)
        if out is None:
            cm, m, S, o = self.cm, self.m, self.S, self.used[j]
            sched, G = cm.p.schedule, cm.p.global_batch
            out = self._graw[gkey] = [
                _stage_terms(cm, sh, G // (m * sh.dp), s == 0, s == S - 1, in_flight(sched, s, S, m, v), s, S, m, v)
                for s, sh in enumerate(o.shapes, start)]
        return out

    def structure(self, order: tuple[int, ...], v: int) -> Structure:
        """Return the structure with the options in `order` at interleave v, built from the cached
        placed terms and sends (the same numbers as `Structure(cm, shapes, m, v)`)."""
        shapes: list[StageShape] = []
        terms: list[Any] = []
        p2p: list[float] = []
        for i, (j, start, _, _) in enumerate(self._placed(order, v)):
            if i:
                p2p.append(self._send(order[i - 1], j))
            shapes.extend(self.used[j].shapes)
            terms.extend(self._raw(j, start, v))
            p2p.extend(self._inner_sends(j))
        return Structure(self.cm, shapes, self.m, v, terms, p2p)

    def _inner_sends(self, j: int) -> list[float]:
        """Return the sends between consecutive stages of option j (seconds, `_p2p`), cached solve-wide."""
        gkey = ("inner-p2p", self._ids[j], self.m)
        out = self._gx.get(gkey)
        if out is None:
            sh, G = self.used[j].shapes, self.cm.p.global_batch
            out = self._gx[gkey] = [_p2p(self.cm, sh[k], sh[k + 1], G // (self.m * sh[k].dp))
                                    for k in range(len(sh) - 1)]
        return out  # type: ignore[no-any-return]

    def _send(self, a: int, b: int) -> float:
        """Return the send from option a's last stage to option b's first (seconds, `_p2p`)."""
        x = self.used[a].shapes[-1]
        return _p2p(self.cm, x, self.used[b].shapes[0], self.cm.p.global_batch // (self.m * x.dp))

    def _stages(self, j: int, start: int, v: int) -> list[tuple[float, float, int, float, float, float, float]]:
        """Return (w, const, nmax, c, e, a, a0) of option j's stages placed from position `start` at
        interleave v: per-block seconds m c + a, fixed seconds m e + a0 (without the tied-embedding
        all-reduce, so at most the structure's), the most blocks that fit there (as `Structure`
        computes them), and `Structure`'s c, e, a, a0 of the stage (seconds)."""
        key = (j, start, v)
        out = self._terms.get(key)
        if out is None:
            gkey = (self._ids[j], start, v, self.m, self.S)
            out = self._gterms.get(gkey)
            if out is None:
                m = self.m
                out = self._gterms[gkey] = [(m * (f + g) + a, m * (ef + eg) + a0, max(caps), f + g, ef + eg, a, a0)
                                            for f, g, ef, eg, a, a0, caps in self._raw(j, start, v)]
            self._terms[key] = out
        return out

    def _chains(self, j: int, start: int, v: int, prev: int, nxt: int) -> list[float]:
        """Return per stage of option j placed from `start` the blocking-exchange seconds one
        micro-batch's forwards and backwards hold there (`Structure.exchange_terms`' chain, the same
        float operations), with option `prev` before it and `nxt` after it (-1: none; cyclic with
        v > 1); zeros when the exchanges do not block."""
        key = (j, start, v, prev, nxt)
        out = self._chain.get(key)
        if out is None:
            ids = self._ids
            gkey = (ids[j], start, v, self.m, self.S, ids[prev] if prev >= 0 else -1, ids[nxt] if nxt >= 0 else -1)
            out = self._gchain.get(gkey)
            if out is None:
                out = self._gchain[gkey] = self._compute_chains(j, start, v, prev, nxt)
            self._chain[key] = out
        return out

    def _compute_chains(self, j: int, start: int, v: int, prev: int, nxt: int) -> list[float]:
        """Return `_chains` uncached: stage q holds its forward exchange in every chunk but the last
        virtual stage's and its backward one in every chunk but virtual stage 0's, each summed in
        chunk order as `Structure.exchange_terms` sums them."""
        cm, m, S, o = self.cm, self.m, self.S, self.used[j]
        if not cm.p.blocking_p2p or S * v == 1:
            return [0.0] * o.stages
        inner = self._inner(j)
        fxs = inner + [self._across(j, nxt) if nxt >= 0 else 0.0]
        bxs = [self._across(prev, j) if prev >= 0 else 0.0] + inner
        return [sum([fxs[i]] * (v - (start + i == S - 1))) + sum([bxs[i]] * (v - (start + i == 0)))
                for i in range(o.stages)]

    def _held_at(self, j: int, start: int, v: int, T: float, prev: int = -1, nxt: int = -1
                 ) -> tuple[int, int, list[int]]:
        """Return (sum, min, per stage) over option j's stages from `start` (options `prev` before and
        `nxt` after it, -1: none) of the most blocks (a multiple of v) each can run within T seconds
        under bound (1) with its blocking exchanges, capped by its memory."""
        key = (j, start, v, prev, nxt)
        got = self._held.get(key)
        if got is None or got[0] != T:
            ids = self._ids
            gkey = (ids[j], start, v, self.m, self.S, ids[prev] if prev >= 0 else -1, ids[nxt] if nxt >= 0 else -1)
            got = self._gheld.get(gkey)
            if got is None or got[0] != T:
                m = self.m
                ks = []
                for (w, _, nmax, _, e, _, a0), x in zip(self._stages(j, start, v),
                                                        self._chains(j, start, v, prev, nxt)):
                    room = T - m * (e + x) - a0
                    k = nmax if w <= 0 else min(nmax, int(math.floor(room / w)) if room >= 0 else -1)
                    ks.append(k // v * v)
                got = self._gheld[gkey] = (T, sum(ks), min(ks), ks)
            self._held[key] = got
        return got[1], got[2], got[3]

    def _placed(self, order: tuple[int, ...], v: int) -> Iterator[tuple[int, int, int, int]]:
        """Yield (option, start, option before, option after) along `order` (-1: none; the neighbours
        wrap around with v > 1, as the chunks do)."""
        u, start = len(order), 0
        for i, j in enumerate(order):
            prev = order[i - 1] if i > 0 else (order[-1] if v > 1 else -1)
            nxt = order[i + 1] if i + 1 < u else (order[0] if v > 1 else -1)
            yield j, start, prev, nxt
            start += self.used[j].stages

    def cannot_beat(self, order: tuple[int, ...], v: int, cutoff: float) -> bool:
        """True when bound (1) proves that no layer mapping of the structure with the options in
        `order` (positions in the combo) at interleave v runs faster than `cutoff` seconds: every
        stage q holds at most hi_q blocks within it, and the hi_q sum below L (or one is below v).
        Raised by 1e-9 relative, like `Structure.cannot_beat`, so a tie never prunes."""
        if cutoff == INF or self.S < 2:
            return False
        T = cutoff * (1 + 1e-9)
        # first without the exchanges (they only take time from the stages): the held counts depend
        # on the option's start alone, so far fewer are computed, and most prunes come from here
        total, start = 0, 0
        for j in order:
            held, least = self._held_free(j, start, v, T)
            if least < v:
                return True
            total += held
            start += self.used[j].stages
        if total < self.L:
            return True
        if not self.cm.p.blocking_p2p:
            return False
        total = 0
        for j, start, prev, nxt in self._placed(order, v):
            held, least, _ = self._held_at(j, start, v, T, prev, nxt)
            if least < v:
                return True
            total += held
        return total < self.L

    def _held_free(self, j: int, start: int, v: int, T: float) -> tuple[int, int]:
        """Return (sum, min) over option j's stages from `start` of the most blocks (a multiple of v)
        each can run within T seconds under bound (1) without its exchanges, capped by its memory: at
        least `_held_at`'s counts, cached solve-wide at the last T asked."""
        key = (j, start, v)
        got = self._free.get(key)
        if got is None or got[0] != T:
            gkey = (self._ids[j], start, v, self.m, self.S)
            got = self._gfree.get(gkey)
            if got is None or got[0] != T:
                m, ks = self.m, []
                for w, _, nmax, _, e, _, a0 in self._stages(j, start, v):
                    room = T - m * e - a0
                    k = nmax if w <= 0 else min(nmax, int(math.floor(room / w)) if room >= 0 else -1)
                    ks.append(k // v * v)
                got = self._gfree[gkey] = (T, sum(ks), min(ks))
            self._free[key] = got
        return got[1], got[2]

    def ranged_fill_drain(self, order: tuple[int, ...], v: int, cutoff: float, sends_s: float) -> bool:
        """True when the fill-and-drain path (`fill_drain`'s row) minimised over real layer counts in
        the ranges bound (1) leaves within `cutoff` is above it (raised by 1e-9 relative): each stage q
        holds at most hi_q blocks (`_held_at`) and, the counts summing to L, at least L minus the other
        stages' hi (and v); a mapping faster than the cutoff lies in these ranges, so none exists."""
        if cutoff == INF or self.S < 2:
            return False
        T = cutoff * (1 + 1e-9)
        hi: list[int] = []
        for j, start, prev, nxt in self._placed(order, v):
            hi.extend(self._held_at(j, start, v, T, prev, nxt)[2])
        L, total = self.L, sum(hi)
        lo = [max(v, -(-(L - (total - h)) // v) * v) for h in hi]
        per, base, _ = self._fill_drain_row(order, v, sends_s)
        return _min_in_ranges(per, base, lo, hi, L) > T

    def ranged_paths(self, order: tuple[int, ...], cutoff: float, sends_s: float, rounds: int = 3) -> bool:
        """True when the range test of `Structure.cannot_beat` (without its last minimisation) proves,
        before the structure with the options in `order` at interleave 1 is built, that none of its
        layer mappings runs faster than `cutoff` seconds (raised by 1e-9 relative: a tie never prunes).

        Its rows are the structure's round trips, hourglasses and fill-and-drain path (`_path_rows`,
        blocking exchanges included), from the placed terms and without the tied-embedding
        all-reduce: each row is at most the structure's, hence a lower bound on every mapping's time.
        The ranges start from bound (1)'s held counts (`_held_at`, at least the structure's
        `stage_caps`) and narrow as there: by the sum sum_s n_s = L, and by each row capping each
        count given the others at their least. A row's value at the least counts and its cap on n_s
        come from prefix and suffix sums and minima (a round trip's coefficient on stage s is f_s
        before q, f_s + own_q at q, f_s + g_s after; an hourglass's c_s before q, m c_q at q, 0
        after), so a round costs O(S), not O(S^2)."""
        S, m, L = self.S, self.m, self.L
        if cutoff == INF or S < 2:
            return False
        T = cutoff * (1 + 1e-9)
        terms: list[Any] = []
        hi: list[int] = []
        x: list[float] = []  # the sends, or the blocking exchanges, between stages s and s + 1
        block = self.cm.p.blocking_p2p
        for i, (j, start, prev, nxt) in enumerate(self._placed(order, 1)):
            if i:
                x.append(self._across(order[i - 1], j) if block else self._send(order[i - 1], j))
            x.extend(self._inner(j) if block else self._inner_sends(j))
            terms.extend(self._raw(j, start, 1))
            hi.extend(self._held_at(j, start, 1, T, prev, nxt)[2])
        f, g, ef, eg, a, a0 = (list(col) for col in list(zip(*terms))[:6])
        if min(hi) < 1 or sum(hi) < L:
            return True
        c = [fs + gs for fs, gs in zip(f, g)]
        e = [fs + gs for fs, gs in zip(ef, eg)]
        later = c  # a stage after q: its forward and backward
        kf = ([0.0] * S if self.cm.p.schedule == "gpipe"
              else [float(max(0, m - min(S - 1 - q, m) - 1)) for q in range(S)])
        at = [f[q] + (kf[q] * f[q] + m * g[q] + a[q]) for q in range(S)]  # the round trip's coefficient at q
        x_tail, eg_after, total_x = _suffix_sums(x), _suffix_sums(eg)[1:], sum(x)
        sum_ef = sum(ef)
        rt_const = []
        for q in range(S):
            sends = total_x + x_tail[q]
            if block:
                sends += kf[q] * (x[q] if q < S - 1 else 0.0) + m * (x[q - 1] if q > 0 else 0.0)
            rt_const.append(sum_ef + eg_after[q] + kf[q] * ef[q] + m * eg[q] + a0[q] + sends)
        x_before = [0.0, *itertools.accumulate(x)]
        e_before = [0.0, *itertools.accumulate(e)]
        hg_const = {}  # the hourglass through inner stage q
        for q in range(1, S - 1):
            sends = (x_before[q] + m * (x[q] + x[q - 1]) + x_before[q - 1]) if block else 2 * x_before[q]
            hg_const[q] = e_before[q] + m * e[q] + sends + a0[0]
        fd, fd_base, _ = self._fill_drain_row(order, 1, sends_s)
        lo = [1] * S
        for _ in range(rounds):
            changed = _narrow_by_sum(lo, hi, L, 1)
            if changed is None:
                return True
            fl = [fs * n for fs, n in zip(f, lo)]
            f_before = [0.0, *itertools.accumulate(fl)]
            fg_after = _suffix_sums([ls * n for ls, n in zip(later, lo)])
            c_before = [0.0, *itertools.accumulate(cs * n for cs, n in zip(c, lo))]
            slack_rt = [T - (rt_const[q] + f_before[q] + at[q] * lo[q] + fg_after[q + 1]) for q in range(S)]
            slack_hg = {q: T - (k + c_before[q] + m * c[q] * lo[q] + a[0] * lo[0]) for q, k in hg_const.items()}
            slack_fd = T - (fd_base + sum(p * n for p, n in zip(fd, lo)))
            if min(slack_rt) < 0 or slack_fd < 0 or (slack_hg and min(slack_hg.values()) < 0):
                return True
            rt_after = _suffix_mins(slack_rt)  # rt_after[s] = min over q >= s
            hg_after = _suffix_mins([slack_hg.get(q, INF) for q in range(S)])
            rt_before = INF  # min over q < s
            for s in range(S):
                # (slack, coefficient on n_s) of each row: n_s <= lo_s + floor(slack / coefficient)
                pairs = [(slack_rt[s], at[s]), (rt_after[s + 1], f[s]), (rt_before, c[s]), (slack_fd, fd[s]),
                         (hg_after[s + 1], c[s] + a[0] if s == 0 else c[s]), (slack_hg.get(s, INF), m * c[s])]
                cap = hi[s]
                for k, w in pairs:
                    if w > 0 and k < INF:
                        y = k / w + 1e-9  # >= 0 (every slack is here), so int() floors it
                        if y < cap - lo[s]:
                            cap = lo[s] + int(y)
                if cap < hi[s]:
                    hi[s], changed = cap, True
                rt_before = min(rt_before, slack_rt[s])
            if sum(hi) < L:
                return True
            if not changed:
                break
        return any(h < n for h, n in zip(hi, lo))

    def _inner(self, j: int) -> list[float]:
        """Return the blocking exchanges between consecutive stages of option j (seconds), cached
        solve-wide."""
        out = self._inner_x.get(j)
        if out is None:
            gkey = ("inner", self._ids[j], self.m)
            out = self._gx.get(gkey)
            if out is None:
                cm, sh = self.cm, self.used[j].shapes
                G = cm.p.global_batch
                out = self._gx[gkey] = [_exchange(cm, sh[k], sh[k + 1], G // (self.m * sh[k].dp))
                                        for k in range(len(sh) - 1)]
            self._inner_x[j] = out
        return out

    def _across(self, a: int, b: int) -> float:
        """Return the blocking exchange from option a's last stage to option b's first (seconds), cached
        solve-wide."""
        out = self._across_x.get((a, b))
        if out is None:
            gkey = ("across", self._ids[a], self._ids[b], self.m)
            out = self._gx.get(gkey)
            if out is None:
                cm, x = self.cm, self.used[a].shapes[-1]
                out = self._gx[gkey] = _exchange(cm, x, self.used[b].shapes[0],
                                                 cm.p.global_batch // (self.m * x.dp))
            self._across_x[(a, b)] = out
        return out

    def _path_sends(self, order: tuple[int, ...], v: int, sends_s: float) -> float:
        """Return the seconds of sends (or, when the exchanges block, of exchanges the ops hold) on the
        fill-and-drain path of the structure with `order` at interleave v, as
        `Structure._fill_drain_sends` computes them; `sends_s` is the sum of its sends."""
        S, m = self.S, self.m
        if not self.cm.p.blocking_p2p or S == 1:
            return 2 * sends_s
        xs: list[float] = []
        for i, j in enumerate(order):
            xs.extend(self._inner(j))
            if i + 1 < len(order):
                xs.append(self._across(j, order[i + 1]))
        *_, (j, start, prev, nxt) = self._placed(order, v)
        return sum(xs) + m * self._chains(j, start, v, prev, nxt)[-1] + sum(xs[:S - 2])

    def _fill_drain_row(self, order: tuple[int, ...], v: int, sends_s: float
                        ) -> tuple[list[float], float, list[tuple[float, float, int, float, float, float, float]]]:
        """Return (per, base, stage terms) of the fill-and-drain path of the structure with `order` at
        interleave v: T >= sum_s per_s n_s + base for every layer mapping n (see `fill_drain`); the
        last one is kept (`fill_drain` and `ranged_fill_drain` ask for the same order in turn)."""
        if self._row is not None and self._row[:3] == (order, v, sends_s):
            return self._row[3]  # type: ignore[no-any-return]
        m, S = self.m, self.S
        rows = []
        for j, start, _, _ in self._placed(order, v):
            rows.extend(self._stages(j, start, v))
        last = S - 1
        per = [r[3] / v for r in rows]
        per[last] = m * rows[last][3]
        base = sum(r[4] for r in rows) - rows[last][4] + m * rows[last][4] + self._path_sends(order, v, sends_s)
        if v == 1:
            per[0] += rows[0][5]
            base += rows[0][6]
        self._row = (order, v, sends_s, (per, base, rows))
        return per, base, rows

    def fill_drain(self, order: tuple[int, ...], v: int, sends_s: float) -> float:
        """Return bound (2) of `Structure.lower_bound` (seconds) for the structure with the options in
        `order` at interleave v, with each stage's memory cap, embedding/head and (v = 1) stage 0's
        all-reduce at its real position, before it is built: micro-batch 0 forward through the first
        chunks of every stage but the last, the last stage's whole chain, micro-batch m-1 back down,
        both ways through the sends (`sends_s`, their sum), or the blocking exchanges its ops hold
        (`_path_sends`). The tied-embedding all-reduce is left out (a lower bound of the structure's
        bound (2)); inf when the caps cannot hold L layers."""
        S, L = self.S, self.L
        per, base, rows = self._fill_drain_row(order, v, sends_s)
        spare = L - S * v
        total = base + v * sum(per)
        for s in sorted(range(S), key=per.__getitem__):
            if spare <= 0:
                break
            k = min(spare, rows[s][2] - v)
            if k > 0:
                total += k * per[s]
                spare -= k
        return INF if spare > 0 else total


def _exchange(cm: CostModel, a: StageShape, b: StageShape, micro_batch: int) -> float:
    """Return the seconds of one blocking exchange from stage shape a to b with a's micro-batch
    (`exchanges_s` of the pair, the same float operations as a structure's), cached on the cost model."""
    cache = cm.__dict__.setdefault("_exchange", {})
    key = (a, b, micro_batch)
    if key not in cache:
        cache[key] = exchanges_s(cm, [a, b], [micro_batch, micro_batch], [_p2p(cm, a, b, micro_batch)])[0]
    return cache[key]  # type: ignore[no-any-return]


def _combo_sends(cm: CostModel, m: int, used: tuple[TypeOption, ...]) -> tuple[float, list[list[float]]]:
    """Return (inner, across): the seconds of the sends between consecutive stages of each option of a
    combo, summed, and across[i][j] the send from option i's last stage to option j's first (the
    micro-batch of the sender at m micro-batches): a type order's sends are inner plus its
    consecutive pairs' `across`, the sum of `Structure.p2p`."""
    G = cm.p.global_batch
    mb = [G // (m * o.dp) for o in used]
    inner = sum(_p2p(cm, o.shapes[i], o.shapes[i + 1], b) for o, b in zip(used, mb) for i in range(o.stages - 1))
    across = [[_p2p(cm, a.shapes[-1], c.shapes[0], b) if i != j else 0.0 for j, c in enumerate(used)]
              for i, (a, b) in enumerate(zip(used, mb))]
    return inner, across


POOL_MIN_STRUCTURES = 5000  # below this a process pool's start-up costs more than it saves


def _pool_size(workers: int | None, n_structures: int) -> int:
    """Return the number of processes to search with: `workers` when given, else every core (at most
    8) when the space is large enough to pay for the pool, else 1; 1 where processes cannot fork."""
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods():
        return 1
    if workers is not None:
        return max(1, int(workers))
    if n_structures < POOL_MIN_STRUCTURES:
        return 1
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores))


_POOL: dict[str, Any] = {}  # the forked workers' view of the solve (set before the pool forks)


def _solve_pooled(problem: PoseidonProblem, cm: CostModel, entries: list[ComboEntry],
                  best: tuple[float, Structure | None, list[int]], stats: Stats, mapper: Any, n_workers: int,
                  ) -> tuple[tuple[float, Structure | None, list[int]], Status]:
    """Return (best (seconds, structure, layers), status) over `best` and the combos `entries` (in bound order) searched by `n_workers` forked
    processes: worker w takes the combos ranked w, w + n, w + 2n, ... (so each sees combos in bound
    order), and every structure is bounded, given a first look and ridge-mapped depth first. The best
    time found by any worker is shared (a lock-protected double) and prunes in every worker, which
    keeps the optimum: a bound prunes only what cannot beat a time some plan reaches. Ties between
    equally fast plans go to the lowest (combo rank, structure index)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")  # the workers inherit the cost model's caches (`_pool_size` checks)
    shared = ctx.Value("d", best[0])
    _POOL.update(problem=problem, cm=cm, entries=entries, shared=shared, mapper=mapper,
                 deadline=stats.deadline, step=n_workers)
    try:
        with ctx.Pool(n_workers) as pool:
            results = pool.map(_pooled_worker, range(n_workers))
    finally:
        _POOL.clear()
    status = Status.OPTIMAL
    found: tuple[float, int, int, list[int]] | None = None
    for r in results:
        for key in ("pruned", "evaluated", "dag_evaluations", "cuts_pruned", "infeasible", "unvisited"):
            setattr(stats, key, getattr(stats, key) + r["stats"][key])
        if r["cut"]:
            status = Status.TIME_LIMIT
        if r["best"] is not None and (found is None or r["best"][:3] < found[:3]):
            found = r["best"]
    if found is not None and found[0] < best[0] - 1e-12 * found[0]:
        t, rank, index, layers = found
        st = _structure_at(problem, cm, (entries[rank].m, entries[rank].used), index)
        best, stats.best_from = (t, st, layers), "search"
    stats.best_from += f" ({n_workers} processes)"
    return best, status


def _pooled_worker(w: int) -> dict[str, Any]:
    """Search the combos ranked w, w + step, ... (see `_solve_pooled`); return this worker's counters
    (structures of the space excepted: the parent counted them), its best (seconds, rank, structure
    index, layers) or None, and whether the deadline cut it short."""
    g = _POOL
    problem, cm, shared, mapper = g["problem"], g["cm"], g["shared"], g["mapper"]
    stats = Stats(deadline=g["deadline"])
    entries: list[ComboEntry] = g["entries"]
    mine = list(range(w, len(entries), g["step"]))
    found: tuple[float, int, int, list[int]] | None = None
    cut = False

    def incumbent() -> float:
        return float(shared.value)

    def offer(t: float, k: int, index: int, layers: list[int]) -> None:
        nonlocal found
        if found is None or (t, k, index) < found[:3]:
            found = (t, k, index, layers)
        with shared.get_lock():
            if t < shared.value:
                shared.value = t

    # pass 1, breadth: this worker's combos in bound order, every structure bounded and given a first look
    pending: list[tuple[float, float, int, int]] = []
    for pos, k in enumerate(mine):
        e = entries[k]
        if e.bound >= incumbent() or stats.out_of_time():  # the rest of this worker's combos rank higher still
            rest = sum(combo_size(problem, (entries[j].m, entries[j].used)) for j in mine[pos:])
            if e.bound >= incumbent():
                stats.pruned += rest
            else:
                stats.unvisited += rest
                cut = True
            break
        size = combo_size(problem, (e.m, e.used))
        handled, tally = 0, OrderTally()
        for index, lb, st in _combo_structures(problem, cm, e, incumbent, tally):
            handled += 1
            if not st.feasible():
                stats.infeasible += 1
                continue
            if st.cannot_beat(incumbent()):  # the range test first (see `solve_poseidon`)
                stats.pruned += 1
                continue
            lb = max(lb, st.lower_bound(incumbent()))
            if lb >= incumbent():
                stats.pruned += 1
                continue
            t, layers = quick_map(st, stats)
            if t < incumbent() - 1e-12 * t and not stats.out_of_time():  # a new incumbent: mapped at once
                t, layers = mapper(st, stats)
                stats.evaluated += 1
                if stats.out_of_time():
                    cut = True
            else:
                pending.append((t, lb, k, index))
            offer(t, k, index, layers)
            if stats.out_of_time():
                break
        stats.pruned, stats.infeasible = stats.pruned + tally.pruned, stats.infeasible + tally.infeasible
        handled += tally.pruned + tally.infeasible
        if handled < size:
            stats.unvisited += size - handled
            cut = True
            break
    # pass 2, depth: the ridge mapping of what is left, most promising first look first
    pending.sort()
    for c, (_, lb, k, index) in enumerate(pending):
        if stats.out_of_time():
            stats.unvisited += len(pending) - c
            cut = True
            break
        if lb >= incumbent():
            stats.pruned += 1
            continue
        st = _structure_at(problem, cm, (entries[k].m, entries[k].used), index)
        if st.cannot_beat(incumbent()) or st.lp_bound() >= incumbent():
            stats.pruned += 1
            continue
        t, layers = mapper(st, stats)
        stats.evaluated += 1
        offer(t, k, index, layers)
        if stats.out_of_time():
            cut = True
    return {"stats": stats.as_dict(), "best": found, "cut": cut}


def solve_exhaustive(problem: PoseidonProblem, *, time_limit_s: float | None = None, seed: int = 0,
                     progress: Progress, cuts: str = "ridge", num_stages: int | None = None, **_: Any) -> PoseidonPlan:
    """Return the best plan after evaluating EVERY structure of the space (no pruning); with
    cuts="all", every contiguous layer mapping of every structure too."""
    return solve_poseidon(problem, time_limit_s=time_limit_s, seed=seed, progress=progress, cuts=cuts, prune=False,
                          num_stages=num_stages)


EXHAUSTIVE_LIMIT = 20000


def _exhaustive_applies(problem: PoseidonProblem) -> str | None:
    n = count_structures(problem)
    return None if n <= EXHAUSTIVE_LIMIT else f"{n} stage structures (limit {EXHAUSTIVE_LIMIT})"


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------

def uniform_layers(L: int, S: int) -> list[int]:
    """Return S layer counts as equal as possible (the first L % S stages one more)."""
    return [L // S + (1 if s < L % S else 0) for s in range(S)]


def solve_megatron(problem: PoseidonProblem, *, time_limit_s: float | None = None, seed: int = 0,
                   progress: Progress, **_: Any) -> PoseidonPlan:
    """Megatron-style homogeneous planner: every type split into stages of the SAME size and TP, the
    types in cluster order, layers split uniformly; the best (size, tp, m) by the DAG model
    (`megatron_configs`, walked best-first by bound: the same best as walking all of them)."""
    cm = CostModel(problem)
    stats = Stats()
    configs = megatron_configs(problem)
    best, _, walks = best_classic(cm, configs)
    stats.structures, stats.evaluated, stats.pruned = len(configs), walks, len(configs) - walks
    return _finish(problem, best, stats, "megatron", Status.FEASIBLE)


def metis_cost(st: Structure, layers: list[int]) -> float:
    """Return Metis' closed-form iteration estimate (seconds): (m-1) max_s E_s + sum_s E_s + max_s
    all-reduce + max_s optimizer + the sends counted once per boundary (Metis' own formula, costed
    over EVERY stage, with the real inter-node bandwidth and explicit units)."""
    E = [n * c + e for n, c, e in zip(layers, st.c, st.e)]
    tail = [n * a + a0 for n, a, a0 in zip(layers, st.a, st.a0)]
    return (st.m - 1) * max(E) + sum(E) + max(tail) + sum(st.p2p)


METIS_SUBUNITS = 7  # Metis' `hallucination`: every layer split into this many sub-units when balancing
METIS_MOVES = 3  # local boundary moves after the sub-unit fill
METIS_REPAIRS = 3  # memory-repair attempts


def _metis_unit_costs(st: Structure) -> list[list[float]]:
    """Return per stage s the forward+backward seconds of every one of Metis' L + 2 layers on that
    stage's devices (Metis costs the embedding and the head as layers: unit 0 and unit L + 1)."""
    L, cm = st.cm.p.model.num_layers, st.cm
    out = []
    for sh, b, c in zip(st.shapes, st.b, st.c):
        emb = sum(cm.extras(sh.device_type, sh.tp, b, True, False))
        head = sum(cm.extras(sh.device_type, sh.tp, b, False, True))
        out.append([emb] + [c] * L + [head])
    return out


def _metis_stage_times(w: list[list[float]], bounds: list[int]) -> list[float]:
    """Return each stage's seconds for the unit cut `bounds` (stage s holds units bounds[s]..bounds[s+1])."""
    return [sum(w[s][bounds[s]:bounds[s + 1]]) for s in range(len(w))]


def metis_partition(st: Structure) -> list[int]:
    """Return the transformer blocks per stage Metis' LayerComputeBalancer gives (SamsungLabs/Metis),
    over its L + 2 layers (embedding and head costed as layers, on the first and last stage):

    1. each stage's capacity is its normalised speed, 1 / (its seconds for the whole model);
    2. every layer is split into METIS_SUBUNITS sub-units, filled in order into stages 0..S-2 up to
       their share of the work (timed on the stage's devices), the rest to the last stage; a layer
       goes to the stage holding most of its sub-units (every stage keeps one block or more);
    3. up to METIS_MOVES local moves of one layer across a boundary, off the slowest stage, while
       they lower the slowest stage's time;
    4. memory repair (up to METIS_REPAIRS rounds): a stage over its memory cap keeps what fits and
       the surplus goes to the stages with room, fastest first.

    Unlike the public planner, each stage is costed at its real position and device memory is
    checked per device, not pooled per stage."""
    L, S = st.cm.p.model.num_layers, st.S
    U = L + 2
    w = _metis_unit_costs(st)
    speed = [1.0 / sum(ws) for ws in w]
    owner_count = [[0] * S for _ in range(U)]
    filled, s = 0.0, 0
    # stage s's share of the work: speed_s / sum(speed) of the model, i.e. that much of its own time
    quota = [sum(w[k]) * v / sum(speed) for k, v in enumerate(speed)]
    for sub in range(METIS_SUBUNITS * U):
        u = sub // METIS_SUBUNITS
        cost = w[s][u] / METIS_SUBUNITS
        while s < S - 1 and filled + cost > quota[s] * (1 + 1e-12):
            s, filled = s + 1, 0.0
            cost = w[s][u] / METIS_SUBUNITS
        owner_count[u][s] += 1
        filled += cost
    owner = [max(range(S), key=lambda k: (cnt[k], -k)) for cnt in owner_count]
    owner = [max(owner[: u + 1]) for u in range(U)]  # contiguous, in pipeline order
    units = [sum(1 for o in owner if o == k) for k in range(S)]
    blocks = [units[0] - 1] + units[1:-1] + [units[-1] - 1] if S > 1 else [L]
    blocks = _at_least_one(blocks, L)

    def bounds(n: list[int]) -> list[int]:
        out = [0, n[0] + 1]
        for k in range(1, S):
            out.append(out[-1] + n[k] + (1 if k == S - 1 else 0))
        return out

    for _ in range(METIS_MOVES):
        times = _metis_stage_times(w, bounds(blocks))
        slow = max(range(S), key=lambda k: times[k])
        best, cand = max(times), None
        for nb in (slow - 1, slow + 1):
            if 0 <= nb < S and blocks[slow] > 1:
                n = list(blocks)
                n[slow] -= 1
                n[nb] += 1
                t = max(_metis_stage_times(w, bounds(n)))
                if t < best:
                    best, cand = t, n
        if cand is None:
            break
        blocks = cand
    for _ in range(METIS_REPAIRS):
        over = [k for k in range(S) if blocks[k] > st.nmax[k]]
        if not over:
            break
        for k in over:
            surplus = blocks[k] - st.nmax[k]
            blocks[k] = st.nmax[k]
            for r in sorted((r for r in range(S) if blocks[r] < st.nmax[r]), key=lambda r: -speed[r]):
                give = min(surplus, st.nmax[r] - blocks[r])
                blocks[r] += give
                surplus -= give
            blocks[k] += surplus  # no room left anywhere: stays over (the plan does not fit)
    return blocks


def _at_least_one(n: list[int], L: int) -> list[int]:
    """Return counts with every stage holding one block or more, the total kept at L (taken from the
    largest stages)."""
    n = [max(1, x) for x in n]
    while sum(n) > L:
        k = max(range(len(n)), key=lambda k: n[k])
        n[k] -= 1
    return n


def _metis_search(problem: PoseidonProblem, cm: CostModel, stats: Stats, deadline: float,
                  num_stages: int | None = None, opts: dict[str, list[TypeOption]] | None = None
                  ) -> tuple[tuple[float, Structure, list[int]] | None, bool]:
    """Return ((DAG seconds, structure, layers) of Metis' pick, None when nothing fits; True when the
    `perf_counter` deadline cut the enumeration short). See `solve_metis`."""
    best_cost, best = INF, None
    seen: set[tuple[int, tuple[tuple[str, int], ...]]] = set()
    for m, used in combos(problem, num_stages, opts):
        for order in itertools.permutations(used):
            if time.perf_counter() > deadline:
                return (None if best is None else (best[0].time(best[1]), *best)), True
            stats.structures += 1
            shapes = [sh for o in order for sh in o.shapes]
            key = (m, tuple((sh.device_type, len(sh.gpu_ids)) for sh in shapes))
            if key in seen:
                continue  # DP first: the same stages with smaller TP (enumerated earlier) already fit
            st = Structure(cm, shapes, m)
            if not st.feasible():
                continue
            layers = metis_partition(st)
            if not st.fits(layers):
                continue
            seen.add(key)
            stats.evaluated += 1
            c = metis_cost(st, layers)
            if c < best_cost:
                best_cost, best = c, (st, layers)
    return (None if best is None else (best[0].time(best[1]), *best)), False


def solve_metis(problem: PoseidonProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Progress, **_: Any) -> PoseidonPlan:
    """Metis-style search: every type order and per-type stage count, data parallelism first (the
    smallest TP whose stages fit), Metis' proportional layer partition, ranked by Metis' closed-form
    cost; the chosen plan is then scored by the DAG model. Cut by `time_limit_s`, it returns the best
    pick so far (status TIME_LIMIT), or raises SolverError when none fitted yet (not InfeasibleError:
    the orders left unvisited may hold one)."""
    cm = CostModel(problem)
    stats = Stats()
    deadline = INF if time_limit_s is None else time.perf_counter() + time_limit_s
    found, cut = _metis_search(problem, cm, stats, deadline)
    if found is None and cut:  # stopped before any configuration fitted: no proof that none does
        raise SolverError(f"no plan found within the time limit of {time_limit_s:g} s: the Metis-style search "
                          f"stopped after {stats.structures} type orders, none of them a configuration that fits; "
                          f"not a proof of infeasibility: raise the time limit (--time-limit, or time_limit_s in the API)")
    if found is None:
        raise InfeasibleError(_why_infeasible(problem))
    return _finish(problem, found, stats, "metis", Status.TIME_LIMIT if cut else Status.FEASIBLE)


def solve_3d(problem: PoseidonProblem, *, time_limit_s: float | None = None, seed: int = 0,
             progress: Progress, **_: Any) -> PoseidonPlan:
    """Classic 3D parallelism on a homogeneous cluster (Megatron-LM recipe): TP = devices per node
    (at most max_tp), the fewest pipeline stages whose uniform layer split fits, the rest data
    parallel, micro-batch size 1."""
    cm = CostModel(problem)
    stats = Stats()
    (os,) = type_options(problem).values()
    L = problem.model.num_layers
    for o in sorted([o for o in os if o.tp == max(x.tp for x in os)], key=lambda o: o.stages):
        m = problem.global_batch // o.dp
        if o.stages > min(L, problem.max_stages) or problem.global_batch % o.dp or m > problem.max_microbatches:
            continue
        st = Structure(cm, list(o.shapes), m)
        stats.structures += 1
        layers = uniform_layers(L, o.stages)
        t = st.time(layers)
        stats.evaluated += 1
        if t < INF:
            return _finish(problem, (t, st, layers), stats, "3d", Status.FEASIBLE)
    raise InfeasibleError(_why_infeasible(problem))


SEARCH_RULES = {
    "cuts": one_of("ridge", "all"),  # the layer mapping: ridge walk, or every cut set
    "prune": flag(),
    # a pipeline depth no problem's max_stages exceeds (COUNT_LIMITS); one above the problem's finds no structure
    "num_stages": integer(1, COUNT_LIMITS["max_stages"], none="any depth"),
    "workers": integer(1, MAX_WORKERS, none="automatic: every core, at most 8, when the space is large enough"),
}
"""The domain of the search's options, which registry.check_options enforces."""

register_solver("poseidon", "poseidon", solve_poseidon, role="paper", default=True,
                description="stage structures best-first by a proven DAG lower bound, ridge layer mapping",
                option_rules=SEARCH_RULES)
register_solver("poseidon", "exhaustive", solve_exhaustive, role="exact", applicable=_exhaustive_applies,
                description="every stage structure of the same space, no pruning (option cuts=all: every cut set)",
                option_rules={k: SEARCH_RULES[k] for k in ("cuts", "num_stages")})
register_solver("poseidon", "megatron", solve_megatron, role="baseline",
                description="homogeneous-style: equal stages and degrees, uniform layers")
register_solver("poseidon", "metis", solve_metis, role="baseline",
                description="Metis-style: DP-first, proportional layers, closed-form cost")
register_solver("poseidon", "3d", solve_3d, role="baseline",
                applicable=lambda p: None if len(p.cluster.capacity()) == 1 else "needs a homogeneous cluster",
                description="classic 3D parallel config: TP per node, fewest stages that fit")

from gpuplan.solvers.poseidon import config as _config  # noqa: E402, F401  (registers the "config" name)
