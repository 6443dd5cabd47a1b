"""Module latency models for LLM serving: dense modules as a staircase, attention linear in KV tokens.

Dense modules (QKV/out projections, MLP) run GEMMs whose time is flat while the weights' read from
memory dominates, then rises in steps of one tile of `tau` tokens (thread-block quantisation):

    f_D(n) = c0_s + max(floor_s, step_s * ceil(n / tau))                (n tokens in the iteration)

Attention reads the KV cache: decode attention is memory-bound, linear in the KV tokens read,

    f_A(k) = a0_s + a1_s * k                                            (k KV tokens read, all layers)

and prefill attention is compute-bound (causal: a chunk of c tokens at position p does
~4 * c * (p + c/2) * d flops per layer). Each model is built from catalog figures (datasheet peak
FLOP/s and memory bandwidth with stated efficiencies) or fitted by least squares to measured
samples (a profile); the fit is exact for the model's form, so measured samples decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.models.catalog import catalog_entry
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig

# Stated assumptions for catalog-built models (not fitted to any published serving figure):
GEMM_EFFICIENCY = 0.7        # fraction of datasheet dense peak a large serving GEMM reaches
MEMORY_EFFICIENCY = 0.8      # fraction of datasheet HBM bandwidth a streaming read reaches
ATTENTION_EFFICIENCY = 0.5   # fraction of peak a flash-attention prefill kernel reaches
ITERATION_OVERHEAD_S = 2e-3  # launch + scheduling + sampling per iteration (vLLM-class engines: 1-5 ms)
TILE_TOKENS = 64             # GEMM tile along the token dimension (CUTLASS/cuBLAS tiles are 64-256)


def _as_array(x: float | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=float)


@dataclass(frozen=True)
class StaircaseLatency:
    """f(n) = c0_s + max(floor_s, step_s * ceil(n / tau)) seconds for n tokens (0 tokens: 0 s)."""

    c0_s: float
    floor_s: float
    step_s: float
    tau: int

    def __call__(self, n: float | np.ndarray) -> float | np.ndarray:
        """Return the time (s) for `n` tokens; vectorised over arrays."""
        if isinstance(n, (int, float)):
            return 0.0 if n <= 0 else self.c0_s + max(self.floor_s, self.step_s * math.ceil(n / self.tau))
        arr = _as_array(n)
        t = self.c0_s + np.maximum(self.floor_s, self.step_s * np.ceil(arr / self.tau))
        out = np.where(arr > 0, t, 0.0)
        return float(out) if np.ndim(out) == 0 else out

    @staticmethod
    def fit(tokens: np.ndarray | list[float], seconds: np.ndarray | list[float],
            taus: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)) -> "StaircaseLatency":
        """Return the least-squares staircase through measured (tokens, seconds) samples.

        For each tile size and each split of the samples into a flat part (the floor dominates) and a
        rising part, the model is linear in (c0, floor, step), so every candidate is an exact linear
        least-squares fit; candidates whose split contradicts their own fit (a flat sample above the
        breakpoint, a rising one below it) are skipped, and the smallest squared error wins.
        """
        n = _as_array(tokens)
        t = _as_array(seconds)
        if n.size < 2 or n.size != t.size or not (np.all(np.isfinite(n)) and np.all(np.isfinite(t))):
            raise ValueError("fit needs at least two finite (tokens, seconds) samples of equal length")
        best: tuple[float, StaircaseLatency] | None = None
        for tau in taus:
            k = np.ceil(n / tau)
            levels = np.unique(k)
            for j in range(len(levels)):  # samples with k < levels[j] are flat
                flat = k < levels[j]
                rising = ~flat
                a = np.stack([np.ones_like(k), flat.astype(float), np.where(rising, k, 0.0)], axis=1)
                if not flat.any():
                    a = a[:, [0, 2]]
                coef, *_ = np.linalg.lstsq(a, t, rcond=None)
                c0, step = float(coef[0]), float(coef[-1])
                floor = float(coef[1]) if flat.any() else 0.0
                tol = 1e-9 * max(1.0, abs(step))
                if step < 0 or floor < 0 or (flat.any() and (floor < step * k[flat].max() - tol
                                                             or floor > step * k[rising].min() + tol)):
                    continue
                cand = StaircaseLatency(c0, floor, step, int(tau))
                err = float(np.sum((_as_array(cand(n)) - t) ** 2))
                if best is None or err < best[0] * (1 - 1e-12) - 1e-30:
                    best = (err, cand)
        if best is None:
            raise ValueError("no non-decreasing staircase fits these samples")
        return best[1]


@dataclass(frozen=True)
class LinearLatency:
    """f(x) = a0_s + a1_s * x seconds (x: KV tokens read, or flops, as the model states)."""

    a0_s: float
    a1_s: float

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        """Return the time (s) for load `x`; 0 s for no load; vectorised over arrays."""
        if isinstance(x, (int, float)):
            return 0.0 if x <= 0 else self.a0_s + self.a1_s * x
        arr = _as_array(x)
        out = np.where(arr > 0, self.a0_s + self.a1_s * arr, 0.0)
        return float(out) if np.ndim(out) == 0 else out

    @staticmethod
    def fit(load: np.ndarray | list[float], seconds: np.ndarray | list[float]) -> "LinearLatency":
        """Return the least-squares line through measured (load, seconds) samples (slope >= 0)."""
        x = _as_array(load)
        t = _as_array(seconds)
        if x.size < 2 or x.size != t.size or not (np.all(np.isfinite(x)) and np.all(np.isfinite(t))):
            raise ValueError("fit needs at least two finite (load, seconds) samples of equal length")
        a = np.stack([np.ones_like(x), x], axis=1)
        (a0, a1), *_ = np.linalg.lstsq(a, t, rcond=None)
        if a1 < 0:
            a0, a1 = float(np.mean(t)), 0.0
        return LinearLatency(float(a0), float(a1))


def relative_errors(model: StaircaseLatency | LinearLatency, x: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Return |model(x) - seconds| / seconds per sample (held-out validation of a fitted model)."""
    t = _as_array(seconds)
    return np.abs(_as_array(model(x)) - t) / np.maximum(t, 1e-12)


def _device_figures(device: Any, dtype: str) -> tuple[float, float]:
    """Return (dense peak FLOP/s, memory bandwidth B/s) of a catalog type name, or of a declared
    device type (an object with `peak(dtype)` in TFLOP/s and `memory_bandwidth_GBps`, such as
    gpuplan.models.cluster.DeviceType: inline or measured types that are not in the catalog)."""
    if not isinstance(device, str):
        return float(device.peak(dtype)) * 1e12, float(device.memory_bandwidth_GBps) * 1e9
    entry = catalog_entry(device)
    if entry is None:
        raise ValueError(f"device type {device!r} is not in the catalog; give its figures or a profile")
    peak = dict(entry["peak_tflops"])  # type: ignore[call-overload]
    if dtype not in peak:
        raise ValueError(f"device type {device!r} has no {dtype} rate in the catalog")
    return float(peak[dtype]) * 1e12, float(entry["memory_bandwidth_GBps"]) * 1e9  # type: ignore[arg-type]


def kv_bytes_per_token(cfg: TransformerConfig, dtype: str = "bf16") -> float:
    """Return the KV-cache bytes one token holds over all layers (K and V, every KV head)."""
    return 2.0 * cfg.kv * cfg.dhead * DTYPE_BYTES[dtype] * cfg.num_layers


def kv_bytes_per_head_token(cfg: TransformerConfig, dtype: str = "bf16") -> float:
    """Return the KV-cache bytes one token holds for ONE KV head over all layers (K and V)."""
    return 2.0 * cfg.dhead * DTYPE_BYTES[dtype] * cfg.num_layers


def dense_latency(cfg: TransformerConfig, device: Any, *, tp: int = 1, layers: int | None = None,
                  dtype: str = "bf16", tau: int = TILE_TOKENS) -> StaircaseLatency:
    """Return the staircase time (s) of one iteration's dense modules over `layers` layers (all by
    default) split `tp` ways, from the catalog: the floor is the weights' read at MEMORY_EFFICIENCY
    of the datasheet bandwidth, each tile of `tau` tokens costs its GEMM flops at GEMM_EFFICIENCY of
    the datasheet peak, plus ITERATION_OVERHEAD_S."""
    peak, bw = _device_figures(device, dtype)
    n_layers = cfg.num_layers if layers is None else layers
    weight_bytes = cfg.layer_weight_bytes(dtype) * n_layers / tp
    flops_per_token = 2.0 * cfg.layer_params() * n_layers / tp
    return StaircaseLatency(ITERATION_OVERHEAD_S, weight_bytes / (bw * MEMORY_EFFICIENCY),
                            tau * flops_per_token / (peak * GEMM_EFFICIENCY), tau)


def decode_attention_latency(cfg: TransformerConfig, device: Any, *, heads_fraction: float = 1.0,
                             layers: int | None = None, dtype: str = "bf16") -> LinearLatency:
    """Return decode attention time (s) as a line in KV tokens read over `layers` layers, for a
    `heads_fraction` share of the KV heads: bytes read at MEMORY_EFFICIENCY of the datasheet bandwidth."""
    _, bw = _device_figures(device, dtype)
    n_layers = cfg.num_layers if layers is None else layers
    per_token = 2.0 * cfg.kv * cfg.dhead * DTYPE_BYTES[dtype] * n_layers * heads_fraction
    return LinearLatency(0.0, per_token / (bw * MEMORY_EFFICIENCY))


def prefill_attention_s(cfg: TransformerConfig, device: Any, chunk: np.ndarray | float, position: np.ndarray | float,
                        *, tp: int = 1, dtype: str = "bf16") -> float:
    """Return the time (s) of causal prefill attention for chunks of `chunk` tokens starting at
    `position` (arrays sum), all layers, split `tp` ways: 4 * c * (p + c/2) * heads * head_dim flops
    per layer at ATTENTION_EFFICIENCY of the datasheet peak."""
    peak, _ = _device_figures(device, dtype)
    c = _as_array(chunk)
    p = _as_array(position)
    flops = 4.0 * c * (p + c / 2.0) * cfg.heads * cfg.dhead * cfg.num_layers / tp
    return float(np.sum(flops)) / (peak * ATTENTION_EFFICIENCY)


def ceil_div(a: int, b: int) -> int:
    """Return ceil(a / b) for non-negative integers."""
    return -(-a // b) if b else math.inf  # type: ignore[return-value]
