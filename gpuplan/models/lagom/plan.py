"""Lagom's plan: a setting per op, the predicted windows and iteration time, the emitted env vars and
per-group Options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from gpuplan.models.lagom.compiled import Theta
from gpuplan.models.lagom.emit import emit
from gpuplan.models.plan import Plan, Status

if TYPE_CHECKING:
    from gpuplan.models.lagom.problem import LagomProblem


class OpSetting(BaseModel):
    """theta for one op."""

    op: str
    algo: str
    proto: str
    channels: int
    threads: int
    chunk_bytes: int

    def theta(self) -> Theta:
        """Return the setting as a Theta."""
        return Theta(self.algo, self.proto, self.channels, self.threads, self.chunk_bytes)


class WindowTiming(BaseModel):
    """One window's predicted figures (seconds) and which lane bounds it."""

    name: str
    start_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    time_s: float = 0.0
    bound: Literal["compute", "comm", "exposed", "idle"] = "compute"
    ops: list[str] = Field(default_factory=list)


class LagomPlan(Plan):
    """Per-op settings, predicted windows, the emitted env vars and per-group Options."""

    kind: str = "lagom"
    settings: list[OpSetting] = Field(default_factory=list)
    baselines: dict[str, list[OpSetting]] = Field(default_factory=dict)
    iteration_s: float = 0.0
    windows: list[WindowTiming] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    group_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def thetas(self, baseline: str | None = None) -> list[Theta]:
        """Return the settings (or a baseline's) as Thetas, in op order."""
        return [s.theta() for s in (self.baselines[baseline] if baseline else self.settings)]


def timeline(problem: LagomProblem, settings: list[Theta]) -> list[WindowTiming]:
    """Return each window's start, compute time (slowed), communication time and bounding lane (s)."""
    comp = problem.compiled
    out, t0 = [], 0.0
    for w, win in enumerate(comp.windows):
        total = float(comp.window_us(w, settings))
        stretch = 1 + comp.consts.psi if win.compute_us > 0 else 1.0
        comm = sum(float(comp.comm_us(i, settings[i])) * stretch * comp.ops[i].count for i in win.ops)
        progress = sum(float(comp.comm_us(i, settings[i])) * stretch * comp.ops[i].count
                       / float(comp.slowdown(i, settings[i])) for i in win.ops)
        compute = (comm + win.compute_us - progress) if win.compute_us > progress else \
            win.compute_us * (comm / progress if progress else 1.0)
        bound = "exposed" if win.compute_us == 0 and win.ops else (
            "idle" if not win.ops else ("comm" if comm >= total - 1e-9 and comm > compute else "compute"))
        out.append(WindowTiming(name=win.name, start_s=t0 * 1e-6, compute_s=compute * 1e-6, comm_s=comm * 1e-6,
                                time_s=total * 1e-6, bound=bound, ops=[comp.ops[i].name for i in win.ops]))
        t0 += total
    return out


def make_plan(problem: LagomProblem, settings: list[Theta], **fields: Any) -> LagomPlan:
    """Return a LagomPlan for `settings`: predicted windows and iteration time, env and Options."""
    comp = problem.compiled
    it = comp.iteration_us(settings)
    env, options, notes = emit(problem, settings)
    predicted = {"iteration_s": it * 1e-6,
                 "compute_alone_s": sum(w.compute_us for w in comp.windows) * 1e-6}
    for name, base in fields.get("baselines", {}).items():
        predicted[f"iteration_s_{name.replace('-', '_')}"] = comp.iteration_us([s.theta() for s in base]) * 1e-6
    fields.setdefault("status", Status.FEASIBLE)
    return LagomPlan(objective=it * 1e-6, objective_name="iteration time (s)", predicted=predicted,
                     settings=[OpSetting(op=o.name, **vars(t)) for o, t in zip(comp.ops, settings)],
                     iteration_s=it * 1e-6, windows=timeline(problem, settings), env=env,
                     group_options=options, notes=notes + fields.pop("notes", []), **fields)
