"""Poseidon's per-operation time model: GEMMs by shape, attention, element-wise ops, tensor-parallel
collectives, and what each recomputation mode adds. All times in seconds, sizes in bytes.

Assumptions (each one recorded in docs/poseidon.md, with its source):

* GEMM time: math at the device's dtype peak times the largest-GEMM ceiling of its type (measured
  "maximum achievable matmul FLOPS", MAMF) times tile and wave quantisation (128x128 / 128x256 /
  256x128 output tiles over the streaming multiprocessors, the best of them, as cuBLAS heuristics
  pick). Before Hopper the epilogue is serial (`serial_epilogue`): max(math, A and B read once) plus
  the output write, all traffic at `HBM_FRACTION` of the datasheet bandwidth; Hopper overlaps the
  epilogue (roofline: max(math, A + B + C traffic)) but pays a fixed cost per output tile, worth
  `HOPPER_TILE_K0` more elements of K, as measured sweeps over K show (`k_efficiency`).
  Weight-gradient GEMMs accumulate into the main gradients (`MAIN_GRAD_BYTES` in fp32; 4 B in 16 bits, the
  problem's `grad_reduce_in_fp32`). When the problem
  carries a measured matmul sweep (profile), the measured fraction of peak at the GEMM's equivalent
  cube size replaces the ceiling.
* Element-wise ops (layer norms, bias + GeLU / SwiGLU, bias + dropout + residual, cross-entropy)
  are memory-bound: bytes read + written at `HBM_FRACTION` of the bandwidth; backward moves about
  twice the forward's bytes. `layer_ops` lists each operation of a block with its times.
* Attention: flash attention (fused, scores never stored) when `flash`; its forward FLOPs are
  4 b s^2 (heads x head_dim) / tp, halved when `causal` (the kernel skips masked blocks), its
  backward 2.5x the forward (five matmuls instead of two: it recomputes the scores), at the rates
  measured for the kernel the attention library runs (`attention_library`): cuDNN's on Hopper under
  Transformer Engine (`FLASH_HOPPER_TFLOPS`), FlashAttention-2's on the A100 and, under PyTorch's
  SDPA, on Hopper (`FLASH2_TFLOPS`); else at the GEMM rate. Without flash,
  Megatron-LM's explicit path (2021-22): QK^T and AV batched GEMMs over the full square, the fused
  scale-mask-softmax kernel (causal: it reads the lower triangle only) and a separate dropout kernel
  over b (heads/tp) s^2 scores, the QKV bias added by its own kernel, the context layer's permute
  copy, and in backward autograd's extra kernels: the alpha scaling of dQ and dK (torch.baddbmm's
  derivative) and the concatenation of the Q, K, V gradients (the split's derivative).
* Recomputation: "full" re-runs the whole layer forward (its GEMMs, attention, element-wise ops and
  TP collectives) in backward; "selective" (Korthikanti et al. 2022) re-runs only the attention core
  (QK^T, softmax, dropout, AV); with flash attention that core is already recomputed inside the
  flash backward, so selective costs nothing extra and saves nothing extra.
* fp8 training (`dtype` fp8: Transformer Engine's recipe, E4M3 forward / E5M2 gradients): the four
  linear layers' GEMMs of a block (forward, input gradient, weight gradient) run on fp8 tensor cores
  with 1-byte operands and 16-bit outputs (the weight gradient into fp32 main gradients), at the
  type's fp8 ceiling (`FP8_CEILING`), the two gradient GEMMs slower by `FP8_SPLIT_ACCUMULATION`
  on Ada and Hopper (they accumulate with fp32 promotion; Blackwell accumulates in fp32); each
  linear's input (forward) and output gradient (backward) pass through a cast-transpose kernel that
  reads them in bf16 and writes the fp8 copy and its transpose (`FP8_CAST_BYTES` per element),
  after an amax pass with current scaling (`FP8_AMAX_BYTES`). Attention, element-wise ops, the embedding and the
  output head stay in bf16 (`storage_dtype`).
* Eager kernels (`eager`: PyTorch without torch.compile, as torchtitan's Llama runs by default): the
  rotary embedding on Q and K in complex fp32 (`eager_rope_bytes`; gated-MLP models, the Llama family:
  others are taken as GPT-style, learned positions), SwiGLU as silu then mul, the input-gradient adds of
  the separate wq / wk / wv and w1 / w3 linears, residual adds without dropout; the norm stays one fused
  kernel unless `composite_norm` (`composite_norm_bytes`). Byte counts from torchtitan's code.
* Tensor parallelism (Megatron): two all-reduces of the layer's activations per direction, or with
  sequence parallelism two all-gathers and two reduce-scatters of the same total bus volume; not
  overlapped with compute, unless `tp_overlap` (Transformer Engine's userbuffers overlap, Megatron's
  `--tp-comm-overlap`, which needs sequence parallelism): each collective then runs beside the GEMM
  that consumes or produces its tensor (`tp_overlap_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from gpuplan.models.catalog import canonical_name, catalog_chip
from gpuplan.models.cluster import DeviceType
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, storage_dtype

if TYPE_CHECKING:
    from gpuplan.models.profile import LayerTable

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")

# Fraction of the datasheet HBM bandwidth a streaming kernel reaches. Source: measured device-to-device
# copies reach ~90% of the datasheet rate (e.g. 3.57 of 3.94 TB/s on Hopper; ~1.8 of 2.04 TB/s is
# the usual A100-80GB figure); an assumption, not a fit to training throughput.
HBM_FRACTION = 0.9

# Largest-GEMM ceiling per catalog type: the best bf16 matmul TFLOP/s measured with mamf-finder over
# the dense datasheet peak (S. Bekman, ml-engineering, "Maximum Achievable Matmul FLOPS comparison
# table"). A training step keeps the tensor cores busy at the board's power limit, where the clock
# settles below its boost point, so where the table gives the *sustainable* figure (MSMF: the chip
# thermally soaked and power-saturated, "the number that matches sustained training throughput") it is
# taken, else the achievable one (MAMF: a short burst at the boost clock). Hopper SXM: H200 SXM's
# MSMF, 708.5/989.4 (693 W at 1465 MHz, torch 2.13 / CUDA 13.0; its MAMF is 841.9): the same GH100 die,
# SMs, clocks and 700 W limit as H100 SXM (the table lists H100 SXM's MAMF, 794.5, as "H200 is the
# same"). Blackwell: B200 SXM's MSMF, 1456.3/2250 (994 W at 1339 MHz; its MAMF is 1770.9 at 1965 MHz);
# B300 is "the same as B200" in the table. Superchip parts with a higher power limit and no sustained
# figure of their own take their die's: GH200 (900 W) Hopper's, GB200 and GB300 (1200 and 1400 W)
# Blackwell's. The higher limit lets the clock settle somewhat higher, which this does not credit,
# while their burst MAMF (GH200 821.0/989, GB200 1822/2500) would credit the boost clock no training
# step holds. A100 SXM: the table has only its burst MAMF (267.9/312); its sustained rate is Azure's
# (Azure/AI-benchmarking-guide, ND A100 v4, A100-SXM4-80GB: cuBLASLt fp16 GEMMs after 10,000 warm-up
# iterations, 256.5 TFLOP/s at 16384^3, the best of its sweep), taken for the 40 GB part too (the same
# die, clocks and 400 W limit). A100 PCIe has no sustained figure: its MAMF, 256.4/312. Types without
# a measurement use their architecture's figure, else DEFAULT_CEILING.
HOPPER_SUSTAINED = 708.5 / 989.4
BLACKWELL_SUSTAINED = 1456.3 / 2250
AMPERE_SUSTAINED = 256.5 / 312
GEMM_CEILING: dict[str, float] = {"A100-80GB": AMPERE_SUSTAINED, "A100-40GB": AMPERE_SUSTAINED,
                                  "H100": HOPPER_SUSTAINED, "H200": HOPPER_SUSTAINED, "H100-PCIe": 256.4 / 312}
ARCH_CEILING: dict[str, float] = {"ampere": AMPERE_SUSTAINED, "hopper": HOPPER_SUSTAINED,
                                  "blackwell": BLACKWELL_SUSTAINED}
DEFAULT_CEILING = 0.8

# The sustained over the burst rate of Hopper's tensor cores at bf16, from the same measurement (H200
# SXM MSMF / MAMF, 708.5 / 841.9): what a kernel timed in short bursts at the boost clock (the fused
# attention rates below) keeps when it runs inside a training step at the power limit.
HOPPER_SUSTAINED_OVER_BURST = 708.5 / 841.9

# Largest-GEMM ceiling of fp8 (float8_e4m3fn) GEMMs per architecture, over the dense fp8 datasheet peak,
# from the same table and rule as GEMM_CEILING: Hopper, H200 SXM's MSMF 1288.7/1978.9 (693 W at 1374
# MHz; its MAMF is 1491.9, H100 SXM's 1402.6); Blackwell, B200 SXM's MSMF 2795.7/4500 (990 W at 1331
# MHz; its MAMF is 3435.2). Architectures without an fp8 measurement use their bf16 ceiling.
FP8_CEILING: dict[str, float] = {"hopper": 1288.7 / 1978.9, "blackwell": 2795.7 / 4500}

# Slowdown of fp8 GEMMs that accumulate with promotion to fp32 ("split accumulator", cuBLASLt's
# CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0) against fast accumulation: Transformer Engine's recipe runs the
# forward GEMM with fast accumulation and the input- and weight-gradient GEMMs split (as torchao's
# float8 training does); torchao users measure fast accumulation 1.1-1.2x faster (pytorch/ao issue
# 2377): the middle, 1.15, is taken. It applies where the tensor cores' fp8 accumulator is narrower
# than fp32 and the kernels promote it (`SPLIT_ACCUMULATION_ARCHS`: Ada and Hopper, whose fp8 MMA
# accumulates in about 22 bits); Blackwell's fp8 MMA accumulates in fp32 and cuBLASLt has no fast
# accumulation mode for it (Transformer Engine pull request 2748: "there is no fastAccuMode for sm100").
FP8_SPLIT_ACCUMULATION = 1.15
SPLIT_ACCUMULATION_ARCHS: tuple[str, ...] = ("ada", "hopper")

# Fused (flash) attention on Hopper as measured: cuDNN's kernel, which Transformer Engine prefers on
# Hopper, in bf16 with head dim 128 on an H100 80GB SXM5 (Shah et al., "FlashAttention-3", 2024,
# figures "Attention forward speed, head dim 128" with and without the causal mask, and "Attention
# backward speed, head dim 128"), TFLOP/s per sequence length, FLOPs counted as FlashAttention
# counts them (causal: half; backward: 2.5x the forward). Interpolated in log sequence length,
# clamped at the ends, as fractions of the dense bf16 peak (989.4), times HOPPER_SUSTAINED_OVER_BURST
# (a benchmark's short runs hold the boost clock; a training step runs at the power limit). Other
# architectures keep the GEMM rate of (s, s, head_dim) x heads.
FLASH_SEQ: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
FLASH_HOPPER_TFLOPS: dict[str, tuple[float, ...]] = {
    "forward": (497.0, 574.0, 617.0, 609.0, 600.0, 595.0),
    "forward_causal": (315.0, 410.0, 484.0, 518.0, 529.0, 539.0),
    "backward": (305.0, 408.0, 465.0, 499.0, 518.0, 516.0)}
FLASH_HOPPER_PEAK = 989.4

# FlashAttention-2 as measured, forward and backward together, bf16, 16k tokens per batch, hidden 2048
# (Dao, "FlashAttention-2", 2023, figures "Attention forward + backward speed" on an A100 80GB SXM4 and an
# H100 80GB SXM5; the repository's assets/flash2_a100_fwd_bwd_benchmark.png and
# flash2_h100_fwd_bwd_benchmark.png), TFLOP/s per sequence length (`FLASH_SEQ`) by (head dim, causal),
# FLOPs counted as for Hopper's table (forward and backward: 3.5x the forward). It is the kernel PyTorch's
# scaled_dot_product_attention runs on sm80 and sm90 (its flash backend first; cuDNN's is opt-in since
# torch 2.5.1, pytorch pull request 138522; torchtitan issue 1042: H100s dispatch FLASH_ATTENTION) and
# Megatron-LM's --use-flash-attn. Labels the figures' legends hide were read from the bars' heights
# against the labelled bars (A100, head dim 128, no mask: 151 and 172 at 512 and 1k tokens; H100, the same
# panel: 294 at 1k, whose label is half visible and agrees). The pair's rate is taken for each direction,
# so the pair's time is the figure's and its split is not (the paper has the forward faster). Head dims
# between 64 and 128 are interpolated, others clamped. Each chip's figures are taken as fractions of its
# dense 16-bit peak (`FLASH2_PEAK`) times its sustained over burst matmul rate (a benchmark's short runs
# hold the boost clock): Hopper's (`HOPPER_SUSTAINED_OVER_BURST`), and the A100's, Azure's soaked 256.5
# over mamf-finder's MAMF 267.9. The A100's apply to sm80 parts only (`FLASH2_AMPERE_TYPES`): sm86 (A10,
# A40) has less shared memory per SM and other kernel tiles.
FLASH2_TFLOPS: dict[str, dict[tuple[int, bool], tuple[float, ...]]] = {
    "ampere": {(64, False): (132.0, 153.0, 162.0, 171.0, 175.0, 176.0),
               (64, True): (88.0, 119.0, 140.0, 156.0, 165.0, 171.0),
               (128, False): (151.0, 172.0, 187.0, 196.0, 201.0, 203.0),
               (128, True): (99.0, 133.0, 155.0, 173.0, 182.0, 189.0)},
    "hopper": {(64, False): (215.0, 254.0, 274.0, 288.0, 294.0, 296.0),
               (64, True): (141.0, 192.0, 232.0, 257.0, 273.0, 284.0),
               (128, False): (248.0, 294.0, 320.0, 326.0, 335.0, 338.0),
               (128, True): (163.0, 221.0, 265.0, 294.0, 308.0, 328.0)}}
AMPERE_SUSTAINED_OVER_BURST = 256.5 / 267.9
FLASH2_PEAK: dict[str, tuple[float, float]] = {"ampere": (312.0, AMPERE_SUSTAINED_OVER_BURST),
                                               "hopper": (FLASH_HOPPER_PEAK, HOPPER_SUSTAINED_OVER_BURST)}
FLASH2_AMPERE_TYPES: tuple[str, ...] = ("A100-40GB", "A100-80GB")

# Which kernel runs fused attention, by the library that calls it (`attention_library`): Transformer
# Engine ("te": Megatron-LM, NeMo) takes cuDNN's fused attention on Hopper (`FLASH_HOPPER_TFLOPS`) and
# FlashAttention-2 on the A100 (the measured one there); PyTorch's scaled_dot_product_attention ("sdpa":
# FSDP scripts, Hugging Face, earlier torchtitan releases) runs FlashAttention-2 on both. Blackwell has no
# measurement either way: the GEMM rate.
ATTENTION_LIBRARIES: tuple[str, ...] = ("te", "sdpa")

# Bytes per element of Transformer Engine's cast-transpose of a linear layer's input (forward) or
# output gradient (backward) in fp8 training: read the bf16 tensor (2), write its fp8 copy (1) and
# the transposed fp8 copy the weight gradient reads (1). First principles.
FP8_CAST_BYTES = 4.0

# Bytes per element of current scaling's amax pass (Transformer Engine's Float8CurrentScaling, Megatron-LM's
# --fp8-recipe tensorwise, torchao's dynamic tensorwise float8): the tensor's absolute maximum is computed
# in a kernel of its own that reads the bf16 tensor once (2 B) before the cast-transpose scales it with
# it; delayed scaling takes the scale from earlier iterations' amax history, recorded by the cast itself.
# First principles.
FP8_AMAX_BYTES = 2.0

# Fixed cost per output tile of Hopper's GEMM kernels, in elements of the inner dimension K: a tile's
# prologue (the pipeline's first loads) and epilogue take as long as K0 more steps of its main loop, so an
# M x N x K GEMM runs at (1 + K0 / K_ceiling) / (1 + K0 / K) of the ceiling (`k_efficiency`), the ceiling
# having been measured at K_ceiling. fp8: tile-lang's FP8 matmul benchmark on an H800 SXM (H100 SXM's SMs
# and clocks; tile-ai/tilelang benchmark/matmul_fp8/README.md: M = N = 8192, K = 256 to 16384, 376 / 622
# / 927 / 1174 / 1378 / 1461 / 1523 TFLOP/s) follows A K / (K + K0) within 2% from K = 1024 up with
# K0 = 734 (its two ends, K = 1024 and 16384, give K0); the same K0 gives Azure's soaked cuBLASLt sweep on
# H100 (fp8, 2048^3 to 16384^3: `gemm_sweeps` in benchmarks/data) within 2% as well. 16-bit: the same
# time per tile at half the math rate per element of K, K0 = 734 / 2. K_ceiling: the inner dimension of
# the best shape mamf-finder reports for H100 SXM (bf16 2048 x 2048 x 13312, fp8 1024 x 9216 x 14336).
# Other architectures have no such sweep (Ampere's serial epilogue, `serial_epilogue`, is its own
# per-tile cost).
HOPPER_TILE_K0: dict[str, float] = {"fp8": 734.0, "bf16": 367.0, "fp16": 367.0}
HOPPER_CEILING_K: dict[str, float] = {"fp8": 14336.0, "bf16": 13312.0, "fp16": 13312.0}

# Streaming multiprocessors of a type outside the catalog (the catalog's types: `catalog_chip`).
DEFAULT_SMS = 108

# Architectures whose GEMM kernels overlap a tile's epilogue (output write) with the next tile's math:
# Hopper's persistent warp-specialised kernels (CUTLASS 3.x "KernelTmaWarpSpecializedPingpong": one
# consumer warp group runs its epilogue while the other runs its mainloop). Earlier architectures'
# kernels (CUTLASS 2.x, cuBLAS 11: one output tile per thread block, a 128x256 tile's accumulators
# leave room for one block per SM) write the tile after its mainloop: see `serial_epilogue`.
OVERLAPPED_EPILOGUE_ARCHS: tuple[str, ...] = ("hopper", "blackwell")

# Bytes per weight-gradient element a mixed-precision step moves per micro-batch when the gradient is
# accumulated into fp32 main gradients (Megatron-LM's main_grad; fused into the GEMM epilogue with
# --gradient-accumulation-fusion: read + write 4 bytes). First principles; the unfused 2021 path
# (write the 16-bit gradient, then a separate add) moves more, 2 + 2 + 8 = 12 bytes, and 16-bit main
# gradients less (`models.poseidon.wgrad_bytes`).
MAIN_GRAD_BYTES = 8.0


def eager_rope_bytes(w: int) -> float:
    """Return the HBM bytes per element of Q or K that eager rotary embedding moves in one direction, as
    torchtitan's Llama applies it (view_as_complex of x.float(), a complex multiply, type_as back):
    the cast up (read w, write 4), the complex multiply in fp32 (read 4, write 4), the cast back (read 4,
    write w); its backward runs the same three kernels in reverse."""
    return (w + 4) + 8 + (4 + w)


def composite_norm_bytes(w: int) -> tuple[float, float]:
    """Return the (forward, backward) HBM bytes per element of an RMSNorm run as PyTorch's separate
    eager kernels in fp32, as torchtitan's 2024 `rmsnorm` wrote it (x.float(); x * rsqrt(x.pow(2).mean(-1)
    + eps); .type_as(x) * weight) on `w`-byte activations: forward the cast up (w + 4), pow (8), the mean's
    read (4), the scaling (8), the cast back (4 + w), the weight multiply (2w); backward autograd's
    kernels: the weight multiply's input gradient (2w) and weight gradient (multiply 3w, sum w), the cast
    (w + 4), the scaling's two gradients (8; multiply 12 and row sum 4), the mean's expanded gradient (4),
    pow's (12), their sum (12) and the cast back (4 + w). First principles from the code; the row-wise
    statistics are negligible."""
    return 4 * w + 28, 8 * w + 60


# Output tiles cuBLAS / CUTLASS use for large 16-bit GEMMs on Ampere and Hopper (threadblock tiles).
TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128))


def gemm_ceiling(dev: DeviceType, dtype: str = "bf16") -> float:
    """Return the fraction of the dense `dtype` peak the largest GEMMs reach on `dev` (1.0 for measured
    types, whose peak is already the measured best; fp8: `FP8_CEILING` of the architecture when
    measured, else the 16-bit ceiling)."""
    if dev.measured:
        return 1.0
    if dtype == "fp8" and dev.arch in FP8_CEILING:
        return FP8_CEILING[dev.arch]
    return GEMM_CEILING.get(dev.name, ARCH_CEILING.get(dev.arch, DEFAULT_CEILING))


def k_efficiency(dev: DeviceType, dtype: str, K: int) -> float:
    """Return the factor (> 0; 1 at the ceiling's own K) by which the per-tile fixed cost of `dev`'s GEMM
    kernels scales its `dtype` ceiling at inner dimension K (`HOPPER_TILE_K0`); 1 where no sweep
    measures it (other architectures, measured or unknown types)."""
    k0 = HOPPER_TILE_K0.get(dtype)
    if dev.measured or dev.arch != "hopper" or k0 is None or K <= 0:
        return 1.0
    return (1.0 + k0 / HOPPER_CEILING_K[dtype]) / (1.0 + k0 / K)


def wave_efficiency(dev: DeviceType, M: int, N: int, batch: int = 1) -> float:
    """Return the tile-and-wave quantisation factor in (0, 1] of an M x N output (times `batch`):
    useful work over the work of the whole waves of padded tiles, best of `TILES`; 1.0 for measured
    or unknown-architecture types (CPUs, declared devices: no tile model applies)."""
    if dev.measured or dev.arch == "unknown":
        return 1.0
    chip = catalog_chip(dev.name)
    sms = chip[0] if chip else DEFAULT_SMS
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
    cube size (M N K)^(1/3); otherwise the roofline with the type's ceiling (times the per-tile cost's
    `k_efficiency` at inner dimension K) times tile/wave quantisation.
    """
    if sweep:
        return max(1e-6, min(1.0, sweep_fraction(sweep, (M * N * K) ** (1.0 / 3.0))))
    ceiling = gemm_ceiling(dev, dtype) * k_efficiency(dev, dtype, K)
    return roofline_efficiency(dev, dtype, M, N, K, ceiling) * wave_efficiency(dev, M, N, batch)


def flash_fractions(dev: DeviceType, seq: int, causal: bool, head_dim: int = 128,
                    library: str = "te") -> tuple[float, float] | None:
    """Return the (forward, backward) fractions of the dense 16-bit peak that fused attention reaches
    at `seq` tokens on `dev` as measured for the kernel `library` runs there (`ATTENTION_LIBRARIES`):
    cuDNN's on Hopper under "te" (`FLASH_HOPPER_TFLOPS`, head dim 128), FlashAttention-2's on the A100
    and, under "sdpa", on Hopper (`FLASH2_TFLOPS`, head dim 64 and 128); or None where no measurement
    applies (other types, measured or unknown ones: the GEMM rate stands)."""
    if dev.measured:
        return None
    at = max(FLASH_SEQ[0], min(FLASH_SEQ[-1], seq))  # clamped at both ends

    def fraction(tflops: Sequence[float], scale: float) -> float:  # the measured curve at `at`, x `scale`
        return sweep_fraction([(n, f * scale) for n, f in zip(FLASH_SEQ, tflops)], at)

    if dev.arch == "hopper" and library == "te":
        scale = HOPPER_SUSTAINED_OVER_BURST / FLASH_HOPPER_PEAK
        return (fraction(FLASH_HOPPER_TFLOPS["forward_causal" if causal else "forward"], scale),
                fraction(FLASH_HOPPER_TFLOPS["backward"], scale))
    chip = "hopper" if dev.arch == "hopper" else "ampere" if canonical_name(dev.name) in FLASH2_AMPERE_TYPES else None
    if chip is None:
        return None
    peak, sustained = FLASH2_PEAK[chip]
    lo, hi = (fraction(FLASH2_TFLOPS[chip][d, causal], sustained / peak) for d in (64, 128))
    both = lo + min(1.0, max(0.0, (head_dim - 64) / 64)) * (hi - lo)
    return both, both


def serial_epilogue(dev: DeviceType) -> bool:
    """Return True when `dev`'s GEMM kernels write their output after the math of each tile, not
    overlapped with it: one output tile per thread block, no persistent scheduling (pre-Hopper
    tensor-core kernels: CUTLASS 2.x / cuBLAS 11 on Volta, Turing, Ampere, Ada). Hopper and later
    run persistent warp-specialised kernels whose epilogue overlaps the next tile's math; measured or
    unknown-architecture types carry no kernel model."""
    return not dev.measured and dev.arch not in ("unknown", *OVERLAPPED_EPILOGUE_ARCHS)


def gemm_s(dev: DeviceType, dtype: str, M: int, N: int, K: int, batch: int = 1,
           sweep: Sequence[tuple[int, float]] | None = None, out_bytes: float | None = None) -> float:
    """Return the seconds of `batch` GEMMs of M x N x K (2 M N K FLOPs each) on `dev`.

    `out_bytes` is what the epilogue moves per output element (default: one write of `dtype`;
    `MAIN_GRAD_BYTES` for a weight gradient accumulated into fp32 main gradients). Where the epilogue
    is serial (`serial_epilogue`): max(math at the ceiling x wave efficiency, A and B read once)
    plus the output traffic at the streaming rate; else the roofline `gemm_efficiency`, with the
    output traffic counted in its memory term.
    """
    if M <= 0 or N <= 0 or K <= 0:
        return 0.0
    w = DTYPE_BYTES.get(dtype, 2)
    ob = float(w if out_bytes is None else out_bytes)
    flops = 2.0 * M * N * K * batch
    peak = dev.peak(dtype) * 1e12
    if sweep or not serial_epilogue(dev):
        t = flops / (peak * gemm_efficiency(dev, dtype, M, N, K, batch, sweep))
        if out_bytes is None:
            return t
        return max(t, memory_s(dev, batch * ((M * K + K * N) * w + M * N * ob)))
    math_s = flops / (peak * gemm_ceiling(dev, dtype) * wave_efficiency(dev, M, N, batch))
    operands_s = memory_s(dev, batch * (M * K + K * N) * w)
    return max(math_s, operands_s) + memory_s(dev, batch * M * N * ob)


def memory_s(dev: DeviceType, size_bytes: float) -> float:
    """Return the seconds to stream `size_bytes` through HBM (read + write counted by the caller)."""
    return size_bytes / (dev.memory_bandwidth_GBps * 1e9 * HBM_FRACTION)


@dataclass(frozen=True)
class LayerOptions:
    """Execution assumptions of one transformer block: flash attention, causal mask skipping inside
    flash, Megatron sequence parallelism, PyTorch eager element-wise kernels (`eager`: see
    `layer_ops`) instead of fused ones, the norm as PyTorch's composite ops (`composite_norm`:
    `composite_norm_bytes`) instead of one fused kernel, and the bytes a weight-gradient GEMM's
    epilogue moves per element (`wgrad_out_bytes`: `MAIN_GRAD_BYTES` into fp32 main gradients;
    FSDP2 writes the 16-bit gradient, 2); `tp_overlap`: the TP collectives of sequence parallelism run
    beside their GEMMs (`tp_overlap_s`); `fp8_current`: fp8 current scaling, an amax pass over each
    fp8 GEMM input before its cast (`FP8_AMAX_BYTES`); `attention_library`: which library's fused
    attention kernel runs (`ATTENTION_LIBRARIES`, `flash_fractions`)."""

    flash: bool = True
    causal: bool = True
    sequence_parallel: bool = True
    eager: bool = False
    composite_norm: bool = False
    wgrad_out_bytes: float = MAIN_GRAD_BYTES
    tp_overlap: bool = False
    fp8_current: bool = False
    attention_library: str = "te"


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one block for one micro-batch on one TP rank: forward and backward compute (GEMMs,
    attention, element-wise), the TP collectives of one direction, and what selective recomputation
    re-runs: the attention core's forward (0 with flash attention, whose backward already
    recomputes it and is costed so); the memory-bound shares of the forward and backward compute
    (what is not tensor-core work, `OpTime.math`)."""

    forward_s: float
    backward_s: float
    tp_comm_s: float
    selective_s: float
    memory_bound_forward: float = 0.0
    memory_bound_backward: float = 0.0

    def recompute_s(self, mode: str) -> float:
        """Return the seconds recomputation `mode` adds to the block's backward."""
        if mode == "full":
            return self.forward_s + self.tp_comm_s
        if mode == "selective":
            return self.selective_s
        return 0.0


@dataclass(frozen=True)
class OpTime:
    """Seconds of one operation of a block (one micro-batch, one TP rank): its forward and its
    backward; `core` marks the attention core that selective recomputation re-runs, `comm` the TP
    collectives, `math` the tensor-core work (GEMMs, attention); every other op is memory-bound."""

    name: str
    forward_s: float
    backward_s: float
    core: bool = False
    comm: bool = False
    math: bool = False


def layer_ops(cfg: TransformerConfig, dev: DeviceType, dtype: str, tp: int, b: int, seq: int,
              opts: LayerOptions, tp_collective_s: Callable[[str, float], float],
              sweep: Sequence[tuple[int, float]] | None = None) -> list[OpTime]:
    """Return the operations of one transformer block of `cfg` at micro-batch `b`, `seq` tokens, TP
    `tp`, in execution order, each with its forward and backward seconds (see `OpTime`).

    `tp_collective_s(op, size_bytes)` gives the seconds of one collective ("all_reduce",
    "all_gather", "reduce_scatter") over the block's TP group. Without flash attention the kernels are
    Megatron-LM's explicit path: the QKV bias added by its own kernel (`matmul` then `+ bias`), the
    fused scale-mask-softmax kernel and a separate dropout kernel over the scores, and the context
    layer's permute copy back to [s, b, h]. In fp8 training the four linear layers run fp8 GEMMs
    with their cast-transposes (see the module's notes) and everything else runs in `storage_dtype`.
    With `opts.eager` the element-wise ops are PyTorch's eager kernels (the module's notes), with
    `opts.composite_norm` the norms too; weight gradients move `opts.wgrad_out_bytes` per element.
    """
    lin = dtype  # the linear layers' GEMM dtype
    dtype = storage_dtype(dtype)
    fp8 = lin == "fp8"
    w = DTYPE_BYTES[dtype]
    T, h, d = b * seq, cfg.hidden, cfg.dhead
    qkv = (cfg.heads + 2 * cfg.kv) * d // tp
    q_out = cfg.heads * d // tp
    ffn = cfg.ffn_hidden // tp
    ffn_in = ffn * (2 if cfg.gated_mlp else 1)
    sp = tp if opts.sequence_parallel else 1
    explicit = not opts.flash

    def g(M: int, N: int, K: int, batch: int = 1) -> float:
        return gemm_s(dev, dtype, M, N, K, batch, sweep)

    parts: dict[str, tuple[float, float, float]] = {}  # per linear: forward, input gradient, weight gradient

    def linear(n_in: int, n_out: int, name: str) -> tuple[float, float]:
        # forward [T, n_in] x [n_in, n_out]; backward: input gradient and weight gradient (its epilogue
        # moves opts.wgrad_out_bytes per element: fp32 main gradients, or FSDP2's 16-bit gradient)
        wgrad = gemm_s(dev, lin, n_out, n_in, T, 1, None if fp8 else sweep, out_bytes=opts.wgrad_out_bytes)
        if not fp8:
            parts[name] = (g(T, n_out, n_in), g(T, n_in, n_out), wgrad)
        else:
            # fp8 operands, 16-bit outputs; the input's and the output gradient's cast-transposes (a profile's
            # matmul sweep, or the flat `efficiency`, is of 16-bit matmuls: the fp8 GEMMs keep the fp8 ceiling)
            cast = FP8_CAST_BYTES + (FP8_AMAX_BYTES if opts.fp8_current else 0.0)
            fwd = gemm_s(dev, lin, T, n_out, n_in, 1, None, out_bytes=w) + memory_s(dev, T * n_in * cast)
            dgrad = gemm_s(dev, lin, T, n_in, n_out, 1, None, out_bytes=w)
            split = FP8_SPLIT_ACCUMULATION if dev.arch in SPLIT_ACCUMULATION_ARCHS else 1.0
            parts[name] = (fwd, split * dgrad + memory_s(dev, T * n_out * cast), split * wgrad)
        f, dg, wg = parts[name]
        return f, dg + wg

    def elem(fwd_bytes_per_token: float, bwd_factor: float = 2.0) -> tuple[float, float]:
        f = memory_s(dev, T * fwd_bytes_per_token)
        return f, bwd_factor * f

    ops: list[OpTime] = []
    # layer norm: read + write h per token (x2 in the block; replicated unless SP); backward ~2x
    ln = elem(2 * h * w / sp)
    if opts.composite_norm:
        norm_f, norm_b = composite_norm_bytes(w)
        ln = (memory_s(dev, T * h * norm_f / sp), memory_s(dev, T * h * norm_b / sp))
    ops.append(OpTime("layer norm (attention)", *ln))
    ops.append(OpTime("QKV GEMM", *linear(h, qkv, "qkv"), math=True))
    kv_out = cfg.kv * d // tp
    if opts.eager:
        # three linears read the normed input (all-gathered under SP): autograd adds their input
        # gradients (two adds: read 2h, write h each)
        acc = memory_s(dev, T * 2 * 3 * h * w)
        ops.append(OpTime("Q, K, V input-gradient adds (eager)", 0.0, acc))
        if cfg.gated_mlp:  # the Llama family: rotary embedding in complex fp32 on Q and K
            rope = memory_s(dev, T * (q_out + kv_out) * eager_rope_bytes(w))
            ops.append(OpTime("rotary embedding (eager)", rope, rope))
    if explicit:
        # bias added by its own kernel: read + write the QKV output; backward: the bias gradient
        # reduction reads the output gradient once, and the split of the QKV output into Q, K and V
        # (views) has autograd concatenate their three gradients into one tensor (read + write)
        f = memory_s(dev, T * qkv * w * 2)
        ops.append(OpTime("QKV bias add + split", f, f / 2 + f))
    heads = max(1, cfg.heads // tp)
    if opts.flash:
        flops = 4.0 * b * seq * seq * heads * d * (0.5 if opts.causal else 1.0)
        fractions = None if sweep else flash_fractions(dev, seq, opts.causal, d, opts.attention_library)
        if fractions is None:  # no measurement of the kernel: the GEMM rate of its score shape
            fractions = (gemm_efficiency(dev, dtype, seq, seq, d, b * heads, sweep),) * 2
        rate_f, rate_b = (dev.peak(dtype) * 1e12 * f for f in fractions)
        io = 4.0 * T * heads * d * w  # Q, K, V read, O written
        ops.append(OpTime("flash attention", max(flops / rate_f, memory_s(dev, io)),
                          max(2.5 * flops / rate_b, memory_s(dev, 2.0 * io + T * heads * d * w)), math=True))
    else:
        bh = b * heads
        scores = float(bh * seq * seq)
        # QK^T writes the scores; backward dQ = dS K and dK = dS^T Q (K = seq)
        # (torch.baddbmm with alpha = 1/norm_factor: autograd's formula scales dQ and dK by alpha in
        # two element-wise kernels, read + write each)
        ops.append(OpTime("attention scores QK^T", g(seq, seq, d, bh),
                          2.0 * g(seq, d, seq, bh) + memory_s(dev, 2.0 * T * (q_out + kv_out) * w), core=True,
                          math=True))
        # Megatron's fused scale+mask+softmax (`softmax_bytes_per_score`: the causal kernel reads the
        # lower triangle only) then the dropout kernel (read, write output + 1-byte mask; backward:
        # read grad + mask, write)
        sm_f, sm_b = softmax_bytes_per_score(w, seq, opts.causal)
        ops.append(OpTime("softmax + dropout", memory_s(dev, scores * (sm_f + 2 * w + 1)),
                          memory_s(dev, scores * (sm_b + 2 * w + 1)), core=True))
        # AV reads the probabilities; backward dV = P^T dO (K = seq) and dP = dO V^T (writes s^2)
        ops.append(OpTime("attention context AV", g(seq, d, seq, bh), g(seq, d, seq, bh) + g(seq, seq, d, bh),
                          core=True, math=True))
        f = memory_s(dev, T * q_out * w * 2)  # [b, np, s, hn] -> [s, b, np, hn] copy, both ways
        ops.append(OpTime("context permute copy", f, f))
    ops.append(OpTime("attention output GEMM", *linear(q_out, h, "proj"), math=True))
    if opts.eager:
        # residual add: read 2h, write h; backward: the residual's gradient joins the branch's (one add)
        residual = (memory_s(dev, T * 3 * h * w / sp),) * 2
        ops.append(OpTime("residual add (attention, eager)", *residual))
    else:
        # bias + dropout + residual: read 2h, write h, 1-byte mask h (replicated unless SP)
        residual = elem((3 * h * w + h) / sp)
        ops.append(OpTime("bias+dropout+residual (attention)", *residual))
    ops.append(OpTime("layer norm (MLP)", *ln))
    ops.append(OpTime("MLP in GEMM", *linear(h, ffn_in, "fc1"), math=True))
    if opts.eager and cfg.gated_mlp:
        # F.silu(w1(x)) * w3(x): silu (read f, write f) then mul (read 2f, write f); backward: the mul's
        # two gradients (read 2f, write f each), silu's (read 2f, write f); w1's and w3's input
        # gradients added (read 2h, write h)
        ops.append(OpTime("SwiGLU: silu, mul (eager)", memory_s(dev, T * 5 * ffn * w),
                          memory_s(dev, T * (9 * ffn * w + 3 * h * w))))
    else:
        ops.append(OpTime("bias + GeLU / SwiGLU", *elem((ffn_in + ffn) * w)))
    ops.append(OpTime("MLP out GEMM", *linear(ffn, h, "fc2"), math=True))
    ops.append(OpTime("residual add (MLP, eager)" if opts.eager else "bias+dropout+residual (MLP)", *residual))
    size = T * h * w
    if tp > 1 and opts.tp_overlap and opts.sequence_parallel:
        ops.append(OpTime("TP collectives (exposed beside GEMMs)",
                          *tp_overlap_s(parts, tp, tp_collective_s("all_gather", size),
                                        tp_collective_s("reduce_scatter", size)), comm=True))
    elif tp > 1:
        comm = (2.0 * (tp_collective_s("all_gather", size) + tp_collective_s("reduce_scatter", size))
                if opts.sequence_parallel else 2.0 * tp_collective_s("all_reduce", size))
        ops.append(OpTime("TP collectives", comm, comm, comm=True))
    return ops


def tp_overlap_s(parts: dict[str, tuple[float, float, float]], tp: int, all_gather_s: float,
                 reduce_scatter_s: float) -> tuple[float, float]:
    """Return the (forward, backward) seconds the TP collectives of sequence parallelism add to a block
    when each runs beside the GEMM that needs or makes its tensor, as Transformer Engine's userbuffers
    overlap pairs them (Megatron's `--tp-comm-overlap`; the H100 settings of NeMo / Megatron-Bridge's
    performance recipes): forward, the all-gather of the QKV and MLP-in inputs beside those GEMMs and the
    reduce-scatter of the attention-output and MLP-out outputs beside theirs, each split in tp chunks
    exchanged ring-wise with the GEMM's chunks ("ring_exchange": the GEMM's first or last chunk cannot
    overlap, so a pair takes max(G, C + G / tp)); backward, the all-gather of the output gradients of
    the attention-output and MLP-out layers beside their input-gradient GEMMs (ring exchange) and the
    reduce-scatter of the QKV and MLP-in input gradients beside their weight-gradient GEMMs, which run
    whole side by side ("bulk": max(G, C)). `parts` maps "qkv", "proj", "fc1", "fc2" to their
    (forward, input-gradient, weight-gradient) seconds. The exchanges use copy engines or one or two
    SMs, so the GEMMs' own slowdown beside them is not modelled. First principles from the pairing."""
    def ring(gemm: float, comm: float) -> float:
        return max(gemm, comm + gemm / tp) - gemm

    def bulk(gemm: float, comm: float) -> float:
        return max(gemm, comm) - gemm

    fwd = (ring(parts["qkv"][0], all_gather_s) + ring(parts["proj"][0], reduce_scatter_s)
           + ring(parts["fc1"][0], all_gather_s) + ring(parts["fc2"][0], reduce_scatter_s))
    bwd = (ring(parts["fc2"][1], all_gather_s) + bulk(parts["fc1"][2], reduce_scatter_s)
           + ring(parts["proj"][1], all_gather_s) + bulk(parts["qkv"][2], reduce_scatter_s))
    return fwd, bwd


def layer_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, tp: int, b: int, seq: int,
                opts: LayerOptions, tp_collective_s: Callable[[str, float], float],
                sweep: Sequence[tuple[int, float]] | None = None) -> LayerTimes:
    """Return the LayerTimes of one transformer block of `cfg` at micro-batch `b`, `seq` tokens, TP `tp`:
    the sums of `layer_ops` (compute forward and backward, TP collectives of one direction, the
    attention core's forward)."""
    ops = layer_ops(cfg, dev, dtype, tp, b, seq, opts, tp_collective_s, sweep)
    f, g = sum(o.forward_s for o in ops if not o.comm), sum(o.backward_s for o in ops if not o.comm)
    mf = sum(o.forward_s for o in ops if not (o.comm or o.math))
    mb = sum(o.backward_s for o in ops if not (o.comm or o.math))
    return LayerTimes(f, g, sum(o.forward_s for o in ops if o.comm), sum(o.forward_s for o in ops if o.core),
                      mf / f if f > 0 else 0.0, mb / g if g > 0 else 0.0)


def head_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, tp: int, b: int, seq: int,
               sweep: Sequence[tuple[int, float]] | None = None, fused_ce: bool = False,
               wgrad_out_bytes: float = MAIN_GRAD_BYTES) -> tuple[float, float]:
    """Return (forward_s, backward_s) of the output projection onto the vocabulary (split by tp) and
    the vocabulary-parallel cross-entropy over its logits (memory-bound: bytes per logit in
    `ce_bytes_per_logit`, Megatron-LM's fp32 kernel sequence or, with `fused_ce`, the fused kernel);
    in `storage_dtype` (bf16 in fp8 training). The weight gradient's epilogue moves `wgrad_out_bytes`
    per element (`LayerOptions.wgrad_out_bytes`)."""
    dtype = storage_dtype(dtype)
    T, V = b * seq, max(1, cfg.vocab // tp)
    f = gemm_s(dev, dtype, T, V, cfg.hidden, 1, sweep)
    bwd = (gemm_s(dev, dtype, T, cfg.hidden, V, 1, sweep)
           + gemm_s(dev, dtype, V, cfg.hidden, T, 1, sweep, out_bytes=wgrad_out_bytes))
    ce_f, ce_b = ce_bytes_per_logit(DTYPE_BYTES[dtype], fused_ce)
    return f + memory_s(dev, T * V * ce_f), bwd + memory_s(dev, T * V * ce_b)


def ce_bytes_per_logit(w: int, fused: bool = False) -> tuple[float, float]:
    """Return the (forward, backward) HBM bytes per logit of Megatron-LM's vocabulary-parallel
    cross-entropy on `w`-byte logits, one kernel at a time: forward: cast to fp32 (read w, write 4),
    row max (read 4), subtract it in place (4 + 4), exp in place (4 + 4), row sum (4), divide by the
    sum in place, kept as the softmax for backward (4 + 4); backward: scale the softmax by the loss
    gradient in place (4 + 4), cast back (read 4, write w). The target-logit gathers are per token.
    `fused` (Megatron's --cross-entropy-loss-fusion on Transformer Engine's Triton kernel): the
    forward reads the logits for the row's max and sum of exponentials (w), then reads them again
    and writes the gradient over them (2w); the backward scales that gradient in place (2w)."""
    if fused:
        return 3.0 * w, 2.0 * w
    return (w + 4) + 4 + 8 + 8 + 4 + 8, 8.0 + (4 + w)


def softmax_bytes_per_score(w: int, seq: int, causal: bool) -> tuple[float, float]:
    """Return the (forward, backward) HBM bytes per attention score of Megatron-LM's fused
    scale + mask + softmax kernels on `w`-byte scores of `seq` keys.

    Causal (`scaled_upper_triang_masked_softmax`, megatron/fused_kernels, 2021-2023): row i reads
    its first i + 1 scores only and writes the whole row (zeros above the diagonal): forward
    w (s+1)/(2s) + w; backward reads the output gradient and the probabilities of the lower
    triangle and writes the whole row: 2 w (s+1)/(2s) + w. With a padding mask
    (`scaled_masked_softmax`): 2w and 3w. The kernels' own limits (16 < keys <= 2048 until May
    2023, micro-batch x heads a multiple of 4; otherwise PyTorch's fp32 sequence, ~9x the bytes)
    are not modelled: every explicit-attention layer is costed with the fused kernel."""
    if causal:
        r = (seq + 1) / (2.0 * seq)
        return w * r + w, 2.0 * w * r + w
    return 2.0 * w, 3.0 * w


def embedding_times(cfg: TransformerConfig, dev: DeviceType, dtype: str, b: int, seq: int) -> tuple[float, float]:
    """Return (forward_s, backward_s) of the token (+ position) embedding lookup: memory-bound gathers
    and the scatter-add of its gradient (in `storage_dtype`)."""
    size = b * seq * cfg.hidden * DTYPE_BYTES[storage_dtype(dtype)]
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


def stage_call_s(table: "LayerTable | None", device_type: str) -> tuple[float, float]:
    """Return (forward_s, backward_s) the pipeline runtime adds to each forward / backward call of a
    stage on `device_type`: the measured per-call overhead of a layer table (0 without one, or for a
    table measured before the overhead was), times the type's emulated slowdown (a run of an
    emulated type sleeps in proportion to the whole call, overhead included)."""
    if table is None:
        return 0.0, 0.0
    factor = table.slowdowns.get(device_type, 1.0)
    return table.stage_call_forward_s * factor, table.stage_call_backward_s * factor


def blocking_exchanges(fwd: Sequence[float], bwd: Sequence[float], exchange: Sequence[float]
                       ) -> tuple[list[float], list[float], list[float]]:
    """Return (forward_s, backward_s, sends_s) per virtual stage with Megatron-LM's blocking
    pipeline exchanges folded into the compute ops: `fwd[k]`, `bwd[k]` are the seconds of virtual
    stage k's forward / backward of one micro-batch, `exchange[k]` the seconds of one exchange
    between virtual stages k and k + 1 (the send, plus the all-gather across TP that rebuilds the
    tensor under the scatter/gather optimisation).

    Megatron-LM's p2p_communication._communicate (2021-2023: the SC'21 artifact and the 2022 code)
    posts the sends and receives with torch.distributed.batch_isend_irecv, waits for them, then calls
    torch.cuda.synchronize() ("to protect against race condition"), and only then all-gathers the
    received chunks across the TP group (mpu.gather_split_1d_tensor). Neither side computes while it
    exchanges, so each forward of virtual stage k < V - 1 is followed by the exchange with k + 1 and
    each backward of k > 0 by the exchange with k - 1, both on the device's own timeline; the data is
    on the receiver when the sender's op ends, so the DAG's sends become 0 (returned as `sends_s`).
    """
    V = len(fwd)
    if len(bwd) != V or len(exchange) != max(0, V - 1):
        raise ValueError(f"{V} forward, {len(bwd)} backward and {len(exchange)} exchange times: "
                         "expected V, V and V - 1")
    f = [fwd[k] + (exchange[k] if k < V - 1 else 0.0) for k in range(V)]
    g = [bwd[k] + (exchange[k - 1] if k > 0 else 0.0) for k in range(V)]
    return f, g, [0.0] * len(exchange)
