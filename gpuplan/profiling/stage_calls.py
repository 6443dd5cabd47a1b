"""The per-call cost of running a pipeline stage through torch.distributed.pipelining's runtime.

`gpuplan run` executes each stage with a `PipelineStage` under a schedule: every micro-batch's
forward goes through `forward_one_chunk` and its backward through `backward_one_chunk` (argument
handling, the stage's input and output bookkeeping, autograd over the stage's outputs). The layer
table times the modules called directly. This module measures the difference, per forward and per
backward call, the way the runner executes stages but without communication: a one-stage schedule
(`ScheduleGPipe`) in a process group of one rank, whose stage holds one transformer block.

In each round one schedule step runs `micro_batches` micro-batches, its calls timed by wrapping
`forward_one_chunk` / `backward_one_chunk` as the runner's own timing does, then the same block is
called directly on the same micro-batches (forward, then the backward of the same scalar loss the
schedule uses). Rounds interleave the two so a change of machine load between them does not pass
for an overhead. Clock: process CPU time on a one-thread CPU (as the layer table), wall time
otherwise (CUDA synchronised around each call). The overhead is the difference of the medians,
never below zero.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from gpuplan.models.workload import TransformerConfig


@dataclass(frozen=True)
class StageCallOverhead:
    """Per-call overhead of the pipeline runtime (seconds) and the medians it is the difference of."""

    forward_s: float
    backward_s: float
    pipeline_forward_s: float
    pipeline_backward_s: float
    direct_forward_s: float
    direct_backward_s: float
    calls: int


def _call_timer(device: Any, clock: str) -> Callable[[Callable[[], Any]], tuple[Any, float]]:
    """Return run(fn) -> (fn's result, seconds it took) on `device` with `clock` ("cpu" | "wall")."""
    import time

    import torch

    cuda = str(device).startswith("cuda")
    now = time.process_time if clock == "cpu" and not cuda else time.perf_counter

    def run(fn: Callable[[], Any]) -> tuple[Any, float]:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = now()
        out = fn()
        if cuda:
            torch.cuda.synchronize(device)
        return out, now() - t0

    return run


def measure_in_group(config: TransformerConfig, micro_batch: int, seq_len: int, device: Any, dtype: Any, *,
                     clock: str, micro_batches: int = 4, rounds: int = 8, warmup: int = 2) -> StageCallOverhead:
    """Return the StageCallOverhead (seconds) of a one-block stage at (micro_batch, seq_len), measured
    in the current process, which must be the only rank of an initialised default process group."""
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from gpuplan.runtime import gpt

    torch.manual_seed(0)
    module = gpt.Stage(gpt.block(config, 0)).to(device=device, dtype=dtype)
    stage = PipelineStage(module, 0, 1, torch.device(device))
    timer = _call_timer(device, clock)
    calls: dict[str, list[float]] = {"F": [], "B": []}
    for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
        call = getattr(stage, name)

        def timed(*args: Any, _call: Any = call, _kind: str = kind, **kwargs: Any) -> Any:
            out, took = timer(lambda: _call(*args, **kwargs))
            calls[_kind].append(took)
            return out

        setattr(stage, name, timed)

    def loss(y: Any, target: Any) -> Any:  # a scalar whose backward costs next to nothing
        return y.sum()

    schedule = ScheduleGPipe(stage, micro_batches, loss_fn=loss)
    g = torch.Generator().manual_seed(micro_batch * 100003 + seq_len)
    x = torch.randn(micro_batches * micro_batch, seq_len, config.hidden, generator=g).to(device=device, dtype=dtype)
    target = torch.zeros(micro_batches * micro_batch, device=device)
    chunks = [x[i * micro_batch:(i + 1) * micro_batch] for i in range(micro_batches)]
    direct: dict[str, list[float]] = {"F": [], "B": []}
    pipe: dict[str, list[float]] = {"F": [], "B": []}
    for r in range(warmup + rounds):
        calls["F"].clear()
        calls["B"].clear()
        schedule.step(x, target=target, losses=[])
        fwd, bwd = [], []
        for chunk in chunks:
            inp = chunk.detach().clone()
            y, tf = timer(lambda: module(inp))
            _, tb = timer(lambda: y.sum().backward())
            fwd.append(tf)
            bwd.append(tb)
        module.zero_grad(set_to_none=True)
        if r >= warmup:
            pipe["F"] += calls["F"]
            pipe["B"] += calls["B"]
            direct["F"] += fwd
            direct["B"] += bwd
    med = {k: (statistics.median(pipe[k]), statistics.median(direct[k])) for k in ("F", "B")}
    return StageCallOverhead(forward_s=max(0.0, med["F"][0] - med["F"][1]),
                             backward_s=max(0.0, med["B"][0] - med["B"][1]),
                             pipeline_forward_s=med["F"][0], pipeline_backward_s=med["B"][0],
                             direct_forward_s=med["F"][1], direct_backward_s=med["B"][1],
                             calls=len(pipe["F"]))


def _worker(rank: int, world: int, config_doc: dict[str, Any], micro_batch: int, seq_len: int, device: str,
            dtype_name: str, clock: str, rounds: int) -> dict[str, Any]:
    import torch

    out = measure_in_group(TransformerConfig.model_validate(config_doc), micro_batch, seq_len, device,
                           getattr(torch, dtype_name), clock=clock, rounds=rounds)
    return out.__dict__


def stage_call_overhead(config: TransformerConfig, micro_batch: int, seq_len: int, device: Any, dtype: Any, *,
                        clock: str, rounds: int = 8) -> StageCallOverhead:
    """Return the pipeline runtime's per-call overhead (seconds per forward / backward call of a stage)
    at (micro_batch, seq_len) on `device` in torch dtype `dtype`, timed with `clock`.

    Without a process group, one of a single rank (gloo on CPU, NCCL on CUDA) is made in this process
    for the measurement and destroyed afterwards; inside one (a torchrun rank, a runner's worker),
    the measurement runs in a fresh one-rank process with this process's torch threads.
    """
    import torch
    import torch.distributed as dist

    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    if dist.is_available() and dist.is_initialized():
        from gpuplan.runtime.launch import run_workers

        dtype_name = str(dtype).removeprefix("torch.")
        res = run_workers(_worker, 1, args=(config.model_dump(mode="json"), micro_batch, seq_len, str(device),
                                            dtype_name, clock, rounds),
                          backend=backend, threads=torch.get_num_threads(), timeout_s=600)[0]
        return StageCallOverhead(**res)
    from gpuplan.runtime.launch import free_port

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return measure_in_group(config, micro_batch, seq_len, device, dtype, clock=clock, rounds=rounds)
    finally:
        dist.destroy_process_group()
