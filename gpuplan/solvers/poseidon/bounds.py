"""Poseidon's combo-level lower bounds, computed for whole blocks of combos at once (numpy) before any
`Structure` is built, and per type order (first and last type) before a structure of a combo is built.

A combo is (m, one TypeOption per device type used). Every structure of it (a type order and an
interleave v) has, for every layer mapping, an iteration time of at least (docs/poseidon.md):

* W1: every stage's m forwards and backwards: T >= m n_s c_s (water-filling of the layers over the
  stages under their memory caps);
* W2: micro-batch 0's forward and backward through the first chunks of every stage but the last, then
  the last stage's whole chain: T >= sum_{s<last} n_s c_s / v + m n_last c_last + embedding + m head;
* RT0: micro-batch 0's round trip through every stage, then the rest of stage 0's chain:
  T >= sum_{s>0} n_s (f_s + g_s / v) + n_0 (f_0 + k_F f_0 + m g_0) + embedding + head.

Each is relaxed to hold whatever the order: a stage's memory cap is the most layers it holds at any
position (one micro-batch in flight, no embedding or head, the thriftiest recomputation), the sends
and all-reduces count zero, the embedding and head their cheapest type unless the order fixes it;
W2 is minimised over which type is last, RT0 over which is first, each a greedy (exact) linear
minimisation over real layer counts in [v, cap]. The combo's bound is the smallest over its allowed
interleaves of max(W1, W2, RT0); a type order's bound fixes the first and last type. All are lower
bounds of `Structure.lower_bound`'s paths, hence of every layer mapping's time, and are shaved by
1e-9 relative for rounding. Sends, all-reduces and memory positions make the structure-level bounds
tighter; these only have to be cheap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuplan.models.poseidon import CostModel, PoseidonProblem, stage_memory

INF = math.inf
SHAVE = 1 - 1e-9  # bounds are multiplied by this: a float rounding never prunes a tie
BLOCK_ROWS = 1 << 17  # combos per numpy block (the product of the inner types' options)


@dataclass
class ComboEntry:
    """A combo that may beat the cutoff: (m, options of the types used, in cluster type order), its
    bound (seconds) and, per allowed interleave v, (W1, W2 per last type, RT0 per first type) indexed
    by position in `used` (empty for single-stage combos, whose bound is 0)."""

    bound: float
    m: int
    used: tuple[Any, ...]
    terms: dict[int, tuple[float, list[float], list[float]]] = field(default_factory=dict)

    def order_bound(self, order: tuple[int, ...], v: int, sends_s: float = 0.0) -> float:
        """Return a lower bound (seconds) on every layer mapping of the structure with the types in
        `order` (positions in `used`) at interleave v; inf when v is not allowed or cannot fit.
        `sends_s`: the sum of the structure's sends between consecutive stages (`order_sends`),
        which W2 and RT0 each pay twice (micro-batch 0's forward, then a backward down the pipeline)."""
        if not self.terms:
            return 0.0
        t = self.terms.get(v)
        if t is None:
            return INF
        w1, w2, rt0 = t
        return max(w1, max(w2[order[-1]], rt0[order[0]]) + 2 * sends_s * SHAVE)


@dataclass
class ComboList:
    """The combos of the space whose bound is below the cutoff, in bound order (ties: listing order),
    with the structure counts of those left out: pruned by the bound, or infeasible (no memory fits)."""

    entries: list[ComboEntry]
    structures: int = 0
    pruned: int = 0
    infeasible: int = 0
    cut: bool = False  # the deadline passed while listing (the entries are then incomplete)


def option_terms(cm: CostModel, o: Any, m: int) -> tuple[float, float, float, float, float, float, float] | None:
    """Return (c, f, g, cap, embedding, head, a) of a stage of option `o` at m micro-batches: block
    forward+backward, forward and backward seconds (no recomputation), the most blocks it holds at
    any position (one micro-batch in flight, no embedding or head, the thriftiest recomputation
    mode), the embedding's and head's forward+backward seconds on it, and the least per-block
    all-reduce + optimizer seconds of its stages at any position (`Structure.a`, first and last
    included); None when its data-parallel degree does not divide the batch into m micro-batches.
    Cached on the cost model."""
    cache = cm.__dict__.setdefault("_bound_terms", {})
    key = (id(o), m)
    if key not in cache:
        G = cm.p.global_batch
        if G % (m * o.dp):
            cache[key] = None
        else:
            b = G // (m * o.dp)
            f, g = cm.layer(o.device_type, o.tp, b)
            cap_bytes = cm.dev(o.device_type).memory_bytes * cm.p.memory_fraction
            sh = o.shapes[0]
            thrifty = "full" if cm.p.recompute == "auto" else cm.p.recompute
            base = stage_memory(cm, sh, 0, b, 1, 3, 1, thrifty)
            per = stage_memory(cm, sh, 1, b, 1, 3, 1, thrifty) - base
            cap = min(cm.p.model.num_layers, int((cap_bytes - base) // per)) if cap_bytes >= base + per else 0
            emb = sum(cm.extras(o.device_type, o.tp, b, True, False))
            head = sum(cm.extras(o.device_type, o.tp, b, False, True))
            cache[key] = (f + g, f, g, float(cap), emb, head, _least_slope(cm, o))
    return cache[key]  # type: ignore[no-any-return]


SLOPE_MAX_STAGES = 8  # options with more stages take a = 0 in W1 (each stage's slope costs L collective times)


def _least_slope(cm: CostModel, o: Any) -> float:
    """Return the least per-block all-reduce + optimizer seconds (`Structure.a`, >= 0) of option o's
    stages at any pipeline position (inner, first, last) in a pipeline of two or more stages; 0 (still
    a lower bound) for options of more than SLOPE_MAX_STAGES stages."""
    from gpuplan.solvers.poseidon import _min_slope

    if o.stages > SLOPE_MAX_STAGES:
        return 0.0
    return max(0.0, min(_min_slope(cm, x, first, last, 3, cm.tail_s(x, 0, first, last, 3))
                        for x in o.shapes for first, last in ((False, False), (True, False), (False, True))))


def _min_linear(coef: np.ndarray, count: np.ndarray, hi: np.ndarray, lo: float, spare: np.ndarray
                ) -> np.ndarray:
    """Return per row min of sum_j coef_j x_j over real x with count_j stages of group j each holding
    between lo and hi_j layers, lo-holding first, then `spare` more layers to the cheapest groups
    (greedy, exact for this LP); inf where the spare does not fit. Arrays are (rows, groups)."""
    room = count * np.maximum(hi - lo, 0.0)
    order = np.argsort(coef, axis=1, kind="stable")
    c = np.take_along_axis(coef, order, axis=1)
    r = np.take_along_axis(room, order, axis=1)
    before = np.cumsum(r, axis=1) - r
    take = np.clip(spare[:, None] - before, 0.0, r)
    total = (coef * count).sum(axis=1) * lo + (take * np.where(r > 0, c, 0.0)).sum(axis=1)
    return np.where(spare <= r.sum(axis=1) + 1e-9, total, INF)


def _end_bound(which: str, c: np.ndarray, f: np.ndarray, g: np.ndarray, k: np.ndarray, capv: np.ndarray,
               used: np.ndarray, m: int, v: int, spare: np.ndarray, e_other: np.ndarray, e_own: np.ndarray,
               kf: np.ndarray | None = None) -> np.ndarray:
    """Return (rows, types) seconds: per type t used, W2 with a stage of t last ("W2": its whole chain
    m c_t, the others c / v; plus the cheapest embedding `e_other` and m x t's head `e_own`) or RT0 with
    a stage of t first ("RT0": its chain f_t + k_F f_t + m g_t, the others f + g / v; plus t's
    embedding `e_own` and the cheapest head `e_other`), minimised over real layer counts in [v, capv];
    inf where t is unused."""
    rows, T = c.shape
    out = np.full((rows, T), INF)
    one = np.ones((rows, 1))
    for t in range(T):
        has = used[:, t]
        if not has.any():
            continue
        kk = np.maximum(k - (np.arange(T) == t), 0)
        cnt = np.concatenate([kk, one], axis=1)
        hi = np.concatenate([capv, capv[:, t:t + 1]], axis=1)
        if which == "W2":
            coef = np.concatenate([c / v, m * c[:, t:t + 1]], axis=1)
            x = _min_linear(coef, cnt, hi, v, spare) + e_other + m * e_own[:, t]
        else:
            assert kf is not None
            coef = np.concatenate([f + g / v, (f[:, t] + kf * f[:, t] + m * g[:, t])[:, None]], axis=1)
            x = _min_linear(coef, cnt, hi, v, spare) + e_own[:, t] + e_other
        out[:, t] = np.where(has, x, INF)
    return out


def _water_fill(w: np.ndarray, count: np.ndarray, cap: np.ndarray, L: int) -> np.ndarray:
    """Return per row a lower bound on the smallest W with sum_j count_j min(cap_j, floor(W / w_j)) >= L,
    the integer min-max of the layer counts (bisection: the lower end never holds L layers, so it
    stays below; inf where sum_j count_j cap_j < L)."""
    ok = (count * cap).sum(axis=1) >= L - 1e-9
    lo = np.zeros(len(w))
    hi = np.where(count > 0, cap * w, 0.0).max(axis=1)
    wsafe = np.where(w > 0, w, 1.0)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        held = (count * np.where(w > 0, np.minimum(cap, np.floor(mid[:, None] / wsafe)), cap)).sum(axis=1)
        good = held >= L
        hi = np.where(good, mid, hi)
        lo = np.where(good, lo, mid)
    return np.where(ok, lo, INF)


def _kf(problem: PoseidonProblem, S: np.ndarray, m: int, v: int) -> np.ndarray:
    """Return stage 0's forwards after micro-batch 0's backward (chunk forwards / v with interleave v):
    Structure.round_trip's k_F at q = 0, per row of stage counts S."""
    if v > 1:
        warm = np.where(S == m, m * v, np.minimum(m * v, 2 * (S - 1) + (v - 1) * S))
        return np.maximum(0, m * v - warm - 1) / v
    if problem.schedule == "gpipe":
        return np.zeros(len(S))
    return np.maximum(0, m - np.minimum(S - 1, m) - 1).astype(float)


def list_combos(problem: PoseidonProblem, cm: CostModel, opts: dict[str, list[Any]], num_stages: int | None,
                cutoff: float, deadline: float = INF) -> ComboList:
    """Return the combos of the space (those with exactly `num_stages` stages when given) whose bound is
    below `cutoff` (seconds), in bound order, and the structure counts of the rest, computing the
    bounds block by block (numpy) without listing every combo; the clock (`perf_counter` against
    `deadline`) is read before every block."""
    L, limit = problem.model.num_layers, min(problem.max_stages, problem.model.num_layers)
    types = list(opts)
    T = len(types)
    from gpuplan.solvers.poseidon import microbatch_counts

    out = ComboList([])
    found: list[tuple[float, int, ComboEntry]] = []
    # inner types: the last ones whose option product stays within a block; the rest loop here
    inner, rows = T, 1
    while inner > 0 and rows * (len(opts[types[inner - 1]]) + 1) <= BLOCK_ROWS:
        inner -= 1
        rows *= len(opts[types[inner]]) + 1
    inner = min(inner, T - 1) if T else 0
    outer_types, inner_types = types[:inner], types[inner:]
    vmax = problem.max_interleave if problem.schedule == "1f1b" else 1
    seq = 0
    for m in microbatch_counts(problem):
        if time.perf_counter() > deadline:  # the option terms of one m cost seconds at 1T on 3,072 GPUs
            out.cut = True
            break
        # per type: a row per choice (0: unused), columns c, f, g, cap, emb, head, k, valid
        tabs = []
        for t in types:
            rows_t = [(0.0,) * 7 + (0, True)]
            for o in opts[t]:
                if time.perf_counter() > deadline:
                    out.cut = True
                    break
                x = option_terms(cm, o, m)
                rows_t.append((*x, o.stages, True) if x is not None else (0.0,) * 7 + (o.stages, False))
            tabs.append(rows_t)
        if out.cut:
            break
        grids = np.meshgrid(*[np.arange(len(tabs[j])) for j in range(inner, T)], indexing="ij")
        inner_idx = np.stack([g.ravel() for g in grids], axis=1) if grids else np.zeros((1, 0), dtype=int)
        inner_arr = [np.asarray([r[:8] for r in tabs[j]], dtype=float) for j in range(inner, T)]
        inner_ok = [np.asarray([r[8] for r in tabs[j]]) for j in range(inner, T)]
        for prefix in np.ndindex(*[len(tabs[j]) for j in range(inner)]):
            if time.perf_counter() > deadline:
                out.cut = True
                break
            if any(not tabs[j][i][8] for j, i in enumerate(prefix)):
                continue
            n = len(inner_idx)
            vals = np.zeros((n, T, 8))
            for j, i in enumerate(prefix):
                vals[:, j, :] = tabs[j][i][:8]
            ok = np.ones(n, dtype=bool)
            for jj in range(T - inner):
                vals[:, inner + jj, :] = inner_arr[jj][inner_idx[:, jj]]
                ok &= inner_ok[jj][inner_idx[:, jj]]
            k = vals[:, :, 7]
            S = k.sum(axis=1)
            used = np.concatenate([np.tile(np.asarray(prefix, dtype=int) > 0, (n, 1)), inner_idx > 0], axis=1)
            ok &= (S >= 1) & (S <= limit)
            if num_stages is not None:
                ok &= S == num_stages
            if not ok.any():
                continue
            idx = np.nonzero(ok)[0]
            vals, k, S, used = vals[idx], k[idx], S[idx], used[idx]
            full_idx = np.concatenate([np.tile(np.asarray(prefix, dtype=int), (len(idx), 1)), inner_idx[idx]], axis=1)
            c, f, g, cap, emb, head, a = (vals[:, :, i] for i in range(7))
            nused = used.sum(axis=1)
            Si = S.astype(int)
            n_inter = np.zeros(len(idx), dtype=int)
            allowed = {1: np.ones(len(idx), dtype=bool)}
            for v in range(2, vmax + 1):
                if L % v:
                    continue
                allowed[v] = (Si >= 2) & (m % Si == 0) & (L // v >= Si)
                n_inter += allowed[v]
            size = np.asarray([math.factorial(u) for u in nused]) * (1 + n_inter)
            out.structures += int(size.sum())
            big = np.where(used, 1e300, INF)
            min_emb = np.where(used, emb, big).min(axis=1)
            min_head = np.where(used, head, big).min(axis=1)
            cut = cutoff / SHAVE  # a row whose bound reaches this is pruned once shaved
            n = len(idx)
            bound = np.full(n, INF)
            per_v: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            bvs = []
            for v, rows_ok in allowed.items():
                capv = np.floor(cap / v) * v
                fits = rows_ok & np.all(np.where(used, capv >= v, True), axis=1) & ((k * capv).sum(axis=1) >= L) \
                    & (S * v <= L)
                w2 = np.full((n, T), INF)
                rt0 = np.zeros((n, T))  # 0 (no bound) where W2 already prunes the row
                sub = np.nonzero(fits)[0]
                if len(sub):
                    args = (c[sub], f[sub], g[sub], k[sub], capv[sub], used[sub], m, v, L - S[sub] * v)
                    w2[sub] = _end_bound("W2", *args, min_emb[sub], head[sub])
                    sub3 = sub[w2[sub].min(axis=1) < cut]
                    if len(sub3):
                        args = (c[sub3], f[sub3], g[sub3], k[sub3], capv[sub3], used[sub3], m, v, L - S[sub3] * v)
                        rt0[sub3] = _end_bound("RT0", *args, min_head[sub3], emb[sub3],
                                               _kf(problem, Si[sub3], m, v))
                per_v[v] = (w2, rt0, fits)
                bv = np.where(fits, np.maximum(w2.min(axis=1), rt0.min(axis=1)), INF)
                bvs.append(bv)
                bound = np.minimum(bound, bv)
            w1 = np.zeros(n)  # 0 (no bound) where the other bounds already prune the row
            need = np.nonzero(bound < cut)[0]
            if len(need):
                w1[need] = _water_fill(m * c[need] + a[need], k[need], cap[need], L)
                bound[need] = np.min(np.stack([np.maximum(w1[need], bv[need]) for bv in bvs]), axis=0)
            single = S == 1
            bound = np.where(single, np.where((k * cap).sum(axis=1) >= L, 0.0, INF), bound)
            bound = bound * SHAVE
            out.infeasible += int(size[bound == INF].sum())
            keep = bound < cutoff
            out.pruned += int(size[(bound >= cutoff) & (bound < INF)].sum())
            for r in np.nonzero(keep)[0]:
                combo_used = tuple(opts[types[j]][full_idx[r, j] - 1] for j in range(T) if full_idx[r, j] > 0)
                cols = [j for j in range(T) if full_idx[r, j] > 0]
                terms: dict[int, tuple[float, list[float], list[float]]] = {}
                if not single[r]:
                    for v, (w2, rt0, fits) in per_v.items():
                        if fits[r]:
                            terms[v] = (float(w1[r]) * SHAVE, [float(w2[r, j]) * SHAVE for j in cols],
                                        [float(rt0[r, j]) * SHAVE for j in cols])
                found.append((float(bound[r]), seq, ComboEntry(float(bound[r]), m, combo_used, terms)))
                seq += 1
        if out.cut:
            break
    found.sort(key=lambda x: (x[0], x[1]))
    out.entries = [e for _, _, e in found]
    return out
