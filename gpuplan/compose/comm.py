"""Lagom problems for the stages of a Poseidon plan, laid out along a Tessel schedule.

Starts from Lagom's own Poseidon workload (gpuplan.compose.lagom_poseidon: tensor-parallel
all-reduces, pipeline sends, the data-parallel gradient reduction of one stage) and re-lays its
compute segments in the order the schedule runs them on that stage's device, so each collective
overlaps the compute the schedule really puts beside it:

- a forward's activation send overlaps the block that follows that forward on the device,
- a backward's gradient send overlaps the block that follows that backward,
- the gradient reduction overlaps the stage's last block (with zero-bubble splits, a deferred W).

With a split backward, the backward segment is the input-gradient part and a `wgt-mb{j}` segment the
weight-gradient part. With interleaved chunks, segments are per chunk (`fwd-c{c}-mb{j}`); a stage's
activation send overlaps what follows its last chunk's forward, its gradient send what follows its
first chunk's backward (Lagom's workload has one send per micro-batch and direction); a collective
beside a micro-batch's forward (the distributed optimizer's weight gather, FSDP's gathers) overlaps
its first chunk's forward, one beside its backward the last chunk's backward, which runs first. A
stage on a device type Lagom does not know (a CPU) has no NCCL knobs: it gets no problem (None) and
keeps scale 1.
"""

from __future__ import annotations

from typing import Any

from gpuplan.compose.pipeline import virtual_stage_times, weight_fraction
from gpuplan.models.catalog import canonical_name
from gpuplan.models.lagom import GPU_EXTRA
from gpuplan.compose.lagom_poseidon import workload_from_poseidon
from gpuplan.models.tessel import Entry, TesselProblem


def nccl_stage(plan: dict[str, Any], stage: int) -> bool:
    """Return True when the stage's device type is a GPU Lagom's NCCL model knows."""
    key = canonical_name(str(plan["stages"][stage]["device_type"]))
    return key is not None and key in GPU_EXTRA


def _segment(block: str, j: int, n: int, v: int) -> str:
    """Return the Lagom segment name of block instance (block, micro-batch j): fwd/bwd/wgt, with the
    chunk when the plan interleaves v > 1 chunks over n stages."""
    kind = {"F": "fwd", "B": "bwd", "W": "wgt"}[block[0]]
    return f"{kind}-mb{j}" if v == 1 else f"{kind}-c{int(block[1:]) // n}-mb{j}"


def lagom_document(plan: dict[str, Any], stage: int, problem: TesselProblem,
                   schedule: list[list[Entry]]) -> dict[str, Any] | None:
    """Return the Lagom problem document of `stage` with its segments in the schedule's order (None when
    the stage has no NCCL knobs or communicates nothing). Segment times are compute seconds."""
    if not nccl_stage(plan, stage):
        return None
    try:
        fields = workload_from_poseidon(plan, stage)
    except ValueError as exc:
        if "communicates nothing" in str(exc):
            return None
        raise
    n, v = len(plan["stages"]), int(plan.get("interleave", 1))
    fwd, bwd, _ = virtual_stage_times(plan)
    wf = weight_fraction(plan, plan["stages"][stage])
    split = any(b.kind == "backward_weight" and b.devices == [stage] for b in problem.blocks)

    def compute_s(block: str) -> float:
        k = int(block[1:])
        return {"F": fwd[k], "B": bwd[k] * (1 - wf) if split else bwd[k], "W": bwd[k] * wf}[block[0]]

    order = [(e.block, e.microbatch) for e in sorted(schedule[stage], key=lambda e: (e.start_s, e.end_s))]
    names = [_segment(b, j, n, v) for b, j in order]
    segments = [{"name": name, "compute_s": max(0.0, compute_s(b))} for name, (b, j) in zip(names, order)]
    last_chunk = "" if v == 1 else f"c{v - 1}-"
    first_chunk = "" if v == 1 else "c0-"
    following = {names[i]: names[i + 1] for i in range(len(names) - 1)}
    ops = []
    for op in fields["ops"]:
        op = dict(op)
        name = op["name"]
        if name.startswith("send-next-mb"):
            op["overlaps"] = following.get(f"fwd-{last_chunk}mb{name.removeprefix('send-next-mb')}")
        elif name.startswith("send-prev-mb"):
            op["overlaps"] = following.get(f"bwd-{first_chunk}mb{name.removeprefix('send-prev-mb')}")
        elif name == "dp-grads":
            op["overlaps"] = names[-1] if names else None
        elif v > 1 and op.get("overlaps") and op["overlaps"] not in names:
            # a micro-batch's forward (backward) named without its chunk: its first chunk's run, c0
            # (the last chunk's, backward runs the chunks in reverse)
            kind, _, mb = str(op["overlaps"]).partition("-")
            chunk = f"{kind}-c{0 if kind == 'fwd' else v - 1}-{mb}"
            op["overlaps"] = chunk if chunk in names else None
        ops.append(op)
    return {"kind": "lagom", **fields, "segments": segments, "ops": ops}
