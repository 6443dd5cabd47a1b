"""OmniServe (SIGMOD'26): LS and BE LLM services on shared GPUs, BE attention piggybacked from CPU pools.

The problem (problem.py): one tensor-parallel GPU engine, CPU pools (host and remote servers) with an
attention rate and memory for BE KV, the model, an LS service (ShareGPT lengths, TTFT/TPOT SLOs) and a
BE service (LongBench-like long prompts). A plan states a policy and its parameters; `check`
re-simulates it with the problem's seed and compares every figure, and checks the explicit schedule of
the first iterations against the paper's constraints (a BE request advances at most one layer per
iteration, GPU and pool memory, the LS admission rule). See docs/omniserve.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from gpuplan.models.base import Violation
from gpuplan.models.omniserve.costs import MAX_BUDGET, build_latency, build_trace
from gpuplan.models.omniserve.evaluate import MODES, Evaluation, run_policy
from gpuplan.models.omniserve.policy import PolicyParams, admission_floor_s, admission_forecast
from gpuplan.models.omniserve.problem import OmniServeProblem
from gpuplan.models.plan import Plan, figure_violations, stated_figures_violations
from gpuplan.registry import ModelSpec, register_model
from gpuplan.sim.serving import BE, LS

SOLVER_MODE = {"omniserve": "omniserve", "omniserve-pass": "omniserve", "headroom": "headroom", "neo": "neo",
               "sarathi": "sarathi"}


class IterationRow(BaseModel):
    """One iteration of the explicit schedule: start and length (s), LS decodes, LS and BE prefill
    tokens, BE tokens emitted, piggyback merges [request, layer], GPU KV tokens held, pool KV bytes."""

    model_config = ConfigDict(extra="forbid")

    start_s: float
    duration_s: float
    ls_decodes: int = 0
    ls_prefill_tokens: int = 0
    be_prefill_tokens: int = 0
    be_decodes: int = 0
    merges: list[list[int]] = Field(default_factory=list)
    gpu_kv_tokens: int = 0
    pool_kv_bytes: list[float] = Field(default_factory=list)


class OmniServePlan(Plan):
    """The policy and its parameters, the pools it uses, and the explicit schedule of the first
    iterations with the LS admission decisions taken in them."""

    kind: str = "omniserve"
    policy: str = ""
    token_budget: int = 0
    tpot_target_s: float = 0.0
    be_gpu_fraction: float = 0.0
    admission: bool = False
    be_batch_max: int = 0
    pace_factor: float = 1.0
    watermark: float = 0.01
    layers_per_iteration: int = 1
    be_inflight_max: int = 0
    be_prefill_max: int = 0
    pools: list[str] = Field(default_factory=list)
    admissions: list[list[float]] = Field(default_factory=list)
    schedule: list[IterationRow] = Field(default_factory=list)


def params_of(plan: OmniServePlan) -> PolicyParams:
    """Return the policy parameters a plan states."""
    return PolicyParams(plan.policy, plan.token_budget, plan.tpot_target_s, plan.be_gpu_fraction, plan.admission,
                        plan.be_batch_max, plan.pace_factor, plan.watermark, plan.layers_per_iteration,
                        plan.be_inflight_max, plan.be_prefill_max)


def fill_plan(problem: OmniServeProblem, plan: OmniServePlan, stats: dict[str, Any] | None = None,
              ev: Evaluation | None = None) -> OmniServePlan:
    """Simulate the plan's policy (or take `ev`, a recorded `run_policy` of exactly the plan's parameters
    on this problem, already simulated); fill its pools, schedule, admissions, predicted figures and
    objective (BE output tokens per second within the LS window). `stats` (when given) receives the
    controller's mean and P99 decision time per iteration (s; measured, so not a predicted figure)."""
    ev = ev if ev is not None else run_policy(problem, params_of(plan))
    d = getattr(ev.policy, "decision_s", [])
    if stats is not None and d:
        import numpy as np

        stats.update({"decision_mean_s": float(np.mean(d)), "decision_p99_s": float(np.percentile(d, 99))})
    plan.pools = list(ev.recorder.pool_names)
    plan.schedule = [IterationRow(**row) for row in ev.recorder.schedule]
    adm = getattr(ev.policy, "admissions", [])
    plan.admissions = [list(a) for a in adm if a[1] <= _recorded_until(ev.recorder.schedule)]
    plan.predicted = ev.figures
    plan.objective = ev.figures["be_output_tokens_per_s"]
    plan.objective_name = "be_output_tokens_per_s"
    return plan


def _recorded_until(schedule: list[dict[str, Any]] | list[IterationRow]) -> float:
    if not schedule:
        return -1.0
    last = schedule[-1]
    return float(last["start_s"] if isinstance(last, dict) else last.start_s)


# ---------------------------------------------------------------- check

def _param_violations(problem: OmniServeProblem, plan: OmniServePlan) -> list[Violation]:
    out: list[Violation] = []
    if plan.policy not in MODES:
        out.append(Violation("policy", f"policy {plan.policy!r}; expected one of {', '.join(MODES)}"))
    if plan.solver is not None and SOLVER_MODE.get(plan.solver.name, plan.policy) != plan.policy:
        out.append(Violation("policy", f"solver {plan.solver.name!r} runs policy {SOLVER_MODE[plan.solver.name]!r}, "
                             f"the plan states {plan.policy!r}"))
    if not 1 <= plan.token_budget <= MAX_BUDGET:
        out.append(Violation("token_budget", f"token budget {plan.token_budget}; expected 1..{MAX_BUDGET}"))
    if not 0 < plan.tpot_target_s <= problem.ls.tpot_slo_s:
        out.append(Violation("tpot_target", f"TPOT target {plan.tpot_target_s} s; expected in (0, "
                             f"{problem.ls.tpot_slo_s}] (the LS TPOT SLO)"))
    if not 0 <= plan.be_gpu_fraction <= 1:
        out.append(Violation("be_gpu_fraction", f"BE share of GPU KV memory {plan.be_gpu_fraction}; expected 0..1"))
    if not 0 <= plan.be_batch_max <= 100_000:
        out.append(Violation("be_batch_max", f"BE batch bound {plan.be_batch_max}; expected 0..100000"))
    if not 0 <= plan.be_inflight_max <= 100_000 or (plan.be_inflight_max and plan.policy != "omniserve"):
        out.append(Violation("be_inflight_max", f"bound on BE in flight on CPU pools {plan.be_inflight_max}; expected "
                             "0..100000 (0: none; only for policy omniserve)"))
    if not 0 <= plan.be_prefill_max <= MAX_BUDGET or (plan.be_prefill_max and plan.policy != "omniserve"):
        out.append(Violation("be_prefill_max", f"bound on BE prefill tokens per iteration {plan.be_prefill_max}; "
                             f"expected 0..{MAX_BUDGET} (0: none; only for policy omniserve)"))
    if not 0 < plan.pace_factor <= 100 or not 0 <= plan.watermark <= 0.5:
        out.append(Violation("pace", f"pace factor {plan.pace_factor} (0..100) or watermark {plan.watermark} "
                             "(0..0.5) out of range"))
    if not 1 <= plan.layers_per_iteration <= problem.layers() or (plan.layers_per_iteration > 1
                                                                  and plan.policy != "omniserve"):
        out.append(Violation("layers_per_iteration", f"{plan.layers_per_iteration} layers per iteration; expected "
                             f"1..{problem.layers()} (more than 1 only for policy omniserve)"))
    if plan.admission and plan.policy != "omniserve":
        out.append(Violation("admission", f"LS admission control is OmniServe's; policy {plan.policy!r} has none"))
    known = set(problem.pool_names())
    if any(p not in known for p in plan.pools):
        out.append(Violation("pools", f"the plan uses pools {plan.pools}; the problem has {sorted(known)}"))
    return out


def schedule_violations(problem: OmniServeProblem, plan: OmniServePlan) -> list[Violation]:
    """Return violations of the paper's constraints in the stated schedule, independent of any simulation:
    a BE request advanced more layers in one iteration than the plan's layers_per_iteration (1: once), or
    at a layer other than the one after its last merge, merges outside OmniServe, GPU KV over the cache, a pool's KV
    over its memory, iterations that do not follow one another."""
    out: list[Violation] = []
    L = problem.layers()
    cap = problem.kv_capacity_tokens()
    mem = {n: p.memory_bytes for n, p in problem.pools()}
    n_ls, n_be = problem.ls.requests, problem.be.requests
    last: dict[int, int] = {}
    prev_end = None
    lat = build_latency(problem)
    for k, row in enumerate(plan.schedule):
        if not (row.duration_s > 0):
            out.append(Violation("iteration", f"iteration {k} lasts {row.duration_s} s; expected > 0"))
        if row.merges and all(len(m) == 2 and 0 <= m[1] < L for m in row.merges):
            # the merges alone take the dense modules at their rows per layer plus the piggyback
            # overhead (T_k with no other tokens; more tokens only add time)
            per_layer = np.bincount([m[1] for m in row.merges], minlength=L).astype(float)
            least = lat.iteration_s(0, 0.0, 0.0, per_layer)
            if row.duration_s < least * (1 - 1e-9):
                out.append(Violation("iteration", f"iteration {k} lasts {row.duration_s:.6g} s; its "
                                     f"{len(row.merges)} piggybacked BE rows alone take {least:.6g} s in the "
                                     "latency model", {"iteration": k}))
        if prev_end is not None and abs(row.start_s - prev_end) > 1e-9 * max(1.0, prev_end) and row.start_s < prev_end:
            out.append(Violation("iteration", f"iteration {k} starts at {row.start_s} s, before the previous "
                                 f"one ends ({prev_end} s)"))
        prev_end = row.start_s + row.duration_s
        if row.gpu_kv_tokens > cap:
            out.append(Violation("gpu_memory", f"iteration {k}: {row.gpu_kv_tokens:,} KV tokens on the GPU; the "
                                 f"cache holds {cap:,}", {"iteration": k}))
        if len(row.pool_kv_bytes) != len(plan.pools):
            out.append(Violation("pool_memory", f"iteration {k} states KV of {len(row.pool_kv_bytes)} pools; the "
                                 f"plan uses {len(plan.pools)}", {"iteration": k}))
        for name, used in zip(plan.pools, row.pool_kv_bytes):
            if name in mem and used > mem[name] * (1 + 1e-9):
                out.append(Violation("pool_memory", f"iteration {k}: pool {name} holds {used:.4g} B of BE KV; its "
                                     f"memory is {mem[name]:.4g} B", {"iteration": k, "pool": name}))
        if row.merges and plan.policy != "omniserve":
            out.append(Violation("merge", f"iteration {k} piggybacks BE rows under policy {plan.policy!r}"))
        steps: dict[int, int] = {}
        for m in row.merges:
            if len(m) != 2:
                out.append(Violation("merge", f"iteration {k}: merge {m!r}; expected [request, layer]"))
                continue
            i, lay = m
            if not 0 <= lay < L:
                out.append(Violation("merge", f"iteration {k}: request {i} merged at layer {lay}; the model has "
                                     f"{L} layers"))
            if not 0 <= i < n_ls + n_be:
                out.append(Violation("merge", f"iteration {k}: request {i} is not in the trace"))
            steps[i] = steps.get(i, 0) + 1
            if steps[i] > plan.layers_per_iteration:
                out.append(Violation("be_two_layers", f"iteration {k}: BE request {i} advances {steps[i]} layers; "
                                     f"the plan allows {plan.layers_per_iteration} per iteration",
                                     {"iteration": k, "request": i}))
            elif steps[i] > 1 and lay != last[i] + 1:
                out.append(Violation("be_two_layers", f"iteration {k}: BE request {i} merged at layer {lay} after "
                                     f"layer {last[i]} in the same pass (layers follow one another, and a token's "
                                     "last layer ends the pass)", {"iteration": k, "request": i}))
            elif steps[i] == 1 and i in last and lay != (last[i] + 1) % L:
                out.append(Violation("be_two_layers", f"iteration {k}: BE request {i} merged at layer {lay} after "
                                     f"layer {last[i]} (a request advances one layer at a time)",
                                     {"iteration": k, "request": i}))
            last[i] = lay
    return out


def knob_violations(problem: OmniServeProblem, plan: OmniServePlan) -> list[Violation]:
    """Return where the stated schedule breaks the plan's own policy knobs, independently of any simulation:
    under omniserve, an iteration's BE decode batch (GPU-resident BE decodes plus the BE requests merged)
    above be_batch_max, or more BE requests in flight on the pools than be_inflight_max (a request is in
    flight at least from its first merge to its last); under any policy with pools, a pool's reserved BE
    KV above what the pace rule admits (pace_factor x its attention rate x the TPOT target, in KV tokens
    per layer-step, times the KV bytes per token)."""
    out: list[Violation] = []
    L = problem.layers()
    if plan.policy == "omniserve":
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for k, row in enumerate(plan.schedule):
            ids = {m[0] for m in row.merges if len(m) == 2}
            # be_decodes counts GPU-resident BE decodes and the merged requests that emit (at the last layer)
            emitted = {m[0] for m in row.merges if len(m) == 2 and m[1] == L - 1}
            batch = row.be_decodes - len(emitted) + len(ids)
            if batch > plan.be_batch_max and not any(v.code == "be_batch" for v in out):
                out.append(Violation("be_batch", f"iteration {k} decodes a BE batch of {batch} (GPU-resident BE "
                                     f"decodes and piggybacked requests); be_batch_max is {plan.be_batch_max}",
                                     {"iteration": k}))
            for i in ids:
                first.setdefault(i, k)
                last[i] = k
        if plan.be_inflight_max and first:
            change = np.zeros(len(plan.schedule) + 1, dtype=np.int64)
            for i, k in first.items():
                change[k] += 1
                change[last[i] + 1] -= 1
            held = np.cumsum(change)
            k = int(np.argmax(held))
            if held[k] > plan.be_inflight_max:
                out.append(Violation("be_inflight", f"iteration {k}: {int(held[k])} BE requests are decoding from the "
                                     f"CPU pools (between their first and last merge); be_inflight_max is "
                                     f"{plan.be_inflight_max}", {"iteration": k}))
    pools = dict(problem.pools())
    kvb = problem.kv_bytes_per_token()
    for k, row in enumerate(plan.schedule):
        for name, used in zip(plan.pools, row.pool_kv_bytes):
            if name not in pools:
                continue
            paced = plan.pace_factor * pools[name].attention_tokens_per_s * plan.tpot_target_s * kvb
            if used > paced * (1 + 1e-9):
                return out + [Violation("pace", f"iteration {k}: pool {name} holds {used:.4g} B of BE KV; pace factor "
                                        f"{plan.pace_factor} admits {paced:.4g} B (pace x attention rate x TPOT target "
                                        "x KV bytes per token)", {"iteration": k, "pool": name})]
    return out


def admission_violations(problem: OmniServeProblem, plan: OmniServePlan) -> list[Violation]:
    """Return violations of the LS admission rule in the stated decisions: each forecast recomputed from
    its own inputs; an admitted request needs a forecast within the TTFT SLO, a rejected one beyond it."""
    out: list[Violation] = []
    if plan.admissions and not plan.admission:
        out.append(Violation("ls_admission", "the plan states admission decisions but no admission control"))
    trace, _ = build_trace(problem)
    lat = build_latency(problem)
    for a in plan.admissions:
        if len(a) != 8:
            out.append(Violation("ls_admission", f"admission record {a!r}; expected 8 numbers"))
            continue
        i, t, need, per_iter, t_est, waited, forecast, ok = a
        if not (float(i).is_integer() and 0 <= i < len(trace)) or trace.service[int(i)] != LS:
            out.append(Violation("ls_admission", f"admission record for request {i}, not an LS request of the trace"))
            continue
        floor = admission_floor_s(lat, per_iter, need, plan.tpot_target_s) if per_iter >= 1 and need >= 1 else 0.0
        if per_iter < 1 or per_iter > plan.token_budget or not floor * (1 - 1e-9) <= t_est <= plan.tpot_target_s \
                or need < 1:
            out.append(Violation("ls_admission", f"request {i:.0f}: forward simulation at {per_iter} tokens per "
                                 f"iteration of {t_est} s; expected at most the plan's budget {plan.token_budget} "
                                 f"tokens, and an iteration from {floor:.6g} s (the dense modules for those tokens) "
                                 f"to the plan's target {plan.tpot_target_s} s"))
            continue
        arrived = float(trace.arrival_s[int(i)])
        recomputed = admission_forecast(need, per_iter, t_est, t - arrived)
        if abs(waited - (t - arrived)) > 1e-9 * max(1.0, t) or abs(recomputed - forecast) > 1e-9 * max(1.0, forecast):
            out.append(Violation("ls_admission", f"request {i:.0f}: forecast {forecast} s does not follow from "
                                 f"its inputs ({recomputed} s)"))
        admitted = bool(ok)
        within = forecast <= problem.ls.ttft_slo_s
        if admitted != within:
            out.append(Violation("ls_admission", f"LS request {i:.0f} {'admitted' if admitted else 'rejected'} "
                                 f"with a forecast TTFT of {forecast:.4g} s against an SLO of "
                                 f"{problem.ls.ttft_slo_s} s", {"request": i}))
    return out


def check(problem: OmniServeProblem, plan: OmniServePlan) -> list[Violation]:
    """Return the plan's violations: parameters, the schedule's constraints, the schedule against the plan's
    knobs (knob_violations), the admission rule, then a re-simulation with the problem's seed under the
    plan's stated knobs whose figures, schedule and decisions must equal the plan's."""
    out = _param_violations(problem, plan)
    if out:
        return out
    out += schedule_violations(problem, plan)
    out += knob_violations(problem, plan)
    out += admission_violations(problem, plan)
    ev = run_policy(problem, params_of(plan))
    sched = ev.recorder.schedule
    if len(sched) != len(plan.schedule):
        out.append(Violation("figure", f"the plan states {len(plan.schedule)} iterations of schedule; the "
                             f"re-simulation records {len(sched)}", {"field": "schedule"}))
    else:
        for k, (row, mine) in enumerate(zip(plan.schedule, sched)):
            stated = row.model_dump()
            bad = [f for f in mine if stated.get(f) != mine[f] and not (isinstance(mine[f], float)
                   and not figure_violations(f, stated.get(f), mine[f]))]
            if bad:
                out.append(Violation("figure", f"iteration {k} of the schedule differs from the re-simulation in "
                                     f"{', '.join(bad)}", {"field": f"schedule[{k}]", "fields": bad}))
                break
    adm = [list(a) for a in getattr(ev.policy, "admissions", []) if a[1] <= _recorded_until(sched)]
    out += figure_violations("admissions", plan.admissions, adm) if len(adm) == len(plan.admissions) else [
        Violation("figure", f"the plan states {len(plan.admissions)} admission decisions; the re-simulation "
                  f"takes {len(adm)}", {"field": "admissions"})]
    if list(ev.recorder.pool_names) != plan.pools:
        out.append(Violation("figure", f"the plan uses pools {plan.pools}; the policy uses {ev.recorder.pool_names}"))
    return out + stated_figures_violations(plan, ev.figures["be_output_tokens_per_s"], ev.figures)


def _register() -> None:
    from gpuplan.models.omniserve import view

    register_model(ModelSpec("omniserve", OmniServeProblem, OmniServePlan, check, summarize=view.summarize,
                             describe=view.describe, draw=view.draw, runner="gpuplan.runtime.omniserve:run_plan",
                             title="OmniServe: LS/BE colocation with CPU attention piggybacking"))


_register()

__all__ = ["OmniServePlan", "OmniServeProblem", "IterationRow", "PolicyParams", "check", "fill_plan", "params_of",
           "build_latency", "BE", "LS"]
