"""Predicted against measured, the way `gpuplan run` reports it: relative errors, the 15 % warning,
and the machine's contention as a table."""

from __future__ import annotations

from typing import Any

from gpuplan.models.base import Table

# A prediction further than this from the measurement (relative) gets a warning.
TOLERANCE = 0.15


def rel_error(predicted: float, measured: float) -> float:
    """Return (predicted - measured) / measured (nan when nothing was measured)."""
    return (predicted - measured) / measured if measured > 0 else float("nan")


def pct(x: float) -> str:
    """Return a signed percentage such as '+12.3%'."""
    return f"{x:+.1%}"


def off(predicted: float, measured: float) -> bool:
    """True when the prediction is further than TOLERANCE from the measurement (or not comparable)."""
    e = rel_error(predicted, measured)
    return not abs(e) <= TOLERANCE


def machine_table(fields: dict[str, Any]) -> Table:
    """Return the contention fields of a run (gpuplan.runtime.contention.report) as a table."""
    def share(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.0%} of {fields['cores']} cores"

    def load(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.2f}"

    rows = [["load average (1 min) before", load(fields["load_before"])],
            ["load average (1 min) during, max (incl. this run)", load(fields["load_during_max"])],
            ["other processes' CPU before", share(fields["others_cpu_share_before"])],
            ["other processes' CPU during", share(fields["others_cpu_share_during"])],
            ["busiest other processes (share of one core)", fields["busiest_others"]],
            ["step times spread (p90 - p10) / median", f"{fields['step_spread']:.1%}"],
            ["contended", "YES" if fields["contended"] else "no"]]
    return Table("machine during the measurement", ["measure", "value"], rows)


def contention_warnings(fields: dict[str, Any]) -> list[str]:
    """Return the warning a run on a contended (or unsteady) machine gets, from the contention fields."""
    if fields["contended"]:
        share = max(x or 0.0 for x in (fields["others_cpu_share_before"], fields["others_cpu_share_during"]))
        return [f"measured on a CONTENDED machine: other processes used {share:.0%} of the {fields['cores']} cores "
                f"around the run; the measured times are not the plan's own (rerun on a quiet machine)"]
    if fields["unsteady"]:
        return [f"step times spread {fields['step_spread']:.0%}: the measurement is unsteady"]
    return []
