"""One registry of models and solvers that `solve`, `compare`, `check`, `show`, `run` and the CLI read.

Each `gpuplan/models/<kind>.py` calls `register_model`, each `gpuplan/solvers/<kind>.py` calls
`register_solver`; `discover()` imports them all, so adding a model touches no central switch.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from gpuplan.models.base import Problem, Table, Violation
from gpuplan.models.plan import Plan
from gpuplan.option_rules import OptionRule, is_nonfinite


class Progress(Protocol):
    """Progress callback: fraction done in [0, 1] (None when unknown) and a short message."""

    def __call__(self, fraction: float | None, message: str = "") -> None: ...


def no_progress(fraction: float | None, message: str = "") -> None:
    """A progress callback that does nothing."""


SolverRole = Literal["paper", "variant", "exact", "baseline"]


@dataclass(frozen=True)
class ModelSpec:
    """What a model provides to the frame.

    check: the model's own validation, written from the paper's constraints (no solver code).
    summarize: the figures `compare` prints per plan (name -> number or short text).
    describe: tables for `gpuplan show`. draw: a PNG for `gpuplan show --png` (matplotlib).
    runner: dotted path 'module:function' of the executor, imported only when a plan is run.
    with_profile: returns the problem with measured figures from a profile in place of the catalog.
    """

    kind: str
    problem_type: type[Problem]
    plan_type: type[Plan]
    check: Callable[[Any, Any], list[Violation]]
    summarize: Callable[[Any, Any], dict[str, Any]] | None = None
    describe: Callable[[Any, Any], list[Table]] | None = None
    draw: Callable[[Any, Any, Path], None] | None = None
    runner: str | None = None
    with_profile: Callable[[Any, Any], Any] | None = None
    title: str = ""


@dataclass(frozen=True)
class SolverSpec:
    """A registered solver: its function, its role, and when it applies.

    fn(problem, *, time_limit_s, seed, progress, **options) -> Plan (the frame fills solver info,
    digest and problem document). applicable(problem) returns None when the solver applies, else
    the reason it does not (e.g. an exact solver on an instance too large for it). guarantees: the
    properties every plan of this solver promises (its contract, e.g. OEF's sharing incentive); a
    model's check enforces them from here, never from a list in the plan. option_rules: the domain
    of each option (name -> OptionRule), which `check_options` enforces.
    """

    kind: str
    name: str
    fn: Callable[..., Plan]
    role: SolverRole = "paper"
    default: bool = False
    description: str = ""
    applicable: Callable[[Any], str | None] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    guarantees: tuple[str, ...] = ()
    option_rules: dict[str, OptionRule] = field(default_factory=dict)


_MODELS: dict[str, ModelSpec] = {}
_SOLVERS: dict[str, dict[str, SolverSpec]] = {}
_DISCOVERED = False


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a model to the registry; return the spec."""
    _MODELS[spec.kind] = spec
    _SOLVERS.setdefault(spec.kind, {})
    return spec


def register_solver(kind: str, name: str, fn: Callable[..., Plan], *, role: SolverRole = "paper",
                    default: bool = False, description: str = "",
                    applicable: Callable[[Any], str | None] | None = None,
                    options: dict[str, Any] | None = None, guarantees: tuple[str, ...] = (),
                    option_rules: dict[str, OptionRule] | None = None) -> SolverSpec:
    """Add a solver for `kind` under `name`; return its spec. `guarantees` is the solver's contract;
    `option_rules` gives each option's domain (name -> OptionRule, see gpuplan.option_rules). Raises
    ValueError when a rule names an option the solver does not read (a typo would leave it unchecked)."""
    spec = SolverSpec(kind, name, fn, role, default, description, applicable, dict(options or {}),
                      tuple(guarantees), dict(option_rules or {}))
    stray = sorted(set(spec.option_rules) - set(solver_options(spec)))
    if stray:
        raise ValueError(f"solver {name!r} of {kind}: option_rules name {stray}, which it does not read; "
                         f"its options: {sorted(solver_options(spec))}")
    _SOLVERS.setdefault(kind, {})[name] = spec
    return spec


def discover() -> None:
    """Import every module of gpuplan.models and gpuplan.solvers once, so all register themselves."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    for package in ("gpuplan.models", "gpuplan.solvers"):
        pkg = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package}.{info.name}")


def kinds() -> list[str]:
    """Return the kinds of every registered model, sorted."""
    discover()
    return sorted(_MODELS)


def model(kind: str, file: str | None = None) -> ModelSpec:
    """Return the ModelSpec of `kind`; raise InputError naming `file` (the document that gave the kind,
    when there is one), the field 'kind', the value and the kinds there are when it is none of them."""
    from gpuplan.errors import InputError

    discover()
    if not isinstance(kind, str) or kind not in _MODELS:
        raise InputError.at(file, "kind", kind, f"one of {', '.join(sorted(_MODELS))}")
    return _MODELS[kind]


def solvers(kind: str) -> list[SolverSpec]:
    """Return the solvers of `kind`: paper first, then variants, exact, baselines."""
    model(kind)
    order = {"paper": 0, "variant": 1, "exact": 2, "baseline": 3}
    return sorted(_SOLVERS.get(kind, {}).values(), key=lambda s: (order[s.role], not s.default, s.name))


_FRAME_ARGS = frozenset({"problem", "time_limit_s", "seed", "progress"})


def solver_options(spec: SolverSpec) -> dict[str, Any]:
    """Return the options a solver reads (name -> default; inspect.Parameter.empty when required):
    its named keyword parameters other than the frame's (problem, time_limit_s, seed, progress),
    and its registered options. A catch-all `**kwargs` adds none: what it swallows is ignored."""
    out: dict[str, Any] = {}
    try:
        params = inspect.signature(spec.fn).parameters.values()
    except (TypeError, ValueError):
        params = []  # type: ignore[assignment]
    for p in params:
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _FRAME_ARGS:
            out[p.name] = p.default
    return {**out, **spec.options}


def check_options(spec: SolverSpec, options: dict[str, Any]) -> None:
    """Refuse solver options the solver does not read, of another type than its default, or outside
    the domain its OptionRule gives (nan and inf too, for every option whose rule does not allow them);
    return None when every option is valid. Raises InputError naming the option, the value and what
    is expected (`option 'beta': got 1.5; expected a number in (0, 1] (default 0.5)`)."""
    check_option_domains(solver_options(spec), spec.option_rules, options, f"solver {spec.name!r} of {spec.kind}",
                         "option")


def check_option_domains(known: dict[str, Any], rules: dict[str, OptionRule], options: dict[str, Any], owner: str,
                         label: str) -> None:
    """Refuse `options` missing from `known` (name -> default, as read from a signature), of another type
    than the default, outside their entry of `rules`, or nan / inf where no rule allows them; return None
    when all are valid. `owner` and `label` word the error (see check_against_signature). Raises
    InputError naming the option, the value and what is expected."""
    from gpuplan.errors import InputError, shown

    check_against_signature(known, options, owner, label)
    for name, value in options.items():
        rule = rules.get(name)
        if rule is None and not is_nonfinite(value):
            continue  # an option without a rule (tests/test_option_rules.py says none may lack one)
        if rule is not None and rule.accepts(value):
            continue
        expected = rule.describe() if rule is not None else "a finite number"
        default = known[name]
        tail = "" if default is inspect.Parameter.empty else f" (default {default!r})"
        raise InputError(f"{label} {name!r}: got {shown(value)}; expected {expected}{tail}",
                         field=f"option.{name}", value=value, expected=expected)


def option_rule(spec: SolverSpec, name: str) -> OptionRule | None:
    """Return the OptionRule of option `name` of a solver, or None when it has none."""
    return spec.option_rules.get(name)


def check_against_signature(known: dict[str, Any], options: dict[str, Any], owner: str, label: str) -> None:
    """Refuse an option missing from `known` (name -> default, as read from a signature) or of another
    type than its default; return None when all are known. `owner` and `label` word the error
    ("solver 'oef' of oef", "option"). Raises InputError naming the option, the value and what is expected."""
    from gpuplan.errors import InputError, shown

    for name, value in options.items():
        if name not in known:
            names = ", ".join(sorted(known))
            expected = f"one of: {names}" if names else "no options: it takes none"
            raise InputError(f"{label} {name!r}: {owner} has no such option; expected {expected}",
                             field=f"option.{name}", value=value, expected=names or "none")
        default = known[name]
        if default is None or default is inspect.Parameter.empty:
            continue
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, type(default)) and not isinstance(value, bool)
        if not ok:
            raise InputError(f"{label} {name!r}: got {shown(value)}; expected a {type(default).__name__} "
                             f"(default {default!r})", field=f"option.{name}", value=value,
                             expected=type(default).__name__)


def solver(kind: str, name: str | None = None) -> SolverSpec:
    """Return the solver `name` of `kind`, or its default; raise InputError listing the names."""
    from gpuplan.errors import InputError

    specs = solvers(kind)
    if not specs:
        raise InputError(f"model {kind!r} has no solver registered")
    if name is None:
        return next((s for s in specs if s.default), specs[0])
    for s in specs:
        if s.name == name:
            return s
    names = ", ".join(s.name for s in specs)
    raise InputError(f"unknown solver {name!r} for {kind}; expected one of {names}",
                     field="solver", value=name, expected=names)


def contract(kind: str, solver_name: str) -> tuple[str, ...] | None:
    """Return the guarantees the registered solver `solver_name` of `kind` promises, or None when no
    solver of that name is registered (so nothing it promised can be known)."""
    discover()
    spec = _SOLVERS.get(kind, {}).get(solver_name)
    return None if spec is None else spec.guarantees
