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
