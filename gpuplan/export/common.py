"""What every trainer export reads from a bundle, and the refusal of plans a trainer cannot express.

Megatron-LM and torchtitan build one device mesh (tp x pp x dp, the same degrees on every stage) and
give every rank the same micro-batch size and the same recomputation setting; they place stages on
ranks by mesh order, with no notion of device types. A plan with different tensor- or data-parallel
degrees per stage, or stages on different device types, is refused, naming what the trainer lacks.
Both rank the mesh pp outermost, tp innermost: `node_launch` maps those ranks onto the plan's nodes and
GPUs (each node's CUDA device indices in local-rank order); `check_seq_len` refuses a sequence longer
than a limit of the model or the trainer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuplanError
from gpuplan.models.poseidon import grad_reduce_bytes, partial_blocks, recompute_mode


def recompute_strength(label: str) -> tuple[int, int]:
    """Return a key that orders recomputation labels by the memory they save: none < selective <
    "full:K" (by K, the blocks of a stage fully recomputed) < full."""
    k = partial_blocks(label)
    return (2, k) if k else ({"none": 0, "selective": 1, "full": 3}[recompute_mode(label)], 0)


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
    distributed_optimizer: bool = False  # optimizer states sharded over dp (ZeRO-1), the problem's field
    overlap_dp_allreduce: bool = False  # gradient reduction overlapped with the backward, the problem's field
    tp_comm_overlap: bool = False  # TP collectives beside their GEMMs (TE userbuffers), the problem's field
    fsdp: bool = False  # weights, gradients and states sharded over dp (FSDP2 / ZeRO-3), the problem's field
    eager_kernels: bool = False  # the plan's times assume PyTorch's eager element-wise kernels (not fused)
    fp8_recipe: str = "delayed"  # fp8 scaling the plan's times assume (delayed or current), the problem's field
    fp8_params: bool = False  # block weights held and gathered in fp8 only, the problem's field
    fused_cross_entropy: bool = False  # the loss as one fused kernel on 16-bit logits, the problem's field
    attention_library: str = "te"  # whose fused attention kernel the plan's times assume, the problem's field
    grad_reduce_in_fp32: bool = True  # gradients held and reduced in fp32 (the problem's field, resolved)
    gradient_accumulation_fusion: bool = True  # wgrad GEMMs accumulate into the main gradients, the problem's field
    device_arch: str = "unknown"  # the architecture of the plan's one device type (catalog, or unknown)

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (ranks along the pipeline)."""
        return len(self.layers) // self.interleave


def check_seq_len(job: TrainingJob, trainer: str, limits: list[tuple[str, int]]) -> None:
    """Raise ExportRefused (naming `trainer`, the plan's seq_len, each limit it exceeds and that limit's
    field) when the plan's sequence length exceeds any of `limits` ([(field, max tokens)]); return None."""
    over = [f"sequences of at most {limit} tokens ({name}); the plan's seq_len is {job.seq_len}"
            for name, limit in limits if job.seq_len > limit]
    if over:
        raise ExportRefused(trainer, over)


def model_max_seq_len(job: TrainingJob) -> int:
    """Return the longest sequence (tokens) the plan's model takes: its `max_seq_len` (gpuplan's default
    when the plan's model does not state it)."""
    from gpuplan.models.workload import TransformerConfig

    return int(TransformerConfig.model_validate(job.model).max_seq_len)


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
    recompute = max(modes, key=recompute_strength)
    notes = []
    if len(set(modes)) > 1:
        notes.append(f"the plan recomputes per stage ({modes}); the trainer has one setting for all stages, so "
                     f"the strongest ({recompute}) is exported: it fits the memory, some stages run slower")
    env = stage_envs(plans)
    problem = doc["problem"]
    arch = api.plan_problem(plans["poseidon.json"]).cluster.type_of(str(stages[0]["device_type"])).arch  # type: ignore[union-attr]
    return TrainingJob(model=problem["model"], layers=virtual_layers(doc), interleave=int(doc.get("interleave", 1)),
                       tp=int(stages[0]["tp"]), dp=int(stages[0]["dp"]),
                       micro_batch_size=int(stages[0]["micro_batch_size"]),
                       num_microbatches=int(doc["num_microbatches"]), global_batch=int(problem["global_batch"]),
                       seq_len=int(problem["seq_len"]), dtype=str(problem.get("dtype", "bf16")), recompute=recompute,
                       actions=actions, split_backward=any(b.kind == "backward_weight" for b in tprob.blocks),  # type: ignore[attr-defined]
                       nccl_env=env, predicted_iteration_s=float(manifest["predicted"]["iteration_time_s"]),
                       notes=notes, stage_gpus=[[int(g) for g in s.get("gpu_ids", [])] for s in stages],
                       cluster=dict(problem.get("cluster") or {}),
                       distributed_optimizer=bool(problem.get("distributed_optimizer", False)),
                       overlap_dp_allreduce=bool(problem.get("overlap_dp_allreduce", False)),
                       tp_comm_overlap=bool(problem.get("tp_comm_overlap", False)),
                       fsdp=bool(problem.get("fsdp", False)),
                       eager_kernels=bool(problem.get("eager_kernels", False)),
                       fp8_recipe=str(problem.get("fp8_recipe", "delayed")),
                       fp8_params=bool(problem.get("fp8_params", False)),
                       fused_cross_entropy=bool(problem.get("fused_cross_entropy", False)),
                       attention_library=str(problem.get("attention_library", "te")),
                       grad_reduce_in_fp32=grad_reduce_bytes(str(problem.get("dtype", "bf16")), bool(problem.get("fsdp")),
                                                             problem.get("grad_reduce_in_fp32")) >= 4,
                       gradient_accumulation_fusion=bool(problem.get("gradient_accumulation_fusion", True)),
                       device_arch=arch)


@dataclass
class Launch:
    """How the job's ranks start: the nodes in node-rank order, each node's rank count, each node's GPUs
    in local-rank order (the node's CUDA device indices, [] when the plan names no placement), notes."""

    nodes: list[str]
    nproc: list[int]
    notes: list[str]
    devices: list[list[int]] = field(default_factory=list)

    @property
    def world(self) -> int:
        """Return the number of ranks."""
        return sum(self.nproc)

    def visible(self, r: int) -> str:
        """Return node-rank r's CUDA_VISIBLE_DEVICES value ("4,5,6,7"; "" when the placement is unknown)."""
        return ",".join(map(str, self.devices[r])) if self.devices else ""


def node_launch(job: TrainingJob, trainer: str) -> Launch:
    """Return the launch of the job from the plan's placement for a trainer that ranks by the mesh order
    pp, dp, tp (tp innermost; torchtitan and Megatron-LM both do) under a launcher that gives node r the
    ranks after those of nodes 0..r-1 (torchrun): nodes numbered in the order the plan's ranks reach them,
    each node's GPUs as their index within the node (the cluster's order: types as the node lists them);
    notes for uneven nodes, TP groups across nodes, nodes whose GPUs the plan uses only in part, and
    placements the rank order cannot follow."""
    world = job.num_stages * job.tp * job.dp
    if not job.stage_gpus or not job.cluster or sum(map(len, job.stage_gpus)) != world:
        return Launch(["localhost"], [world], [])
    from gpuplan.models.cluster import Cluster

    cluster = Cluster.model_validate(job.cluster)
    dev = {d.id: d for d in cluster.devices}
    flat = [dev[g] for gpus in job.stage_gpus for g in sorted(gpus)]  # the plan's device of each rank
    order = [d.node for d in flat]
    runs = [[n, len(list(g))] for n, g in groupby(order)]  # [node, count] in rank order
    notes = []
    if len(runs) != len({n for n, _ in runs}):
        counts = Counter(order)
        runs = [[n, counts[n]] for n in dict.fromkeys(order)]
        notes.append(f"{trainer} gives each node a block of consecutive ranks (mesh order pp, dp, tp); the plan's "
                     "stages share nodes in another order, so some stages run on other nodes than planned "
                     "(same device type; their links may differ from the plan's)")
    nodes, nproc = [str(n) for n, _ in runs], [int(c) for _, c in runs]
    devices = [[d.local_index for d in flat if d.node == n] for n in nodes]
    if len(set(nproc)) > 1:
        notes.append("the plan's ranks do not fill its nodes evenly (" + ", ".join(
            f"{n}: {c}" for n, c in zip(nodes, nproc)) + "): each node starts that many ranks; "
            "torchrun numbers ranks node after node")
    starts = list(accumulate(nproc[:-1]))  # the first global rank of each node after node 0
    if job.tp > 1 and any(b % job.tp for b in starts):
        notes.append(f"{trainer}'s tensor-parallel groups ({job.tp} consecutive ranks) cross a node boundary "
                     f"(nodes hold {nproc} ranks): those groups run over the inter-node network")
    for n, idx in zip(nodes, devices):
        gpus = cluster.node(n).gpus
        if idx != list(range(sum(gpus.values()))):
            listed = ", ".join(f"{c} {t}" for t, c in gpus.items())
            used = (f"the plan uses {len(idx)} of its GPUs ({listed})" if len(idx) < sum(gpus.values())
                    else f"the plan's stages take its GPUs ({listed}) in another order")
            notes.append(f"node {n}: {used}, so its ranks run with CUDA_VISIBLE_DEVICES={','.join(map(str, idx))} "
                         "and CUDA_DEVICE_ORDER=PCI_BUS_ID (the node's GPUs numbered in the cluster's order, types "
                         "as listed, which must be the node's PCI bus order: nvidia-smi's numbering)")
    return Launch(nodes, nproc, notes, devices)
