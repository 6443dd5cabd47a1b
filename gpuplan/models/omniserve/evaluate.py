"""Simulate one OmniServe problem under one policy: the figures a plan predicts and its schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.models.omniserve.costs import Latency, build_latency, build_trace, finite
from gpuplan.models.omniserve.policy import MixedPolicy, PolicyParams, Recorder
from gpuplan.models.omniserve.problem import OmniServeProblem
from gpuplan.sim.serving import BE, LS, SarathiPolicy, SimResult, simulate

MODES = ("omniserve", "headroom", "neo", "sarathi")


@dataclass
class Evaluation:
    """A simulated run: the engine's result, the recorder (schedule, BE tokens in the window), the
    policy object, the figures (see `metrics`) and the length of the measurement window (s)."""

    result: SimResult
    recorder: Recorder
    policy: Any
    figures: dict[str, float]
    window_s: float


def make_policy(problem: OmniServeProblem, lat: Latency, params: PolicyParams) -> Any:
    """Return the policy object of `params.mode` (sarathi: the shared engine's SarathiPolicy, both classes)."""
    if params.mode == "sarathi":
        return SarathiPolicy(lat.sarathi_iteration_s, lat.prefill_attention, problem.kv_capacity_tokens(),
                             token_budget=params.token_budget, max_batch=1024, watermark=params.watermark)
    return MixedPolicy(problem, lat, params)


def run_policy(problem: OmniServeProblem, params: PolicyParams, *, seed: int | None = None,
               ls_rate_per_s: float | None = None, be_rate_per_s: float | None = None,
               record: bool = True, lat: Latency | None = None, lengths_source: str | None = None,
               log_be: bool = False) -> Evaluation:
    """Simulate the problem's LS + BE trace (its seed, or `seed`; optionally other rates) under `params`;
    LS lengths from `lengths_source` when given (see costs.build_trace); `log_be`: the recorder logs BE
    tokens per iteration (Recorder.be_log); return the Evaluation.
    Deterministic: same inputs, same figures and schedule."""
    lat = lat or build_latency(problem)
    trace, _ = build_trace(problem, seed, ls_rate_per_s, be_rate_per_s, lengths_source)
    ls = trace.service == LS
    window = float(trace.arrival_s[ls][-1]) if ls.any() else 0.0
    policy = make_policy(problem, lat, params)
    if hasattr(policy, "record_merges"):
        policy.record_merges = record and problem.schedule_limit > 0
    pools = list(getattr(policy, "pools").names) if hasattr(policy, "pools") else []
    rec = Recorder(policy, window, problem.schedule_limit if record else 0, problem.kv_capacity_tokens(), pools,
                   be_log=[] if log_be else None)
    res = simulate(trace, rec)
    return Evaluation(res, rec, policy, metrics(problem, res, rec, window), window)


def metrics(problem: OmniServeProblem, res: SimResult, rec: Recorder, window_s: float) -> dict[str, float]:
    """Return the predicted figures: LS SLO attainment (fraction of LS requests served within TTFT and
    TPOT SLOs), LS P95 TTFT and TPOT (s), LS rejected by admission control, BE output tokens per second
    within the LS window, BE requests finished, iterations and the window (s)."""
    slo = res.slo(problem.ls.ttft_slo_s, problem.ls.tpot_slo_s, service=LS)
    ls = res.requests.service == LS
    be = res.requests.service == BE
    return {
        "ls_attainment": slo["attainment"],
        "ls_ttft_p95_s": finite(slo["ttft_p_s"]),
        "ls_tpot_p95_s": finite(slo["tpot_p_s"]),
        "ls_rejected": float(np.count_nonzero(res.rejected & ls)),
        "be_output_tokens_per_s": rec.be_tokens / window_s if window_s > 0 else 0.0,
        "be_finished": float(np.count_nonzero(np.isfinite(res.finish_s) & be)),
        "iterations": float(res.iterations),
        "window_s": window_s,
    }


class _PrefillOnly(MixedPolicy):
    """The ceiling's policy: a BE request leaves the engine once its prefill completes (its decode is free)."""

    def _finish_prefills(self, state: Any) -> None:
        super()._finish_prefills(state)
        self.cpu = self.cpu[:0]


def be_prefill_ceiling(problem: OmniServeProblem, params: PolicyParams, *, lat: Latency | None = None,
                       seed: int | None = None) -> dict[str, float]:
    """Return the GPU-prefill ceiling on BE output throughput at the problem's LS load: BE prefill takes
    every token of the budget LS leaves (LS decode > LS prefill > BE prefill, LS admission control as
    `params` states, the token budget and TPOT target of `params`), no BE decode runs on the GPU, and each
    BE request whose prefill completes within the LS window is credited with its whole output at once.

    Every policy here prefills BE prompts on the GPU under LS priority, so none emits more BE tokens in the
    window than the requests it prefilled there hold; this run prefills the most (the GPU does nothing
    else for BE). Keys: `be_output_tokens_per_s` (the ceiling, output tokens/s), `be_prefill_tokens_per_s`
    (BE prompt tokens prefilled per second of the window), `be_prefilled` (requests), `ls_attainment`
    (fraction), `window_s` (s). The bound is a simulation of the same engine, not a formula: it assumes
    nothing about how BE decodes (CPU pools of unlimited memory and pace stand for "decode is free")."""
    doc = problem.document()
    doc["cpu_pools"] = [{"name": "ceiling", "attention_tokens_per_s": 1e13, "memory_bytes": 1e18,
                         "network_gbps": 1e5, "latency_s": 0.0}]
    free = OmniServeProblem.model_validate(doc)
    p = PolicyParams("omniserve", params.token_budget, params.tpot_target_s, 0.0, params.admission,
                     be_batch_max=0, watermark=params.watermark)
    lat = lat or build_latency(problem)
    trace, _ = build_trace(free, seed)
    ls = trace.service == LS
    window = float(trace.arrival_s[ls][-1]) if ls.any() else 0.0
    policy = _PrefillOnly(free, lat, p)
    policy.record_merges = False
    rec = Recorder(policy, window, 0, free.kv_capacity_tokens(), ["ceiling"])
    res = simulate(trace, rec)
    be = (res.requests.service == BE) & np.isfinite(res.ttft_s)
    done = be & (res.requests.arrival_s + np.where(be, res.ttft_s, 0.0) <= window)
    out = float(res.requests.output_tokens[done].sum())
    pre = float(res.requests.prompt_tokens[done].sum())
    slo = res.slo(problem.ls.ttft_slo_s, problem.ls.tpot_slo_s, service=LS)
    w = max(window, 1e-12)
    return {"be_output_tokens_per_s": out / w, "be_prefill_tokens_per_s": pre / w,
            "be_prefilled": float(np.count_nonzero(done)), "ls_attainment": slo["attainment"], "window_s": window}
