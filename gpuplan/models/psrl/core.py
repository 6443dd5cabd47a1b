"""psRL problem, plan, cost model and check (training-time prefix sharing for agentic RL updates).

Cost model (beyond.md 3.2, a reconstruction [R] of the paper's):
  c(v)        forward + backward FLOPs of node v's segment: 3 * (len_v * dense FLOPs per token +
              causal (query, key) pairs * attention FLOPs per pair), pairs = len_v*pos_v + len_v(len_v+1)/2
  comm(v)     exchanging v's K/V (forward) and dK/dV (backward): latency + 2 * kvb(v) / exchange rate
  load_w      sum over nodes computed on w of c(v) / (peak_w * mfu) + sum over nodes received on w of
              comm(v) + the prefix misses of w's micro-batch order at the K/V budget memory_w reserves (a
              computed prefix read again after eviction: its forward, c(v) / 3; a received one: comm(v) / 2;
              0 for DFS orders); with sharing 'none' every sample's whole path is computed on its own
  makespan    max_w load_w (the update phase's modelled time)
  memory_w    model state + max over w's samples of the path's K/V (in allocated blocks) + activations
              (DFS bound: one root-to-node path resident at a time)
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from gpuplan.models.base import Problem, Schema, Violation, document_path
from gpuplan.models.cluster import DeviceType, device_type
from gpuplan.models.plan import (FIGURE_ABS_TOL, FIGURE_REL_TOL, Plan, figure_violations,
                                 stated_figures_violations)
from gpuplan.models.psrl import cache
from gpuplan.models.psrl.forest import (MAX_NODES, MAX_SAMPLES, MAX_SEGMENT_TOKENS, Forest, activation_bytes_per_token,
                                        build_forest, kv_bytes_per_token, node_flops, path_flops, token_counts)
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, model_config
from gpuplan.units import Bytes, GBps, Seconds, TFLOPS

MAX_WORKERS = 4_096
"""Most workers (after count expansion)."""


class WorkerSpec(Schema):
    """A GPU worker (or `count` identical ones named name0, name1, ...): a catalog GPU type, optionally
    with a measured peak (TFLOP/s) and memory (bytes) in place of the catalog's."""

    name: str = Field(min_length=1, max_length=64)
    gpu: str = "H100"
    count: int = Field(default=1, ge=1, le=MAX_WORKERS)
    peak_tflops: TFLOPS | None = Field(default=None, gt=0)
    memory_bytes: Bytes | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _known_gpu(self) -> "WorkerSpec":
        try:
            device_type(self.gpu)
        except ValueError as exc:
            raise ValueError(f"at gpu: {exc}") from None
        return self


class NodeSpec(Schema):
    """One trie node: its id, its parent's id (-1 for a root) and its segment length in tokens."""

    id: int = Field(ge=0, le=1 << 40)
    parent: int = Field(default=-1, ge=-1, le=1 << 40)
    tokens: int = Field(ge=1, le=MAX_SEGMENT_TOKENS)


class SampleSpec(Schema):
    """One training sample: the node its path ends at, its group (task) and its loss weight."""

    node: int = Field(ge=0, le=1 << 40)
    group: int = Field(default=-1, ge=-1, le=1 << 40)
    weight: float = Field(default=1.0, ge=-1e6, le=1e6)


class ForestSpec(Schema):
    """The batch as a prefix forest: nodes with parent links, samples ending at nodes."""

    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_NODES)
    samples: list[SampleSpec] = Field(min_length=1, max_length=MAX_SAMPLES)


class GenerateSpec(Schema):
    """A seeded synthetic trace (see gpuplan.models.psrl.traces): step-wise multi-turn rollouts (one
    sample per turn, history carried) or tree rollouts (one sample per leaf, branching 2-4)."""

    shape: Literal["stepwise", "tree"] = "stepwise"
    tasks: int = Field(default=8, ge=1, le=4_096)
    rollouts: int = Field(default=4, ge=1, le=256)
    turns_min: int = Field(default=5, ge=1, le=64)
    turns_max: int = Field(default=20, ge=1, le=64)
    system_tokens: int = Field(default=0, ge=0, le=65_536)
    prompt_tokens_min: int = Field(default=1000, ge=1, le=65_536)
    prompt_tokens_max: int = Field(default=4000, ge=1, le=65_536)
    turn_tokens_min: int = Field(default=200, ge=1, le=65_536)
    turn_tokens_max: int = Field(default=500, ge=1, le=65_536)
    branching_min: int = Field(default=2, ge=1, le=8)
    branching_max: int = Field(default=4, ge=1, le=8)
    depth: int = Field(default=3, ge=1, le=8)
    seed: int = Field(default=0, ge=0, le=2**31)

    @model_validator(mode="after")
    def _ranges(self) -> "GenerateSpec":
        for lo, hi in (("turns_min", "turns_max"), ("prompt_tokens_min", "prompt_tokens_max"),
                       ("turn_tokens_min", "turn_tokens_max"), ("branching_min", "branching_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"at {lo}: at most {hi}={getattr(self, hi)}, not {getattr(self, lo)}")
        from gpuplan.models.psrl.traces import generated_size

        nodes, samples = generated_size(self)
        if nodes > MAX_NODES or samples > MAX_SAMPLES:
            raise ValueError(f"at tasks: a trace of at most {MAX_NODES:,} nodes and {MAX_SAMPLES:,} samples; "
                             f"this one would hold up to {nodes:,} nodes and {samples:,} samples")
        return self


class PsrlProblem(Problem):
    """An RL update batch as a prefix forest, the policy model's shape, and the GPU workers.

    Exactly one of `forest` (inline), `trace` (a JSONL file of rollouts, read once into `forest`)
    or `generate` (a seeded synthetic trace) gives the batch."""

    kind: Literal["psrl"] = "psrl"
    model: str | TransformerConfig = "qwen3-8b"
    dtype: str = "bf16"
    mfu: float = Field(default=0.4, gt=0, le=1)
    workers: list[WorkerSpec] = Field(min_length=1, max_length=MAX_WORKERS)
    exchange_GBps: GBps = Field(default=50.0, gt=0)
    exchange_latency_s: Seconds = Field(default=1e-5, ge=0)
    model_state_bytes: Bytes | None = Field(default=None, ge=0)
    cache_fraction: float = Field(default=0.25, gt=0, le=1)
    block_overhead_tokens: float = Field(default=4.0, ge=0, le=1024)
    forest: ForestSpec | None = None
    generate: GenerateSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_trace(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or "trace" not in data:
            return data

        from gpuplan.models.psrl.traces import read_trace

        data = dict(data)
        trace = data.pop("trace")
        if not isinstance(trace, str) or not trace:
            raise ValueError(f"at trace: a path to a JSONL rollout file, not {trace!r}")
        if data.get("forest") is not None:
            raise ValueError("at trace: one of forest, trace or generate, not trace and forest")
        data["forest"] = read_trace(document_path(trace, info))
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "PsrlProblem":
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"at dtype: one of {', '.join(DTYPE_BYTES)}, not {self.dtype!r}")
        if isinstance(self.model, str):
            try:
                model_config(self.model)
            except ValueError as exc:
                raise ValueError(f"at model: {exc}") from None
        if (self.forest is None) == (self.generate is None):
            raise ValueError("at forest: exactly one of forest, trace or generate")
        names = self.worker_names()
        if len(names) > MAX_WORKERS:
            raise ValueError(f"at workers: at most {MAX_WORKERS:,} workers after count expansion, not {len(names):,}")
        seen: set[str] = set()
        dup = sorted({n for n in names if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
        if dup:
            raise ValueError(f"at workers: distinct worker names (after count expansion), but {dup[:5]} repeat")
        if self.forest is not None:
            self.built  # noqa: B018 - validate the forest now (unknown parents, cycles)
        return self

    # -- derived figures

    @cached_property
    def built(self) -> Forest:
        """Return the prefix forest (built once from `forest` or generated from `generate`)."""
        if self.generate is not None:
            from gpuplan.models.psrl.traces import generate_forest

            return generate_forest(self.generate)
        assert self.forest is not None
        try:
            f = build_forest([(n.id, n.parent, n.tokens) for n in self.forest.nodes],
                             [(s.node, s.group, s.weight) for s in self.forest.samples])
        except ValueError as exc:  # 'at nodes[4].parent: ...' is a field of `forest`: name its whole path
            raise ValueError(f"at forest.{str(exc).removeprefix('at ')}") from None
        f.group = [g if g >= 0 else f.ids[f.root_of(f.end[i])] for i, g in enumerate(f.group)]
        return f

    @cached_property
    def config(self) -> TransformerConfig:
        """Return the policy model's shape."""
        return model_config(self.model)

    def worker_names(self) -> list[str]:
        """Return the worker names after expanding `count`."""
        out = []
        for w in self.workers:
            out += [w.name] if w.count == 1 else [f"{w.name}{i}" for i in range(w.count)]
        return out

    @cached_property
    def worker_specs(self) -> list[WorkerSpec]:
        """Return the WorkerSpec of every worker (after expanding `count`), in worker_names order."""
        return [w for w in self.workers for _ in range(w.count)]

    def device(self, i: int) -> DeviceType:
        """Return the catalog device type of worker i."""
        return device_type(self.worker_specs[i].gpu)

    @cached_property
    def rates(self) -> list[float]:
        """Return every worker's achieved FLOP/s: peak (measured or catalog, in `dtype`) x mfu."""
        out = []
        for i, w in enumerate(self.worker_specs):
            peak = w.peak_tflops if w.peak_tflops is not None else self.device(i).peak(self.dtype)
            out.append(peak * 1e12 * self.mfu)
        return out

    @cached_property
    def memory(self) -> list[float]:
        """Return every worker's memory in bytes (measured or catalog)."""
        return [w.memory_bytes if w.memory_bytes is not None else self.device(i).memory_bytes
                for i, w in enumerate(self.worker_specs)]

    @cached_property
    def static_bytes(self) -> float:
        """Return the model-state bytes every worker holds: `model_state_bytes`, else weights and
        gradients in `dtype` (optimizer states sharded away)."""
        if self.model_state_bytes is not None:
            return float(self.model_state_bytes)
        return 2.0 * self.config.total_params() * DTYPE_BYTES[self.dtype]

    @cached_property
    def flops(self) -> list[float]:
        """Return c(v) per node (FLOPs)."""
        return node_flops(self.built, self.config)

    @cached_property
    def sample_flops(self) -> list[float]:
        """Return, per sample, the FLOPs of its whole path trained alone (no sharing)."""
        return path_flops(self.built, self.config)

    @cached_property
    def kv_per_token(self) -> float:
        """Return K/V bytes per token (all layers)."""
        return kv_bytes_per_token(self.config, self.dtype)

    @cached_property
    def comm_s(self) -> list[float]:
        """Return comm(v) per node: seconds to receive its K/V and return its dK/dV."""
        rate = self.exchange_GBps * 1e9
        return [self.exchange_latency_s + 2.0 * t * self.kv_per_token / rate for t in self.built.tokens]

    @cached_property
    def sample_kv_bytes(self) -> list[float]:
        """Return, per sample, the K/V bytes of its path in allocated blocks (the segments plus padding)."""
        alloc = [cache.allocated_tokens(b) for b in self.blocks]
        f = self.built
        return [sum(alloc[v] for v in f.sample_path(s)) * self.kv_per_token for s in range(f.n_samples)]

    @cached_property
    def sample_bytes(self) -> list[float]:
        """Return, per sample, the bytes its path keeps resident: its K/V in allocated blocks and the
        activations of every token."""
        act = activation_bytes_per_token(self.config)
        return [kv + self.built.sample_tokens(s) * act for s, kv in enumerate(self.sample_kv_bytes)]

    @cached_property
    def blocks(self) -> list[list[int]]:
        """Return the block counts [n1024, n256, n64, n16] per node (the DP's cheapest cover)."""
        memo: dict[int, list[int]] = {}
        out = []
        for t in self.built.tokens:
            if t not in memo:
                memo[t] = cache.block_counts(t, self.block_overhead_tokens)
            out.append(memo[t])
        return out

    def with_blocks(self, blocks: list[list[int]]) -> "PsrlProblem":
        """Return a copy of the problem whose block counts per node are `blocks` in place of the DP's
        cover, so that every figure depending on them (sample K/V and memory, cache sizes, hit rates,
        misses) follows them."""
        out = self.model_copy()
        for name in ("blocks", "sample_kv_bytes", "sample_bytes"):  # the cached values that read blocks
            out.__dict__.pop(name, None)
        out.__dict__["blocks"] = blocks
        return out


# ---------------------------------------------------------------- the plan

class PsrlPlan(Plan):
    """Which worker trains which sample, which nodes each worker computes or receives (K/V and dK/dV
    exchanged), the micro-batch order per worker, the KV blocks per node, and the predicted figures."""

    kind: str = "psrl"
    sharing: Literal["prefix", "none"] = "prefix"
    sample_worker: list[str] = Field(default_factory=list)
    computed: dict[str, list[int]] = Field(default_factory=dict)
    received: dict[str, list[int]] = Field(default_factory=dict)
    order: dict[str, list[int]] = Field(default_factory=dict)
    blocks: dict[str, list[int]] = Field(default_factory=dict)
    load_s: dict[str, float] = Field(default_factory=dict)
    memory_bytes: dict[str, float] = Field(default_factory=dict)
    hit_rate: dict[str, float] = Field(default_factory=dict)


# ---------------------------------------------------------------- cost model

def worker_loads(problem: PsrlProblem, sharing: str, assign: list[int], computed: list[set[int]],
                 received: list[set[int]]) -> list[float]:
    """Return each worker's modelled update time (s): computed nodes' FLOPs over its rate plus the
    exchange time of received nodes; with sharing 'none', the whole path of each of its samples."""
    W = len(problem.rates)
    out = [0.0] * W
    if sharing == "none":
        for s, w in enumerate(assign):
            out[w] += problem.sample_flops[s] / problem.rates[w]
        return out
    for w in range(W):
        out[w] = sum(problem.flops[v] for v in computed[w]) / problem.rates[w] + \
            sum(problem.comm_s[v] for v in received[w])
    return out


def worker_memory(problem: PsrlProblem, assign: list[int]) -> list[float]:
    """Return each worker's peak memory (bytes): model state + its largest sample path (K/V and
    activations), or the model state alone when it trains nothing."""
    W = len(problem.rates)
    peak = [0.0] * W
    for s, w in enumerate(assign):
        peak[w] = max(peak[w], problem.sample_bytes[s])
    return [problem.static_bytes + p for p in peak]


def cache_accesses(problem: PsrlProblem, order: list[int]) -> list[int]:
    """Return the node accesses of a micro-batch order: each sample reads its whole path, root first."""
    f = problem.built
    out: list[int] = []
    for s in order:
        out += f.sample_path(s)
    return out


def path_kv_bytes(problem: PsrlProblem, order: list[int]) -> float:
    """Return the K/V bytes (allocated blocks) of the largest root-to-sample path among `order`'s samples:
    what the memory model (worker_memory) already reserves next to the model state for the DFS working set."""
    return max((problem.sample_kv_bytes[s] for s in order), default=0.0)


def cache_stats(problem: PsrlProblem, order: list[int], fraction: float | None = None,
                policy: str = "belady", budget_bytes: float | None = None,
                costs: dict[int, float] | None = None) -> dict[str, float]:
    """Return the prefix-cache figures of one worker's order (see cache.simulate) at a budget of
    `fraction` (default the problem's cache_fraction) of its fully resident prefix K/V: the allocated
    block bytes of every node it reads more than once; or at `budget_bytes` when given. `costs` per node
    give miss_cost (see cache.simulate). Adds budget_bytes and resident_bytes."""
    acc = cache_accesses(problem, order)
    counts: dict[int, int] = {}
    for v in acc:
        counts[v] = counts.get(v, 0) + 1
    sizes = {v: cache.allocated_tokens(problem.blocks[v]) * problem.kv_per_token for v in counts}
    resident = sum(sizes[v] for v, c in counts.items() if c > 1)
    budget = (budget_bytes if budget_bytes is not None else
              (problem.cache_fraction if fraction is None else fraction) * resident)
    weights = {v: float(problem.built.tokens[v]) for v in counts}
    out = cache.simulate(acc, sizes, weights, budget, policy, costs)
    return {**out, "budget_bytes": budget, "resident_bytes": resident}


def miss_seconds(problem: PsrlProblem, order: list[int], computed: set[int], rate: float) -> dict[str, float]:
    """Return what a worker's prefix cache costs it at the budget the memory model reserves (path_kv_bytes,
    next-use eviction): miss_s, the seconds of re-creating every evicted prefix it reads again (a computed
    node's forward pass again, c(v) / 3 / rate; a received node's K/V received again, comm(v) / 2), and
    hit_rate there. DFS orders keep every prefix on the resident path while its descendants run, so they
    pay 0 on every trace tried; another order may not."""
    costs = {v: (problem.flops[v] / 3.0 / rate if v in computed else problem.comm_s[v] / 2.0)
             for v in set(cache_accesses(problem, order))}
    st = cache_stats(problem, order, budget_bytes=path_kv_bytes(problem, order), costs=costs)
    return {"miss_s": st["miss_cost"], "hit_rate": st["hit_rate"]}


def overall_hit_rate(stats: list[dict[str, float]]) -> float:
    """Return the token-weighted prefix hit rate over several workers' cache statistics."""
    reuse = sum(s["reuse_tokens"] for s in stats)
    return sum(s["hit_tokens"] for s in stats) / reuse if reuse > 0 else 1.0


def metrics(problem: PsrlProblem, sharing: str, assign: list[int], computed: list[set[int]],
            received: list[set[int]], orders: list[list[int]]) -> dict[str, Any]:
    """Return the predicted figures: makespan_s, mean_load_s, imbalance (max/mean load), raw_tokens,
    dedup_tokens, computed_tokens (with recomputation and repeats), exchanged_bytes, hit_rate (at the
    cache_fraction budget), miss_s (seconds of prefix misses at the reserved path K/V, included in the loads)
    and path_hit_rate (the worst worker's hit rate there), and the per-worker load_s, memory_bytes and
    hit_rate lists."""
    loads = worker_loads(problem, sharing, assign, computed, received)
    W = len(loads)
    path_hit, misses = 1.0, [0.0] * W
    if sharing != "none":  # a prefix evicted from the reserved path K/V and read again is paid in the load
        ms = [miss_seconds(problem, orders[w], computed[w], problem.rates[w]) for w in range(W)]
        misses = [m["miss_s"] for m in ms]
        loads = [l + x for l, x in zip(loads, misses)]
        path_hit = min((m["hit_rate"] for m in ms), default=1.0)
    mean = sum(loads) / W
    raw, dedup = token_counts(problem.built)
    toks = problem.built.tokens
    if sharing == "none":
        computed_tokens = raw
        # no prefix is kept: every reuse of a shared prefix is recomputed (a miss)
        stats = [{"reuse_tokens": 1.0, "hit_tokens": 0.0, "hit_rate": 0.0} for _ in range(W)]
    else:
        computed_tokens = sum(toks[v] for w in range(W) for v in computed[w])
        stats = [cache_stats(problem, orders[w]) for w in range(W)]
    exchanged = sum(2.0 * toks[v] * problem.kv_per_token for w in range(W) for v in received[w])
    return {"makespan_s": max(loads), "mean_load_s": mean, "imbalance": max(loads) / mean if mean > 0 else 1.0,
            "raw_tokens": float(raw), "dedup_tokens": float(dedup), "computed_tokens": float(computed_tokens),
            "exchanged_bytes": exchanged, "hit_rate": overall_hit_rate(stats),
            "miss_s": sum(misses), "path_hit_rate": path_hit,
            "load_s": loads, "memory_bytes": worker_memory(problem, assign),
            "worker_hit_rate": [s["hit_rate"] for s in stats]}


def finish_plan(problem: PsrlProblem, plan: PsrlPlan, assign: list[int], computed: list[set[int]],
                received: list[set[int]], orders: list[list[int]] | None = None) -> PsrlPlan:
    """Fill the plan's fields from worker indices: assignment, node sets, DFS micro-batch orders (unless
    given), blocks of every node used, and the predicted figures and objective (makespan, s)."""
    names = problem.worker_names()
    f = problem.built
    W = len(names)
    if orders is None:
        per: list[list[int]] = [[] for _ in range(W)]
        for s, w in enumerate(assign):
            per[w].append(s)
        orders = [f.dfs_samples(p) for p in per]
    m = metrics(problem, plan.sharing, assign, computed, received, orders)
    ids = f.ids
    plan.sample_worker = [names[w] for w in assign]
    plan.computed = {names[w]: sorted(ids[v] for v in computed[w]) for w in range(W) if computed[w]}
    plan.received = {names[w]: sorted(ids[v] for v in received[w]) for w in range(W) if received[w]}
    plan.order = {names[w]: orders[w] for w in range(W) if orders[w]}
    used = set().union(*computed, *received) if W else set()
    plan.blocks = {str(ids[v]): problem.blocks[v] for v in sorted(used)}
    plan.load_s = dict(zip(names, m["load_s"]))
    plan.memory_bytes = dict(zip(names, m["memory_bytes"]))
    plan.hit_rate = {names[w]: m["worker_hit_rate"][w] for w in range(W) if orders[w]}
    plan.predicted = {k: v for k, v in m.items() if not isinstance(v, list)}
    plan.objective = m["makespan_s"]
    plan.objective_name = "makespan_s"
    return plan


# ---------------------------------------------------------------- check

def check(problem: PsrlProblem, plan: PsrlPlan) -> list[Violation]:
    """Return the violations of `plan`, recomputed from the problem (nothing in the plan trusted):
    every sample on one known worker; each of its path's nodes computed on that worker or received
    there (and a received node computed by another worker); a computed node's parent computed or
    received on the same worker; a node not both computed and received on
    one worker; sharing 'none' receives nothing; each order a permutation of the worker's samples;
    blocks from {1024, 256, 64, 16} covering their node at the cheapest cost (stated_blocks); memory within
    each worker's; the stated loads, memory, hit rates, makespan and other figures equal to the ones
    recomputed under the stated blocks; and the greedy's makespan in the stats not below the plan's."""
    out: list[Violation] = []
    f = problem.built
    names = problem.worker_names()
    widx = {n: i for n, i in zip(names, range(len(names)))}
    nidx = {nid: i for i, nid in enumerate(f.ids)}
    W = len(names)
    if len(plan.sample_worker) != f.n_samples:
        return [Violation("assignment", f"the plan assigns {len(plan.sample_worker)} samples; the batch holds "
                          f"{f.n_samples}", {"samples": len(plan.sample_worker)})]
    assign: list[int] = []
    for s, n in enumerate(plan.sample_worker):
        if n not in widx:
            out.append(Violation("unknown_worker", f"sample {s} is assigned to {n!r}, which is not a worker",
                                 {"sample": s, "worker": n}))
            assign.append(-1)
        else:
            assign.append(widx[n])

    def node_sets(field: str, table: dict[str, list[int]]) -> list[set[int]]:
        sets: list[set[int]] = [set() for _ in range(W)]
        for n, nodes in table.items():
            if n not in widx:
                out.append(Violation("unknown_worker", f"{field} lists worker {n!r}, which is not a worker",
                                     {"worker": n}))
                continue
            for nid in nodes:
                if nid not in nidx:
                    out.append(Violation("unknown_node", f"{field}[{n}] lists node {nid}, which is not in the forest",
                                         {"worker": n, "node": nid}))
                else:
                    sets[widx[n]].add(nidx[nid])
        return sets

    computed = node_sets("computed", plan.computed)
    received = node_sets("received", plan.received)
    if out:
        return out
    if plan.sharing == "none" and any(received):
        out.append(Violation("sharing", "a plan without sharing receives no K/V, but this one does"))
    for w in range(W):
        both = computed[w] & received[w]
        if both:
            out.append(Violation("both", f"{names[w]} both computes and receives node(s) "
                                 f"{sorted(f.ids[v] for v in both)[:5]}", {"worker": names[w]}))
        orphans = sorted(f.ids[v] for v in computed[w] if f.parent[v] >= 0 and f.parent[v] not in computed[w]
                         and f.parent[v] not in received[w])
        if orphans:
            out.append(Violation("parent_missing", f"{names[w]} computes node(s) {orphans[:5]} without their parent's "
                                 "K/V (neither computed nor received there)", {"worker": names[w], "nodes": orphans}))
        for v in sorted(received[w]):
            if not any(v in computed[u] for u in range(W) if u != w):
                out.append(Violation("received_from_nowhere", f"{names[w]} receives node {f.ids[v]}'s K/V, but no "
                                     "other worker computes it", {"worker": names[w], "node": f.ids[v]}))
    missing = 0
    for s, w in enumerate(assign):
        for v in f.sample_path(s):
            if v not in computed[w] and v not in received[w]:
                missing += 1
                if missing <= 10:
                    out.append(Violation("prefix_missing", f"sample {s} on {names[w]} needs node {f.ids[v]}, which "
                                         f"{names[w]} neither computes nor receives",
                                         {"sample": s, "worker": names[w], "node": f.ids[v]}))
    if missing > 10:
        out.append(Violation("prefix_missing", f"... and {missing - 10} more missing prefix nodes"))
    orders: list[list[int]] = [[] for _ in range(W)]
    for n, seq in plan.order.items():
        if n not in widx:
            out.append(Violation("unknown_worker", f"order lists worker {n!r}, which is not a worker", {"worker": n}))
            continue
        orders[widx[n]] = list(seq)
    for w in range(W):
        mine = sorted(s for s, a in enumerate(assign) if a == w)
        if sorted(orders[w]) != mine:
            out.append(Violation("order", f"the micro-batch order of {names[w]} is not a permutation of its "
                                 f"{len(mine)} samples", {"worker": names[w]}))
    blocks, bad = stated_blocks(problem, plan.blocks)
    out += bad
    if out:
        return out
    if blocks != problem.blocks:  # a cheapest cover other than the DP's: the figures follow the plan's
        problem = problem.with_blocks(blocks)
    mem = worker_memory(problem, assign)
    for w in range(W):
        if mem[w] > problem.memory[w] * (1 + 1e-9):
            out.append(Violation("memory", f"{names[w]} needs {mem[w] / 2**30:.2f} GiB (model state + its longest "
                                 f"sample path); it has {problem.memory[w] / 2**30:.2f} GiB",
                                 {"worker": names[w], "need_bytes": mem[w], "have_bytes": problem.memory[w]}))
    m = metrics(problem, plan.sharing, assign, computed, received, orders)
    out += figure_violations("load_s", plan.load_s, dict(zip(names, m["load_s"])))
    out += figure_violations("memory_bytes", plan.memory_bytes, dict(zip(names, m["memory_bytes"])))
    out += figure_violations("hit_rate", plan.hit_rate,
                             {names[w]: m["worker_hit_rate"][w] for w in range(W) if orders[w]})
    scalars = {k: v for k, v in m.items() if not isinstance(v, list)}
    objective = m["makespan_s"] if plan.objective is not None or plan.solver is not None else None
    out += stated_figures_violations(plan, objective, scalars)
    placed = max(worker_loads(problem, plan.sharing, assign, computed, received), default=0.0)
    return out + greedy_bound_violations(plan, placed)


def stated_blocks(problem: PsrlProblem, stated: dict[str, list[int]]) -> tuple[list[list[int]], list[Violation]]:
    """Return the block counts per node the plan's `blocks` give (the DP's cover for a node it leaves out)
    and the violations of those it states: a key that is no node (`unknown_node`); counts that are not four
    non-negative numbers of 1024/256/64/16-token blocks covering the node, or a cover dearer than the
    cheapest (padding + block_overhead_tokens per block: the cache manager's rule) (`blocks`)."""
    f = problem.built
    nidx = {nid: i for i, nid in enumerate(f.ids)}
    blocks = [list(b) for b in problem.blocks]
    out: list[Violation] = []
    for key, counts in stated.items():
        nid = int(key) if key.lstrip("-").isdigit() else None
        if nid is None or nid not in nidx:
            out.append(Violation("unknown_node", f"blocks for {key!r}, which is not a node", {"node": key}))
            continue
        v = nidx[nid]
        tokens = f.tokens[v]
        if len(counts) != len(cache.BLOCK_SIZES) or any(c < 0 for c in counts) or \
                cache.allocated_tokens(counts) < tokens:
            out.append(Violation("blocks", f"node {nid}'s blocks {counts} (counts of {list(cache.BLOCK_SIZES)} "
                                 f"tokens) do not cover its {tokens} tokens", {"node": nid}))
            continue
        cost = cache.block_cost(tokens, counts, problem.block_overhead_tokens)
        best = cache.block_cost(tokens, problem.blocks[v], problem.block_overhead_tokens)
        if cost > best + 1e-9 * max(1.0, best):
            out.append(Violation("blocks", f"node {nid}'s blocks {counts} cost {cost:g} (padding tokens + "
                                 f"{problem.block_overhead_tokens:g} per block); the cheapest cover of its {tokens} "
                                 f"tokens, {problem.blocks[v]}, costs {best:g}", {"node": nid, "blocks": counts}))
            continue
        blocks[v] = list(counts)
    return blocks, out


def greedy_bound_violations(plan: PsrlPlan, placed: float) -> list[Violation]:
    """Return a `figure` violation when solver.stats.greedy_makespan_s is no number or lies below `placed`,
    the plan's recomputed placement makespan (the loads without cache misses: the greedy's figure is a
    placement's, with DFS orders); the local search only improves on the greedy, and CP-SAT's plan is kept
    only when better. [] otherwise, or when the stats hold no greedy makespan."""
    if plan.solver is None or "greedy_makespan_s" not in plan.solver.stats:
        return []
    greedy = plan.solver.stats["greedy_makespan_s"]
    if isinstance(greedy, bool) or not isinstance(greedy, (int, float)):
        return figure_violations("solver.stats.greedy_makespan_s", greedy, placed)
    if placed <= greedy * (1 + FIGURE_REL_TOL) + FIGURE_ABS_TOL:
        return []
    return [Violation("figure", f"the plan states solver.stats.greedy_makespan_s = {greedy:.6g}, below its own "
                      f"placement's makespan {placed:.6g}; the search only improves on the greedy's placement",
                      {"field": "solver.stats.greedy_makespan_s", "stated": greedy, "recomputed": placed})]


def with_profile(problem: PsrlProblem, profile: Any) -> PsrlProblem:
    """Return the problem with measured worker figures from a profile: each worker whose `gpu` names a
    profiled device type (its name or catalog name; or every worker when the profile measures exactly one
    type) gets that type's measured matmul TFLOP/s in `dtype` (fp32's, else the best, when not measured)
    as peak_tflops (mfu then scales it) and its memory; the fastest measured link sets exchange_GBps.
    Raises InputError when no worker matches a profiled device type."""
    from gpuplan.errors import InputError
    from gpuplan.models.catalog import canonical_name

    def key(name: str | None) -> str | None:
        return (canonical_name(name) or name.lower()) if name else None

    measured: dict[str, Any] = {}
    for d in profile.device_types:
        for n in (d.name, d.catalog_name):
            if key(n):
                measured[key(n)] = d  # type: ignore[index]
    only = profile.device_types[0] if len(profile.device_types) == 1 else None
    workers, used = [], 0
    for w in problem.workers:
        d = measured.get(key(w.gpu) or "") or only
        if d is None:
            workers.append(w)
            continue
        tf = d.matmul_tflops.get(problem.dtype) or d.matmul_tflops.get("fp32") or max(d.matmul_tflops.values(),
                                                                                      default=0.0)
        if tf <= 0:
            workers.append(w)
            continue
        used += 1
        workers.append(w.model_copy(update={"peak_tflops": tf, "memory_bytes": d.memory_bytes}))
    if not used:
        have = ", ".join(d.name for d in profile.device_types) or "none"
        raise InputError(f"the profile measures no device type the workers use (profile: {have}; workers: "
                         f"{', '.join(sorted({w.gpu for w in problem.workers}))})", field="workers")
    update: dict[str, Any] = {"workers": workers}
    links = [ln.bandwidth_GBps for ln in profile.links if ln.bandwidth_GBps > 0]
    if links:
        update["exchange_GBps"] = max(links)
    return problem.model_copy(update=update)
