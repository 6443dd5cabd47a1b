"""Execute a Poseidon plan with torch: one process per device, torch.distributed.pipelining for the
stages and the schedule (Schedule1F1B / ScheduleGPipe), data-parallel gradient all-reduce per stage,
and device-type heterogeneity emulated per process.

Layout: rank = replica * S + stage (S stages, `dp` pipeline replicas). Every stage must have
tp == 1 and the same dp (tensor parallelism inside a stage is not executed here). A slower device
type is emulated by a calibrated slowdown: after each forward or backward call of a stage, the
process sleeps (factor - 1) x the time the call took, factor = the type's profiled layer time over
the fastest type's (or the inverse ratio of catalog peaks without a profile). Returns measured
iteration and per-stage times next to the plan's predictions.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.base import Table
from gpuplan.models.poseidon import CostModel, PoseidonPlan, PoseidonProblem, iteration_time_fast
from gpuplan.models.profile import LayerCost, LayerTable
from gpuplan.models.workload import TransformerConfig, scaled
from gpuplan.profiling.stage_speed import measure_stage_speeds
from gpuplan.runtime import contention
from gpuplan.runtime.contention import cores as cpu_cores  # bundle.py uses this name
from gpuplan.runtime.report import TOLERANCE, contention_warnings, machine_table, off, pct, rel_error


def stage_slowdowns(problem: PoseidonProblem, plan: PoseidonPlan) -> list[float]:
    """Return each stage's slowdown factor (>= 1): the one its device type is emulated by on the
    measured device when the problem's layer table says so (a profile's `--emulate`, 1 for a
    measured type), else its type's one-layer forward+backward time at the plan's micro-batch over
    the fastest type's."""
    table = problem.layer_costs
    if table is not None and table.slowdowns:
        missing = sorted({s.device_type for s in plan.stages} - set(table.slowdowns))
        if missing:
            raise InputError(f"layer_costs.slowdowns: no slowdown for device type(s) {missing} of the plan's "
                             f"stages (have {sorted(table.slowdowns)})")
        return [table.slowdowns[s.device_type] for s in plan.stages]
    cm = CostModel(problem)
    b = plan.stages[0].micro_batch_size
    per = {t: sum(cm.layer(t, 1, b)) for t in problem.cluster.capacity()}
    fastest = min(per.values())
    return [per[s.device_type] / fastest for s in plan.stages]


def runnable_config(problem: PoseidonProblem, max_hidden: int = 256, max_vocab: int = 4096,
                    max_seq: int = 128) -> tuple[TransformerConfig, int, str]:
    """Return (config, sequence length, note): the problem's model, scaled down when it is larger
    than a CPU run allows (same number of layers, so the plan's layer ranges hold)."""
    cfg, seq = problem.model, problem.seq_len
    note = ""
    if cfg.hidden > max_hidden or cfg.vocab > max_vocab:
        cfg = scaled(cfg, hidden=min(cfg.hidden, max_hidden), vocab=min(cfg.vocab, max_vocab))
        note = f"scaled: hidden {cfg.hidden} (of {problem.model.hidden}), vocab {cfg.vocab} (of {problem.model.vocab})"
    if seq > max_seq:
        note += f"{'; ' if note else 'scaled: '}sequence {max_seq} (of {seq})"
        seq = max_seq
    return cfg, seq, note


def table_chunk_s(problem: PoseidonProblem, device_type: str, first: int, last: int, micro_batch: int
                  ) -> tuple[float, float] | None:
    """Return (forward_s, backward_s) the problem's layer table gives the modules of layers [first, last)
    (with the embedding when first == 0, the head and loss when last is the model's last layer) at
    `micro_batch`, without the emulated slowdown of `device_type` and without the pipeline runtime's
    per-call overhead: the figure `gpuplan.profiling.stage_speed` times the same modules against.
    None without a layer table."""
    table = problem.layer_costs
    if table is None:
        return None
    cm = CostModel(problem)
    lf, lb = cm.layer(device_type, 1, micro_batch)
    ef, eb = cm.extras(device_type, 1, micro_batch, first == 0, last == problem.model.num_layers)
    factor = table.slowdowns.get(device_type, 1.0) if table.slowdowns else 1.0
    n = last - first
    return (n * lf + ef) / factor, (n * lb + eb) / factor


def chunk_ratio(problem: PoseidonProblem, device_type: str, first: int, last: int, micro_batch: int,
                forward_now_s: float, backward_now_s: float, scaled: bool) -> tuple[float, float]:
    """Return (forward, backward): the compute of layers [first, last) measured just before the run the
    executor's way (`measure_stage_speeds`, seconds per call, one rank alone) over the layer table's
    figure for the same modules (`table_chunk_s`); 1.0 where there is no table, a figure is missing or
    not positive, or the run executes a scaled model (the table's modules are not the run's)."""
    ref = None if scaled else table_chunk_s(problem, device_type, first, last, micro_batch)
    if ref is None or min(ref) <= 0 or forward_now_s <= 0 or backward_now_s <= 0:
        return 1.0, 1.0
    return forward_now_s / ref[0], backward_now_s / ref[1]


def compute_ratios(problem: PoseidonProblem, plan: PoseidonPlan, forward_now_s: list[float],
                   backward_now_s: list[float], scaled: bool) -> list[tuple[float, float]]:
    """Return `chunk_ratio` (forward, backward) for every stage of `plan`."""
    return [chunk_ratio(problem, st.device_type, st.first_layer, st.last_layer, st.micro_batch_size,
                        forward_now_s[k], backward_now_s[k], scaled) for k, st in enumerate(plan.stages)]


def contended_iteration_s(fwd: list[float], bwd: list[float], p2p: list[float], tail: list[float], m: int,
                          schedule: str, factors: list[float], rates: list[float],
                          record: list[tuple[int, str, float, float]] | None = None, wake_s: float = 0.0,
                          sleep_s: float = 0.0) -> float:
    """Return the iteration time (s) of the DAG's op order when the S stage processes share the CPU
    cores: while k ops compute, each runs at rates[k-1] of its uncontended speed (processor sharing;
    min(1, cores / k) for ideal cores, or the rates `measure_stage_speeds` measured).

    fwd/bwd are the stages' per-micro-batch times including the emulated slowdown (uncontended
    seconds x factor): an op computes for time/factor of CPU work, then sleeps (factor - 1) x the
    time its compute took, as `slow_down_stage` does; sleeping and sends (p2p, seconds) use no core.
    Each stage's tail (all-reduce + optimizer) is CPU work after its last op. This
    equals the DAG longest path (`iteration_time_fast`) when every rate is 1. When `record` is a
    list, appends (stage, "F"|"B", start_s, end_s) of every op, its emulated sleep included.
    `wake_s`: seconds a stage waiting idle for a message starts after it arrives (the scheduler's
    wake-up delay; 0 by default); not charged when the message arrives while the stage is busy.
    `sleep_s`: seconds each emulated sleep lasts beyond what it asks (timer slack and wake-up,
    `measure_wait_costs`); charged to every op of a stage with factor > 1."""
    from gpuplan.models.poseidon import _flat_ops

    S = len(fwd)
    ops = _flat_ops(schedule, S, m)
    queue: list[list[int]] = [[] for _ in range(S)]  # per stage: op indices in execution order
    for i, (s, *_rest) in enumerate(ops):
        queue[s].append(i)
    end = [math.inf] * len(ops)
    sends = list(p2p) + [0.0]
    pos = [0] * S
    # per stage: phase "idle" | "cpu" | "sleep" | "tail" | "done", remaining work or wake-up time
    phase, left, began, t = ["idle"] * S, [0.0] * S, [0.0] * S, 0.0
    idle_since = [0.0] * S

    def ready(s: int) -> float:  # when stage s's next op may start (its input arrived, s awake)
        _, _, _, dep, send = ops[queue[s][pos[s]]]
        if dep < 0:
            return 0.0
        arrival = end[dep] + sends[send]
        return arrival + (wake_s if send >= 0 and arrival > idle_since[s] else 0.0)

    while True:
        for s in range(S):  # start every op whose dependency has arrived
            if phase[s] != "idle":
                continue
            if pos[s] == len(queue[s]):
                phase[s], left[s] = "tail", tail[s]
                continue
            _, is_f, _, dep, send = ops[queue[s][pos[s]]]
            if dep < 0 or ready(s) <= t + 1e-15:
                phase[s], began[s] = "cpu", t
                left[s] = (fwd[s] if is_f else bwd[s]) / factors[s]
        busy = [s for s in range(S) if phase[s] in ("cpu", "tail")]
        if not busy and all(p == "done" for p in phase):
            return t
        rate = rates[min(len(busy), len(rates)) - 1] if busy else 1.0
        step = min([left[s] / rate for s in busy] + [left[s] - t for s in range(S) if phase[s] == "sleep"]
                   + [ready(s) - t for s in range(S) if phase[s] == "idle" and pos[s] < len(queue[s])])
        step = max(step, 0.0)
        t += step
        for s in busy:
            left[s] -= step * rate
        for s in range(S):
            if phase[s] in ("cpu", "tail") and left[s] <= 1e-12:
                if phase[s] == "tail":
                    phase[s] = "done"
                else:
                    late = sleep_s if factors[s] > 1.0 + 1e-9 else 0.0
                    phase[s], left[s] = "sleep", t + (factors[s] - 1.0) * (t - began[s]) + late
            if phase[s] == "sleep" and left[s] <= t + 1e-12:
                end[queue[s][pos[s]]] = t
                if record is not None:
                    record.append((s, "F" if ops[queue[s][pos[s]]][1] else "B", began[s], t))
                pos[s] += 1
                phase[s], idle_since[s] = "idle", t


def order_actions(schedule: str, num_stages: int, m: int) -> dict[int, list[str]]:
    """Return each stage's actions in the plan's DAG op order (`_flat_ops`), with the sends and
    receives torch's action-list runtime needs (format "compute_comms"; rank = stage)."""
    from gpuplan.models.poseidon import _flat_ops
    from gpuplan.runtime import tessel_actions as acts

    lists: dict[int, list[str]] = {s: [] for s in range(num_stages)}
    for s, is_f, j, _, _ in _flat_ops(schedule, num_stages, m):
        lists[s].append(f"{s}{'F' if is_f else 'B'}{j}")
    out = acts.with_comms(lists, {s: s for s in range(num_stages)}, m)
    acts.check_actions(out, {s: s for s in range(num_stages)}, m)
    return out


def slow_down_stage(stage: Any, factor: float) -> None:
    """Wrap a PipelineStage's compute calls (forward, backward, and the weight-gradient half of a
    split backward where torch has it) to sleep (factor - 1) x their duration afterwards."""
    if factor <= 1.0 + 1e-9:
        return
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        call = getattr(stage, name, None)
        if call is None:
            continue

        def slowed(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = _call(*args, **kwargs)
            time.sleep((factor - 1.0) * (time.perf_counter() - t0))
            return out

        setattr(stage, name, slowed)


def _cpu_time_calls(stage: Any, sink: list[tuple[str, float]]) -> None:
    """Wrap a PipelineStage's compute calls so each appends ("F"|"B", process CPU seconds) to `sink`:
    the work of the call without the time spent waiting for a core (or sleeping for an emulated
    slowdown), so a contended machine does not inflate it. Meaningful with one torch thread."""
    for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
        call = getattr(stage, name)

        def timed(*args: Any, _call: Any = call, _kind: str = kind, **kwargs: Any) -> Any:
            t0 = time.process_time()
            out = _call(*args, **kwargs)
            sink.append((_kind, time.process_time() - t0))
            return out

        setattr(stage, name, timed)


def _global_name(local: str, first: int, last: int, has_embedding: bool, num_layers: int) -> str:
    """Map a stage module's parameter name to the whole model's (gpt.model) name."""
    idx, rest = local.split(".", 1)
    i = int(idx)
    if has_embedding:
        if i == 0:
            return f"0.{rest}"
        i -= 1
    if first + i < last:
        return f"{1 + first + i}.{rest}"
    return f"{1 + num_layers}.{rest}"


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from gpuplan.runtime import gpt
    from gpuplan.runtime import torch_pipelining as tp
    from gpuplan.runtime.torch_pipelining import time_stage_calls

    cfg = TransformerConfig.model_validate(spec["config"])
    S, dp, m, mb, seq = len(spec["ranges"]), spec["dp"], spec["m"], spec["micro_batch"], spec["seq"]
    replica, s = divmod(rank, S)
    pp_groups = [dist.new_group([r * S + k for k in range(S)]) for r in range(dp)]
    dp_groups = [dist.new_group([r * S + k for r in range(dp)]) for k in range(S)]
    first, last = spec["ranges"][s]
    module = gpt.stage(cfg, first, last, spec["seed"])
    stage = PipelineStage(module, s, S, torch.device("cpu"), group=pp_groups[replica])
    slow_down_stage(stage, spec["factors"][s])
    cpu_sink: list[tuple[str, float]] = []
    _cpu_time_calls(stage, cpu_sink)
    sink: list[tuple[int, str, float]] = []
    time_stage_calls(stage, sink)
    if spec["schedule"] != "gpipe" and m < S:  # torch's Schedule1F1B refuses m < S: the plan's own op order
        schedule = tp.runtime_schedule([stage], m, gpt.lm_loss, order_actions(spec["schedule"], S, m), "compute_comms")
    else:
        schedule_cls = ScheduleGPipe if spec["schedule"] == "gpipe" else Schedule1F1B
        schedule = schedule_cls(stage, m, loss_fn=gpt.lm_loss)
    opt = torch.optim.SGD(module.parameters(), lr=spec["lr"])
    calibrated = _calibrate(module, cfg, s, S, mb, seq, spec["factors"][s], spec["calibrate"])
    iters, losses_out, grads = [], [], {}
    for step in range(spec["warmup"] + spec["steps"]):
        tokens, targets = gpt.synthetic_batch(cfg, m * mb * dp, seq, seed=spec["seed"] + step)
        part = slice(replica * m * mb, (replica + 1) * m * mb)
        opt.zero_grad()
        sink.clear()
        cpu_sink.clear()
        dist.barrier()
        t0 = time.perf_counter()
        losses: list[Any] = []
        args = (tokens[part],) if s == 0 else ()
        kwargs = {"target": targets[part], "losses": losses} if s == S - 1 else {}
        schedule.step(*args, **kwargs)
        if dp > 1:
            for p in module.parameters():
                dist.all_reduce(p.grad, group=dp_groups[s])
                p.grad /= dp
        if step == 0 and replica == 0 and spec["grads"]:
            grads = {_global_name(n, first, last, first == 0, cfg.num_layers): p.grad.detach().numpy().copy()
                     for n, p in module.named_parameters()}
        opt.step()
        dist.barrier()
        wall = time.perf_counter() - t0
        if step >= spec["warmup"]:
            fw = [d for k, kind, d in sink if kind == "F"]
            bw = [d for k, kind, d in sink if kind == "B"]
            losses_out.append(float(sum(float(x.detach()) for x in losses) / len(losses)) if losses else None)
            fc = [d for kind, d in cpu_sink if kind == "F"]
            bc = [d for kind, d in cpu_sink if kind == "B"]
            iters.append((wall, statistics.median(fw) if fw else 0.0, statistics.median(bw) if bw else 0.0,
                          statistics.median(fc) if fc else 0.0, statistics.median(bc) if bc else 0.0))
    return {"rank": rank, "stage": s, "replica": replica, "iters": iters, "losses": losses_out, "grads": grads,
            "calibrated": calibrated}


def _calibrate(module: Any, cfg: TransformerConfig, s: int, S: int, mb: int, seq: int, factor: float,
               repeats: int) -> tuple[float, float]:
    """Return (forward_s, backward_s) of this stage on one micro-batch, timed standalone in the
    worker (all ranks at once, so under the run's own CPU contention) and scaled by its slowdown."""
    import torch
    import torch.distributed as dist

    from gpuplan.runtime import gpt

    if repeats <= 0:
        return 0.0, 0.0
    tokens, targets = gpt.synthetic_batch(cfg, mb, seq, seed=12345)
    g = torch.Generator().manual_seed(7)
    act = torch.randn(mb, seq, cfg.hidden, generator=g)
    fwd, bwd = [], []
    dist.barrier()
    for i in range(repeats + 1):
        x = tokens if s == 0 else act.clone().requires_grad_(True)
        t0 = time.perf_counter()
        y = module(x)
        t1 = time.perf_counter()
        if s == S - 1:
            gpt.lm_loss(y, targets).backward()
        else:
            y.backward(torch.ones_like(y))
        t2 = time.perf_counter()
        if i:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    module.zero_grad(set_to_none=True)
    return statistics.median(fwd) * factor, statistics.median(bwd) * factor


def run_plan(problem: PoseidonProblem, plan: PoseidonPlan, *, command: list[str] | None = None, steps: int = 3,
             warmup: int = 1, threads: int | None = None, seed: int = 0, lr: float = 1e-3, timeout_s: float = 600.0,
             return_grads: bool = False, factors: list[float] | None = None, calibrate: int = 3,
             sharing: list[float] | None = None) -> dict[str, Any]:
    """Run `steps` training iterations of the plan (after `warmup`) and return measured figures:
    iteration time (s, median), per-stage forward/backward time per micro-batch (s, median), each
    next to the plan's prediction, the losses, the slowdown factors and the scaling applied.

    "predicted_cpu_iteration_s" is the plan's prediction for this machine: the plan's op order with
    the workers sharing this machine's cores, by `contended_iteration_s`, from figures known before
    the run. Just before the launch `gpuplan.profiling.stage_speed.measure_stage_speeds` times the
    plan's own stage modules in as many processes as the run has: the stages looping together give
    the sharing rates (the speed of a worker while k compute; `sharing` overrides them), and each
    stage's modules timed alone, each call after a wait, by process CPU time, as the layer table
    times them, give the speed of this machine's cores now: each stage's compute is the plan's
    times that figure over the layer table's for the same modules ("compute_ratios",
    "stageK_forward_ratio" / "stageK_backward_ratio"; 1 with `sharing` given, without a layer table,
    or for a scaled model). A shared virtual machine's cores drift by 20 % and more between a profile
    and a run minutes later (docs/poseidon.md); "predicted_cpu_profile_speed_iteration_s" is the same
    prediction at the profile's speed (compute ratios 1). When the workers outnumber the cores, each forward and backward call there also costs the
    extra CPU time of a call after a wait on cores others kept busy (`measure_cold_op_s`, measured
    just before the launch; "cold_forward_s" / "cold_backward_s", s; 0 with `sharing` given), and a
    stage waiting idle for a message starts after the scheduler's wake-up delay on busy cores
    (`measure_wake_s`, measured likewise; "wake_s", s). Each emulated sleep of a slowed stage ends
    late by the measured overshoot of a sleep ("sleep_late_s", s; on busy cores when the workers
    outnumber the cores, `measure_wait_costs`; 0 with `sharing` given).
    "measured_fastest_iteration_s" is the fastest step, the one least disturbed by other jobs on a
    shared machine.

    With calibrate > 0 the workers first time their stage standalone (`calibrate` repeats, all at
    once) and "calibrated_iteration_s" is the DAG model's longest path fed with those stage times
    (the plan's sends, all-reduce and optimizer terms unchanged): the prediction under the run's
    own CPU load. "replayed_iteration_s" is the DAG fed with the per-stage times measured inside the
    run itself: it checks the DAG structure (order, dependencies) apart from the per-op costs.
    With return_grads, also "grads": the first step's gradients by parameter name.

    `threads` per worker defaults to the threads the problem's layer table was measured with (1).
    The machine's contention is recorded (gpuplan.runtime.contention.report: load average before
    and during, other processes' CPU share, step-time spread, "contended", "verdict"); "report"
    holds the tables `gpuplan run` prints (predicted next to measured, per iteration and per stage,
    and the machine) and "warnings" each prediction further than 15 % from the measurement."""
    if command:
        raise InputError("poseidon plans run their own training step; a command after -- is not supported")
    stages = plan.stages
    bad = [s.index for s in stages if s.tp != 1]
    if bad:
        raise InputError(f"stages {bad} use tensor parallelism; the CPU executor runs tp == 1 stages only")
    if len({s.dp for s in stages}) != 1:
        raise InputError(f"the executor needs the same dp in every stage, got {[s.dp for s in stages]}")
    cfg, seq, note = runnable_config(problem)
    dp, S = stages[0].dp, len(stages)
    spec = {"config": cfg.model_dump(mode="json"), "ranges": [(s.first_layer, s.last_layer) for s in stages],
            "dp": dp, "m": plan.num_microbatches, "micro_batch": stages[0].micro_batch_size, "seq": seq,
            "schedule": plan.schedule, "factors": factors or stage_slowdowns(problem, plan), "seed": seed,
            "steps": steps, "warmup": warmup, "lr": lr, "grads": return_grads,
            "calibrate": calibrate}
    from gpuplan.runtime.launch import run_workers

    table = problem.layer_costs
    threads = threads or (table.threads if table is not None and table.threads else 1)
    before = contention.quiet_window()
    # the plan's stages timed the executor's way just before the launch (each rank's own modules, calls
    # after waits, process CPU time) and the core sharing of those stages computing together
    speeds = None if sharing else measure_stage_speeds(
        cfg, [[(stages[r % S].first_layer, stages[r % S].last_layer)] for r in range(S * dp)],
        micro_batch=stages[0].micro_batch_size, seq_len=seq, threads=threads, seed=seed)
    rates = sharing or speeds.rates  # type: ignore[union-attr]
    ratios = [(1.0, 1.0)] * S if speeds is None else compute_ratios(
        problem, plan, [speeds.forward_s[k][0] for k in range(S)], [speeds.backward_s[k][0] for k in range(S)],
        scaled=bool(note))
    # an op after a wait (a receive, an emulated sleep) with every core taken by other workers, and
    # how late an emulated sleep ends
    *cold, late = (0.0, 0.0, 0.0) if sharing else measure_wait_costs(
        cfg, seq_len=seq, micro_batch=stages[0].micro_batch_size, processes=S * dp, cores=cpu_cores(), threads=threads)
    wake = 0.0 if sharing else measure_wake_s(cfg, seq_len=seq, micro_batch=stages[0].micro_batch_size,
                                              processes=S * dp, cores=cpu_cores(), threads=threads)
    with contention.ContentionMonitor() as monitor:
        results = run_workers(_worker, S * dp, args=(spec,), threads=threads, timeout_s=timeout_s)
    step_s = [max(r["iters"][i][0] for r in results) for i in range(steps)]
    iteration = statistics.median(step_s)
    out: dict[str, Any] = {"world_size": S * dp, "steps": steps, "threads": threads, "scaling": note or "none",
                           "measured_iteration_s": iteration, "measured_step_s": step_s,
                           "measured_fastest_iteration_s": min(step_s),
                           "predicted_iteration_s": plan.iteration_time_s,
                           "predicted_over_measured": plan.iteration_time_s / iteration}
    out["cores"] = cpu_cores()
    out["core_sharing_rates"] = rates
    p2p, tails = [st.p2p_s for st in stages], [st.allreduce_s + st.optimizer_s for st in stages]
    replay: list[tuple[int, str, float, float]] = []
    out["cold_forward_s"], out["cold_backward_s"] = cold
    out["wake_s"] = wake
    out["sleep_late_s"] = late
    # every forward and backward call of a stage follows a wait (a receive, an emulated sleep): its
    # measured extra CPU time, as work the emulated sleep stretches too
    stage_rates = [rates[min(len(rates), k * dp) - 1] for k in range(1, S + 1)]
    out["compute_ratios"] = ratios
    out["probe_others_share"] = None if speeds is None else speeds.others_share
    out["probe_attempts"] = 0 if speeds is None else speeds.attempts
    # the prediction for this machine: each stage's compute at the speed the probe timed it at
    out["predicted_cpu_iteration_s"] = contended_iteration_s(
        [st.forward_s * r[0] + cold[0] * f for st, f, r in zip(stages, spec["factors"], ratios)],
        [st.backward_s * r[1] + cold[1] * f for st, f, r in zip(stages, spec["factors"], ratios)], p2p, tails,
        plan.num_microbatches, plan.schedule, spec["factors"], stage_rates, record=replay, wake_s=wake,
        sleep_s=late)
    # the same at the profile's speed
    out["predicted_cpu_profile_speed_iteration_s"] = contended_iteration_s(
        [st.forward_s + cold[0] * f for st, f in zip(stages, spec["factors"])],
        [st.backward_s + cold[1] * f for st, f in zip(stages, spec["factors"])], p2p, tails,
        plan.num_microbatches, plan.schedule, spec["factors"], stage_rates, wake_s=wake, sleep_s=late)
    out["predicted_cpu_over_measured"] = out["predicted_cpu_iteration_s"] / iteration
    # the same on idle cores (min(1, cores / k) for k workers computing): what a quiet machine gives
    out["predicted_idle_cpu_iteration_s"] = contended_iteration_s(
        [st.forward_s for st in stages], [st.backward_s for st in stages], p2p, tails,
        plan.num_microbatches, plan.schedule, spec["factors"],
        [min(1.0, out["cores"] / (k * dp)) for k in range(1, S + 1)])
    if calibrate > 0:
        cal = [max(r["calibrated"] for r in results if r["stage"] == k) for k in range(S)]
        out["calibrated_iteration_s"] = iteration_time_fast(
            [c[0] for c in cal], [c[1] for c in cal], p2p, tails, plan.num_microbatches, plan.schedule)
        out["calibrated_over_measured"] = out["calibrated_iteration_s"] / iteration
        for k, c in enumerate(cal):
            out[f"stage{k}_forward_calibrated_s"], out[f"stage{k}_backward_calibrated_s"] = c
    for k, st in enumerate(stages):
        mine = [r for r in results if r["stage"] == k]
        out[f"stage{k}_slowdown"] = spec["factors"][k]
        out[f"stage{k}_forward_ratio"], out[f"stage{k}_backward_ratio"] = ratios[k]
        if speeds is not None:  # the probe's CPU time per call of this stage's modules, before the run
            out[f"stage{k}_forward_now_s"] = speeds.forward_s[k][0]
            out[f"stage{k}_backward_now_s"] = speeds.backward_s[k][0]
        out[f"stage{k}_forward_measured_s"] = statistics.median(x[1] for r in mine for x in r["iters"])
        out[f"stage{k}_forward_predicted_s"] = st.forward_s
        out[f"stage{k}_forward_predicted_cpu_s"] = statistics.median(
            b - a for s, kind, a, b in replay if s == k and kind == "F")
        out[f"stage{k}_backward_measured_s"] = statistics.median(x[2] for r in mine for x in r["iters"])
        out[f"stage{k}_backward_predicted_s"] = st.backward_s
        out[f"stage{k}_backward_predicted_cpu_s"] = statistics.median(
            b - a for s, kind, a, b in replay if s == k and kind == "B")
        # CPU time of each op (no waiting, no emulated sleep) against the plan's compute share
        out[f"stage{k}_forward_cpu_measured_s"] = statistics.median(x[3] for r in mine for x in r["iters"])
        out[f"stage{k}_backward_cpu_measured_s"] = statistics.median(x[4] for r in mine for x in r["iters"])
    out["replayed_iteration_s"] = iteration_time_fast(
        [out[f"stage{k}_forward_measured_s"] for k in range(S)], [out[f"stage{k}_backward_measured_s"] for k in range(S)],
        p2p, tails, plan.num_microbatches, plan.schedule)
    out.update(contention.report(before, monitor.window, step_s))
    out["report"], out["warnings"] = _report(problem, plan, out)
    last = [r for r in results if r["stage"] == S - 1 and r["replica"] == 0][0]
    out["losses"] = last["losses"]
    if return_grads:
        import torch

        out["grads"] = {k: torch.from_numpy(v) for r in results for k, v in r["grads"].items()}
    return out


def _report(problem: PoseidonProblem, plan: PoseidonPlan, out: dict[str, Any]) -> tuple[list[Table], list[str]]:
    """Return the tables `gpuplan run` prints for a run's figures `out` and the warnings: the plan's
    own predictions (and those with this machine's core sharing) next to the measured ones."""
    stages, S, workers, cores = plan.stages, len(plan.stages), out["world_size"], out["cores"]
    measured, steps = out["measured_iteration_s"], out["steps"]
    shared = workers > cores
    rows = [["plan (DAG; devices share nothing)", plan.iteration_time_s, measured,
             pct(rel_error(plan.iteration_time_s, measured))],
            [f"plan with {workers} workers sharing {cores} idle cores", out["predicted_idle_cpu_iteration_s"],
             measured, pct(rel_error(out["predicted_idle_cpu_iteration_s"], measured))],
            [f"plan with {workers} workers sharing {cores} cores (its stages' sharing rates and compute speed "
             f"measured before the run: the prediction for this machine)",
             out["predicted_cpu_iteration_s"], measured, pct(rel_error(out["predicted_cpu_iteration_s"], measured))],
            ["the same at the profile's compute speed",
             out.get("predicted_cpu_profile_speed_iteration_s", out["predicted_cpu_iteration_s"]), measured,
             pct(rel_error(out.get("predicted_cpu_profile_speed_iteration_s", out["predicted_cpu_iteration_s"]),
                           measured))],
            ["plan (DAG) vs the fastest step", plan.iteration_time_s, out["measured_fastest_iteration_s"],
             pct(rel_error(plan.iteration_time_s, out["measured_fastest_iteration_s"]))]]
    tables = [Table(f"iteration: predicted vs measured (median of {steps} steps; error = (predicted - measured) / "
                    f"measured)", ["prediction", "predicted_s", "measured_s", "error"], rows)]
    srows, off_stages, compute_errors = [], [], []
    for k, st in enumerate(stages):
        f_m, b_m = out[f"stage{k}_forward_measured_s"], out[f"stage{k}_backward_measured_s"]
        f_c, b_c = out[f"stage{k}_forward_predicted_cpu_s"], out[f"stage{k}_backward_predicted_cpu_s"]
        factor = out[f"stage{k}_slowdown"]
        f_w, b_w = st.forward_s / factor, st.backward_s / factor  # the compute share of the plan's op times
        f_cpu, b_cpu = out.get(f"stage{k}_forward_cpu_measured_s", 0.0), out.get(f"stage{k}_backward_cpu_measured_s", 0.0)
        srows.append([k, st.device_type, factor, st.num_layers, st.forward_s * 1e3, f_c * 1e3,
                      f_m * 1e3, pct(rel_error(st.forward_s, f_m)), st.backward_s * 1e3, b_c * 1e3, b_m * 1e3,
                      pct(rel_error(st.backward_s, b_m)), f"{f_w * 1e3:.3g} / {f_cpu * 1e3:.3g}",
                      f"{b_w * 1e3:.3g} / {b_cpu * 1e3:.3g}"])
        if f_cpu > 0 and b_cpu > 0:
            compute_errors += [(rel_error(f_w, f_cpu), f"stage {k} forward"), (rel_error(b_w, b_cpu), f"stage {k} backward")]
        if off(st.forward_s, f_m) or off(st.backward_s, b_m):
            off_stages.append(f"stage {k} ({st.device_type}) forward {pct(rel_error(st.forward_s, f_m))}, "
                              f"backward {pct(rel_error(st.backward_s, b_m))}")
    tables.append(Table("stages: one micro-batch, predicted by the plan / with core sharing / measured (ms; the "
                        "emulated slowdown's sleep included); compute plan / CPU time: the plan's op time without the "
                        "slowdown vs the op's process CPU time in the run (not inflated by waiting for a core)",
                        ["stage", "type", "slowdown", "layers", "fwd plan", "fwd shared", "fwd measured", "fwd error",
                         "bwd plan", "bwd shared", "bwd measured", "bwd error", "fwd compute plan / CPU time",
                         "bwd compute plan / CPU time"], srows))
    tables.append(machine_table(out))
    warnings = []
    why = []
    if shared:
        why.append(f"{workers} workers share {cores} cores, which the plan's figure leaves out (with core sharing it "
                   f"predicts {out['predicted_cpu_iteration_s']:.4g} s, "
                   f"{pct(rel_error(out['predicted_cpu_iteration_s'], measured))})")
    if out["contended"]:
        why.append("the machine was contended (see 'machine')")
    if off(plan.iteration_time_s, measured):
        warnings.append(f"the plan predicts {plan.iteration_time_s:.4g} s per iteration, measured {measured:.4g} s: "
                        f"{pct(rel_error(plan.iteration_time_s, measured))}, more than {TOLERANCE:.0%} off"
                        + (f"; {'; '.join(why)}" if why else ""))
    if off_stages:
        warnings.append(f"per-stage predictions more than {TOLERANCE:.0%} off: {'; '.join(off_stages)}")
    if out["scaling"] != "none":
        warnings.append(f"the run executes a scaled model ({out['scaling']}), not the planned one: predicted and "
                        f"measured times are not comparable")
    if problem.layer_costs is not None and problem.layer_costs.clock == "cpu" and \
            problem.layer_costs.calls == "back-to-back":
        warnings.append("the profile's CPU layer table timed its calls back to back (a profile older than the "
                        "after-wait timing, docs/profiling.md): a pipeline's calls each follow a wait and cost "
                        "25-40 % more CPU time on such machines, so the plan is too fast; profile again "
                        "(gpuplan profile) and solve with the new profile")
    if problem.layer_costs is None:
        warnings.append("the plan's costs come from declared peak TFLOP/s, not measured layers: solve with "
                        "--profile for a prediction of this machine")
    worst = max(compute_errors, key=lambda e: abs(e[0]), default=None)
    if worst is not None and off(1.0 + worst[0], 1.0):
        warnings.append(f"the ops' own CPU time differs from the plan's compute by more than {TOLERANCE:.0%} "
                        f"(worst: {worst[1]} {pct(worst[0])}): the cost model, not only the machine, is off")
    warned = contention_warnings(out)
    if warned and out["contended"] and worst is not None and not off(1.0 + worst[0], 1.0):
        warned[0] += (f"; the ops' own CPU time is within {abs(worst[0]):.0%} of the plan's compute, so the "
                      f"difference is the machine's")
    return tables, warnings + warned


def _cold_op_worker(rank: int, world: int, config_doc: dict[str, Any], micro_batch: int, seq_len: int,
                    window_s: float) -> list[float]:
    import torch
    import torch.distributed as dist

    from gpuplan.runtime import gpt

    cfg = TransformerConfig.model_validate({**config_doc, "num_layers": 3})
    block = gpt.stage(cfg, 1, 2, seed=rank)  # one middle block: no embedding, no head
    x = torch.randn(micro_batch, seq_len, cfg.hidden, generator=torch.Generator().manual_seed(rank))

    def call(fn: Any) -> tuple[Any, float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        return out, time.process_time() - c0, time.perf_counter() - w0

    over: list[float] = []  # how much longer each sleep took than asked (the emulation's sleeps)

    def nap(seconds: float) -> None:
        t0 = time.perf_counter()
        time.sleep(seconds)
        over.append(time.perf_counter() - t0 - seconds)

    def op(wait: bool) -> tuple[float, float]:  # (forward, backward) CPU seconds, each call after a wait
        y, cf, wf = call(lambda: block(x.clone().requires_grad_(True)))
        if wait:
            nap(wf)
        _, cb, wb = call(lambda: y.backward(torch.ones_like(y)))
        if wait:
            nap(wb)
        return cf, cb

    for _ in range(3):
        op(False)
    per_op: list[float] = []
    for others_busy in (False, True):  # rank 0 waits after each call as long as the call took
        dist.barrier()
        over.clear()
        cpu: list[tuple[float, float]] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < window_s or (rank == 0 and len(cpu) < 2):
            if rank == 0:
                cpu.append(op(True))
            elif others_busy:
                op(False)
            else:
                time.sleep(window_s)
        dist.barrier()
        per_op += [statistics.median(c[0] for c in cpu), statistics.median(c[1] for c in cpu)] if cpu else [0.0, 0.0]
        per_op.append(statistics.fmean(over) if over else 0.0)
    return per_op  # quiet: forward, backward, sleep overshoot; busy: the same


def measure_cold_op_s(config: TransformerConfig, *, seq_len: int, micro_batch: int, processes: int,
                      cores: int, threads: int = 1, window_s: float = 0.5) -> tuple[float, float]:
    """Return (forward_s, backward_s): the extra process CPU time (s) a forward / backward call costs
    when it follows a wait during which every core was busy with the run's other workers, over one
    following a wait on idle cores; (0, 0) when `processes` <= `cores` (a waiting worker's core
    stays free). Measured with one gpt block, each call followed by a sleep as long as it took, in
    one process while min(processes, cores + 1) - 1 others sleep, then loop the block (someone
    else ran on its core meanwhile: caches refilled, or the process moved); never below 0."""
    return measure_wait_costs(config, seq_len=seq_len, micro_batch=micro_batch, processes=processes, cores=cores,
                              threads=threads, window_s=window_s)[:2]


def sleep_overshoot_s(seconds: float = 1e-3, naps: int = 100) -> float:
    """Return the mean time (s) a `time.sleep(seconds)` of this process lasts beyond `seconds` (timer
    slack and wake-up), over `naps` sleeps, as the machine is now."""
    over = []
    for _ in range(naps):
        t0 = time.perf_counter()
        time.sleep(seconds)
        over.append(time.perf_counter() - t0 - seconds)
    return max(0.0, statistics.fmean(over))


def measure_wait_costs(config: TransformerConfig, *, seq_len: int, micro_batch: int, processes: int,
                       cores: int, threads: int = 1, window_s: float = 0.5) -> tuple[float, float, float]:
    """Return (forward_s, backward_s, sleep_s): the extra CPU time of a call after a wait on cores the
    other workers kept busy (as `measure_cold_op_s`; 0 when `processes` <= `cores`), and how much longer
    than asked one of the emulation's sleeps lasts (s, mean: timer slack plus the wake-up, on a busy
    core when the workers outnumber the cores, measured with the block's own call times as the sleep
    lengths while the others loop the block; else on this process's idle core). Never below 0."""
    from gpuplan.runtime.launch import run_workers

    if processes <= cores:
        return 0.0, 0.0, sleep_overshoot_s()
    per = run_workers(_cold_op_worker, min(processes, cores + 1),
                      args=(config.model_dump(mode="json"), micro_batch, seq_len, window_s),
                      threads=threads, timeout_s=600)
    quiet_f, quiet_b, _, busy_f, busy_b, busy_sleep = per[0]
    return max(0.0, busy_f - quiet_f), max(0.0, busy_b - quiet_b), max(0.0, busy_sleep)


def _wake_worker(rank: int, world: int, config_doc: dict[str, Any], micro_batch: int, seq_len: int,
                 messages: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from gpuplan.runtime import gpt

    cfg = TransformerConfig.model_validate({**config_doc, "num_layers": 3})
    block = gpt.stage(cfg, 1, 2, seed=rank)
    x = torch.randn(micro_batch, seq_len, cfg.hidden, generator=torch.Generator().manual_seed(rank))
    gap_s = 0.005  # the receiver blocks this long before each message, as a stage waiting for its input
    out: list[float] = []
    for busy in (False, True):
        dist.barrier()
        stamp, latency, t0 = torch.zeros(1, dtype=torch.float64), [], time.perf_counter()
        if rank == world - 2:  # the sender
            for _ in range(messages):
                time.sleep(gap_s)
                stamp[0] = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process
                dist.send(stamp, world - 1)
        elif rank == world - 1:  # the receiver
            for _ in range(messages):
                dist.recv(stamp, world - 2)
                latency.append(time.perf_counter() - float(stamp[0]))
        elif busy:  # the others keep every core busy for longer than the messages take
            while time.perf_counter() - t0 < 3 * messages * gap_s:
                y = block(x.clone().requires_grad_(True))
                y.backward(torch.ones_like(y))
        dist.barrier()
        out.append(statistics.mean(latency) if latency else 0.0)
    return out


def measure_wake_s(config: TransformerConfig, *, seq_len: int, micro_batch: int, processes: int, cores: int,
                   threads: int = 1, messages: int = 60) -> float:
    """Return the wake-up delay (s) of a worker blocked waiting for a message while the run's other
    workers keep every core busy: the mean time from a send to the receiver running again, minus
    the same on idle cores; 0 when `processes` <= `cores`. Measured with `cores` processes looping
    one gpt block's forward+backward while one process sends `messages` time-stamped messages,
    5 ms apart, to another blocked in gloo's recv; never below 0."""
    from gpuplan.runtime.launch import run_workers

    if processes <= cores:
        return 0.0
    per = run_workers(_wake_worker, cores + 2, args=(config.model_dump(mode="json"), micro_batch, seq_len, messages),
                      threads=threads, timeout_s=600)
    idle, busy = per[-1]
    return max(0.0, busy - idle)


def _profile_worker(rank: int, world: int, config_doc: dict[str, Any], micro_batches: list[int], seq_len: int,
                    repeats: int) -> list[dict[str, Any]]:
    from gpuplan.profiling.layers import LayerPlan, layer_table

    plan = LayerPlan(TransformerConfig.model_validate(config_doc), None, "", micro_batches, [seq_len], "fp32")
    return [c.model_dump(mode="json") for c in layer_table(plan, "cpu", "cpu", repeats=repeats).costs]


def measure_layer_costs(config: TransformerConfig, *, seq_len: int, micro_batches: list[int], processes: int = 1,
                        threads: int = 1, repeats: int = 5) -> LayerTable:
    """Return the LayerTable of `config`'s gpt blocks, embedding and head measured on this CPU by the
    profiler (gpuplan.profiling.layers) in `processes` processes at once, each on `threads` threads,
    so the costs carry the contention of a run with that many workers; times are the median over
    the processes (seconds)."""
    from gpuplan.runtime.launch import run_workers

    per = run_workers(_profile_worker, processes, args=(config.model_dump(mode="json"), micro_batches, seq_len,
                                                        repeats), threads=threads, timeout_s=600)
    costs = []
    for rows in zip(*per):
        row = dict(rows[0])
        row["forward_s"] = statistics.median(r["forward_s"] for r in rows)
        row["backward_s"] = statistics.median(r["backward_s"] for r in rows)
        costs.append(LayerCost.model_validate(row))
    return LayerTable(model=config.name, config=config.model_dump(mode="json"), dtype="fp32", costs=costs,
                      calls="after-wait", scaling_note=f"measured on this CPU: {processes} process(es) at once, {threads} thread(s) each")


def cpu_problem(config: TransformerConfig, *, seq_len: int, global_batch: int, types: dict[str, tuple[int, float]],
                micro_batches: list[int], threads: int = 1, repeats: int = 5, **fields: Any) -> PoseidonProblem:
    """Return a Poseidon problem for a CPU run whose costs were measured here: the gpt blocks of
    `config` are timed with the profiler at each micro-batch size in one process, uncontended
    (`measure_layer_costs`; the sharing of the cores by the run's workers is modelled by
    `contended_iteration_s`); `types` maps an emulated device type to (device count, slowdown
    factor), and each type's layer table is the measured one times its factor. One node; local
    gloo link."""
    base = measure_layer_costs(config, seq_len=seq_len, micro_batches=micro_batches, processes=1, threads=threads,
                               repeats=repeats)
    costs = [c.model_copy(update={"device_type": name, "forward_s": c.forward_s * f, "backward_s": c.backward_s * f})
             for name, (_, f) in types.items() for c in base.costs]
    table = base.model_copy(update={"costs": costs})
    device_types = {name: {"name": name, "memory_bytes": "16 GiB", "memory_bandwidth_GBps": 10.0,
                           "peak_tflops": {"fp32": 0.1 / f}, "intra_node_GBps": 2.0}
                    for name, (_, f) in types.items()}
    doc = {"kind": "poseidon", "cluster": {
        "device_types": device_types,
        "nodes": [{"name": "cpu0", "gpus": {name: n for name, (n, _) in types.items()},
                   "intra_link": {"bandwidth_GBps": 2.0, "latency_s": 1e-4}}]},
        "model": config.model_dump(mode="json"), "global_batch": global_batch, "seq_len": seq_len, "dtype": "fp32",
        "optimizer_state_bytes_per_param": 0.0, "layer_costs": table.model_dump(mode="json"), **fields}
    return PoseidonProblem.model_validate(doc)
