"""Poseidon plan -> Tessel problem with a split backward, and the composed iteration time of a schedule.

Works on the Poseidon plan document (plain data) plus per-stage scale factors (what Lagom's settings
make of each stage's time, 1.0 = NCCL's defaults). Each Poseidon stage is one Tessel device. With
`split=True` a stage's backward becomes B (input gradient, plus what recomputation re-runs and the
attention core) and W (weight gradient): W is half the backward's linear-layer share, the linear
layers' share of a layer's forward FLOPs being 2P / (2P + 4 s h) (P its parameters, s the sequence,
h the hidden size; every linear layer's backward is two GEMMs of equal size, dX and dW).

Memory is counted in micro-batches in flight: a forward keeps one, and (an upper bound) the whole of
it is kept until the weight gradient W ran (B frees nothing). Each stage may hold what its device's
memory allows beside what Poseidon already counted: Poseidon's own in-flight count under 1F1B plus
the headroom (capacity - Poseidon's predicted peak) over one micro-batch's activations, at most m.
"""

from __future__ import annotations

import math
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.tessel import Entry, TesselProblem


def _poseidon_problem(plan: dict[str, Any]) -> Any:
    """Return the PoseidonProblem embedded in a plan document (None when the plan embeds none)."""
    from gpuplan.models.poseidon import PoseidonProblem

    doc = plan.get("problem") or {}
    return validate(PoseidonProblem, doc) if doc else None


def weight_fraction(plan: dict[str, Any], stage: dict[str, Any]) -> float:
    """Return the fraction of a stage's backward_s that is weight-gradient work (W), in [0, 0.5]."""
    problem = _poseidon_problem(plan)
    if problem is None:
        return 0.0
    cfg = problem.model
    params = float(cfg.layer_params())
    share = 2 * params / (2 * params + 4 * problem.seq_len * cfg.hidden)
    bwd = float(stage.get("backward_s", 0.0))
    if bwd <= 0:
        return 0.0
    recompute_s = float(stage.get("forward_s", 0.0)) if stage.get("recompute") == "full" else 0.0
    return max(0.0, min(0.5, 0.5 * share * max(0.0, bwd - recompute_s) / bwd))


def memory_caps_mb(plan: dict[str, Any]) -> list[float]:
    """Return, per stage, the micro-batches whose activations it may hold at once (Poseidon's 1F1B
    count plus the memory headroom over one micro-batch's activation bytes, at most m)."""
    stages = plan["stages"]
    n, m = len(stages), int(plan.get("num_microbatches") or 1)
    base = [float(min(m, n - s)) for s in range(n)]
    problem = _poseidon_problem(plan)
    if problem is None:
        return base
    from gpuplan.models.poseidon import CostModel

    cm = CostModel(problem)
    out = []
    for s, st in enumerate(stages):
        act_bytes = (int(st["last_layer"]) - int(st["first_layer"])) * cm.activation_bytes(
            int(st.get("tp", 1)), int(st.get("micro_batch_size", 1)), st.get("recompute", "none"))
        cap_bytes = cm.dev(st["device_type"]).memory_bytes * problem.memory_fraction
        extra = math.floor((cap_bytes - float(st.get("memory_bytes", 0.0))) / act_bytes) if act_bytes > 0 else m
        out.append(float(min(m, base[s] + max(0, extra))))
    return out


def tessel_problem(plan: dict[str, Any], scales: list[float] | None = None, *, split: bool = True,
                   file: str | None = None) -> TesselProblem:
    """Return the Tessel problem of a Poseidon plan document: one device per stage, block durations in
    seconds (compute x the stage's scale, plus the send to the neighbour), memory in micro-batches.
    split=False keeps each backward one block (Poseidon's own 1F1B view)."""
    stages = plan.get("stages") or []
    if plan.get("kind") != "poseidon" or not stages or plan.get("status") == "infeasible":
        raise InputError.at(file, "stages", plan.get("kind"), "a feasible Poseidon plan with stages")
    if int(plan.get("interleave", 1)) > 1:
        raise InputError.at(file, "interleave", plan.get("interleave"),
                            "1 (the composer schedules one model chunk per stage)")
    n, m = len(stages), int(plan.get("num_microbatches") or 1)
    scales = list(scales or [1.0] * n)
    if len(scales) != n:
        raise InputError.at(file, "scales", scales, f"{n} stage scales")
    blocks: list[dict[str, Any]] = []
    for s, st in enumerate(stages):
        send = float(st.get("p2p_s", 0.0)) if s < n - 1 else 0.0
        blocks.append({"name": f"F{s}", "kind": "forward", "devices": [s], "stage": s, "memory_bytes": 1,
                       "duration_s": max(1e-9, float(st.get("forward_s", 0.0)) * scales[s] + send),
                       "after": [f"F{s - 1}"] if s else []})
    for s in reversed(range(n)):
        st = stages[s]
        send_back = float(stages[s - 1].get("p2p_s", 0.0)) if s > 0 else 0.0
        bwd = float(st.get("backward_s", 0.0)) * scales[s]
        w = bwd * weight_fraction(plan, st) if split else 0.0
        after = [f"B{s + 1}"] if s < n - 1 else [f"F{n - 1}"]
        if w > 0:
            blocks.append({"name": f"B{s}", "kind": "backward_input", "devices": [s], "stage": s,
                           "memory_bytes": 0, "duration_s": max(1e-9, bwd - w + send_back), "after": after})
            blocks.append({"name": f"W{s}", "kind": "backward_weight", "devices": [s], "stage": s,
                           "memory_bytes": -1, "duration_s": max(1e-9, w), "after": [f"B{s}"]})
        else:
            blocks.append({"name": f"B{s}", "kind": "backward", "devices": [s], "stage": s, "memory_bytes": -1,
                           "duration_s": max(1e-9, bwd + send_back), "after": after})
    caps = memory_caps_mb(plan) if split else [float(min(m, n - s)) for s in range(n)]
    doc = {"kind": "tessel", "name": f"from poseidon plan ({n} stages{', split backward' if split else ''})",
           "devices": n, "microbatches": m, "blocks": blocks, "memory_limit_bytes": caps}
    return validate(TesselProblem, doc, file=file)


def stage_tails_s(plan: dict[str, Any], scales: list[float] | None = None) -> list[float]:
    """Return per stage the seconds after its last block: gradient all-reduce (x the stage's scale)
    plus the optimizer step."""
    stages = plan["stages"]
    scales = list(scales or [1.0] * len(stages))
    return [float(st.get("allreduce_s", 0.0)) * scales[s] + float(st.get("optimizer_s", 0.0))
            for s, st in enumerate(stages)]


def composed_time_s(schedule: list[list[Entry]], tails_s: list[float]) -> float:
    """Return the predicted iteration time (s): the latest over stages of the end of its last block plus
    its tail (gradient all-reduce and optimizer step)."""
    return max((max((e.end_s for e in dev), default=0.0) + tails_s[d]) for d, dev in enumerate(schedule))
