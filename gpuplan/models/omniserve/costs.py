"""OmniServe's module latency models and traces: f_D (staircase, dense modules), f_A (linear, GPU decode
attention), prefill attention, the per-iteration time with piggybacked BE rows per layer, and the
seeded LS + BE trace of a problem.

    T_k = sum_l f_D(n_k + b_{k,l}) / L + f_A(KV tokens read on the GPU) + prefill attention
          + piggyback overhead (when b_k > 0)

n_k: tokens of the iteration's GPU batch (LS decodes, LS and BE prefill chunks, GPU-resident BE
decodes); b_{k,l}: BE requests whose layer-l CPU attention merges into layer l this iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gpuplan.models.omniserve.problem import OmniServeProblem
from gpuplan.sim.latency import (LinearLatency, StaircaseLatency, decode_attention_latency, dense_latency,
                                 prefill_attention_s)
from gpuplan.sim.serving import BE, LS, Requests
from gpuplan.sim.traces import lengths, long_prompt_trace, poisson_trace, source_stamp

MAX_BUDGET = 16_384  # largest token budget considered (tokens per iteration)


@dataclass(frozen=True)
class Latency:
    """The latency model of one engine: f_D over all layers, f_A (GPU decode attention over all layers,
    per KV token read), prefill attention (s per chunk at a position), L layers, piggyback overhead (s)."""

    dense: StaircaseLatency
    attention: LinearLatency
    layers: int
    prefill_flop_s: float          # seconds per unit of c * (p + c/2) (all layers, the engine's share)
    overhead_s: float

    def prefill_attention(self, chunks: np.ndarray, positions: np.ndarray) -> float:
        """Return the causal prefill attention time (s) of chunks of `chunks` tokens at `positions`."""
        c = np.asarray(chunks, dtype=float)
        return float(np.sum(c * (np.asarray(positions, dtype=float) + c / 2.0))) * self.prefill_flop_s

    def iteration_s(self, tokens: int, kv_read: float, prefill_attn_s: float,
                    per_layer: np.ndarray | None = None) -> float:
        """Return an iteration's time (s): dense modules for `tokens` tokens plus `per_layer[l]` BE rows
        piggybacked at layer l, GPU decode attention over `kv_read` KV tokens, prefill attention."""
        t = float(self.attention(kv_read)) + prefill_attn_s if kv_read > 0 else prefill_attn_s
        if per_layer is None or not per_layer.any():
            return t + float(self.dense(tokens)) if tokens > 0 else t
        n = tokens + per_layer
        return t + float(np.sum(self.dense(n))) / self.layers + self.overhead_s

    def sarathi_iteration_s(self, tokens: int, kv_read: float, prefill_attn_s: float) -> float:
        """Return the iteration time (s) without piggybacking (the signature SarathiPolicy reads)."""
        return self.iteration_s(tokens, kv_read, prefill_attn_s)


def build_latency(problem: OmniServeProblem) -> Latency:
    """Return the engine's latency model: catalog-built (sim.latency) unless the problem states figures."""
    cfg, g = problem.config, problem.gpus
    dense = dense_latency(cfg, g.type, tp=g.tp, dtype=problem.dtype)
    attn = decode_attention_latency(cfg, g.type, heads_fraction=1.0 / g.tp, dtype=problem.dtype)
    if problem.latency is not None and problem.latency.dense is not None:
        d = problem.latency.dense
        dense = StaircaseLatency(d.c0_s, d.floor_s, d.step_s, d.tau)
    if problem.latency is not None and problem.latency.attention_s_per_kv_token is not None:
        attn = LinearLatency(0.0, problem.latency.attention_s_per_kv_token)
    unit = prefill_attention_s(cfg, g.type, 1.0, 0.5, tp=g.tp, dtype=problem.dtype)   # c * (p + c/2) = 1
    return Latency(dense, attn, cfg.num_layers, unit, problem.piggyback_overhead_s)


def token_budget(problem: OmniServeProblem, lat: Latency, position: float = 512.0) -> int:
    """Return Sarathi-Serve's token budget for the TPOT SLO: the largest multiple of the dense tile such
    that an iteration of that many tokens (a prefill chunk at `position`) stays within the TPOT target
    with a fifth of it left for decode attention; at least one tile."""
    tau = lat.dense.tau
    target = 0.8 * problem.tpot_target_s()
    best = tau
    b = tau
    while b <= MAX_BUDGET:
        if lat.iteration_s(b, 0.0, lat.prefill_attention(np.array([b]), np.array([position]))) <= target:
            best = b
        else:
            break
        b += tau
    return int(best)


@lru_cache(maxsize=4)
def _lengths(source: str, stamp: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Return `sim.traces.lengths(source)`, cached by the source and its file's stamp (a rewritten
    CSV is read again)."""
    return lengths(source)


def build_trace(problem: OmniServeProblem, seed: int | None = None, ls_rate_per_s: float | None = None,
                be_rate_per_s: float | None = None, lengths_source: str | None = None) -> tuple[Requests, str]:
    """Return (the LS + BE trace, a description of the LS lengths' source) for the problem's seed (or
    `seed`), optionally at other arrival rates (requests/s) and LS lengths from another source ('sample',
    'sharegpt', 'auto' or a CSV of prompt_tokens,output_tokens). LS: ShareGPT lengths, Poisson or gamma
    arrivals; BE: LongBench-like lognormal lengths, Poisson arrivals."""
    s = problem.seed if seed is None else seed
    src = lengths_source or problem.ls.lengths
    p, o, desc = _lengths(src, source_stamp(src))
    ls = poisson_trace(p, o, problem.ls.requests, ls_rate_per_s or problem.ls.rate_per_s, seed=s,
                       process=problem.ls.arrival, cv=problem.ls.cv, service=LS)
    if problem.be.requests == 0:
        return ls, desc
    b = problem.be
    be = long_prompt_trace(b.requests, be_rate_per_s or b.rate_per_s, mean_prompt=b.mean_prompt_tokens,
                           mean_output=b.mean_output_tokens, sigma=b.sigma, max_tokens=b.max_tokens,
                           seed=s + 1000, service=BE)
    return Requests.merge(ls, be), desc


def finite(x: float) -> float:
    """Return x, or 0.0 when it is not finite (figures a plan states must be finite)."""
    return float(x) if math.isfinite(x) else 0.0
