"""`gpuplan solve poseidon CLUSTER MODEL --batch N --seq S` and the same inputs for `compare poseidon`.

CLUSTER is a cluster file (YAML/JSON, a `cluster:` mapping or the cluster itself) or a preset
name; MODEL is a catalog name (gpt3-1.3b, llama2-7b, ...) or a file with the model's shape.
A full poseidon problem file is accepted as CLUSTER alone (MODEL omitted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuplan.commands import ProblemInputs
from gpuplan.errors import InputError
from gpuplan.models.base import Problem


def _document(arg: str) -> tuple[dict[str, Any] | str, Path | None]:
    """Return the mapping in file `arg` (and its folder), or `arg` itself when it is not a file."""
    from gpuplan.io import read_document

    p = Path(arg)
    if p.is_file():
        return read_document(p), p.parent
    return arg, None


def build(cluster: str, model: str | None, batch: int | None, seq: int | None, schedule: str | None,
          max_stages: int | None, max_tp: int | None, **_: Any) -> Problem:
    """Return the PoseidonProblem the command-line arguments describe."""
    from gpuplan.api import load_problem

    doc, base = _document(cluster)
    if isinstance(doc, dict) and doc.get("kind") == "poseidon":
        problem: dict[str, Any] = dict(doc)
    else:
        if model is None:
            raise InputError(f"{cluster}: a MODEL argument is needed (a catalog name or a model file)",
                             field="model")
        problem = {"cluster": doc.get("cluster", doc) if isinstance(doc, dict) else {"preset": doc}}
        mdoc, _ = _document(model)
        problem["model"] = mdoc.get("model", mdoc) if isinstance(mdoc, dict) else mdoc
    for key, value in (("global_batch", batch), ("seq_len", seq), ("schedule", schedule),
                       ("max_stages", max_stages), ("max_tp", max_tp)):
        if value is not None:
            problem[key] = value
    problem["kind"] = "poseidon"
    if isinstance(problem.get("cluster"), dict) and "profile" in problem["cluster"] and base is not None:
        prof = Path(problem["cluster"]["profile"])
        problem["cluster"] = {**problem["cluster"], "profile": str(prof if prof.is_absolute() else base / prof)}
    return load_problem(problem, "poseidon")


INPUTS = ProblemInputs("poseidon", [
    click.Argument(["cluster"]),
    click.Argument(["model"], required=False),
    click.Option(["--batch", "batch"], type=int, default=None, help="Global batch size (sequences)."),
    click.Option(["--seq", "seq"], type=int, default=None, help="Sequence length (tokens)."),
    click.Option(["--schedule"], type=click.Choice(["1f1b", "gpipe"]), default=None, help="Pipeline schedule."),
    click.Option(["--max-stages", "max_stages"], type=int, default=None, help="Most pipeline stages."),
    click.Option(["--max-tp", "max_tp"], type=int, default=None, help="Largest tensor-parallel degree."),
], build, help="CLUSTER is a cluster file or preset name, MODEL a catalog name or model file "
               "(or CLUSTER is a whole poseidon problem file).")
