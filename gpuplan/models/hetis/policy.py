"""Hetis and its baselines as policies over the shared serving engine (gpuplan.sim.serving.simulate).

One engine policy serves one (virtual) replica: Sarathi-style stall-free batching (every running
decode, then prefill chunks under the token budget, FCFS, KV admission with recompute preemption)
with a per-device KV cache. Where a request's KV lives is the layout's business:

  tensor-parallel      fixed fractions: a stage's devices hold layers_s / L of its KV, split evenly
                       over their tp ranks (uniform TP, HexGen-style stages, Splitwise pools)
  water-filling        Hetis: each admitted request's KV heads go to the attention devices by the
                       water-filling dispatch (gpuplan.models.hetis.dispatch); with re-dispatch
                       (Stage C), heads move off the slowest device when max/mean > theta, paying
                       the migrated bytes over the link
  memory-proportional  the same devices, every request split by one static head vector proportional
                       to each device's KV capacity (the heads-by-memory baseline)

Hetis' data-parallel replicas pool their decode attention over ALL GPUs (their own primaries, the
attention workers and each other's primaries): their engines run together (`_run_pooled`), sharing
each device's KV memory (one ledger) and its time (processor sharing on the other replicas' moving-
average load: `KvPool`); a head off the replica's own primaries pays the link (per-layer messages,
the prompt KV shipped at prefill). A replica with pp
pipeline stages runs pp interleaved batches (virtual engines, vLLM-style): each
gets 1/pp of the replica's requests (and of its KV memory in tensor-parallel layouts; pooled engines
share one ledger of whole devices), and its token step is
max(sum of stage times, pp * slowest stage). Data-parallel replicas (and virtual engines) get the
trace by smooth weighted round robin on their shares; a phase-split plan (Splitwise) runs the prefill
pools first, then ships each request's KV to a decode pool (bytes / link bandwidth + latency, the
transfers queued on the links between the pools: `transfer_arrivals_s`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.models.hetis.cost import (AttentionCost, StageCost, attention_cost, gpus_of, head_bytes_per_token,
                                       kv_capacity, kv_fractions_tp, link_of, prefill_attention_stage_s,
                                       stage_costs)
from gpuplan.models.hetis.dispatch import DispatchInstance, water_filling
from gpuplan.sim.core import SimulationWatch
from gpuplan.sim.latency import kv_bytes_per_token
from gpuplan.sim.serving import EngineState, Iteration, Requests, SimResult, apply_iteration, simulate

_EMPTY = np.zeros(0, dtype=np.int64)
WATERMARK = 0.01  # fraction of each device's KV kept free at admission (vLLM's default watermark)


@dataclass
class EngineSpec:
    """What one virtual engine runs: its dense stages, the devices holding its KV (G) with their capacity
    (bytes, this engine's share), the attention cost, the layout mode and its parameters."""

    stages: list[StageCost]
    kv_ids: np.ndarray
    cap_bytes: np.ndarray
    attn: AttentionCost
    mode: str                              # tensor-parallel | water-filling | memory-proportional
    fractions: np.ndarray | None           # tensor-parallel: KV fraction per device
    groups: list[np.ndarray] | None        # tensor-parallel: kv indices of each stage
    static_heads: np.ndarray | None        # memory-proportional: heads per device
    heads: int
    kv_bytes_token: float
    head_bytes_token: float
    o_pred: float
    token_budget: int
    max_batch: int
    prefill_free: bool = False
    redispatch_every_s: float = 0.0
    theta: float = 1.2
    mig_bw: np.ndarray | None = None       # G x G B/s
    mig_lat: np.ndarray | None = None      # G x G s
    ship_bw: np.ndarray | None = None      # B/s from the engine's primaries to each KV device (inf: a primary)
    ship_lat: np.ndarray | None = None     # s, the same links' latency
    own: np.ndarray | None = None          # bool per KV device: one of this replica's primaries
    foreign: np.ndarray | None = None      # bool per KV device: another replica's primary
    replica: int = 0                       # index of the replica in the plan (pooled engines)


class KvPool:
    """What the engines of every data-parallel replica share when decode attention is pooled over all
    GPUs (the paper's dispatch): each device's KV memory (every engine's KV bytes on it count against
    its capacity) and its time. Per engine: KV bytes in use per device, and the fraction of each
    device's time it keeps busy (attention, and dense work on its own primaries), a moving average over
    LOAD_WINDOW_S of its iterations (idle time counts as zero), from which the others' load on a device
    is read: processor sharing stretches a replica's work on a device by 1 / (1 - the others' load)."""

    def __init__(self, cap_bytes: np.ndarray, replicas: list[int]) -> None:
        E, G = len(replicas), len(cap_bytes)
        self.cap_bytes = cap_bytes
        self.replica = np.asarray(replicas, dtype=np.int64)
        self.used = np.zeros((E, G))
        self.util = np.zeros((E, G))
        self.end_s = np.zeros(E)
        self._others = [self.replica != self.replica[e] for e in range(E)]  # engines of other replicas
        self._alone = [not o.any() for o in self._others]

    def others_used(self, e: int) -> np.ndarray:
        """Return the KV bytes per device every other engine holds."""
        return self.used.sum(axis=0) - self.used[e]

    def record(self, e: int, busy_s: np.ndarray, start_s: float, dur_s: float) -> None:
        """Fold engine e's iteration (busy seconds per device from start_s for dur_s) into its load."""
        idle = np.exp(-max(0.0, start_s - self.end_s[e]) / LOAD_WINDOW_S)
        a = np.exp(-dur_s / LOAD_WINDOW_S)
        self.util[e] = self.util[e] * idle * a + (busy_s / dur_s) * (1 - a)
        self.end_s[e] = start_s + dur_s

    def others_load(self, e: int, now_s: float) -> np.ndarray:
        """Return, per device, the fraction of its time the engines of other replicas keep it busy around
        `now_s` (their moving averages, decayed over their idle time since), capped at MAX_FOREIGN_LOAD."""
        if self._alone[e]:
            return np.zeros(self.used.shape[1])
        other = self._others[e]
        decay = np.exp(-np.maximum(0.0, now_s - self.end_s[other]) / LOAD_WINDOW_S)
        return np.minimum((self.util[other] * decay[:, None]).sum(axis=0), MAX_FOREIGN_LOAD)


# Whether a replica's heads may go to other replicas' primaries (the paper's dispatch over all GPUs: on).
# Off, a replica dispatches over its own primaries and the attention workers only. Measured on the paper
# cluster (13B, 2,000 ShareGPT requests, A100 4 x tp1 | 3090 2 x tp2, P100s as workers): 74.1 req/s on,
# 57.8 off, 77.2 for the static engine on the same layout; Stage A keeps the static engine where it serves
# more (gpuplan.solvers.hetis).
POOL_FOREIGN_PRIMARIES = True
MAX_FOREIGN_LOAD = 0.95  # a device never gives another replica less than 5 % of its time
LOAD_WINDOW_S = 1.0      # the time constant (s) of an engine's moving-average load on a device


class HetisEnginePolicy:
    """The engine policy of one virtual replica (see the module docstring); `problem` gives the model."""

    def __init__(self, problem: Any, spec: EngineSpec, n_requests: int, pool: KvPool | None = None,
                 engine: int = 0) -> None:
        self.p = problem
        self.s = spec
        self.pool = pool
        self.engine = engine
        self.shipped_bytes = 0.0
        G = len(spec.kv_ids)
        self.F = np.zeros((n_requests, G))
        self.n = np.zeros((n_requests, G), dtype=np.int64)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.last_redispatch_s = 0.0
        self.migrated_bytes = 0.0
        self.moves = 0
        self.dispatches = 0
        self._limit = spec.cap_bytes * (1 + 1e-9) + 1e-6  # bytes per device past which a request is preempted

    # -- engine callbacks

    def on_arrival(self, idx: np.ndarray, state: EngineState) -> None:
        """Queue arrivals in order."""
        self.waiting.extend(idx.tolist())

    def on_finish(self, idx: np.ndarray, state: EngineState) -> None:
        """Drop finished requests from the batch."""
        done = set(idx.tolist())
        self.running = [i for i in self.running if i not in done]

    # -- placement

    def _loads(self, dec: np.ndarray, state: EngineState,
               kv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return (whole-token KV read per device, heads per device) of the decoding requests; `kv`: their
        KV tokens when the caller has them (state.kv_tokens(dec))."""
        if not len(dec):
            G = len(self.s.kv_ids)
            return np.zeros(G), np.zeros(G)
        ctx = (state.kv_tokens(dec) if kv is None else kv).astype(float)
        share = ctx @ self.F[dec]
        heads = np.add.reduce(self.n[dec], axis=0).astype(float) if self.s.mode != "tensor-parallel" else \
            self.F[dec].sum(axis=0) * self.s.heads
        return share, heads

    def _place(self, i: int, need: int, used: np.ndarray, share: np.ndarray, heads: np.ndarray) -> np.ndarray | None:
        """Return request i's KV fraction per device (setting its head counts), or None when it does not
        fit now. `used` is the KV bytes in use per device; share/heads the decoding loads."""
        s = self.s
        room = s.cap_bytes * (1 - WATERMARK) - used
        if self.pool is not None:
            room = room - self.pool.others_used(self.engine)
        if s.foreign is not None and not POOL_FOREIGN_PRIMARIES:
            room = np.where(s.foreign, 0.0, room)  # another replica's primaries serve that replica
        if s.mode == "tensor-parallel":
            f = s.fractions
        elif s.mode == "memory-proportional":
            self.n[i] = s.static_heads
            f = s.static_heads / s.heads
        else:
            H = s.heads
            work = s.attn.s_per_token / H * s.attn.storage_factor
            base = work * self._slow
            load = base * H * share
            if s.foreign is not None:
                # a head on another replica's primary also delays that replica's step by its work there
                # (processor sharing): the dispatch weighs that cost too, not only its own time
                base = base + np.where(s.foreign, work, 0.0)
            ctx = need + s.o_pred / 2.0
            if s.ship_bw is not None:
                # a head off the replica's own primaries ships its prompt KV there once (it delays the
                # prefill step); spread over the request's predicted decode steps, per head-token of context
                ship = np.where(np.isfinite(s.ship_bw), s.ship_lat + need * s.head_bytes_token / s.ship_bw, 0.0)
                base = base + ship / max(1.0, s.o_pred) / ctx
            nvec = None
            for mem in (need + s.o_pred, float(need)):
                inst = DispatchInstance(base, s.attn.c0_s, s.attn.c1_s_per_head, load, heads,
                                        np.maximum(room, 0.0) / s.head_bytes_token,
                                        np.array([ctx]), np.array([mem]), H)
                placed = water_filling(inst)
                if placed is not None:
                    nvec = placed[0]
                    break
            if nvec is None:
                return None
            self.dispatches += 1
            self.n[i] = nvec
            f = nvec / H
        # only the devices that take some of the request: another device may be over-full for a moment
        # (other engines' requests grew into it) without refusing a request that puts nothing there
        if np.any((f > 0) & (f * need * s.kv_bytes_token > room + 1e-6)):
            return None
        return f

    def _redispatch(self, dec: np.ndarray, state: EngineState) -> float:
        """Stage C: move heads off the slowest device while max/mean > theta; return migration seconds."""
        s = self.s
        if s.mode != "water-filling" or not s.redispatch_every_s or not len(dec):
            return 0.0
        if state.now_s - self.last_redispatch_s < s.redispatch_every_s:
            return 0.0
        self.last_redispatch_s = state.now_s
        share, heads = self._loads(dec, state)
        t = self._times(share, heads)
        active = s.cap_bytes > 0
        if not np.any(active) or t.max() <= s.theta * t[active].mean():
            return 0.0
        ctx = state.kv_tokens(dec).astype(float)
        used = (self.F[dec] * (ctx + 1)[:, None]).sum(axis=0) * s.kv_bytes_token
        per = s.attn.s_per_token / s.heads * s.attn.storage_factor * self._slow
        cap = s.cap_bytes * (1 - WATERMARK) - (self.pool.others_used(self.engine) if self.pool is not None else 0.0)
        if s.foreign is not None and not POOL_FOREIGN_PRIMARIES:
            cap = np.where(s.foreign, 0.0, cap)
        seconds = 0.0
        for _ in range(2 * s.heads):
            g = int(np.argmax(t))
            on = np.flatnonzero(self.n[dec, g] > 0)
            if not len(on):
                break
            k = on[int(np.argmax(ctx[on]))]
            r = int(dec[k])
            nb = ctx[k] * s.head_bytes_token
            gain = per * ctx[k] + s.attn.c1_s_per_head
            cand = t + gain + np.where(heads > 0, 0.0, s.attn.c0_s)
            cand = np.where(used + nb <= cap, cand, np.inf)
            cand[g] = np.inf
            h = int(np.argmin(cand))
            if not np.isfinite(cand[h]) or max(cand[h], t[g] - gain[g]) >= t[g]:
                break
            # a move pays its migration once and saves on every remaining decode step (predicted output
            # left): make it only when the saving over those steps exceeds the migration time
            mig = s.mig_lat[g, h] + nb / s.mig_bw[g, h]
            left = max(1.0, s.o_pred - float(state.generated[r]))
            if (t[g] - max(cand[h], t[g] - gain[g])) * left <= mig:
                break
            self.n[r, g] -= 1
            self.n[r, h] += 1
            self.F[r] = self.n[r] / s.heads
            t[g] -= gain[g]
            t[h] = cand[h]
            heads[g] -= 1
            heads[h] += 1
            used[g] -= nb
            used[h] += nb
            seconds += mig
            self.migrated_bytes += nb
            self.moves += 1
        return seconds

    @property
    def _slow(self) -> np.ndarray | float:
        """Return per KV device the factor 1 / (1 - other replicas' load on it) of this iteration (1 alone)."""
        return getattr(self, "_slow_now", 1.0)

    def _times(self, share: np.ndarray, heads: np.ndarray) -> np.ndarray:
        """Return per-device decode attention + message seconds: the devices' work stretched by the time
        other replicas keep them busy (messages are link time, not stretched)."""
        s = self.s
        work = s.attn.s_per_token * share * s.attn.storage_factor
        msg = np.where(heads > 0, s.attn.c0_s + s.attn.c1_s_per_head * heads, 0.0)
        return work * self._slow + msg

    # -- the iteration

    def next_iteration(self, state: EngineState) -> Iteration | None:
        """Return the next iteration: running decodes, prefill chunks, admissions; its duration from the
        cost model (dense stages, prefill attention, decode attention per device, migrations)."""
        s = self.s
        pool = self.pool
        others = pool.others_used(self.engine) if pool is not None else 0.0
        self._slow_now = 1.0 / (1.0 - pool.others_load(self.engine, state.now_s)) if pool is not None else 1.0
        run = np.asarray(self.running, dtype=np.int64)
        limit = self._limit
        while len(run):
            # KV tokens after this iteration (a decoding request adds one), bytes per device
            kv_run = state.kv_tokens(run)
            dec_flag = state.prefilled[run] >= state.prefill_target[run]
            used = np.add.reduce((kv_run + dec_flag)[:, None] * self.F[run], axis=0) * s.kv_bytes_token
            # an over-full device is this engine's business only where its own requests hold KV (another
            # replica's growth on a device it does not use is no reason to preempt its requests)
            if not ((used + others > limit) & (used > 0)).any():
                break
            victim = int(run[-1])
            state.preempt(victim)
            self.running.pop()
            self.waiting.appendleft(victim)
            run = run[:-1]
        if len(run):
            decoding = run[dec_flag]
            share, heads = self._loads(decoding, state, kv_run[dec_flag])
        else:
            decoding = _EMPTY
            used = np.zeros(len(s.kv_ids))
            share, heads = self._loads(decoding, state)
        budget = s.token_budget - len(decoding)
        chunks: list[tuple[int, int]] = []
        for i in self.running:
            if budget <= 0:
                break
            left = int(state.prefill_target[i] - state.prefilled[i])
            if left > 0:
                c = left if s.prefill_free else min(budget, left)
                chunks.append((i, c))
                budget -= 1 if s.prefill_free else c
        while budget > 0 and self.waiting and len(self.running) < s.max_batch:
            i = self.waiting[0]
            need = int(state.prefill_target[i])
            f = self._place(i, need, used, share, heads)
            if f is None:
                if not self.running and not chunks and (pool is None or not np.any(others > 0)):
                    self.waiting.popleft()  # does not fit even alone: refuse rather than stall
                    state.reject(i)
                    continue
                break
            self.waiting.popleft()
            self.F[i] = f
            self.running.append(i)
            used = used + f * need * s.kv_bytes_token
            c = need if s.prefill_free else min(budget, need)
            chunks.append((i, c))
            budget -= 1 if s.prefill_free else c
        if pool is not None:
            pool.used[self.engine] = used
        if not len(decoding) and not chunks:
            return None
        p_idx = np.array([c[0] for c in chunks], dtype=np.int64)
        p_tok = np.array([c[1] for c in chunks], dtype=np.int64)
        dense_tokens = len(decoding) + (len(chunks) if s.prefill_free else int(p_tok.sum()))
        stage_t = [sc.time_s(dense_tokens) for sc in s.stages]
        if len(chunks) and not s.prefill_free:
            pos = state.prefilled[p_idx]
            stage_t = [t + prefill_attention_stage_s(self.p, sc, p_tok, pos) for t, sc in zip(stage_t, s.stages)]
        dense_busy = np.zeros(len(s.kv_ids))
        if pool is not None and s.own is not None:
            # my primaries also run other replicas' attention heads: my dense work shares their time
            for k, ks in enumerate(self._stage_kv_pos()):
                dense_busy[ks] = stage_t[k]
                slow = float(np.max(self._slow_now[ks])) if ks else 1.0
                stage_t[k] *= slow
        times = self._times(share, heads) if len(decoding) else np.zeros(len(s.kv_ids))
        pp = len(stage_t)
        if s.mode == "tensor-parallel":
            for k, grp in enumerate(s.groups or []):
                stage_t[k] += float(times[grp].max()) if len(grp) else 0.0
            step = max(sum(stage_t), pp * max(stage_t))
            attn = 0.0
        else:
            attn = float(times.max()) if len(times) else 0.0
            step = max(sum(stage_t) + attn, pp * max(max(stage_t), attn))
            step = max(step, self._ship_s(p_idx, p_tok))
        step += self._redispatch(decoding, state)
        if pool is not None:
            alone = s.attn.device_times(share, heads) if len(decoding) else np.zeros(len(s.kv_ids))
            busy = alone - np.where(heads > 0, s.attn.c0_s + s.attn.c1_s_per_head * heads, 0.0) + dense_busy
            pool.record(self.engine, np.minimum(busy, step), state.now_s, step)
        return Iteration(step, p_idx, p_tok, decoding,
                         {"decodes": float(len(decoding)), "prefill_tokens": float(p_tok.sum()), "attention_s": attn})

    def _stage_kv_pos(self) -> list[list[int]]:
        """Return, per dense stage, the positions of its devices among the KV devices (computed once)."""
        if getattr(self, "_stage_pos", None) is None:
            pos_of = {int(d): k for k, d in enumerate(self.s.kv_ids.tolist())}
            self._stage_pos = [[pos_of[d] for d in sc.devices if d in pos_of] for sc in self.s.stages]
        return self._stage_pos

    def _ship_s(self, p_idx: np.ndarray, p_tok: np.ndarray) -> float:
        """Return the seconds to ship this iteration's prefill KV of heads placed off the replica's own
        primaries to the devices holding them (per device: link latency + bytes / bandwidth; the devices'
        links in parallel, overlapped with the iteration's compute layer by layer, so the step is at least
        the slowest). 0 without such heads."""
        s = self.s
        if s.ship_bw is None or not len(p_idx):
            return 0.0
        heads = (self.n[p_idx] * p_tok[:, None]).sum(axis=0).astype(float)  # head-tokens per device
        remote = (heads > 0) & np.isfinite(s.ship_bw)
        if not np.any(remote):
            return 0.0
        nbytes = heads[remote] * s.head_bytes_token
        self.shipped_bytes += float(nbytes.sum())
        return float(np.max(s.ship_lat[remote] + nbytes / s.ship_bw[remote]))


# ---------------------------------------------------------------- building engines from a plan


def _virtual_engines(problem: Any, plan: Any, replica: Any, prefill_free: bool,
                     replica_index: int = 0) -> list[EngineSpec]:
    """Return the EngineSpecs of one replica: pp virtual engines sharing its memory."""
    cfg = problem.config
    stages = stage_costs(problem, replica.stages)
    primaries = [d for st in replica.stages for d in st.devices]
    pp = len(replica.stages)
    hetis_mode = plan.dispatch != "tensor-parallel"
    cap_all = kv_capacity(problem, plan.replicas, plan.attention_devices)
    if hetis_mode:
        # decode attention pooled over ALL GPUs (the paper's dispatch): a replica's heads may go to its own
        # primaries, to attention workers and to other replicas' primaries; the engines of all replicas
        # share each device's KV memory and time (KvPool), and a device that is not one of this
        # replica's primaries is reached over the link (messages per layer, prompt KV shipped at prefill)
        kv_ids = np.array(sorted(plan.attention_devices), dtype=np.int64)
        fractions, groups = None, None
    else:
        fr = kv_fractions_tp(problem, replica)
        kv_ids = np.array(sorted(fr), dtype=np.int64)
        fractions = np.array([fr[d] for d in kv_ids.tolist()])
        pos = {d: k for k, d in enumerate(kv_ids.tolist())}
        groups = [np.array([pos[d] for d in st.devices], dtype=np.int64) for st in replica.stages]
    own = {d: st.layers for st in replica.stages for d in st.devices} if len(replica.stages) > 1 else None
    attn = attention_cost(problem, kv_ids.tolist(), primaries, own)
    # pooled engines share one ledger of every device's whole capacity; tensor-parallel virtual engines
    # split their replica's memory
    cap = np.array([cap_all[d] for d in kv_ids.tolist()]) / (1 if hetis_mode else pp)
    static = None
    if plan.dispatch == "memory-proportional":
        static = np.array([plan.static_heads.get(str(d), 0) for d in kv_ids.tolist()], dtype=np.int64)
    g = {x.id: x for x in gpus_of(problem)}
    G = len(kv_ids)
    bw = np.full((G, G), np.inf)
    lat = np.zeros((G, G))
    for a in range(G):
        for b in range(G):
            if a != b:
                bw[a, b], lat[a, b] = link_of(problem, g[int(kv_ids[a])], g[int(kv_ids[b])])
    own = np.array([d in set(primaries) for d in kv_ids.tolist()], dtype=bool)
    ship_bw = np.full(G, np.inf)
    ship_lat = np.zeros(G)
    for k, d in enumerate(kv_ids.tolist()):
        if not own[k]:  # the nearest of the replica's primaries (lowest latency, then widest)
            ship_bw[k], ship_lat[k] = min((link_of(problem, g[d], g[p]) for p in primaries),
                                          key=lambda t: (t[1], -t[0]))
    spec = EngineSpec(stages, kv_ids, cap, attn, plan.dispatch, fractions, groups, static, cfg.kv,
                      kv_bytes_per_token(cfg, problem.dtype), head_bytes_per_token(problem), problem.o_pred(),
                      problem.token_budget, problem.max_batch, prefill_free,
                      problem.redispatch_every_s if plan.redispatch else 0.0, problem.redispatch_theta, bw, lat,
                      ship_bw if hetis_mode else None, ship_lat if hetis_mode else None, own if hetis_mode else None,
                      replica=replica_index)  # by name: the field before it is `foreign`
    if hetis_mode:
        others = {d for r in plan.replicas if r is not replica for st in r.stages for d in st.devices}
        spec.foreign = np.array([d in others for d in kv_ids.tolist()], dtype=bool)
    return [spec] * pp


def route(n: int, weights: list[float]) -> np.ndarray:
    """Return, for each of n requests in arrival order, the index of the engine it goes to: smooth
    weighted round robin on `weights` (deterministic; engines of weight 0 get nothing)."""
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    cur = np.zeros(len(w))
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        cur += w
        k = int(np.argmax(cur))
        out[i] = k
        cur[k] -= 1.0
    return out


def _sub(req: Requests, idx: np.ndarray, arrival: np.ndarray | None = None,
         output: np.ndarray | None = None) -> tuple[Requests, np.ndarray]:
    """Return the sub-trace of requests idx (optionally with new arrivals / outputs), sorted by arrival,
    and idx in that order."""
    a = req.arrival_s[idx] if arrival is None else arrival
    o = req.output_tokens[idx] if output is None else output
    order = np.argsort(a, kind="stable")
    return Requests(a[order], req.prompt_tokens[idx][order], o[order], req.service[idx][order]), idx[order]


def _run_pool(problem: Any, plan: Any, replicas: list[Any], req: Requests, idx: np.ndarray, prefill_free: bool,
              arrival: np.ndarray | None, output: np.ndarray | None, stats: dict[str, float]) -> dict[str, np.ndarray]:
    """Simulate requests `idx` of `req` over the engines of `replicas`; return per-request arrays
    (first_s, finish_s, rejected) indexed like idx."""
    engines: list[EngineSpec] = []
    weights: list[float] = []
    for k, rep in enumerate(replicas):
        specs = _virtual_engines(problem, plan, rep, prefill_free, k)
        engines += specs
        weights += [rep.share / len(specs)] * len(specs)
    where = route(len(idx), weights)
    first = np.full(len(idx), np.nan)
    finish = np.full(len(idx), np.nan)
    rejected = np.zeros(len(idx), dtype=bool)
    if engines and engines[0].own is not None:  # head-wise dispatch pooled over all GPUs: one joint run
        return _run_pooled(problem, engines, req, idx, where, arrival, output, stats)
    for k, spec in enumerate(engines):
        mine = np.flatnonzero(where == k)
        if not len(mine):
            continue
        sub, order = _sub(req, idx[mine], None if arrival is None else arrival[mine],
                          None if output is None else output[mine])
        pol = HetisEnginePolicy(problem, spec, len(sub))
        res = simulate(sub, pol)
        back = {int(v): j for j, v in enumerate(idx[mine].tolist())}
        pos = np.array([back[int(v)] for v in order.tolist()], dtype=np.int64)
        first[mine[pos]] = res.ttft_s + sub.arrival_s
        finish[mine[pos]] = res.finish_s
        rejected[mine[pos]] = res.rejected
        _add_stats(stats, res.iterations, res.preemptions, pol)
    return {"first_s": first, "finish_s": finish, "rejected": rejected}


@dataclass
class _PooledRun:
    """One engine of a pooled layout as `_run_pooled` advances it: its requests (in arrival order) and
    their positions in the caller's arrays, its policy and state, how many of its requests have arrived,
    and whether it has finished."""

    requests: Requests
    positions: np.ndarray
    policy: "HetisEnginePolicy"
    state: EngineState
    arrived: int = 0
    done: bool = False


def _run_pooled(problem: Any, engines: list[EngineSpec], req: Requests, idx: np.ndarray, where: np.ndarray,
                arrival: np.ndarray | None, output: np.ndarray | None,
                stats: dict[str, float]) -> dict[str, np.ndarray]:
    """Simulate the engines of a pooled layout together (they share each device's KV memory and time):
    the engine whose clock is earliest runs its next iteration (gpuplan.sim.serving's iteration rules,
    per engine); an engine that cannot admit because others hold the memory waits for the next event.
    Return per-request arrays (first_s, finish_s, rejected) indexed like idx."""

    pool = KvPool(engines[0].cap_bytes.copy(), [e.replica for e in engines])
    first = np.full(len(idx), np.nan)
    finish = np.full(len(idx), np.nan)
    rejected = np.zeros(len(idx), dtype=bool)
    runs = []
    for k, spec in enumerate(engines):
        mine = np.flatnonzero(where == k)
        sub, order = _sub(req, idx[mine], None if arrival is None else arrival[mine],
                          None if output is None else output[mine])
        back = {int(v): j for j, v in enumerate(idx[mine].tolist())}
        pos = mine[np.array([back[int(v)] for v in order.tolist()], dtype=np.int64)] if len(mine) else mine
        runs.append(_PooledRun(sub, pos, HetisEnginePolicy(problem, spec, len(sub), pool, k), EngineState(sub)))
    budget = 50_000_000
    stalled: set[int] = set()
    watch = SimulationWatch(f"{len(idx)} requests on {len(engines)} pooled engines")
    while budget > 0:
        live = [r for r in runs if not r.done]
        if not live:
            break
        run = min(live, key=lambda r: r.state.now_s)
        sub, pol, st = run.requests, run.policy, run.state
        upto = int(np.searchsorted(sub.arrival_s, st.now_s, side="right"))
        if upto > run.arrived:
            pol.on_arrival(np.arange(run.arrived, upto, dtype=np.int64), st)
            run.arrived = upto
        it = pol.next_iteration(st)
        if it is None:
            nexts = [float(sub.arrival_s[run.arrived])] if run.arrived < len(sub) else []
            if not pol.waiting:
                if nexts:
                    st.now_s = max(st.now_s, nexts[0])
                else:
                    run.done = True
                continue
            # memory held by other engines: wait for the next event (another engine's, or an arrival)
            stalled.add(id(run))
            if len(stalled) >= len(live) and not any(r.arrived < len(r.requests) for r in live):
                st.reject(pol.waiting.popleft())  # every engine waits on the others: refuse one request
                stalled.clear()
                continue
            later = [r.state.now_s for r in live if r is not run and r.state.now_s > st.now_s] + nexts
            st.now_s = min(later) if later else st.now_s + 1e-6
            continue
        stalled.clear()
        budget -= 1
        apply_iteration(st, sub, pol, it)
        watch.tick()
    for run in runs:
        if not len(run.requests):
            continue
        st = run.state
        first[run.positions] = st.first_token_s
        finish[run.positions] = st.finish_s
        rejected[run.positions] = st.rejected
        _add_stats(stats, st.iterations, st.preemptions, run.policy)
    return {"first_s": first, "finish_s": finish, "rejected": rejected}


def _add_stats(stats: dict[str, float], iterations: int, preemptions: int, pol: HetisEnginePolicy) -> None:
    """Add one engine's counts (iterations, preemptions, bytes migrated and shipped, head moves,
    dispatches) to the pool's `stats`."""
    for key, value in (("iterations", iterations), ("preemptions", preemptions),
                       ("migrated_bytes", pol.migrated_bytes), ("shipped_bytes", pol.shipped_bytes),
                       ("head_moves", pol.moves), ("dispatches", pol.dispatches)):
        stats[key] = stats.get(key, 0.0) + value


def simulate_plan(problem: Any, plan: Any, req: Requests) -> tuple[SimResult, dict[str, float]]:
    """Return (SimResult over all of `req`, engine statistics) of a plan's layout serving the trace.
    Raises SimulationCut when the solve's time limit passes first (gpuplan.sim.core.solve_clock)."""
    watch = SimulationWatch(f"{len(req)} requests")  # the whole plan's length, for the room a search keeps
    n = len(req)
    stats: dict[str, float] = {}
    both = [r for r in plan.replicas if r.phase == "both"]
    pre = [r for r in plan.replicas if r.phase == "prefill"]
    dec = [r for r in plan.replicas if r.phase == "decode"]
    idx = np.arange(n, dtype=np.int64)
    if both:
        out = _run_pool(problem, plan, both, req, idx, False, None, None, stats)
        first, finish, rejected = out["first_s"], out["finish_s"], out["rejected"]
    else:
        one = np.ones(n, dtype=np.int64)
        p1 = _run_pool(problem, plan, pre, req, idx, False, None, one, stats)
        first, rejected = p1["first_s"], p1["rejected"].copy()
        finish = np.where(req.output_tokens == 1, first, np.nan)
        go = np.flatnonzero(np.isfinite(first) & (req.output_tokens > 1))
        if len(go):
            arrive = transfer_arrivals_s(problem, plan, first[go], req.prompt_tokens[go])
            p2 = _run_pool(problem, plan, dec, req, go, True, arrive, None, stats)
            finish[go] = p2["finish_s"]
            rejected[go] |= p2["rejected"]
    out_tok = req.output_tokens
    with np.errstate(invalid="ignore"):
        tpot = np.where(out_tok > 1, (finish - first) / np.maximum(out_tok - 1, 1), 0.0)
    tpot = np.where(np.isfinite(finish), tpot, np.nan)
    end = float(np.nanmax(finish)) if np.any(np.isfinite(finish)) else float(req.arrival_s[-1]) if n else 0.0
    res = SimResult(req, first - req.arrival_s, tpot, finish, rejected, end, int(stats.get("iterations", 0)), 0.0,
                    int(stats.get("preemptions", 0)), [])
    watch.done()
    return res, stats


def transfer_s(problem: Any, plan: Any, prompt_tokens: np.ndarray) -> np.ndarray:
    """Return the seconds to ship each prompt's KV from the prefill pool to the decode pool (the slowest
    link between their first devices, latency + bytes / bandwidth)."""
    g = {x.id: x for x in gpus_of(problem)}
    pre = [r for r in plan.replicas if r.phase == "prefill"]
    dec = [r for r in plan.replicas if r.phase == "decode"]
    bw, lat = math.inf, 0.0
    for a in pre:
        for b in dec:
            x, y = link_of(problem, g[a.stages[0].devices[0]], g[b.stages[0].devices[0]])
            if x < bw:
                bw, lat = x, y
    kvb = kv_bytes_per_token(problem.config, problem.dtype)
    return lat + prompt_tokens * kvb / bw


def transfer_links(problem: Any, plan: Any) -> int:
    """Return how many KV transfers between the prefill and the decode pool can run at once: one per
    node (its NIC) on the narrower side, min(nodes of the prefill pool, nodes of the decode pool), >= 1."""
    node = {x.id: x.node for x in gpus_of(problem)}

    def nodes(phase: str) -> set[str]:
        return {node[d] for r in plan.replicas if r.phase == phase for st in r.stages for d in st.devices}
    return max(1, min(len(nodes("prefill")), len(nodes("decode"))))


def transfer_arrivals_s(problem: Any, plan: Any, ready_s: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
    """Return when each prompt's KV has arrived at the decode pool (s): transfers queue first come first
    served on `transfer_links(problem, plan)` links of the pool's slowest link bandwidth (a link carries one
    transfer at a time, bytes / bandwidth), each transfer ready when its prefill finished (`ready_s`),
    plus the link latency. A link's capacity bounds the pools' rate: beyond it the queue grows."""
    import heapq

    ready = np.asarray(ready_s, dtype=float)
    full = transfer_s(problem, plan, prompt_tokens)
    lat = float(transfer_s(problem, plan, np.zeros(1))[0])
    busy = full - lat
    out = np.empty_like(ready)
    free = [0.0] * transfer_links(problem, plan)
    for i in np.argsort(ready, kind="stable"):
        start = max(float(ready[i]), heapq.heappop(free))
        heapq.heappush(free, start + float(busy[i]))
        out[i] = start + float(busy[i]) + lat
    return out


def p95(values: np.ndarray, q: float = 95.0) -> float:
    """Return the nearest-rank q-th percentile of `values` with unserved (nan) entries counted as +inf."""
    v = np.sort(np.where(np.isfinite(values), values, np.inf))
    if not len(v):
        return 0.0
    k = max(0, int(math.ceil(q / 100.0 * len(v))) - 1)
    return float(v[k])
