"""Errors that gpuplan raises for bad input, so callers and the CLI can report them plainly.

The CLI turns them into exit codes: 0 success, 1 a plan with violations (`check`), 2 bad input,
options or output path (InputError, OutputError, any other GpuplanError; also click's usage errors),
3 an infeasible problem (the plan file says why), 5 a solver that stopped without a plan
(SolverError: out of time or numerical trouble; not a proof of infeasibility). `gpuplan run ...
-- COMMAND` exits with the command's own exit code.
"""

from __future__ import annotations

from typing import Any


def shown(value: Any) -> str:
    """Return repr(value) cut to 80 characters, as error messages show a value (one line, however big)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class GpuplanError(Exception):
    """Base class of every error gpuplan raises on purpose."""


class InputError(GpuplanError, ValueError):
    """A bad input file or value: names the file, the field path, the value and what was expected."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 value: Any = None, expected: str | None = None) -> None:
        self.file, self.field, self.value, self.expected = file, field, value, expected
        super().__init__(message)

    @classmethod
    def at(cls, file: str | None, field: str, value: Any, expected: str) -> "InputError":
        """Build the one-line message `FILE: field F: got V; expected E`."""
        where = f"{file}: " if file else ""
        return cls(f"{where}field '{field}': got {shown(value)}; expected {expected}",
                   file=file, field=field, value=value, expected=expected)


class OutputError(GpuplanError, OSError):
    """An output path that cannot be written (empty, a directory, its folder a file or read-only)."""


class InfeasibleError(GpuplanError):
    """A problem that has no valid plan; the message says why."""


class SolverError(GpuplanError):
    """A solver failed for a reason other than infeasibility (e.g. numerical trouble)."""
