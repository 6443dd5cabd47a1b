"""The plan format every solver returns: versioned JSON, written atomically, loaded without code."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.errors import InputError
from gpuplan.models.base import Violation
from gpuplan.io import atomic_write_text, read_json

SCHEMA_VERSION = 1


class Status(str, Enum):
    """How a solve ended."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIME_LIMIT = "time_limit"
    INFEASIBLE = "infeasible"


class SolverInfo(BaseModel):
    """Which solver made a plan, with what options and seed, and how long it took (seconds)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    time_limit_s: float | None = None
    wall_time_s: float = 0.0
    stats: dict[str, Any] = Field(default_factory=dict)


class Plan(BaseModel):
    """Base of every model's plan.

    Subclasses add the model's own fields (allocations, stages, schedules...). `problem` holds
    the problem document the plan was solved for, so a plan file checks, shows and runs alone;
    `input_digest` is the sha256 of that document.
    """

    model_config = ConfigDict(extra="forbid")

    kind: str
    schema_version: int = SCHEMA_VERSION
    status: Status
    objective: float | None = None
    objective_name: str = ""
    predicted: dict[str, float] = Field(default_factory=dict)
    solver: SolverInfo | None = None
    input_digest: str = ""
    message: str = ""
    problem: dict[str, Any] = Field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """Return the plan as a JSON-able mapping."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        """Return the plan as indented JSON text."""
        return json.dumps(self.document(), indent=1, sort_keys=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON atomically; return the path."""
        return atomic_write_text(path, self.to_json())

    @property
    def ok(self) -> bool:
        """True when the plan holds a solution (optimal, feasible or stopped at the time limit)."""
        return self.status is not Status.INFEASIBLE


def read_plan_document(path: str | Path) -> dict[str, Any]:
    """Return the JSON mapping of a plan file, checking kind and schema_version; never runs code."""
    p = Path(path)
    # bounded; raises InputError when missing or not JSON; check reports non-finite figures
    data = read_json(p, what="plan file", allow_nonfinite=True)
    if not isinstance(data, dict) or "kind" not in data:
        raise InputError.at(str(p), "kind", None if not isinstance(data, dict) else data.get("kind"),
                            "a plan file with a 'kind' field")
    version = data.get("schema_version")
    if isinstance(version, bool) or version != SCHEMA_VERSION:  # true == 1 in Python
        raise InputError.at(str(p), "schema_version", version,
                            f"{SCHEMA_VERSION} (this gpuplan reads plan schema version {SCHEMA_VERSION})")
    return data


def plan_from_document(plan_type: type[Plan], data: dict[str, Any], file: str | None = None) -> Plan:
    """Validate a plan mapping into `plan_type`; raise InputError naming the file on bad fields."""
    from gpuplan.models.base import input_error_from, refuse_bool_numbers

    try:
        plan = plan_type.model_validate(data)
    except ValidationError as exc:
        raise input_error_from(exc, file) from None
    refuse_bool_numbers(data, plan, file)
    return plan


# ---------------------------------------------------------------- what every check verifies

FIGURE_REL_TOL = 1e-6
FIGURE_ABS_TOL = 1e-9


def non_finite_paths(value: Any, path: str = "") -> list[str]:
    """Return the dotted paths ([i] for list items) of every NaN or infinite number inside `value`."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "(top level)"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite_paths(v, f"{path}[{i}]")]
    return []


def non_finite_violations(plan: Plan) -> list[Violation]:
    """Return one `non_finite` violation per NaN or infinite number anywhere in the plan document."""
    return [Violation("non_finite", f"{p} is not a finite number", {"field": p})
            for p in non_finite_paths(plan.document())]


def same_figure(stated: float, recomputed: float, rel_tol: float = FIGURE_REL_TOL,
                abs_tol: float = FIGURE_ABS_TOL) -> bool:
    """Return True when a stated figure equals the recomputed one within the tolerances (NaN never does)."""
    return math.isclose(float(stated), float(recomputed), rel_tol=rel_tol, abs_tol=abs_tol)


def figure_violations(field: str, stated: Any, recomputed: Any, rel_tol: float = FIGURE_REL_TOL,
                      abs_tol: float = FIGURE_ABS_TOL) -> list[Violation]:
    """Return a `figure` violation when the plan's `field` (a number, or a list / mapping of numbers)
    differs from what the check recomputed; [] when they agree. Units are the field's own."""
    if isinstance(recomputed, dict):
        if not isinstance(stated, dict) or set(stated) != set(recomputed):
            keys = sorted(stated) if isinstance(stated, dict) else stated
            return [Violation("figure", f"the plan states {field} for {keys!r}; the model has it for "
                              f"{sorted(recomputed)}", {"field": field})]
        return [v for k in recomputed for v in figure_violations(f"{field}.{k}", stated[k], recomputed[k],
                                                                  rel_tol, abs_tol)]
    if isinstance(recomputed, (list, tuple)):
        if not isinstance(stated, (list, tuple)) or len(stated) != len(recomputed):
            count = len(stated) if isinstance(stated, (list, tuple)) else "no"
            return [Violation("figure", f"the plan states {count} value(s) of {field}; the model has "
                              f"{len(recomputed)}", {"field": field})]
        return [v for i, (s, r) in enumerate(zip(stated, recomputed))
                for v in figure_violations(f"{field}[{i}]", s, r, rel_tol, abs_tol)]
    if stated is None or isinstance(stated, bool) or not isinstance(stated, (int, float)):
        return [Violation("figure", f"the plan states no number for {field}; the model gives {recomputed:.6g}",
                          {"field": field, "stated": stated, "recomputed": recomputed})]
    if same_figure(stated, recomputed, rel_tol, abs_tol):
        return []
    return [Violation("figure", f"the plan states {field} = {stated:.6g}; recomputed from the problem it is "
                      f"{recomputed:.6g}", {"field": field, "stated": stated, "recomputed": recomputed})]


def stated_figures_violations(plan: Plan, objective: float | None, predicted: dict[str, float],
                              rel_tol: float = FIGURE_REL_TOL, abs_tol: float = FIGURE_ABS_TOL) -> list[Violation]:
    """Return violations where the plan's `objective` or a `predicted` metric differs from the recomputed
    one. Every recomputed metric the plan states is compared; one it leaves out is not required, but
    an objective is (when the model gives one)."""
    out: list[Violation] = []
    if objective is not None:
        out += figure_violations("objective", plan.objective, objective, rel_tol, abs_tol)
    for key, value in predicted.items():
        if key in plan.predicted:
            out += figure_violations(f"predicted.{key}", plan.predicted[key], value, rel_tol, abs_tol)
    return out


def infeasible_contradictions(plan: Plan) -> list[Violation]:
    """Return a `status` violation naming the figures and schedule fields an `infeasible` plan holds: such a
    plan records that no solution exists, so objective, predicted metrics and the model's own fields
    (allocations, stages, schedules...) must all be empty; [] for other statuses."""
    if plan.status is not Status.INFEASIBLE:
        return []
    held = []
    if plan.objective is not None:
        held.append("objective")
    if plan.predicted:
        held.append("predicted")
    for name, info in type(plan).model_fields.items():
        if name in Plan.model_fields:
            continue
        default = info.get_default(call_default_factory=True)
        if getattr(plan, name) != default:
            held.append(name)
    if not held:
        return []
    return [Violation("status", f"the plan's status is 'infeasible' but it holds {', '.join(held)}; an "
                      "infeasible plan holds no solution", {"fields": held})]
