"""What every model shares: the problem base class, validation with clear errors, violations."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuplan.errors import InputError, shown


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
        elif str(part).startswith("function-") or part in ("tagged-union",) or "[" in str(part):
            continue  # pydantic's validator and union-branch labels ('list[...]'): not fields
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


MAX_FIELDS_SHOWN = 4
"""Most bad fields one validation message names (the rest are counted), so it stays one readable line."""


def input_error_from(exc: ValidationError, file: str | None) -> InputError:
    """Turn a pydantic ValidationError into one InputError listing each bad field plainly; an InputError
    a validator raised about a file the document names (a CSV trace: its row, column, value) is
    returned as it is, since that file, not the document's field, holds the fault."""
    lines: list[str] = []
    seen: set[str] = set()
    first: dict[str, Any] | None = None
    errors = exc.errors(include_url=False)
    for err in errors:  # a file the document names (a CSV trace) was bad: its own one-line error is the cause
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, InputError) and inner.file is not None:
            return inner
    for err in errors:
        path = field_path(tuple(err.get("loc", ())))
        if path in seen:  # one message per field (a union reports each branch)
            continue
        seen.add(path)
        expected = err.get("msg", "a valid value")
        expected = expected.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        at = re.match(r"^at ([^:]+): (.*)$", expected, re.S)
        if at:
            path = path + "." + at.group(1) if path != "(top level)" else at.group(1)
            lines.append(f"field '{path}': expected {at.group(2)}")
        elif err.get("type") == "missing":
            lines.append(f"field '{path}': missing; it is required")
        elif err.get("type") == "extra_forbidden":
            lines.append(f"field '{path}': unknown field (value {shown(err.get('input'))}); check its spelling")
        else:
            lines.append(f"field '{path}': got {shown(err.get('input'))}; expected {expected}")
        first = first or {"field": path, "value": err.get("input"), "expected": expected}
    where = f"{file}: " if file else ""
    if len(lines) > MAX_FIELDS_SHOWN:  # a document of another kind: every field of it is unknown
        lines = lines[:MAX_FIELDS_SHOWN] + [f"and {len(lines) - MAX_FIELDS_SHOWN} more bad fields"]
    message = where + "; ".join(lines)  # one line, however many fields are bad
    return InputError(message, file=file, **(first or {}))


MAX_NUMBER = 1e18
"""Largest magnitude of any number in an input document (larger ones are typos or attacks)."""

COUNT_LIMITS: dict[str, int] = {
    "gpus": 65_536,             # GPUs of one type (cluster, node) or of one job; also their sum
    "count": 65_536,            # repetitions of an aurora worker or a lagom op
    "gpus_per_node": 1_024,
    "nvlinks": 1_024,
    "nodes": 65_536,            # when a number (lagom groups)
    "ranks": 65_536,
    "dp": 65_536,
    "tp": 65_536,
    "sms": 65_536,
    "max_tp": 4_096,
    "max_stages": 256,          # poseidon: the search grows with stages and micro-batch counts;
    "max_microbatches": 4_096,  # 65,536 micro-batches ran 90 s past a 5 s time limit
    "microbatches": 4_096,
    "global_batch": 1 << 24,
    "micro_batch": 1 << 24,
    "seq_len": 1 << 24,
    "batch_samples": 1 << 30,
    "workers.count": 4_096,     # aurora workers after count expansion, each entry and in all
}
"""Documented upper limits of the count fields that size allocations (field name -> most allowed).

A count over its limit would make a solver or the cluster expansion allocate without bound, so
it is refused with the field's path before validation. A key 'LIST.FIELD' applies to FIELD in the
items of the list named LIST, to each and to their sum (the AuroraRL solver takes ~13 s for 4,096
workers and minutes for 65,536)."""


@functools.lru_cache(maxsize=4096)
def _quantity_unit(key: str) -> str | None:
    from gpuplan.units import SUFFIX_UNITS

    return next((unit for suffix, unit in SUFFIX_UNITS.items() if key.endswith(suffix)), None)


def _refuse_type_aliases(mapping: dict[Any, Any], path: tuple[Any, ...], file: str | None) -> None:
    """Refuse a mapping with two keys naming one catalog GPU type (`V100` and `V100-16GB`): they
    would be merged silently, one value lost."""
    if len(mapping) < 2:
        return
    from gpuplan.models.catalog import canonical_name

    seen: dict[str, str] = {}
    for k in mapping:
        name = canonical_name(k) if isinstance(k, str) else None
        if name is None:
            continue
        if name in seen:
            raise InputError.at(file, field_path(path + (k,)), k, f"one name per GPU type, but {seen[name]!r} "
                                f"and {k!r} both name {name}")
        seen[name] = k


def _check_list_totals(items: list[Any], path: tuple[Any, ...], file: str | None) -> None:
    """Refuse a list whose items' FIELD values sum past COUNT_LIMITS['LIST.FIELD']."""
    if not path or not isinstance(path[-1], str):
        return
    for key, limit in COUNT_LIMITS.items():
        listname, _, fieldname = key.partition(".")
        if listname != path[-1] or not fieldname:
            continue
        total = sum(v for v in (i.get(fieldname, 1) if isinstance(i, dict) else 0 for i in items)
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        if total > limit:
            raise InputError.at(file, field_path(path), f"{total:,.0f} in all", f"at most {limit:,} {fieldname} in all "
                                f"(the documented limit of '{key}')")


def check_input_numbers(data: Any, file: str | None = None) -> None:
    """Refuse numbers no input should hold; return None when every number is acceptable.

    Every number is finite and at most MAX_NUMBER in magnitude; a field named with a unit suffix
    (`_bytes`, `_GBps`, `_gbps`, `_s`, `_tflops`, see gpuplan.units) holds at most that unit's
    limit in magnitude, and rates (`_GBps`, `_gbps`, `_tflops`) are non-negative; a count field
    of COUNT_LIMITS (or each value and the sum of a mapping under it) is at most its limit; no
    mapping names one catalog GPU type twice (an alias and its canonical name).
    Raises InputError naming the file, the field path, the value and the limit.
    """
    from gpuplan.io import check_document
    from gpuplan.units import check_quantity

    check_document(data, file)  # size, nesting, non-finite floats (also for documents built in code)
    # (value, path, name of the nearest enclosing field with a unit suffix, the last two field names)
    stack: list[tuple[Any, tuple[Any, ...], str | None, tuple[str, ...]]] = [(data, (), None, ())]
    while stack:
        obj, path, unit_key, names = stack.pop()
        if isinstance(obj, dict):
            for k, v in obj.items():
                key_names = names if isinstance(k, int) else (names[-1:] + (str(k),))
                stack.append((v, path + (k,), str(k) if _quantity_unit(str(k)) else unit_key, key_names))
            _refuse_type_aliases(obj, path, file)
            key = str(path[-1]) if path else ""
            limit = COUNT_LIMITS.get(key) if key == "gpus" else None  # {gpus: {V100: n}}: the sum too
            numbers = [v for v in obj.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if limit is not None and numbers and sum(numbers) > limit:
                raise InputError.at(file, field_path(path), obj, f"at most {limit:,} in all (the documented "
                                    f"limit of '{key}')")
            continue
        if isinstance(obj, list):
            stack.extend((v, path + (i,), unit_key, names) for i, v in enumerate(obj))
            _check_list_totals(obj, path, file)
            continue
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            continue
        if not math.isfinite(obj) or abs(obj) > MAX_NUMBER:
            raise InputError.at(file, field_path(path), obj, f"a finite number of at most {MAX_NUMBER:g} in magnitude")
        limit = _count_limit(names, bool(path) and isinstance(path[-1], str))
        if limit is not None and abs(obj) > limit:
            raise InputError.at(file, field_path(path), obj, f"at most {limit:,} (the documented limit of this count)")
        unit = _quantity_unit(unit_key or "")
        if unit is not None:
            try:
                check_quantity(obj / 8 if (unit_key or "").endswith("_gbps") else obj, unit)
            except ValueError as exc:
                raise InputError.at(file, field_path(path), obj, str(exc).rsplit(", not ", 1)[0]) from None


@functools.lru_cache(maxsize=4096)
def _count_limit(names: tuple[str, ...], keyed_by_name: bool) -> int | None:
    """Return the COUNT_LIMITS entry for a number whose last two field names are `names` (list
    indices skipped), or None; `keyed_by_name`: the number is a mapping's value, not a list item."""
    limit = COUNT_LIMITS.get(".".join(names)) if len(names) >= 2 else None
    if limit is None and names:
        limit = COUNT_LIMITS.get(names[-1])
    if limit is None and len(names) >= 2 and names[-2] == "gpus" and keyed_by_name:
        limit = COUNT_LIMITS["gpus"]  # {gpus: {V100: n}}
    return limit


def document_path(value: str | Path, info: Any) -> Path:
    """Return `value` as a Path, resolved against the validating document's folder (`base_dir` in the
    pydantic validation context that `validate` sets) when it is relative."""
    path = Path(value)
    base = (getattr(info, "context", None) or {}).get("base_dir")
    return path if path.is_absolute() or base is None else Path(base) / path


def validate(schema: type[BaseModel], data: Any, *, file: str | Path | None = None,
             base_dir: Path | None = None) -> Any:
    """Validate `data` against `schema`; return the instance or raise InputError naming the file.

    `base_dir` is where relative paths inside the document (profiles, traces) are resolved.
    Numbers are checked first (check_input_numbers: finite, within their unit's and count's limits).
    """
    check_input_numbers(data, str(file) if file else None)
    context = {"base_dir": base_dir or (Path(file).parent if file else Path.cwd()), "file": file}
    try:
        instance = schema.model_validate(data, context=context)
    except ValidationError as exc:
        raise input_error_from(exc, str(file) if file else None) from None
    refuse_bool_numbers(data, instance, str(file) if file else None)
    return instance


_ABSENT = object()


def _follow(obj: Any, path: tuple[Any, ...]) -> Any:
    """Return what `path` (keys and list indices of the raw document) names inside a validated model, or
    _ABSENT where the model does not hold the document's shape there (a validator rebuilt it)."""
    for part in path:
        if isinstance(obj, BaseModel):
            fields = type(obj).model_fields
            name = part if part in fields else next((n for n, f in fields.items() if f.alias == part), None)
            if name is None:
                return _ABSENT
            obj = getattr(obj, name, _ABSENT)
        elif isinstance(obj, dict):
            obj = obj.get(part, _ABSENT)
        elif isinstance(obj, (list, tuple)) and isinstance(part, int) and 0 <= part < len(obj):
            obj = obj[part]
        else:
            return _ABSENT
        if obj is _ABSENT:
            return _ABSENT
    return obj


def coerced_bool(data: Any, instance: BaseModel) -> tuple[Any, ...] | None:
    """Return the path of the first true/false in the raw `data` that validating it into `instance` turned
    into a number (pydantic's lax mode reads `gpus: true` as 1 GPU), or None when every boolean stayed one."""
    if not isinstance(data, (dict, list)):
        return None
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:  # path tuples only for containers and booleans: a 100k-job document has few of either
        obj, path = stack.pop()
        for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
            if isinstance(value, (dict, list)):
                stack.append((value, path + (key,)))
            elif value is True or value is False:
                held = _follow(instance, path + (key,))
                if isinstance(held, (int, float)) and not isinstance(held, bool):
                    return path + (key,)
    return None


def refuse_bool_numbers(data: Any, instance: BaseModel, file: str | None = None) -> None:
    """Refuse a true/false the validation of `data` into `instance` turned into a number (see coerced_bool:
    `global_batch: false` is not 0); return None otherwise. Raises InputError naming the file, the field
    and the value."""
    path = coerced_bool(data, instance)
    if path is not None:
        raise InputError.at(file, field_path(path), _follow(data, path), "a number, not true or false")


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
