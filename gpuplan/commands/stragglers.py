"""`gpuplan simulate stragglers INPUT --policy P --load L`: weighted flowtime of policies across loads.

`gpuplan solve stragglers INPUT [--solver srptms-c]` and `gpuplan compare stragglers INPUT` use the frame's
default one-file input (a YAML/JSON problem; `trace: FILE.csv` inside it reads a CSV trace).
"""

from __future__ import annotations

from typing import Any

import click

from gpuplan.cliout import STDOUT, FiniteFloat, OutputPath, json_flag
from gpuplan.commands import subgroup
from gpuplan.errors import GpuplanError, InputError

MAX_LOADS = 16
MAX_POLICIES = 32


def at_load(problem: Any, load: float) -> Any:
    """Return the problem at offered load `load`: a generated workload's `load` replaced, or a listed job
    set's arrival times scaled (gaps stretched or shrunk) so its offered load is `load`."""
    from gpuplan.models.base import validate
    from gpuplan.models.stragglers import StragglersProblem

    doc = problem.document()
    if problem.workload is not None:
        doc["workload"]["load"] = load
    else:
        now = problem.offered_load()
        if now >= 1e6:
            raise InputError("--load: the jobs all arrive at once, so no load can be set by scaling their arrivals",
                             field="--load", value=load)
        first = min(j["arrival_s"] for j in doc["jobs"])
        for j in doc["jobs"]:
            j["arrival_s"] = first + (j["arrival_s"] - first) * now / load
    return validate(StragglersProblem, doc)


@click.command("stragglers")
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("--policy", "policies", multiple=True,
              help="A stragglers policy (solver name; repeatable). Default: every one.")
@click.option("--load", "loads", multiple=True, type=FiniteFloat(0.01, 1.5),
              help="Offered load(s) to simulate at (repeatable); default: the input's.")
@click.option("--seed", type=click.IntRange(0, 2**32), default=0, show_default=True, help="Simulation seed.")
@json_flag(help="Print the figures as JSON on stdout (or write them to FILE): one row per policy and load.")
@click.option("--png", type=OutputPath(), default=None,
              help="Draw weighted flowtime against load per policy to a PNG file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
def simulate_stragglers(input: str, policies: tuple[str, ...], loads: tuple[float, ...], seed: int,
                        json_out: str | None, png: str | None, quiet: bool) -> None:
    """Simulate the jobs of INPUT under each policy at each load; print weighted flowtime, its ratio to
    Mantri's, machine time and the LP bound (small instances).

    \b
    Examples:
      gpuplan simulate stragglers examples/stragglers/synthetic.yaml --policy srptms-c --policy sca --load 0.3 --load 0.9
      gpuplan simulate stragglers examples/stragglers/small-trace.yaml --png flowtime.png
    Exit codes: 0 simulated, 2 bad input or option."""
    from gpuplan import registry
    from gpuplan.api import load_problem
    from gpuplan.cliout import emit_json, say
    from gpuplan.models.base import Table
    from gpuplan.models.stragglers import simulate_problem
    from gpuplan.render import print_tables

    try:
        problem = load_problem(input, "stragglers")
        names = list(dict.fromkeys(policies)) or [s.name for s in registry.solvers("stragglers")]
        if len(names) > MAX_POLICIES or len(loads) > MAX_LOADS:
            raise InputError(f"at most {MAX_POLICIES} policies and {MAX_LOADS} loads", field="--load")
        for n in names:
            registry.solver("stragglers", n)
        if "mantri" not in names:
            names.append("mantri")  # the reference every ratio is taken against
        rows, out = [], []
        for load in (loads or (None,)):
            prob = problem if load is None else at_load(problem, load)
            bound = None
            from gpuplan.solvers.stragglers_lp import lp_applicable, lower_bound

            if not lp_applicable(prob):
                bound = lower_bound(prob, "limit")
            figs = {}
            for n in names:
                if not quiet and json_out != STDOUT:
                    click.echo(f"simulating {n} at load {prob.offered_load():.3g} ...", err=True)
                res, f = simulate_problem(prob, n, {}, seed, record=False)
                figs[n] = (res, f)
            ref = figs["mantri"][1]["weighted_flowtime_s"]
            for n in names:
                res, f = figs[n]
                wft = f["weighted_flowtime_s"]
                row = {"policy": n, "regime": res.params.get("regime", ""), "load": f["offered_load"],
                       "weighted_flowtime_s": wft, "vs_mantri": wft / ref if ref > 0 else float("nan"),
                       "mean_flowtime_s": f["mean_flowtime_s"], "machine_time_s": f["machine_time_s"],
                       "lp_bound_s": bound, "over_lp_bound": wft / bound if bound else None}
                out.append(row)
                rows.append([n + (f" ({row['regime']})" if row["regime"] else ""), row["load"], wft,
                             row["vs_mantri"], row["mean_flowtime_s"], row["machine_time_s"], row["over_lp_bound"]])
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)
    if json_out != STDOUT:
        print_tables([Table(f"stragglers: {len(problem.arrays[0])} jobs on {problem.slots} slots, "
                            f"{problem.variability.build()!r}, seed {seed}",
                            ["policy", "load", "weighted flowtime (s)", "vs Mantri", "mean flowtime (s)",
                             "machine time (slot-s)", "over LP bound"], rows)])
    emit_json("simulate", out, json_out)
    if png:
        from pathlib import Path

        from gpuplan.viz import _pyplot, _save, series_colour

        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(9, 5))
        for i, n in enumerate(names):
            pts = sorted((r["load"], r["weighted_flowtime_s"]) for r in out if r["policy"] == n)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=series_colour(i), label=n)
        ax.set_yscale("log")
        ax.set_xlabel("offered load")
        ax.set_ylabel("weighted flowtime (s)")
        ax.set_title(f"stragglers: weighted flowtime vs load ({problem.variability.build()!r})")
        ax.legend(fontsize=8, ncol=2)
        _save(fig, Path(png))
        say(f"figure written to {png}", json_out)


def register(main: click.Group) -> None:
    """Add `gpuplan simulate stragglers` (creating the `simulate` group when no other model has)."""
    subgroup(main, "simulate", "Simulate a job trace under a model's policies.").add_command(simulate_stragglers)
