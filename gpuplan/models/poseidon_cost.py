"""Poseidon's per-operation time model: GEMMs by shape, attention, element-wise ops, tensor-parallel
collectives, and what each recomputation mode adds. All times in seconds, sizes in bytes.

Assumptions (each one recorded in docs/poseidon.md, with its source):

* GEMM time = max(compute, memory) under a roofline: compute at the device's dtype peak times the
  largest-GEMM ceiling of its type (measured "maximum achievable matmul FLOPS", MAMF) times tile and
  wave quantisation (128x128 / 128x256 / 256x128 output tiles over the streaming multiprocessors,
  the best of them, as cuBLAS heuristics pick); memory = the operands and result once at
  `HBM_FRACTION` of the datasheet bandwidth. When the problem carries a measured matmul sweep
  (profile), the measured fraction of peak at the GEMM's equivalent cube size replaces the ceiling.
* Element-wise ops (layer norms, bias + GeLU / SwiGLU, bias + dropout + residual, the non-flash
  softmax with its mask and dropout, cross-entropy) are memory-bound: bytes read + written at
  `HBM_FRACTION` of the bandwidth; backward moves twice the forward's bytes.
* Attention: flash attention (fused, scores never stored) when `flash`; its forward FLOPs are
  4 b s^2 (heads x head_dim) / tp, halved when `causal` (the kernel skips masked blocks), its
  backward 2.5x the forward (five matmuls instead of two: it recomputes the scores). Without flash,
  Megatron's explicit path: two batched GEMMs (QK^T, AV) over the full square, then the fused
  softmax and dropout over b (heads/tp) s^2 scores, memory-bound.
* Recomputation: "full" re-runs the whole layer forward (its GEMMs, attention, element-wise ops and
  TP collectives) in backward; "selective" (Korthikanti et al. 2022) re-runs only the attention core
  (QK^T, softmax, dropout, AV); with flash attention that core is already recomputed inside the
  flash backward, so selective costs nothing extra and saves nothing extra.
* Tensor parallelism (Megatron): two all-reduces of the layer's activations per direction, or with
  sequence parallelism two all-gathers and two reduce-scatters of the same total bus volume; not
  overlapped with compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from gpuplan.models.cluster import DeviceType
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")

# Fraction of the datasheet HBM bandwidth a streaming kernel reaches. Source: measured device-to-device
# copies reach ~90% of the datasheet rate (e.g. 3.57 of 3.94 TB/s on Hopper; ~1.8 of 2.04 TB/s is
# the usual A100-80GB figure); an assumption, not a fit to training throughput.
HBM_FRACTION = 0.9

# Largest-GEMM ceiling per catalog type: measured maximum achievable bf16 matmul TFLOP/s over the
# dense datasheet peak (S. Bekman, ml-engineering, "Maximum Achievable Matmul FLOPS comparison
# table": A100 SXM 267.9/312, A100 PCIe 256.4/312, H100 SXM 792.1/989, GH200 821.0/989).
# Types without a measurement use their architecture's figure, else DEFAULT_CEILING.
GEMM_CEILING: dict[str, float] = {"A100-80GB": 267.9 / 312, "A100-40GB": 267.9 / 312,
                                  "H100": 792.1 / 989, "H200": 792.1 / 989, "GH200": 821.0 / 989,
                                  "H100-PCIe": 256.4 / 312}
ARCH_CEILING: dict[str, float] = {"ampere": 267.9 / 312, "hopper": 792.1 / 989}
DEFAULT_CEILING = 0.8

# Streaming multiprocessors per catalog type (vendor whitepapers / datasheets).
SM_COUNT: dict[str, int] = {"K80": 13, "P100": 56, "V100": 80, "V100-32GB": 80, "T4": 40, "A10": 72, "L4": 58,
                            "RTX4090": 128, "L40S": 142, "A100-40GB": 108, "A100-80GB": 108, "H100": 132,
                            "H100-PCIe": 114, "H200": 132, "GH200": 132}
DEFAULT_SMS = 108

# Output tiles cuBLAS / CUTLASS use for large 16-bit GEMMs on Ampere and Hopper (threadblock tiles).
TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128))


def gemm_ceiling(dev: DeviceType) -> float:
    """Return the fraction of the dense peak the largest GEMMs reach on `dev` (1.0 for measured types,
    whose peak is already the measured best)."""
    if dev.measured:
        return 1.0
    return GEMM_CEILING.get(dev.name, ARCH_CEILING.get(dev.arch, DEFAULT_CEILING))


def wave_efficiency(dev: DeviceType, M: int, N: int, batch: int = 1) -> float:
    """Return the tile-and-wave quantisation factor in (0, 1] of an M x N output (times `batch`):
    useful work over the work of the whole waves of padded tiles, best of `TILES`; 1.0 for measured
    or unknown-architecture types (CPUs, declared devices: no tile model applies)."""
    if dev.measured or dev.arch == "unknown":
        return 1.0
    sms = SM_COUNT.get(dev.name, DEFAULT_SMS)
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(M / tm) * math.ceil(N / tn) * batch
        waves = math.ceil(tiles / sms)
        best = max(best, (M * N * batch) / (waves * sms * tm * tn))
    return best


def roofline_efficiency(dev: DeviceType, dtype: str, M: int, N: int, K: int, ceiling: float) -> float:
    """Return the fraction of the dtype peak an M x N x K GEMM reaches under the roofline alone:
    min(ceiling, arithmetic intensity x bandwidth / peak). Non-decreasing in M, N and K."""
    flops = 2.0 * M * N * K
    bytes_ = (M * K + K * N + M * N) * DTYPE_BYTES.get(dtype, 2)
    peak = dev.peak(dtype) * 1e12
    bw = dev.memory_bandwidth_GBps * 1e9 * HBM_FRACTION
    return min(ceiling, flops / bytes_ * bw / peak)


def sweep_fraction(sweep: Sequence[tuple[int, float]], n_equiv: float) -> float:
    """Return the measured fraction of peak at equivalent cube size `n_equiv`, interpolated in log n
    between the sweep's (n, fraction) points (sorted by n) and clamped at its ends."""
    pts = sorted(sweep)
    if n_equiv <= pts[0][0]:
        return pts[0][1] * n_equiv / pts[0][0]  # below the sweep: work shrinks with n at fixed overhead
    for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
        if n_equiv <= n1:
            w = math.log(n_equiv / n0) / math.log(n1 / n0)
            return f0 + w * (f1 - f0)
    return pts[-1][1]


def gemm_efficiency(dev: DeviceType, dtype: str, M: int, N: int, K: int, batch: int = 1,
                    sweep: Sequence[tuple[int, float]] | None = None) -> float:
    """Return the fraction of `dev`'s dense `dtype` peak that `batch` GEMMs of M x N x K reach (0..1].

    With a measured `sweep` ((n, fraction of peak) of square matmuls) the fraction at the equivalent
    cube size (M N K)^(1/3); otherwise the roofline with the type's ceiling times tile/wave
    quantisation.
    """
    if sweep:
        return max(1e-6, min(1.0, sweep_fraction(sweep, (M * N * K) ** (1.0 / 3.0))))
    return roofline_efficiency(dev, dtype, M, N, K, gemm_ceiling(dev)) * wave_efficiency(dev, M, N, batch)


def gemm_s(dev: DeviceType, dtype: str, M: int, N: int, K: int, batch: int = 1,
           sweep: Sequence[tuple[int, float]] | None = None) -> float:
    """Return the seconds of `batch` GEMMs of M x N x K (2 M N K FLOPs each) on `dev`."""
    if M <= 0 or N <= 0 or K <= 0:
        return 0.0
    eff = gemm_efficiency(dev, dtype, M, N, K, batch, sweep)
    return 2.0 * M * N * K * batch / (dev.peak(dtype) * 1e12 * eff)


def memory_s(dev: DeviceType, size_bytes: float) -> float:
    """Return the seconds to stream `size_bytes` through HBM (read + write counted by the caller)."""
    return size_bytes / (dev.memory_bandwidth_GBps * 1e9 * HBM_FRACTION)


@dataclass(frozen=True)
class LayerOptions:
    """Execution assumptions of one transformer block: flash attention, causal mask skipping inside
    flash, Megatron sequence parallelism."""

    flash: bool = True
    causal: bool = True
    sequence_parallel: bool = True


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one block for one micro-batch on one TP rank: forward and backward compute (GEMMs,
    attention, element-wise), the TP collectives of one direction, and what selective recomputation
    re-runs: the attention core's forward (0 with flash attention, whose backward already
    recomputes it and is costed so)."""

    forward_s: float
    backward_s: float
    tp_comm_s: float
    selective_s: float

    def recompute_s(self, mode: str) -> float:
        """Return the seconds recomputation `mode` adds to the block's backward."""
        if mode == "full":
            return self.forward_s + self.tp_comm_s
        if mode == "selective":
            return self.selective_s
        return 0.0


def layer_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, tp: int, b: int, seq: int,
                opts: LayerOptions, tp_collective_s: Callable[[str, float], float],
                sweep: Sequence[tuple[int, float]] | None = None) -> LayerTimes:
    """Return the LayerTimes of one transformer block of `cfg` at micro-batch `b`, `seq` tokens, TP `tp`.

    `tp_collective_s(op, size_bytes)` gives the seconds of one collective ("all_reduce",
    "all_gather", "reduce_scatter") over the block's TP group.
    """
    w = DTYPE_BYTES[dtype]
    T, h, d = b * seq, cfg.hidden, cfg.dhead
    q_out, kv_out = cfg.heads * d // tp, cfg.kv * d // tp
    ffn = cfg.ffn_hidden // tp
    g = (lambda M, N, K, batch=1: gemm_s(dev, dtype, M, N, K, batch, sweep))
    # dense GEMMs of one TP rank: QKV projection, attention output, MLP in (x2 when gated), MLP out
    dense_fwd = (g(T, q_out + 2 * kv_out, h) + g(T, h, q_out)
                 + g(T, ffn * (2 if cfg.gated_mlp else 1), h) + g(T, h, ffn))
    # backward: input gradient and weight gradient, each the forward's shape transposed
    dense_bwd = (g(T, h, q_out + 2 * kv_out) + g(q_out + 2 * kv_out, h, T) + g(T, q_out, h) + g(h, q_out, T)
                 + g(T, h, ffn * (2 if cfg.gated_mlp else 1)) + g(ffn * (2 if cfg.gated_mlp else 1), h, T)
                 + g(T, ffn, h) + g(ffn, h, T))
    heads = max(1, cfg.heads // tp)
    if opts.flash:
        flops = 4.0 * b * seq * seq * heads * d * (0.5 if opts.causal else 1.0)
        rate = dev.peak(dtype) * 1e12 * gemm_efficiency(dev, dtype, seq, seq, d, b * heads, sweep)
        io = 4.0 * T * heads * d * w  # Q, K, V read, O written
        attn_f = max(flops / rate, memory_s(dev, io))
        attn_b = max(2.5 * flops / rate, memory_s(dev, 2.0 * io + T * heads * d * w))
        core_f = 0.0
    else:
        scores = float(b * heads * seq * seq)
        gemms = g(seq, seq, d, b * heads) + g(seq, d, seq, b * heads)
        # scale + mask + softmax (read scores, write probabilities), dropout (mask byte, output)
        elem_f = memory_s(dev, scores * (w + w + 1 + w))
        core_f = gemms + elem_f
        attn_f = core_f
        attn_b = 2.0 * gemms + 2.0 * elem_f
    # element-wise traffic per token on this rank (bytes): 2 layer norms (read + write h), 2 x bias +
    # dropout + residual (read 2h, write h, mask h/2), activation of the MLP (read, write)
    rep = 2 * 2 * h * w + 2 * (3 * h * w + h)
    if opts.sequence_parallel:
        rep /= tp
    act = (3 if cfg.gated_mlp else 2) * ffn * w
    elem_fwd = memory_s(dev, T * (rep + act))
    fwd = dense_fwd + attn_f + elem_fwd
    bwd = dense_bwd + attn_b + 2.0 * elem_fwd
    size = T * h * w
    if tp > 1:
        comm = (2.0 * (tp_collective_s("all_gather", size) + tp_collective_s("reduce_scatter", size))
                if opts.sequence_parallel else 2.0 * tp_collective_s("all_reduce", size))
    else:
        comm = 0.0
    return LayerTimes(fwd, bwd, comm, core_f)


def head_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, tp: int, b: int, seq: int,
               sweep: Sequence[tuple[int, float]] | None = None) -> tuple[float, float]:
    """Return (forward_s, backward_s) of the output projection onto the vocabulary (split by tp) and
    the fp32 cross-entropy over its logits (memory-bound)."""
    T, V = b * seq, max(1, cfg.vocab // tp)
    f = gemm_s(dev, dtype, T, V, cfg.hidden, 1, sweep)
    bwd = gemm_s(dev, dtype, T, cfg.hidden, V, 1, sweep) + gemm_s(dev, dtype, V, cfg.hidden, T, 1, sweep)
    ce = memory_s(dev, T * V * (DTYPE_BYTES[dtype] + 4 + 4))  # read logits, write fp32 softmax, grads
    return f + ce, bwd + ce


def embedding_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, b: int, seq: int) -> tuple[float, float]:
    """Return (forward_s, backward_s) of the token (+ position) embedding lookup: memory-bound gathers
    and the scatter-add of its gradient."""
    size = b * seq * cfg.hidden * DTYPE_BYTES[dtype]
    return memory_s(dev, 2.0 * size), memory_s(dev, 3.0 * size)


def model_flops_per_sample(cfg: TransformerConfig, seq: int, recompute: str = "none") -> float:
    """Return the training FLOPs of one sequence (forward + backward = 3x forward; +1 forward for full
    recomputation; + the attention core's forward for selective), counting full (non-causal)
    attention as the published MFU formulas do (Narayanan et al. 2021 eq. 3)."""
    fwd = cfg.num_layers * cfg.layer_forward_flops(1, seq) + cfg.head_forward_flops(1, seq)
    extra = 0.0
    if recompute == "full":
        extra = cfg.num_layers * cfg.layer_forward_flops(1, seq)
    elif recompute == "selective":
        extra = cfg.num_layers * 4.0 * seq * seq * cfg.heads * cfg.dhead
    return 3.0 * fwd + extra
