"""`gpuplan export torchtitan BUNDLE -o DIR` and `gpuplan export megatron BUNDLE [--launch-dir DIR]`: a training bundle as
another trainer's job (gpuplan.export); a plan the trainer cannot express is refused (exit code 2)."""

from __future__ import annotations

import shlex
import sys

import click

from gpuplan.cliout import STDOUT, OutputDir, OutputPath, emit_json, json_flag, say

_JSON = json_flag(help="Print one JSON document on stdout (or write it to FILE); keys: docs/index.md, Scripting.")


def register(main: click.Group) -> None:
    """Add the `export` group."""
    group = click.Group("export", help="Export a training bundle (`gpuplan plan train`) to a trainer.")
    main.add_command(group)

    @group.command("torchtitan")
    @click.argument("bundle", type=click.Path(file_okay=False, exists=True))
    @click.option("-o", "--output", type=OutputDir(), default="torchtitan-job", show_default=True)
    @click.option("--config", "config", default=None, metavar="MODULE:FUNCTION",
                  help="torchtitan's model module and config_registry function (--module, --config), e.g. "
                       "llama3:llama3_8b. Default: the torchtitan 0.3.0 config whose model has the plan's shape "
                       "(refused, naming the nearest, when none has); a given one is used unchecked (noted).")
    @_JSON
    def torchtitan_cmd(bundle: str, output: str, config: str | None, json_out: str | None = None) -> None:
        """Write torchtitan's job overrides (torchtitan.args), the schedule CSV, Lagom's NCCL env (nccl.env,
        or nccl-stage{k}.env and the per-rank wrapper nccl_env.sh when stages differ) and run.sh (each node's
        ranks pinned to the plan's GPUs; multi-node torchrun when the plan spans nodes: set NODE_RANK,
        MASTER_ADDR, MASTER_PORT on each); --json prints {command, bundle, output, files, notes}."""
        from gpuplan.errors import GpuplanError
        from gpuplan.export import torchtitan

        try:
            result = torchtitan.export(bundle, output, config=config)
        except GpuplanError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        emit_json("export torchtitan", {"bundle": bundle, "output": output, "files": [str(f) for f in result["files"]],
                                        "notes": list(result["notes"])}, json_out)
        for f in result["files"]:
            say(f"written {f}", json_out)
        for n in result["notes"]:
            say(f"note: {n}", json_out)

    @group.command("megatron")
    @click.argument("bundle", type=click.Path(file_okay=False, exists=True))
    @click.option("-o", "--output", type=OutputPath(), default=None,
                  help="Also write the arguments to this file (one per line).")
    @click.option("--launch-dir", type=OutputDir(), default=None, metavar="DIR",
                  help="Also write a launch directory: megatron.args, Lagom's NCCL env files and run.sh "
                       "(torchrun of $MEGATRON_LM/pretrain_gpt.py on the plan's nodes and GPUs; mock data "
                       "unless run.sh is given data arguments).")
    @_JSON
    def megatron_cmd(bundle: str, output: str | None, launch_dir: str | None, json_out: str | None = None) -> None:
        """Print Megatron-LM's command-line arguments for the bundle (pretrain_gpt.py), each stage's NCCL env
        and each node's ranks and GPUs (CUDA_VISIBLE_DEVICES); with --launch-dir also write run.sh and its
        files there; --json prints {command, bundle, output, args, env, nodes, notes, files}."""
        from gpuplan.errors import GpuplanError
        from gpuplan.export import megatron
        from gpuplan.io import atomic_write_text

        try:
            result = megatron.export(bundle, launch_dir)
            if output:
                atomic_write_text(output, "\n".join(result["args"]) + "\n")
        except GpuplanError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        emit_json("export megatron", {"bundle": bundle, "output": output, "args": list(result["args"]),
                                      "env": {str(k): v for k, v in sorted(result["env"].items())},
                                      "nodes": list(result["nodes"]), "notes": list(result["notes"]),
                                      "files": list(result["files"])}, json_out)
        if json_out == STDOUT:
            return
        for f in result["files"]:
            click.echo(f"written {f}")
        click.echo(" ".join(shlex.quote(a) for a in result["args"]))
        for s, env in sorted(result["env"].items()):
            click.echo(f"stage {s} env: " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items())))
        for n in result["nodes"]:
            click.echo(f"NODE_RANK={n['node_rank']} ({n['node']}, {n['ranks']} ranks): "
                       f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={n['cuda_visible_devices']}")
        for n in result["notes"]:
            click.echo(f"note: {n}")
