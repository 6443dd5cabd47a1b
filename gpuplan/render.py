"""Presentation shared by the models: tables in the terminal (rich) and plan headers."""

from __future__ import annotations

import math
from typing import Any

from gpuplan.models.base import Table
from gpuplan.models.plan import Plan


def fmt(value: Any) -> str:
    """Return a short text for a table cell: 4 significant digits for floats, '-' for None/NaN."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def layer_range(first: int, last: int) -> str:
    """Return the text of a stage's layers `first` up to, not including, `last`: '[0, 16)' for layers 0
    to 15, half-open as the plan stores them (first_layer, last_layer) and docs/poseidon.md writes them;
    every human-facing table of stage layers uses it."""
    return f"[{first}, {last})"


def plan_header(plan: Plan) -> Table:
    """Return the table of a plan's common fields (kind, status, objective, predicted, solver)."""
    rows: list[list[Any]] = [["kind", plan.kind], ["status", plan.status.value]]
    if plan.objective is not None:
        rows.append([f"objective ({plan.objective_name or 'value'})", plan.objective])
    for k, v in plan.predicted.items():
        rows.append([f"predicted {k}", v])
    if plan.solver:
        rows += [["solver", plan.solver.name], ["seed", plan.solver.seed],
                 ["solve time (s)", plan.solver.wall_time_s]]
    if plan.message:
        rows.append(["message", plan.message])
    rows.append(["input digest", plan.input_digest[:23] + "..." if plan.input_digest else "-"])
    return Table("plan", ["field", "value"], rows)


def print_tables(tables: list[Table], console: Any = None) -> None:
    """Print tables: box-drawn with rich on a terminal, aligned plain text (no box drawing, whole
    cells) when stdout is piped or captured; return None."""
    from rich.console import Console
    from rich.table import Table as RichTable

    if console is None:
        import sys

        if not sys.stdout.isatty():
            import click

            for t in tables:
                click.echo(table_text(t) + "\n")
            return
        console = Console()
    for t in tables:
        rt = RichTable(title=t.title, title_justify="left")
        for c in t.columns:
            rt.add_column(c)
        for r in t.rows:
            rt.add_row(*[fmt(v) for v in r])
        console.print(rt)


def table_text(table: Table) -> str:
    """Return a table as aligned plain text (for benchmarks and docs)."""
    cells = [table.columns] + [[fmt(v) for v in r] for r in table.rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(table.columns))]
    # numbers right-aligned, text (and the header) left-aligned
    numeric = [[isinstance(v, (int, float)) and not isinstance(v, bool) for v in r] for r in table.rows]
    lines = [table.title] if table.title else []
    for j, row in enumerate(cells):
        lines.append("  ".join(str(c).rjust(w) if j and i < len(numeric[j - 1]) and numeric[j - 1][i]
                               else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
