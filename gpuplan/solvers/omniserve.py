"""OmniServe solvers: the paper's piggybacking policy and the baselines its paper beats, all simulated on
the shared serving engine with the same latency model and trace.

omniserve (paper)  LS decode > LS prefill > BE prefill > BE piggyback; BE KV on CPU pools packed by
                   first-fit decreasing on memory and attention rate; the piggyback batch binary-searched
                   against the TPOT target each iteration; LS admission control by forward simulation
omniserve-pass     the same, where a CPU result back in time joins the current pass (a request may advance
                   several layers per iteration; the reading that makes BE throughput CPU-pace-bound)
sarathi            Sarathi-Serve on the GPU only: LS and BE FCFS under the token budget
headroom           Llumnix-style headroom: BE may hold at most X of the GPU KV cache; X chosen as its
                   paper would: the best BE throughput whose LS attainment stays within one point of
                   the same engine without BE
neo                NEO-style: GPU memory first; when full, BE KV goes to the host CPU and all of its decode
                   attention runs there, overlapped with the GPU iteration

`pack_exact` is the exact CP-SAT bin packing the first-fit-decreasing packer is tested against.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gpuplan.models.omniserve import OmniServePlan, OmniServeProblem, fill_plan
from gpuplan.models.omniserve.costs import MAX_BUDGET, build_latency, build_trace, token_budget
from gpuplan.models.omniserve.evaluate import Evaluation, run_policy
from gpuplan.models.omniserve.policy import PolicyParams
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.option_rules import OptionRule, flag, integer, number
from gpuplan.registry import Progress, no_progress, register_solver
from gpuplan.sim.serving import BE
from gpuplan.solvers.backends import Deadline

HEADROOM_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)
LS_TOLERANCE = 0.01   # "within one point" of LS attainment
SEARCH_SHARE = 0.8    # of a time limit for the parameter searches; the plan's own simulation follows


def _simulate(problem: OmniServeProblem, params: PolicyParams, evals: dict[PolicyParams, Evaluation] | None
              ) -> dict[str, float]:
    """Return the predicted figures of `params` on `problem`; with `evals`, the run is recorded (the
    schedule a plan states) and kept there, so that the plan the search picks is not simulated again
    (its own simulation used to follow the search unbudgeted, and can be the longest of all)."""
    if evals is None:
        return run_policy(problem, params, record=False).figures
    if params not in evals:
        evals[params] = run_policy(problem, params)
    return evals[params].figures


def _plan(problem: OmniServeProblem, params: PolicyParams, stats: dict[str, Any] | None = None,
          evals: dict[PolicyParams, Evaluation] | None = None) -> OmniServePlan:
    """Return the plan of `params`, filled from its simulation (the one in `evals` when the search ran it)."""
    plan = OmniServePlan(kind="omniserve", status=Status.FEASIBLE, policy=params.mode,
                         token_budget=params.token_budget, tpot_target_s=params.tpot_target_s,
                         be_gpu_fraction=params.be_gpu_fraction, admission=params.admission,
                         be_batch_max=params.be_batch_max, pace_factor=params.pace_factor, watermark=params.watermark,
                         layers_per_iteration=params.layers_per_iteration, be_inflight_max=params.be_inflight_max,
                         be_prefill_max=params.be_prefill_max)
    return fill_plan(problem, plan, stats, ev=(evals or {}).get(params))


def _base(problem: OmniServeProblem, budget: int) -> tuple[int, float]:
    lat = build_latency(problem)
    return (budget if budget > 0 else token_budget(problem, lat)), problem.tpot_target_s()


def solve_omniserve(problem: OmniServeProblem, *, time_limit_s: float | None = None, seed: int = 0,
                    progress: Progress = no_progress, token_budget: int = 0, be_gpu_fraction: float = -1.0,
                    be_batch_max: int = 4096, pace_factor: float = 1.0, admission: bool = True,
                    be_inflight_max: int = -1) -> OmniServePlan:
    """Return OmniServe's plan: the piggybacking policy with the Sarathi token budget for the TPOT SLO
    (or `token_budget` when > 0), BE attention on the CPU pools; a share X of the GPU KV cache may hold BE
    requests that decode on the GPU (`be_gpu_fraction`; -1: chosen by `best_fraction` as for the
    headroom baseline), bounds on BE prefill tokens per iteration and on BE requests in flight on the
    pools (`be_inflight_max` -1: both chosen by `best_controls`; else no prefill bound and this in-flight
    bound, 0: none), LS admission control; the plan states the simulated figures. OPTION_RULES gives
    each option's domain."""
    return _omniserve(problem, "omniserve", 1, progress, token_budget, be_gpu_fraction, be_batch_max, pace_factor,
                      admission, be_inflight_max, Deadline.after(time_limit_s, SEARCH_SHARE))


def solve_omniserve_pass(problem: OmniServeProblem, *, time_limit_s: float | None = None, seed: int = 0,
                         progress: Progress = no_progress, token_budget: int = 0, be_gpu_fraction: float = -1.0,
                         be_batch_max: int = 4096, pace_factor: float = 1.0, admission: bool = True,
                         be_inflight_max: int = -1) -> OmniServePlan:
    """Return OmniServe's plan under the same-pass reading [R]: a CPU result back before its layer's
    out-projection joins the current pass, so a BE request may advance up to every layer in one iteration
    (while the iteration stays within the TPOT target); otherwise as `solve_omniserve`."""
    return _omniserve(problem, "omniserve-pass", problem.layers(), progress, token_budget, be_gpu_fraction,
                      be_batch_max, pace_factor, admission, be_inflight_max, Deadline.after(time_limit_s, SEARCH_SHARE))


def _omniserve(problem: OmniServeProblem, name: str, lpi: int, progress: Progress, token_budget: int,
               be_gpu_fraction: float, be_batch_max: int, pace_factor: float, admission: bool,
               be_inflight_max: int, deadline: Deadline) -> OmniServePlan:
    budget, target = _base(problem, token_budget)
    stats: dict[str, Any] = {}
    evals: dict[PolicyParams, Evaluation] = {}
    if be_gpu_fraction < 0:
        be_gpu_fraction, stats = best_fraction(problem, "omniserve", budget, target, progress, lpi, deadline,
                                               evals=evals)
    params = PolicyParams("omniserve", budget, target, min(1.0, be_gpu_fraction), admission,
                          max(0, be_batch_max), max(1e-3, pace_factor), layers_per_iteration=lpi,
                          be_inflight_max=max(0, be_inflight_max))
    if be_inflight_max < 0:
        params, more = best_controls(problem, params, stats.get("ls_only_attainment"), progress, deadline,
                                     evals=evals)
        stats.update(more)
    decision: dict[str, Any] = {}
    plan = _plan(problem, params, decision, evals)
    plan.solver = SolverInfo(name=name, stats={**stats, **decision})
    return deadline.mark(plan, CUT_SHORT)


CUT_SHORT = "the parameter candidates solver.stats lists"  # what a time-limited plan's message names


def inflight_candidates(problem: OmniServeProblem) -> list[int]:
    """Return the bounds on BE requests in flight on CPU pools `best_controls` tries: 0 (no bound) and, for
    each k, how many of the trace's BE requests (in arrival order, prompt + output KV bytes each) the
    first k pools' memory holds, so that a subset's own limit is among the choices (more pools never
    leave fewer options)."""
    if not problem.pools() or problem.be.requests == 0:
        return [0]
    trace, _ = build_trace(problem)
    be = trace.service == BE
    need = np.cumsum((trace.prompt_tokens[be] + trace.output_tokens[be]).astype(float)) * problem.kv_bytes_per_token()
    mem = np.cumsum([p.memory_bytes for _, p in problem.pools()])
    caps = sorted({max(1, int(np.searchsorted(need, m, side="right"))) for m in mem})
    return [0] + caps


def prefill_candidates(problem: OmniServeProblem, budget: int) -> list[int]:
    """Return the bounds on BE prefill tokens per iteration `best_controls` tries: 0 (what the token budget
    leaves) and 1, 2 and 4 dense tiles below the budget."""
    tau = build_latency(problem).dense.tau
    return [0] + [k * tau for k in (1, 2, 4) if k * tau < budget]


def best_controls(problem: OmniServeProblem, params: PolicyParams, ls_ref: float | None = None,
                  progress: Progress = no_progress, deadline: Deadline | None = None, *,
                  evals: dict[PolicyParams, Evaluation] | None = None
                  ) -> tuple[PolicyParams, dict[str, Any]]:
    """Return (params with the BE prefill bound of `prefill_candidates`, then the bound on BE in flight of
    `inflight_candidates`, each with the most BE throughput whose LS attainment is within LS_TOLERANCE of
    the engine serving LS alone; stats). Why these bounds exist: see PolicyParams. Candidates are
    simulated in order while `deadline` allows one more of the longest so far (the current setting is
    kept where none was tried). With `evals`, every candidate's recorded run is kept there (`_simulate`)."""
    deadline = deadline or Deadline()
    if ls_ref is None:
        if deadline.cut:  # the time limit already stopped an earlier simulation (the reference, say)
            return params, {"ls_only_attainment": None}
        with deadline.timing():
            ls_ref = deadline.attempt(_ls_only_attainment, problem, params.token_budget, params.tpot_target_s)
        if ls_ref is None:  # the solve's time limit stopped the reference: the current setting is kept
            return params, {"ls_only_attainment": None}
    stats: dict[str, Any] = {"ls_only_attainment": ls_ref}
    for field, cands in (("be_prefill_max", prefill_candidates(problem, params.token_budget)),
                         ("be_inflight_max", inflight_candidates(problem) if problem.pools() else [0])):
        best, best_be = getattr(params, field), -1.0
        tried: dict[str, float] = {}
        for k, v in enumerate(deadline.paced(cands, first_free=False)):
            progress(k / len(cands), f"omniserve: {field} = {v}")
            f = deadline.attempt(_simulate, problem, replace(params, **{field: v}), evals,
                                 reserve=evals is None or params not in evals)
            if f is None:  # the solve's time limit stopped this candidate's simulation
                break
            tried[str(v)] = f["be_output_tokens_per_s"]
            if f["ls_attainment"] >= ls_ref - LS_TOLERANCE and f["be_output_tokens_per_s"] > best_be:
                best, best_be = v, f["be_output_tokens_per_s"]
        params = replace(params, **{field: best})
        stats[f"be_tokens_per_s_by_{field}"] = tried
    return params, stats


def solve_sarathi(problem: OmniServeProblem, *, time_limit_s: float | None = None, seed: int = 0,
                  progress: Progress = no_progress, token_budget: int = 0) -> OmniServePlan:
    """Return the Sarathi-Serve plan: GPU only, LS and BE FCFS under the token budget for the TPOT SLO."""
    budget, target = _base(problem, token_budget)
    return _plan(problem, PolicyParams("sarathi", budget, target))


def _ls_only_attainment(problem: OmniServeProblem, budget: int, target: float) -> float:
    """Return the LS SLO attainment of the engine serving LS alone (headroom with X = 0): the reference
    the BE controls are tuned against."""
    return float(run_policy(problem, PolicyParams("headroom", budget, target, 0.0), record=False).figures["ls_attainment"])


def best_fraction(problem: OmniServeProblem, mode: str, budget: int, target: float,
                  progress: Progress = no_progress, layers_per_iteration: int = 1,
                  deadline: Deadline | None = None, *, evals: dict[PolicyParams, Evaluation] | None = None
                  ) -> tuple[float, dict[str, Any]]:
    """Return (X, stats): the share X of HEADROOM_FRACTIONS of the GPU KV cache that BE may hold under
    policy `mode` with the most BE throughput whose LS attainment is within LS_TOLERANCE of the engine
    serving LS alone (X = 0 under the headroom policy), as Llumnix-style reservation is tuned. The
    shares are simulated in order while `deadline` allows one more of the longest so far (X = 0
    where none was). With `evals`, every candidate's recorded run is kept there (`_simulate`)."""
    deadline = deadline or Deadline()
    best, best_be = 0.0, -1.0
    tried: dict[str, float] = {}
    with deadline.timing():
        ref = deadline.attempt(_ls_only_attainment, problem, budget, target)
    if ref is None:  # the solve's time limit stopped the reference: X = 0, nothing compared
        return best, {"ls_only_attainment": None, "be_tokens_per_s_by_x": tried}
    for k, x in enumerate(deadline.paced(HEADROOM_FRACTIONS, first_free=False)):
        progress(k / len(HEADROOM_FRACTIONS), f"{mode}: BE share of GPU KV X = {x}")
        # once the best so far is a simulated candidate, the plan reuses its run: no room kept for another
        f = deadline.attempt(_simulate, problem, PolicyParams(mode, budget, target, x, mode == "omniserve",
                                                              layers_per_iteration=layers_per_iteration), evals,
                             reserve=best_be < 0)
        if f is None:  # the solve's time limit stopped this candidate's simulation
            break
        tried[str(x)] = f["be_output_tokens_per_s"]
        if f["ls_attainment"] >= ref - LS_TOLERANCE and f["be_output_tokens_per_s"] > best_be:
            best, best_be = x, f["be_output_tokens_per_s"]
    return best, {"ls_only_attainment": ref, "be_tokens_per_s_by_x": tried}


def solve_headroom(problem: OmniServeProblem, *, time_limit_s: float | None = None, seed: int = 0,
                   progress: Progress = no_progress, token_budget: int = 0,
                   be_gpu_fraction: float = -1.0) -> OmniServePlan:
    """Return the memory-headroom plan: BE may hold at most X of the GPU KV cache, LS first. With
    be_gpu_fraction -1, X is chosen by `best_fraction` (best BE throughput under the LS SLO)."""
    budget, target = _base(problem, token_budget)
    if be_gpu_fraction >= 0:
        return _plan(problem, PolicyParams("headroom", budget, target, min(1.0, be_gpu_fraction)))
    deadline = Deadline.after(time_limit_s, SEARCH_SHARE)
    evals: dict[PolicyParams, Evaluation] = {}
    best, stats = best_fraction(problem, "headroom", budget, target, progress, deadline=deadline, evals=evals)
    plan = _plan(problem, PolicyParams("headroom", budget, target, best), evals=evals)
    plan.solver = SolverInfo(name="headroom", stats=stats)
    return deadline.mark(plan, CUT_SHORT)


def solve_neo(problem: OmniServeProblem, *, time_limit_s: float | None = None, seed: int = 0,
              progress: Progress = no_progress, token_budget: int = 0) -> OmniServePlan:
    """Return the NEO-style plan: GPU KV first, BE decode attention on the host CPU when the GPU is full."""
    budget, target = _base(problem, token_budget)
    return _plan(problem, PolicyParams("neo", budget, target))


def pack_exact(need_bytes: np.ndarray, need_rate: np.ndarray, free_bytes: np.ndarray, free_rate: np.ndarray,
               *, time_limit_s: float = 10.0, seed: int = 0) -> np.ndarray:
    """Return each item's pool (-1: not packed) maximising the number of items packed, then their bytes,
    with every pool's memory (bytes) and attention rate within its free capacity: exact CP-SAT (small
    instances). Integer-scaled: sizes are rounded up and capacities down to a common grid."""
    from ortools.sat.python import cp_model

    from gpuplan.solvers.backends import solve_cpsat

    n, m = len(need_bytes), len(free_bytes)
    scale_b = max(float(np.max(need_bytes)) if n else 1.0, 1.0) / 10_000
    scale_r = max(float(np.max(need_rate)) if n else 1.0, 1.0) / 10_000
    nb = [int(np.ceil(x / scale_b)) for x in need_bytes]
    nr = [int(np.ceil(x / scale_r)) for x in need_rate]
    fb = [max(0, int(np.floor(x / scale_b))) for x in free_bytes]
    fr = [max(0, int(np.floor(x / scale_r))) for x in free_rate]
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x{i}_{c}") for c in range(m)] for i in range(n)]
    for i in range(n):
        model.Add(sum(x[i]) <= 1)
    for c in range(m):
        model.Add(sum(nb[i] * x[i][c] for i in range(n)) <= fb[c])
        model.Add(sum(nr[i] * x[i][c] for i in range(n)) <= fr[c])
    total = sum(nb) + 1
    model.Maximize(sum(total * x[i][c] + nb[i] * x[i][c] for i in range(n) for c in range(m)))
    res = solve_cpsat(model, time_limit_s=time_limit_s, seed=seed, workers=1)
    out = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        for c in range(m):
            if res.solver.Value(x[i][c]):
                out[i] = c
    return out


OPTION_RULES: dict[str, OptionRule] = {  # the ranges the model's check accepts in a plan (_param_violations)
    "token_budget": integer(1, MAX_BUDGET, special={0: "automatic: the Sarathi budget for the TPOT SLO"}),
    "be_gpu_fraction": number(0, 1, special={-1: "automatic: chosen by best_fraction"}),
    "be_batch_max": integer(0, 100_000),
    "pace_factor": number(0.001, 100),  # the plan's (0, 100]; the policy never paces below 0.001
    "admission": flag(),
    "be_inflight_max": integer(1, 100_000, special={0: "no bound", -1: "automatic: chosen by best_controls"}),
}
"""The domain of every omniserve solver option, which registry.check_options enforces."""


def _rules(*names: str) -> dict[str, OptionRule]:
    """Return the OPTION_RULES of the options `names` (those one solver reads)."""
    return {n: OPTION_RULES[n] for n in names}


register_solver("omniserve", "omniserve", solve_omniserve, role="paper", default=True,
                description="piggybacked CPU attention for BE, LS priority and admission control, binary-searched "
                            "BE batch, FFD pool packing", option_rules=OPTION_RULES)
register_solver("omniserve", "omniserve-pass", solve_omniserve_pass, role="variant",
                description="omniserve where a CPU result back before its layer's out-projection joins the same "
                            "pass (up to every layer per iteration)", option_rules=OPTION_RULES)
register_solver("omniserve", "sarathi", solve_sarathi, role="baseline",
                description="Sarathi-Serve: GPU only, LS and BE FCFS under the token budget",
                option_rules=_rules("token_budget"))
register_solver("omniserve", "headroom", solve_headroom, role="baseline",
                description="Llumnix-style memory headroom: BE at most X of GPU KV, X best for BE under the LS SLO",
                option_rules=_rules("token_budget", "be_gpu_fraction"))
register_solver("omniserve", "neo", solve_neo, role="baseline",
                description="NEO-style: BE decode attention on the host CPU when GPU memory is full",
                option_rules=_rules("token_budget"))
