"""`gpuplan profile`: measure this machine (or, under torchrun, several nodes) into a profile file;
`gpuplan profile merge` joins profiles taken separately; `gpuplan profile show` prints one."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import click

from gpuplan.cliout import OutputPath, json_flag
from gpuplan.errors import GpuplanError, InputError
from gpuplan.models.workload import TransformerConfig, model_config

DEFAULT_MODEL = "llama3-8b"


def _fail(message: str) -> None:
    """Report `message` as the CLI reports bad input (exit code 2)."""
    from gpuplan.cli import _fail as cli_fail

    cli_fail(GpuplanError(message))


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


@click.group("profile", invoke_without_command=True)
@click.option("-o", "--output", default="profile.json", show_default=True, type=OutputPath(),
              help="Where to write the profile (JSON).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Profile the CUDA GPUs, or the CPU as devices (auto: GPUs when there are any).")
@click.option("--quick", is_flag=True, help="Small sweeps: under a minute on a 2-core machine.")
@click.option("--model", default=None,
              help=f"Model whose layers are timed: a catalog name (gpt3-*, llama2-*, llama3-*, qwen3-*; on CPU "
                   f"timed in a scaled copy, which the profile records) or an exact shape as a JSON/YAML mapping "
                   f"(timed as given). Default {DEFAULT_MODEL}, or the --for problem's model.")
@click.option("--for", "for_problem", type=click.Path(dir_okay=False), default=None,
              help="A poseidon problem file: time its model exactly, at its sequence length and the micro-batch "
                   "sizes its global batch allows.")
@click.option("--seq-len", type=click.IntRange(1), default=None,
              help="Sequence length to time an exact --model at (default 128, or the --for problem's).")
@click.option("--micro-batches", default=None, metavar="B1,B2,...",
              help="Micro-batch sizes to time an exact --model at (default 1,2,4, or the --for problem's).")
@click.option("--emulate", "emulate", multiple=True, metavar="NAME=BASE*FACTOR",
              help="Record device type NAME as measured type BASE slowed down FACTOR times (e.g. "
                   "cpu-slow2x=cpu*2); solves keep NAME and runs emulate it (repeatable).")
@click.option("--validate", is_flag=True,
              help="Also predict stacks of 2, 4 and 8 layers from the layer table and measure them.")
@click.option("--cpu-ranks", type=click.IntRange(1, 64), default=None,
              help="Without a GPU: how many devices (gloo processes) the CPU counts as (default 2, or the most "
                   "devices a node of the --for problem holds).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.pass_context
def profile(ctx: click.Context, output: str, device: str, quick: bool, model: str | None, for_problem: str | None,
            seq_len: int | None, micro_batches: str | None, emulate: tuple[str, ...], validate: bool,
            cpu_ranks: int | None, quiet: bool) -> None:
    """Measure devices, collectives and transformer layers with torch; write a profile every solver
    reads with --profile (or `cluster: {profile: FILE}`). Under torchrun, profiles every node."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuplan.models.profile import parse_emulation, summary_tables
    from gpuplan.render import print_tables

    try:
        target = layer_target(model, for_problem, seq_len, micro_batches)
        emulated = tuple(parse_emulation(e) for e in emulate)
    except GpuplanError as exc:
        _fail(str(exc))
    model = target.catalog or DEFAULT_MODEL
    cpu_ranks = cpu_ranks or target.devices_per_node or 2
    if _under_torchrun():
        if target.config is not None or emulated:
            _fail("under torchrun, profile a catalog --model without --emulate (exact shapes: profile one node)")
        from gpuplan.profiling.multinode import main as multinode_main

        args = ["-o", output, "--model", model, "--device", device] + (["--quick"] if quick else [])
        sys.exit(multinode_main(args))
    from gpuplan.cli import _progress
    from gpuplan.profiling.profile import ProfileOptions, run_profile

    options = ProfileOptions(device=device, quick=quick, model=model, cpu_ranks=cpu_ranks, validate=validate,
                             config=target.config, seq_lens=target.seq_lens, micro_batches=target.micro_batches,
                             emulate=emulated)
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


@dataclass(frozen=True)
class LayerTarget:
    """The model `gpuplan profile` times: a catalog name (scaled on CPU) or an exact shape with
    its sequence lengths and micro-batch sizes."""

    catalog: str | None
    config: TransformerConfig | None = None
    seq_lens: tuple[int, ...] = ()
    micro_batches: tuple[int, ...] = ()
    devices_per_node: int | None = None


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise InputError.at(None, option, text, "positive integers separated by commas, e.g. 1,2,4")
    return values


def layer_target(model: str | None, for_problem: str | None, seq_len: int | None,
                 micro_batches: str | None) -> LayerTarget:
    """Return what to time from the --model, --for, --seq-len and --micro-batches options; raise
    InputError naming the option and value when they do not describe one model."""
    from gpuplan.models.profile_map import micro_batch_sizes

    mbs = _int_list(micro_batches, "--micro-batches") if micro_batches else ()
    if for_problem:
        if model:
            raise InputError.at(None, "--model", model, "no --model with --for (the problem names the model)")
        from gpuplan.api import load_problem

        problem = load_problem(for_problem, "poseidon")
        most = max(sum(n.gpus.values()) for n in problem.cluster.nodes)  # type: ignore[attr-defined]
        return LayerTarget(None, problem.model, (seq_len or problem.seq_len,),  # type: ignore[attr-defined]
                           mbs or tuple(micro_batch_sizes(problem.global_batch)), most)  # type: ignore[attr-defined]
    text = (model or "").strip()
    if text.startswith("{"):
        from pydantic import ValidationError

        from gpuplan.io import parse_document
        from gpuplan.models.base import input_error_from

        data = parse_document(text, "--model")  # bounded like input files; InputError when not YAML
        try:
            config = model_config(data)
        except ValidationError as exc:  # one line per bad field, as for input files
            raise input_error_from(exc, "--model") from None
        except ValueError as exc:
            raise InputError.at(None, "--model", text, f"a model shape mapping ({exc})") from None
        return LayerTarget(None, config, (seq_len or min(128, config.max_seq_len),), mbs or (1, 2, 4))
    if seq_len or mbs:
        raise InputError.at(None, "--seq-len/--micro-batches", seq_len or micro_batches,
                            "only with an exact --model mapping or --for (a catalog model is timed in the "
                            "profiler's own scaled shapes)")
    name = text or DEFAULT_MODEL
    try:
        model_config(name)
    except ValueError as exc:
        raise InputError.at(None, "--model", name, str(exc)) from None
    return LayerTarget(name)


@profile.command("merge")
@click.argument("profiles", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--link", "links", multiple=True, metavar="A:B:BANDWIDTH:LATENCY",
              help="A link between nodes of different profiles, e.g. n0:n1:100Gbps:5us (repeatable).")
@click.option("-o", "--output", default="profile.json", show_default=True, type=OutputPath())
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
@click.option("--png", type=OutputPath(), default=None,
              help="Also draw the matmul throughput and collective time curves (with their fits) to a PNG file.")
@json_flag(help="Print {command, profile_file, tables: [{title, columns, rows}]} as JSON (or write it to FILE).")
def show_cmd(profile_file: str, png: str | None = None, json_out: str | None = None) -> None:
    """Print a profile as tables; --png draws its curves.

    \b
    Examples:
      gpuplan profile show examples/profile/cpu-2core-quick.json --png profile.png
      gpuplan profile show profile.json --json
    Exit codes: 0 shown, 2 unreadable profile."""
    from pathlib import Path

    from gpuplan.cliout import emit_json, say, table_doc
    from gpuplan.models.profile import load_profile, summary_tables
    from gpuplan.render import print_tables

    try:
        loaded = load_profile(profile_file)
        tables = summary_tables(loaded)
        if json_out != "-":
            print_tables(tables)
        emit_json("profile show", {"profile_file": profile_file, "tables": [table_doc(t) for t in tables]},
                  json_out)
        if png:
            from gpuplan.viz import profile_figure

            profile_figure(loaded, Path(png))
            say(f"figure written to {png}", json_out)
    except GpuplanError as exc:
        _fail(str(exc))


def register(main: click.Group) -> None:
    """Attach `gpuplan profile` (with `merge` and `show`) to the main command."""
    main.add_command(profile)
