"""`gpuplan plan train CLUSTER MODEL --batch B --seq S [--profile P] -o DIR`: one training job, end to end.

Also the bundle side of `check`, `show` and `run` (the CLI hands a bundle directory to these helpers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuplan.cliout import OutputDir, Seconds, json_flag
from gpuplan.commands.poseidon import EXECUTION_FIELDS, execution_options


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
    from gpuplan.render import layer_range

    comp = manifest.get("composition", {})
    stages = Table("stages (Poseidon) and their Lagom scale",
                   ["stage", "device type", "GPUs", "tp", "dp", "layers", "Lagom scale"],
                   [[s["index"], s["device_type"], len(s["gpu_ids"]), s["tp"], s["dp"],
                     layer_range(*s["layers"]), manifest["scales"][i]]
                    for i, s in enumerate(manifest.get("stages", []))])
    steps = Table("composition", ["figure", "value"],
                  [["method", comp.get("method")], ["rounds", comp.get("rounds")],
                   ["converged", comp.get("converged")], ["micro-batches", manifest.get("num_microbatches")]]
                  + [[f"{k} (wall)", v] for k, v in manifest.get("step_times_s", {}).items()]
                  + [["note", n] for n in manifest.get("notes", [])])
    return [stages, gains_table(manifest), steps]


def bundle_doc(path: str, manifest: dict[str, Any] | None, tables: list[Any]) -> dict[str, Any]:
    """Return the JSON fields every bundle document shares: plan_file, kind ("training-bundle"),
    predicted (iteration times in s and gains as fractions), gains (one row per step) and tables."""
    from gpuplan.cliout import table_doc
    from gpuplan.compose.bundle import BUNDLE_KIND

    manifest = manifest or {}
    return {"plan_file": path, "kind": BUNDLE_KIND, "predicted": manifest.get("predicted"),
            "gains": manifest.get("gains", []), "tables": [table_doc(t) for t in tables]}


def check_bundle_cli(path: str, json_out: str | None = None) -> None:
    """Check a bundle and print the verdict (with `json_out`, the document {command, plan_file, kind,
    status, valid, violations} as `check --json` prints it, status null); exit 1 on violations."""
    from gpuplan.cliout import print_check
    from gpuplan.compose import check_bundle
    from gpuplan.compose.bundle import BUNDLE_KIND

    print_check(path, BUNDLE_KIND, None, check_bundle(path), "training bundle: poseidon + tessel + lagom agree",
                json_out)


def show_bundle_cli(path: str, png: str | None, json_out: str | None = None) -> None:
    """Print a bundle's tables; with `png` draw the composed timeline; with `json_out` emit {command,
    plan_file, kind, predicted, gains, tables, valid, violations, png}. Exit 1 when it fails check."""
    from gpuplan.cliout import STDOUT, emit_json, say
    from gpuplan.compose.bundle import checked_bundle
    from gpuplan.render import print_tables

    violations, manifest, _ = checked_bundle(path)
    if violations and json_out:
        emit_json("show", {**bundle_doc(path, None, []), "valid": False,
                           "violations": [str(v) for v in violations], "png": None}, json_out)
        if json_out == STDOUT:
            sys.exit(1)
    if violations:
        click.echo(f"{path}: {len(violations)} violation(s); nothing is shown")
        for v in violations:
            click.echo(f"  {v}")
        sys.exit(1)
    tables = bundle_tables(manifest)
    if json_out != STDOUT:
        print_tables(tables)
    if png:
        from gpuplan.compose.view import draw_bundle

        draw_bundle(path, Path(png))
        say(f"figure written to {png}", json_out)
    emit_json("show", {**bundle_doc(path, manifest, tables), "valid": True, "violations": [], "png": png},
              json_out)


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
    @click.option("-o", "--output", type=OutputDir(), default="train-bundle", show_default=True,
                  help="The bundle directory to write.")
    @click.option("--time-limit", "time_limit", type=Seconds(), default=20.0, show_default=True,
                  help="Time limit of each solve (s).")
    @click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
    @json_flag(help="Print {command, bundle, plan_file, kind, predicted, gains, tables} as JSON (or write "
                    "it to FILE); see docs/index.md, Scripting.")
    def train(cluster: str, model: str | None, batch: int | None, seq: int | None, profile: str | None,
              output: str, time_limit: float, seed: int, json_out: str | None = None, **settings: Any) -> None:
        """Poseidon's parallel plan, Tessel's schedule of its stages, Lagom's NCCL settings for the
        collectives beside that schedule (iterated to a fixed point); writes a bundle and prints each
        step's predicted gain. CLUSTER is a cluster file, preset or whole poseidon problem file; MODEL a
        catalog name or model file."""
        from gpuplan.cliout import STDOUT, emit_json, say
        from gpuplan.compose import plan_training, read_manifest
        from gpuplan.errors import GpuplanError, InfeasibleError
        from gpuplan.render import print_tables

        try:
            plan_training(cluster, model, batch=batch, seq=seq, profile=profile, output=output,
                          time_limit_s=time_limit, seed=seed,
                          settings={field: settings.get(field) for field in EXECUTION_FIELDS})
        except InfeasibleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(3)
        except GpuplanError as exc:
            from gpuplan.cli import _fail

            _fail(exc)  # exit code 5 for a solver that stopped without a plan, else 2
        manifest = read_manifest(output)
        tables = bundle_tables(manifest)
        if json_out != STDOUT:
            print_tables(tables)
        emit_json("plan train", {"bundle": output, **bundle_doc(output, manifest, tables)}, json_out)
        say(f"bundle written to {output}", json_out)

    # the execution settings, as `solve poseidon` takes them, before --json
    json_at = next(i for i, param in enumerate(train.params) if param.name == "json_out")
    train.params[json_at:json_at] = execution_options()
