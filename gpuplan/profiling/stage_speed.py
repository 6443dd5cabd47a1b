"""The plan's own stages timed the way the executor runs them, just before a run: each stage's compute
now, and how fast the workers compute when several do at once.

The profile's layer table times one block (and the embedding, and the head with the loss) in one
process, in a tight loop, some time before the run. `gpuplan run` executes different modules under
different conditions: each worker holds its stage's own blocks (the stage's whole working set, not
one block's), every call follows a wait (a receive or an emulated sleep, during which the core idles
or runs another worker), and the workers compute next to each other. On this machine's 2 shared
virtual cores the layers' speed also drifts between the profile and the run (the host's other work).
This probe measures, in as many fresh processes as the run has workers, with the run's torch threads:

* `alone`: each rank in turn (the others waiting in gloo) calls its own stage modules (gpt.stage of the
  plan's layer ranges; tokens into the first stage, activations requiring a gradient into the others,
  the loss on the last) forward, then backward, each call followed by a sleep as long as it took, and
  times each call by process CPU time (waiting for a core does not count; wall time with more than one
  torch thread, as the layer table's clock): seconds per call, per chunk, the median of several turns
  (one turn alone was caught by the host's other work now and then: 2x a stage's speed);
* `rates[k - 1]`: the speed of a worker (1.0 = alone) while k of them loop their own stage's forward and
  backward at once (ranks 0..k-1, wall time, median over the k): the core-sharing rates, with the
  plan's stages (the runner's earlier probe looped one generic block).

Nothing here is fitted to a run: the figures are known before the launch.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any

from gpuplan.models.workload import TransformerConfig

MAX_PROBE_RANKS = 64


@dataclass(frozen=True)
class StageSpeeds:
    """What the probe measured: `forward_s[r][c]` / `backward_s[r][c]` (s, process CPU time per call,
    one rank alone) of chunk c of rank r, and `rates[k - 1]` (1.0 = alone) with k ranks computing."""

    forward_s: list[list[float]]
    backward_s: list[list[float]]
    rates: list[float]
    others_share: float | None = None  # the share of all cores other processes used during the probe
    attempts: int = 1


def _modules(cfg: TransformerConfig, chunks: list[tuple[int, int]], seed: int) -> list[Any]:
    from gpuplan.runtime import gpt

    return [gpt.stage(cfg, first, last, seed) for first, last in chunks]


def _probe_worker(rank: int, world: int, config_doc: dict[str, Any], chunks_of: list[list[tuple[int, int]]],
                  batches: list[int], seq_len: int, seed: int, window_s: float, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from gpuplan.runtime import gpt

    cfg = TransformerConfig.model_validate(config_doc)
    chunks = [tuple(c) for c in chunks_of[rank]]
    mods = _modules(cfg, chunks, seed)  # type: ignore[arg-type]
    micro_batch = batches[rank]
    tokens, targets = gpt.synthetic_batch(cfg, micro_batch, seq_len, seed=seed + 7)
    gen = torch.Generator().manual_seed(seed + 1000 + rank)
    act = torch.randn(micro_batch, seq_len, cfg.hidden, generator=gen)
    grad = torch.randn(micro_batch, seq_len, cfg.hidden, generator=gen)

    # the layer table's clock: process CPU time on one thread, wall time with more (CPU time sums threads)
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter

    def call(c: int, nap: bool) -> tuple[float, float]:  # (forward, backward) seconds by `clock`
        first, last = chunks[c]
        x = tokens if first == 0 else act.clone().requires_grad_(True)
        c0, w0 = clock(), time.perf_counter()
        y = mods[c](x)
        out = gpt.lm_loss(y, targets) if last == cfg.num_layers else y
        cf, wf = clock() - c0, time.perf_counter() - w0
        if nap:
            time.sleep(wf)
        c0, w0 = clock(), time.perf_counter()
        out.backward() if last == cfg.num_layers else out.backward(grad)
        cb, wb = clock() - c0, time.perf_counter() - w0
        if nap:
            time.sleep(wb)
        return cf, cb

    def loop(nap: bool) -> tuple[list[list[tuple[float, float]]], float]:  # per chunk timings, wall s per pass
        got: list[list[tuple[float, float]]] = [[] for _ in chunks]
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < window_s:
            for c in range(len(chunks)):
                got[c].append(call(c, nap))
            n += 1
        for m in mods:
            m.zero_grad(set_to_none=True)
        return got, (time.perf_counter() - t0) / n

    for c in range(len(chunks)):  # first calls: allocations, autograd's first pass
        call(c, False)
        call(c, False)
    # each rank alone, every call followed by a wait as long as it took; the ranks take turns for
    # `rounds` rounds and each figure is the median over its rounds, so one window caught by a passing
    # burst of the host's other work does not set a stage's speed
    per_f: list[list[float]] = [[] for _ in chunks]
    per_b: list[list[float]] = [[] for _ in chunks]
    solos: list[float] = []
    for _ in range(rounds):
        for turn in range(world):
            dist.barrier()
            if turn == rank:
                got, _ = loop(True)
                for c, g in enumerate(got):
                    per_f[c].append(statistics.median(f for f, _ in g))
                    per_b[c].append(statistics.median(b for _, b in g))
                solos.append(loop(False)[1])
    alone_f = [statistics.median(x) for x in per_f]
    alone_b = [statistics.median(x) for x in per_b]
    solo = statistics.median(solos)
    per_pass = []
    for k in range(2, world + 1):  # k ranks loop their stage together, the others wait in gloo
        dist.barrier()
        per_pass.append(loop(False)[1] if rank < k else 0.0)
    dist.barrier()
    return {"forward_s": alone_f, "backward_s": alone_b, "solo_s": solo, "together_s": per_pass}


def rates_from(per_rank: list[dict[str, Any]]) -> list[float]:
    """Return rates[k - 1] for k = 1..ranks (1.0 for k = 1): the median over ranks 0..k-1 of their
    time per pass alone over their time per pass while k ranks compute (the probe's results)."""
    rates = [1.0]
    for k in range(2, len(per_rank) + 1):
        rates.append(statistics.median(per_rank[r]["solo_s"] / per_rank[r]["together_s"][k - 2]
                                       for r in range(k) if per_rank[r]["together_s"][k - 2] > 0))
    return rates


def measure_stage_speeds(config: TransformerConfig, chunks_of: list[list[tuple[int, int]]], *,
                         micro_batch: int | list[int], seq_len: int, threads: int = 1, seed: int = 0, window_s: float = 0.3,
                         attempts: int = 2, wait_s: float = 30.0, rounds: int = 3) -> StageSpeeds:
    """Return the StageSpeeds of the plan's stages on this machine now (see the module docstring):
    `chunks_of[r]` lists the layer ranges [first, last) rank r computes (one per pipeline chunk, as
    `gpuplan.runtime.gpt.stage` builds them), at `micro_batch` samples per call (one figure, or one per
    rank). Runs one fresh process per rank with `threads` torch
    threads; about (2 x `rounds` + 1) x ranks x `window_s` seconds of measurement after the start-up
    (each rank's time alone: the median of `rounds` turns). Other processes'
    CPU share during the probe is recorded (`others_share`); when it reaches
    `gpuplan.runtime.contention.CONTENDED_SHARE`, the probe waits up to `wait_s` seconds for a quiet
    machine and measures again, `attempts` times at most, and returns the least contended attempt."""
    from gpuplan.runtime.contention import CONTENDED_SHARE, ContentionMonitor, wait_quiet
    from gpuplan.runtime.launch import run_workers

    if not 1 <= len(chunks_of) <= MAX_PROBE_RANKS:
        raise ValueError(f"measure_stage_speeds: 1 to {MAX_PROBE_RANKS} ranks, not {len(chunks_of)}")
    for chunks in chunks_of:
        for first, last in chunks:
            if not 0 <= first < last <= config.num_layers:
                raise ValueError(f"measure_stage_speeds: a layer range inside 0..{config.num_layers}, "
                                 f"not [{first}, {last})")
    batches = [micro_batch] * len(chunks_of) if isinstance(micro_batch, int) else list(micro_batch)
    if len(batches) != len(chunks_of) or min(batches) < 1:
        raise ValueError(f"measure_stage_speeds: one micro-batch of 1 or more per rank, not {micro_batch}")
    best: StageSpeeds | None = None
    for attempt in range(1, max(1, attempts) + 1):
        with ContentionMonitor() as monitor:
            per = run_workers(_probe_worker, len(chunks_of),
                              args=(config.model_dump(mode="json"), [[list(c) for c in ch] for ch in chunks_of],
                                    batches, seq_len, seed, window_s, max(1, rounds)), threads=threads,
                              timeout_s=600)
        share = monitor.window.others_share
        got = StageSpeeds(forward_s=[r["forward_s"] for r in per], backward_s=[r["backward_s"] for r in per],
                          rates=rates_from(per), others_share=share, attempts=attempt)
        if best is None or (share is not None and share < (best.others_share or 0.0)):
            best = got
        if share is None or share < CONTENDED_SHARE or attempt == attempts:
            break
        wait_quiet(wait_s)  # other processes took the cores during the probe: wait for them, measure again
    assert best is not None
    return dataclasses.replace(best, attempts=attempt)


def reduce_gradients(params: list[Any], group: Any, size: int) -> None:
    """All-reduce each parameter's gradient over `group` (gloo, one call per tensor, as the bundle's
    executors do after the last action) and divide it by `size`."""
    import torch.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= size


def _reduce_worker(rank: int, world: int, config_doc: dict[str, Any], chunks_of: list[list[tuple[int, int]]],
                   groups: list[list[int]], micro_batch: int, seq_len: int, seed: int, window_s: float
                   ) -> list[tuple[float, float]]:
    import torch
    import torch.distributed as dist

    from gpuplan.runtime import gpt

    cfg = TransformerConfig.model_validate(config_doc)
    mods = _modules(cfg, [tuple(c) for c in chunks_of[rank]], seed)  # type: ignore[misc]
    params = [p for m in mods for p in m.parameters()]
    for p in params:
        p.grad = torch.ones_like(p)
    block = gpt.stage(cfg, 1, 2, seed=rank)  # what a busy worker computes: one middle block, forward + backward
    x = torch.randn(micro_batch, seq_len, cfg.hidden, generator=torch.Generator().manual_seed(seed + rank))
    handles = [dist.new_group(g) for g in groups]
    out: list[tuple[float, float]] = []
    for g, handle in zip(groups, handles):
        got = []
        for busy in (False, True):
            dist.barrier()
            took = []
            t_start = time.perf_counter()
            if rank in g:
                reduce_gradients(params, handle, len(g))  # first call: gloo's buffers
                go = torch.ones(1)
                while go[0] > 0:
                    dist.barrier(group=handle)
                    t0 = time.perf_counter()
                    reduce_gradients(params, handle, len(g))
                    took.append(time.perf_counter() - t0)
                    # go on while the window lasts (g[0]'s clock decides; an untimed all-reduce tells the group)
                    go[0] = float(rank == g[0] and (len(took) < 2 or time.perf_counter() - t_start < window_s))
                    dist.all_reduce(go, group=handle)
            elif busy:  # loop until after the group's last round can have started
                while time.perf_counter() - t_start < 2 * window_s:
                    y = block(x.clone().requires_grad_(True))
                    y.backward(torch.ones_like(y))
            got.append(statistics.median(took) if took else 0.0)
        out.append((got[0], got[1]))
    dist.barrier()
    return out


def measure_reduce_s(config: TransformerConfig, chunks_of: list[list[tuple[int, int]]], groups: list[list[int]], *,
                     micro_batch: int, seq_len: int, threads: int = 1, seed: int = 0, window_s: float = 0.6
                     ) -> list[tuple[float, float]]:
    """Return, per data-parallel group (`groups`: rank lists, rank r holding the layer ranges
    `chunks_of[r]`), (alone_s, busy_s): the wall seconds of the group's gradient reduction as the
    executors run it (`reduce_gradients`: one gloo all-reduce per parameter of the rank's own stage
    modules, then a division), median over the rounds that start within `window_s` (two at least),
    measured in as many fresh processes as the run has workers: alone (the other ranks wait in gloo)
    and while every rank outside the group loops a gpt block's forward and backward for 2 x `window_s`
    (the other stages computing next to it). [] without groups."""
    from gpuplan.runtime.launch import run_workers

    if not groups:
        return []
    per = run_workers(_reduce_worker, len(chunks_of),
                      args=(config.model_dump(mode="json"), [[list(c) for c in ch] for ch in chunks_of],
                            [list(g) for g in groups], micro_batch, seq_len, seed, window_s),
                      threads=threads, timeout_s=600)
    return [(max(per[r][i][0] for r in g), max(per[r][i][1] for r in g)) for i, g in enumerate(groups)]
