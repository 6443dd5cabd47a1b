"""`gpuplan profile`: measure this machine (or, under torchrun, several nodes) into a profile file;
`gpuplan profile merge` joins profiles taken separately; `gpuplan profile show` prints one."""

from __future__ import annotations

import os
import sys

import click

from gpuplan.errors import GpuplanError

DEFAULT_MODEL = "llama3-8b"


def _fail(message: str) -> None:
    """Report `message` as the CLI reports bad input (exit code 2)."""
    from gpuplan.cli import _fail as cli_fail

    cli_fail(GpuplanError(message))


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


@click.group("profile", invoke_without_command=True)
@click.option("-o", "--output", default="profile.json", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the profile (JSON).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Profile the CUDA GPUs, or the CPU as devices (auto: GPUs when there are any).")
@click.option("--quick", is_flag=True, help="Small sweeps: under a minute on a 2-core machine.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help="Catalog model whose layers are timed (gpt3-*, llama2-*, llama3-*, qwen3-*).")
@click.option("--validate", is_flag=True,
              help="Also predict stacks of 2, 4 and 8 layers from the layer table and measure them.")
@click.option("--cpu-ranks", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Without a GPU: how many devices (gloo processes) the CPU counts as.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.pass_context
def profile(ctx: click.Context, output: str, device: str, quick: bool, model: str, validate: bool,
            cpu_ranks: int, quiet: bool) -> None:
    """Measure devices, collectives and transformer layers with torch; write a profile every solver
    reads with --profile (or `cluster: {profile: FILE}`). Under torchrun, profiles every node."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuplan.models.profile import summary_tables
    from gpuplan.models.workload import model_config
    from gpuplan.render import print_tables

    try:
        model_config(model)
    except ValueError as exc:
        _fail(f"--model: expected {exc}")
    if _under_torchrun():
        from gpuplan.profiling.multinode import main as multinode_main

        args = ["-o", output, "--model", model, "--device", device] + (["--quick"] if quick else [])
        sys.exit(multinode_main(args))
    from gpuplan.cli import _progress
    from gpuplan.profiling.profile import ProfileOptions, run_profile

    options = ProfileOptions(device=device, quick=quick, model=model, cpu_ranks=cpu_ranks, validate=validate)
    try:
        with _progress(not quiet) as progress:
            result = run_profile(options, progress)
    except (GpuplanError, ValueError) as exc:
        _fail(str(exc))
    result.save(output)
    print_tables(summary_tables(result))
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(f"profile written to {output}")


@profile.command("merge")
@click.argument("profiles", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--link", "links", multiple=True, metavar="A:B:BANDWIDTH:LATENCY",
              help="A link between nodes of different profiles, e.g. n0:n1:100Gbps:5us (repeatable).")
@click.option("-o", "--output", default="profile.json", show_default=True, type=click.Path(dir_okay=False))
def merge_cmd(profiles: tuple[str, ...], links: tuple[str, ...], output: str) -> None:
    """Join profiles taken separately on different machines into one, with declared links."""
    from gpuplan.models.profile import load_profile
    from gpuplan.profiling.merge import merge_profiles, parse_link

    try:
        loaded = [load_profile(p) for p in profiles]
        merged = merge_profiles(loaded, [parse_link(l) for l in links], names=list(profiles))
    except GpuplanError as exc:
        _fail(str(exc))
    merged.save(output)
    for note in merged.notes:
        click.echo(f"note: {note}")
    click.echo(f"merged {len(loaded)} profiles ({len(merged.nodes)} nodes) into {output}")


@profile.command("show")
@click.argument("profile_file", type=click.Path(dir_okay=False))
def show_cmd(profile_file: str) -> None:
    """Print a profile as tables."""
    from gpuplan.models.profile import load_profile, summary_tables
    from gpuplan.render import print_tables

    try:
        print_tables(summary_tables(load_profile(profile_file)))
    except GpuplanError as exc:
        _fail(str(exc))


def register(main: click.Group) -> None:
    """Attach `gpuplan profile` (with `merge` and `show`) to the main command."""
    main.add_command(profile)
