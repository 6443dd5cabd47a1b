"""`gpuplan run BUNDLE`: execute a training bundle with torch.distributed.

Poseidon's stage split and degrees (S stages x dp replicas, tp = 1 on CPU; with interleave v each
rank holds v chunks), Tessel's schedule through torch.distributed.pipelining's action-list runtime
(forward, input- and weight-gradient actions in the schedule's per-rank order), the data-parallel
gradient all-reduce and an SGD step after it. Stages of different dp (stage s with dp_s replicas)
run the same orders through `bundle_mixed` instead: torch's runtime joins each stage to one peer per
neighbour, so there gpuplan sends each replica of the next stage the rows of every micro-batch it
holds (activations split and merged between replicas), and gradients back the same way. Lagom's NCCL environment is set on the workers with
NCCL; on gloo (CPU) it is recorded and ignored, with a note. Device types a stage was planned on are
emulated as the Poseidon runner does: a stage of a type k times slower sleeps (k - 1) x each call.

Returns measured next to predicted, per iteration (the bundle's composed prediction; the same with
this machine's core sharing, cold-call cost and wake-up delay measured just before the launch, as the
Poseidon runner does; and the
schedule re-timed with the block durations measured in this run) and per block.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.base import Table
from gpuplan.runtime.poseidon import slow_down_stage


def shared_cores_time_s(problem: Any, orders: list[list[tuple[str, int]]], rates: list[float],
                        tails_s: list[float], *, wake_s: float = 0.0,
                        extra_s: dict[str, float] | None = None, workers: list[int] | None = None,
                        factors: list[float] | None = None, sleep_s: float = 0.0,
                        ends: list[float] | None = None,
                        reduce_s: list[tuple[float, float]] | None = None) -> float:
    """Return the iteration time (s) of per-device `orders` when the devices share this machine's cores:
    while blocks compute on devices holding k workers in all (`workers[d]` per device, its dp replicas
    running the same order at once; 1 each by default), each progresses at rates[k-1] (1.0 = alone)
    of its planned duration (plus `extra_s[name]`, s of CPU work added to every call of that block,
    e.g. the extra CPU time of a call after a wait on busy cores). A device emulated `factors[d]`
    times slower (1 by default) computes duration / factor of CPU work, then sleeps (factor - 1) x the
    time that took plus `sleep_s` (how late a sleep ends), using no core, as `slow_down_stage` does.
    A block starts when its device finished the previous one and its dependencies ended; each device
    ends with its tail (at the rate of the devices still busy then, approximated by rates[0]).
    `wake_s`: seconds a device waiting idle for a block of another device starts after that block
    ends (the scheduler's wake-up delay, as `contended_iteration_s` charges it); not charged when that
    block ended while the device was still busy. When `ends` is a list, it receives each device's
    end of its last block (s, before its tail).
    `reduce_s[d]` (alone_s, busy_s): the device's gradient reduction measured before the run with the
    cores idle and with every other worker computing (`measure_reduce_s`); it starts when the device's
    last block ends and progresses at 1 / (alone + (busy - alone) x j / J) while j of the J workers of
    the other devices compute blocks, then 1 / alone; the tail then follows it (optimizer only, when
    given: `tails_s` must then leave the reduction out). The reduction is taken to use no core the
    other devices' blocks would have (its CPU share is not charged to them)."""
    extra = extra_s or {}
    weight = list(workers or [1] * len(orders))
    factor = list(factors or [1.0] * len(orders))
    dur = {b.name: b.duration_s + extra.get(b.name, 0.0) for b in problem.blocks}
    deps = {b.name: b.after for b in problem.blocks}
    device_of = {b.name: b.devices[0] for b in problem.blocks}
    pos = [0] * len(orders)
    done: dict[tuple[str, int], float] = {}
    # device -> [block, microbatch, remaining seconds of CPU work, start, end of its sleep (None: computing)]
    running: dict[int, list[Any]] = {}
    now, free = 0.0, [0.0] * len(orders)
    log: list[tuple[float, int, dict[int, int]]] = []  # (from, workers computing, device -> its workers)
    total = sum(len(o) for o in orders)

    def ready(d: int, name: str, j: int) -> float:  # when the block may start (inputs arrived, device awake)
        local = max((done[(a, j)] for a in deps[name] if device_of[a] == d), default=0.0)
        sent = max((done[(a, j)] for a in deps[name] if device_of[a] != d), default=0.0)
        if sent > free[d]:  # the device went idle before its input arrived: it wakes up after it
            sent += wake_s
        return max(local, sent)

    while len(done) < total:
        waiting: list[float] = []
        for d, order in enumerate(orders):
            if d in running or pos[d] >= len(order):
                continue
            name, j = order[pos[d]]
            if all((a, j) in done for a in deps[name]):
                at = ready(d, name, j)
                if at <= now + 1e-12:
                    running[d] = [name, j, dur[name] / factor[d], now, None]
                else:
                    waiting.append(at)
        if not running and not waiting:
            raise ValueError("the orders wait on each other (deadlock)")
        computing = [d for d, r in running.items() if r[4] is None]
        busy = sum(weight[d] for d in computing)
        log.append((now, busy, {d: weight[d] for d in computing}))
        rate = rates[min(busy, len(rates)) - 1] if busy else 1.0
        step = min([running[d][2] / rate for d in computing] + [r[4] - now for r in running.values()
                                                                 if r[4] is not None] + [at - now for at in waiting])
        step = max(step, 0.0)
        now += step
        for d in list(running):
            r = running[d]
            if r[4] is None:
                r[2] -= step * rate
                if r[2] <= 1e-12:
                    slow = factor[d] > 1.0 + 1e-9
                    r[4] = now + (factor[d] - 1.0) * (now - r[3]) + (sleep_s if slow else 0.0)
            if r[4] is not None and r[4] <= now + 1e-12:
                name, j = r[0], r[1]
                running.pop(d)
                done[(name, j)] = now
                free[d] = now
                pos[d] += 1
    log.append((now, 0, {}))  # nothing computes after the last block
    if ends is not None:
        ends[:] = free
    start = [free[d] if reduce_s is None else reduce_end_s(free[d], reduce_s[d], log, d, sum(weight) - weight[d])
             for d in range(len(orders))]
    return max(start[d] + tails_s[d] / rates[0] for d in range(len(orders)))


def reduce_end_s(start_s: float, reduce_s: tuple[float, float], log: list[tuple[float, int, dict[int, int]]],
                 device: int, others: int) -> float:
    """Return when (s) a gradient reduction that starts at `start_s` ends: `reduce_s` (alone_s, busy_s)
    is its duration with no other worker computing and with all `others` computing; while j of them
    compute (`log`: (from s, workers computing, device -> its workers computing) in time order, each
    entry lasting to the next; none after the last) it lasts alone + (busy - alone) x j / others."""
    alone, busy = reduce_s
    if alone <= 0.0:
        return start_s
    left, t = 1.0, start_s
    bounds = [(a, log[i + 1][0] if i + 1 < len(log) else math.inf, n - cw.get(device, 0))
              for i, (a, n, cw) in enumerate(log)]
    for a, b, j in bounds:
        if b <= t:
            continue
        t = max(t, a)
        dur = alone + (busy - alone) * (j / others if others else 0.0)
        if t + left * dur <= b:
            return t + left * dur
        left -= (b - t) / dur
        t = b
    return t + left * alone


def phase_table(out: dict[str, Any], stage_of: list[int]) -> Table:
    """Return the table of each worker's measured step phases (ms, median over the measured steps:
    compute calls, point-to-point waits, the gradient reduction wall and CPU time, optimizer, the end of
    the pipeline phase) beside the prediction's terms for its stage (the end of its last block and its
    reduction alone / next to the other stages' compute, as measured before the run)."""
    rows = []
    for rank, phases in sorted(out["phases"].items()):
        if not phases:
            continue
        med = {k: statistics.median(p[k] for p in phases) * 1e3 for k in phases[0]}
        s = stage_of[int(rank)]
        red = out["reduce_s"][s] if out.get("reduce_s") else None
        rows.append([rank, s, med["compute"], med["p2p"], med["allreduce"], med["allreduce_cpu"], med["optimizer"],
                     med["pipeline_end"], out["predicted_here_pipeline_end_s"][s] * 1e3,
                     "-" if red is None else f"{red[0] * 1e3:.1f} / {red[1] * 1e3:.1f}"])
    return Table("per worker: measured step phases vs the prediction's terms (ms, median of the measured steps)",
                 ["rank", "stage", "compute", "p2p wait", "reduce", "reduce CPU", "optimizer", "pipeline end",
                  "predicted pipeline end", "predicted reduce alone / busy"], rows)


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt
    from gpuplan.runtime import torch_pipelining as tp
    from gpuplan.profiling.stage_speed import reduce_gradients
    from gpuplan.runtime.bundle_mixed import global_grads, phase_times

    cfg = TransformerConfig.model_validate(spec["config"])
    S, dp, m, mb, seq = spec["stages"], spec["dp"], spec["m"], spec["micro_batch"], spec["seq"]
    replica, s = divmod(rank, S)
    pp_groups = [dist.new_group([r * S + k for k in range(S)]) for r in range(dp)]
    dp_groups = [dist.new_group([r * S + k for r in range(dp)]) for k in range(S)]
    ranges = spec["ranges"]
    mine = [k for k in range(len(ranges)) if k % S == s]
    modules = {k: gpt.stage(cfg, *ranges[k], seed=spec["seed"]) for k in mine}
    stages = [tp.pipeline_stage(modules[k], k, len(ranges), torch.device("cpu"), group=pp_groups[replica])
              for k in mine]
    for st in stages:
        slow_down_stage(st, spec["factors"][s])
    sched = tp.runtime_schedule(stages, m, gpt.lm_loss, {int(r): a for r, a in spec["actions"].items()},
                                spec["format"])
    params = [p for mod in modules.values() for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=spec["lr"])
    calls: list[tuple[int, str, float]] = []
    step_s: list[float] = []
    phases: list[dict[str, float]] = []
    losses_out: list[float] = []
    grads: dict[str, Any] = {}
    if spec["warmup"] == 0:
        for st in stages:
            tp.time_stage_calls(st, calls)
        tp.time_loss_calls(sched, calls)
    for step in range(spec["warmup"] + spec["steps"]):
        tokens, targets = gpt.synthetic_batch(cfg, m * mb * dp, seq, seed=spec["seed"] + step)
        part = slice(replica * m * mb, (replica + 1) * m * mb)
        opt.zero_grad(set_to_none=True)
        found: list[Any] = []
        n_calls = len(calls)
        dist.barrier()
        t0 = time.perf_counter()
        last = len(ranges) - 1 in mine
        args = (tokens[part],) if 0 in mine else ()
        sched.step(*args, target=targets[part] if last else None, losses=found if last else None)
        t_pipe, c_pipe = time.perf_counter(), time.process_time()
        if dp > 1:  # the reduction measure_reduce_s times before the run
            reduce_gradients(params, dp_groups[s], dp)
        t_reduce, c_reduce = time.perf_counter(), time.process_time()
        if step == 0 and replica == 0 and spec["grads"]:
            grads = global_grads(modules, ranges, cfg.num_layers)
        t_opt = time.perf_counter()
        opt.step()
        t_step = time.perf_counter()
        dist.barrier()
        if step + 1 == spec["warmup"]:  # time the blocks of the measured steps only
            for st in stages:
                tp.time_stage_calls(st, calls)
            tp.time_loss_calls(sched, calls)
        if step >= spec["warmup"]:
            step_s.append(time.perf_counter() - t0)
            phases.append(phase_times(t0, t_pipe, t_reduce, t_opt, t_step,
                                      sum(x for _, op, x in calls[n_calls:] if op != "R"), c_reduce - c_pipe))
            if found:
                losses_out.append(float(sum(float(x.detach()) for x in found) / len(found)))
    durations: dict[int, dict[str, float]] = {}
    for k in mine:
        for op in ("F", "B", "I", "W", "L"):
            got = [x for st, o, x in calls if st == k and o == op]
            if got:
                durations.setdefault(k, {})[op] = statistics.fmean(got)
    return {"rank": rank, "stage": s, "replica": replica, "step_s": step_s, "durations": durations,
            "losses": losses_out, "grads": grads, "phases": phases}


def run_bundle(directory: str | Path, *, steps: int = 3, warmup: int = 1, seed: int = 0, lr: float = 1e-3,
               threads: int | None = 1, timeout_s: float = 600.0, sharing: list[float] | None = None,
               return_grads: bool = False) -> dict[str, Any]:
    """Run a training bundle on local processes (gloo on CPU); return measured figures (seconds):
    measured_iteration_s (median step), predicted_iteration_s (the bundle's composed prediction),
    predicted_here_iteration_s (the same for this machine: `shared_cores_time_s` with the core sharing of
    the plan's own stages measured just before the launch (`gpuplan.profiling.stage_speed`; `sharing`
    overrides it), each block's compute scaled by its chunk's "compute_ratios" entry (the chunk's modules
    timed alone by the same probe, each call after a wait as the layer table times them, over the
    table's figure for them: the speed of this machine's cores now; 1 with `sharing` given or for a
    scaled model), and, when the workers
    outnumber the cores, the extra CPU time of a call after a wait on busy cores, cold_forward_s /
    cold_backward_s, and the wake-up delay wake_s; the emulated stages' sleeps use no core and end
    sleep_late_s late; each data-parallel group's gradient reduction, reduce_s per stage (alone_s, busy_s)
    from `measure_reduce_s`, in place of the plan's all-reduce figure; all measured just before the
    launch), predicted_here_plan_reduce_iteration_s (the same with the plan's all-reduce after the last
    block), phases ({rank: per measured step, `bundle_mixed.phase_times`}),
    predicted_here_profile_speed_iteration_s (the prediction for this machine at the profile's compute
    speed: compute ratios 1),
    retimed_iteration_s (the schedule's order re-timed with the blocks measured in the run), per-block
    measured vs planned durations, losses, "report" (tables) and "warnings" (each > 15 % off).
    Stages of equal dp run through torch.distributed.pipelining's action-list runtime; stages of
    different dp through `bundle_mixed.worker` (the same orders, activations split and merged between
    the stages' replicas). Refuses a bundle that fails check, or stages with tensor parallelism (the CPU
    executor has none)."""
    from gpuplan import api
    from gpuplan.compose.bundle import checked_bundle, stage_envs
    from gpuplan.compose.pipeline import stage_tails_s, virtual_layers
    from gpuplan.models.tessel import orders_of, simulate
    from gpuplan.runtime import contention
    from gpuplan.runtime import tessel_actions as acts
    from gpuplan.runtime.launch import run_workers
    from gpuplan.profiling.stage_speed import measure_reduce_s, measure_stage_speeds
    from gpuplan.runtime.poseidon import (chunk_ratio, cpu_cores, measure_wait_costs, measure_wake_s,
                                          runnable_config, stage_slowdowns)
    from gpuplan.runtime.report import TOLERANCE, contention_warnings, machine_table, off, pct, rel_error
    from gpuplan.runtime.torch_pipelining import check_version

    violations, manifest, plans = checked_bundle(directory)
    if violations:
        raise api.PlanRejected(violations)
    poseidon, tessel = plans["poseidon.json"], plans["tessel.json"]
    pprob = api.plan_problem(poseidon)
    tprob = api.plan_problem(tessel)
    stages = poseidon.stages  # type: ignore[attr-defined]
    bad = [s.index for s in stages if s.tp != 1]
    if bad:
        raise InputError(f"stages {bad} use tensor parallelism; the CPU executor runs tp == 1 stages only")
    check_version()
    doc = poseidon.document()
    S, dps = len(stages), [s.dp for s in stages]
    world = sum(dps)
    mixed = len(set(dps)) > 1  # stages of different dp: gpuplan's own messages (bundle_mixed), not torch's runtime
    ranks = acts.stage_ranks(tprob)  # type: ignore[arg-type]
    lists = acts.with_comms(acts.compute_only(tprob, tessel), ranks, tprob.microbatches)  # type: ignore[arg-type]
    acts.check_actions(lists, ranks, tprob.microbatches)  # type: ignore[attr-defined]
    cfg, seq, note = runnable_config(pprob)  # type: ignore[arg-type]
    m = poseidon.num_microbatches  # type: ignore[attr-defined]
    spec = {"config": cfg.model_dump(mode="json"), "ranges": virtual_layers(doc), "stages": S, "dp": dps[0],
            "dps": dps, "m": m, "micro_batch": stages[0].micro_batch_size, "samples": pprob.global_batch // m,
            "seq": seq, "actions": lists, "format": "compute_comms", "seed": seed, "lr": lr, "steps": steps,
            "warmup": warmup, "factors": stage_slowdowns(pprob, poseidon), "grads": return_grads}  # type: ignore[arg-type]
    if mixed:  # per-device compute order (the messages are the worker's), keyed by str for the spawn pickle
        spec["actions"] = {str(d): a for d, a in acts.compute_only(tprob, tessel).items()}  # type: ignore[arg-type]
    envs = stage_envs(plans)
    notes = [f"model {note}"] if note else []
    if envs:
        notes.append("Lagom's NCCL settings are recorded and ignored: gloo (CPU) has no NCCL knobs")
    before = contention.quiet_window()
    # this machine's core sharing, measured just before the launch: the speed of one worker while k of
    # the S x dp compute at once (1.0 = alone), so the prediction for here is known before the run
    # the micro-batch the sharing and cold-call probes time: the one most of the workers run
    mb = statistics.median_low(s.micro_batch_size for s in stages for _ in range(s.dp))
    # the plan's stages timed the executor's way just before the launch (each rank's own chunks, calls after
    # waits, process CPU time, one rank alone) and the core sharing of those stages computing together
    from gpuplan.runtime.bundle_mixed import offsets

    first_rank = offsets(dps) if mixed else list(range(S))
    stage_of = [max(k for k in range(S) if first_rank[k] <= r) if mixed else r % S for r in range(world)]
    chunks_of = [[tuple(spec["ranges"][k]) for k in range(len(spec["ranges"])) if k % S == stage_of[r]]
                 for r in range(world)]
    speeds = None if sharing else measure_stage_speeds(
        cfg, chunks_of, micro_batch=[stages[stage_of[r]].micro_batch_size for r in range(world)], seq_len=seq,
        threads=threads or 1, seed=seed)  # type: ignore[arg-type]
    rates = sharing or speeds.rates  # type: ignore[union-attr]
    # virtual stage k -> (forward, backward) ratio of its chunk now over the table; chunk k // S of its rank
    ratios = {k: (1.0, 1.0) if speeds is None else chunk_ratio(
        pprob, stages[k % S].device_type, first, last, stages[k % S].micro_batch_size,  # type: ignore[arg-type]
        speeds.forward_s[first_rank[k % S]][k // S], speeds.backward_s[first_rank[k % S]][k // S], bool(note))
        for k, (first, last) in enumerate(spec["ranges"])}
    # when the workers outnumber the cores, as the Poseidon runner: the extra CPU time of a call after a
    # wait on cores the others kept busy, and the wake-up delay of a worker blocked in gloo's recv
    cores = cpu_cores()
    *cold, late = (0.0, 0.0, 0.0) if sharing else measure_wait_costs(cfg, seq_len=seq, micro_batch=mb,
                                                                     processes=world, cores=cores,
                                                                     threads=threads or 1)
    wake = 0.0 if sharing else measure_wake_s(cfg, seq_len=seq, micro_batch=mb, processes=world, cores=cores,
                                              threads=threads or 1)
    tails = stage_tails_s(doc, [float(x) for x in manifest["scales"]])
    # each data-parallel group's gradient reduction as the executor runs it (one gloo all-reduce per
    # parameter), alone and next to the other stages computing, measured here before the run: the plan's
    # all-reduce figure is one message of the stage's bytes over the profile's link, on idle cores
    groups = [[r for r in range(world) if stage_of[r] == k] for k in range(S)]
    measured_reduce = [] if sharing else measure_reduce_s(
        cfg, chunks_of, [g for g in groups if len(g) > 1], micro_batch=mb, seq_len=seq, threads=threads or 1,
        seed=seed)
    it = iter(measured_reduce)
    reduce_s = None if sharing else [next(it) if len(g) > 1 else (0.0, 0.0) for g in groups]
    optimizer_tails = [float(st.get("optimizer_s", 0.0)) for st in doc["stages"]]
    # every forward / backward(-input) call follows a wait (a receive, an emulated sleep); the emulated
    # slow-down stretches the extra work too (a stage k times slower sleeps (k - 1) x each call)
    extra = {b.name: (cold[0] if b.kind == "forward" else cold[1] if b.kind in ("backward", "backward_input")
                      else 0.0) * spec["factors"][b.devices[0]]  # type: ignore[index]
             for b in tprob.blocks}  # type: ignore[attr-defined]
    # each block's compute at the speed its chunk was timed at before the run (ratio over the table's)
    now_extra = {b.name: extra[b.name] + b.duration_s * (ratios.get(b.stage, (1.0, 1.0))[0 if b.kind == "forward"
                                                                                       else 1] - 1.0)
                 for b in tprob.blocks}  # type: ignore[attr-defined]
    pipeline_ends: list[float] = []
    here = {"wake_s": wake, "extra_s": now_extra, "workers": dps, "factors": spec["factors"], "sleep_s": late}
    predicted_plan_reduce = shared_cores_time_s(tprob, orders_of(tessel.schedule), rates, tails,  # type: ignore[attr-defined]
                                                ends=pipeline_ends, **here)  # type: ignore[arg-type]
    predicted_here = predicted_plan_reduce if reduce_s is None else shared_cores_time_s(
        tprob, orders_of(tessel.schedule), rates, optimizer_tails, reduce_s=reduce_s,  # type: ignore[attr-defined]
        **here)  # type: ignore[arg-type]
    predicted_profile_speed = shared_cores_time_s(  # the same at the profile's compute speed
        tprob, orders_of(tessel.schedule), rates,  # type: ignore[attr-defined]
        tails if reduce_s is None else optimizer_tails, reduce_s=reduce_s,
        **{**here, "extra_s": extra})  # type: ignore[arg-type]
    from gpuplan.runtime.bundle_mixed import worker as mixed_worker

    with contention.ContentionMonitor() as monitor:
        results = run_workers(mixed_worker if mixed else _worker, world, args=(spec,), threads=threads,
                              timeout_s=timeout_s)
    step_s = [max(r["step_s"][i] for r in results) for i in range(steps)]
    measured = statistics.median(step_s)
    times = {k: t for r in results if r["replica"] == 0 for k, t in r["durations"].items()}
    durations: dict[str, float] = {}
    for b in tprob.blocks:  # type: ignore[attr-defined]
        t = times.get(b.stage, {})
        loss = t.get("L", 0.0) if b.kind == "forward" else 0.0
        durations[b.name] = t.get(acts.KIND_CODE[b.kind], 0.0) + loss
    timed = simulate(tprob, orders_of(tessel.schedule), durations)  # type: ignore[arg-type, attr-defined]
    retimed = max(max((e.end_s for e in dev), default=0.0) + tails[d] for d, dev in enumerate(timed))
    predicted = float(manifest["predicted"]["iteration_time_s"])
    last = [r["losses"] for r in results if r["stage"] == S - 1 and r["losses"]]
    losses = [statistics.fmean(x) for x in zip(*last)] if mixed else [x for r in results for x in r["losses"]]
    out: dict[str, Any] = {"world_size": world, "stages": S, "dps": dps, "executor": "gpuplan p2p (stages of "
                           "different dp)" if mixed else "torch.distributed.pipelining", "steps": steps,
                           "measured_iteration_s": measured,
                           "measured_steps_s": step_s, "predicted_iteration_s": predicted,
                           "error": rel_error(predicted, measured), "core_sharing_rates": rates,
                           "cold_forward_s": cold[0], "cold_backward_s": cold[1], "wake_s": wake,
                           "sleep_late_s": late,
                           "predicted_here_iteration_s": predicted_here,
                           "predicted_here_error": rel_error(predicted_here, measured),
                           "predicted_here_profile_speed_iteration_s": predicted_profile_speed,
                           "predicted_here_profile_speed_error": rel_error(predicted_profile_speed, measured),
                           "compute_ratios": [ratios[k] for k in range(len(spec["ranges"]))],
                           "probe_others_share": None if speeds is None else speeds.others_share,
                           "probe_attempts": 0 if speeds is None else speeds.attempts,
                           "retimed_iteration_s": retimed,
                           "retimed_error": rel_error(retimed, measured), "block_durations_s": durations,
                           "losses": losses, "lagom_env": envs, "notes": notes,
                           "phases": {r["rank"]: r["phases"] for r in results},
                           "predicted_here_pipeline_end_s": pipeline_ends, "tails_s": tails,
                           "reduce_s": reduce_s, "predicted_here_plan_reduce_iteration_s": predicted_plan_reduce,
                           "predicted_here_plan_reduce_error": rel_error(predicted_plan_reduce, measured)}
    if return_grads:
        import torch

        out["grads"] = {k: torch.from_numpy(v) for r in results for k, v in r["grads"].items()}
    out.update(contention.report(before, monitor.window, step_s))
    rows = [["composed prediction (the bundle)", predicted, measured, pct(rel_error(predicted, measured))],
            ["the same for this machine (its stages' core sharing and compute speed, cold calls, wake-up; "
             "measured before the run)", predicted_here, measured, pct(rel_error(predicted_here, measured))],
            ["the same at the profile's compute speed", predicted_profile_speed, measured,
             pct(rel_error(predicted_profile_speed, measured))],
            ["the schedule re-timed with this run's blocks (checks the order)", retimed, measured,
             pct(rel_error(retimed, measured))]]
    brows = [[b.name, b.kind, b.devices[0], b.duration_s * 1e3, durations[b.name] * 1e3,
              pct(rel_error(b.duration_s, durations[b.name])) if durations[b.name] > 0 else "-"]
             for b in tprob.blocks]  # type: ignore[attr-defined]
    out["report"] = [Table(f"iteration: predicted vs measured (median of {steps} steps)",
                           ["prediction", "predicted_s", "measured_s", "error"], rows),
                     Table("blocks per stage: planned vs measured (ms)",
                           ["block", "kind", "stage device", "plan", "measured", "error"], brows),
                     machine_table(out), phase_table(out, stage_of)]
    warnings = list(notes)
    if off(predicted, measured):
        warnings.append(f"the composed prediction {predicted:.4g} s is {pct(rel_error(predicted, measured))} off the "
                        f"measured {measured:.4g} s (more than {TOLERANCE:.0%})")
    out["warnings"] = warnings + contention_warnings(out)
    return out
