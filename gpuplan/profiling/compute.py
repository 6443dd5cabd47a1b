"""Dense matmul throughput per dtype over a sweep of sizes, and the fraction of the catalog peak.

An n x n by n x n matmul is 2 n^3 FLOPs. On CUDA, fp32 is measured with TF32 switched off (the
catalog's fp32 peak is the non-tensor-core rate) and tf32 separately; bf16 and fp16 where the
device supports them. On CPU: fp32, and bf16 when a bf16 matmul runs there.
"""

from __future__ import annotations

import re
from typing import Any

from gpuplan.models.catalog import canonical_name, catalog_entry
from gpuplan.models.profile import MatmulPoint
from gpuplan.profiling.timing import clock_for, measure

CUDA_SIZES = [1024, 2048, 4096, 8192, 16384]
# Before a CUDA dtype's points, matmuls of SOAK_N run back to back for SOAK_S seconds (SOAK_S_QUICK with
# --quick): a training step keeps the tensor cores busy at the board's power limit, where the clock
# settles below its boost point (on H200 SXM mamf-finder measures 708.5 bf16 TFLOP/s so sustained
# against 841.9 in a short burst), and the points are taken at the rate the model uses for GPUs
# (gpuplan.models.poseidon.cost.GEMM_CEILING), not a cold GPU's burst.
SOAK_N = 8192
SOAK_S = 5.0
SOAK_S_QUICK = 2.0
CPU_SIZES = [256, 512, 1024, 2048]
CPU_SIZES_QUICK = [256, 512]

# gpuplan dtype name -> torch dtype attribute (tf32 is fp32 storage with TF32 matmuls allowed)
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def catalog_match(device_name: str) -> str | None:
    """Return the catalog name of a device as torch names it, or None when nothing matches.

    "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" -> "A100-40GB",
    "NVIDIA GeForce RTX 4090" -> "RTX4090". Tries the whole name, then each word joined with a
    memory size named in the name, then adjacent pairs of words, then single words.
    """
    name = re.sub(r"^(NVIDIA|AMD)\s+", "", device_name.strip(), flags=re.I)
    words = [w for w in re.split(r"[\s_\-]+", name) if w and w.upper() not in ("TESLA", "GEFORCE")]
    memory = [w for w in words if re.fullmatch(r"\d+GB", w, flags=re.I)]
    candidates = [name] + [f"{w}-{m}" for w in words for m in memory if w not in memory] \
        + [f"{a}-{b}" for a, b in zip(words, words[1:])] + [f"{a}{b}" for a, b in zip(words, words[1:])] + words
    for c in candidates:
        found = canonical_name(c)
        if found is not None:
            return found
    return None


def supported_dtypes(device: Any) -> list[str]:
    """Return the dtypes ("fp32", "tf32", "bf16", "fp16") whose matmul this device runs natively."""
    import torch

    if str(device).startswith("cuda"):
        major, _ = torch.cuda.get_device_capability(device)
        out = ["fp32"] + (["tf32"] if major >= 8 else []) + ["fp16"]
        return out + (["bf16"] if torch.cuda.is_bf16_supported() else [])
    try:
        a = torch.ones(8, 8, dtype=torch.bfloat16)
        (a @ a).sum().item()
        return ["fp32", "bf16"]
    except RuntimeError:
        return ["fp32"]


def matmul_point(device: Any, dtype: str, n: int, *, repeats: int = 5, budget_s: float = 2.0) -> MatmulPoint:
    """Time one n x n matmul in `dtype` on `device`; return the point with its TFLOP/s (1e12 FLOP/s)."""
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    is_cuda = str(device).startswith("cuda")
    g = torch.Generator(device=device if is_cuda else "cpu").manual_seed(n)
    a = torch.randn(n, n, generator=g, device=device, dtype=tdtype)
    b = torch.randn(n, n, generator=g, device=device, dtype=tdtype)
    out = torch.empty(n, n, device=device, dtype=tdtype)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    if is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        timing = measure(lambda: torch.matmul(a, b, out=out), device=device, warmup=2, repeats=repeats,
                         budget_s=budget_s, clock=clock_for(device))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return MatmulPoint(dtype=dtype, n=n, tflops=2.0 * n ** 3 / timing.median_s / 1e12, timing=timing)


def soak(device: Any, dtype: str, n: int, seconds: float) -> int:
    """Run n x n matmuls in `dtype` on `device` back to back for at least `seconds` (waiting for the device
    before the clock is read); return how many ran."""
    import time

    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, device=device, dtype=tdtype)
    out = torch.empty(n, n, device=device, dtype=tdtype)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda *_: None)
    ran, ends = 0, time.perf_counter() + seconds
    while True:
        for _ in range(8):  # a few kernels in flight between clock reads
            torch.matmul(a, a, out=out)
        ran += 8
        sync(device)
        if time.perf_counter() >= ends:
            return ran


def matmul_sweep(device: Any, dtypes: list[str], sizes: list[int], *, repeats: int = 5, soak_s: float = 0.0,
                 progress: Any = None) -> list[MatmulPoint]:
    """Return one MatmulPoint per (dtype, size); `progress(message)` is called before each point. With
    `soak_s` > 0 each dtype's points follow `soak_s` seconds of SOAK_N matmuls (see SOAK_S)."""
    points = []
    for dtype in dtypes:
        if soak_s > 0:
            if progress is not None:
                progress(f"matmul {dtype}: {soak_s:g} s at the power limit before timing")
            soak(device, dtype, SOAK_N, soak_s)
        for n in sizes:
            if progress is not None:
                progress(f"matmul {dtype} n={n}")
            points.append(matmul_point(device, dtype, n, repeats=repeats))
    return points


def best_tflops(points: list[MatmulPoint]) -> dict[str, float]:
    """Return the best TFLOP/s per dtype over the reliable points (all points when none is reliable)."""
    best: dict[str, float] = {}
    for dtype in dict.fromkeys(p.dtype for p in points):
        mine = [p for p in points if p.dtype == dtype]
        trusted = [p for p in mine if p.timing.reliable] or mine
        best[dtype] = max(p.tflops for p in trusted)
    return best


def peak_fraction(best: dict[str, float], catalog_name: str | None) -> dict[str, float]:
    """Return measured / catalog peak per dtype (only dtypes the catalog lists); {} off-catalog."""
    entry = catalog_entry(catalog_name) if catalog_name else None
    if entry is None:
        return {}
    peaks: dict[str, float] = entry["peak_tflops"]  # type: ignore[assignment]
    return {d: tf / peaks[d] for d, tf in best.items() if d in peaks and peaks[d] > 0}
