"""What every model shares: the problem base class, validation with clear errors, violations."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuplan.errors import InputError


class Schema(BaseModel):
    """Base of every input schema: unknown fields are refused, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Problem(Schema):
    """Base of every model's problem. `kind` names the model (oef, poseidon, ...)."""

    kind: str
    name: str | None = None

    KIND: ClassVar[str] = ""

    def document(self) -> dict[str, Any]:
        """Return the problem as a plain JSON-able mapping that `load_problem` reads back."""
        return self.model_dump(mode="json", exclude_none=True)


def field_path(loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location as a dotted path with [i] for list indices."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-") or part in ("tagged-union",):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def input_error_from(exc: ValidationError, file: str | None) -> InputError:
    """Turn a pydantic ValidationError into one InputError listing each bad field plainly."""
    lines = []
    first: dict[str, Any] | None = None
    for err in exc.errors(include_url=False):
        path = field_path(tuple(err.get("loc", ())))
        expected = err.get("msg", "a valid value")
        expected = expected.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        at = re.match(r"^at ([^:]+): (.*)$", expected, re.S)
        if at:
            path = path + "." + at.group(1) if path != "(top level)" else at.group(1)
            lines.append(f"field '{path}': expected {at.group(2)}")
        elif err.get("type") == "missing":
            lines.append(f"field '{path}': missing; it is required")
        elif err.get("type") == "extra_forbidden":
            lines.append(f"field '{path}': unknown field (value {err.get('input')!r}); check its spelling")
        else:
            shown = repr(err.get("input"))
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            lines.append(f"field '{path}': got {shown}; expected {expected}")
        first = first or {"field": path, "value": err.get("input"), "expected": expected}
    where = f"{file}: " if file else ""
    message = where + ("; ".join(lines) if len(lines) == 1 else "\n  " + "\n  ".join(lines))
    return InputError(message, file=file, **(first or {}))


def validate(schema: type[BaseModel], data: Any, *, file: str | Path | None = None,
             base_dir: Path | None = None) -> Any:
    """Validate `data` against `schema`; return the instance or raise InputError naming the file.

    `base_dir` is where relative paths inside the document (profiles, traces) are resolved.
    """
    context = {"base_dir": base_dir or (Path(file).parent if file else Path.cwd()), "file": file}
    try:
        return schema.model_validate(data, context=context)
    except ValidationError as exc:
        raise input_error_from(exc, str(file) if file else None) from None


@dataclass(frozen=True)
class Violation:
    """One broken constraint found by a model's `check`: a short code, a sentence, and the numbers."""

    code: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclass(frozen=True)
class Table:
    """A titled table of rows for `gpuplan show` and `compare` (cells are numbers or short strings)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
