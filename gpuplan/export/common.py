"""What every trainer export reads from a bundle, and the refusal of plans a trainer cannot express.

Megatron-LM and torchtitan build one device mesh (tp x pp x dp, the same degrees on every stage) and
give every rank the same micro-batch size and the same recomputation setting; they place stages on
ranks by mesh order, with no notion of device types. A plan with different tensor- or data-parallel
degrees per stage, or stages on different device types, is refused, naming what the trainer lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuplanError

RECOMPUTE_ORDER = ("none", "selective", "full")


class ExportRefused(GpuplanError):
    """A plan the trainer cannot express; `reasons` says what the trainer lacks for it."""

    def __init__(self, trainer: str, reasons: list[str]) -> None:
        self.trainer, self.reasons = trainer, reasons
        super().__init__(f"{trainer} cannot run this plan: " + "; ".join(reasons))


@dataclass
class TrainingJob:
    """The figures of a bundle every export needs: layer ranges per virtual stage (k = chunk * S + stage,
    S stages of `interleave` chunks each; one per stage without interleaving), the uniform degrees, micro-batch
    size (sequences), micro-batches, global batch, sequence length (tokens), recompute mode, schedule
    action lists ({rank: ["0F0", "0I0", "0W0", ...]}), each stage's NCCL env, notes, and the placement:
    each stage's global GPU ids and the cluster they index."""

    model: dict[str, Any]
    layers: list[tuple[int, int]]
    interleave: int
    tp: int
    dp: int
    micro_batch_size: int
    num_microbatches: int
    global_batch: int
    seq_len: int
    dtype: str
    recompute: str
    actions: dict[int, list[str]]
    split_backward: bool
    nccl_env: dict[int, dict[str, str]]
    predicted_iteration_s: float
    notes: list[str] = field(default_factory=list)
    stage_gpus: list[list[int]] = field(default_factory=list)  # each stage's global GPU ids in the cluster
    cluster: dict[str, Any] = field(default_factory=dict)  # the plan's problem's cluster, as written in the plan

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (ranks along the pipeline)."""
        return len(self.layers) // self.interleave


def refusals(stages: list[dict[str, Any]]) -> list[str]:
    """Return what a single-mesh trainer lacks to run these Poseidon stages ([] when it can)."""
    out = []
    tps, dps = sorted({int(s["tp"]) for s in stages}), sorted({int(s["dp"]) for s in stages})
    if len(tps) > 1:
        out.append(f"one tensor-parallel degree for every stage (the plan uses {tps} on different stages)")
    if len(dps) > 1:
        out.append(f"one data-parallel degree for every stage (the plan uses {dps} on different stages)")
    types = sorted({str(s["device_type"]) for s in stages})
    if len(types) > 1:
        out.append(f"a way to pin stages to device types (the plan puts stages on {types}; ranks are placed "
                   "by mesh order only)")
    mbs = sorted({int(s["micro_batch_size"]) for s in stages})
    if len(mbs) > 1:
        out.append(f"one micro-batch size for every stage (the plan uses {mbs})")
    return out


def training_job(directory: str | Path, trainer: str) -> TrainingJob:
    """Return the TrainingJob of a checked bundle; raise ExportRefused (naming `trainer`) when its plan
    cannot be expressed by a single-mesh trainer, InputError when the bundle fails check."""
    from gpuplan.compose.bundle import checked_bundle, stage_envs
    from gpuplan.compose.pipeline import virtual_layers
    from gpuplan.errors import InputError
    from gpuplan.runtime.tessel_actions import compute_only

    violations, manifest, plans = checked_bundle(directory)
    if violations:
        raise InputError(f"{directory}: the bundle fails check ({violations[0]}); it is not exported")
    doc = plans["poseidon.json"].document()
    stages = doc["stages"]
    reasons = refusals(stages)
    if reasons:
        raise ExportRefused(trainer, reasons)
    tessel = plans["tessel.json"]
    from gpuplan import api

    tprob = api.plan_problem(tessel)
    actions = compute_only(tprob, tessel)  # type: ignore[arg-type]
    modes = [str(s.get("recompute", "none")) for s in stages]
    recompute = max(modes, key=RECOMPUTE_ORDER.index)
    notes = []
    if len(set(modes)) > 1:
        notes.append(f"the plan recomputes per stage ({modes}); the trainer has one setting for all stages, so "
                     f"the strongest ({recompute}) is exported: it fits the memory, some stages run slower")
    env = stage_envs(plans)
    problem = doc["problem"]
    return TrainingJob(model=problem["model"], layers=virtual_layers(doc), interleave=int(doc.get("interleave", 1)),
                       tp=int(stages[0]["tp"]), dp=int(stages[0]["dp"]),
                       micro_batch_size=int(stages[0]["micro_batch_size"]),
                       num_microbatches=int(doc["num_microbatches"]), global_batch=int(problem["global_batch"]),
                       seq_len=int(problem["seq_len"]), dtype=str(problem.get("dtype", "bf16")), recompute=recompute,
                       actions=actions, split_backward=any(b.kind == "backward_weight" for b in tprob.blocks),  # type: ignore[attr-defined]
                       nccl_env=env, predicted_iteration_s=float(manifest["predicted"]["iteration_time_s"]),
                       notes=notes, stage_gpus=[[int(g) for g in s.get("gpu_ids", [])] for s in stages],
                       cluster=dict(problem.get("cluster") or {}))
