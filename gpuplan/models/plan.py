"""The plan format every solver returns: versioned JSON, written atomically, loaded without code."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.errors import InputError
from gpuplan.io import atomic_write_text

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
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{p}: no such plan file", file=str(p)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a JSON plan file: {exc}", file=str(p)) from None
    if not isinstance(data, dict) or "kind" not in data:
        raise InputError.at(str(p), "kind", None if not isinstance(data, dict) else data.get("kind"),
                            "a plan file with a 'kind' field")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError.at(str(p), "schema_version", version,
                            f"{SCHEMA_VERSION} (this gpuplan reads plan schema version {SCHEMA_VERSION})")
    return data


def plan_from_document(plan_type: type[Plan], data: dict[str, Any], file: str | None = None) -> Plan:
    """Validate a plan mapping into `plan_type`; raise InputError naming the file on bad fields."""
    from gpuplan.models.base import input_error_from

    try:
        return plan_type.model_validate(data)
    except ValidationError as exc:
        raise input_error_from(exc, file) from None
