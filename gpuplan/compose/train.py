"""One training job, end to end: Poseidon's parallel plan, Tessel's schedule, Lagom's NCCL settings.

The steps interact both ways: Tessel's schedule decides which compute each collective overlaps (so
Lagom's problem depends on it), and Lagom's settings change each stage's time (so Tessel's problem
depends on them). `compose` iterates to a fixed point: Tessel on the stage times, Lagom on that
schedule, Tessel again on the times Lagom's settings give, ... until the schedule's per-device order
and the stage scales stop changing (or `max_rounds`). Poseidon's plan is not revisited (its search
assumes 1F1B and NCCL's defaults; the composed plan is predicted never slower than it, since each
later step keeps its default when the default is at least as fast).

Each step's default: Poseidon + 1F1B + NCCL's defaults is the baseline; "+ Tessel" swaps in the
schedule (stage times unchanged); "+ Lagom" is the composed plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpuplan.compose.comm import lagom_document
from gpuplan.compose.pipeline import (SCALE_TOLERANCE, baseline_schedule, composed_time_s, gains_table,
                                      stage_tails_s, tessel_problem)
from gpuplan.models.plan import Plan
from gpuplan.models.tessel import orders_of


@dataclass
class Composition:
    """The composed training plan: the three plans, per-stage scales, predicted times (s), step timings."""

    poseidon: Plan
    tessel: Plan
    baseline_tessel: Plan
    lagom: dict[int, Plan]
    scales: list[float]
    predicted: dict[str, float]
    rounds: int
    converged: bool
    step_times_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def gains(self) -> list[dict[str, Any]]:
        """Return the gains table: each step's predicted iteration time (s) and its gain over the previous
        step and over the baseline (fractions)."""
        p = self.predicted
        return gains_table(p["baseline_iteration_time_s"], p["tessel_iteration_time_s"], p["iteration_time_s"])


def _solve_lagom(doc: dict[str, Any], seed: int) -> tuple[Plan, float]:
    """Return Lagom's plan for a stage document and the stage's compute scale it gives: its tuned over NCCL's
    default iteration time on the same workload (the plan's own `nccl-default` baseline), at most 1."""
    from gpuplan import api

    plan = api.solve(api.load_problem(doc, "lagom"), solver="lagom", seed=seed)
    default_s = float(plan.predicted["iteration_s_nccl_default"])
    return plan, min(1.0, float(plan.iteration_s) / default_s) if default_s > 0 else 1.0  # type: ignore[attr-defined]


def _solve_tessel(problem: Any, time_limit_s: float, seed: int, previous: Plan | None = None,
                  tails_s: list[float] | None = None) -> Plan:
    """Return Tessel's schedule of `problem`, or the `previous` schedule's per-device order re-timed with
    this problem's durations when that ends sooner (Tessel's search is a heuristic under a time limit:
    shorter blocks must never give a longer schedule)."""
    from gpuplan import api
    from gpuplan.io import digest
    from gpuplan.models.plan import SolverInfo, Status
    from gpuplan.models.tessel import DeadlockError, make_plan, simulate

    plan = api.solve(problem, solver="tessel", time_limit_s=time_limit_s, seed=seed)
    if previous is None or not plan.ok:
        return plan
    tails_s = tails_s or [0.0] * problem.devices
    kept = _retimed(problem, previous, plan, "the previous round's order, re-timed (shorter than the new search's)")
    if kept is None:
        return plan
    longer = composed_time_s(kept.schedule, tails_s) >= composed_time_s(plan.schedule, tails_s) - 1e-12  # type: ignore[attr-defined]
    if longer:
        return plan
    return kept


def _retimed(problem: Any, previous: Plan, solved: Plan | None, why: str) -> Plan | None:
    """Return `previous`'s per-device order re-timed with `problem`'s durations, as a checked Tessel plan of
    `problem` (solver info from `solved` when given), or None when that order deadlocks or fails the check."""
    from gpuplan import api
    from gpuplan.io import digest
    from gpuplan.models.plan import SolverInfo, Status
    from gpuplan.models.tessel import DeadlockError, make_plan, simulate

    try:
        again = simulate(problem, orders_of(previous.schedule))  # type: ignore[attr-defined]
    except DeadlockError:
        return None
    kept = make_plan(problem, again, previous.schedule_name, Status.FEASIBLE)  # type: ignore[attr-defined]
    info = solved.solver if solved is not None else previous.solver
    kept.solver = SolverInfo(name=info.name if info else "tessel", seed=info.seed if info else 0,
                             time_limit_s=info.time_limit_s if info else None,
                             wall_time_s=info.wall_time_s if info else 0.0, stats={"schedule_from": why})
    kept.problem = problem.document()
    kept.input_digest = digest(kept.problem)
    return None if api.check(problem, kept) else kept


def compose(poseidon: Plan, *, time_limit_s: float = 20.0, seed: int = 0, max_rounds: int = 4,
            lagom: bool = True) -> Composition:
    """Return the composition of a solved Poseidon plan: Tessel's schedule and Lagom's settings at their
    fixed point, with predicted iteration times (s) of the baseline, of + Tessel, and of the composed
    plan. `lagom=False` skips the communication step (every scale 1)."""
    doc = poseidon.document()
    n = len(doc["stages"])
    timings: dict[str, float] = {"poseidon_s": float(poseidon.solver.wall_time_s) if poseidon.solver else 0.0,
                                 "tessel_s": 0.0, "lagom_s": 0.0}
    from gpuplan import api

    started = time.perf_counter()
    base_problem, baseline, base_t = baseline_schedule(doc, seed)
    scales = [1.0] * n
    problem = tessel_problem(doc, scales)
    sched = _solve_tessel(problem, time_limit_s, seed)
    timings["tessel_s"] += time.perf_counter() - started
    tessel_t = composed_time_s(sched.schedule, stage_tails_s(doc, scales))  # type: ignore[attr-defined]
    notes: list[str] = []
    lagom_plans: dict[int, Plan] = {}
    rounds, converged = 0, not lagom
    skipped = [s for s in range(n) if lagom and lagom_document(doc, s, problem, sched.schedule) is None]  # type: ignore[attr-defined]
    if skipped:
        notes.append(f"stages {skipped}: no NCCL settings to tune (a device type without NCCL, or nothing to "
                     "communicate); their times stay as predicted")
    lagom_docs: dict[int, dict[str, Any]] = {}  # the stage documents `lagom_plans` were solved on
    while lagom and rounds < max_rounds:
        rounds += 1
        t0 = time.perf_counter()
        new_scales, plans, lagom_docs = [], {}, {}
        for s in range(n):
            ldoc = lagom_document(doc, s, problem, sched.schedule)  # type: ignore[attr-defined]
            if ldoc is None:
                new_scales.append(1.0)
                continue
            plans[s], scale = _solve_lagom(ldoc, seed)
            lagom_docs[s] = ldoc
            new_scales.append(scale)
        timings["lagom_s"] += time.perf_counter() - t0
        lagom_plans = plans
        if all(abs(a - b) <= SCALE_TOLERANCE for a, b in zip(new_scales, scales)) and rounds > 1:
            converged = True
            break
        scales = new_scales
        t0 = time.perf_counter()
        new_problem = tessel_problem(doc, scales)
        new_sched = _solve_tessel(new_problem, time_limit_s, seed, previous=sched,
                                  tails_s=stage_tails_s(doc, scales))
        timings["tessel_s"] += time.perf_counter() - t0
        same_order = orders_of(new_sched.schedule) == orders_of(sched.schedule)  # type: ignore[attr-defined]
        problem, sched = new_problem, new_sched
        if same_order:
            converged = True
            break
    if lagom and not converged:  # the last Tessel round changed the order: Lagom for that order, and the
        # order re-timed (not searched again) with the scales Lagom gives it, so plans, scales and schedule agree
        t0 = time.perf_counter()
        last_scales = []
        for s in range(n):
            ldoc = lagom_document(doc, s, problem, sched.schedule)  # type: ignore[attr-defined]
            if ldoc is None:
                lagom_plans.pop(s, None)
                last_scales.append(1.0)
                continue
            if ldoc != lagom_docs.get(s):
                lagom_plans[s], scale = _solve_lagom(ldoc, seed)
                last_scales.append(scale)
            else:
                last_scales.append(scales[s])
        timings["lagom_s"] += time.perf_counter() - t0
        retimed_problem = tessel_problem(doc, last_scales)
        retimed = _retimed(retimed_problem, sched, None, "the last round's order, re-timed with the scales Lagom "
                                                         "gives it (no fixed point within the rounds)")
        # the same order under other block times: the same dependencies and memory, so it runs and checks
        assert retimed is not None, "an order that ran did not run again at other block times"
        problem, sched, scales = retimed_problem, retimed, last_scales
    final_t = composed_time_s(sched.schedule, stage_tails_s(doc, scales))  # type: ignore[attr-defined]
    if final_t > base_t:  # a tail the split schedule ends later on: keep the default schedule and times
        notes.append(f"the composed schedule ({final_t:.6g} s) was slower than 1F1B ({base_t:.6g} s) once the "
                     "stages' tails were added: 1F1B and NCCL's default times are kept")
        problem, sched, scales, final_t = base_problem, baseline, [1.0] * n, base_t
        lagom_plans = {s: _solve_lagom(d, seed)[0] for s in range(n)
                       if (d := lagom_document(doc, s, problem, sched.schedule)) is not None} if lagom else {}  # type: ignore[attr-defined]
    if lagom and not converged:
        notes.append(f"the Tessel/Lagom iteration stopped after {rounds} rounds without a fixed point: the last "
                     "order is kept, with Lagom's plans for it and its blocks re-timed at their scales")
    predicted = {"iteration_time_s": final_t, "baseline_iteration_time_s": base_t,
                 "tessel_iteration_time_s": tessel_t,
                 "poseidon_iteration_time_s": float(doc.get("iteration_time_s", 0.0)),
                 "gain_over_baseline": 1 - final_t / base_t}
    return Composition(poseidon, sched, baseline, lagom_plans, scales, predicted, rounds, converged, timings,
                       notes)


def training_problem(cluster: Any, model: Any = None, *, batch: int | None = None, seq: int | None = None,
                     profile: Any = None, settings: dict[str, Any] | None = None) -> Any:
    """Return the PoseidonProblem of a training job: `cluster` is a poseidon problem (file, mapping or
    Problem) or a cluster (file, mapping or preset name) with `model` a catalog name or mapping;
    `batch` (sequences) and `seq` (tokens) override the problem's, and so do the problem fields in
    `settings` that are not None (e.g. dtype, distributed_optimizer, fsdp); `profile` (a file or
    Profile) puts measured figures in place of the catalog's."""
    from pathlib import Path

    from gpuplan import api, registry
    from gpuplan.io import read_document
    from gpuplan.models.base import Problem
    from gpuplan.models.poseidon import SIZE_FIELDS
    from gpuplan.models.profile import Profile, load_profile

    if isinstance(cluster, Problem):
        doc = cluster.document()
    elif isinstance(cluster, (str, Path)) and (Path(cluster).suffix.lower() in (".yaml", ".yml", ".json")
                                              or Path(cluster).exists()):
        loaded = read_document(cluster)
        doc = dict(loaded) if loaded.get("kind") == "poseidon" else {"cluster": loaded.get("cluster", loaded)}
        cl = doc.get("cluster")
        if isinstance(cl, dict) and "profile" in cl and not Path(str(cl["profile"])).is_absolute():
            doc["cluster"] = {**cl, "profile": str(Path(cluster).parent / str(cl["profile"]))}
    elif isinstance(cluster, dict):
        doc = dict(cluster) if cluster.get("kind") == "poseidon" else {"cluster": cluster}
    else:
        doc = {"cluster": {"preset": str(cluster)}}
    if model is not None:
        if isinstance(model, (str, Path)) and (Path(model).suffix.lower() in (".yaml", ".yml", ".json")):
            mdoc = read_document(model)
            doc["model"] = mdoc.get("model", mdoc)
        else:
            doc["model"] = model
    for key, value in (("global_batch", batch), ("seq_len", seq), *(settings or {}).items()):
        if value is not None:
            doc[key] = value
    doc["kind"] = "poseidon"
    missing = [(key, arg, what) for key, arg, what in SIZE_FIELDS if doc.get(key) is None]
    if missing:
        from gpuplan.errors import InputError

        key, arg, what = missing[0]
        raise InputError("; ".join(f"field '{k}': missing; expected {w}: give {a}=N (--{a} N on the command line) or "
                                   f"{k} in a poseidon problem file" for k, a, w in missing),
                         field=key, expected=what)
    problem = api.load_problem(doc, "poseidon")
    if profile is not None:
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        spec = registry.model("poseidon")
        assert spec.with_profile is not None
        problem = spec.with_profile(problem, prof)
    return problem


def plan_training(cluster: Any, model: Any = None, *, batch: int | None = None, seq: int | None = None,
                  profile: Any = None, output: Any = None, time_limit_s: float = 20.0, seed: int = 0,
                  lagom: bool = True, max_rounds: int = 4, settings: dict[str, Any] | None = None) -> Composition:
    """Plan one training job end to end (see `compose`) and, when `output` names a directory, write the
    bundle there; `settings` are problem fields that override the problem's (`training_problem`).
    Returns the Composition (predicted times in seconds). Raises InfeasibleError with Poseidon's
    reason when no parallel plan fits."""
    from gpuplan import api
    from gpuplan.errors import InfeasibleError

    problem = training_problem(cluster, model, batch=batch, seq=seq, profile=profile, settings=settings)
    poseidon = api.solve(problem, solver="poseidon", time_limit_s=time_limit_s, seed=seed)
    if not poseidon.ok:
        raise InfeasibleError(f"no parallel plan: {poseidon.message}")
    comp = compose(poseidon, time_limit_s=time_limit_s, seed=seed, lagom=lagom, max_rounds=max_rounds)
    if output is not None:
        from gpuplan.compose.bundle import write_bundle

        write_bundle(output, comp)
    return comp
