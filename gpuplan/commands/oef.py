"""`gpuplan simulate oef TRACE`: run a trace under OEF and the baselines, print one table.

`gpuplan simulate oef --gavel-trace FILE --gavel-throughputs FILE [--gavel-cluster 8:16:24]` reads
Gavel's own trace and throughput files instead (gpuplan.models.gavel_trace) and replays them with
Gavel's round mechanism.
"""

from __future__ import annotations

import click

from gpuplan import registry
from gpuplan.cliout import STDOUT, FiniteFloat, OutputPath, json_flag
from gpuplan.commands import subgroup
from gpuplan.errors import GpuplanError, InputError
from gpuplan.models.base import Table
from gpuplan.render import print_tables


def parse_gavel_cluster(spec: str) -> dict[str, int]:
    """Return {v100, p100, k80: GPUs} from Gavel's -c form 'V100:P100:K80' (e.g. '8:16:24')."""
    parts = spec.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise InputError(f"--gavel-cluster: three GPU counts V100:P100:K80 such as 8:16:24, not {spec!r}",
                         field="--gavel-cluster", value=spec)
    return dict(zip(("v100", "p100", "k80"), (int(p) for p in parts)))


@click.command("oef")
@click.argument("trace_file", type=click.Path(dir_okay=False), required=False)
@click.option("--policy", "policies", multiple=True,
              help="An oef solver to simulate (repeatable; default: every oef solver).")
@click.option("--gavel-trace", type=click.Path(dir_okay=False), default=None,
              help="A trace in Gavel's format (tab-separated, ten columns) instead of TRACE_FILE.")
@click.option("--gavel-throughputs", type=click.Path(dir_okay=False), default=None,
              help="Gavel's throughput JSON (simulation_throughputs.json); needed with --gavel-trace.")
@click.option("--gavel-cluster", default="8:16:24", show_default=True,
              help="V100:P100:K80 GPU counts for a Gavel trace (Gavel's -c).")
@click.option("--mechanism", type=click.Choice(["grid", "gavel"]), default=None,
              help="Round mechanism (default: gavel for a Gavel trace, grid otherwise).")
@click.option("--resolve-every-s", type=FiniteFloat(min=0, max=1e9), default=1920.0, show_default=True,
              help="With --mechanism gavel: re-allocate at most this often (0: at every arrival/finish).")
@click.option("--normalisation", type=click.Choice(["slowest", "best", "reference", "jobs"]), default=None,
              help="What OEF's efficiency measures normalised throughput against (default: the trace's).")
@click.option("--reference-type", default=None, help="GPU type for --normalisation reference/jobs.")
@click.option("--space-sharing", is_flag=True,
              help="With --mechanism gavel: pack waiting jobs onto running jobs' GPUs by measured co-location "
                   "throughputs (a Gavel throughput file's pairs, or the trace's `colocated`).")
@json_flag(help="Print the figures as one JSON document on stdout (or write it to FILE): a list with one "
                   "row per policy: policy, avg_jct_h, p95_jct_h, makespan_h, utilisation, ..., jct_s (per job).")
@click.option("--png", type=OutputPath(), default=None,
              help="Also draw the CDF of job completion times per policy to a PNG file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
def simulate_oef(trace_file: str | None, policies: tuple[str, ...], gavel_trace: str | None,
                 gavel_throughputs: str | None, gavel_cluster: str, mechanism: str | None, resolve_every_s: float,
                 normalisation: str | None, reference_type: str | None, space_sharing: bool, json_out: str | None,
                 quiet: bool, png: str | None = None) -> None:
    """Simulate a job trace round by round under each policy; print JCT, makespan, utilisation, fairness.

    \b
    Examples:
      gpuplan simulate oef examples/oef/trace-100.yaml --policy oef --policy gavel-maxmin --png jct.png
      gpuplan simulate oef examples/oef/trace-100.yaml --json > figures.json
    Exit codes: 0 simulated, 2 bad trace or option."""
    from gpuplan.models.base import validate
    from gpuplan.models.oef_trace import Trace, load_trace
    from gpuplan.solvers.oef.sim import simulate

    try:
        if gavel_trace is not None:
            if trace_file is not None or gavel_throughputs is None:
                raise InputError("--gavel-trace: give --gavel-throughputs FILE too, and no TRACE_FILE",
                                 field="--gavel-throughputs")
            from gpuplan.models.gavel_trace import load_gavel

            trace = load_gavel(gavel_trace, gavel_throughputs, parse_gavel_cluster(gavel_cluster),
                               space_sharing=space_sharing)
            source = gavel_trace
            mechanism = mechanism or "gavel"
        else:
            if trace_file is None:
                raise InputError("a TRACE_FILE, or --gavel-trace FILE with --gavel-throughputs FILE",
                                 field="TRACE_FILE")
            trace = load_trace(trace_file)
            source = trace_file
            mechanism = mechanism or "grid"
        if space_sharing and mechanism != "gavel":
            raise InputError("--space-sharing: only with --mechanism gavel", field="--space-sharing")
        if normalisation is not None or reference_type is not None:
            doc = trace.model_dump(mode="json", exclude_none=True)
            doc.update({k: v for k, v in (("normalisation", normalisation), ("reference_type", reference_type))
                        if v is not None})
            trace = validate(Trace, doc, file=source)
        names = list(policies) or [s.name for s in registry.solvers("oef")]
        for name in names:
            registry.solver("oef", name)
        rows, out = [], []
        for name in names:
            if not quiet and json_out != STDOUT:
                click.echo(f"simulating {name} ...", err=True)
            res = simulate(trace, name, mechanism=mechanism, resolve_every_s=resolve_every_s,
                           space_sharing=space_sharing)
            fig = res.figures()
            rows.append([name] + [fig[k] for k in ("avg_jct_h", "p95_jct_h", "makespan_h", "utilisation",
                                                   "useful_gpus", "ftf_mean", "ftf_max", "min_si_ratio",
                                                   "envy_allocations", "reallocations")])
            out.append({"policy": name, **fig, "jct_s": res.jct_s})
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)
    from gpuplan.cliout import emit_json, say

    if json_out != STDOUT:
        print_tables([Table(f"oef: simulated {len(trace.jobs)} jobs of {source} ({mechanism} rounds)",
                            ["policy", "avg JCT (h)", "p95 JCT (h)", "makespan (h)", "utilisation", "useful GPUs",
                             "FTF mean", "FTF max", "worst SI ratio", "allocations with envy", "re-allocations"],
                            rows)])
    emit_json("simulate", out, json_out)
    if png:
        from pathlib import Path

        from gpuplan.viz import jct_cdf_figure

        jct_cdf_figure(f"oef: JCT of {len(trace.jobs)} jobs ({mechanism} rounds)",
                       {o["policy"]: list(o["jct_s"].values()) for o in out}, Path(png))
        say(f"figure written to {png}", json_out)


def register(main: click.Group) -> None:
    """Add `gpuplan simulate oef` (creating the `simulate` group when no other model has)."""
    subgroup(main, "simulate", "Simulate a job trace under a model's policies.").add_command(simulate_oef)
