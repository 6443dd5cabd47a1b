"""`gpuplan solve tessel PLACEMENT --microbatches N` and `gpuplan compare tessel ...` with the same inputs."""

from __future__ import annotations

from typing import Any

import click

from gpuplan.commands import ProblemInputs
from gpuplan.models.base import Problem


def build(placement: str, microbatches: int | None, memory_limit: str | None, **_: Any) -> Problem:
    """Return the Tessel problem of a placement file, with N and the memory limit overridden when given."""
    from gpuplan.api import load_problem
    from gpuplan.io import read_document

    doc = read_document(placement)
    if doc.get("kind") == "poseidon":  # a Poseidon plan: its stages become the placement
        from gpuplan.compose.tessel_poseidon import problem_from_poseidon

        prob = problem_from_poseidon(doc, microbatches=microbatches, file=placement)
        if memory_limit is None:
            return prob
        doc = prob.document()
    if microbatches is not None:
        doc["microbatches"] = microbatches
    if memory_limit is not None:
        doc["memory_limit_bytes"] = memory_limit
    doc.setdefault("kind", "tessel")
    if doc.get("kind") != "tessel":
        return load_problem(placement, "tessel")  # names the file and the wrong kind
    from gpuplan.models.base import validate
    from gpuplan.models.tessel import TesselProblem

    return validate(TesselProblem, doc, file=placement)


INPUTS = ProblemInputs(
    "tessel",
    [click.Argument(["placement"], type=click.Path(dir_okay=False)),
     click.Option(["--microbatches", "-n"], type=click.IntRange(1, 4096), default=None,
                  help="Number of micro-batches N (default: the file's)."),
     click.Option(["--memory-limit"], default=None,
                  help="Per-device memory limit in bytes or with a unit ('8 GiB'); default: the file's.")],
    build,
    help="PLACEMENT is a YAML/JSON file with the blocks of one micro-batch (or a `shape:` to generate), "
         "or a Poseidon plan (JSON) whose stages become the placement.")
