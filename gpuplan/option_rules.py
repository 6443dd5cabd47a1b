"""The domain of a solver option: the values its algorithm is defined for.

A solver gives one OptionRule per option when it registers (`register_solver(..., option_rules={...})`;
the straggler policies keep theirs beside their `defaults` in gpuplan/sim/tasks.py), and
`registry.check_options` refuses a value outside it with an InputError naming the option, the value
and what is expected. Build rules with `flag`, `one_of`, `integer`, `number` and `value_of`.

This module imports nothing from gpuplan, so models/, sim/ and solvers/ may all use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

RuleKind = Literal["bool", "choice", "int", "number", "value"]


@dataclass(frozen=True)
class OptionRule:
    """What one option accepts.

    kind: 'bool' (True or False), 'choice' (one of `choices`), 'int' (an integer), 'number' (an int or
    float) or 'value' (an instance of `types`, checked further by the solver; `what` describes it).
    low, high: the bounds of an int or number (None: unbounded on that side); low_open, high_open:
    whether that end is excluded. special: (value, meaning) pairs an int or number rule accepts
    besides its range (or names inside it), the sentinels the code documents (e.g. (-1, 'automatic'),
    (0, 'off')). none: what None means when None is accepted (an option whose default is None), else
    None: refused. nonfinite: whether nan and +-inf are accepted (never, unless a rule says so).
    """

    kind: RuleKind
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    special: tuple[tuple[Any, str], ...] = ()
    none: str | None = None
    nonfinite: bool = False
    types: tuple[type, ...] = ()
    what: str = ""

    def accepts(self, value: Any) -> bool:
        """Return whether `value` is in this rule's domain (a bool never counts as a number)."""
        if value is None:
            return self.none is not None
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return any(_same(value, c) for c in self.choices)
        if self.kind == "value":
            return isinstance(value, self.types) and not isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if any(_same(value, v) for v, _ in self.special):
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return self.nonfinite
        return self._in_range(value)

    def _in_range(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return True

    def describe(self) -> str:
        """Return what the rule accepts, as words for an error message or a listing
        (e.g. 'a number in [0, 1]', 'an integer >= 1, or 0 (automatic)')."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "value":
            text = self.what or " or ".join(t.__name__ for t in self.types)
        else:
            text = self._describe_range()
        extras = [f"{v!r} ({meaning})" for v, meaning in self.special]
        if self.none is not None:
            extras.append(f"None ({self.none})")
        if self.nonfinite and self.kind == "number":
            extras.append("nan or inf")
        return ", or ".join([text] + extras)

    def _describe_range(self) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        if self.kind == "number" and not self.nonfinite and (self.low is None or self.high is None):
            noun = "a finite number"
        lo, hi = _show(self.low), _show(self.high)
        if self.low is not None and self.high is not None:
            return f"{noun} in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {lo}"
        if self.high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {hi}"
        return noun


def _same(value: Any, ref: Any) -> bool:
    """Return whether `value` equals `ref` with bools and numbers kept apart (True is not 1)."""
    if isinstance(value, bool) or isinstance(ref, bool):
        return isinstance(value, bool) and isinstance(ref, bool) and value == ref
    if isinstance(ref, (int, float)):
        return isinstance(value, (int, float)) and value == ref
    return type(value) is type(ref) and value == ref


def _show(x: float | None) -> str:
    if x is None:
        return ""
    if float(x).is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")  # 1e9, 0.001, 2.5e-07


def _special(special: dict[Any, str] | None) -> tuple[tuple[Any, str], ...]:
    return tuple((special or {}).items())


def flag() -> OptionRule:
    """Return the rule of an on/off option: True or False."""
    return OptionRule("bool")


def one_of(*choices: Any) -> OptionRule:
    """Return the rule of an option that takes one of `choices` (e.g. the implemented methods)."""
    if not choices:
        raise ValueError("one_of needs at least one choice")
    return OptionRule("choice", choices=tuple(choices))


MAX_WORKERS = 256  # the most processes or CP-SAT search threads a `workers` option may ask for


def integer(low: int | None = None, high: int | None = None, *, special: dict[Any, str] | None = None,
            none: str | None = None) -> OptionRule:
    """Return the rule of an integer option in [low, high] (None: unbounded), also accepting the
    `special` sentinels (value -> meaning) and, when `none` says what it means, None."""
    return OptionRule("int", low=low, high=high, special=_special(special), none=none)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, special: dict[Any, str] | None = None, none: str | None = None,
           nonfinite: bool = False) -> OptionRule:
    """Return the rule of a real option between `low` and `high` (None: unbounded; `low_open` /
    `high_open` exclude that end), also accepting the `special` sentinels (value -> meaning), None
    when `none` says what it means, and nan/inf only with `nonfinite`."""
    return OptionRule("number", low=low, high=high, low_open=low_open, high_open=high_open,
                      special=_special(special), none=none, nonfinite=nonfinite)


def value_of(*types: type, what: str, none: str | None = None) -> OptionRule:
    """Return the rule of a structured option (an instance of `types`, described by `what`) whose
    content the solver itself checks; None too when `none` says what it means."""
    return OptionRule("value", types=tuple(types), what=what, none=none)


def is_nonfinite(value: Any) -> bool:
    """Return whether `value` is a float nan or +-inf."""
    return isinstance(value, float) and not math.isfinite(value)
