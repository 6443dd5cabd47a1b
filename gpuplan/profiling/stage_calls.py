"""The per-call cost of running a pipeline stage through torch.distributed.pipelining's runtime.

`gpuplan run` executes each stage with a `PipelineStage` under a schedule: every micro-batch's
forward goes through `forward_one_chunk` and its backward through `backward_one_chunk` (argument
handling, the stage's input and output bookkeeping, the received activations and gradients, autograd
over the stage's outputs, the input gradient a later stage computes for the one before). The layer
table times the modules called directly. This module measures the difference, per forward and per
backward call, the way the runner executes stages: a pipeline of `ranks` processes (2 or 3 by
default: a first, a last and, with 3, a middle stage) whose stages each hold one transformer block,
under `Schedule1F1B` with the activations and gradients sent between the ranks (gloo on CPU, NCCL
on CUDA). A one-rank group (one GPU) runs a one-stage `ScheduleGPipe`, without communication.

In each round one schedule step runs `micro_batches` micro-batches on every rank, its calls timed by
wrapping `forward_one_chunk` / `backward_one_chunk` as the runner's own timing does; then every rank
calls its block directly on as many micro-batches at the same time (forward, then the backward of
the output, the input requiring a gradient on every stage but the first, as in the pipeline), so
the direct calls run with the same number of processes computing together as the pipeline's at
most. Rounds interleave the two so a change of machine load does not pass for an overhead. Clock:
process CPU time on a one-thread CPU (as the layer table; it includes the CPU time of gloo's own
threads), wall time otherwise (CUDA synchronised around each call). The overhead is the median of
all ranks' pipeline calls minus the median of their direct calls, never below zero. The same block
called directly by one rank at a time is timed too (`alone_*`): the difference between the two
direct medians is what processes computing together cost each other, which `gpuplan run`'s
prediction takes from its measured core-sharing rates, not from this per-call term.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from gpuplan.models.workload import TransformerConfig


@dataclass(frozen=True)
class StageCallOverhead:
    """Per-call overhead of the pipeline runtime (seconds) and the medians it is the difference of.

    `direct_*`: the block called directly by every rank at once; `alone_*`: by one rank at a time
    (equal to `direct_*` with one rank); `ranks`: the pipeline's processes; `calls`: pipeline
    forward calls timed over all ranks."""

    forward_s: float
    backward_s: float
    pipeline_forward_s: float
    pipeline_backward_s: float
    direct_forward_s: float
    direct_backward_s: float
    calls: int
    alone_forward_s: float = 0.0
    alone_backward_s: float = 0.0
    ranks: int = 1


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


def measure_rank(config: TransformerConfig, micro_batch: int, seq_len: int, device: Any, dtype: Any, *,
                 clock: str, micro_batches: int = 4, rounds: int = 8, warmup: int = 2) -> dict[str, list[float]]:
    """Return this rank's timings (seconds per call) of a one-block stage at (micro_batch, seq_len):
    "pipeline_F"/"pipeline_B" (calls of the schedule), "direct_F"/"direct_B" (the block called by
    every rank at once), "alone_F"/"alone_B" (called by one rank at a time). The current process
    must be a rank of an initialised default process group; every rank calls this together."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from gpuplan.runtime import gpt

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    module = gpt.Stage(gpt.block(config, 0)).to(device=device, dtype=dtype)
    stage = PipelineStage(module, rank, world, torch.device(device))
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

    schedule = (Schedule1F1B if world > 1 else ScheduleGPipe)(stage, micro_batches, loss_fn=loss)
    g = torch.Generator().manual_seed(micro_batch * 100003 + seq_len + rank)
    x = torch.randn(micro_batches * micro_batch, seq_len, config.hidden, generator=g).to(device=device, dtype=dtype)
    target = torch.zeros(micro_batches * micro_batch, device=device)
    chunks = [x[i * micro_batch:(i + 1) * micro_batch] for i in range(micro_batches)]

    def direct(sink: dict[str, list[float]]) -> None:
        for chunk in chunks:
            inp = chunk.detach().clone().requires_grad_(rank > 0)  # later stages compute the input gradient
            y, tf = timer(lambda: module(inp))
            _, tb = timer(lambda: y.backward(torch.ones_like(y)))
            sink["F"].append(tf)
            sink["B"].append(tb)

    out: dict[str, list[float]] = {f"{what}_{k}": [] for what in ("pipeline", "direct", "alone") for k in "FB"}
    for r in range(warmup + rounds):
        calls["F"].clear()
        calls["B"].clear()
        dist.barrier()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
        together: dict[str, list[float]] = {"F": [], "B": []}
        dist.barrier()
        direct(together)
        alone: dict[str, list[float]] = {"F": [], "B": []}
        for turn in range(world):
            dist.barrier()
            if turn == rank:
                direct(alone)
        module.zero_grad(set_to_none=True)
        if r >= warmup:
            for k in "FB":
                out[f"pipeline_{k}"] += calls[k]
                out[f"direct_{k}"] += together[k]
                out[f"alone_{k}"] += alone[k]
    dist.barrier()
    return out


def overhead_from(per_rank: list[dict[str, list[float]]]) -> StageCallOverhead:
    """Return the StageCallOverhead (seconds) of the ranks' timings (`measure_rank`'s results):
    medians over all ranks' calls, the overhead being pipeline minus direct, never below zero."""
    med = {key: statistics.median(v for r in per_rank for v in r[key]) for key in per_rank[0]}
    return StageCallOverhead(forward_s=max(0.0, med["pipeline_F"] - med["direct_F"]),
                             backward_s=max(0.0, med["pipeline_B"] - med["direct_B"]),
                             pipeline_forward_s=med["pipeline_F"], pipeline_backward_s=med["pipeline_B"],
                             direct_forward_s=med["direct_F"], direct_backward_s=med["direct_B"],
                             alone_forward_s=med["alone_F"], alone_backward_s=med["alone_B"],
                             calls=sum(len(r["pipeline_F"]) for r in per_rank), ranks=len(per_rank))


def _worker(rank: int, world: int, config_doc: dict[str, Any], micro_batch: int, seq_len: int, device: str,
            dtype_name: str, clock: str, rounds: int) -> dict[str, list[float]]:
    import torch

    if device.startswith("cuda"):
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    return measure_rank(TransformerConfig.model_validate(config_doc), micro_batch, seq_len, device,
                        getattr(torch, dtype_name), clock=clock, rounds=rounds)


def stage_call_overhead(config: TransformerConfig, micro_batch: int, seq_len: int, device: Any, dtype: Any, *,
                        clock: str, rounds: int = 8, ranks: int = 3) -> StageCallOverhead:
    """Return the pipeline runtime's per-call overhead (seconds per forward / backward call of a stage)
    at (micro_batch, seq_len) on `device` in torch dtype `dtype`, timed with `clock`.

    Measured in `ranks` fresh processes (as many as there are GPUs at most on CUDA; each with this
    process's torch threads) forming a pipeline of one-block stages that send activations and
    gradients to each other, as `gpuplan run`'s workers do.
    """
    import torch

    from gpuplan.runtime.launch import run_workers

    cuda = str(device).startswith("cuda")
    if ranks < 1:
        raise ValueError(f"stage_call_overhead: ranks={ranks}; expected 1 or more")
    if cuda:
        ranks = max(1, min(ranks, torch.cuda.device_count()))
    dtype_name = str(dtype).removeprefix("torch.")
    per_rank = run_workers(_worker, ranks, args=(config.model_dump(mode="json"), micro_batch, seq_len, str(device),
                                                 dtype_name, clock, rounds),
                           backend="nccl" if cuda else "gloo", threads=torch.get_num_threads(), timeout_s=600)
    return overhead_from(per_rank)
