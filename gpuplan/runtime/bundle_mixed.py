"""The bundle executor for stages of different data-parallel degrees.

torch.distributed.pipelining joins each stage to one peer per neighbour (one pipeline per replica),
so it cannot run a plan whose stage s has dp_s replicas and stage s + 1 a different dp_{s+1}. This
worker runs the same per-device action lists (Tessel's order: F, B or I + W per virtual stage and
micro-batch) with its own point-to-point messages instead:

- rank layout: stage s owns the dp_s ranks offset_s .. offset_s + dp_s - 1 (offset_s = dp_0 + ... +
  dp_{s-1}); replica r of stage s holds, of every micro-batch's G / m samples, the slice
  [r b_s, (r + 1) b_s), b_s = G / (m dp_s) (its micro-batch size);
- activations and their gradients are split and merged between stages of different dp: replica q of
  the sending stage sends each receiving replica the rows both hold (`replica_slices`), each message
  tagged with its virtual stage, micro-batch and direction, so no two messages can be swapped;
- a split backward uses torch's own input- and weight-gradient passes (`torch_pipelining.
  backward_input` / `backward_weight`); the first virtual stage, whose input (tokens) has no gradient,
  runs its whole backward at W, as torch's runtime does;
- after the last action each stage scales its gradients by 1 / m, sums them over its own dp group
  (gloo all-reduce) and divides by the last stage's dp: the loss is a mean over the last stage's
  b_last samples, so every stage's gradient is then the mean over the global batch, the gradient of
  one process running the whole model.

Emulated device types sleep (factor - 1) x each compute call, as in the other executors.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def offsets(dps: list[int]) -> list[int]:
    """Return the first rank of each stage: the running sum of the stages' dp before it."""
    out, at = [], 0
    for d in dps:
        out.append(at)
        at += d
    return out


def replica_slices(dp_src: int, dp_dst: int, samples: int) -> list[tuple[int, int, int, int]]:
    """Return (source replica, destination replica, first, last) for each pair of replicas that share
    rows [first, last) of one micro-batch of `samples` samples, when the source stage splits it over
    dp_src replicas and the destination over dp_dst (each in equal, consecutive slices)."""
    if samples % dp_src or samples % dp_dst:
        raise ValueError(f"{samples} samples per micro-batch do not split over dp {dp_src} and {dp_dst}")
    bs, bd = samples // dp_src, samples // dp_dst
    out = []
    for q in range(dp_src):
        for r in range(dp_dst):
            a, b = max(q * bs, r * bd), min((q + 1) * bs, (r + 1) * bd)
            if a < b:
                out.append((q, r, a, b))
    return out


def global_grads(modules: dict[int, Any], ranges: list[Any], num_layers: int) -> dict[str, Any]:
    """Return {whole-model parameter name (gpt.model's): gradient as a numpy array} of the virtual
    stages' `modules` ({k: module of layers ranges[k]})."""
    from gpuplan.runtime.poseidon import _global_name

    return {_global_name(n, ranges[k][0], ranges[k][1], ranges[k][0] == 0, num_layers): p.grad.detach().numpy().copy()
            for k, mod in modules.items() for n, p in mod.named_parameters() if p.grad is not None}


def phase_times(t0: float, pipeline_end: float, reduce_end: float, opt_start: float, opt_end: float,
                compute_s: float, reduce_cpu_s: float) -> dict[str, float]:
    """Return one worker's step split into phases (s, from perf_counter stamps of the step): compute
    (its compute calls, emulated sleeps included), p2p (the rest of the pipeline phase: waiting for
    messages, sending), allreduce (the data-parallel gradient reduction, wall; allreduce_cpu: its
    process CPU time), optimizer, pipeline_end / reduce_end (when the pipeline phase and the reduction
    ended, from the step's start)."""
    return {"compute": compute_s, "p2p": pipeline_end - t0 - compute_s, "allreduce": reduce_end - pipeline_end,
            "allreduce_cpu": reduce_cpu_s, "optimizer": opt_end - opt_start, "pipeline_end": pipeline_end - t0,
            "reduce_end": reduce_end - t0, "step_end": opt_end - t0}


def _tag(k: int, j: int, m: int, backward: bool) -> int:
    """The message tag of what virtual stage k receives for micro-batch j (activations or gradients)."""
    return 2 * (k * m + j) + int(backward)


def worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Run spec's warm-up and measured steps on this rank; return {rank, stage, replica, step_s (s per
    measured step), durations ({virtual stage: {F|B|I|W|L: mean seconds}}, the emulated sleep
    included, measured steps only), losses (mean over micro-batches per step; last stage only), grads
    (the first step's reduced gradients by whole-model name, replica 0, when spec["grads"])}."""
    import torch
    import torch.distributed as dist

    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt
    from gpuplan.runtime import torch_pipelining as tp
    from gpuplan.runtime.tessel_actions import parse

    cfg = TransformerConfig.model_validate(spec["config"])
    dps, m, seq, samples = list(spec["dps"]), spec["m"], spec["seq"], spec["samples"]
    S, first_rank = len(dps), offsets(dps)
    s = max(k for k in range(S) if first_rank[k] <= rank)
    r = rank - first_rank[s]
    dp_groups = [dist.new_group(list(range(first_rank[k], first_rank[k] + dps[k]))) for k in range(S)]
    ranges = spec["ranges"]
    V = len(ranges)
    mine = [k for k in range(V) if k % S == s]
    modules = {k: gpt.stage(cfg, *ranges[k], seed=spec["seed"]) for k in mine}
    params = [p for mod in modules.values() for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=spec["lr"])
    actions = [parse(a) for a in spec["actions"][str(s)]]
    b = samples // dps[s]
    factor = float(spec["factors"][s])
    calls: list[tuple[int, str, float]] = []

    def timed(k: int, op: str, fn: Any, slow: bool = True) -> Any:
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        if slow and factor > 1.0 + 1e-9:
            time.sleep((factor - 1.0) * took)
        calls.append((k, op, time.perf_counter() - t0))
        return out

    def receive(k: int, j: int, backward: bool, shape: tuple[int, ...]) -> Any:
        """Merge what the neighbour stage's replicas send virtual stage k for micro-batch j."""
        peer = (k + 1) % S if backward else (k - 1) % S
        buf = torch.empty(shape)
        pairs = replica_slices(dps[peer], dps[s], samples)
        works = [dist.irecv(buf[a - r * b:c - r * b], src=first_rank[peer] + q, tag=_tag(k, j, m, backward))
                 for q, rr, a, c in pairs if rr == r]
        for w in works:
            w.wait()
        return buf

    def send(k: int, j: int, backward: bool, tensor: Any, pending: list[Any]) -> None:
        """Split virtual stage k's output (or input gradient) of micro-batch j over the neighbour's replicas."""
        to = k - 1 if backward else k + 1
        peer = to % S
        data = tensor.detach()
        for q, rr, a, c in replica_slices(dps[s], dps[peer], samples):
            if q == r:
                piece = data[a - r * b:c - r * b].contiguous()
                pending.append((dist.isend(piece, dst=first_rank[peer] + rr, tag=_tag(to, j, m, backward)), piece))

    step_s: list[float] = []
    phases: list[dict[str, float]] = []
    losses_out: list[float] = []
    grads: dict[str, Any] = {}
    for step in range(spec["warmup"] + spec["steps"]):
        tokens, targets = gpt.synthetic_batch(cfg, m * samples, seq, seed=spec["seed"] + step)
        opt.zero_grad(set_to_none=True)
        if step == spec["warmup"]:
            calls.clear()
        inputs: dict[tuple[int, int], Any] = {}
        outputs: dict[tuple[int, int], Any] = {}
        grads_in: dict[tuple[int, int], Any] = {}
        groups: dict[tuple[int, int], Any] = {}
        pending: list[Any] = []
        found: list[float] = []
        n_calls = len(calls)
        dist.barrier()
        t0 = time.perf_counter()
        for a in actions:
            k, j = a.stage, int(a.mb or 0)
            rows = slice(j * samples + r * b, j * samples + (r + 1) * b)
            if a.op == "F":
                if k == 0:
                    x = tokens[rows]
                elif (k - 1) % S == s:  # the previous virtual stage is on this rank
                    x = outputs[(k - 1, j)].detach().requires_grad_(True)
                else:
                    x = receive(k, j, False, (b, seq, cfg.hidden)).requires_grad_(True)
                inputs[(k, j)] = x
                y = timed(k, "F", lambda: modules[k](x))
                if k == V - 1:
                    y = timed(k, "L", lambda: gpt.lm_loss(y, targets[rows]), slow=False)
                    found.append(float(y.detach()))
                elif (k + 1) % S != s:
                    send(k, j, False, y, pending)
                outputs[(k, j)] = y
                continue
            x, y = inputs.get((k, j)), outputs[(k, j)]
            if a.op in ("B", "I"):
                if k == V - 1:
                    g = None
                elif (k + 1) % S == s:
                    g = inputs.pop((k + 1, j)).grad
                else:
                    g = receive(k, j, True, tuple(y.shape))
                grads_in[(k, j)] = g
                if a.op == "B":
                    timed(k, "B", lambda: torch.autograd.backward([y], None if g is None else [g]))
                elif k > 0:
                    groups[(k, j)] = timed(k, "I", lambda: tp.backward_input(
                        [y], None if g is None else [g], [x], modules[k].parameters())[1])
                else:  # no input gradient to compute: the whole backward runs at W (as torch's runtime)
                    timed(k, "I", lambda: None, slow=False)
                if k > 0 and (k - 1) % S != s:
                    send(k, j, True, x.grad, pending)
            elif a.op == "W":
                if k == 0:
                    g = grads_in[(k, j)]
                    timed(k, "W", lambda: torch.autograd.backward([y], None if g is None else [g]))
                else:
                    timed(k, "W", lambda: tp.backward_weight(modules[k].parameters(), groups.pop((k, j))))
            if k == 0 or (k - 1) % S != s:
                inputs.pop((k, j), None)
            if a.op != "I":
                outputs.pop((k, j), None)
        for w, _ in pending:
            w.wait()
        t_pipe, c_pipe = time.perf_counter(), time.process_time()
        for p in params:
            if p.grad is not None:
                p.grad /= m
                if dps[s] > 1:
                    dist.all_reduce(p.grad, group=dp_groups[s])
                p.grad /= dps[-1]
        t_reduce, c_reduce = time.perf_counter(), time.process_time()
        if step == 0 and r == 0 and spec["grads"]:
            grads = global_grads(modules, ranges, cfg.num_layers)
        t_opt = time.perf_counter()
        opt.step()
        t_step = time.perf_counter()
        dist.barrier()
        if step >= spec["warmup"]:
            step_s.append(time.perf_counter() - t0)
            phases.append(phase_times(t0, t_pipe, t_reduce, t_opt, t_step, sum(x for _, _, x in calls[n_calls:]),
                                      c_reduce - c_pipe))
            if found:
                losses_out.append(sum(found) / len(found))
    durations: dict[int, dict[str, float]] = {}
    for k in mine:
        for op in ("F", "B", "I", "W", "L"):
            got = [x for st, o, x in calls if st == k and o == op]
            if got:
                durations.setdefault(k, {})[op] = statistics.fmean(got)
    return {"rank": rank, "stage": s, "replica": r, "step_s": step_s, "durations": durations, "losses": losses_out,
            "grads": grads, "phases": phases}
