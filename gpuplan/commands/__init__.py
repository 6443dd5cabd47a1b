"""Model-specific CLI pieces. Each module here may define:

- `INPUTS = ProblemInputs(kind, params, build)`: how `gpuplan solve KIND ...` and
  `gpuplan compare KIND ...` read their arguments (default: one problem file), and
- `register(main)`: extra verbs (`gpuplan profile`, `gpuplan delta`, `gpuplan simulate ...`).

The CLI imports every module here; keep them thin: parse, call the API, print.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import click

from gpuplan.models.base import Problem


@dataclass(frozen=True)
class ProblemInputs:
    """The click parameters that describe a problem on the command line, and the builder.

    build(**values) receives the parameters' values by name and returns the Problem.
    """

    kind: str
    params: list[click.Parameter]
    build: Callable[..., Problem]
    help: str = ""


def default_inputs(kind: str) -> ProblemInputs:
    """Return the default inputs: one problem file (YAML or JSON) whose kind must be `kind`."""
    from gpuplan.api import load_problem

    def build(input: str, **_: Any) -> Problem:
        return load_problem(input, kind)

    return ProblemInputs(kind, [click.Argument(["input"], type=click.Path(dir_okay=False))], build,
                         help=f"INPUT is a {kind} problem file (YAML or JSON).")


def subgroup(main: click.Group, name: str, help: str) -> click.Group:
    """Return `main`'s verb group `name`, creating it (with `help`) when no other module has yet."""
    group = main.commands.get(name)
    if not isinstance(group, click.Group):
        group = click.Group(name, help=help)
        main.add_command(group)
    return group
