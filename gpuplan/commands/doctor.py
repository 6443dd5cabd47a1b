"""`gpuplan doctor`: what this machine can do (torch build, CUDA devices, NCCL, gloo, memory, commands)."""

from __future__ import annotations

import click

from gpuplan.cliout import json_flag


@click.command("doctor")
@json_flag(help="Print {command, python, platform, cpus, host_memory_bytes, host_free_bytes, torch: {installed, "
                   "version, build, cuda_devices, nccl, gloo}, matplotlib, commands: {VERB: {works, why}}} as JSON "
                   "(or write it to FILE).")
def doctor(json_out: str | None) -> None:
    """Say what this machine can do: torch and its build, CUDA devices and their free memory, NCCL,
    gloo, host memory, and which gpuplan commands will work here (and which extra to install if not).

    \\b
    Examples:
      gpuplan doctor
      gpuplan doctor --json | jq .commands.run
    Exit codes: 0 always (the report says what does not work)."""
    from gpuplan.cliout import emit_json
    from gpuplan.doctor import diagnose, tables
    from gpuplan.render import print_tables

    report = diagnose()
    if json_out != "-":
        print_tables(tables(report))
    emit_json("doctor", report, json_out)


def register(main: click.Group) -> None:
    """Attach `gpuplan doctor` to the main command."""
    main.add_command(doctor)
