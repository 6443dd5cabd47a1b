"""`gpuplan plan train CLUSTER MODEL --batch B --seq S [--profile P] -o DIR`: one training job, end to end.

Also the bundle side of `check`, `show` and `run` (the CLI hands a bundle directory to these helpers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click


def gains_table(manifest: dict[str, Any]) -> Any:
    """Return the Table of a bundle's gains: each step's predicted iteration time (s) and gains."""
    from gpuplan.models.base import Table

    return Table("predicted iteration time, step by step",
                 ["step", "iteration s", "gain vs previous", "gain vs baseline"],
                 [[g["step"], g["iteration_time_s"], f"{100 * g['gain_over_previous']:.2f}%",
                   f"{100 * g['gain_over_baseline']:.2f}%"] for g in manifest["gains"]])


def bundle_tables(manifest: dict[str, Any]) -> list[Any]:
    """Return the tables describing a bundle: its stages, scales and gains, and what each step took."""
    from gpuplan.models.base import Table

    comp = manifest.get("composition", {})
    stages = Table("stages (Poseidon) and their Lagom scale",
                   ["stage", "device type", "GPUs", "tp", "dp", "layers", "Lagom scale"],
                   [[s["index"], s["device_type"], len(s["gpu_ids"]), s["tp"], s["dp"],
                     f"{s['layers'][0]}-{s['layers'][1]}", manifest["scales"][i]]
                    for i, s in enumerate(manifest.get("stages", []))])
    steps = Table("composition", ["figure", "value"],
                  [["method", comp.get("method")], ["rounds", comp.get("rounds")],
                   ["converged", comp.get("converged")], ["micro-batches", manifest.get("num_microbatches")]]
                  + [[f"{k} (wall)", v] for k, v in manifest.get("step_times_s", {}).items()]
                  + [["note", n] for n in manifest.get("notes", [])])
    return [stages, gains_table(manifest), steps]


def check_bundle_cli(path: str) -> None:
    """Check a bundle and print the verdict; exit 1 on violations."""
    from gpuplan.compose import check_bundle

    violations = check_bundle(path)
    if not violations:
        click.echo(f"{path}: valid (training bundle: poseidon + tessel + lagom agree)")
        return
    click.echo(f"{path}: {len(violations)} violation(s)")
    for v in violations:
        click.echo(f"  {v}")
    sys.exit(1)


def show_bundle_cli(path: str, png: str | None) -> None:
    """Print a bundle's tables; with `png` draw the composed timeline. Exit 1 when it fails check."""
    from gpuplan.compose import check_bundle, read_manifest
    from gpuplan.render import print_tables

    violations = check_bundle(path)
    if violations:
        click.echo(f"{path}: {len(violations)} violation(s); nothing is shown")
        for v in violations:
            click.echo(f"  {v}")
        sys.exit(1)
    manifest = read_manifest(path)
    print_tables(bundle_tables(manifest))
    if png:
        from gpuplan.compose.view import draw_bundle

        draw_bundle(path, Path(png))
        click.echo(f"figure written to {png}")


def register(main: click.Group) -> None:
    """Add `gpuplan plan train`."""
    group = main.commands.get("plan")
    if not isinstance(group, click.Group):
        group = click.Group("plan", help="Plan a whole job by composing several models' plans.")
        main.add_command(group)

    @group.command("train")
    @click.argument("cluster")
    @click.argument("model", required=False)
    @click.option("--batch", type=click.IntRange(1), default=None, help="Global batch size (sequences).")
    @click.option("--seq", type=click.IntRange(1), default=None, help="Sequence length (tokens).")
    @click.option("--profile", type=click.Path(dir_okay=False), default=None,
                  help="Measured figures from `gpuplan profile` in place of the catalog's.")
    @click.option("-o", "--output", type=click.Path(file_okay=False), default="train-bundle", show_default=True,
                  help="The bundle directory to write.")
    @click.option("--time-limit", "time_limit", type=float, default=20.0, show_default=True,
                  help="Time limit of each solve (s).")
    @click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
    def train(cluster: str, model: str | None, batch: int | None, seq: int | None, profile: str | None,
              output: str, time_limit: float, seed: int) -> None:
        """Poseidon's parallel plan, Tessel's schedule of its stages, Lagom's NCCL settings for the
        collectives beside that schedule (iterated to a fixed point); writes a bundle and prints each
        step's predicted gain. CLUSTER is a cluster file, preset or whole poseidon problem file; MODEL a
        catalog name or model file."""
        from gpuplan.compose import plan_training, read_manifest
        from gpuplan.errors import GpuplanError, InfeasibleError
        from gpuplan.render import print_tables

        if time_limit <= 0 or time_limit != time_limit or time_limit == float("inf"):
            raise click.BadParameter(f"{time_limit!r}: a positive, finite number of seconds",
                                     param_hint="--time-limit")
        try:
            plan_training(cluster, model, batch=batch, seq=seq, profile=profile, output=output,
                          time_limit_s=time_limit, seed=seed)
        except InfeasibleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(3)
        except GpuplanError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        print_tables(bundle_tables(read_manifest(output)))
        click.echo(f"bundle written to {output}")
