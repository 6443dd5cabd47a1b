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

# How far two rounds' stage compute scales (tuned over NCCL-default time, per stage) may differ for the
# Tessel/Lagom iteration to stop at them (compose.train), and so how far a bundle's stated scale may lie below
# what its stage's Lagom plan gives (compose.bundle): the fixed point holds within it.
SCALE_TOLERANCE = 1e-6


def _poseidon_problem(plan: dict[str, Any]) -> Any:
    """Return the PoseidonProblem embedded in a plan document (None when the plan embeds none)."""
    from gpuplan.models.poseidon import PoseidonProblem

    doc = plan.get("problem") or {}
    return validate(PoseidonProblem, doc) if doc else None


def weight_fraction(plan: dict[str, Any], stage: dict[str, Any]) -> float:
    """Return the fraction of a stage's backward_s that is weight-gradient work (W), in [0, 0.5]."""
    return _weight_fraction(_poseidon_problem(plan), stage)


def _weight_fraction(problem: Any, stage: dict[str, Any]) -> float:
    """`weight_fraction` given the plan's validated PoseidonProblem (None: no W split)."""
    if problem is None:
        return 0.0
    cfg = problem.model
    params = float(cfg.layer_params())
    share = 2 * params / (2 * params + 4 * problem.seq_len * cfg.hidden)
    bwd = float(stage.get("backward_s", 0.0))
    if bwd <= 0:
        return 0.0
    from gpuplan.models.poseidon import recomputed_blocks

    n = int(stage.get("last_layer", 0)) - int(stage.get("first_layer", 0))
    share_full = recomputed_blocks(stage.get("recompute", "none"), n) / n if n > 0 else 0.0
    recompute_s = float(stage.get("forward_s", 0.0)) * share_full  # the blocks that re-run their forward
    return max(0.0, min(0.5, 0.5 * share * max(0.0, bwd - recompute_s) / bwd))


def base_caps_mb(plan: dict[str, Any]) -> list[float]:
    """Return, per stage, the micro-batches' worth of activations Poseidon's own schedule holds there
    (1F1B: S - s; interleaved: its peak chunks in flight / v)."""
    from gpuplan.models.poseidon import in_flight

    stages = plan["stages"]
    n, m, v = len(stages), int(plan.get("num_microbatches") or 1), int(plan.get("interleave", 1))
    return [float(in_flight(str(plan.get("schedule", "1f1b")), s, n, m, v)) for s in range(n)]


def memory_caps_mb(plan: dict[str, Any]) -> list[float]:
    """Return, per stage, the micro-batches whose activations it may hold at once (Poseidon's own count
    plus the memory headroom over one micro-batch's activation bytes, at most m)."""
    stages = plan["stages"]
    m = int(plan.get("num_microbatches") or 1)
    base = base_caps_mb(plan)
    problem = _poseidon_problem(plan)
    if problem is None:
        return base
    from gpuplan.models.poseidon import CostModel

    cm = CostModel(problem)
    out = []
    for s, st in enumerate(stages):
        act_bytes = cm.stage_activation_bytes(int(st.get("tp", 1)), int(st.get("micro_batch_size", 1)),
                                              st.get("recompute", "none"),
                                              int(st["last_layer"]) - int(st["first_layer"]))
        cap_bytes = cm.dev(st["device_type"]).memory_bytes * problem.memory_fraction
        extra = math.floor((cap_bytes - float(st.get("memory_bytes", 0.0))) / act_bytes) if act_bytes > 0 else m
        out.append(float(min(m, base[s] + max(0, extra))))
    return out


def virtual_stage_times(plan: dict[str, Any]) -> tuple[list[float], list[float], list[float]]:
    """Return per virtual stage k = chunk * S + stage (S stages, v = the plan's interleave chunks) its
    forward and backward seconds per micro-batch and the seconds to send its activations to k + 1
    (Poseidon's own split: each chunk 1/v of the stage's blocks, the embedding on the first chunk,
    the head on the last; with v = 1 the stages' figures as stated)."""
    stages = plan["stages"]
    n, v = len(stages), int(plan.get("interleave", 1))
    if v == 1:
        return ([float(st.get("forward_s", 0.0)) for st in stages], [float(st.get("backward_s", 0.0)) for st in stages],
                [float(st.get("p2p_s", 0.0)) for st in stages[:-1]])
    from types import SimpleNamespace

    from gpuplan.models.poseidon import CostModel, StageShape, chunk_lists, p2p_s

    problem = _poseidon_problem(plan)
    if problem is None:
        raise InputError.at(None, "problem", None, "a Poseidon plan embedding its problem (needed to split chunks)")
    cm = CostModel(problem)
    shapes = [StageShape(st["device_type"], int(st["tp"]), int(st["dp"]), tuple(st["gpu_ids"]), tuple(st["nodes"]))
              for st in stages]
    layers = [int(st["last_layer"]) - int(st["first_layer"]) for st in stages]
    b = [int(st["micro_batch_size"]) for st in stages]
    costs = [SimpleNamespace(forward_s=float(st["forward_s"]), backward_s=float(st["backward_s"])) for st in stages]
    fwd, bwd = chunk_lists(cm, shapes, layers, costs, b, v)  # type: ignore[arg-type]
    sends = [p2p_s(cm, shapes[k % n], shapes[(k + 1) % n], b[k % n]) for k in range(n * v - 1)]
    return list(fwd), list(bwd), sends


def tessel_problem(plan: dict[str, Any], scales: list[float] | None = None, *, split: bool = True,
                   file: str | None = None) -> TesselProblem:
    """Return the Tessel problem of a Poseidon plan document: one device per stage, one chain of virtual
    stages (chunk c of stage s is virtual stage c * S + s, on device s), block durations in seconds
    (compute x the stage's scale, plus the send to the neighbour), memory in micro-batches.
    split=False keeps each backward one block (Poseidon's own 1F1B view)."""
    stages = plan.get("stages") or []
    if plan.get("kind") != "poseidon" or not stages or plan.get("status") == "infeasible":
        raise InputError.at(file, "stages", plan.get("kind"), "a feasible Poseidon plan with stages")
    n, m, v = len(stages), int(plan.get("num_microbatches") or 1), int(plan.get("interleave", 1))
    scales = list(scales or [1.0] * n)
    if len(scales) != n:
        raise InputError.at(file, "scales", scales, f"{n} stage scales")
    fwd, bwd, sends = virtual_stage_times(plan)
    problem = _poseidon_problem(plan) if split else None
    wfs = [_weight_fraction(problem, st) for st in stages]
    last = n * v - 1
    blocks: list[dict[str, Any]] = []
    for k in range(n * v):
        s = k % n
        send = sends[k] if k < last else 0.0
        blocks.append({"name": f"F{k}", "kind": "forward", "devices": [s], "stage": k, "memory_bytes": 1,
                       "duration_s": max(1e-9, fwd[k] * scales[s] + send), "after": [f"F{k - 1}"] if k else []})
    for k in reversed(range(n * v)):
        s = k % n
        send_back = sends[k - 1] if k > 0 else 0.0
        b_s = bwd[k] * scales[s]
        w = b_s * wfs[s]
        after = [f"B{k + 1}"] if k < last else [f"F{last}"]
        if w > 0:
            blocks.append({"name": f"B{k}", "kind": "backward_input", "devices": [s], "stage": k,
                           "memory_bytes": 0, "duration_s": max(1e-9, b_s - w + send_back), "after": after})
            blocks.append({"name": f"W{k}", "kind": "backward_weight", "devices": [s], "stage": k,
                           "memory_bytes": -1, "duration_s": max(1e-9, w), "after": [f"B{k}"]})
        else:
            blocks.append({"name": f"B{k}", "kind": "backward", "devices": [s], "stage": k, "memory_bytes": -1,
                           "duration_s": max(1e-9, b_s + send_back), "after": after})
    caps = memory_caps_mb(plan) if split else base_caps_mb(plan)
    doc = {"kind": "tessel", "name": f"from poseidon plan ({n} stages{f' x {v} chunks' if v > 1 else ''}"
                                     f"{', split backward' if split else ''})",
           "devices": n, "microbatches": m, "blocks": blocks, "memory_limit_bytes": [c * v for c in caps]}
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


def virtual_layers(plan: dict[str, Any]) -> list[tuple[int, int]]:
    """Return the transformer-block range [first, last) of each virtual stage k = chunk * S + stage
    (Poseidon's chunking: chunk c of a stage holds [c L / v + first / v, c L / v + last / v))."""
    stages = plan["stages"]
    v = int(plan.get("interleave", 1))
    total = int(plan["problem"]["model"]["num_layers"]) if v > 1 else 0
    return [(c * total // v + int(s["first_layer"]) // v, c * total // v + int(s["last_layer"]) // v)
            for c in range(v) for s in stages]


def baseline_schedule(doc: dict[str, Any], seed: int = 0) -> tuple[Any, Any, float]:
    """Return (the Tessel problem of a Poseidon plan document's stages with a fused backward, its
    classic 1F1B schedule (interleaved 1F1B with virtual stages), that schedule's iteration time in s
    with the stages' tails): the composition's baseline, deterministic."""
    from gpuplan import api

    problem = tessel_problem(doc, split=False)
    plan = api.solve(problem, solver="1f1b" if int(doc.get("interleave", 1)) == 1 else "interleaved-1f1b", seed=seed)
    return problem, plan, composed_time_s(plan.schedule, stage_tails_s(doc))  # type: ignore[attr-defined]


def gains_table(baseline_s: float, tessel_s: float, composed_s: float) -> list[dict[str, Any]]:
    """Return each composition step's predicted iteration time (s) and its gain over the previous step
    and over the baseline (fractions)."""
    rows = [("Poseidon + 1F1B + NCCL defaults", baseline_s, baseline_s),
            ("+ Tessel schedule (NCCL defaults)", tessel_s, baseline_s),
            ("+ Lagom NCCL settings (composed)", composed_s, tessel_s)]
    return [{"step": name, "iteration_time_s": t, "gain_over_previous": 1 - t / prev,
             "gain_over_baseline": 1 - t / baseline_s} for name, t, prev in rows]
