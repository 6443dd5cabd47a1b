"""The public Python API: load problems and plans, solve, check, compare, describe, run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuplan import registry
from gpuplan.errors import GpuplanError, InfeasibleError, InputError, SolverError
from gpuplan.io import digest, read_document
from gpuplan.models.base import Problem, Violation, validate
from gpuplan.models.plan import (SCHEMA_VERSION, Plan, SolverInfo, Status, infeasible_contradictions,
                                 non_finite_violations, plan_from_document, read_plan_document)
from gpuplan.registry import Progress, no_progress
from gpuplan.sim.core import solve_clock


class PlanRejected(GpuplanError):
    """`run` refused a plan that fails `check`; `violations` lists why (nothing was started)."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__(f"the plan fails check with {len(violations)} violation(s), so it is not run:\n  "
                         + "\n  ".join(str(v) for v in violations))


def load_problem(source: str | Path | dict[str, Any] | Problem, kind: str | None = None) -> Problem:
    """Return a validated Problem from a YAML/JSON file, a mapping, or a Problem.

    The kind is read from the document's `kind` field; when `kind` is also given it must match.
    Raises InputError naming the file, field, value and what was expected.
    """
    if isinstance(source, Problem):
        if kind and source.kind != kind:
            raise InputError.at(None, "kind", source.kind, f"{kind!r}")
        return source
    file: str | None = None
    base_dir: Path | None = None
    if isinstance(source, (str, Path)):
        file, base_dir = str(source), Path(source).parent
        data = read_document(source)
    else:
        data = dict(source)
    found = data.get("kind")
    if found is None and "kind" in data:  # `kind:` written but empty is a slip, not an omission
        raise InputError.at(file, "kind", None, f"one of {', '.join(registry.kinds())} (or no kind field: the "
                            "kind named on the command line)")
    if found is None:
        if kind is None:
            raise InputError.at(file, "kind", None, f"one of {', '.join(registry.kinds())}")
        data["kind"] = found = kind
    if kind is not None and found != kind:
        raise InputError.at(file, "kind", found, f"{kind!r} (the kind named on the command line)")
    spec = registry.model(found, file)
    return validate(spec.problem_type, data, file=file, base_dir=base_dir)


def load_plan(path: str | Path) -> Plan:
    """Return the Plan stored in a JSON plan file, typed by its kind; nothing in it is executed."""
    data = read_plan_document(path)
    spec = registry.model(data["kind"], str(path))
    return plan_from_document(spec.plan_type, data, str(path))


def plan_problem(plan: Plan, problem: Problem | str | Path | dict[str, Any] | None = None) -> Problem:
    """Return the problem a plan is for: `problem` when given, else the document embedded in the plan."""
    if problem is not None:
        return load_problem(problem, plan.kind)
    if not plan.problem:
        raise InputError("the plan holds no problem document; pass the problem (--input)")
    return load_problem(plan.problem, plan.kind)


OVERRUN = 1.1  # a plan whose solve took longer than this times its time limit says so in its message


def solve(kind_or_problem: str | Problem | Path | dict[str, Any], problem: Any = None, *,
          solver: str | None = None, time_limit_s: float | None = None, seed: int = 0,
          progress: Progress | None = None, **options: Any) -> Plan:
    """Solve a problem with a registered solver; return its Plan.

    Call as `solve("oef", problem_or_path)` or `solve(problem)`. `solver` names a solver of the
    kind (default: the paper's method); `time_limit_s` bounds the search; `seed` fixes every
    random choice. An infeasible problem returns a plan with status 'infeasible' and the reason.
    """
    if isinstance(kind_or_problem, str) and problem is not None:
        prob = load_problem(problem, kind_or_problem)
    else:
        prob = load_problem(kind_or_problem)
    spec = registry.solver(prob.kind, solver)
    registry.check_options(spec, options)  # an unknown or mistyped option is an error, never ignored
    reason = spec.applicable(prob) if spec.applicable else None
    if reason:
        raise InputError(f"solver {spec.name!r} does not apply to this {prob.kind} problem: {reason}")
    plan_type = registry.model(prob.kind).plan_type
    started = time.perf_counter()
    try:
        with solve_clock(time_limit_s):  # every simulation of the solve stops at the limit (SimulationCut)
            plan = spec.fn(prob, time_limit_s=time_limit_s, seed=seed, progress=progress or no_progress,
                           **{**spec.options, **options})
    except InfeasibleError as exc:
        plan = plan_type(kind=prob.kind, status=Status.INFEASIBLE, message=str(exc))
    wall = time.perf_counter() - started
    if time_limit_s is not None and wall > OVERRUN * time_limit_s and plan.status is not Status.INFEASIBLE:
        past = (f"the solve took {wall:.3g} s, past its time limit of {time_limit_s:g} s: the least work that "
                "makes one plan (a search stops at the limit; raise it for more of the search)")
        plan.message = f"{plan.message}; {past}" if plan.message else past
    stats = dict(plan.solver.stats) if plan.solver else {}
    plan.solver = SolverInfo(name=spec.name, options={**spec.options, **options}, seed=seed,
                             time_limit_s=time_limit_s, wall_time_s=wall, stats=stats)
    doc = prob.document()
    plan.problem = doc
    plan.input_digest = digest(doc)
    return plan


def check(problem: Problem | str | Path | dict[str, Any] | None, plan: Plan) -> list[Violation]:
    """Return every violation found in `plan` ([] when the plan is valid); trusts nothing the plan states.

    Frame-wide checks first: no NaN or infinite number anywhere in the plan; the problem embedded in
    the plan matches its `input_digest` (else the plan was edited after solving and is not checked
    further against it); when `problem` is given its digest matches the plan's too (else the plan was
    solved for another input); the plan's solver is a registered one (its contract, the guarantees a
    model's check enforces, comes from the registry; only a plan made by hand, without an embedded
    problem, may name none); an `infeasible` plan holds no solution (what it holds anyway is checked
    as a solution too). Then the model's own `check`, which recomputes every figure the plan states.
    When `problem` is None the problem embedded in the plan is used. Raises InputError when there is
    no problem to check against.
    """
    out = non_finite_violations(plan)
    if plan.schema_version != SCHEMA_VERSION:
        out.append(Violation("schema_version", f"the plan states schema version {plan.schema_version}; this "
                             f"gpuplan reads {SCHEMA_VERSION}", {"schema_version": plan.schema_version}))
    embedded_ok = True
    if plan.problem:
        if not plan.input_digest:
            embedded_ok = False
            out.append(Violation("digest", "the plan embeds a problem but states no input_digest to verify it by"))
        elif digest(plan.problem) != plan.input_digest:
            embedded_ok = False
            out.append(Violation("problem_digest", "the problem embedded in the plan does not match the plan's "
                                 f"input_digest {plan.input_digest[:19]}... (digest {digest(plan.problem)[:19]}...): "
                                 "it was edited after solving", {"input_digest": plan.input_digest}))
    if problem is not None:
        prob = load_problem(problem, plan.kind)
        if plan.input_digest and digest(prob.document()) != plan.input_digest:
            return out + [Violation("input_mismatch", "the plan was solved for a different input "
                                    f"(digest {plan.input_digest[:19]}..., this input "
                                    f"{digest(prob.document())[:19]}...)")]
    elif not embedded_ok:
        return out
    else:
        prob = plan_problem(plan)
    if plan.solver is None and plan.problem:   # `solve` always records both: the solver was removed
        out.append(Violation("unknown_solver", "the plan embeds its problem but names no solver, so what "
                             "its solver promises cannot be known"))
    elif plan.solver is not None and registry.contract(prob.kind, plan.solver.name) is None:
        out.append(Violation("unknown_solver", f"the plan names solver {plan.solver.name!r}, which is not a "
                             f"registered {prob.kind} solver, so what it promises cannot be known",
                             {"solver": plan.solver.name}))
    if plan.status is Status.INFEASIBLE:
        held = infeasible_contradictions(plan)
        if not held:
            return out
        out += held   # and what it holds is checked as a solution, so its faults are named too
        plan = plan.model_copy(update={"status": Status.FEASIBLE})
    try:
        out += registry.model(prob.kind).check(prob, plan)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        out.append(Violation("unreadable", f"the {prob.kind} check could not evaluate the plan: "
                             f"{type(exc).__name__}: {exc}"))
    return out


def compare(problem: Problem | str | Path | dict[str, Any], *, solvers: list[str] | None = None,
            time_limit_s: float | None = None, seed: int = 0, progress: Progress | None = None,
            kind: str | None = None) -> list[tuple[str, Plan | None, dict[str, Any]]]:
    """Solve one problem with the paper's solver and every applicable variant, exact solver and baseline.

    Returns (solver name, plan or None when it did not apply or gave up with a SolverError, summary
    figures) per solver, in the registry's order; the summary holds the model's figures plus `solve_time_s` and `status`.
    """
    prob = load_problem(problem, kind)
    spec = registry.model(prob.kind)
    out: list[tuple[str, Plan | None, dict[str, Any]]] = []
    chosen = registry.solvers(prob.kind) if solvers is None else [registry.solver(prob.kind, n) for n in solvers]
    for s in chosen:
        reason = s.applicable(prob) if s.applicable else None
        if reason:
            out.append((s.name, None, {"status": f"skipped: {reason}"}))
            continue
        try:
            plan = solve(prob, solver=s.name, time_limit_s=time_limit_s, seed=seed, progress=progress)
        except SolverError as e:  # one solver giving up leaves the others' rows
            out.append((s.name, None, {"status": f"failed: {e}"}))
            continue
        summary: dict[str, Any] = {"status": plan.status.value}
        if plan.ok and spec.summarize is not None:
            summary.update(spec.summarize(prob, plan))
        summary["solve_time_s"] = plan.solver.wall_time_s if plan.solver else float("nan")
        out.append((s.name, plan, summary))
    return out


def run(plan: Plan, problem: Problem | None = None, **options: Any) -> dict[str, Any]:
    """Execute a plan with the model's runtime (torch.distributed); return measured figures.

    The plan is checked first (see `check`): a plan with violations, or an infeasible one, is refused
    with PlanRejected before any process starts; so are options the runner does not read or values
    outside their domain (gpuplan.run_options.RUN_OPTION_RULES; InputError), as on the command line.
    """
    from gpuplan.run_options import check_run_options, runner_function

    violations = check(problem, plan)
    if not plan.ok and not violations:
        violations = [Violation("status", f"the plan's status is {plan.status.value!r}: "
                                          "it holds no solution to run")]
    if violations:
        raise PlanRejected(violations)
    prob = plan_problem(plan, problem)
    check_run_options(prob.kind, {k: v for k, v in options.items() if k != "command"})  # a command is not an option
    return runner_function(prob.kind)(prob, plan, **options)


def evaluate_config(problem: Problem | str | Path | dict[str, Any], config: Any, *,
                    check_memory: bool = True) -> Plan:
    """Return the Poseidon plan of a FIXED parallel configuration: `config` is a mapping, a YAML/JSON
    file or the text "tp=8,pp=8,dp=12,mb=1,recompute=selective,interleave=2" (see
    gpuplan.models.poseidon.config). Every figure comes from the same DAG model the search uses;
    predicted holds iteration_time_s, throughput, model_tflops_per_gpu and mfu; the plan embeds the
    problem it was evaluated on (the config's recompute and execution assumptions applied). Raises
    InfeasibleError when the configuration does not fit in memory (unless check_memory=False)."""
    from gpuplan.models.poseidon.config import evaluate_config as _evaluate

    return _evaluate(load_problem(problem, "poseidon"), config, check_memory=check_memory)  # type: ignore[arg-type]


def plan_training(cluster: Any, model: Any = None, *, batch: int | None = None, seq: int | None = None,
                  profile: Any = None, output: str | Path | None = None, time_limit_s: float = 20.0,
                  seed: int = 0, settings: dict[str, Any] | None = None) -> Any:
    """Plan one training job end to end: Poseidon's parallel plan, Tessel's schedule of its stages and
    Lagom's NCCL settings, iterated to a fixed point (gpuplan.compose). Returns the Composition (its
    `predicted` holds iteration times in seconds, `gains()` the table of each step's gain); with
    `output` the bundle (three plans and a manifest) is written to that directory. `settings`: Poseidon
    problem fields that override the problem's, e.g. {"dtype": "fp8", "fsdp": True}."""
    from gpuplan.compose import plan_training as _plan_training

    return _plan_training(cluster, model, batch=batch, seq=seq, profile=profile, output=output,
                          time_limit_s=time_limit_s, seed=seed, settings=settings)
