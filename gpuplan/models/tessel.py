"""Tessel: schedule search for a given operator placement (HPCA'24), as a formal model.

A *placement* is the plan of one micro-batch: blocks (forward, backward-input, backward-weight of
a stage, or an inference step) with a duration, the devices each occupies (several for a
tensor-parallel block), the memory each adds (+) or frees (-) on each of its devices, and the
dependencies between blocks of the same micro-batch. Every one of the N micro-batches runs the
same blocks. A *schedule* gives each device an ordered list of (block, micro-batch, start, end).

Memory follows Tessel's reservoir model: a block's memory delta counts from its start, so the
memory of a device at any moment is the sum of the deltas of the block instances started on it.
This module holds the schema, the standard placement shapes, the event simulator that times a
per-device order (the cost model), and `check`, written from the constraints alone.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gpuplan.models.base import Problem, Schema, Table, Violation
from gpuplan.models.plan import Plan, figure_violations, infeasible_contradictions, stated_figures_violations
from gpuplan.registry import ModelSpec, register_model, solvers as registry_solvers
from gpuplan.units import Bytes, Seconds
from gpuplan.viz import PALETTE

BlockKind = Literal["forward", "backward", "backward_input", "backward_weight", "other"]
EPS = 1e-9


class Block(Schema):
    """One block of a micro-batch: duration (s), devices it occupies, memory delta per device (bytes)."""

    name: str = Field(min_length=1)
    kind: BlockKind = "other"
    devices: list[int] = Field(min_length=1)
    duration_s: Seconds = Field(gt=0)
    memory_bytes: Bytes = 0.0
    after: list[str] = Field(default_factory=list)
    stage: int | None = Field(default=None, ge=0,
                              description="pipeline stage (model chunk) the block computes; needed to run it")


class Shape(Schema):
    """A standard placement to generate: its name, device count and per-block durations (s)."""

    name: Literal["1f1b", "vshape", "interleaved", "chimera", "tp_pp"]
    devices: int = Field(ge=1, le=64)
    chunks: int = Field(default=2, ge=1, le=8, description="model chunks per device (interleaved)")
    forward_s: float = Field(default=1.0, gt=0)
    backward_s: float = Field(default=2.0, gt=0, description="backward time (input + weight when not split)")
    backward_weight_s: float = Field(default=0.0, ge=0,
                                     description="> 0 splits backward into B (input) and W (weight)")
    tp_s: float = Field(default=1.0, gt=0, description="tp_pp: forward time of each all-device block")
    activation_bytes: Bytes = Field(default=1.0, gt=0, description="memory a forward block keeps (bytes)")
    inference: bool = False


class TesselProblem(Problem):
    """Blocks of one micro-batch, the number of micro-batches, and per-device memory limits (bytes)."""

    kind: Literal["tessel"] = "tessel"
    devices: int = Field(ge=1, le=256)
    microbatches: int = Field(default=8, ge=1, le=4096)
    blocks: list[Block] = Field(default_factory=list)
    shape: Shape | None = None
    memory_limit_bytes: Bytes | list[Bytes] | None = None
    mode: Literal["training", "inference"] = "training"

    @model_validator(mode="before")
    @classmethod
    def _expand_shape(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("shape") is not None and not data.get("blocks"):
            shape = Shape.model_validate(data["shape"])
            data = {**data, "blocks": [b.model_dump() for b in shape_blocks(shape)]}
            data.setdefault("devices", shape.devices)
            if shape.inference:
                data.setdefault("mode", "inference")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "TesselProblem":
        if not self.blocks:
            raise ValueError(f"at blocks: at least one block (or a `shape` to generate them)")
        names = [b.name for b in self.blocks]
        for i, b in enumerate(self.blocks):
            if names.count(b.name) > 1:
                raise ValueError(f"at blocks[{i}].name: a unique name, {b.name!r} repeats")
            for d in b.devices:
                if not 0 <= d < self.devices:
                    raise ValueError(f"at blocks[{i}].devices: device ids in 0..{self.devices - 1}, got {d}")
            if len(set(b.devices)) != len(b.devices):
                raise ValueError(f"at blocks[{i}].devices: distinct devices, got {b.devices}")
            for a in b.after:
                if a not in names:
                    raise ValueError(f"at blocks[{i}].after: names of blocks, {a!r} is none")
        if topological_order(self.blocks) is None:
            raise ValueError(f"at blocks: dependencies without a cycle (the `after` lists form one)")
        net: dict[int, float] = defaultdict(float)
        for b in self.blocks:
            for d in b.devices:
                net[d] += b.memory_bytes
        for d, v in sorted(net.items()):
            if abs(v) > 1e-6 * max(1.0, max(abs(b.memory_bytes) for b in self.blocks)):
                raise ValueError(f"at blocks: the memory deltas of one micro-batch to sum to 0 on "
                                 f"each device (what a micro-batch adds it frees), device {d} nets {v:g} bytes")
        lim = self.memory_limit_bytes
        if lim is not None and min(lim if isinstance(lim, list) else [lim]) < 0:
            raise ValueError(f"at memory_limit_bytes: a limit >= 0 bytes, got {lim}")
        if isinstance(lim, list) and len(lim) != self.devices:
            raise ValueError(f"at memory_limit_bytes: one limit per device ({self.devices}), got {len(lim)}")
        return self

    def limit(self, device: int) -> float:
        """Return the memory limit of `device` in bytes (infinity when none is set)."""
        lim = self.memory_limit_bytes
        if lim is None:
            return float("inf")
        return float(lim[device] if isinstance(lim, list) else lim)

    def block(self, name: str) -> Block:
        """Return the block called `name`."""
        return next(b for b in self.blocks if b.name == name)

    def busy_s(self) -> list[float]:
        """Return each device's busy time for one micro-batch (s): the period's lower bound."""
        out = [0.0] * self.devices
        for b in self.blocks:
            for d in b.devices:
                out[d] += b.duration_s
        return out

    def single_device(self) -> bool:
        """Return True when every block occupies exactly one device (a runnable pipeline placement)."""
        return all(len(b.devices) == 1 for b in self.blocks)


def topological_order(blocks: list[Block]) -> list[str] | None:
    """Return the block names in a dependency order, or None when `after` has a cycle."""
    preds = {b.name: set(b.after) for b in blocks}
    out: list[str] = []
    ready = [b.name for b in blocks if not preds[b.name]]
    while ready:
        n = ready.pop(0)
        out.append(n)
        for b in blocks:
            if n in preds[b.name]:
                preds[b.name].discard(n)
                if not preds[b.name] and b.name not in out and b.name not in ready:
                    ready.append(b.name)
    return out if len(out) == len(blocks) else None


# ---------------------------------------------------------------- standard placements


def _pipeline(devices_of_stage: list[int], s: Shape, prefix: str = "", first_after: list[str] | None = None,
              stage_offset: int = 0) -> list[Block]:
    """Blocks of a chain of stages: F0..F(S-1), then B(S-1)..B0 (+ W per stage when split)."""
    out: list[Block] = []
    n = len(devices_of_stage)
    split = s.backward_weight_s > 0 and not s.inference
    a = s.activation_bytes
    prev = list(first_after or [])
    for i, d in enumerate(devices_of_stage):
        out.append(Block(name=f"{prefix}F{i}", kind="forward", devices=[d], duration_s=s.forward_s,
                         memory_bytes=0.0 if s.inference else a, after=prev, stage=stage_offset + i))
        prev = [f"{prefix}F{i}"]
    if s.inference:
        return out
    for i in reversed(range(n)):
        d = devices_of_stage[i]
        if split:
            out.append(Block(name=f"{prefix}B{i}", kind="backward_input", devices=[d], duration_s=s.backward_s,
                             memory_bytes=-a / 2, after=prev, stage=stage_offset + i))
            out.append(Block(name=f"{prefix}W{i}", kind="backward_weight", devices=[d],
                             duration_s=s.backward_weight_s, memory_bytes=-a / 2, after=[f"{prefix}B{i}"],
                             stage=stage_offset + i))
        else:
            out.append(Block(name=f"{prefix}B{i}", kind="backward", devices=[d], duration_s=s.backward_s,
                             memory_bytes=-a, after=prev, stage=stage_offset + i))
        prev = [f"{prefix}B{i}"]
    return out


def shape_blocks(s: Shape) -> list[Block]:
    """Return the blocks of one micro-batch for a standard placement shape.

    1f1b: stage i on device i. vshape: 2p stages, stage i on device i then back (ZB-V's V).
    interleaved: p*chunks stages, stage i on device i mod p (Megatron). chimera: two opposite
    chains (down 0..p-1 and up p-1..0), one micro-batch of each per unit (Tessel's X shape).
    tp_pp: an all-device (tensor-parallel) block before and after a 1F1B chain (Tessel's M shape).
    """
    p = s.devices
    if s.name == "1f1b":
        return _pipeline(list(range(p)), s)
    if s.name == "vshape":
        return _pipeline(list(range(p)) + list(reversed(range(p))), s)
    if s.name == "interleaved":
        return _pipeline([i % p for i in range(p * s.chunks)], s)
    if s.name == "chimera":
        return _pipeline(list(range(p)), s, "d") + _pipeline(list(reversed(range(p))), s, "u", stage_offset=p)
    # tp_pp: the M shape
    every = list(range(p))
    a = s.activation_bytes
    head_f = Block(name="Tin", kind="forward", devices=every, duration_s=s.tp_s,
                   memory_bytes=0.0 if s.inference else a)
    chain = _pipeline(list(range(p)), s, first_after=["Tin"], stage_offset=0)
    fwd = [b for b in chain if b.kind == "forward"]
    bwd = [b for b in chain if b.kind != "forward"]
    out_f = Block(name="Tout", kind="forward", devices=every, duration_s=s.tp_s,
                  memory_bytes=0.0 if s.inference else a, after=[fwd[-1].name])
    if s.inference:
        return [head_f] + fwd + [out_f]
    out_b = Block(name="TBout", kind="backward", devices=every, duration_s=2 * s.tp_s, memory_bytes=-a,
                  after=["Tout"])
    first_b = bwd[0].model_copy(update={"after": ["TBout"]})
    last_name = f"B{0}"
    in_b = Block(name="TBin", kind="backward", devices=every, duration_s=2 * s.tp_s, memory_bytes=-a,
                 after=[last_name])
    return [head_f] + fwd + [out_f, out_b, first_b] + bwd[1:] + [in_b]


# ---------------------------------------------------------------- schedules and plans


class Entry(Schema):
    """One block instance in a device's order: block name, micro-batch, start and end (s)."""

    block: str
    microbatch: int = Field(ge=0)
    start_s: float
    end_s: float


class Repetend(Schema):
    """The repeated pattern: period (s), per-block start within the period (s) and micro-batch lag.

    Instance (b, i) of the steady state starts at offset_s[b] + (i + lag[b]) * period_s (before the
    final left-shift). A pattern of `group` > 1 micro-batches (such as interleaved 1F1B's groups of p)
    keys its blocks "b@j" (j < group): instance (b, u * group + j) starts at offset_s["b@j"] + (u +
    lag["b@j"]) * group * period_s, so period_s stays the time per micro-batch (1 / throughput) for
    every group size. It is a cyclic schedule of the placement: offsets in [0, group * period_s),
    dependencies met, no overlap modulo the period, steady-state memory under the limits (see
    repetend_violations). `copies` is how many full copies of the pattern (every key once, each of a
    micro-batch that exists) the pattern unrolled over N micro-batches holds: N // group - (max lag -
    min lag). The schedule is built from the pattern (unrolled, or completed with it as priorities),
    so it need not repeat it exactly; `window_s` marks one period of its steady state for charts: from
    the start of the middle micro-batch's (N // 2) first block in topological order, group * period_s
    long (None when the schedule was not built from this pattern).
    """

    period_s: float
    offset_s: dict[str, float] = Field(default_factory=dict)
    lag: dict[str, int] = Field(default_factory=dict)
    window_s: tuple[float, float] | None = None
    copies: int = 0
    group: int = Field(default=1, ge=1, description="micro-batches per repeated unit")


class TesselPlan(Plan):
    """A schedule: per device the ordered block instances; makespan, bubble ratio, memory peaks."""

    kind: str = "tessel"
    schedule: list[list[Entry]] = Field(default_factory=list)
    schedule_name: str = ""
    makespan_s: float = 0.0
    bubble_ratio: float = 0.0
    peak_memory_bytes: list[float] = Field(default_factory=list)
    repetend: Repetend | None = None


Order = list[list[tuple[str, int]]]


class DeadlockError(ValueError):
    """A per-device order that cannot run: the devices wait on each other (message: who waits on what)."""


def simulate(problem: TesselProblem, orders: Order, durations: dict[str, float] | None = None,
             link_s: float = 0.0) -> list[list[Entry]]:
    """Time a per-device order as soon as possible; return each device's timed entries (s).

    A block instance starts when its device(s) finished the previous entry in their order and its
    dependencies of the same micro-batch ended. A block on several devices must appear in each
    device's order. `durations` overrides block durations (s), e.g. measured ones; `link_s` delays a
    dependency between blocks on different devices (a point-to-point transfer, s). Raises
    DeadlockError when the orders wait on each other.
    """
    dur = {b.name: (durations or {}).get(b.name, b.duration_s) for b in problem.blocks}
    deps = {b.name: b.after for b in problem.blocks}
    devs = {b.name: b.devices for b in problem.blocks}
    pos = [0] * problem.devices
    free = [0.0] * problem.devices
    end: dict[tuple[str, int], float] = {}
    out: list[list[Entry]] = [[] for _ in range(problem.devices)]
    total = sum(len(o) for o in orders)
    placed = 0
    while placed < total:
        progressed = False
        for d in range(problem.devices):
            while pos[d] < len(orders[d]):
                b, i = orders[d][pos[d]]
                if (b, i) in end:  # already placed from another device of a multi-device block
                    pos[d] += 1
                    continue
                if any((a, i) not in end for a in deps[b]):
                    break
                if any(pos[e] >= len(orders[e]) or orders[e][pos[e]] != (b, i) for e in devs[b]):
                    break
                start = max([free[e] for e in devs[b]] + [end[(a, i)] + (link_s if devs[a] != devs[b] else 0.0)
                                                          for a in deps[b]])
                end[(b, i)] = start + dur[b]
                for e in devs[b]:
                    free[e] = start + dur[b]
                    out[e].append(Entry(block=b, microbatch=i, start_s=start, end_s=start + dur[b]))
                    pos[e] += 1
                placed += len(devs[b])
                progressed = True
        if not progressed:
            stuck = [f"device {d} waits at {orders[d][pos[d]][0]}#{orders[d][pos[d]][1]}"
                     for d in range(problem.devices) if pos[d] < len(orders[d])]
            raise DeadlockError("the per-device orders deadlock: " + "; ".join(stuck))
    return out


def lower_bound_s(problem: TesselProblem) -> float:
    """Return a makespan lower bound (s): for each device, the earliest its first block can start, plus
    N times its busy time, plus the shortest path that must follow its last block; the largest."""
    order = topological_order(problem.blocks) or []
    blocks = {b.name: b for b in problem.blocks}
    head: dict[str, float] = {}
    for n in order:
        head[n] = max((head[a] + blocks[a].duration_s for a in blocks[n].after), default=0.0)
    tail: dict[str, float] = {}
    for n in reversed(order):
        nxt = [b for b in problem.blocks if n in b.after]
        tail[n] = max((b.duration_s + tail[b.name] for b in nxt), default=0.0)
    busy = problem.busy_s()
    best = 0.0
    for d in range(problem.devices):
        mine = [b.name for b in problem.blocks if d in b.devices]
        if mine:
            best = max(best, min(head[n] for n in mine) + problem.microbatches * busy[d] + min(tail[n] for n in mine))
    return best


def makespan_s(schedule: list[list[Entry]]) -> float:
    """Return the schedule's makespan (s): last end minus first start."""
    entries = [e for dev in schedule for e in dev]
    return max(e.end_s for e in entries) - min(e.start_s for e in entries) if entries else 0.0


def bubble_ratio(problem: TesselProblem, schedule: list[list[Entry]]) -> float:
    """Return the idle fraction of all devices over the makespan (0 = no bubble)."""
    span = makespan_s(schedule)
    busy = sum(problem.busy_s()) * problem.microbatches
    return 1.0 - busy / (problem.devices * span) if span > 0 else 0.0


def memory_peaks(problem: TesselProblem, schedule: list[list[Entry]]) -> list[float]:
    """Return each device's peak memory (bytes) under the reservoir model (deltas count at start)."""
    mem = {b.name: b.memory_bytes for b in problem.blocks}
    peaks = []
    for dev in schedule:
        level, peak = 0.0, 0.0
        for e in sorted(dev, key=lambda e: (e.start_s, e.end_s)):
            level += mem.get(e.block, 0.0)
            peak = max(peak, level)
        peaks.append(peak)
    return peaks


def make_plan(problem: TesselProblem, schedule: list[list[Entry]], name: str, status: Any,
              repetend: Repetend | None = None, message: str = "") -> TesselPlan:
    """Return a TesselPlan for a timed schedule with its makespan, bubble ratio and memory peaks."""
    span = makespan_s(schedule)
    peaks = memory_peaks(problem, schedule)
    predicted = {"makespan_s": span, "bubble_ratio": bubble_ratio(problem, schedule),
                 "peak_memory_bytes": max(peaks, default=0.0), "lower_bound_s": lower_bound_s(problem)}
    if problem.mode == "inference":
        predicted["batch_latency_s"] = span
    if repetend is not None:
        predicted["period_s"] = repetend.period_s
        predicted["stream_throughput_mb_per_s"] = 1.0 / repetend.period_s
    return TesselPlan(status=status, objective=span, objective_name="makespan_s", predicted=predicted,
                      schedule=schedule, schedule_name=name, makespan_s=span,
                      bubble_ratio=predicted["bubble_ratio"], peak_memory_bytes=peaks,
                      repetend=repetend, message=message)


def orders_of(schedule: list[list[Entry]]) -> Order:
    """Return the per-device (block, micro-batch) order of a timed schedule."""
    return [[(e.block, e.microbatch) for e in sorted(dev, key=lambda e: (e.start_s, e.end_s))] for dev in schedule]


# ---------------------------------------------------------------- check


def check(problem: TesselProblem, plan: TesselPlan) -> list[Violation]:
    """Return the violations of a schedule: coverage, devices, dependencies, overlap, memory, and every
    figure the plan states (makespan, bubble ratio, peak memory per device, predicted metrics,
    objective), recomputed from the problem and the entries. An infeasible plan must hold nothing."""
    if not plan.ok:
        return infeasible_contradictions(plan)
    out: list[Violation] = []
    if len(plan.schedule) != problem.devices:
        return [Violation("devices", f"the schedule has {len(plan.schedule)} device lists, "
                          f"the problem {problem.devices} devices")]
    blocks = {b.name: b for b in problem.blocks}
    seen: dict[tuple[str, int], tuple[float, float]] = {}
    where: dict[tuple[str, int], set[int]] = defaultdict(set)
    for d, dev in enumerate(plan.schedule):
        for e in dev:
            b = blocks.get(e.block)
            key = (e.block, e.microbatch)
            if b is None or e.microbatch >= problem.microbatches:
                out.append(Violation("unknown", f"device {d} runs {e.block}#{e.microbatch}, not in the problem"))
                continue
            if d not in b.devices:
                out.append(Violation("device", f"{e.block}#{e.microbatch} runs on device {d}; "
                                     f"it belongs on {b.devices}"))
            if abs(e.end_s - e.start_s - b.duration_s) > 1e-6 * max(1.0, b.duration_s):
                out.append(Violation("duration", f"{e.block}#{e.microbatch} lasts {e.end_s - e.start_s:g} s, "
                                     f"its duration is {b.duration_s:g} s"))
            if key in seen and (abs(seen[key][0] - e.start_s) > EPS or d in where[key]):
                out.append(Violation("twice", f"{e.block}#{e.microbatch} is scheduled twice or at "
                                     f"different times on its devices ({seen[key][0]:g} s and {e.start_s:g} s)"))
            seen.setdefault(key, (e.start_s, e.end_s))
            where[key].add(d)
    for b in problem.blocks:
        for i in range(problem.microbatches):
            if (b.name, i) not in seen:
                out.append(Violation("missing", f"{b.name}#{i} is not scheduled"))
            elif where[(b.name, i)] != set(b.devices):
                out.append(Violation("device", f"{b.name}#{i} runs on devices {sorted(where[(b.name, i)])}, "
                                     f"it occupies {b.devices}"))
            else:
                for a in b.after:
                    if (a, i) in seen and seen[(a, i)][1] > seen[(b.name, i)][0] + EPS:
                        out.append(Violation("dependency", f"{b.name}#{i} starts at {seen[(b.name, i)][0]:g} s "
                                             f"before {a}#{i} ends at {seen[(a, i)][1]:g} s",
                                             {"block": b.name, "microbatch": i}))
    peaks = memory_peaks(problem, plan.schedule)
    for d, dev in enumerate(plan.schedule):
        ordered = sorted(dev, key=lambda e: (e.start_s, e.end_s))
        for x, y in zip(ordered, ordered[1:]):
            if y.start_s < x.end_s - EPS:
                out.append(Violation("overlap", f"device {d}: {y.block}#{y.microbatch} starts at {y.start_s:g} s "
                                     f"while {x.block}#{x.microbatch} runs until {x.end_s:g} s", {"device": d}))
        peak = peaks[d]
        if peak > problem.limit(d) * (1 + 1e-9) + EPS:
            out.append(Violation("memory", f"device {d} peaks at {peak:g} bytes, its limit is "
                                 f"{problem.limit(d):g} bytes", {"device": d, "peak": peak}))
    if any(plan.schedule):
        span = makespan_s(plan.schedule)
        if abs(span - plan.makespan_s) > 1e-6 * max(1.0, span):
            out.append(Violation("makespan", f"the plan states a makespan of {plan.makespan_s:g} s, "
                                 f"its entries span {span:g} s"))
    return (out + _check_figures(problem, plan, peaks) + repetend_violations(problem, plan)
            + _stats_violations(problem, plan) + _schedule_name_violations(plan))


def _check_figures(problem: TesselProblem, plan: TesselPlan, peaks: list[float]) -> list[Violation]:
    """Return violations of the figures the plan states besides its makespan field: bubble ratio, peak
    memory per device (bytes), the objective and predicted makespan (s), bubble ratio, peak memory,
    batch latency (s), period (s) and stream throughput (micro-batches/s), and a lower bound (s) that
    is at least the model's and at most the plan's own makespan (1% slack for CP-SAT's tick rounding)."""
    span = makespan_s(plan.schedule)
    out = figure_violations("bubble_ratio", plan.bubble_ratio, bubble_ratio(problem, plan.schedule))
    out += figure_violations("peak_memory_bytes", plan.peak_memory_bytes, peaks)
    predicted = {"makespan_s": span, "bubble_ratio": bubble_ratio(problem, plan.schedule),
                 "peak_memory_bytes": max(peaks, default=0.0), "batch_latency_s": span}
    if plan.repetend is not None and plan.repetend.period_s > 0:
        predicted["period_s"] = plan.repetend.period_s
        predicted["stream_throughput_mb_per_s"] = 1.0 / plan.repetend.period_s
    elif {"period_s", "stream_throughput_mb_per_s"} & set(plan.predicted):
        out.append(Violation("figure", "the plan states a period but holds no repetend (or a period <= 0)",
                             {"field": "predicted.period_s"}))
    out += stated_figures_violations(plan, span if plan.objective is not None or plan.solver else None, predicted)
    if plan.predicted.get("search_s", 0.0) < 0:
        out.append(Violation("figure", f"the plan states a negative search time "
                             f"({plan.predicted['search_s']:g} s)", {"field": "predicted.search_s"}))
    stats = plan.solver.stats if plan.solver else {}
    floor = lower_bound_s(problem)
    proven = plan.predicted.get("proven_bound_s")  # exact's: the bound CP-SAT proved, or the model's
    if proven is not None and not (_number(proven)
                                   and floor * (1 - 1e-6) - EPS <= proven <= span * (1 + TICK_SLACK) + EPS):
        out.append(Violation("figure", f"the plan states predicted.proven_bound_s = {proven!r} s; a makespan bound "
                             f"lies between the model's bound {floor:.6g} s and the plan's makespan {span:.6g} s",
                             {"field": "predicted.proven_bound_s", "stated": proven, "recomputed": floor}))
    # the stated lower bound is the proven one where a solver proved one, else the model's
    expected = proven if _number(proven) else floor
    for field, bound in (("predicted.lower_bound_s", plan.predicted.get("lower_bound_s")),
                         ("solver.stats.bound_s", stats.get("bound_s") if _number(proven) else None)):
        if bound is not None:
            out += figure_violations(field, bound, expected)
    return out


# ---------------------------------------------------------------- the repetend and the solver's figures

TICK_SLACK = 0.01  # relative slack for what a solver computed on an integer time grid (CP-SAT ticks)


def _number(x: Any) -> bool:
    """Return True when `x` is an int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def repetend_keys(problem: TesselProblem, group: int) -> dict[str, tuple[str, int]]:
    """Return the repetend's keys of a group size, each mapped to (block name, position j < group): the
    block names when group is 1, else "b@j"."""
    return {(b.name if group == 1 else f"{b.name}@{j}"): (b.name, j)
            for j in range(group) for b in problem.blocks}


def _readable(problem: TesselProblem, rep: Repetend) -> bool:
    """Return True when a repetend can be unrolled: a period > 0 and an offset and a lag for each of its keys."""
    keys = set(repetend_keys(problem, rep.group))
    return rep.period_s > 0 and set(rep.offset_s) == keys and set(rep.lag) == keys


def repetend_violations(problem: TesselProblem, plan: TesselPlan) -> list[Violation]:
    """Return the violations of the plan's repetend ([] when it has none): its keys (one per block, or
    per block and position in a group), offsets within the period, the period at least the busiest
    device's work per micro-batch, the pattern a cyclic schedule of the placement (dependencies, no
    overlap modulo the period, steady-state memory under the limits; times with TICK_SLACK of the
    period for a solver's rounding), `copies` recomputed, and `window_s` recomputed from the schedule."""
    rep = plan.repetend
    if rep is None:
        return []
    if not rep.period_s > 0:
        return [Violation("repetend", f"the repetend's period_s is {rep.period_s:g} s; a period is > 0",
                          {"field": "repetend.period_s"})]
    keys = repetend_keys(problem, rep.group)
    for field, got in (("offset_s", rep.offset_s), ("lag", rep.lag)):
        if set(got) != set(keys):
            return [Violation("repetend", f"the repetend (group {rep.group}) states {field} for {sorted(got)}; "
                              f"the placement's keys are {sorted(keys)}", {"field": f"repetend.{field}"})]
    span = rep.group * rep.period_s  # one period of the pattern
    slack = TICK_SLACK * span
    out: list[Violation] = []
    busy = max(problem.busy_s())
    if rep.period_s < busy * (1 - TICK_SLACK):
        out.append(Violation("figure", f"the plan states repetend.period_s = {rep.period_s:.6g} s; the busiest "
                             f"device works {busy:.6g} s per micro-batch, a period is at least that",
                             {"field": "repetend.period_s", "stated": rep.period_s, "recomputed": busy}))
    for k, o in rep.offset_s.items():
        if not -EPS <= o < span * (1 - 1e-9):
            out.append(Violation("repetend", f"repetend.offset_s.{k} = {o:g} s lies outside the period "
                                 f"[0, {span:g}) s", {"field": f"repetend.offset_s.{k}"}))
    dur = {b.name: b.duration_s for b in problem.blocks}
    at = {k: rep.offset_s[k] + rep.lag[k] * span for k in keys}  # start of the pattern's instance, lags unrolled
    for k, (name, j) in keys.items():
        for a in problem.block(name).after:
            ka = a if rep.group == 1 else f"{a}@{j}"
            if at[k] < at[ka] + dur[a] - slack:
                out.append(Violation("repetend", f"repetend: {k} starts at {at[k]:g} s (offset + lag x period) "
                                     f"before {ka} ends at {at[ka] + dur[a]:g} s",
                                     {"field": f"repetend.offset_s.{k}"}))
    for d in range(problem.devices):
        mine = sorted((rep.offset_s[k], k) for k, (name, _) in keys.items() if d in problem.block(name).devices)
        following = mine[1:] + [(mine[0][0] + span, mine[0][1])] if mine else []  # the first again, a period on
        for (s1, k1), (s2, k2) in zip(mine, following):
            if s1 + dur[keys[k1][0]] > s2 + slack:
                out.append(Violation("repetend", f"repetend: on device {d}, {k2} starts at offset {s2:g} s while "
                                     f"{k1} runs until {s1 + dur[keys[k1][0]]:g} s (modulo the period {span:g} s)",
                                     {"device": d, "field": "repetend.offset_s"}))
        out += _repetend_memory(problem, rep, keys, d, mine)
    out += figure_violations("repetend.copies", rep.copies, _copies(problem, rep))
    if rep.window_s is not None:
        out += figure_violations("repetend.window_s", list(rep.window_s), _window(problem, plan.schedule, span) or [])
    return out


def _repetend_memory(problem: TesselProblem, rep: Repetend, keys: dict[str, tuple[str, int]], device: int,
                     mine: list[tuple[float, str]]) -> list[Violation]:
    """Return a `repetend` violation when the pattern's steady-state memory on `device` exceeds its limit:
    at phase tau it holds sum_k delta_k ([offset_k <= tau] - lag_k), checked at every allocating start."""
    if math.isinf(problem.limit(device)):
        return []
    mem = {k: problem.block(keys[k][0]).memory_bytes for _, k in mine}
    for s, k in mine:
        if mem[k] <= 0:
            continue
        level = sum(mem[x] * ((1 if o <= s else 0) - rep.lag[x]) for o, x in mine)
        if level > problem.limit(device) * (1 + 1e-9) + EPS:
            return [Violation("repetend", f"repetend: device {device} holds {level:g} bytes in the steady state "
                              f"when {k} starts; its limit is {problem.limit(device):g} bytes",
                              {"device": device, "field": "repetend.lag"})]
    return []


def _copies(problem: TesselProblem, rep: Repetend) -> int:
    """Return how many full copies of the pattern its unrolling over N micro-batches holds."""
    spread = max(rep.lag.values()) - min(rep.lag.values()) if rep.lag else 0
    return max(0, problem.microbatches // rep.group - spread)


def _window(problem: TesselProblem, schedule: list[list[Entry]], span: float) -> list[float] | None:
    """Return the repetend's window (s): from the start of the middle micro-batch's first block (in
    topological order), `span` long; None when that instance is not in the schedule."""
    first = (topological_order(problem.blocks) or [problem.blocks[0].name])[0]
    mid = problem.microbatches // 2
    at = [e.start_s for dev in schedule for e in dev if e.block == first and e.microbatch == mid]
    return [at[0], at[0] + span] if at else None


def unrolled_schedule(problem: TesselProblem, rep: Repetend) -> list[list[Entry]]:
    """Return the repetend unrolled over the N micro-batches (each device runs its instances in the order
    of their pattern start times) and left-shifted, timed by `simulate` (s); raises DeadlockError."""
    span = rep.group * rep.period_s
    times: list[list[tuple[float, str, int]]] = [[] for _ in range(problem.devices)]
    for b in problem.blocks:
        for i in range(problem.microbatches):
            k = b.name if rep.group == 1 else f"{b.name}@{i % rep.group}"
            for d in b.devices:
                times[d].append((rep.offset_s[k] + (i // rep.group + rep.lag[k]) * span, b.name, i))
    return simulate(problem, [[(n, i) for _, n, i in sorted(dev)] for dev in times])


def _stats_violations(problem: TesselProblem, plan: TesselPlan) -> list[Violation]:
    """Return violations of what Tessel's solver.stats claim about the problem and the plan: the period's
    busy bound (ticks on the grid tick_s, recomputed) and memory bound (at most the period found), the
    period and group against the repetend, micro-batches in flight, and makespans of schedules the solver
    built and dropped (baselines, grouped repetend, completion candidates: none below the model's lower
    bound nor, where it kept the best of them, below the plan's makespan; see _makespans_violations).
    Other stats are diagnostics."""
    stats = plan.solver.stats if plan.solver else {}
    rep = plan.repetend
    out: list[Violation] = []
    tick, found = stats.get("tick_s"), None  # found: the period per micro-batch in ticks
    if _number(stats.get("period_ticks")) and _number(stats.get("group")) and stats["group"] >= 1:
        found = stats["period_ticks"] / stats["group"]
    if rep is not None:
        if "group" in stats:
            out += figure_violations("solver.stats.group", stats["group"], rep.group)
        if stats.get("period_ticks") is not None and _number(tick) and tick > 0:  # ticks read by tick_s
            out += figure_violations("solver.stats.period_ticks", stats["period_ticks"],
                                     rep.period_s * rep.group / tick)
        if "microbatches_in_flight" in stats:
            in_flight = (max(rep.lag.values()) - min(rep.lag.values()) + 1) * rep.group if rep.lag else 0
            out += figure_violations("solver.stats.microbatches_in_flight", stats["microbatches_in_flight"],
                                     in_flight)
    if "period_lower_bound_ticks" in stats:
        if _number(tick) and tick > 0:  # durations on the grid: each the nearest multiple of tick_s, at least 1
            busy = max(sum(max(1, round(b.duration_s / tick)) for b in problem.blocks if d in b.devices)
                       for d in range(problem.devices))
            out += figure_violations("solver.stats.period_lower_bound_ticks", stats["period_lower_bound_ticks"],
                                     busy)
        else:
            out.append(Violation("figure", "the plan states solver.stats.period_lower_bound_ticks without a tick_s "
                                 "> 0 to read it by", {"field": "solver.stats.tick_s"}))
    for field in ("period_lower_bound_ticks", "period_memory_bound_ticks"):
        bound = stats.get(field)
        if bound is not None and (not _number(bound) or bound < 0
                                  or (found is not None and bound > found * (1 + 1e-9))):
            out.append(Violation("figure", f"the plan states solver.stats.{field} = {bound!r}; a lower bound on "
                                 f"the period must lie between 0 and the period found ({found} ticks per micro-batch)",
                                 {"field": f"solver.stats.{field}", "stated": bound}))
    return out + _makespans_violations(problem, plan, stats)


def _makespans_violations(problem: TesselProblem, plan: TesselPlan, stats: dict[str, Any]) -> list[Violation]:
    """Return violations of the makespans (s) Tessel's stats give for schedules it built: its floor (the
    best baseline), the grouped repetend's schedule and the completion candidates, the unrolled one
    recomputed by the simulator. None lies below the model's lower bound; none the plan kept the best of
    lies below the plan's makespan (the floor, the grouped schedule, candidates that fit the memory: all
    without a limit, the unrolled one when its schedule fits); a schedule built from the repetend
    (schedule_from "repetend", or the grouped one when the repetend is it) is no longer than the repetend
    unrolled, one of its candidates, and is exactly that when no completion or polish ran."""
    rep, span, floor = plan.repetend, plan.makespan_s, lower_bound_s(problem)
    candidates = stats.get("completion_candidates_s")
    candidates = candidates if isinstance(candidates, dict) else {}
    grouped = stats.get("grouped")
    grouped = grouped if isinstance(grouped, dict) else {}
    from_repetend = stats.get("schedule_from") == "repetend"
    is_grouped = rep is not None and rep.group > 1 and grouped.get("group") == rep.group  # the repetend is it
    out: list[Violation] = []
    unrolled = None  # the unrolled repetend's makespan (s), when its schedule fits the memory
    schedule: list[list[Entry]] = []  # the unrolled repetend's
    wanted = "unrolled" in candidates or from_repetend or (is_grouped and "makespan_s" in grouped)
    if rep is not None and _readable(problem, rep) and wanted:
        try:
            schedule = unrolled_schedule(problem, rep)
        except DeadlockError as exc:
            out.append(Violation("repetend", f"the repetend unrolled over the micro-batches cannot run: {exc}",
                                 {"field": "repetend"}))
        else:
            if "unrolled" in candidates:
                out += figure_violations("solver.stats.completion_candidates_s.unrolled", candidates["unrolled"],
                                         makespan_s(schedule))
            peaks = memory_peaks(problem, schedule)
            if all(p <= problem.limit(d) * (1 + 1e-9) + EPS for d, p in enumerate(peaks)):
                unrolled = makespan_s(schedule)
    polished = bool({"polish_status", "polish_error"} & set(stats))
    if from_repetend and not candidates and not polished and unrolled is not None:
        # built without completion or polish: the schedule is the repetend unrolled
        out += _unrolled_differences(plan.schedule, schedule)
    elif from_repetend and unrolled is not None and span > unrolled * (1 + 1e-6) + EPS:
        out.append(Violation("repetend", f"the schedule, built from the repetend (solver.stats.schedule_from), spans "
                             f"{span:.6g} s; the repetend unrolled spans {unrolled:.6g} s, and the shortest is kept",
                             {"field": "repetend", "stated": span, "recomputed": unrolled}))
    unlimited = all(math.isinf(problem.limit(d)) for d in range(problem.devices))
    made: list[tuple[str, Any, bool, bool]] = []  # (field, makespan, >= the plan's, <= the unrolled repetend's)
    baselines = stats.get("best_baseline")
    for name, value in (baselines.items() if isinstance(baselines, dict) else []):
        made.append((f"solver.stats.best_baseline.{name}", value, True, False))
        if stats.get("schedule_from") == name:  # the plan is that baseline's schedule
            out += figure_violations(f"solver.stats.best_baseline.{name}", value, span)
    if "makespan_s" in grouped:
        made.append(("solver.stats.grouped.makespan_s", grouped["makespan_s"], True, is_grouped))
    for key, value in candidates.items():
        made.append((f"solver.stats.completion_candidates_s.{key}", value,
                     unlimited or (key == "unrolled" and unrolled is not None), False))
    for field, value, above_plan, below_unrolled in made:
        if value is None or (isinstance(value, float) and math.isnan(value)):  # a candidate not built (JSON: null)
            continue
        if not _number(value) or not value >= floor * (1 - 1e-6) - EPS:
            out.append(Violation("figure", f"the plan states {field} = {value!r} s, a makespan below the model's "
                                 f"lower bound {floor:.6g} s", {"field": field, "stated": value, "recomputed": floor}))
        elif above_plan and value < span * (1 - 1e-6) - EPS:
            out.append(Violation("figure", f"the plan states {field} = {value:.6g} s, shorter than the plan's own "
                                 f"makespan {span:.6g} s: the solver keeps the shortest",
                                 {"field": field, "stated": value, "recomputed": span}))
        elif below_unrolled and unrolled is not None and value > unrolled * (1 + 1e-6) + EPS:
            out.append(Violation("figure", f"the plan states {field} = {value:.6g} s, longer than its repetend "
                                 f"unrolled ({unrolled:.6g} s), one of its candidates",
                                 {"field": field, "stated": value, "recomputed": unrolled}))
    return out


def _unrolled_differences(schedule: list[list[Entry]], unrolled: list[list[Entry]]) -> list[Violation]:
    """Return a `repetend` violation naming the first block instance whose start (s) differs between the
    plan's schedule and the unrolled repetend's ([] when they agree)."""
    ours = {(e.block, e.microbatch): e.start_s for dev in schedule for e in dev}
    for dev in unrolled:
        for e in dev:
            at = ours.get((e.block, e.microbatch))
            if at is None or abs(at - e.start_s) > 1e-9 * max(1.0, abs(e.start_s)):
                return [Violation("repetend", f"the schedule is the repetend unrolled (solver.stats: from the "
                                  f"repetend, no completion), but {e.block}#{e.microbatch} starts at {at} s, the "
                                  f"unrolled repetend at {e.start_s:g} s",
                                  {"field": "repetend", "block": e.block, "microbatch": e.microbatch})]
    return []


def _schedule_name_violations(plan: TesselPlan) -> list[Violation]:
    """Return a `schedule_name` violation when the name disagrees with the plan's solver: "tessel" for
    the paper's method and its variants, the solver's own name otherwise ([] without a solver)."""
    if plan.solver is None:
        return []
    roles = {s.name: s.role for s in registry_solvers("tessel")}
    if plan.solver.name not in roles:
        return []  # api.check reports an unknown solver
    expected = "tessel" if roles[plan.solver.name] in ("paper", "variant") else plan.solver.name
    if plan.schedule_name == expected:
        return []
    return [Violation("schedule_name", f"the plan names its schedule {plan.schedule_name!r}; solver "
                      f"{plan.solver.name!r} makes {expected!r} schedules", {"field": "schedule_name"})]


# ---------------------------------------------------------------- show


def summarize(problem: TesselProblem, plan: TesselPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare tessel` prints: makespan (s), bubble ratio, peak memory, period."""
    out: dict[str, Any] = {"makespan_s": plan.makespan_s, "bubble_ratio": round(plan.bubble_ratio, 4),
                           "peak_memory_bytes": max(plan.peak_memory_bytes, default=0.0)}
    if plan.repetend is not None:
        out["period_s"] = plan.repetend.period_s
    return out


def describe(problem: TesselProblem, plan: TesselPlan) -> list[Table]:
    """Return tables for `gpuplan show`: per-device figures, the repetend, and the first entries."""
    busy = problem.busy_s()
    rows = [[d, len(dev), busy[d] * problem.microbatches,
             (plan.peak_memory_bytes[d] if plan.peak_memory_bytes else 0.0) / 2**30, problem.limit(d) / 2**30,
             " ".join(f"{e.block}#{e.microbatch}" for e in dev[:8]) + (" ..." if len(dev) > 8 else "")]
            for d, dev in enumerate(plan.schedule)]
    tables = [Table(f"tessel schedule '{plan.schedule_name}': makespan {plan.makespan_s:g} s, "
                    f"bubble ratio {plan.bubble_ratio:.3f}",
                    ["device", "instances", "busy_s", "peak_memory_GiB", "limit_GiB", "order (first 8)"], rows)]
    if plan.repetend is not None:
        r = plan.repetend
        tables.append(Table(f"repetend: period {r.period_s:g} s, {r.copies} copies",
                            ["block", "offset_s", "lag"],
                            [[b, r.offset_s[b], r.lag.get(b, 0)] for b in r.offset_s]))
    return tables


KIND_COLOURS = {"forward": PALETTE["forward"], "backward": PALETTE["backward"], "backward_input": PALETTE["backward"],
                "backward_weight": PALETTE["weight"], "other": PALETTE["comm"]}


def draw(problem: TesselProblem, plan: TesselPlan, path: Path) -> None:
    """Write a Gantt chart PNG: one row per device, blocks coloured by kind, labelled by micro-batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from gpuplan.io import atomic_write_figure

    kinds = {b.name: b.kind for b in problem.blocks}
    fig, ax = plt.subplots(figsize=(max(8.0, min(16.0, plan.makespan_s / max(1e-9, min(
        b.duration_s for b in problem.blocks)) * 0.25)), 0.5 * problem.devices + 1.5))
    for d, dev in enumerate(plan.schedule):
        for e in dev:
            ax.barh(d, e.end_s - e.start_s, left=e.start_s, height=0.8, color=KIND_COLOURS[kinds[e.block]],
                    edgecolor="black", linewidth=0.4)
            ax.text((e.start_s + e.end_s) / 2, d, str(e.microbatch), ha="center", va="center", fontsize=6,
                    color="white")
    if plan.repetend is not None and plan.repetend.window_s is not None:
        a, b = plan.repetend.window_s
        ax.axvspan(a, b, color="gold", alpha=0.25, zorder=0)
    ax.set_yticks(range(problem.devices), [f"dev {d}" for d in range(problem.devices)])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{plan.schedule_name}: makespan {plan.makespan_s:g} s, bubble {plan.bubble_ratio:.1%}")
    used = sorted({kinds[e.block] for dev in plan.schedule for e in dev})
    handles = [Patch(color=KIND_COLOURS[k], label=k) for k in used]
    if plan.repetend is not None and plan.repetend.window_s is not None:
        handles.append(Patch(color="gold", alpha=0.25, label="repetend"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=120)


register_model(ModelSpec(kind="tessel", problem_type=TesselProblem, plan_type=TesselPlan, check=check,
                         summarize=summarize, describe=describe, draw=draw,
                         runner="gpuplan.runtime.tessel:run_plan",
                         title="Tessel: schedule search for a given operator placement"))
