"""Start a group of local worker processes joined by torch.distributed, and collect their results.

Used by the profiler (collectives), the executors of Poseidon and Tessel plans, and Lagom's
calibration. gloo on CPU processes; NCCL when every rank has its own CUDA device.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import Any, Callable

# Keep queue.get from blocking forever when a worker dies without answering.
_POLL_S = 0.5


def rendezvous_store(timeout_s: float) -> Any:
    """Return a master torch.distributed.TCPStore on 127.0.0.1, bound to a port the OS picked.

    The parent holds it for the workers' whole life, so the port cannot be taken by another
    process between choosing it and binding it (a free-port probe followed by a later bind can).
    Its `port` attribute is what the workers connect to.
    """
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)


def _worker(rank: int, world_size: int, backend: str, port: int, threads: int | None,
            fn: Callable[..., Any], args: tuple[Any, ...], queue: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=300))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - report any failure of a worker to the parent
        queue.put((rank, False, traceback.format_exc()))


class WorkerError(RuntimeError):
    """A worker process failed; the message holds its traceback."""


def run_workers(fn: Callable[..., Any], world_size: int, *, args: tuple[Any, ...] = (),
                backend: str = "gloo", threads: int | None = 1, timeout_s: float = 300.0,
                env: dict[str, str] | None = None) -> list[Any]:
    """Run fn(rank, world_size, *args) in `world_size` fresh processes inside one process group.

    `fn` must be importable (a module-level function): processes are spawned, not forked.
    `threads` fixes torch's intra-op threads per process. Returns the results ordered by rank;
    raises WorkerError with the first failing rank's traceback, or on timeout (seconds).
    """
    import queue as queue_mod
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = rendezvous_store(timeout_s)
    port = int(store.port)
    procs = [ctx.Process(target=_worker, args=(r, world_size, backend, port, threads, fn, args, q,
                                                 dict(env or {})), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            try:
                rank, ok, value = q.get(timeout=_POLL_S)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise WorkerError(f"workers did not finish within {timeout_s} s") from None
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and p.exitcode not in (0, None)
                        and r not in results]
                if dead:
                    raise WorkerError(f"worker {dead[0]} exited with code {procs[dead[0]].exitcode}") from None
                continue
            if not ok:
                raise WorkerError(f"worker {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        del store  # closes the rendezvous port
    return [results[r] for r in range(world_size)]
