"""`gpuplan lagom-calibrate`: fit Lagom's group figures and measure compute-under-communication here; and
how `gpuplan solve|compare lagom` read their input (a Lagom problem file or a Poseidon plan file)."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuplan.cliout import OutputPath
from gpuplan.commands import ProblemInputs
from gpuplan.models.base import Problem


def _build(input: str, stage: int | None = None, **_: Any) -> Problem:
    """Return the LagomProblem in INPUT: a Lagom problem file, or a Poseidon plan file (one stage)."""
    from gpuplan.compose.lagom_input import load_lagom_input

    return load_lagom_input(input, stage)


INPUTS = ProblemInputs(
    "lagom",
    [click.Argument(["input"], type=click.Path(dir_okay=False)),
     click.Option(["--stage"], type=click.IntRange(0), default=None,
                  help="With a Poseidon plan: the stage whose collectives to tune (default: the bottleneck "
                       "stage among those on NCCL GPUs; a CPU stage is refused: gloo has no NCCL knobs).")],
    _build,
    help="INPUT is a lagom problem file (YAML or JSON) or a Poseidon plan file (JSON, from `gpuplan solve "
         "poseidon`): its stage's workload, as a `from_poseidon:` document builds it.")


def _channel_counts(text: str, most: int) -> list[int]:
    """Return the channel counts of a comma-separated list; raise click.BadParameter unless each is
    an integer in [1, most] (checked on every backend, so a typo never passes silently)."""
    out = []
    for part in text.split(","):
        try:
            n = int(part.strip())
        except ValueError:
            raise click.BadParameter(f"{part.strip()!r} is not an integer; expected counts like 1,2,4,8",
                                     param_hint="--channels") from None
        if not 1 <= n <= most:
            raise click.BadParameter(f"{n} is not in [1, {most}]", param_hint="--channels")
        out.append(n)
    return out


def register(main: click.Group) -> None:
    """Add the `lagom-calibrate` verb to the gpuplan command."""

    @main.command("lagom-calibrate")
    @click.option("--ranks", type=click.IntRange(1, 1024), default=2, show_default=True,
                  help="Local processes (GPUs with NCCL).")
    @click.option("--channels", default="1,2,4,8,16", show_default=True,
                  help="Channel counts swept with NCCL_MIN/MAX_CTAS (NCCL only; gloo has none).")
    @click.option("--quick", is_flag=True, help="Fewer sizes and repeats.")
    @click.option("-o", "--output", type=OutputPath(), default=None,
                  help="Write the fitted group fields (YAML) to paste under a workload's groups.")
    def calibrate(ranks: int, channels: str, quick: bool, output: str | None) -> None:
        """Time all_reduce per size (and channel count with NCCL), fit the group's per-channel bandwidth,
        cap and latency scale, and time a matmul loop alone and under all_reduces."""
        import yaml

        from gpuplan.errors import GpuplanError
        from gpuplan.io import atomic_write_text
        from gpuplan.models.lagom import cost
        from gpuplan.models.base import Table
        from gpuplan.profiling.lagom_calib import default_backend, fit_collective, measure_collectives, \
            measure_interference
        from gpuplan.render import print_tables

        asked = _channel_counts(channels, cost.MAX_CHANNELS)
        try:
            backend = default_backend()
            sizes = [2**k for k in range(12, 25, 4 if quick else 2)]
            ncs = asked if backend == "nccl" else [1]
            points = measure_collectives(ranks, sizes, ncs, backend=backend, repeats=3 if quick else 5)
            guess = cost.Link(ranks=ranks, nodes=1, intra="nvlink" if backend == "nccl" else "pcie",
                              channel_GBps=10.0, cap_GBps=100.0, channels=max(ncs))
            fit = fit_collective(points, "all_reduce", guess, cost.Consts())
            inter = measure_interference(ranks, backend=backend, iters=10 if quick else 20)
        except (GpuplanError, ValueError, RuntimeError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        rows: list[list[Any]] = [[f"{s / 1024:g} KiB", nc, t * 1e6] for s, nc, t in points]
        group = {"channels": max(ncs), "intra_GBps": round(fit["channel_GBps"] * max(ncs), 4),
                 "cap_GBps": round(fit["cap_GBps"], 4), "latency_scale": round(fit["latency_scale"], 4)}
        print_tables([Table(f"all_reduce among {ranks} ranks ({backend})", ["size", "channels", "time us"], rows),
                      Table("fitted group fields", ["field", "value"],
                            [[k, v] for k, v in group.items()] + [["max rel error", fit["max_rel_error"]]]),
                      Table("matmul loop alone vs under all_reduce", ["measure", "value"],
                            [["alone s", inter["alone_s"]], ["overlapped s", inter["overlapped_s"]],
                             ["slowdown", inter["slowdown"]]])])
        if output:
            atomic_write_text(output, yaml.safe_dump({"group": group, "measured_slowdown": inter["slowdown"],
                                                      "backend": backend}, sort_keys=False))
            click.echo(f"written to {output}")
