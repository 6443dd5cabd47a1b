"""The options `gpuplan run --option KEY=VALUE` passes to a kind's runner, read from its signature."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from gpuplan import registry
from gpuplan.errors import InputError

# arguments the frame passes itself; never options
_FRAME = frozenset({"problem", "plan", "command"})


def runner_function(kind: str) -> Callable[..., Any]:
    """Return the runner function of `kind` (imports its runtime module); raise InputError when the
    kind has no runner."""
    spec = registry.model(kind)
    if spec.runner is None:
        raise InputError(f"plans of kind {kind!r} have no executor", field="kind", value=kind)
    module, _, func = spec.runner.partition(":")
    return getattr(importlib.import_module(module), func)


def runner_options(kind: str) -> dict[str, Any]:
    """Return the options the runner of `kind` reads: name -> default (inspect.Parameter.empty when
    required); a catch-all **kwargs adds none."""
    params = inspect.signature(runner_function(kind)).parameters.values()
    return {p.name: p.default for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _FRAME}


def check_run_options(kind: str, options: dict[str, Any]) -> None:
    """Refuse options the runner of `kind` does not read, or of another type than its default; return
    None when all are known. Raises InputError naming the option, the value and what is expected."""
    registry.check_against_signature(runner_options(kind), options, f"the {kind} runner", "run option")


def annotations_of(fn: Callable[..., Any]) -> dict[str, str]:
    """Return each parameter's annotation of `fn` as text (e.g. 'int | None'); {} when unreadable."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: (p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", ""))
            for p in params if p.annotation is not inspect.Parameter.empty}


def describe_default(default: Any, annotation: str = "") -> tuple[str, str]:
    """Return (type, default as text) of an option for listings: the annotation when known, else the
    default's type ('required' when there is no default)."""
    kind = annotation or ("any" if default in (None, inspect.Parameter.empty) else type(default).__name__)
    if default is inspect.Parameter.empty:
        return kind, "required"
    return kind, repr(default)
