"""AuroraRL: sparse-delta weight sync and bandwidth-aware assignment for RL over commodity networks.

A trainer and rollout workers sit in regions joined by links (bandwidth per flow, per-stream cap,
latency); every node has an egress (uplink) capacity. Each RL step the trainer ships the new
weights - a bit-exact sparse delta (or, for the dense baselines, the full checkpoint) - down a
relay tree; relays forward chunks as they arrive. The step's rollout batch is split over the
workers, and transfer overlaps rollout under a staleness bound.

Cost model (our reconstruction of the paper's, see docs/aurora.md):
  edge rate      r_e <= streams * per-stream rate; the child rates of a node sum to at most its
                 uplink, the rates of edges crossing two regions to at most their link (solvers
                 give equal shares); inside a region the link bandwidth is per flow
  arrival        F_c = c/X + sum over path edges (latency_e + b/r_e) + (D - b)/min(X D/dense, R_c)
                 D payload bytes, c dense bytes of a chunk, b = c D/dense bytes of its record,
                 X extraction rate (dense bytes/s), R_c bottleneck rate on the path
  step time      T = max(T_train, gen_i, F_i, (T_train + F_i + gen_i)/(s + 1)) over active workers i,
                 gen_i = n_i * tokens_per_sample / tokens_per_s_i, s the staleness (0 = synchronous)
  ideal          the same with F = 0 (single-datacenter RDMA); gap = T / T_ideal - 1
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuplan.models.base import Problem, Schema, Table, Violation
from gpuplan.models.plan import Plan, figure_violations, same_figure, stated_figures_violations
from gpuplan.models.workload import DTYPE_BYTES, model_config
from gpuplan.registry import ModelSpec, register_model
from gpuplan.units import Bytes, GBps, Seconds

TRAINER = "trainer"
RECORD_HEADER_BYTES = 40  # one chunk record's fixed header in the delta format


class RegionLink(Schema):
    """A link between two regions (or inside one when a == b), with a per-stream cap and a latency.

    Between two regions `bandwidth_GBps` is the capacity all flows crossing it share; inside a
    region it is the bandwidth of each flow (a switched fabric).
    """

    a: str
    b: str
    bandwidth_GBps: GBps = Field(gt=0)
    stream_GBps: GBps | None = Field(default=None, gt=0)
    latency_s: Seconds = Field(default=0.0, ge=0)


class Trainer(Schema):
    """The trainer: its region, egress capacity, time per training step, delta extraction rate, price."""

    region: str
    uplink_GBps: GBps = Field(gt=0)
    train_time_s: Seconds = Field(ge=0)
    extract_GBps: GBps = Field(default=100.0, gt=0)
    price_per_hour: float = Field(default=0.0, ge=0)


class Worker(Schema):
    """A rollout worker (or `count` identical ones named name0, name1, ...)."""

    name: str
    region: str
    tokens_per_s: float = Field(gt=0)
    uplink_GBps: GBps = Field(gt=0)
    price_per_hour: float = Field(default=0.0, ge=0)
    count: int = Field(default=1, ge=1)


class DeltaSpec(Schema):
    """Per-step delta: the changed fraction of elements, or a measured size ratio (dense / delta)."""

    changed_fraction: float = Field(default=0.01, ge=0, le=1)
    measured_ratio: float | None = Field(default=None, gt=0)


class AuroraProblem(Problem):
    """Trainer, workers, region links, the model and the rollout batch of one RL step."""

    kind: Literal["aurora"] = "aurora"
    model: str = "qwen3-8b"
    params: float | None = Field(default=None, gt=0)
    dtype: str = "bf16"
    delta: DeltaSpec = Field(default_factory=DeltaSpec)
    chunk_bytes: Bytes = Field(default=float(1 << 20), gt=0)
    batch_samples: int = Field(ge=1)
    tokens_per_sample: float = Field(gt=0)
    max_staleness: int = Field(default=1, ge=0, le=8)
    max_streams: int = Field(default=8, ge=1, le=64)
    default_stream_GBps: GBps = Field(default=0.0375, gt=0)  # one WAN TCP stream: 300 Mb/s
    objective: Literal["step_time", "tokens_per_dollar"] = "step_time"
    trainer: Trainer
    workers: list[Worker] = Field(min_length=1)
    links: list[RegionLink] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _model_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("params") is None and "model" in data:
            try:
                model_config(str(data["model"]))
            except ValueError as exc:
                raise ValueError(f"at model: {exc}") from None
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "AuroraProblem":
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"at dtype: one of {', '.join(DTYPE_BYTES)}, not {self.dtype!r}")
        names = [n for n, _ in self.nodes()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"at workers: distinct worker names (after count expansion), but {dup} repeat")
        if self.objective == "tokens_per_dollar" and not (self.trainer.price_per_hour
                                                         or any(w.price_per_hour for w in self.workers)):
            raise ValueError("at objective: step_time, or prices (price_per_hour) for tokens_per_dollar")
        regions = {self.trainer.region} | {w.region for w in self.workers}
        have = {frozenset((ln.a, ln.b)) for ln in self.links}
        for a in sorted(regions):
            for b in sorted(regions):
                if a <= b and frozenset((a, b)) not in have:
                    raise ValueError(f"at links: a link for every region pair used, but {a}-{b} is missing")
        return self

    # -- derived figures

    def nodes(self) -> list[tuple[str, Worker]]:
        """Return (name, worker) for every worker after expanding `count`."""
        out = []
        for w in self.workers:
            out += [(w.name, w)] if w.count == 1 else [(f"{w.name}{i}", w) for i in range(w.count)]
        return out

    @cached_property
    def node_map(self) -> dict[str, Worker]:
        """Return worker name -> its Worker entry (computed once)."""
        return dict(self.nodes())

    def worker_names(self) -> list[str]:
        """Return the worker names in order."""
        return [n for n, _ in self.nodes()]

    def n_params(self) -> float:
        """Return the number of parameters (from `params` or the model catalog)."""
        return float(self.params) if self.params else float(model_config(self.model).total_params())

    def dense_bytes(self) -> float:
        """Return the bytes of a full checkpoint in `dtype`."""
        return self.n_params() * DTYPE_BYTES[self.dtype]

    def delta_bytes(self) -> float:
        """Return the bytes of one step's delta: measured ratio, else the Elias-Fano size estimate."""
        if self.delta.measured_ratio:
            return self.dense_bytes() / self.delta.measured_ratio
        return delta_size_bytes(self.n_params(), self.delta.changed_fraction, DTYPE_BYTES[self.dtype],
                                max(1, int(self.chunk_bytes // DTYPE_BYTES[self.dtype])))

    def payload_bytes(self, payload: str) -> float:
        """Return the bytes sent per step for payload 'delta' or 'dense'."""
        return self.delta_bytes() if payload == "delta" else self.dense_bytes()

    @cached_property
    def link_map(self) -> dict[frozenset[str], RegionLink]:
        """Return {region pair: link} (a one-region set for the link inside a region)."""
        return {frozenset((ln.a, ln.b)): ln for ln in self.links}

    def link(self, a: str, b: str) -> RegionLink:
        """Return the link between regions a and b."""
        return self.link_map[frozenset((a, b))]

    def region_of(self, node: str) -> str:
        """Return the region of the trainer or a worker."""
        if node == TRAINER:
            return self.trainer.region
        return self.node_map[node].region

    def uplink(self, node: str) -> float:
        """Return a node's egress capacity in GB/s."""
        return self.trainer.uplink_GBps if node == TRAINER else self.node_map[node].uplink_GBps

    def edge_cap(self, parent: str, child: str, streams: int) -> float:
        """Return the most an edge can carry with `streams` streams, in GB/s (link and stream caps)."""
        ln = self.link(self.region_of(parent), self.region_of(child))
        per = ln.stream_GBps or self.default_stream_GBps
        return min(ln.bandwidth_GBps, streams * per)

    def seconds_per_sample(self, node: str) -> float:
        """Return the rollout seconds one sample takes on a worker."""
        return self.tokens_per_sample / self.node_map[node].tokens_per_s

    def step_tokens(self) -> float:
        """Return the rollout tokens of one step."""
        return self.batch_samples * self.tokens_per_sample


def delta_size_bytes(params: float, changed_fraction: float, value_bytes: int, chunk_elems: int) -> float:
    """Return the expected delta size in bytes with Elias-Fano positions per chunk and raw values.

    Per chunk of n elements with k = rho*n changed: header + ceil(k*L/8) + ceil((k + n/2^L + 1)/8)
    + k*value_bytes, L = floor(log2(n/k)); chunks with no change are skipped.
    """
    n = chunk_elems
    k = changed_fraction * n
    chunks = params / n
    if k <= 0:
        return RECORD_HEADER_BYTES
    if k >= n:
        return chunks * (RECORD_HEADER_BYTES + n * value_bytes)
    low = math.floor(math.log2(n / k))
    per_chunk = RECORD_HEADER_BYTES + k * low / 8 + (k + n / 2 ** low + 1) / 8 + k * value_bytes
    touched = 1 - (1 - changed_fraction) ** n  # fraction of chunks with at least one change
    return chunks * touched * per_chunk


# ---------------------------------------------------------------- the plan

class Edge(BaseModel):
    """Who sends to whom, on how many parallel streams, at what rate (GB/s)."""

    model_config = ConfigDict(extra="forbid")

    parent: str
    child: str
    streams: int
    rate_GBps: float


class AuroraPlan(Plan):
    """A relay tree with streams and rates, the rollout split, the staleness and the arrival times."""

    kind: str = "aurora"
    payload: str = "delta"
    payload_bytes: float = 0.0
    edges: list[Edge] = Field(default_factory=list)
    rollout: dict[str, int] = Field(default_factory=dict)
    staleness: int = 0
    arrival_s: dict[str, float] = Field(default_factory=dict)


# ---------------------------------------------------------------- cost model

def extraction(problem: AuroraProblem, payload_bytes: float) -> tuple[float, float, float]:
    """Return (seconds to extract the first chunk, extraction rate in payload bytes/s, record bytes)."""
    dense = problem.dense_bytes()
    X = problem.trainer.extract_GBps * 1e9
    chunk = min(problem.chunk_bytes, dense)
    share = payload_bytes / dense
    return chunk / X, X * share, chunk * share


def arrival_times(problem: AuroraProblem, edges: list[Edge], payload_bytes: float) -> dict[str, float]:
    """Return the time (s) each worker in the tree holds the whole payload (pipelined relays).

    F_c = c/X + sum_path(latency + b/r) + (D - b)/min(X*D/dense, bottleneck rate), with c the dense
    bytes of a chunk, b = c*D/dense the bytes of its record and X the extraction rate in dense
    bytes/s; raises ValueError when the edges do not form a tree rooted at the trainer.
    """
    parent = {e.child: e for e in edges}
    first, Xp, b = extraction(problem, payload_bytes)
    out: dict[str, float] = {}
    memo: dict[str, tuple[float, float]] = {TRAINER: (first, Xp)}

    def visit(node: str, depth: int) -> tuple[float, float]:  # (path seconds, bottleneck B/s)
        if node in memo:
            return memo[node]
        if depth > len(parent):
            raise ValueError(f"the edges form a cycle through {node!r}")
        e = parent.get(node)
        if e is None:
            raise ValueError(f"worker {node!r} has no parent edge")
        path, bott = visit(e.parent, depth + 1)
        rate = e.rate_GBps * 1e9
        if rate <= 0:
            memo[node] = (math.inf, 0.0)
        else:
            lat = problem.link(problem.region_of(e.parent), problem.region_of(node)).latency_s
            memo[node] = (path + lat + b / rate, min(bott, rate))
        return memo[node]

    for child in parent:
        path, bott = visit(child, 0)
        out[child] = path + (payload_bytes - b) / bott if bott > 0 else math.inf
    return out


def step_time(problem: AuroraProblem, arrival: dict[str, float], rollout: dict[str, int], staleness: int) -> float:
    """Return the steady-state RL step time (s): T = max(T_train, gen_i, F_i, (T_train+F_i+gen_i)/(s+1))."""
    t_train = problem.trainer.train_time_s
    t = t_train
    for w, n in rollout.items():
        if n <= 0:
            continue
        gen = n * problem.seconds_per_sample(w)
        f = arrival.get(w, math.inf)
        t = max(t, gen, f, (t_train + f + gen) / (staleness + 1))
    return t


def max_samples(problem: AuroraProblem, worker: str, arrival_s: float, t: float, staleness: int) -> int:
    """Return the most samples `worker` can roll out in a step of length t (0 if its arrival exceeds t)."""
    if arrival_s > t * (1 + 1e-12):
        return 0
    budget = min(t, (staleness + 1) * t - problem.trainer.train_time_s - arrival_s)
    if budget < 0:
        return 0
    return int(math.floor(budget / problem.seconds_per_sample(worker) * (1 + 1e-12)))


def best_split(problem: AuroraProblem, arrival: dict[str, float], staleness: int,
               workers: list[str] | None = None) -> tuple[float, dict[str, int]]:
    """Return (step time, samples per worker) minimising T for fixed arrivals (water-filling, exact).

    The smallest T at which sum_i max_samples_i(T) >= batch is found by bisection on T, then the
    batch is assigned greedily in worker order up to each cap. Raises ValueError when no worker
    is reachable.
    """
    workers = [w for w in (workers if workers is not None else list(arrival)) if math.isfinite(arrival.get(w, math.inf))]
    if not workers:
        raise ValueError("no worker receives the weights")
    B = problem.batch_samples

    def total(t: float) -> int:
        return sum(max_samples(problem, w, arrival[w], t, staleness) for w in workers)

    lo = problem.trainer.train_time_s
    hi = max(lo, 1.0)
    while total(hi) < B:
        hi *= 2
        if hi > 1e12:
            raise ValueError("the batch cannot be split (no finite step time)")
    if total(lo) >= B:
        hi = lo
    for _ in range(200):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if total(mid) >= B:
            hi = mid
        else:
            lo = mid
    left, split = B, {}
    caps = {w: max_samples(problem, w, arrival[w], hi, staleness) for w in workers}
    for w in sorted(workers, key=lambda w: (problem.seconds_per_sample(w), arrival[w], w)):
        take = min(left, caps[w])
        if take:
            split[w] = take
            left -= take
    return step_time(problem, arrival, split, staleness), split


def ideal_step_time(problem: AuroraProblem, staleness: int) -> float:
    """Return the step time with instant weight transfer (ideal single-datacenter RDMA), every worker used."""
    return best_split(problem, {w: 0.0 for w in problem.worker_names()}, staleness)[0]


def edge_rate(problem: AuroraProblem, parent: str, child: str, fanout: int, crossing: int = 1,
              streams: int | None = None) -> float:
    """Return an edge's rate in GB/s under the sharing rule: min(stream cap, uplink / fan-out,
    inter-region capacity / edges crossing that region pair); a link inside a region is per flow."""
    rate = min(problem.edge_cap(parent, child, streams or problem.max_streams), problem.uplink(parent) / max(1, fanout))
    a, b = problem.region_of(parent), problem.region_of(child)
    if a != b:
        rate = min(rate, problem.link(a, b).bandwidth_GBps / max(1, crossing))
    return rate


def crossings(problem: AuroraProblem, pairs: list[tuple[str, str]]) -> dict[frozenset[str], int]:
    """Return how many of the (parent, child) edges cross each inter-region pair."""
    out: dict[frozenset[str], int] = {}
    for p, c in pairs:
        a, b = problem.region_of(p), problem.region_of(c)
        if a != b:
            out[frozenset((a, b))] = out.get(frozenset((a, b)), 0) + 1
    return out


def tree_edges(problem: AuroraProblem, tree: dict[str, str], streams: int | None = None) -> list[Edge]:
    """Return the edges of a tree (child -> parent) with shared rates and the fewest streams.

    `streams` fixes the stream count of every edge (the baselines); by default each edge gets the
    fewest streams that reach its share. Rates never exceed the streams, the parent's uplink share
    or the share of an inter-region link among the edges crossing it.
    """
    fanout: dict[str, int] = {}
    for p in tree.values():
        fanout[p] = fanout.get(p, 0) + 1
    cross = crossings(problem, [(p, c) for c, p in tree.items()])
    order = {w: i for i, w in enumerate(problem.worker_names())}
    edges = []
    for c in sorted(tree, key=order.__getitem__):
        p = tree[c]
        m = cross.get(frozenset((problem.region_of(p), problem.region_of(c))), 1)
        if streams is None:
            rate = edge_rate(problem, p, c, fanout[p], m)
            s = streams_needed(problem, p, c, rate)
        else:
            s = min(streams, problem.max_streams)
            rate = edge_rate(problem, p, c, fanout[p], m, streams=s)
        edges.append(Edge(parent=p, child=c, streams=s, rate_GBps=rate))
    return edges


def streams_needed(problem: AuroraProblem, parent: str, child: str, rate_GBps: float) -> int:
    """Return the fewest streams (<= max_streams) whose capacity reaches min(rate, link bandwidth)."""
    ln = problem.link(problem.region_of(parent), problem.region_of(child))
    per = ln.stream_GBps or problem.default_stream_GBps
    want = min(rate_GBps, ln.bandwidth_GBps)
    return max(1, min(problem.max_streams, math.ceil(want / per - 1e-9)))


def metrics(problem: AuroraProblem, plan: AuroraPlan) -> dict[str, float]:
    """Return the predicted figures of a plan: step time (s), tokens/s, tokens per dollar, transfer time
    (s), the part of it the step waits for and the fraction hidden under rollout, the gap to ideal."""
    arrival = arrival_times(problem, plan.edges, plan.payload_bytes)
    t = step_time(problem, arrival, plan.rollout, plan.staleness)
    ideal = ideal_step_time(problem, problem.max_staleness)
    used = {e.child for e in plan.edges}
    price = problem.trainer.price_per_hour + sum(w.price_per_hour for n, w in problem.nodes() if n in used)
    tokens = problem.step_tokens()
    active = [w for w, n in plan.rollout.items() if n > 0]
    transfer = max((arrival[w] for w in active), default=0.0)
    # the part of the transfer the step waits for: this split with weights that arrive instantly
    exposed = t - step_time(problem, {w: 0.0 for w in arrival}, plan.rollout, plan.staleness)
    out = {
        "step_time_s": t,
        "tokens_per_s": tokens / t,
        "transfer_s": transfer,
        "exposed_transfer_s": exposed,
        "overlap_fraction": 1 - exposed / transfer if transfer > 0 else 1.0,
        "ideal_step_s": ideal,
        "gap_to_ideal": t / ideal - 1,
        "payload_bytes": plan.payload_bytes,
        "workers_used": float(len(used)),
    }
    if price > 0:
        out["tokens_per_dollar"] = tokens / (t * price / 3600)
    return out


def objective_value(problem: AuroraProblem, m: dict[str, float]) -> float:
    """Return the figure the problem's objective minimises (step time, or minus tokens per dollar)."""
    if problem.objective == "step_time":
        return m["step_time_s"]
    return -m.get("tokens_per_dollar", 0.0)


def finish_plan(problem: AuroraProblem, plan: AuroraPlan) -> AuroraPlan:
    """Fill arrivals, the smallest staleness that keeps the step time, predicted figures and objective."""
    arrival = arrival_times(problem, plan.edges, plan.payload_bytes)
    t = step_time(problem, arrival, plan.rollout, plan.staleness)
    for s in range(plan.staleness + 1):
        if step_time(problem, arrival, plan.rollout, s) <= t * (1 + 1e-12):
            plan.staleness = s
            break
    plan.arrival_s = {w: arrival[w] for w in problem.worker_names() if w in arrival}
    plan.predicted = metrics(problem, plan)
    plan.objective = objective_value(problem, plan.predicted)
    plan.objective_name = "step_time_s" if problem.objective == "step_time" else "-tokens_per_dollar"
    return plan


# ---------------------------------------------------------------- check

def check(problem: AuroraProblem, plan: AuroraPlan) -> list[Violation]:
    """Return the violations of `plan`: tree shape, streams, link and uplink capacities, the batch split,
    staleness, payload size and predicted step time (recomputed from the cost model)."""
    out: list[Violation] = []
    names = set(problem.worker_names())
    tol = 1e-6
    seen: dict[str, str] = {}
    known: list[Edge] = []  # edges whose ends are both trainer or workers
    for e in plan.edges:
        if e.child not in names:
            out.append(Violation("unknown_node", f"edge to {e.child!r}, which is not a worker", {"child": e.child}))
            continue
        if e.parent != TRAINER and e.parent not in names:
            out.append(Violation("unknown_node", f"edge from {e.parent!r}, neither trainer nor worker",
                                 {"parent": e.parent}))
            continue
        known.append(e)
        if e.child in seen:
            out.append(Violation("two_parents", f"{e.child} receives from {seen[e.child]} and {e.parent}"))
        seen[e.child] = e.parent
        if not 1 <= e.streams <= problem.max_streams:
            out.append(Violation("streams", f"{e.parent}->{e.child} uses {e.streams} streams; "
                                 f"allowed 1..{problem.max_streams}", {"streams": e.streams}))
        cap = problem.edge_cap(e.parent, e.child, max(1, e.streams))
        if e.rate_GBps > cap * (1 + tol) or e.rate_GBps <= 0:
            out.append(Violation("edge_rate", f"{e.parent}->{e.child} at {e.rate_GBps:.4g} GB/s; its link and "
                                 f"{e.streams} streams carry at most {cap:.4g} GB/s", {"cap": cap}))
    crossing: dict[frozenset[str], float] = {}
    sent: dict[str, float] = {}
    for e in known:
        pair = frozenset((problem.region_of(e.parent), problem.region_of(e.child)))
        if len(pair) == 2:
            crossing[pair] = crossing.get(pair, 0.0) + e.rate_GBps
        sent[e.parent] = sent.get(e.parent, 0.0) + e.rate_GBps
    for pair, total in crossing.items():
        cap = problem.link(*sorted(pair)).bandwidth_GBps
        if total > cap * (1 + tol):
            out.append(Violation("region_link", f"edges between {' and '.join(sorted(pair))} carry "
                                 f"{total:.4g} GB/s in all; the link between them carries {cap:.4g} GB/s"))
    for node, total in sent.items():
        if total > problem.uplink(node) * (1 + tol):
            out.append(Violation("uplink", f"{node} sends {total:.4g} GB/s in all; its uplink is "
                                 f"{problem.uplink(node):.4g} GB/s", {"node": node}))
    for child in seen:  # every receiver must reach the trainer without a cycle
        node, hops = child, 0
        while node != TRAINER and node in seen and hops <= len(seen):
            node, hops = seen[node], hops + 1
        if node != TRAINER:
            out.append(Violation("not_a_tree", f"{child} does not receive from the trainer through a chain "
                                 "of relays (a cycle or a missing parent)", {"worker": child}))
    if sum(plan.rollout.values()) != problem.batch_samples:
        out.append(Violation("batch", f"rollout split sums to {sum(plan.rollout.values())}, the batch is "
                             f"{problem.batch_samples} samples"))
    for w, n in plan.rollout.items():
        if n < 0 or (n > 0 and w not in seen):
            out.append(Violation("rollout_worker", f"{n} samples on {w!r}, which does not receive the weights"
                                 if n > 0 else f"negative samples on {w!r}", {"worker": w, "samples": n}))
    if not 0 <= plan.staleness <= problem.max_staleness:
        out.append(Violation("staleness", f"staleness {plan.staleness}; allowed 0..{problem.max_staleness}"))
    if plan.payload not in ("delta", "dense"):
        out.append(Violation("payload", f"payload {plan.payload!r}; expected delta or dense"))
    elif plan.payload_bytes < problem.payload_bytes(plan.payload) * (1 - tol):
        out.append(Violation("payload", f"payload of {plan.payload_bytes:.4g} B is below the {plan.payload} "
                             f"size {problem.payload_bytes(plan.payload):.4g} B"))
    if out:
        return out
    m = metrics(problem, plan)
    claimed = plan.predicted.get("step_time_s")
    if claimed is not None and not same_figure(claimed, m["step_time_s"]):
        out.append(Violation("prediction", f"plan predicts a step of {claimed:.6g} s; the cost model gives "
                             f"{m['step_time_s']:.6g} s"))
    return out + _check_figures(problem, plan, m)


def _check_figures(problem: AuroraProblem, plan: AuroraPlan, m: dict[str, float]) -> list[Violation]:
    """Return violations of the figures the plan states besides the step time: each worker's arrival
    time (s) through the tree, every other predicted metric and the objective, recomputed from the
    cost model; and a rollout entry for a worker outside the problem."""
    out: list[Violation] = []
    arrival = arrival_times(problem, plan.edges, plan.payload_bytes)
    expected = {w: arrival[w] for w in problem.worker_names() if w in arrival}
    if set(plan.arrival_s) != set(expected):
        out.append(Violation("figure", f"the plan states arrival times for {sorted(plan.arrival_s)}; the tree "
                             f"delivers to {sorted(expected)}", {"field": "arrival_s"}))
    else:
        out += figure_violations("arrival_s", plan.arrival_s, expected)
    unknown = sorted(set(plan.rollout) - set(problem.worker_names()))
    if unknown:
        out.append(Violation("rollout_worker", f"rollout on {unknown}, which are not workers of the problem",
                             {"workers": unknown}))
    rest = {k: v for k, v in m.items() if k != "step_time_s"}   # the step time is reported above
    objective = objective_value(problem, m) if plan.objective is not None or plan.solver is not None else None
    return out + stated_figures_violations(plan, objective, rest)


# ---------------------------------------------------------------- summaries

def summarize(problem: AuroraProblem, plan: AuroraPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare aurora` prints for a plan."""
    p = plan.predicted
    depth = 0
    parent = {e.child: e.parent for e in plan.edges}
    for c in parent:
        d, node = 0, c
        while node != TRAINER and d <= len(parent):
            node, d = parent.get(node, TRAINER), d + 1
        depth = max(depth, d)
    out = {"payload": plan.payload, "payload_MB": plan.payload_bytes / 1e6, "transfer_s": p.get("transfer_s"),
           "step_time_s": p.get("step_time_s"), "tokens_per_s": p.get("tokens_per_s"),
           "gap_to_ideal": p.get("gap_to_ideal"), "tree_depth": depth, "staleness": plan.staleness}
    if "tokens_per_dollar" in p:
        out["tokens_per_dollar"] = p["tokens_per_dollar"]
    return out


def describe(problem: AuroraProblem, plan: AuroraPlan) -> list[Table]:
    """Return the relay tree and the rollout split as tables for `gpuplan show`."""
    rows = []
    for e in plan.edges:
        rows.append([e.parent, e.child, problem.region_of(e.child), e.streams, e.rate_GBps * 8,
                     plan.arrival_s.get(e.child), plan.rollout.get(e.child, 0)])
    return [Table(f"relay tree ({plan.payload}, {plan.payload_bytes / 1e6:.1f} MB per step, staleness "
                  f"{plan.staleness})", ["from", "to", "region", "streams", "Gb/s", "arrival_s", "samples"], rows)]


def draw(problem: AuroraProblem, plan: AuroraPlan, path: Any) -> None:
    """Write a PNG of each worker's arrival time and rollout time within the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.viz import PALETTE, legend_outside, relay_tree

    names = problem.worker_names()
    fig, (tree_ax, ax) = plt.subplots(1, 2, figsize=(16, 0.45 * len(names) + 2.2))
    nodes = [TRAINER] + names
    relay_tree(tree_ax, [(e.parent, e.child, e.rate_GBps * 8) for e in plan.edges], plan.arrival_s,
               {n: problem.region_of(n) for n in nodes}, TRAINER)
    for i, w in enumerate(names):
        f = plan.arrival_s.get(w, 0.0)
        gen = plan.rollout.get(w, 0) * problem.seconds_per_sample(w)
        ax.barh(i - 0.2, f, height=0.4, color=PALETTE["comm"], label="weights arrive (transfer)" if i == 0 else None)
        ax.barh(i + 0.2, gen, height=0.4, left=0 if plan.staleness else f, color=PALETTE["forward"],
                label="rollout (generation)" if i == 0 else None)
    ax.axvline(plan.predicted.get("step_time_s", 0), color="k", ls="--", label="step time")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("time within the step (s)")
    ax.set_title(f"{problem.name or 'aurora'}: weight arrival and rollout per worker (staleness {plan.staleness})")
    legend_outside(ax)
    fig.tight_layout()
    from gpuplan.io import atomic_write_figure

    atomic_write_figure(fig, path, dpi=100)


def with_profile(problem: AuroraProblem, profile: Any) -> AuroraProblem:
    """Return the problem with measured link bandwidths and latencies from a profile.

    A profile link between nodes named like two regions (or a node with itself, for the link inside
    a region) replaces that region link's bandwidth and latency; the per-stream cap is kept (and
    lowered to the measured bandwidth when above it). Raises InputError when no link matches.
    """
    from gpuplan.errors import InputError

    measured = {frozenset((ln.a, ln.b)): ln for ln in profile.links}
    links, used = [], 0
    for ln in problem.links:
        m = measured.get(frozenset((ln.a, ln.b)))
        if m is None:
            links.append(ln)
            continue
        used += 1
        stream = min(ln.stream_GBps, m.bandwidth_GBps) if ln.stream_GBps else None
        links.append(ln.model_copy(update={"bandwidth_GBps": m.bandwidth_GBps, "latency_s": m.latency_s,
                                           "stream_GBps": stream}))
    if not used:
        have = ", ".join(sorted(f"{ln.a}-{ln.b}" for ln in profile.links)) or "none"
        raise InputError(f"the profile measures no link between the problem's regions (profile links: {have}; "
                         "name profiled nodes like the regions)", field="links")
    return problem.model_copy(update={"links": links})


register_model(ModelSpec("aurora", AuroraProblem, AuroraPlan, check, summarize=summarize, describe=describe,
                         draw=draw, runner="gpuplan.runtime.aurora_net:run_plan", with_profile=with_profile,
                         title="AuroraRL: sparse-delta weight sync and bandwidth-aware assignment"))
