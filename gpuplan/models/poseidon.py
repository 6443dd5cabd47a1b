"""Poseidon: a DAG training-time model for pipeline/tensor/data-parallel LLM training on heterogeneous
clusters, and the plan format its search returns.

A plan is an ordered list of pipeline stages. Each stage runs on a group of devices of ONE type,
split into `tp` tensor-parallel ranks times `dp` data-parallel replicas, holds a contiguous range
of transformer layers (the embedding sits in front of the first stage, the output head behind the
last), and processes `num_microbatches` micro-batches of `micro_batch_size` samples per replica.

The iteration time is the longest path of a DAG (networkx) whose nodes are every stage's forward
and backward of every micro-batch, the point-to-point sends between stages, and each stage's
data-parallel gradient all-reduce and optimizer step; edges are data dependencies plus each
device's execution order under the schedule (1F1B or GPipe). Tensor-parallel all-reduces are part
of each layer's forward/backward duration (Megatron: two per layer each way). All times are in
seconds, all sizes in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from gpuplan.models.base import Problem, Table, Violation
from gpuplan.models.cluster import Cluster
from gpuplan.models.plan import Plan, Status
from gpuplan.models.profile import LayerCost, LayerTable, Profile, bus_factor, cluster_document
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, model_config
from gpuplan.registry import ModelSpec, register_model

Schedule = Literal["1f1b", "gpipe"]


class PoseidonProblem(Problem):
    """Train `model` on `cluster` with `global_batch` sequences of `seq_len` tokens per iteration.

    Costs come from FLOPs / (device peak x `efficiency`) unless `layer_costs` (a profile's per-layer
    table) gives measured forward/backward seconds per device type. Memory per device = weights +
    gradients (`dtype`) + optimizer states (`optimizer_state_bytes_per_param`, 12 for Adam with fp32
    master weights) + in-flight activations, within `memory_fraction` of the device memory.
    """

    kind: Literal["poseidon"] = "poseidon"
    cluster: Cluster
    model: TransformerConfig
    global_batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    optimizer_state_bytes_per_param: float = Field(default=12.0, ge=0)
    efficiency: float = Field(default=0.5, gt=0, le=1)
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    max_tp: int = Field(default=8, ge=1)
    max_stages: int = Field(default=16, ge=1)
    max_microbatches: int = Field(default=128, ge=1)
    schedule: Schedule = "1f1b"
    layer_costs: LayerTable | None = None

    @model_validator(mode="before")
    @classmethod
    def _model_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            data = dict(data)
            try:
                data["model"] = model_config(data["model"]).model_dump()
            except ValueError as exc:
                raise ValueError(f"at model: {exc}") from None
        return data

    @model_validator(mode="after")
    def _costs_cover_types(self) -> "PoseidonProblem":
        if self.layer_costs is not None:
            have = {c.device_type for c in self.layer_costs.costs if c.part == "layer"}
            for t in self.cluster.capacity():
                if t not in have:
                    raise ValueError(f"at layer_costs.costs: layer costs for every device type of the cluster; "
                                     f"{t!r} has none (have {sorted(have)})")
        return self


class StagePlan(BaseModel):
    """One pipeline stage of a plan (all fields plain data, read by Tessel and Lagom).

    device_type: the type of every device of the stage; gpu_ids: global device ids (cluster order),
    grouped tp-major (ids[r*tp:(r+1)*tp] is data-parallel replica r); nodes: the nodes they sit on.
    Layers [first_layer, last_layer) are transformer blocks; the first stage also holds the
    embedding, the last the output head. forward_s / backward_s: predicted seconds for one
    micro-batch (backward includes the recomputed forward when `recompute`); p2p_s: seconds to send
    one micro-batch's activations to the next stage; allreduce_s: the data-parallel gradient
    all-reduce; optimizer_s: the optimizer step; memory_bytes: peak predicted memory per device.
    """

    index: int
    device_type: str
    nodes: list[str] = Field(default_factory=list)
    gpu_ids: list[int] = Field(default_factory=list)
    tp: int = 1
    dp: int = 1
    first_layer: int = 0
    last_layer: int = 0
    micro_batch_size: int = 1
    recompute: bool = False
    forward_s: float = 0.0
    backward_s: float = 0.0
    p2p_s: float = 0.0
    allreduce_s: float = 0.0
    optimizer_s: float = 0.0
    memory_bytes: float = 0.0

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks in the stage."""
        return self.last_layer - self.first_layer


class PoseidonPlan(Plan):
    """A Poseidon plan: `stages` in pipeline order, `num_microbatches` per iteration, the schedule.

    `iteration_time_s` is the DAG longest path (seconds per training iteration); predicted holds
    iteration_time_s, throughput_samples_per_s, tokens_per_s and bubble_fraction.
    """

    kind: str = "poseidon"
    stages: list[StagePlan] = Field(default_factory=list)
    num_microbatches: int = 1
    schedule: Schedule = "1f1b"
    iteration_time_s: float = 0.0


# ------------------------------------------------------------------------------------------------
# Per-layer costs
# ------------------------------------------------------------------------------------------------

def allreduce_s(size_bytes: float, ranks: int, bandwidth_GBps: float, latency_s: float) -> float:
    """Return the seconds of a ring all-reduce of `size_bytes` over `ranks` ranks (0 for one rank)."""
    if ranks <= 1:
        return 0.0
    return bus_factor("all_reduce", ranks) * size_bytes / (bandwidth_GBps * 1e9) + 2.0 * (ranks - 1) * latency_s


@dataclass(frozen=True)
class StageShape:
    """The devices of one stage before layers are mapped: type, tp x dp, device ids, nodes."""

    device_type: str
    tp: int
    dp: int
    gpu_ids: tuple[int, ...]
    nodes: tuple[str, ...]


class CostModel:
    """Per-layer times (seconds) and sizes (bytes) of a problem, cached by (type, tp, micro-batch).

    layer(type, tp, b) -> (forward_s, backward_s) of one transformer block incl. its TP all-reduces;
    extras(type, tp, b, first, last) -> the embedding/head (forward_s, backward_s) a stage adds.
    """

    def __init__(self, problem: PoseidonProblem) -> None:
        self.p = problem
        self.cfg = problem.model
        self.wbytes = DTYPE_BYTES[problem.dtype]
        self.state_bytes_per_param = 2 * self.wbytes + problem.optimizer_state_bytes_per_param
        self._layer: dict[tuple[str, int, int], tuple[float, float]] = {}
        self._dev: dict[str, Any] = {}
        self._link: dict[tuple[str, str], Any] = {}
        self._dp_link: dict[StageShape, tuple[float, float]] = {}
        self._table: dict[tuple[str, str], list[LayerCost]] = {}
        self._scale = {"layer": 1.0, "embedding": 1.0, "head": 1.0}
        if problem.layer_costs is not None:
            for c in problem.layer_costs.costs:
                self._table.setdefault((c.device_type, c.part), []).append(c)
            # a table measured on another (e.g. scaled-down) configuration: scale by the FLOP ratio
            try:
                measured = TransformerConfig.model_validate(problem.layer_costs.config)
            except ValueError:
                measured = self.cfg
            if measured.model_dump(exclude={"name"}) != self.cfg.model_dump(exclude={"name"}):
                self._scale = {"layer": self.cfg.layer_forward_flops(1, 1024) / measured.layer_forward_flops(1, 1024),
                               "embedding": self.cfg.hidden / measured.hidden,
                               "head": self.cfg.head_forward_flops(1, 1) / measured.head_forward_flops(1, 1)}

    # --- measured table lookup: exact (b, tp) when profiled, else scaled linearly from the nearest
    # (and by the FLOP ratio when the table was measured on another configuration of the model)
    def _measured(self, dtype: str, part: str, tp: int, b: int) -> tuple[float, float] | None:
        rows = self._table.get((dtype, part))
        if not rows:
            return None
        rows = [r for r in rows if r.seq_len == self.p.seq_len] or rows
        best = min(rows, key=lambda r: (r.tp != tp, abs(math.log(r.micro_batch / b)), r.tp))
        scale = (b / best.micro_batch) * (best.tp / tp) * (self.p.seq_len / best.seq_len) * self._scale[part]
        return best.forward_s * scale, best.backward_s * scale

    def _tp_comm(self, dtype: str, tp: int, b: int, nodes_link: tuple[float, float]) -> float:
        """Seconds of the two Megatron TP all-reduces of one layer in one direction."""
        size = b * self.p.seq_len * self.cfg.hidden * self.wbytes
        return 2.0 * allreduce_s(size, tp, *nodes_link)

    def dev(self, dtype: str) -> Any:
        """Return the DeviceType called `dtype` (cached)."""
        if dtype not in self._dev:
            self._dev[dtype] = self.p.cluster.type_of(dtype)
        return self._dev[dtype]

    def link(self, a: str, b: str) -> Any:
        """Return the cluster's Link between nodes a and b (cached)."""
        if (a, b) not in self._link:
            self._link[(a, b)] = self.p.cluster.link(a, b)
        return self._link[(a, b)]

    def dp_link(self, shape: StageShape) -> tuple[float, float]:
        """Return (GB/s, latency s) of the slowest link a data-parallel group of the stage crosses."""
        if shape not in self._dp_link:
            pairs = [(a, b) for a in shape.nodes for b in shape.nodes if a != b] or [(shape.nodes[0],) * 2]
            link = min((self.link(a, b) for a, b in pairs), key=lambda l: l.bandwidth_GBps)
            self._dp_link[shape] = (link.bandwidth_GBps, link.latency_s)
        return self._dp_link[shape]

    def tail_s(self, shape: StageShape, n_layers: int, first: bool, last: bool) -> float:
        """Return the seconds of a stage's gradient all-reduce (ring, over dp) plus optimizer step
        (reading and writing weights, gradients and states once at memory bandwidth)."""
        params = self.stage_params(n_layers, first, last) / shape.tp
        mem_bw = self.dev(shape.device_type).memory_bandwidth_GBps * 1e9
        return (allreduce_s(params * self.wbytes, shape.dp, *self.dp_link(shape))
                + params * self.state_bytes_per_param * 2 / mem_bw)

    def intra(self, dtype: str) -> tuple[float, float]:
        """Return (GB/s, latency s) of the slowest intra-node link among nodes holding `dtype`."""
        links = [self.link(n.name, n.name) for n in self.p.cluster.nodes
                 if any(self.p.cluster.type_key(t) == dtype and c > 0 for t, c in n.gpus.items())]
        link = min(links, key=lambda l: l.bandwidth_GBps)
        return link.bandwidth_GBps, link.latency_s

    def layer(self, dtype: str, tp: int, b: int) -> tuple[float, float]:
        """Return (forward_s, backward_s) of one transformer block at micro-batch `b`, TP `tp`."""
        key = (dtype, tp, b)
        if key not in self._layer:
            measured = self._measured(dtype, "layer", tp, b)
            if measured is not None:
                f, g = measured
            else:
                rate = self.dev(dtype).peak(self.p.dtype) * 1e12 * self.p.efficiency
                f = self.cfg.layer_forward_flops(b, self.p.seq_len) / tp / rate
                g = 2.0 * f
            comm = self._tp_comm(dtype, tp, b, self.intra(dtype))
            self._layer[key] = (f + comm, g + comm)
        return self._layer[key]

    def extras(self, dtype: str, tp: int, b: int, first: bool, last: bool) -> tuple[float, float]:
        """Return (forward_s, backward_s) the embedding (first stage) and head + loss (last) add."""
        f = g = 0.0
        if first:
            m = self._measured(dtype, "embedding", tp, b)
            if m is not None:
                f, g = f + m[0], g + m[1]
        if last:
            m = self._measured(dtype, "head", tp, b)
            if m is None:
                rate = self.dev(dtype).peak(self.p.dtype) * 1e12 * self.p.efficiency
                hf = self.cfg.head_forward_flops(b, self.p.seq_len) / tp / rate
                m = (hf, 2.0 * hf)
            f, g = f + m[0], g + m[1]
        return f, g

    def stage_params(self, n_layers: int, first: bool, last: bool) -> float:
        """Return the parameter count of a stage with `n_layers` blocks (+ embedding / head)."""
        p = n_layers * self.cfg.layer_params()
        if first:
            p += self.cfg.embedding_params()
        if last:
            p += self.cfg.vocab * self.cfg.hidden + self.cfg.hidden
        return float(p)

    def activation_bytes(self, tp: int, b: int, recompute: bool) -> float:
        """Return the activation bytes one block keeps per in-flight micro-batch (per device)."""
        if recompute:
            return b * self.p.seq_len * self.cfg.hidden * self.wbytes / tp
        return self.cfg.layer_activation_bytes(b, self.p.seq_len, tp)

    def boundary_bytes(self, b: int) -> float:
        """Return the bytes of the activations sent between stages for one micro-batch of `b`."""
        return float(b * self.p.seq_len * self.cfg.hidden * self.wbytes)

    def logits_bytes(self, tp: int, b: int) -> float:
        """Return the bytes of the fp32 logits (and their gradient) the last stage holds."""
        return 2.0 * b * self.p.seq_len * self.cfg.vocab * 4 / tp


def in_flight(schedule: str, stage: int, num_stages: int, m: int) -> int:
    """Return the most micro-batches whose activations a stage holds at once under the schedule."""
    return m if schedule == "gpipe" else min(m, num_stages - stage)


# ------------------------------------------------------------------------------------------------
# Stage evaluation: times and memory for one stage given its shape, layer count and position
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageCost:
    """Predicted figures of one stage (seconds, bytes per device); fits is False when over memory."""

    forward_s: float
    backward_s: float
    allreduce_s: float
    optimizer_s: float
    memory_bytes: float
    recompute: bool
    fits: bool


def stage_memory(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
                 m: int, recompute: bool) -> float:
    """Return the peak bytes per device of a stage: weights, gradients and optimizer states of its
    parameters (split by tp), the last stage's logits, and the activations of its in-flight
    micro-batches (with recomputation: each block's input, plus one block's full activations)."""
    first, last = index == 0, index == num_stages - 1
    params = cm.stage_params(n_layers, first, last) / shape.tp
    mem = params * cm.state_bytes_per_param + (cm.logits_bytes(shape.tp, b) if last else 0.0)
    mem += in_flight(cm.p.schedule, index, num_stages, m) * n_layers * cm.activation_bytes(shape.tp, b, recompute)
    if recompute:
        mem += cm.activation_bytes(shape.tp, b, False)
    return mem


def stage_cost(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
               m: int) -> StageCost:
    """Return the cost of a stage; recomputation is switched on only when the stage does not fit."""
    p = cm.p
    first, last = index == 0, index == num_stages - 1
    f1, g1 = cm.layer(shape.device_type, shape.tp, b)
    ef, eg = cm.extras(shape.device_type, shape.tp, b, first, last)
    cap = cm.dev(shape.device_type).memory_bytes * p.memory_fraction
    recompute = False
    mem = stage_memory(cm, shape, n_layers, b, index, num_stages, m, False)
    if mem > cap:
        mem_r = stage_memory(cm, shape, n_layers, b, index, num_stages, m, True)
        if mem_r <= cap:
            recompute, mem = True, mem_r
    params = cm.stage_params(n_layers, first, last) / shape.tp
    fwd = n_layers * f1 + ef
    bwd = n_layers * (g1 + (f1 if recompute else 0.0)) + eg
    ar = allreduce_s(params * cm.wbytes, shape.dp, *cm.dp_link(shape))
    return StageCost(fwd, bwd, ar, cm.tail_s(shape, n_layers, first, last) - ar, mem, recompute, mem <= cap)


def p2p_s(cm: CostModel, a: StageShape, b: StageShape, micro_batch: int) -> float:
    """Return seconds to send one micro-batch's activations from stage shape a to b.

    Each replica of `a` sends its share; the slowest link between the two stages' nodes is used.
    """
    link = min((cm.link(x, y) for x in a.nodes for y in b.nodes), key=lambda l: l.bandwidth_GBps)
    return link.transfer_s(cm.boundary_bytes(micro_batch) / a.tp)


# ------------------------------------------------------------------------------------------------
# The DAG and its longest path
# ------------------------------------------------------------------------------------------------

def stage_order(schedule: str, stage: int, num_stages: int, m: int) -> list[tuple[str, int]]:
    """Return the execution order of one stage: [("F"|"B", micro-batch), ...].

    1F1B: min(S-1-s, m) warm-up forwards, then alternate one forward / one backward, then drain.
    GPipe: every forward, then every backward.
    """
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    w = min(num_stages - 1 - stage, m)
    out = [("F", j) for j in range(w)]
    for i in range(m - w):
        out += [("F", w + i), ("B", i)]
    return out + [("B", j) for j in range(m - w, m)]


@lru_cache(maxsize=256)
def topological_ops(schedule: str, num_stages: int, m: int) -> tuple[tuple[int, str, int], ...]:
    """Return every (stage, "F"|"B", micro-batch) in an order compatible with the DAG's edges."""
    orders = [stage_order(schedule, s, num_stages, m) for s in range(num_stages)]
    pos = [0] * num_stages
    done: set[tuple[int, str, int]] = set()
    out: list[tuple[int, str, int]] = []
    total = 2 * num_stages * m
    while len(out) < total:
        progressed = False
        for s in range(num_stages):
            while pos[s] < len(orders[s]):
                kind, j = orders[s][pos[s]]
                dep = ((s - 1, "F", j) if s > 0 else None) if kind == "F" else \
                    ((s + 1, "B", j) if s < num_stages - 1 else (s, "F", j))
                if dep is not None and dep not in done:
                    break
                out.append((s, kind, j))
                done.add((s, kind, j))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocks")  # cannot happen for 1F1B / GPipe
    return tuple(out)


def build_dag(fwd: list[float], bwd: list[float], p2p: list[float], tail: list[float], m: int,
              schedule: str = "1f1b") -> Any:
    """Return the training-iteration DAG as a networkx DiGraph with node attribute `d` (seconds).

    Nodes: ("F", s, j), ("B", s, j) compute; ("SF", s, j) / ("SB", s, j) sends between stages s and
    s+1; ("AR", s) gradient all-reduce + optimizer step of stage s (duration tail[s]); "end".
    Edges: data dependencies and each stage's execution order (`stage_order`).
    """
    import networkx as nx

    S = len(fwd)
    g = nx.DiGraph()
    for s in range(S):
        for j in range(m):
            g.add_node(("F", s, j), d=fwd[s])
            g.add_node(("B", s, j), d=bwd[s])
            if s < S - 1:
                g.add_node(("SF", s, j), d=p2p[s])
                g.add_node(("SB", s, j), d=p2p[s])
                g.add_edge(("F", s, j), ("SF", s, j))
                g.add_edge(("SF", s, j), ("F", s + 1, j))
                g.add_edge(("B", s + 1, j), ("SB", s, j))
                g.add_edge(("SB", s, j), ("B", s, j))
        if s == S - 1:
            for j in range(m):
                g.add_edge(("F", s, j), ("B", s, j))
        order = stage_order(schedule, s, S, m)
        for (k1, j1), (k2, j2) in zip(order, order[1:]):
            g.add_edge((k1, s, j1), (k2, s, j2))
        g.add_node(("AR", s), d=tail[s])
        last_kind, last_mb = order[-1]
        g.add_edge((last_kind, s, last_mb), ("AR", s))
        g.add_edge(("AR", s), "end")
    g.add_node("end", d=0.0)
    return g


def dag_longest_path_s(g: Any) -> float:
    """Return the longest path of a DAG built by `build_dag` (seconds: the iteration time)."""
    import networkx as nx

    finish: dict[Any, float] = {}
    for v in nx.topological_sort(g):
        start = max((finish[u] for u in g.predecessors(v)), default=0.0)
        finish[v] = start + g.nodes[v]["d"]
    return finish["end"]


@lru_cache(maxsize=256)
def _flat_ops(schedule: str, num_stages: int, m: int) -> tuple[tuple[int, bool, int, int, int], ...]:
    """Return the topological ops as (stage, is_forward, micro-batch, dependency op index or -1,
    index of the send on that dependency edge or -1), indices into the same tuple."""
    ops = topological_ops(schedule, num_stages, m)
    where = {op: i for i, op in enumerate(ops)}
    out = []
    for s, kind, j in ops:
        if kind == "F":
            dep, send = (where[(s - 1, "F", j)], s - 1) if s else (-1, -1)
        elif s < num_stages - 1:
            dep, send = where[(s + 1, "B", j)], s
        else:
            dep, send = where[(s, "F", j)], -1
        out.append((s, kind == "F", j, dep, send))
    return tuple(out)


def iteration_time_fast(fwd: list[float], bwd: list[float], p2p: list[float], tail: list[float], m: int,
                        schedule: str = "1f1b", record: list[tuple[int, str, int, float, float]] | None = None
                        ) -> float:
    """Return the same longest path as `dag_longest_path_s(build_dag(...))` without building a graph.

    Walks the DAG's compute nodes in a cached topological order: finish = max(previous op on the
    stage, dependency + send) + duration. Seconds. When `record` is a list, appends
    (stage, "F"|"B"|"AR", micro-batch, start_s, end_s) of every op to it.
    """
    S = len(fwd)
    free = [0.0] * S
    ops = _flat_ops(schedule, S, m)
    end = [0.0] * len(ops)
    sends = list(p2p) + [0.0]  # index -1: no send
    for i, (s, is_f, j, dep, send) in enumerate(ops):
        ready = end[dep] + sends[send] if dep >= 0 else 0.0
        begin = free[s] if free[s] > ready else ready
        t = begin + (fwd[s] if is_f else bwd[s])
        end[i] = free[s] = t
        if record is not None:
            record.append((s, "F" if is_f else "B", j, begin, t))
    if record is not None:
        record += [(s, "AR", -1, free[s], free[s] + tail[s]) for s in range(S)]
    return max(free[s] + tail[s] for s in range(S))


# ------------------------------------------------------------------------------------------------
# Evaluating a whole plan
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evaluation:
    """A plan's predicted figures: iteration time (s) and per-stage costs; `why` when infeasible."""

    iteration_time_s: float
    stages: list[StageCost]
    p2p: list[float]
    why: str = ""


def evaluate(cm: CostModel, shapes: list[StageShape], layers: list[int], m: int, fast: bool = True) -> Evaluation:
    """Return the predicted figures of stages `shapes` holding `layers[s]` blocks, `m` micro-batches.

    The iteration time is inf (with `why`) when a stage does not fit in memory or the batch does
    not split evenly. `fast=False` computes the longest path on the networkx DAG.
    """
    S, G = len(shapes), cm.p.global_batch
    costs: list[StageCost] = []
    for s, (sh, n) in enumerate(zip(shapes, layers)):
        if G % (m * sh.dp):
            return Evaluation(math.inf, [], [], f"stage {s}: global batch {G} is not divisible by "
                                                 f"{m} micro-batches x dp {sh.dp}")
        c = stage_cost(cm, sh, n, G // (m * sh.dp), s, S, m)
        if not c.fits:
            cap = cm.dev(sh.device_type).memory_bytes * cm.p.memory_fraction
            return Evaluation(math.inf, [], [], f"stage {s} ({sh.device_type}, {n} layers, tp {sh.tp}): "
                                                 f"needs {c.memory_bytes / 2**30:.2f} GiB per device even with "
                                                 f"recomputation, has {cap / 2**30:.2f} GiB")
        costs.append(c)
    p2p = [p2p_s(cm, shapes[s], shapes[s + 1], G // (m * shapes[s].dp)) for s in range(S - 1)]
    args = ([c.forward_s for c in costs], [c.backward_s for c in costs], p2p,
            [c.allreduce_s + c.optimizer_s for c in costs], m, cm.p.schedule)
    t = iteration_time_fast(*args) if fast else dag_longest_path_s(build_dag(*args))
    return Evaluation(t, costs, p2p)


def shapes_of(plan: PoseidonPlan) -> list[StageShape]:
    """Return the StageShapes of a plan's stages."""
    return [StageShape(s.device_type, s.tp, s.dp, tuple(s.gpu_ids), tuple(s.nodes)) for s in plan.stages]


def make_plan(problem: PoseidonProblem, shapes: list[StageShape], layers: list[int], m: int,
              ev: Evaluation | None = None, **fields: Any) -> PoseidonPlan:
    """Return a PoseidonPlan with every predicted figure filled from the DAG model."""
    cm = CostModel(problem)
    ev = ev or evaluate(cm, shapes, layers, m)
    stages, start = [], 0
    for s, (sh, n) in enumerate(zip(shapes, layers)):
        c = ev.stages[s]
        stages.append(StagePlan(index=s, device_type=sh.device_type, nodes=list(sh.nodes), gpu_ids=list(sh.gpu_ids),
                                tp=sh.tp, dp=sh.dp, first_layer=start, last_layer=start + n,
                                micro_batch_size=problem.global_batch // (m * sh.dp), recompute=c.recompute,
                                forward_s=c.forward_s, backward_s=c.backward_s,
                                p2p_s=ev.p2p[s] if s < len(ev.p2p) else 0.0, allreduce_s=c.allreduce_s,
                                optimizer_s=c.optimizer_s, memory_bytes=c.memory_bytes))
        start += n
    t = ev.iteration_time_s
    busy = max(m * (c.forward_s + c.backward_s) for c in ev.stages)
    predicted = {"iteration_time_s": t, "throughput_samples_per_s": problem.global_batch / t,
                 "tokens_per_s": problem.global_batch * problem.seq_len / t,
                 "bubble_fraction": 1.0 - busy / t,
                 "devices_used": float(sum(len(sh.gpu_ids) for sh in shapes))}
    fields.setdefault("status", Status.FEASIBLE)
    return PoseidonPlan(stages=stages, num_microbatches=m, schedule=problem.schedule, iteration_time_s=t,
                        objective=t, objective_name="iteration_time_s", predicted=predicted, **fields)


# ------------------------------------------------------------------------------------------------
# check: written from the constraints, recomputing everything from the problem
# ------------------------------------------------------------------------------------------------

def check(problem: PoseidonProblem, plan: PoseidonPlan) -> list[Violation]:
    """Return the broken constraints of `plan`: devices used once and of the stated type, layers
    covered once in order, degrees that divide, batch that splits, memory within capacity, and the
    predicted iteration time recomputed on the networkx DAG (1e-6 relative)."""
    out: list[Violation] = []
    cl = problem.cluster
    devices = {d.id: d for d in cl.devices}
    seen: dict[int, int] = {}
    if not plan.stages:
        return [Violation("no_stages", "the plan has no stages")]
    m, G = plan.num_microbatches, problem.global_batch
    expect = 0
    for pos, s in enumerate(plan.stages):
        if s.index != pos:
            out.append(Violation("stage_index", f"stage at position {pos} says index {s.index}",
                                 {"stage": pos, "index": s.index}))
        for g in s.gpu_ids:
            if g not in devices:
                out.append(Violation("unknown_device", f"stage {s.index}: device {g} is not in the cluster "
                                     f"(0..{len(devices) - 1})", {"stage": s.index, "device": g}))
                continue
            if g in seen:
                out.append(Violation("device_reused", f"device {g} is used by stages {seen[g]} and {s.index}",
                                     {"device": g, "stages": [seen[g], s.index]}))
            seen[g] = s.index
            if devices[g].type != s.device_type:
                out.append(Violation("device_type", f"stage {s.index}: device {g} is a {devices[g].type}, "
                                     f"not {s.device_type}", {"stage": s.index, "device": g}))
        if s.tp * s.dp != len(s.gpu_ids):
            out.append(Violation("degrees", f"stage {s.index}: tp {s.tp} x dp {s.dp} != {len(s.gpu_ids)} devices",
                                 {"stage": s.index}))
        if s.tp > problem.max_tp:
            out.append(Violation("degrees", f"stage {s.index}: tp {s.tp} above max_tp {problem.max_tp}"))
        for r in range(s.dp):
            group = {devices[g].node for g in s.gpu_ids[r * s.tp:(r + 1) * s.tp] if g in devices}
            if len(group) > 1:
                out.append(Violation("tp_across_nodes", f"stage {s.index}: tensor-parallel group {r} spans "
                                     f"nodes {sorted(group)}", {"stage": s.index}))
        if s.first_layer != expect or s.last_layer <= s.first_layer:
            out.append(Violation("layers", f"stage {s.index}: layers [{s.first_layer}, {s.last_layer}) do not "
                                 f"continue from layer {expect} with at least one layer", {"stage": s.index}))
        expect = max(expect, s.last_layer)
        if G % (m * s.dp) or s.micro_batch_size != G // (m * s.dp):
            out.append(Violation("batch", f"stage {s.index}: global batch {G} != {m} micro-batches x dp {s.dp} "
                                 f"x micro-batch {s.micro_batch_size}", {"stage": s.index}))
    if expect != problem.model.num_layers:
        out.append(Violation("layers", f"the stages cover layers up to {expect}, the model has "
                             f"{problem.model.num_layers}"))
    if out:
        return out
    cm = CostModel(problem)
    S, shapes = len(plan.stages), shapes_of(plan)
    for s, shape in zip(plan.stages, shapes):
        cap = cl.type_of(s.device_type).memory_bytes * problem.memory_fraction
        need = stage_memory(cm, shape, s.num_layers, s.micro_batch_size, s.index, S, m, s.recompute)
        if need > cap:
            out.append(Violation("memory", f"stage {s.index} ({s.device_type}): needs {need / 2**30:.2f} GiB per "
                                 f"device, capacity {cap / 2**30:.2f} GiB", {"stage": s.index, "need_bytes": need,
                                                                              "capacity_bytes": cap}))
    if out:
        return out
    ev = evaluate(cm, shapes, [s.num_layers for s in plan.stages], m, fast=False)
    if not math.isclose(ev.iteration_time_s, plan.iteration_time_s, rel_tol=1e-6):
        out.append(Violation("predicted_time", f"the plan says {plan.iteration_time_s:.6g} s per iteration; the DAG "
                             f"model gives {ev.iteration_time_s:.6g} s",
                             {"plan_s": plan.iteration_time_s, "dag_s": ev.iteration_time_s}))
    return out


# ------------------------------------------------------------------------------------------------
# Presentation, profiles
# ------------------------------------------------------------------------------------------------

def summarize(problem: PoseidonProblem, plan: PoseidonPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare poseidon` prints for one plan."""
    stats = plan.solver.stats if plan.solver else {}
    return {"iteration_time_s": plan.iteration_time_s,
            "samples_per_s": plan.predicted.get("throughput_samples_per_s"),
            "stages": len(plan.stages), "microbatches": plan.num_microbatches,
            "shape": " | ".join(f"{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L" for s in plan.stages),
            "evaluated": stats.get("evaluated"), "pruned": stats.get("pruned")}


def describe(problem: PoseidonProblem, plan: PoseidonPlan) -> list[Table]:
    """Return the stage table of a plan (one row per stage, times in ms, memory in GiB)."""
    rows = []
    for s in plan.stages:
        cap = problem.cluster.type_of(s.device_type).memory_bytes
        rows.append([s.index, s.device_type, len(s.gpu_ids), s.tp, s.dp, f"{s.first_layer}-{s.last_layer - 1}",
                     s.micro_batch_size, s.recompute, s.forward_s * 1e3, s.backward_s * 1e3, s.p2p_s * 1e3,
                     s.allreduce_s * 1e3, s.memory_bytes / 2**30, cap / 2**30, ",".join(s.nodes)])
    return [Table(f"stages ({plan.schedule}, {plan.num_microbatches} micro-batches)",
                  ["stage", "type", "gpus", "tp", "dp", "layers", "mb", "recompute", "fwd_ms", "bwd_ms",
                   "p2p_ms", "allreduce_ms", "mem_GiB", "cap_GiB", "nodes"], rows)]


def timeline(problem: PoseidonProblem, plan: PoseidonPlan) -> list[tuple[int, str, int, float, float]]:
    """Return (stage, "F"|"B"|"AR", micro-batch, start_s, end_s) of every op of the plan's DAG."""
    st, out = plan.stages, []
    iteration_time_fast([s.forward_s for s in st], [s.backward_s for s in st], [s.p2p_s for s in st],
                        [s.allreduce_s + s.optimizer_s for s in st], plan.num_microbatches, plan.schedule, out)
    return out


def draw(problem: PoseidonProblem, plan: PoseidonPlan, path: Path) -> None:
    """Write the pipeline timeline (one row per stage, forward / backward / all-reduce) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure

    colors = {"F": "#4c72b0", "B": "#dd8452", "AR": "#55a868"}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.5 * len(plan.stages)))
    for s, kind, j, a, b in timeline(problem, plan):
        ax.barh(s, (b - a) * 1e3, left=a * 1e3, color=colors[kind], edgecolor="white", linewidth=0.3)
        if kind != "AR" and len(plan.stages) * plan.num_microbatches <= 64:
            ax.text((a + b) / 2 * 1e3, s, str(j), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(plan.stages)), [f"{s.index}: {s.device_type} {s.tp}x{s.dp}" for s in plan.stages])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{plan.schedule}, {plan.num_microbatches} micro-batches, iteration {plan.iteration_time_s * 1e3:.1f} ms"
                 " (blue forward, orange backward, green all-reduce + optimizer)")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=120)


def with_profile(problem: PoseidonProblem, profile: Profile) -> PoseidonProblem:
    """Return the problem on the profiled cluster, with the profile's layer table when it has one."""
    table = profile.layer_table(problem.model.name) or profile.layer_table()
    doc = problem.model_dump()
    doc["cluster"] = cluster_document(profile)
    if table is not None:
        doc["layer_costs"] = table.model_dump()
    return PoseidonProblem.model_validate(doc)


register_model(ModelSpec(
    kind="poseidon", problem_type=PoseidonProblem, plan_type=PoseidonPlan, check=check,
    summarize=summarize, describe=describe, draw=draw, runner="gpuplan.runtime.poseidon:run_plan",
    with_profile=with_profile,
    title="Poseidon: DAG-guided parallelism search for LLM training on heterogeneous clusters"))
