"""`gpuplan run` for Tessel plans: execute the schedule with torch.distributed.pipelining on local
processes (gloo on CPU), on a small GPT whose stages match the placement, and compare the measured
step time with the plan's own makespan (and, apart, with the plan's order re-timed by the block
durations measured in the run, which checks the order but not the plan's figures).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.base import Table
from gpuplan.models.tessel import TesselPlan, TesselProblem, orders_of, simulate
from gpuplan.runtime import contention
from gpuplan.runtime import tessel_actions as acts
from gpuplan.runtime.report import TOLERANCE, contention_warnings, machine_table, off, pct, rel_error


def _stage_layers(stage: int, per_stage: int) -> tuple[int, int]:
    return stage * per_stage, (stage + 1) * per_stage


def _config(num_stages: int, per_stage: int, hidden: int, vocab: int) -> dict[str, Any]:
    from gpuplan.models.workload import model_config, scaled

    cfg = scaled(model_config("gpt3-125m"), num_layers=num_stages * per_stage, hidden=hidden, vocab=vocab)
    return cfg.model_dump()


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt
    from gpuplan.runtime import torch_pipelining as tp

    cfg = TransformerConfig.model_validate(spec["cfg"])
    n_stages, per_stage, seed = spec["num_stages"], spec["per_stage"], spec["seed"]
    mine = sorted(s for s, r in spec["ranks"].items() if r == rank)
    modules = {s: gpt.stage(cfg, *_stage_layers(s, per_stage), seed) for s in mine}
    stages = [tp.pipeline_stage(modules[s], s, n_stages, torch.device("cpu")) for s in mine]
    calls: list[tuple[int, str, float]] = []
    sched = tp.runtime_schedule(stages, spec["microbatches"], gpt.lm_loss, spec["actions"], spec["format"])
    tokens, targets = gpt.synthetic_batch(cfg, spec["microbatches"] * spec["mbs"], spec["seq"], seed)
    step_s: list[float] = []
    losses: list[float] = []
    for step in range(spec["steps"] + 1):
        for m in modules.values():
            m.zero_grad(set_to_none=True)
        found: list[Any] = []
        dist.barrier()
        t0 = time.perf_counter()
        args = (tokens,) if 0 in mine else ()
        target = targets if n_stages - 1 in mine else None
        sched.step(*args, target=target, losses=found if target is not None else None)
        dist.barrier()
        if step == 0:  # the first step warms up (shape inference, allocations); then time the blocks
            for st in stages:
                tp.time_stage_calls(st, calls)
            tp.time_loss_calls(sched, calls)
        else:
            step_s.append(time.perf_counter() - t0)
        losses = [float(x.detach()) for x in found]
    comm_s = _ping_pong(rank, world, (spec["mbs"], spec["seq"], cfg.hidden)) if world > 1 else 0.0
    durations: dict[int, dict[str, float]] = {}
    for s in mine:
        for op in ("F", "B", "I", "W", "L"):
            got = [x for st, o, x in calls if st == s and o == op]
            if got:
                durations.setdefault(s, {})[op] = statistics.fmean(got)
        # per step: the gradient reduction at its end
        durations.setdefault(s, {})["R"] = sum(x for st, o, x in calls if st == s and o == "R") / max(1, spec["steps"])
    grads = {s: [p.grad.detach().clone().numpy() if p.grad is not None else None for p in modules[s].parameters()]
             for s in mine} if spec["grads"] else {}
    return {"rank": rank, "step_s": step_s, "durations": durations, "losses": losses, "grads": grads,
            "comm_s": comm_s}


def _ping_pong(rank: int, world: int, shape: tuple[int, ...], repeats: int = 7) -> float:
    """Return the one-way time (s) of an activation-sized tensor between ranks 0 and 1 (0 elsewhere)."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(*shape)
    samples = []
    for _ in range(repeats):
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(x, 1)
            dist.recv(x, 1)
            samples.append((time.perf_counter() - t0) / 2)
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
    dist.barrier()
    return statistics.median(samples) if samples else 0.0


def reference_grads(cfg_doc: dict[str, Any], num_stages: int, per_stage: int, microbatches: int, mbs: int,
                    seq: int, seed: int) -> dict[int, list[Any]]:
    """Return per-stage gradients (numpy) of the same model run in one process, micro-batch by
    micro-batch, with the loss averaged over micro-batches as the pipeline schedule does."""
    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt

    cfg = TransformerConfig.model_validate(cfg_doc)
    mods = [gpt.stage(cfg, *_stage_layers(s, per_stage), seed) for s in range(num_stages)]
    tokens, targets = gpt.synthetic_batch(cfg, microbatches * mbs, seq, seed)
    for i in range(microbatches):
        x = tokens[i * mbs:(i + 1) * mbs]
        for m in mods:
            x = m(x)
        (gpt.lm_loss(x, targets[i * mbs:(i + 1) * mbs]) / microbatches).backward()
    return {s: [p.grad.detach().numpy() for p in m.parameters()] for s, m in enumerate(mods)}


def _report(problem: TesselProblem, out: dict[str, Any]) -> tuple[list[Table], list[str]]:
    """Return the tables `gpuplan run` prints for a Tessel run's figures `out`, and the warnings."""
    measured, plan_s = out["measured_step_s"], out["plan_makespan_s"]
    rows = [["the plan's makespan (the problem's block durations)", plan_s, measured,
             pct(rel_error(plan_s, measured))],
            ["the plan's order re-timed with the blocks measured in this run (checks the order only)",
             out["retimed_step_s"], measured, pct(rel_error(out["retimed_step_s"], measured))]]
    tables = [Table(f"step: predicted vs measured (median of {out['steps']} steps; error = (predicted - measured) / "
                    f"measured)", ["prediction", "predicted_s", "measured_s", "error"], rows)]
    brows, off_blocks = [], []
    for b in problem.blocks:
        got = out["block_durations_s"].get(b.name, 0.0)
        brows.append([b.name, b.kind, ",".join(str(d) for d in b.devices), b.duration_s * 1e3, got * 1e3,
                      pct(rel_error(b.duration_s, got)) if got > 0 else "-"])
        if got > 0 and off(b.duration_s, got):
            off_blocks.append(b.name)
    tables.append(Table("blocks: the problem's duration vs the mean measured in the run (ms)",
                        ["block", "kind", "devices", "plan", "measured", "error"], brows))
    tables.append(machine_table(out))
    warnings = []
    if off(plan_s, measured):
        warnings.append(f"the plan's makespan {plan_s:.4g} s differs from the measured step {measured:.4g} s by "
                        f"{pct(rel_error(plan_s, measured))}, more than {TOLERANCE:.0%}"
                        + (f"; blocks {', '.join(off_blocks)} last another time here than the problem says (the "
                           f"plan times the problem's durations, not this machine's)" if off_blocks else ""))
    warnings += contention_warnings(out)
    return tables, warnings


def run_plan(problem: TesselProblem, plan: TesselPlan, *, command: list[str] | None = None, steps: int = 3,
             hidden: int = 256, layers_per_stage: int = 1, microbatch_size: int = 4, seq: int = 128, vocab: int = 256,
             format: str = "compute_comms", seed: int = 0, threads: int = 1, timeout_s: float = 300.0,
             check_grads: bool = False) -> dict[str, Any]:
    """Run the plan's schedule on `problem.devices` CPU processes (gloo); return measured figures.

    Returns measured_step_s (median wall time of a training step, s), predicted_step_s (the plan's
    own makespan, s, from the problem's block durations), its error against the measured step
    (error: (predicted - measured) / measured; error_pct: its absolute value in %),
    retimed_step_s (the plan's per-device order timed by the mean block durations measured inside
    the same steps (the loss counted in the last forward, the gradient reduction after each rank's
    last block), plus a measured point-to-point transfer on every dependency between devices, s)
    and its error, the machine's contention (gpuplan.runtime.contention.report), "report" (the
    tables `gpuplan run` prints: the plan's makespan and each block's duration next to the
    measured ones), "warnings" (each figure more than 15 % off), the loss, and max_grad_diff
    against a one-process run when check_grads is set. The
    default model (hidden 256, sequence 128, micro-batch 4, one layer per stage) keeps each block well
    above the runtime's per-action overhead on CPU. Refuses placements whose blocks span devices.
    """
    if command:
        raise InputError("tessel plans run their own model; `gpuplan run PLAN -- COMMAND` takes no command")
    if not plan.ok:
        raise InputError(f"the plan is {plan.status.value}: {plan.message}")
    reason = acts.executable_reason(problem)
    if reason:
        raise InputError(f"this tessel plan cannot run: {reason}")
    from gpuplan.runtime.launch import run_workers
    from gpuplan.runtime.torch_pipelining import check_version

    check_version()
    ranks = acts.stage_ranks(problem)
    n_stages = len(ranks)
    compute = acts.compute_only(problem, plan)
    lists = acts.with_comms(compute, ranks, problem.microbatches) if format == "compute_comms" else compute
    acts.check_actions(lists, ranks, problem.microbatches)
    split = any(b.kind == "backward_weight" for b in problem.blocks)
    cfg = _config(n_stages, layers_per_stage, hidden, vocab)
    spec = {"cfg": cfg, "num_stages": n_stages, "per_stage": layers_per_stage, "seed": seed, "ranks": ranks,
            "actions": lists, "format": format, "microbatches": problem.microbatches, "mbs": microbatch_size,
            "seq": seq, "steps": steps, "split": split, "grads": check_grads}
    before = contention.quiet_window()
    with contention.ContentionMonitor() as monitor:
        results = run_workers(_worker, problem.devices, args=(spec,), threads=threads, timeout_s=timeout_s)
    step_s = [max(r["step_s"][i] for r in results) for i in range(steps)]
    measured = statistics.median(step_s)
    durations: dict[str, float] = {}
    stage_times = {s: t for r in results for s, t in r["durations"].items()}
    for b in problem.blocks:
        # the first stage's input gradient has nothing to compute; torch may skip the call.
        # The loss is computed right after the last stage's forward: it belongs to that block.
        times = stage_times[b.stage]  # type: ignore[index]
        loss = times.get("L", 0.0) if b.kind == "forward" else 0.0
        durations[b.name] = times.get(acts.KIND_CODE[b.kind], 0.0) + loss
    comm = results[0]["comm_s"]
    timed = simulate(problem, orders_of(plan.schedule), durations, link_s=comm)
    # each rank reduces its stages' gradients after its last block
    retimed = max(max((e.end_s for e in dev), default=0.0) + sum(stage_times[s].get("R", 0.0)
                                                                 for s, r in ranks.items() if r == d)
                  for d, dev in enumerate(timed)) - min(e.start_s for dev in timed for e in dev)
    predicted = plan.makespan_s
    out: dict[str, Any] = {
        "world_size": problem.devices, "stages": n_stages, "microbatches": problem.microbatches,
        "format": format, "steps": steps, "measured_step_s": measured, "measured_steps_s": step_s,
        "predicted_step_s": predicted, "plan_makespan_s": predicted,
        "error_pct": 100.0 * abs(rel_error(predicted, measured)), "error": rel_error(predicted, measured),
        "retimed_step_s": retimed, "retimed_error_pct": 100.0 * abs(rel_error(retimed, measured)),
        "p2p_s": comm,
        "measured_over_predicted": measured / predicted if predicted else float("nan"),
        "loss": statistics.fmean(x for r in results for x in r["losses"]) if any(r["losses"] for r in results)
        else float("nan"),
        "block_durations_s": durations}
    out.update(contention.report(before, monitor.window, step_s))
    out["report"], out["warnings"] = _report(problem, out)
    if check_grads:
        import numpy as np

        ref = reference_grads(cfg, n_stages, layers_per_stage, problem.microbatches, microbatch_size, seq, seed)
        diff = 0.0
        for r in results:
            for s, gs in r["grads"].items():
                for g, want in zip(gs, ref[s]):
                    diff = max(diff, float(np.max(np.abs(g - want))) if g is not None else float("inf"))
        out["max_grad_diff"] = diff
    return out
