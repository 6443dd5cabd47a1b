"""The options `gpuplan run --option KEY=VALUE` passes to a kind's runner, read from its signature."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from gpuplan import registry
from gpuplan.errors import InputError
from gpuplan.option_rules import OptionRule, flag, integer, number, one_of, value_of

# arguments the frame passes itself; never options
_FRAME = frozenset({"problem", "plan", "command"})

_SIZE = integer(1, 1 << 16)  # a model dimension of the small model a runner trains (hidden, seq, vocab, ...)
_FACTORS = value_of(list, what="a list of positive numbers, one per stage", none="measured or derived")
RUN_OPTION_RULES: dict[str, OptionRule] = {
    "steps": integer(1, 10_000),
    "warmup": integer(0, 1_000),
    "calibrate": integer(0, 1_000, special={0: "off"}),
    "threads": integer(1, 1_024, none="the problem's measured threads, else 1"),
    "seed": integer(0, 2**31 - 1),
    "timeout_s": number(0, 86_400, low_open=True, none="no limit"),
    "quiet_wait_s": number(0, 3_600),
    "duration_s": number(0, 3_600, low_open=True),
    "lr": number(0, 10, low_open=True),
    "changed_fraction": number(0, 1, none="the plan's"),
    "elements": integer(1, 1 << 28, none="the plan's"),
    "layers": integer(1, 64), "layers_per_stage": integer(1, 64), "head_dim": integer(1, 1_024),
    "hidden": _SIZE, "seq": _SIZE, "vocab": integer(1, 1 << 20), "microbatch_size": integer(1, 4_096),
    "max_ctx": _SIZE, "ctx": _SIZE, "max_tokens": integer(1, 1 << 20), "ls_tokens": _SIZE,
    "be_requests": integer(1, 4_096), "workers": integer(1, 64), "max_workers": integer(1, 64),
    "format": one_of("compute_comms", "compute_only"),
    "return_grads": flag(), "check_grads": flag(),
    "factors": _FACTORS, "sharing": value_of(list, what="a list of positive numbers, the speed while k workers "
                                            "compute", none="measured just before the launch"),
}
"""The domain of each run option by name (the runners share names: steps, threads, timeout_s, ...), checked
by check_run_options before any process starts: counts are bounded so a typo cannot start a run that
never ends or allocates without bound (steps=-1, threads=100000), durations are finite."""


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
    """Refuse options the runner of `kind` does not read, of another type than its default, or outside
    RUN_OPTION_RULES; return None when all are valid. Raises InputError naming the option, the value
    and what is expected."""
    check_option_values(runner_options(kind), options, f"the {kind} runner")


def check_option_values(known: dict[str, Any], options: dict[str, Any], owner: str) -> None:
    """Refuse run `options` missing from `known` (name -> default), of another type than the default, or
    outside their RUN_OPTION_RULES entry (nan and inf too); return None when all are valid. `owner`
    words the error ("the tessel runner"). Raises InputError naming the option, the value and what is expected."""
    registry.check_option_domains(known, RUN_OPTION_RULES, options, owner, "run option")


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
