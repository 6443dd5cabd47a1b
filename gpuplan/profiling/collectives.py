"""Collectives through torch.distributed, timed and reported with the nccl-tests conventions.

Message size S (bytes) as nccl-tests counts it: all_reduce and broadcast the buffer, all_gather
the gathered output, reduce_scatter the whole input, send_recv what each rank sends to the next
rank of a ring (and receives from the previous). algbw = S / t, busbw = algbw * F with
F = 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for broadcast and
send_recv. The time of one repeat is the slowest rank's (all ranks start after a barrier).
Every rank reaches the same repeat/retry decisions, because they use the same (max-reduced) times.
"""

from __future__ import annotations

from typing import Any

from gpuplan.models.profile import CollectivePoint, CollectiveProfile, ProfileLink, Spread, bus_factor
from gpuplan.profiling.fit import fit_alpha_beta
from gpuplan.profiling.timing import DEFAULT_MAX_REL_SPREAD, spread_of, timer_for

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"]
KiB, MiB = 1 << 10, 1 << 20


def sizes_between(lo_bytes: int, hi_bytes: int, factor: int = 4) -> list[int]:
    """Return message sizes lo, lo*factor, ... up to and including hi (bytes)."""
    out, s = [], lo_bytes
    while s < hi_bytes:
        out.append(s)
        s *= factor
    return out + [hi_bytes]


def repeats_for(size_bytes: int, repeats: int) -> int:
    """Return the repeats for one message size: more for small, noisy messages (up to 50)."""
    return max(repeats, min(50, int(repeats * MiB / size_bytes)))


def _op_runner(op: str, size_bytes: int, group: Any, device: Any) -> Any:
    """Return a no-argument function that runs `op` once on buffers of nccl-tests size S."""
    import torch
    import torch.distributed as dist

    group = group or dist.group.WORLD
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    count = max(n, size_bytes // 4 // n * n)  # fp32 elements, divisible by n
    full = torch.ones(count, dtype=torch.float32, device=device)
    part = torch.ones(count // n, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part, group=group)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=dist.get_global_rank(group, 0), group=group)
    if op == "send_recv":
        nxt = dist.get_global_rank(group, (me + 1) % n)
        prv = dist.get_global_rank(group, (me - 1) % n)
        recv = torch.empty_like(full)

        def send_recv() -> None:
            ops = [dist.P2POp(dist.isend, full, nxt, group), dist.P2POp(dist.irecv, recv, prv, group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        return send_recv
    raise ValueError(f"a collective among {OPS}, not {op!r}")


def _timed_repeats(run: Any, repeats: int, group: Any, device: Any) -> list[float]:
    """Return the slowest rank's time (s) of each of `repeats` runs, started after a barrier."""
    import torch
    import torch.distributed as dist

    timer = timer_for(device)
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        times.append(timer(run))
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(v) for v in t.cpu()]


def sweep(ops: list[str], sizes: list[int], *, group: Any = None, device: Any = "cpu", warmup: int = 1,
          repeats: int = 5, retries: int = 1,
          max_rel_spread: float = DEFAULT_MAX_REL_SPREAD) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Time each op at each size among the ranks of `group` (None: the world); every rank calls this.

    Returns {op: [(size_bytes, Spread as a dict), ...]}, the same on every rank. Needs an
    initialised process group.
    """
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for op in ops:
        out[op] = []
        for size in sizes:
            run = _op_runner(op, size, group, device)
            for _ in range(warmup):
                run()
            n = repeats_for(size, repeats)
            for _ in range(retries + 1):
                spread = spread_of(_timed_repeats(run, n, group, device), max_rel_spread)
                if spread.reliable:
                    break
                n *= 2
            out[op].append((size, spread.model_dump()))
    return out


def to_profiles(raw: dict[str, list[tuple[int, dict[str, Any]]]], *, backend: str, group_size: int,
                scope: str = "intra_node", nodes: list[str] | None = None) -> list[CollectiveProfile]:
    """Return one CollectiveProfile per op of a sweep: points with algbw/busbw, and the alpha-beta fit.

    The fit is t(S) = alpha + S / bandwidth on the nccl-tests size S, so its bandwidth is an algbw.
    """
    out = []
    for op, rows in raw.items():
        points = []
        for size, spread in rows:
            timing = Spread.model_validate(spread)
            algbw = size / timing.median_s / 1e9
            points.append(CollectivePoint(size_bytes=size, timing=timing, algbw_GBps=algbw,
                                          busbw_GBps=algbw * bus_factor(op, group_size)))
        fit = fit_alpha_beta([p.size_bytes for p in points], [p.timing.median_s for p in points]) \
            if len(points) >= 2 else None
        out.append(CollectiveProfile(op=op, backend=backend, group_size=group_size, scope=scope,  # type: ignore[arg-type]
                                     nodes=list(nodes or []), points=points, fit=fit))
    return out


def link_from(collective: CollectiveProfile, a: str, b: str) -> ProfileLink | None:
    """Return the link a-b described by a fitted send_recv profile (None when it has no fit)."""
    if collective.op != "send_recv" or collective.fit is None:
        return None
    return ProfileLink(a=a, b=b, bandwidth_GBps=collective.fit.bandwidth_GBps, latency_s=collective.fit.alpha_s,
                       max_rel_error=collective.fit.max_rel_error)


def _local_worker(rank: int, world: int, ops: list[str], sizes: list[int], warmup: int, repeats: int,
                  backend: str) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    import torch

    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    return sweep(ops, sizes, device=device, warmup=warmup, repeats=repeats)


def measure_local(world_size: int, *, backend: str = "gloo", ops: list[str] | None = None,
                  sizes: list[int] | None = None, warmup: int = 1, repeats: int = 5, threads: int = 1,
                  node: str = "local", timeout_s: float = 600.0) -> list[CollectiveProfile]:
    """Run the collective sweep among `world_size` local processes (gloo on CPU, NCCL one GPU each).

    Returns one CollectiveProfile per op (default: every op of OPS over 4 KiB..64 MiB).
    """
    from gpuplan.runtime.launch import run_workers

    ops = ops or OPS
    sizes = sizes or sizes_between(4 * KiB, 64 * MiB)
    raw = run_workers(_local_worker, world_size, args=(ops, sizes, warmup, repeats, backend), backend=backend,
                      threads=threads, timeout_s=timeout_s)[0]
    return to_profiles(raw, backend=backend, group_size=world_size, scope="intra_node", nodes=[node])
