"""Lagom problems for the stages of a Poseidon plan, laid out along a Tessel schedule.

Starts from Lagom's own Poseidon workload (gpuplan.models.lagom_poseidon: tensor-parallel
all-reduces, pipeline sends, the data-parallel gradient reduction of one stage) and re-lays its
compute segments in the order the schedule runs them on that stage's device, so each collective
overlaps the compute the schedule really puts beside it:

- a forward's activation send overlaps the block that follows that forward on the device,
- a backward's gradient send overlaps the block that follows that backward,
- the gradient reduction overlaps the stage's last block (with zero-bubble splits, a deferred W).

With a split backward, the backward segment is the input-gradient part and a `wgt-mb{j}` segment the
weight-gradient part. A stage on a device type Lagom does not know (a CPU) has no NCCL knobs: it gets
no problem (None) and keeps scale 1.
"""

from __future__ import annotations

from typing import Any

from gpuplan.compose.pipeline import weight_fraction
from gpuplan.models.catalog import canonical_name
from gpuplan.models.lagom import GPU_EXTRA
from gpuplan.models.lagom_poseidon import workload_from_poseidon
from gpuplan.models.tessel import Entry, TesselProblem


def nccl_stage(plan: dict[str, Any], stage: int) -> bool:
    """Return True when the stage's device type is a GPU Lagom's NCCL model knows."""
    key = canonical_name(str(plan["stages"][stage]["device_type"]))
    return key is not None and key in GPU_EXTRA


def _segment(block: str, j: int) -> str:
    kind = block[0]
    return {"F": f"fwd-mb{j}", "B": f"bwd-mb{j}", "W": f"wgt-mb{j}"}[kind]


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
    st = plan["stages"][stage]
    fwd_s, bwd_s = float(st.get("forward_s", 0.0)), float(st.get("backward_s", 0.0))
    split = any(b.name == f"W{stage}" for b in problem.blocks)
    w_s = bwd_s * weight_fraction(plan, st) if split else 0.0
    compute = {"F": fwd_s, "B": bwd_s - w_s, "W": w_s}
    order = [(e.block, e.microbatch) for e in sorted(schedule[stage], key=lambda e: (e.start_s, e.end_s))]
    names = [_segment(b, j) for b, j in order]
    segments = [{"name": _segment(b, j), "compute_s": max(0.0, compute[b[0]])} for b, j in order]
    following = {names[i]: names[i + 1] for i in range(len(names) - 1)}
    ops = []
    for op in fields["ops"]:
        op = dict(op)
        name = op["name"]
        if name.startswith("send-next-mb"):
            op["overlaps"] = following.get(f"fwd-mb{name.removeprefix('send-next-mb')}")
        elif name.startswith("send-prev-mb"):
            op["overlaps"] = following.get(f"bwd-mb{name.removeprefix('send-prev-mb')}")
        elif name == "dp-grads":
            op["overlaps"] = names[-1] if names else None
        ops.append(op)
    return {"kind": "lagom", **fields, "segments": segments, "ops": ops}
