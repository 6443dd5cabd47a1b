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

from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gpuplan.models.base import Problem, Schema, Table, Violation
from gpuplan.models.plan import Plan, figure_violations, infeasible_contradictions, stated_figures_violations
from gpuplan.registry import ModelSpec, register_model
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
    final left-shift); `window_s` is where one full copy of the pattern runs in the schedule. A pattern
    of `group` > 1 micro-batches (such as interleaved 1F1B's groups of p) keys its blocks "b@j"
    (j < group): instance (b, u * group + j) starts at offset_s["b@j"] + (u + lag["b@j"]) * group *
    period_s, so period_s stays the time per micro-batch (1 / throughput) for every group size.
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
    return out + _check_figures(problem, plan, peaks)


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
    bound = plan.predicted.get("lower_bound_s")
    if bound is not None:
        floor = lower_bound_s(problem)
        if not bound >= floor * (1 - 1e-6) - EPS or not bound <= span * 1.01 + EPS:
            out.append(Violation("figure", f"the plan states predicted.lower_bound_s = {bound:.6g} s; it must lie "
                                 f"between the model's bound {floor:.6g} s and the plan's makespan {span:.6g} s",
                                 {"field": "predicted.lower_bound_s", "stated": bound, "recomputed": floor}))
    return out


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
