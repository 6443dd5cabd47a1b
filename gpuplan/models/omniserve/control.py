"""OmniServe's per-iteration controller and its cluster-level packing, as pure functions.

Priorities in one iteration (the paper's): LS decode > LS chunked prefill > BE chunked prefill > BE
decode (piggyback). Every LS decode is in; LS prefill chunks take the token budget left in arrival
order; BE prefill chunks take what LS left; then the largest number b of ready BE piggyback rows whose
iteration time stays within the TPOT target is found by binary search (T is monotone in b).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuplan.models.omniserve.costs import Latency

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Decision:
    """One iteration's composition: LS and BE prefill chunk sizes (tokens, aligned with the inputs),
    GPU-resident BE decodes taken (a prefix count), piggyback rows merged (a prefix count of the ready
    list), their count per layer, the iteration time (s), and what it was computed from: batched tokens,
    GPU decode KV tokens read, prefill attention (s)."""

    ls_chunks: np.ndarray
    be_chunks: np.ndarray
    be_gpu_decodes: int
    merged: int
    per_layer: np.ndarray
    duration_s: float
    tokens: int = 0
    kv_read: float = 0.0
    prefill_s: float = 0.0


def fill_chunks(remaining: np.ndarray, budget: int) -> np.ndarray:
    """Return chunk sizes (tokens) giving `budget` tokens to `remaining` prefills in order (FCFS)."""
    if not len(remaining) or budget <= 0:
        return np.zeros(len(remaining), dtype=np.int64)
    r = np.asarray(remaining, dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(r)[:-1]])
    return np.clip(budget - before, 0, r).astype(np.int64)


def iteration_time(lat: Latency, tokens: int, kv_read: float, prefill_s: float, layers: np.ndarray,
                   b: int, gpu_kv: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Return (iteration time in s, piggyback rows per layer) with the first `b` BE decodes taken: first
    GPU-resident ones (KV tokens `gpu_kv`; one token through every layer), then ready piggyback rows
    (layers given; one row at one layer each)."""
    g = min(b, len(gpu_kv)) if gpu_kv is not None else 0
    rows = b - g
    if g:
        tokens += g
        kv_read += float(np.sum(gpu_kv[:g]))  # type: ignore[index]
    if rows <= 0:
        return lat.iteration_s(tokens, kv_read, prefill_s), np.zeros(lat.layers, dtype=np.int64)
    per_layer = np.bincount(layers[:rows], minlength=lat.layers)
    return lat.iteration_s(tokens, kv_read, prefill_s, per_layer), per_layer


def largest_be_batch(lat: Latency, tokens: int, kv_read: float, prefill_s: float, ready_layers: np.ndarray,
                     target_s: float, upper: int, gpu_kv: np.ndarray | None = None) -> int:
    """Return the largest b in [0, min(upper, candidates)] whose iteration time with the first b BE decodes
    (GPU-resident first, then ready piggyback rows) is at most `target_s` seconds; 0 when even b = 1
    exceeds it. Binary search: the time is non-decreasing in b."""
    n = len(ready_layers) + (len(gpu_kv) if gpu_kv is not None else 0)
    hi = min(int(upper), n)
    if hi <= 0 or iteration_time(lat, tokens, kv_read, prefill_s, ready_layers, 1, gpu_kv)[0] > target_s:
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if iteration_time(lat, tokens, kv_read, prefill_s, ready_layers, mid, gpu_kv)[0] <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def decide(lat: Latency, *, budget: int, target_s: float, ls_decode_kv: np.ndarray, ls_prefill_left: np.ndarray,
           ls_prefill_pos: np.ndarray, be_prefill_left: np.ndarray, be_prefill_pos: np.ndarray,
           be_gpu_decode_kv: np.ndarray, ready_layers: np.ndarray, be_max: int,
           be_decode_first: bool = False, be_prefill_max: int = 0) -> Decision:
    """Return the iteration's Decision under the priorities LS decode > LS prefill > BE prefill > BE decode.

    `be_decode_first` (the headroom baseline, vLLM/Sarathi order) lets GPU-resident BE decodes take the
    budget before BE prefill; OmniServe keeps the paper's order. `be_prefill_max` > 0 bounds the BE prefill
    tokens of the iteration (below what the budget leaves). Piggyback rows never push the iteration
    past `target_s`; the rest follows the token budget as Sarathi-Serve does.
    """
    left = budget - len(ls_decode_kv)
    ls_chunks = fill_chunks(ls_prefill_left, left)
    left -= int(ls_chunks.sum())
    n_gpu = 0
    if be_decode_first:   # the headroom baseline: BE decodes are in the budget, before BE prefill
        n_gpu = int(min(max(left, 0), len(be_gpu_decode_kv)))
        left -= n_gpu
    be_chunks = fill_chunks(be_prefill_left, min(left, be_prefill_max) if be_prefill_max > 0 else left)
    tokens = len(ls_decode_kv) + int(ls_chunks.sum()) + int(be_chunks.sum()) + n_gpu
    kv_read = float(np.sum(ls_decode_kv)) + float(np.sum(be_gpu_decode_kv[:n_gpu]))
    pre = 0.0
    if ls_chunks.any():
        pre += lat.prefill_attention(ls_chunks, ls_prefill_pos)
    if be_chunks.any():
        pre += lat.prefill_attention(be_chunks, be_prefill_pos)
    if be_decode_first:
        t, per_layer = iteration_time(lat, tokens, kv_read, pre, ready_layers, 0)
        return Decision(ls_chunks, be_chunks, n_gpu, 0, per_layer, t, tokens, kv_read, pre)
    # OmniServe: BE decodes last, GPU-resident ones then piggyback rows, as many as the TPOT target allows
    gpu_kv = np.asarray(be_gpu_decode_kv, dtype=float)
    b = largest_be_batch(lat, tokens, kv_read, pre, ready_layers, target_s, be_max, gpu_kv)
    if b == 0 and tokens == 0 and len(ready_layers) + len(gpu_kv) and be_max > 0:
        b = 1   # nothing else to run: progress rather than idle
    t, per_layer = iteration_time(lat, tokens, kv_read, pre, ready_layers, b, gpu_kv)
    g = min(b, len(gpu_kv))
    return Decision(ls_chunks, be_chunks, g, b - g, per_layer, t, tokens + g, kv_read + float(np.sum(gpu_kv[:g])),
                    pre)


def pack_ffd(need_bytes: np.ndarray, need_rate: np.ndarray, free_bytes: np.ndarray,
             free_rate: np.ndarray) -> np.ndarray:
    """Return the pool of each item (-1: none fits) by first-fit decreasing on two dimensions: memory
    (bytes) and attention rate (KV token-layers per iteration). Items go largest memory first; each to
    the first pool (in pool order) with room on both; the free capacities are not modified."""
    fb = np.asarray(free_bytes, dtype=float).copy()
    fr = np.asarray(free_rate, dtype=float).copy()
    out = np.full(len(need_bytes), -1, dtype=np.int64)
    for i in np.argsort(-np.asarray(need_bytes, dtype=float), kind="stable"):
        fit = np.flatnonzero((fb >= need_bytes[i]) & (fr >= need_rate[i]))
        if len(fit):
            c = int(fit[0])
            out[i] = c
            fb[c] -= need_bytes[i]
            fr[c] -= need_rate[i]
    return out
