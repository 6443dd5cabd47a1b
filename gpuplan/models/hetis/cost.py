"""Hetis cost model: per-device figures, dense-stage latency, KV capacity, attention and communication.

Every figure comes from the cluster's device types (catalog, inline datasheet figures, or a
profile's measured ones) through gpuplan.sim.latency's module models:

  dense stage s (tp_s GPUs, l_s layers) for n tokens: staircase f_D(n) of its GEMMs (weights read at
      memory bandwidth as the floor, tiles of compute above it) + two ring all-reduces per layer of
      n * hidden * e bytes over the stage's slowest link; a pipeline adds one p2p send per boundary.
  prefill attention: causal flops at the stage's peak (latency.prefill_attention_s), l_s/L of it.
  decode attention on device g: reading its share of the KV cache, a_g seconds per KV byte read
      (memory-bound, latency.MEMORY_EFFICIENCY of its HBM bandwidth); an attention worker (not a
      primary) also pays, per layer, two messages to the primaries (q out, o back):
      latency + heads * q_per_kv * head_dim * e / bandwidth each, and the storage overhead factor.
  KV capacity of g: memory * (1 - reserve) - weights it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig
from gpuplan.sim.latency import (MEMORY_EFFICIENCY, dense_latency, kv_bytes_per_head_token, kv_bytes_per_token,
                                 prefill_attention_s)


@dataclass(frozen=True)
class Gpu:
    """One device of the cluster with the figures the cost model reads.

    id: global device id; node: its node; type: type name; memory_bytes; bandwidth_Bps: HBM bytes/s;
    peak_flops: dense FLOP/s in the problem's dtype.
    """

    id: int
    node: str
    type: str
    memory_bytes: float
    bandwidth_Bps: float
    peak_flops: float


def gpus_of(problem: Any) -> list[Gpu]:
    """Return every device of the problem's cluster with its figures (dtype: the problem's), in device
    order."""
    out = []
    for d in problem.cluster.devices:
        t = problem.cluster.type_of(d.type)
        out.append(Gpu(d.id, d.node, d.type, float(t.memory_bytes), float(t.memory_bandwidth_GBps) * 1e9,
                       float(t.peak(problem.dtype)) * 1e12))
    return out


def stage_weight_bytes(cfg: TransformerConfig, dtype: str, layers: int, tp: int, first: bool, last: bool) -> float:
    """Return the weight bytes ONE device of a stage holds: its layers (and the embedding on the first
    stage, the output head on the last) split `tp` ways."""
    e = DTYPE_BYTES[dtype]
    total = layers * cfg.layer_weight_bytes(dtype)
    if first:
        total += cfg.embedding_params() * e
    if last:
        total += cfg.head_params() * e
    return total / tp


def link_of(problem: Any, a: Gpu, b: Gpu) -> tuple[float, float]:
    """Return (bandwidth B/s, latency s) between the nodes of two devices (the node's intra link when
    they share a node)."""
    ln = problem.cluster.link(a.node, b.node)
    return ln.bandwidth_GBps * 1e9, ln.latency_s


def allreduce_s(nbytes: float, tp: int, bw_Bps: float, lat_s: float) -> float:
    """Return a ring all-reduce's time (s) of `nbytes` over `tp` devices: 2(tp-1) steps of nbytes/tp."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) * (lat_s + nbytes / tp / bw_Bps)


@dataclass(frozen=True)
class StageCost:
    """The cost model of one pipeline stage: its devices, layers, and the functions of n tokens."""

    devices: tuple[int, ...]
    layers: int
    dense: Any            # StaircaseLatency for the stage's layers at its tp (slowest device type)
    ar_lat_s: float       # per all-reduce latency part (both all-reduces of all layers)
    ar_s_per_token: float  # all-reduce seconds per token (all layers)
    p2p_lat_s: float      # send to the next stage: latency (0 for the last stage)
    p2p_s_per_token: float
    slow_type: Any        # DeviceType of the slowest device (prefill attention)
    tp: int

    def time_s(self, tokens: float) -> float:
        """Return the stage's dense time (s) for `tokens` tokens: GEMMs, all-reduces and the p2p send."""
        if tokens <= 0:
            return 0.0
        memo = self._dense_memo
        t = memo.get(tokens)
        if t is None:  # a simulation asks for the same few batch sizes thousands of times
            t = memo[tokens] = (float(self.dense(tokens)) + self.ar_lat_s + self.ar_s_per_token * tokens
                                + self.p2p_lat_s + self.p2p_s_per_token * tokens)
        return t

    @cached_property
    def _dense_memo(self) -> dict[float, float]:
        """The dense times (s) computed so far, by token count."""
        return {}


def stage_costs(problem: Any, stages: Sequence[Any]) -> list[StageCost]:
    """Return the StageCost of each stage of a replica (stages: objects with .devices and .layers)."""
    cfg = problem.config
    e = DTYPE_BYTES[problem.dtype]
    g = {x.id: x for x in gpus_of(problem)}
    out = []
    for i, st in enumerate(stages):
        devs = [g[d] for d in st.devices]
        tp = len(devs)
        slow = min(devs, key=lambda x: (x.peak_flops, x.bandwidth_Bps))
        slow_type = problem.cluster.type_of(slow.type)
        dense = dense_latency(cfg, slow_type, tp=tp, layers=st.layers, dtype=problem.dtype)
        if i:
            dense = type(dense)(0.0, dense.floor_s, dense.step_s, dense.tau)  # one iteration overhead per replica
        bw, lat = min((link_of(problem, a, b) for a in devs for b in devs if a.id != b.id),
                      default=(math.inf, 0.0), key=lambda x: x[0])
        per_token = cfg.hidden * e
        ar_lat = 2 * st.layers * allreduce_s(0.0, tp, bw, lat)
        ar_tok = 2 * st.layers * (allreduce_s(per_token, tp, bw, 0.0) if tp > 1 else 0.0)
        if i + 1 < len(stages):
            nbw, nlat = link_of(problem, devs[0], g[stages[i + 1].devices[0]])
            p_lat, p_tok = nlat, per_token / nbw
        else:
            p_lat, p_tok = 0.0, 0.0
        out.append(StageCost(tuple(st.devices), st.layers, dense, ar_lat, ar_tok, p_lat, p_tok, slow_type, tp))
    return out


def prefill_attention_stage_s(problem: Any, sc: StageCost, chunks: np.ndarray, positions: np.ndarray) -> float:
    """Return the prefill attention time (s) of chunks at positions on one stage (its layers' share)."""
    if not len(chunks):
        return 0.0
    full = prefill_attention_s(problem.config, sc.slow_type, chunks, positions, tp=sc.tp, dtype=problem.dtype)
    return full * sc.layers / problem.config.num_layers


def pipeline_step_s(stage_times: Sequence[float]) -> float:
    """Return one virtual engine's token step (s) in a pipeline of stages run by pp interleaved batches:
    max(sum of stage times, pp * slowest stage) (the pipeline's beat bounds it when stages are unequal)."""
    if not stage_times:
        return 0.0
    return max(sum(stage_times), len(stage_times) * max(stage_times))


def device_weights(problem: Any, replicas: Sequence[Any]) -> dict[int, float]:
    """Return weight bytes per device id over every stage of every replica."""
    cfg = problem.config
    out: dict[int, float] = {}
    for rep in replicas:
        n = len(rep.stages)
        for i, st in enumerate(rep.stages):
            w = stage_weight_bytes(cfg, problem.dtype, st.layers, max(1, len(st.devices)), i == 0, i == n - 1)
            for d in st.devices:
                out[d] = out.get(d, 0.0) + w
    return out


def kv_capacity(problem: Any, replicas: Sequence[Any], attention_devices: Sequence[int]) -> dict[int, float]:
    """Return usable KV bytes per device holding KV: memory * (1 - reserve) - weights (floored at 0).
    Devices holding KV: every stage device and every attention device."""
    g = {x.id: x for x in gpus_of(problem)}
    w = device_weights(problem, replicas)
    ids = sorted(set(w) | set(attention_devices))
    return {d: max(0.0, g[d].memory_bytes * (1 - problem.memory_reserve_fraction) - w.get(d, 0.0)) for d in ids}


def kv_fractions_tp(problem: Any, replica: Any) -> dict[int, float]:
    """Return the fraction of a request's KV bytes each device of a tensor/pipeline-parallel replica holds:
    layers_s / L / tp_s (heads split evenly inside a stage)."""
    L = problem.config.num_layers
    return {d: st.layers / L / len(st.devices) for st in replica.stages for d in st.devices}


def usable_kv_bytes(capacity: dict[int, float], fractions: dict[int, float]) -> float:
    """Return the KV bytes a layout can really fill: with fixed per-request fractions f_g, tokens are
    bounded by min_g cap_g / f_g, so usable = min_g cap_g / f_g (the smallest device limits all)."""
    used = [capacity[d] / f for d, f in fractions.items() if f > 0]
    return min(used) if used else 0.0


@dataclass(frozen=True)
class AttentionCost:
    """Decode attention coefficients of a set of KV-holding devices (arrays over those devices).

    s_per_token: seconds to read ONE token's whole KV (all layers, all KV heads) on the device;
    worker: whether it is an attention worker (not a primary); c0_s: per-iteration message latency
    (all layers, both directions) for a worker; c1_s_per_head: message seconds per head of a decoding
    request (all layers, both directions); overhead: storage factor on workers' attention time.
    """

    ids: np.ndarray
    s_per_token: np.ndarray
    worker: np.ndarray
    c0_s: np.ndarray
    c1_s_per_head: np.ndarray
    overhead: float

    def device_times(self, kv_tokens_share: np.ndarray, heads: np.ndarray) -> np.ndarray:
        """Return per-device decode attention + message time (s) for one iteration: kv_tokens_share[g] is
        sum_r f_rg * ctx_r (whole-token equivalents read on g), heads[g] the decoding heads held on g."""
        t = self.s_per_token * kv_tokens_share * self.storage_factor
        return t + np.where(heads > 0, self.c0_s + self.c1_s_per_head * heads, 0.0)

    @cached_property
    def storage_factor(self) -> np.ndarray:
        """Return per device the factor on its attention time: 1 + overhead on workers, 1 on primaries."""
        return np.where(self.worker, 1.0 + self.overhead, 1.0)


def attention_cost(problem: Any, devices: Sequence[int], primaries: Sequence[int],
                   own_layers: dict[int, int] | None = None) -> AttentionCost:
    """Return the AttentionCost of `devices` when the dense part runs on `primaries`. A primary of a
    pipeline stage exchanges messages only for the layers of the other stages (`own_layers`: device ->
    its stage's layers; absent: a primary exchanges none)."""
    cfg = problem.config
    e = DTYPE_BYTES[problem.dtype]
    g = {x.id: x for x in gpus_of(problem)}
    kvb = kv_bytes_per_token(cfg, problem.dtype)
    prim = [g[p] for p in primaries]
    q_per_kv = cfg.heads // cfg.kv
    ids, spt, wk, c0, c1 = [], [], [], [], []
    for d in devices:
        x = g[d]
        ids.append(d)
        spt.append(kvb / (x.bandwidth_Bps * MEMORY_EFFICIENCY))
        is_worker = d not in set(primaries)
        wk.append(is_worker)
        remote = cfg.num_layers if is_worker else cfg.num_layers - (own_layers or {}).get(d, cfg.num_layers)
        others = [p for p in prim if p.id != d]
        if remote > 0 and others:
            bw, lat = min((link_of(problem, x, p) for p in others), key=lambda t: (t[1], -t[0]))
            c0.append(2 * remote * lat)
            c1.append(2 * remote * 2 * q_per_kv * cfg.dhead * e / bw)
        else:
            c0.append(0.0)
            c1.append(0.0)
    return AttentionCost(np.array(ids, dtype=np.int64), np.array(spt), np.array(wk, dtype=bool), np.array(c0),
                         np.array(c1), problem.attention_worker_overhead)


def head_bytes_per_token(problem: Any) -> float:
    """Return the KV bytes one token holds for ONE KV head over all layers."""
    return kv_bytes_per_head_token(problem.config, problem.dtype)
