"""A Lagom problem straight from a Poseidon plan file: what `gpuplan solve lagom PLAN.json` reads.

Builds the same problem as the document `{kind: lagom, from_poseidon: {plan: PLAN.json, stage: k}}`
(gpuplan.compose.lagom_poseidon). Lagom tunes NCCL (channels, protocol, algorithm, threads, chunk);
a stage on a CPU runs its collectives on gloo, which has none of those knobs, so such a stage is
refused with that reason. Without a stage, the bottleneck stage among those on NCCL GPUs is taken
(the one with the most compute per iteration); a plan with no NCCL stage at all is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplan.compose.comm import nccl_stage
from gpuplan.errors import InputError
from gpuplan.io import read_document
from gpuplan.models.base import Problem


def is_poseidon_plan(document: dict[str, Any]) -> bool:
    """Return True when `document` is a Poseidon plan (kind poseidon with solved stages)."""
    return document.get("kind") == "poseidon" and isinstance(document.get("stages"), list)


def nccl_bottleneck_stage(plan: dict[str, Any], file: str | None = None) -> int:
    """Return the index of the stage on an NCCL GPU with the most compute per iteration (s).

    Raises InputError naming `file` when every stage runs on a device Lagom's NCCL model does not know
    (a CPU: gloo, whose collectives have no NCCL parameters to tune)."""
    stages = plan["stages"]
    m = int(plan.get("num_microbatches", 1))
    gpu = [i for i in range(len(stages)) if nccl_stage(plan, i)]
    if not gpu:
        types = sorted({str(s.get("device_type")) for s in stages})
        raise InputError(f"{file or 'the plan'}: field 'stages[*].device_type': got {types}; expected at least "
                         "one stage on an NCCL GPU: Lagom tunes NCCL's channels, protocol and algorithm, and "
                         "a CPU stage communicates over gloo, which has none of them",
                         file=file, field="stages.device_type", value=types, expected="an NCCL GPU")
    return max(gpu, key=lambda i: m * (float(stages[i].get("forward_s", 0.0)) + float(stages[i].get("backward_s", 0.0))))


def lagom_problem_from_plan(plan: dict[str, Any], stage: int | None = None, file: str | None = None) -> Problem:
    """Return the LagomProblem of one stage of the Poseidon plan document `plan` (default: the NCCL
    bottleneck stage), built exactly as a `from_poseidon:` document builds it.

    Raises InputError naming `file`, the field, the value and the expectation when the stage index is
    out of range, the stage runs on a CPU (gloo has no NCCL parameters), or the stage communicates nothing."""
    from gpuplan import api

    if not is_poseidon_plan(plan):
        hint = (f" (this is a Poseidon problem: solve it first, `gpuplan solve poseidon {file} -o plan.json`)"
                if plan.get("kind") == "poseidon" and file else "")
        field = "stages" if plan.get("kind") == "poseidon" else "kind"
        raise InputError.at(file, field, plan.get(field), "a solved Poseidon plan (kind poseidon, with stages)" + hint)
    n = len(plan["stages"])
    if stage is None:
        stage = nccl_bottleneck_stage(plan, file)
    elif not 0 <= stage < n:
        raise InputError.at(file, "--stage", stage, f"a stage index in 0..{n - 1}")
    elif not nccl_stage(plan, stage):
        device = plan["stages"][stage].get("device_type")
        raise InputError.at(file, f"stages[{stage}].device_type", device,
                            "a GPU NCCL runs on: this stage communicates over gloo, and Lagom's parameters "
                            "(NCCL channels, protocol, algorithm, threads, chunk) do not apply to gloo")
    try:
        return api.load_problem({"kind": "lagom", "from_poseidon": {"plan": plan, "stage": stage}}, "lagom")
    except InputError as exc:
        raise InputError(f"{file}: {exc}" if file else str(exc), file=file, field=exc.field, value=exc.value,
                         expected=exc.expected) from None


def load_lagom_input(path: str, stage: int | None = None) -> Problem:
    """Return the Lagom problem in file `path`: a Lagom problem document, or a Poseidon plan file (JSON)
    turned into the problem of one of its stages (`stage`; default the NCCL bottleneck stage).

    Raises InputError when `stage` is given for a Lagom problem file, or the file is neither."""
    from gpuplan import api

    document = read_document(path)
    if document.get("kind") == "poseidon":
        return lagom_problem_from_plan(document, stage, file=str(path))
    if stage is not None:
        raise InputError.at(str(path), "--stage", stage,
                            "no --stage: it picks a stage of a Poseidon plan, and this is not one")
    return api.load_problem(Path(path), "lagom")
