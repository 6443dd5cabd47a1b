"""`gpuplan simulate oef TRACE`: run a trace under OEF and the baselines, print one table."""

from __future__ import annotations

import json

import click

from gpuplan import registry
from gpuplan.errors import GpuplanError
from gpuplan.models.base import Table
from gpuplan.render import print_tables


@click.command("oef")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.option("--policy", "policies", multiple=True,
              help="An oef solver to simulate (repeatable; default: every oef solver).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the figures (and each job's JCT) as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
def simulate_oef(trace_file: str, policies: tuple[str, ...], json_out: str | None, quiet: bool) -> None:
    """Simulate a job trace round by round under each policy; print JCT, makespan, utilisation, fairness."""
    from gpuplan.io import atomic_write_text
    from gpuplan.models.oef_trace import load_trace
    from gpuplan.solvers.oef_sim import simulate

    try:
        trace = load_trace(trace_file)
        names = list(policies) or [s.name for s in registry.solvers("oef")]
        for name in names:
            registry.solver("oef", name)
        rows, out = [], []
        for name in names:
            if not quiet:
                click.echo(f"simulating {name} ...", err=True)
            res = simulate(trace, name)
            fig = res.figures()
            rows.append([name] + [fig[k] for k in ("avg_jct_h", "p95_jct_h", "makespan_h", "utilisation",
                                                   "ftf_mean", "ftf_max", "reallocations")])
            out.append({"policy": name, **fig, "jct_s": res.jct_s})
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)
    print_tables([Table(f"oef: simulated {len(trace.jobs)} jobs of {trace_file}",
                        ["policy", "avg JCT (h)", "p95 JCT (h)", "makespan (h)", "utilisation",
                         "FTF mean", "FTF max", "re-allocations"], rows)])
    if json_out:
        atomic_write_text(json_out, json.dumps(out, indent=1))


def register(main: click.Group) -> None:
    """Add `gpuplan simulate oef` (creating the `simulate` group when no other model has)."""
    group = main.commands.get("simulate")
    if not isinstance(group, click.Group):
        group = click.Group("simulate", help="Simulate a job trace under a model's policies.")
        main.add_command(group)
    group.add_command(simulate_oef)
