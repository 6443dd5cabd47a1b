"""Output conventions shared by every `gpuplan` verb: `--json [FILE]`, logging for -v/-q.

`--json` alone (or `--json -`) prints one JSON document on stdout and nothing else there (messages go
to stderr); `--json FILE` writes the document to FILE and keeps the tables on stdout. A document is a mapping
whose first key is `command` (the verb, e.g. "solve"), or for compare and simulate a list of rows
(one per solver or policy); the keys are listed in docs/index.md ("Scripting"); tables appear as
{"title", "columns", "rows"} with raw numbers.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from typing import Any, Callable, TypeVar

import click

from gpuplan.models.base import Table

STDOUT = "-"
F = TypeVar("F", bound=Callable[..., Any])
LOG = logging.getLogger("gpuplan")


_JSON_HELP = ("Print one JSON document on stdout (nothing else goes there), or with FILE write it to FILE. "
              "Keys: see docs/index.md, Scripting.")


def _json_dest(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Return the --json destination, refusing an unwritable FILE at once (see OutputPath)."""
    if value is not None and value != STDOUT:
        _refuse_output(value, param, ctx)
    return value


def _json_kwargs(help: str | None) -> dict[str, Any]:
    return {"is_flag": False, "flag_value": STDOUT, "default": None, "metavar": "[FILE]", "help": help or _JSON_HELP,
            "callback": _json_dest}


def _refuse_output(value: str, param: click.Parameter | None, ctx: click.Context | None,
                   directory: bool = False) -> None:
    """Raise click's BadParameter (exit code 2) when gpuplan.io.check_output_path (check_output_dir with
    `directory`) refuses `value`."""
    from gpuplan.errors import OutputError
    from gpuplan.io import check_output_dir, check_output_path

    try:
        (check_output_dir if directory else check_output_path)(value)
    except OutputError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


class OutputPath(click.Path):
    """An output FILE option, checked when the command line is read (gpuplan.io.check_output_path: not a
    directory, FIFO or device, its folders writable), so a bad path fails before a long solve, not after."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the path, or fail with one line naming it and why it cannot be written."""
        path = super().convert(value, param, ctx)
        _refuse_output(str(path), param, ctx)
        return path


class OutputDir(click.Path):
    """An output DIRECTORY option (a bundle, a job folder), checked when the command line is read
    (gpuplan.io.check_output_dir: not a file, no file among the folders above it, the nearest existing
    folder writable)."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the path, or fail with one line naming it and why no folder can be written there."""
        path = super().convert(value, param, ctx)
        _refuse_output(str(path), param, ctx, directory=True)
        return path


class FiniteFloat(click.FloatRange):
    """A finite number within optional bounds: click's FloatRange lets nan through every bound (each
    comparison with nan is false), and a plain float accepts nan and inf."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the number, or fail naming the value and the finite range expected."""
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r}: expected a finite number{self._describe_bounds()}", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_bounds(self) -> str:
        if self.min is None and self.max is None:
            return ""
        return f" in {self._describe_range()}"


class Seconds(click.ParamType):
    """A positive, finite number of seconds (refuses 0, negatives, inf and nan)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Return the seconds as a float, or fail naming the value."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number <= 0:
            self.fail(f"{value!r}: expected a positive, finite number of seconds", param, ctx)
        return number


def json_option(help: str | None = None) -> click.Option:
    """Return the `--json [FILE]` option (value 'json_out': None, '-' for stdout, or a path); `help`
    names the keys of this command's document."""
    return click.Option(["--json", "json_out"], **_json_kwargs(help))


def json_flag(help: str | None = None) -> Callable[[F], F]:
    """Return a decorator adding the shared `--json [FILE]` option (see json_option) to a command."""
    return click.option("--json", "json_out", **_json_kwargs(help))


def jsonable(value: Any) -> Any:
    """Return `value` with every non-finite float as None and unknown objects as text (JSON-safe)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # enums
        return value.value
    return str(value)


def table_doc(table: Table) -> dict[str, Any]:
    """Return a table as {"title", "columns", "rows"} with raw (unformatted) cell values."""
    return {"title": table.title, "columns": list(table.columns), "rows": jsonable(table.rows)}


def emit_json(command: str, doc: dict[str, Any] | list[Any], dest: str | None) -> None:
    """Write the document as JSON to stdout (dest '-') or atomically to the file `dest`; a mapping gets
    "command": command as its first key (compare and simulate write a list of rows, one per solver or
    policy, as they always have); return None (does nothing when dest is None)."""
    if dest is None:
        return
    body = {"command": command, **doc} if isinstance(doc, dict) else doc
    text = json.dumps(jsonable(body), indent=1) + "\n"
    if dest == STDOUT:
        click.echo(text, nl=False)
    else:
        from gpuplan.io import atomic_write_text

        atomic_write_text(dest, text)


def print_check(plan_file: str, kind: str, status: str | None, violations: list[Any], valid_note: str,
                json_out: str | None) -> None:
    """Print a check verdict (or emit {command: check, plan_file, kind, status, valid, violations});
    return when valid, exit 1 on violations."""
    emit_json("check", {"plan_file": plan_file, "kind": kind, "status": status, "valid": not violations,
                        "violations": [str(v) for v in violations]}, json_out)
    if json_out != STDOUT:
        if not violations:
            click.echo(f"{plan_file}: valid ({valid_note})")
        else:
            click.echo(f"{plan_file}: {len(violations)} violation(s)")
            for v in violations:
                click.echo(f"  {v}")
    if violations:
        sys.exit(1)


def say(message: str, json_out: str | None) -> None:
    """Echo a human message: on stdout normally, on stderr when stdout carries the JSON document."""
    click.echo(message, err=json_out == STDOUT)


def setup_logging(verbosity: int) -> None:
    """Configure the `gpuplan` logger on stderr: -1 (-q) warnings only, 0 warnings, 1 (-v) info,
    2 (-vv) debug; return None."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    if verbosity < 0:
        level = logging.ERROR
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    LOG.handlers[:] = [handler]
    LOG.setLevel(level)
    LOG.propagate = False
