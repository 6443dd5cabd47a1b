"""Calibrating Lagom's cost model from measured runs.

Two fits (pure numpy/scipy) and the two experiments that feed them (torch, lazily imported):

- `fit_collective`: a group's per-channel bandwidth, link cap and latency scale from collective
  timings per size and channel count (the profiler's sweep; channels set with NCCL_MIN/MAX_CTAS).
- `fit_interference`: kappa (SM share per CTA) and occ_floor (share a minimal CTA takes) from
  compute slowdowns measured with given (channels, threads).
- `measure_collectives` / `measure_interference`: the experiments among local processes
  (`run_workers`): gloo on CPU (the machinery; CPU has no CTAs, so every run is one "channel"),
  NCCL with one GPU per rank when CUDA is available.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from gpuplan.models.lagom import cost


def fit_collective(points: Sequence[tuple[float, int, float]], collective: str, link: cost.Link, consts: cost.Consts,
                   algo: str = "ring", proto: str = "Simple", threads: int = 512,
                   chunk_bytes: int | None = None) -> dict[str, float]:
    """Return {channel_GBps, cap_GBps, latency_scale, max_rel_error} fitted to (size_bytes, channels, time_s)
    points of `collective` on a group shaped like `link`, by least squares on relative error of
    `lagom.cost.comm_time_us` (log-parameterised so every constant stays positive)."""
    from scipy.optimize import least_squares

    s = np.asarray([p[0] for p in points], dtype=float)
    nc = np.asarray([p[1] for p in points], dtype=float)
    t = np.asarray([p[2] for p in points], dtype=float) * 1e6
    chunk = chunk_bytes or cost.default_chunk(algo, proto, collective)

    def model(x: np.ndarray) -> np.ndarray:
        ln = replace(link, channel_GBps=float(np.exp(x[0])), cap_GBps=float(np.exp(x[1])),
                     latency_scale=float(np.exp(x[2])))
        return np.array([cost.comm_time_us(collective, si, algo, proto, ln, consts, ci, threads, chunk)
                         for si, ci in zip(s, nc)], dtype=float)

    best = None
    for cap0 in (link.cap_GBps, 10 * link.cap_GBps, 0.1 * link.cap_GBps):
        x0 = np.log([link.channel_GBps, cap0, 1.0])
        res = least_squares(lambda x: model(x) / t - 1.0, x0, method="trf", x_scale=1.0)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    rel = np.abs(model(best.x) / t - 1.0)
    return {"channel_GBps": float(np.exp(best.x[0])), "cap_GBps": float(np.exp(best.x[1])),
            "latency_scale": float(np.exp(best.x[2])), "max_rel_error": float(rel.max())}


def fit_interference(points: Sequence[tuple[int, int, float]], sms: int) -> dict[str, float]:
    """Return {kappa, occ_floor, max_rel_error} fitted to (channels, threads, slowdown) of a compute-bound
    kernel: 1 - 1/s = (kappa f) nc / SM + kappa (1 - f) nc nt / (640 SM), linear in (kappa f, kappa (1-f))."""
    nc = np.asarray([p[0] for p in points], dtype=float)
    nt = np.asarray([p[1] for p in points], dtype=float)
    s = np.asarray([p[2] for p in points], dtype=float)
    a = np.column_stack([nc / sms, nc * nt / (640.0 * sms)])
    (u, v), *_ = np.linalg.lstsq(a, 1 - 1 / s, rcond=None)
    u, v = max(u, 0.0), max(v, 0.0)
    kappa = u + v
    floor = u / kappa if kappa > 0 else 0.0
    pred = 1 / (1 - (a @ np.array([u, v])))
    return {"kappa": float(kappa), "occ_floor": float(floor), "max_rel_error": float(np.max(np.abs(pred / s - 1)))}


# ---- experiments (torch) -------------------------------------------------------------------------

def _device(backend: str) -> str:
    import torch

    return f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"


def measure_collectives(world_size: int, sizes: list[int], channels: list[int] | None = None, *,
                        backend: str | None = None, repeats: int = 5,
                        timeout_s: float = 300.0) -> list[tuple[float, int, float]]:
    """Return (size_bytes, channels, median time s) of all_reduce among `world_size` local ranks.

    With NCCL each channel count runs in a fresh group with NCCL_MIN_CTAS = NCCL_MAX_CTAS = nc;
    gloo has no channels, so it is measured once and reported as 1 channel.
    """
    from gpuplan.profiling.collectives import _local_worker
    from gpuplan.runtime.launch import run_workers

    backend = backend or default_backend()
    out: list[tuple[float, int, float]] = []
    for nc in (channels or [1]) if backend == "nccl" else [1]:
        env = {"NCCL_MIN_CTAS": str(nc), "NCCL_MAX_CTAS": str(nc)} if backend == "nccl" else {}
        raw = run_workers(_local_worker, world_size, args=(["all_reduce"], sizes, 1, repeats, backend),
                          backend=backend, env=env, timeout_s=timeout_s)[0]
        out += [(float(s), nc, float(spread["median_s"])) for s, spread in raw["all_reduce"]]
    return out


def default_backend() -> str:
    """Return "nccl" when at least two CUDA devices are visible, else "gloo"."""
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"


def _interference_worker(rank: int, world: int, matmul_n: int, iters: int, size_bytes: int,
                         backend: str) -> dict[str, float]:
    import threading

    import torch
    import torch.distributed as dist

    dev = _device(backend)
    a = torch.randn(matmul_n, matmul_n, device=dev)
    buf = torch.ones(max(1, size_bytes // 4), device=dev)

    def loop() -> float:
        if dev != "cpu":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ a
        if dev != "cpu":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    loop()
    dist.barrier()
    alone = min(loop() for _ in range(3))
    dist.barrier()
    stop = threading.Event()
    done = [0]
    flag = torch.zeros(1, device=dev)

    def comm() -> None:
        # After each all_reduce the ranks agree (MAX of a flag) whether any wants to stop, so all
        # leave the loop after the same number of collectives and none is left waiting for a peer.
        stream = torch.cuda.Stream(device=dev) if dev != "cpu" else None
        while True:
            flag.fill_(1.0 if stop.is_set() else 0.0)
            if stream is not None:
                with torch.cuda.stream(stream):
                    dist.all_reduce(buf)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stream.synchronize()
            else:
                dist.all_reduce(buf)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            done[0] += 1
            if flag.item() > 0:
                break

    th = threading.Thread(target=comm)
    th.start()
    time.sleep(0.01)
    overlapped = min(loop() for _ in range(3))
    stop.set()
    th.join()
    return {"alone_s": alone, "overlapped_s": overlapped, "slowdown": overlapped / alone,
            "collectives": float(done[0])}


def measure_interference(world_size: int = 2, *, matmul_n: int = 256, iters: int = 20,
                         size_bytes: int = 4 * 2**20, channels: int | None = None, threads: int | None = None,
                         backend: str | None = None, torch_threads: int = 1,
                         timeout_s: float = 300.0) -> dict[str, float]:
    """Return rank 0's matmul-loop time alone and while all_reduces of `size_bytes` run (s), and the slowdown.

    With NCCL, `channels` and `threads` set NCCL_MIN/MAX_CTAS and NCCL_NTHREADS for the run.
    """
    from gpuplan.runtime.launch import run_workers

    backend = backend or default_backend()
    env: dict[str, str] = {}
    if backend == "nccl" and channels:
        env.update(NCCL_MIN_CTAS=str(channels), NCCL_MAX_CTAS=str(channels))
    if backend == "nccl" and threads:
        env["NCCL_NTHREADS"] = str(threads)
    res = run_workers(_interference_worker, world_size, args=(matmul_n, iters, size_bytes, backend),
                      backend=backend, threads=torch_threads, env=env, timeout_s=timeout_s)
    return {**res[0], "backend": backend, "channels": float(channels or 0), "threads": float(threads or 0)}

