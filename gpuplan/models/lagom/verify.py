"""Lagom's check: every figure of a plan recomputed from (problem, plan) and NCCL's parameter rules."""

from __future__ import annotations

import math

from gpuplan.models.base import Violation
from gpuplan.models.lagom.compiled import Theta
from gpuplan.models.lagom.emit import emit, env_problems
from gpuplan.models.lagom.plan import LagomPlan, OpSetting, timeline
from gpuplan.models.lagom.problem import LagomProblem
from gpuplan.models.plan import figure_violations, stated_figures_violations

# The baselines a plan may report: NCCL's own choice and the AutoCCL-style search (gpuplan.solvers.lagom).
BASELINES = ("nccl-default", "autoccl")


def check(problem: LagomProblem, plan: LagomPlan) -> list[Violation]:
    """Return the plan's violations: missing/unknown ops, NCCL's parameter rules, a wrong iteration time,
    env vars that disagree with NCCL's ranges."""
    comp = problem.compiled
    out: list[Violation] = []
    by_name = {s.op: s for s in plan.settings}
    names = [o.name for o in comp.ops]
    for n in names:
        if n not in by_name:
            out.append(Violation("missing_op", f"op {n!r} has no setting", {"op": n}))
    for n in by_name:
        if n not in names:
            out.append(Violation("unknown_op", f"setting for unknown op {n!r}", {"op": n}))
    if len(plan.settings) != len(by_name):
        out.append(Violation("duplicate_op", "an op has more than one setting"))
    if out:
        return out
    thetas = [by_name[n].theta() for n in names]
    for i, t in enumerate(thetas):
        for why in comp.valid(i, t):
            out.append(Violation("nccl_rule", f"op {names[i]!r}: {why}", {"op": names[i], **vars(t)}))
    if out:
        return out
    it = comp.iteration_us(thetas) * 1e-6
    for name, stated in (("iteration_s", plan.iteration_s), ("objective", plan.objective)):
        if stated is not None and not math.isclose(it, stated, rel_tol=1e-6):
            out.append(Violation("iteration_time", f"the plan's {name} says {stated:.6g} s per iteration; "
                                 f"the model gives {it:.6g} s", {"field": name, "plan_s": stated, "model_s": it}))
    env_wrong = env_problems(plan.env, plan.group_options)
    for why in env_wrong:
        out.append(Violation("env", why))
    if not env_wrong:
        out += _check_emitted(problem, plan, thetas)
    return out + _check_figures(problem, plan, thetas, it)


def _check_emitted(problem: LagomProblem, plan: LagomPlan, thetas: list[Theta]) -> list[Violation]:
    """Return `env` violations where the plan's env vars, per-group Options or notes differ from what its
    settings emit (the runtime launches with them, so they must say what the settings say); notes after
    the emitted ones are free text."""
    env, options, notes = emit(problem, thetas)
    out = []
    for key in sorted(set(env) | set(plan.env)):
        if plan.env.get(key) != env.get(key):
            out.append(Violation("env", f"env {key}={plan.env.get(key)!r}; the settings emit {env.get(key)!r}",
                                 {"var": key}))
    if plan.group_options != options:
        out.append(Violation("env", "the per-group Options differ from what the settings emit",
                             {"stated": plan.group_options, "emitted": options}))
    # the emitted notes state figures (the values ops chose where the env folds them): they come first
    if plan.notes[:len(notes)] != notes:
        out.append(Violation("env", f"notes {plan.notes[:len(notes)]!r}; the settings emit {notes!r}",
                             {"field": "notes", "stated": plan.notes, "emitted": notes}))
    return out


def _baseline_setting_violations(problem: LagomProblem, name: str, base: list[OpSetting]) -> list[Violation]:
    """Return `baseline` violations of a baseline's per-op settings: an unknown baseline; for nccl-default
    every field that differs from NCCL's own choice (cost.nccl_default); for autoccl a setting that is
    neither NCCL's default (where its descent starts and which it keeps when nothing beats it) nor on the
    search grid (channels, threads, chunk: the problem's grid and the op's default values). [] when they hold."""
    if name not in BASELINES:
        return [Violation("baseline", f"unknown baseline {name!r} (expected one of {', '.join(BASELINES)})",
                          {"baseline": name})]
    comp = problem.compiled
    out: list[Violation] = []
    for i, s in enumerate(base):
        default = comp.nccl_default(i)
        grids = problem.grid.around(default)
        if name == "nccl-default":
            for f, want in vars(default).items():
                if getattr(s, f) != want:
                    out.append(Violation("baseline", f"baselines.{name}[{i}].{f} = {getattr(s, f)!r}; NCCL's "
                                         f"default for op {s.op!r} is {want!r}",
                                         {"field": f"baselines.{name}[{i}].{f}", "stated": getattr(s, f),
                                          "expected": want}))
        elif s.theta() != default:
            off = [f"{f} {getattr(s, f)}" for f, values in grids.items() if getattr(s, f) not in values]
            if off:
                out.append(Violation("baseline", f"baselines.{name}[{i}] (op {s.op!r}) sets {', '.join(off)} "
                                     "outside the search grid and is not NCCL's default",
                                     {"field": f"baselines.{name}[{i}]", "off_grid": off}))
    return out


def _check_figures(problem: LagomProblem, plan: LagomPlan, thetas: list[Theta], it: float
                   ) -> list[Violation]:
    """Return violations of the figures the plan states besides `iteration_s`: each baseline's settings
    (NCCL's rules, `_baseline_setting_violations`), the objective and the
    predicted iteration time, compute-alone time and baseline iteration times (s), and every
    window's start, compute, communication and total time (s), bound and ops, recomputed; `it` is the
    model's iteration time (s) under `thetas`."""
    comp = problem.compiled
    predicted = {"iteration_s": it, "compute_alone_s": sum(w.compute_us for w in comp.windows) * 1e-6}
    out: list[Violation] = []
    names = [o.name for o in comp.ops]
    for name, base in plan.baselines.items():
        if [s.op for s in base] != names:
            out.append(Violation("baseline", f"baseline {name!r} does not set every op once, in op order",
                                 {"baseline": name}))
            continue
        broken = [f"op {names[i]!r}: {why}" for i, s in enumerate(base) for why in comp.valid(i, s.theta())]
        if broken:
            out.append(Violation("baseline", f"baseline {name!r} breaks NCCL's parameter rules: {broken[0]}",
                                 {"baseline": name, "rules": broken}))
            continue
        out += _baseline_setting_violations(problem, name, base)
        predicted[f"iteration_s_{name.replace('-', '_')}"] = comp.iteration_us([s.theta() for s in base]) * 1e-6
    for key in plan.predicted:
        if key.startswith("iteration_s_") and key not in predicted:
            out.append(Violation("figure", f"the plan states predicted.{key} but holds no such baseline",
                                 {"field": f"predicted.{key}"}))
    # the `iteration_time` violation above already covers a wrong objective
    out += stated_figures_violations(plan, None, predicted)
    if plan.objective is None and plan.solver is not None:
        out += figure_violations("objective", plan.objective, it)
    windows = timeline(problem, thetas)
    if len(plan.windows) != len(windows):
        return out + [Violation("figure", f"the plan states {len(plan.windows)} windows; the model has "
                                f"{len(windows)}", {"field": "windows"})]
    for w, (stated, model) in enumerate(zip(plan.windows, windows)):
        if (stated.name, stated.bound, stated.ops) != (model.name, model.bound, model.ops):
            out.append(Violation("figure", f"window {w} is stated as {stated.name!r} ({stated.bound}-bound, ops "
                                 f"{stated.ops}); the model has {model.name!r} ({model.bound}-bound, ops "
                                 f"{model.ops})", {"field": f"windows[{w}]"}))
        for f in ("start_s", "compute_s", "comm_s", "time_s"):
            out += figure_violations(f"windows[{w}].{f}", getattr(stated, f), getattr(model, f))
    return out
