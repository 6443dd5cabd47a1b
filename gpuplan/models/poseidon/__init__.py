"""Poseidon: a DAG training-time model for pipeline/tensor/data-parallel LLM training on heterogeneous
clusters, and the plan format its search returns.

A plan is an ordered list of pipeline stages. Each stage runs on a group of devices of ONE type,
split into `tp` tensor-parallel ranks times `dp` data-parallel replicas, holds a contiguous range
of transformer layers (the embedding sits in front of the first stage, the output head behind the
last), and processes `num_microbatches` micro-batches of `micro_batch_size` samples per replica.

The iteration time is the longest path of a DAG (networkx) whose nodes are every stage's forward
and backward of every micro-batch, the point-to-point sends between stages, and each stage's
data-parallel gradient all-reduce and optimizer step; edges are data dependencies plus each
device's execution order under the schedule (1F1B or GPipe). Tensor-parallel all-reduces are part
of each layer's forward/backward duration (Megatron: two per layer each way). All times are in
seconds, all sizes in bytes.

Modules: this one (problem, plan, stage costs and memory, evaluate, check), cost.py (the operation
time model: GEMMs by shape, attention, element-wise ops, recomputation), dag.py (the 1F1B / GPipe /
interleaved DAG and its fast walk), config.py (a fixed TP/PP/DP configuration evaluated as a plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gpuplan.models.base import Problem, Table, Violation
from gpuplan.models.cluster import Cluster
from gpuplan.models.plan import Plan, Status, figure_violations, stated_figures_violations
from gpuplan.models.poseidon.cost import (FP8_AMAX_BYTES, RECOMPUTE_MODES, LayerOptions, LayerTimes,
                                          blocking_exchanges,
                                          embedding_times, head_times, layer_times, memory_s, model_flops_per_sample,
                                          stage_call_s)
from gpuplan.models.poseidon.dag import (_flat_ops, build_dag, dag_longest_path_s, iteration_time_fast,
                                         peak_chunks_in_flight, stage_order, topological_ops)
from gpuplan.models.profile import LayerCost, LayerTable, Profile, cluster_document
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, model_by_name, storage_dtype

__all__ = ["_flat_ops", "build_dag", "dag_longest_path_s", "iteration_time_fast", "stage_order", "topological_ops"]
from gpuplan.registry import ModelSpec, register_model
from gpuplan.render import layer_range

Schedule = Literal["1f1b", "gpipe"]


SIZE_FIELDS = (("global_batch", "batch", "the global batch in sequences"),
               ("seq_len", "seq", "the sequence length in tokens"))
"""The problem's sizes a cluster file does not hold: (field, the API argument and --option name that
gives it, what it is), for the messages that name a missing one."""


class PoseidonProblem(Problem):
    """Train `model` on `cluster` with `global_batch` sequences of `seq_len` tokens per iteration.

    Costs come from the operation model of gpuplan.models.poseidon.cost (GEMMs by shape against the
    type's measured ceiling, or `matmul_sweep`: per type, measured (n, fraction of peak) of square
    matmuls; a flat `efficiency` replaces the curve when given) unless `layer_costs` (a profile's
    per-layer table) gives measured forward/backward seconds per device type. `flash_attention`,
    `causal_attention` (flash skips masked blocks), `sequence_parallel` (Megatron SP) and
    `blocking_p2p` are the recorded execution assumptions: `blocking_p2p` true (Megatron-LM on GPUs,
    the default) holds the sending device for each pipeline exchange, its send plus the TP
    all-gather of its scatter/gather chunks (`exchanges_s`); false for a runtime whose sends overlap
    compute (gpuplan run's torch.distributed.pipelining on gloo: a send is only an edge of the DAG).
    `overlap_dp_allreduce` false (Megatron-LM's local DDP, 2019-2023 default): each stage all-reduces
    its gradients after its last backward; true (PyTorch DDP, Megatron's --overlap-grad-reduce):
    gradient buckets are all-reduced during the last micro-batch's backward, and only what outlasts
    it, or at least the last bucket, stays exposed (`CostModel.dp_exposed_s`).
    `distributed_optimizer` (Megatron-LM's --use-distributed-optimizer, ZeRO stage 1): each
    data-parallel replica keeps the optimizer states (fp32 main weights and moments) of 1/dp of its
    stage's parameters and updates only those; the gradient all-reduce becomes a reduce-scatter of
    the gradients and, after the step, an all-gather of the updated weights (the same bus volume;
    with `overlap_dp_allreduce` the all-gather overlaps the next forward, as --overlap-param-gather
    does, and only its first bucket stays exposed).
    `fsdp` (PyTorch FSDP2's fully_shard per block, torchtitan's data_parallel_shard_degree; ZeRO
    stage 3): each data-parallel replica keeps 1/dp of its stage's weights, gradients and optimizer
    states; every micro-batch all-gathers each block's weights before its forward and again before
    its backward and reduce-scatters its gradients after it (fp32, torchtitan's default reduce dtype),
    the next block's gather prefetched under the current block's compute (`CostModel.fsdp_layer_s`);
    no gradient all-reduce remains, and the optimizer steps on the shard.
    `tp_comm_overlap` (Megatron-LM's --tp-comm-overlap: Transformer Engine's userbuffers, as NeMo's and
    Megatron-Bridge's H100 recipes run them; it needs `sequence_parallel`): each TP all-gather and
    reduce-scatter runs beside the GEMM that needs or makes its tensor, and only what outlasts it stays
    exposed (`cost.tp_overlap_s`); false: every TP collective is exposed.
    `dtype` fp8 is fp8 training as Transformer Engine runs it (gpuplan.models.poseidon.cost): the
    blocks' linear layers compute in fp8 (on fp8 copies of their weights, `FP8_WEIGHT_BYTES` per
    parameter, and of their inputs, which are kept for the backward in fp8) while weights,
    gradients, activations and communication stay bf16 (`storage_dtype`). `fp8_recipe` "delayed"
    (Megatron-LM's default) scales by earlier iterations' amax; "current" (Megatron's tensorwise,
    Megatron-Bridge's FP8-CS, torchao's float8) first reads each tensor for its amax. `fp8_params`
    (Megatron-LM's --fp8-param-gather, Transformer Engine's fp8_model_init, as Megatron-Bridge's FP8-CS
    recipes run them; it needs the distributed optimizer or FSDP): the blocks' weights are held only as
    their fp8 copies (weight and transpose), with no 16-bit copy beside them (the fp32 main weights
    stay in the optimizer states); the data-parallel gathers of block weights (the distributed
    optimizer's after the step, FSDP's per block) move 1 byte per element; the optimizer casts its
    updated shard straight into fp8 (`CostModel.optimizer_step_s`).
    `fused_cross_entropy` (Megatron's --cross-entropy-loss-fusion with Transformer Engine's kernel,
    Megatron-Bridge's default): the loss reads the 16-bit logits and writes their gradient in place
    (`cost.ce_bytes_per_logit`), holding no fp32 copy (`CostModel.logits_bytes`); false: Megatron-LM's
    unfused fp32 sequence.
    `attention_library`: whose fused attention kernel runs, "te" (Transformer Engine's, as Megatron-LM and
    NeMo run it: cuDNN's on Hopper) or "sdpa" (PyTorch's scaled_dot_product_attention, as FSDP scripts and
    earlier torchtitan releases run it: FlashAttention-2, markedly slower on Hopper); both FlashAttention-2 on
    the A100.
    `grad_reduce_in_fp32`: the data-parallel gradients are accumulated, held and reduced in fp32 (4 B per
    element) or in the 16-bit storage dtype (`grad_reduce_bytes`); None (the default) takes what the
    trainer does by default: in fp32 for bf16 and fp8 (Megatron-LM forces
    --accumulate-allreduce-grads-in-fp32 with --bf16 unless --grad-reduce-in-bf16; torchtitan's FSDP2
    reduces in fp32) and, without FSDP, in fp16 for fp16 (Megatron-LM's default there). It sets the
    gradient buffer's bytes (`CostModel.param_bytes`), the weight-gradient GEMMs' accumulation, the
    reduce-scatters' and all-reduces' bytes and the buffer's zeroing. `gradient_accumulation_fusion`
    (Megatron-LM's default since 2022; false: --no-gradient-accumulation-fusion, and Megatron-LM before it)
    accumulates each weight gradient in the GEMM's epilogue; false writes it in 16 bits and adds it to the
    main gradient in a separate kernel (`wgrad_bytes`).
    `recompute` is "auto" (per stage the fastest mode that fits:
    none, selective, full) or one mode for every stage. Memory per device = weights + gradients
    (`dtype`) + optimizer states (`optimizer_state_bytes_per_param`, 12 for Adam with fp32 master
    weights; divided by dp with `distributed_optimizer`; weights and gradients too with `fsdp`, plus the
    unsharded blocks FSDP works on) + in-flight activations, within
    `memory_fraction` of the device memory.
    """

    kind: Literal["poseidon"] = "poseidon"
    cluster: Cluster
    model: TransformerConfig
    global_batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "bf16"
    optimizer_state_bytes_per_param: float = Field(default=12.0, ge=0)
    efficiency: float | None = Field(default=None, gt=0, le=1)
    matmul_sweep: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)
    recompute: Literal["auto", "none", "selective", "full"] = "auto"
    flash_attention: bool = True
    causal_attention: bool = True
    sequence_parallel: bool = True
    blocking_p2p: bool = True  # Megatron-LM's p2p_communication._communicate (see `exchanges_s`)
    overlap_dp_allreduce: bool = False  # torch DDP / --overlap-grad-reduce (see `CostModel.dp_exposed_s`)
    distributed_optimizer: bool = False  # --use-distributed-optimizer / ZeRO-1 (see `CostModel.param_bytes`)
    fsdp: bool = False  # FSDP2 / ZeRO-3 over each stage's data-parallel group (see `CostModel.fsdp_layer_s`)
    eager_kernels: bool = False  # PyTorch eager element-wise kernels, as torchtitan runs without compile
    composite_norm: bool = False  # RMSNorm as PyTorch's separate eager kernels (torchtitan 2024's "rmsnorm")
    tp_comm_overlap: bool = False  # TE userbuffers / --tp-comm-overlap (see `cost.tp_overlap_s`); needs SP
    fp8_recipe: Literal["delayed", "current"] = "delayed"  # fp8 scaling (see `cost.FP8_AMAX_BYTES`)
    fp8_params: bool = False  # block weights held in fp8 only, gathered in fp8 (--fp8-param-gather)
    fused_cross_entropy: bool = False  # --cross-entropy-loss-fusion, TE's kernel (see `cost.ce_bytes_per_logit`)
    attention_library: Literal["te", "sdpa"] = "te"  # whose fused attention kernel runs (see `cost.flash_fractions`)
    grad_reduce_in_fp32: bool | None = None  # gradient buffer and reduction in fp32 (see `grad_reduce_bytes`)
    gradient_accumulation_fusion: bool = True  # wgrad GEMMs accumulate into the main gradients (see `wgrad_bytes`)
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    max_tp: int = Field(default=8, ge=1)
    max_stages: int = Field(default=128, ge=1)  # 1T-parameter models use 64+ stages (Narayanan et al. 2021)
    max_microbatches: int = Field(default=1024, ge=1)
    max_interleave: int = Field(default=4, ge=1)  # model chunks per stage the search may choose (1: none)
    schedule: Schedule = "1f1b"
    layer_costs: LayerTable | None = None

    @model_validator(mode="before")
    @classmethod
    def _model_by_name(cls, data: Any) -> Any:
        return model_by_name(data)

    @model_validator(mode="after")
    def _devices_and_sequence(self) -> "PoseidonProblem":
        if not self.cluster.devices:
            nodes = ", ".join(f"{n.name}: {dict(n.gpus)}" for n in self.cluster.nodes) or "no nodes"
            raise ValueError(f"at cluster: at least one GPU to train on; the cluster has none ({nodes})")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"at seq_len: at most the model's maximum sequence length, {self.model.max_seq_len} "
                             f"tokens for {self.model.name}, not {self.seq_len}")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ValueError("at tp_comm_overlap: false without sequence_parallel, or sequence_parallel true: "
                             "Transformer Engine's TP overlap splits the all-gathers and reduce-scatters of "
                             "sequence parallelism into chunks beside the GEMMs, and has nothing to overlap "
                             "without it")
        if self.attention_library != "te" and not self.flash_attention:
            raise ValueError(f"at attention_library: te (the default) with flash_attention false, or "
                             f"flash_attention true: the library ({self.attention_library}) names whose fused "
                             f"attention kernel runs, and explicit attention runs none")
        if self.fp8_recipe != "delayed" and self.dtype != "fp8":
            raise ValueError(f"at fp8_recipe: delayed (the default) with dtype {self.dtype}, or dtype fp8: the "
                             f"recipe scales fp8 tensors and there are none")
        if self.fp8_params and self.dtype != "fp8":
            raise ValueError(f"at fp8_params: false with dtype {self.dtype}, or dtype fp8: fp8 parameters are the "
                             f"fp8 copies of the linear layers' weights, which only fp8 training makes")
        if self.grad_reduce_in_fp32 is False and storage_dtype(self.dtype) == "fp32":
            raise ValueError("at grad_reduce_in_fp32: true or unset with dtype fp32, or a 16-bit dtype: fp32 "
                             "training holds and reduces its gradients in fp32")
        if self.fp8_params and not (self.distributed_optimizer or self.fsdp):
            raise ValueError("at fp8_params: false, or distributed_optimizer or fsdp true: the fp32 main weights "
                             "live in the sharded optimizer states, from which each step casts and gathers the "
                             "fp8 weights (Megatron-LM refuses --fp8-param-gather without them)")
        for name in self.cluster.capacity():  # the time model reads each type's peak at the problem's dtype
            if self.dtype == "fp8" and "fp8" not in self.cluster.type_of(name).peak_tflops:
                raise ValueError(f"at dtype: bf16 or fp16 on device type {name!r}, not fp8: fp8 training runs the "
                                 f"linear layers on fp8 tensor cores (Ada, Hopper and later), which it lacks (it "
                                 f"lists no fp8 peak under peak_tflops)")
            try:
                self.cluster.type_of(name).peak(self.dtype)
                self.cluster.type_of(name).peak(storage_dtype(self.dtype))
            except ValueError as exc:
                raise ValueError(f"at cluster.device_types.{name}.peak_tflops: {exc} (the problem's dtype is "
                                 f"{self.dtype})") from None
        return self

    @model_validator(mode="after")
    def _costs_cover_types(self) -> "PoseidonProblem":
        if self.layer_costs is not None:
            have = {c.device_type for c in self.layer_costs.costs if c.part == "layer"}
            for t in self.cluster.capacity():
                if t not in have:
                    raise ValueError(f"at layer_costs.costs: layer costs for every device type of the cluster; "
                                     f"{t!r} has none (have {sorted(have)})")
        return self


class StagePlan(BaseModel):
    """One pipeline stage of a plan (all fields plain data, read by Tessel and Lagom).

    device_type: the type of every device of the stage; gpu_ids: global device ids (cluster order),
    grouped tp-major (ids[r*tp:(r+1)*tp] is data-parallel replica r); nodes: the nodes they sit on.
    Layers [first_layer, last_layer) are transformer blocks; the first stage also holds the
    embedding, the last the output head (with the plan's `interleave` v > 1 the stage's blocks form v
    chunks: chunk c holds blocks [c L/v + first_layer/v, c L/v + last_layer/v), L the model's layers).
    recompute: "none", "selective" (the attention core), "full" (every block re-runs its forward in the
    backward) or "full:K" (only K of the stage's blocks do, the others keep their activations: Megatron's
    --recompute-method block --recompute-num-layers K / v per chunk; K a multiple of the interleave);
    booleans read as full / none.
    forward_s / backward_s: predicted seconds for one micro-batch over all the stage's chunks
    (backward includes what recomputation re-runs); p2p_s: seconds to send
    one micro-batch's activations to the next stage; allreduce_s: the data-parallel gradient
    all-reduce; optimizer_s: the optimizer step; memory_bytes: peak predicted memory per device.
    """

    index: int
    device_type: str
    nodes: list[str] = Field(default_factory=list)
    gpu_ids: list[int] = Field(default_factory=list)
    tp: int = 1
    dp: int = 1
    first_layer: int = 0
    last_layer: int = 0
    micro_batch_size: int = 1
    recompute: str = "none"
    forward_s: float = 0.0
    backward_s: float = 0.0
    p2p_s: float = 0.0
    allreduce_s: float = 0.0
    optimizer_s: float = 0.0
    memory_bytes: float = 0.0

    @field_validator("recompute", mode="before")
    @classmethod
    def _recompute_mode(cls, v: Any) -> Any:
        return recompute_label(v)

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks in the stage."""
        return self.last_layer - self.first_layer


class PoseidonPlan(Plan):
    """A Poseidon plan: `stages` in pipeline order, `num_microbatches` per iteration, the schedule.

    `iteration_time_s` is the DAG longest path (seconds per training iteration); predicted holds
    iteration_time_s, throughput_samples_per_s, tokens_per_s, bubble_fraction, model_tflops_per_gpu
    and mfu. `interleave` is the number of model chunks per stage (Megatron's interleaved 1F1B, 1 =
    plain 1F1B / GPipe).
    """

    kind: str = "poseidon"
    stages: list[StagePlan] = Field(default_factory=list)
    num_microbatches: int = 1
    schedule: Schedule = "1f1b"
    interleave: int = Field(default=1, ge=1)
    iteration_time_s: float = 0.0


# ------------------------------------------------------------------------------------------------
# Per-layer costs
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageShape:
    """The devices of one stage before layers are mapped: type, tp x dp, device ids, nodes."""

    device_type: str
    tp: int
    dp: int
    gpu_ids: tuple[int, ...]
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.device_type, self.tp, self.dp, self.gpu_ids, self.nodes)))

    def __hash__(self) -> int:  # computed once: shapes key the search's caches millions of times
        return self._hash  # type: ignore[attr-defined, no-any-return]


def dp_group(shape: StageShape) -> list[int]:
    """Return the device ids of one data-parallel group of `shape`: the first TP rank of each replica
    (every group of the stage has the same shape, so one stands for all)."""
    return [shape.gpu_ids[r * shape.tp] for r in range(shape.dp)]


def recompute_label(value: Any) -> str:
    """Return the recomputation a plan or config value names, normalised: "none", "selective", "full"
    or "full:K" (K >= 1 of the stage's blocks fully recomputed, the rest keeping their activations); a
    boolean reads as full (True) / none (False). Raises ValueError on anything else."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        text = value.strip().lower()
        if text in RECOMPUTE_MODES:
            return text
        head, _, count = text.partition(":")
        if head == "full" and count.isdigit() and int(count) >= 1:
            return f"full:{int(count)}"
    raise ValueError(f"a recomputation mode ({', '.join(RECOMPUTE_MODES)}, or full:K for K of a stage's blocks), "
                     f"not {value!r}")


def recompute_mode(value: Any) -> str:
    """Return the recomputation mode ("none", "selective", "full") a plan or config value names ("full:K"
    reads as full); a boolean reads as full (True) / none (False). Raises ValueError on anything else."""
    return recompute_label(value).partition(":")[0]


def partial_blocks(value: Any) -> int:
    """Return K of a partial recomputation "full:K" (the stage's blocks fully recomputed), 0 for any other
    mode."""
    head, _, count = recompute_label(value).partition(":")
    return int(count) if count else 0


def recomputed_blocks(value: Any, n_layers: int) -> int:
    """Return how many of a stage's `n_layers` blocks re-run their forward in the backward under
    recomputation `value`: all under "full", min(K, n_layers) under "full:K", none otherwise (selective
    re-runs only the attention core of every block)."""
    if recompute_label(value) == "full":
        return n_layers
    return min(partial_blocks(value), n_layers)


class CostModel:
    """Per-layer times (seconds) and sizes (bytes) of a problem, cached by (type, tp, micro-batch).

    layer(type, tp, b) -> (forward_s, backward_s) of one transformer block incl. its TP collectives
    (no recomputation); recompute_s(type, tp, b, mode) -> what recomputation adds to its backward;
    extras(type, tp, b, first, last) -> the embedding/head (forward_s, backward_s) a stage adds.
    """

    def __init__(self, problem: PoseidonProblem) -> None:
        self.p = problem
        self.cfg = problem.model
        self.wbytes = DTYPE_BYTES[storage_dtype(problem.dtype)]
        # bytes per element of a block weight's data-parallel gather: its fp8 copy with `fp8_params`
        self.gather_bytes = FP8_PARAM_BYTES if problem.fp8_params else self.wbytes
        # bytes per element of the data-parallel gradients (buffer, accumulation, reduction)
        self.grad_bytes = grad_reduce_bytes(problem.dtype, problem.fsdp, problem.grad_reduce_in_fp32)
        wgrad = self.wbytes if problem.fsdp else wgrad_bytes(self.wbytes, self.grad_bytes,
                                                             problem.gradient_accumulation_fusion)
        self.opts = LayerOptions(flash=problem.flash_attention, causal=problem.causal_attention,
                                 sequence_parallel=problem.sequence_parallel, eager=problem.eager_kernels,
                                 composite_norm=problem.composite_norm,
                                 wgrad_out_bytes=wgrad,
                                 tp_overlap=problem.tp_comm_overlap,
                                 fp8_current=problem.fp8_recipe == "current",
                                 attention_library=problem.attention_library)
        self._times: dict[tuple[str, int, int], LayerTimes] = {}
        self._layer: dict[tuple[str, int, int], tuple[float, float]] = {}
        self._dev: dict[str, Any] = {}
        self._link: dict[tuple[str, str], Any] = {}
        self._table: dict[tuple[str, str], list[LayerCost]] = {}
        from gpuplan.models import collectives  # lazily: it pulls in numpy

        self._coll = collectives
        self._tp_coll: dict[tuple[str, int, str, float], float] = {}
        self._dp: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self._scale = {"layer": 1.0, "embedding": 1.0, "head": 1.0}
        if problem.layer_costs is not None:
            for c in problem.layer_costs.costs:
                self._table.setdefault((c.device_type, c.part), []).append(c)
            # a table measured on another (e.g. scaled-down) configuration: scale by the FLOP ratio
            try:
                measured = TransformerConfig.model_validate(problem.layer_costs.config)
            except ValueError:
                measured = self.cfg
            if measured.model_dump(exclude={"name"}) != self.cfg.model_dump(exclude={"name"}):
                self._scale = {"layer": self.cfg.layer_forward_flops(1, 1024) / measured.layer_forward_flops(1, 1024),
                               "embedding": self.cfg.hidden / measured.hidden,
                               "head": self.cfg.head_forward_flops(1, 1) / measured.head_forward_flops(1, 1)}

    # --- measured table lookup: exact (b, tp) when profiled, else scaled linearly from the nearest
    # (and by the FLOP ratio when the table was measured on another configuration of the model)
    def _measured(self, dtype: str, part: str, tp: int, b: int) -> tuple[float, float] | None:
        rows = self._table.get((dtype, part))
        if not rows:
            return None
        rows = [r for r in rows if r.seq_len == self.p.seq_len] or rows
        best = min(rows, key=lambda r: (r.tp != tp, abs(math.log(r.micro_batch / b)), r.tp))
        scale = (b / best.micro_batch) * (best.tp / tp) * (self.p.seq_len / best.seq_len) * self._scale[part]
        return best.forward_s * scale, best.backward_s * scale

    def sweep(self, dtype: str) -> list[tuple[int, float]] | None:
        """Return the problem's measured matmul sweep of type `dtype` as (n, fraction of peak), or None."""
        if self.p.efficiency is not None:
            return [(1, self.p.efficiency)]
        pts = self.p.matmul_sweep.get(dtype)
        return [(int(n), float(f)) for n, f in pts] if pts else None

    def tp_collective_s(self, dtype: str, tp: int, op: str, size_bytes: float) -> float:
        """Return the seconds of one TP collective `op` of `size_bytes` over `tp` devices of `dtype` in
        one node (models.collectives; its alpha-beta ring at the intra-node link rate when no node
        holds `tp` of them)."""
        if tp <= 1:
            return 0.0
        key = (dtype, tp, op, size_bytes)
        if key not in self._tp_coll:
            node = next((n for n in self.p.cluster.nodes
                         if sum(c for t, c in n.gpus.items() if self.p.cluster.type_key(t) == dtype) >= tp), None)
            if node is not None:
                ids = [d.id for d in self.p.cluster.devices if d.node == node.name and d.type == dtype][:tp]
                t = float(self._coll.collective_time_s(self.p.cluster, op, size_bytes, ids, self.wbytes))
            else:
                t = self._coll.fallback_time_s(op, size_bytes, tp, *self.intra(dtype))
            self._tp_coll[key] = t
        return self._tp_coll[key]

    def layer_times(self, dtype: str, tp: int, b: int) -> LayerTimes:
        """Return the LayerTimes (compute, TP collectives, attention core) of one block, cached; from the
        measured table when it has the type (the analytic attention-core share scales with it)."""
        key = (dtype, tp, b)
        if key not in self._times:
            dev = self.dev(dtype)
            t = layer_times(self.cfg, dev, self.p.dtype, tp, b, self.p.seq_len, self.opts,
                            lambda op, size: self.tp_collective_s(dtype, tp, op, size), self.sweep(dtype))
            measured = self._measured(dtype, "layer", tp, b)
            if measured is not None:
                f, g = measured
                share = t.selective_s / t.forward_s if t.forward_s > 0 else 0.0
                t = LayerTimes(f, g, t.tp_comm_s, share * f, t.memory_bound_forward, t.memory_bound_backward)
            self._times[key] = t
        return self._times[key]

    def dev(self, dtype: str) -> Any:
        """Return the DeviceType called `dtype` (cached)."""
        if dtype not in self._dev:
            self._dev[dtype] = self.p.cluster.type_of(dtype)
        return self._dev[dtype]

    def link(self, a: str, b: str) -> Any:
        """Return the cluster's Link between nodes a and b (cached)."""
        if (a, b) not in self._link:
            self._link[(a, b)] = self.p.cluster.link(a, b)
        return self._link[(a, b)]

    def tail_s(self, shape: StageShape, n_layers: int, first: bool, last: bool, num_stages: int = 2) -> float:
        """Return the seconds of a stage's gradient all-reduce (over dp) plus its optimizer step
        (`optimizer_step_bytes_per_param` streamed through HBM per parameter). With
        `overlap_dp_allreduce` the all-reduce is its least exposure (the last bucket): a lower bound,
        which `dp_overlap_extra_s` completes once the backward it hides under is known."""
        return (self.dp_exposed_s(shape, n_layers, first, last, num_stages, math.inf)
                + self.optimizer_step_s(shape, n_layers, first, last, num_stages))

    def param_bytes(self, dp: int) -> float:
        """Return the bytes a device keeps per parameter of its stage (after tp): weights (`dtype`),
        gradients (`grad_bytes`: Megatron's bf16 default, 2 + 4 + 12 = 18 B, or 6 + 12 / dp with the
        distributed optimizer, as Megatron-LM's theoretical_memory_usage counts them) and the
        optimizer states, these split over the `dp` replicas with `distributed_optimizer` (ZeRO stage
        1), all three with `fsdp` (ZeRO stage 3). fp16's fp32 gradient copies live only in the
        optimizer step, when no activation is held, so they are not counted."""
        return sum(self.param_parts(dp))

    def param_parts(self, dp: int) -> tuple[float, float, float]:
        """Return `param_bytes` split into (weights, gradients, optimizer states) bytes per parameter. FSDP2
        keeps the fp32 shard (the states' main weight), its gradient and the moments: 2 x weight bytes over
        dp beside the states, counted as a 16-bit weight and a 16-bit gradient shard."""
        states = self.p.optimizer_state_bytes_per_param
        if self.p.fsdp:
            return self.wbytes / dp, self.wbytes / dp, states / dp
        return self.wbytes, self.grad_bytes, states / dp if self.p.distributed_optimizer else states

    def fsdp_working_bytes(self, tp: int) -> float:
        """Return the bytes per device FSDP holds unsharded beside the shards (0 without `fsdp`): the
        gathered weights (16-bit; with `fp8_params` fp8 and their transposes) of the block being computed
        and of the next (prefetched), and one block's gradient before its reduce-scatter
        (`grad_bytes` per element)."""
        if not self.p.fsdp:
            return 0.0
        gathered = FP8_WEIGHT_BYTES if self.p.fp8_params else self.wbytes
        return self.cfg.layer_params() / tp * (2 * gathered + self.grad_bytes)

    def fsdp_layer_s(self, shape: StageShape) -> tuple[float, float]:
        """Return (all_gather_s, reduce_scatter_s) of one block under `fsdp` over the stage's
        data-parallel group (`dp_collective_s`): the gather of its 16-bit weights, the reduce-scatter
        of its gradients in `grad_bytes`; (0, 0) without `fsdp` or data parallelism."""
        if not self.p.fsdp or shape.dp <= 1:
            return 0.0, 0.0
        key = ("fsdp", shape)
        if key not in self._dp:
            elems = self.cfg.layer_params() / shape.tp
            self._dp[key] = (self.dp_collective_s(shape, "all_gather", elems * self.gather_bytes),
                             self.dp_collective_s(shape, "reduce_scatter", elems * self.grad_bytes, self.grad_bytes))
        ag, rs = self._dp[key]
        return ag, rs

    def stage_layer(self, shape: StageShape, b: int) -> tuple[float, float]:
        """Return (forward_s, backward_s) of one block on stage `shape` at micro-batch `b`: `layer`, and
        with `fsdp` the block's compute (with FSDP2's own copies on the compute stream, `fsdp_copies_s`)
        beside its communication, which runs on its own stream (FSDP2 prefetches the next block's
        gather): forward the gather, backward the gather and the reduce-scatter. As Lagom's windows
        time it (gpuplan.models.lagom.cost.window_time_us), the compute runs 1/s as fast while a
        collective with slowdown s (`fsdp_slowdowns`) runs, so a block takes D + max(0, C - sum d/s)
        = max(D, C + sum d (1 - 1/s)), D the collectives' seconds d, C the compute's.
        Recomputation's time adds to the backward after this."""
        f, g = self.layer(shape.device_type, shape.tp, b)
        ag, rs = self.fsdp_layer_s(shape)
        if ag == rs == 0.0:
            return f, g
        cf, cb = self.fsdp_copies_s(shape)
        s_f, s_ag, s_rs = self.fsdp_slowdowns(shape, b)
        return (max(ag, f + cf + ag * (1.0 - 1.0 / s_f)),
                max(ag + rs, g + cb + ag * (1.0 - 1.0 / s_ag) + rs * (1.0 - 1.0 / s_rs)))

    def fsdp_slowdowns(self, shape: StageShape, b: int) -> tuple[float, float, float]:
        """Return the factors (>= 1) by which a block's compute slows while FSDP's collectives run beside
        it (models.collectives.overlap_slowdown: Lagom's interference model at NCCL's default setting):
        the gather beside the forward, the gather and the reduce-scatter beside the backward, each at
        the compute's memory-bound share (the block's element-wise ops and FSDP2's copies)."""
        key = ("fsdp-slowdown", shape, b)
        if key not in self._dp:
            t = self.layer_times(shape.device_type, shape.tp, b)
            cf, cb = self.fsdp_copies_s(shape)
            f, g = t.forward_s, t.backward_s
            phi_f = (t.memory_bound_forward * f + cf) / (f + cf) if f + cf > 0 else 0.0
            phi_b = (t.memory_bound_backward * g + cb) / (g + cb) if g + cb > 0 else 0.0
            group = dp_group(shape)
            elems = self.cfg.layer_params() / shape.tp
            slow = self._coll.overlap_slowdown
            cl = self.p.cluster
            self._dp[key] = (slow(cl, "all_gather", elems * self.gather_bytes, group, phi_f, self.wbytes),
                             slow(cl, "all_gather", elems * self.gather_bytes, group, phi_b, self.wbytes),
                             slow(cl, "reduce_scatter", elems * self.grad_bytes, group, phi_b, int(self.grad_bytes)))
        s_f, s_ag, s_rs = self._dp[key]
        return s_f, s_ag, s_rs

    def fsdp_copies_s(self, shape: StageShape) -> tuple[float, float]:
        """Return the (forward, backward) seconds of the copies FSDP2 runs on the compute stream per
        block and micro-batch (torch.distributed.fsdp's foreach_all_gather_copy_out and
        foreach_reduce's copy-in, both on the current stream): after each gather the gathered buffer
        is copied into the block's unsharded weights (read + write 16-bit, or fp8 with `fp8_params`,
        forward and backward; with `fp8_params` the backward's gathered fp8 weight is also transposed
        for the input-gradient GEMM, read 1 + write 1), and before each reduce-scatter the 16-bit
        gradients are copied, cast to `grad_bytes`, into its input buffer (backward). (0, 0)
        where `fsdp_layer_s` is."""
        elems = self.cfg.layer_params() / shape.tp
        dev = self.dev(shape.device_type)
        out = memory_s(dev, elems * 2 * self.gather_bytes)
        transpose = 2 * FP8_PARAM_BYTES if self.p.fp8_params else 0.0
        return out, out + memory_s(dev, elems * (self.wbytes + self.grad_bytes + transpose))

    def stage_extras(self, shape: StageShape, b: int, first: bool, last: bool) -> tuple[float, float]:
        """Return `extras` (embedding / head) of stage `shape`, and with `fsdp` what no compute hides in
        each micro-batch: the gather of the first block's weights before the forward starts, and the
        reduce-scatter of the last gradients after the backward ends."""
        ef, eg = self.extras(shape.device_type, shape.tp, b, first, last)
        ag, rs = self.fsdp_layer_s(shape)
        return ef + ag, eg + rs

    def fp8_weight_bytes(self, n_layers: int, tp: int) -> float:
        """Return the bytes of the fp8 weight copies (weight and its transpose, `FP8_WEIGHT_BYTES` per
        parameter) of `n_layers` blocks on one device in fp8 training (0 otherwise)."""
        return n_layers * self.cfg.layer_params() / tp * FP8_WEIGHT_BYTES if self.p.dtype == "fp8" else 0.0

    def fp8_params_saved_bytes(self, shape: StageShape, n_layers: int) -> float:
        """Return the bytes per device that `fp8_params` saves on `n_layers` blocks against
        `param_bytes` + `fp8_weight_bytes` (0 without it): the 16-bit weights beside the fp8 copies;
        with `fsdp` the 16-bit shards, and the fp8 copies of every block, since the shards hold the
        fp8 weights (1 B per element, over dp) and only the gathered blocks are unsharded
        (`fsdp_working_bytes`)."""
        if not self.p.fp8_params:
            return 0.0
        per = self.wbytes
        if self.p.fsdp:
            per = (self.wbytes - FP8_PARAM_BYTES) / shape.dp + FP8_WEIGHT_BYTES
        return n_layers * self.cfg.layer_params() / shape.tp * per

    def optimizer_step_s(self, shape: StageShape, n_layers: int, first: bool, last: bool,
                         num_stages: int = 2) -> float:
        """Return the seconds of a stage's optimizer step: `optimizer_step_bytes_per_param` per
        parameter (split by tp) streamed through HBM. With `distributed_optimizer` each replica
        unscales, clips and updates its 1/dp shard (and copies it into the 16-bit weights) and zeroes
        its whole gradient buffer (`grad_bytes` per parameter). With `fp8_params` the blocks' shard is cast
        from the fp32 main weights straight into fp8 (write 1 B instead of 16 bits; current scaling
        reads the main weights once more for their amax) and, once gathered, each fp8 weight's
        transpose is made (read 1, write 1; with `fsdp` after each gather instead, `fsdp_copies_s`)."""
        params = self.stage_params(n_layers, first, last, num_stages) / shape.tp
        per = self.optimizer_step_bytes_per_param()
        sharded = (self.p.fsdp or self.p.distributed_optimizer) and shape.dp > 1
        if self.p.fsdp and shape.dp > 1:  # the gradients are sharded too: all of the step on the shard
            per = per / shape.dp
        elif self.p.distributed_optimizer and shape.dp > 1:
            per = (per - self.grad_bytes) / shape.dp + self.grad_bytes
        blocks = self.fp8_weight_bytes(n_layers, shape.tp) / FP8_WEIGHT_BYTES  # fp8 block parameters
        if self.p.fp8_params:
            amax = 4.0 if self.opts.fp8_current else 0.0  # the fp32 main weights' amax pass
            shard = blocks / shape.dp if sharded else blocks
            transpose = 0.0 if self.p.fsdp else blocks
            cast = shard * (FP8_PARAM_BYTES - self.wbytes + amax) + transpose * 2.0 * FP8_PARAM_BYTES
        else:
            # fp8: the updated bf16 weights are cast into their fp8 copies once per iteration (read 2 B,
            # write the copy and its transpose; current scaling reads them once more for their amax),
            # cached across the micro-batches
            amax = FP8_AMAX_BYTES if self.opts.fp8_current else 0.0
            cast = blocks * (self.wbytes + FP8_WEIGHT_BYTES + amax)
        return memory_s(self.dev(shape.device_type), params * per + cast)

    def dp_exposed_s(self, shape: StageShape, n_layers: int, first: bool, last: bool, num_stages: int,
                     window_s: float) -> float:
        """Return the seconds of a stage's data-parallel gradient all-reduce that the iteration waits
        for after the stage's last backward, which lasts `window_s` seconds.

        Without `overlap_dp_allreduce`: all of it (Megatron-LM's local DDP all-reduces after the
        backward pass, `train_step`). With it (PyTorch DDP; Megatron's --overlap-grad-reduce):
        buckets of `DDP_BUCKET_BYTES` are all-reduced as their gradients become ready during the last
        micro-batch's backward (earlier micro-batches run under no_sync), one collective at a time,
        so what outlasts the window stays exposed, and at least the last bucket, which is ready only
        when the backward ends. While the other buckets (h seconds) run beside the backward, its
        compute runs 1/s as fast (`dp_slowdowns`: Lagom's interference at NCCL's default setting), so
        as Lagom's windows time it the iteration waits bucket + max(h - window_s, h (1 - 1/s)) after
        the backward's own compute (with s = 1: max(last bucket, all-reduce - window_s)).

        With `distributed_optimizer` the all-reduce is a reduce-scatter of the gradients (exposed as
        above) followed, after the step, by an all-gather of the updated weights: all of it without
        overlap; with it (--overlap-param-gather) the next forward waits for the first bucket only,
        and its compute slows beside the other buckets as above."""
        if self.p.fsdp:  # the reduce-scatters run per block inside each backward (`stage_extras`)
            return 0.0
        key = (shape, n_layers, first, last, num_stages == 1)
        if key not in self._dp:
            params = self.stage_params(n_layers, first, last, num_stages) / shape.tp
            size, g = params * self.grad_bytes, self.grad_bytes
            bucket_size = min(size, DDP_BUCKET_BYTES)
            reduce = "reduce_scatter" if self.p.distributed_optimizer else "all_reduce"
            # the updated weights' gather: the blocks' in fp8 with `fp8_params`, the rest 16-bit
            gathered = (params * self.wbytes
                        - n_layers * self.cfg.layer_params() / shape.tp * (self.wbytes - self.gather_bytes))
            gather, gather_bucket = ((self.dp_collective_s(shape, "all_gather", gathered),
                                      self.dp_collective_s(shape, "all_gather", min(gathered, DDP_BUCKET_BYTES)))
                                     if self.p.distributed_optimizer else (0.0, 0.0))
            self._dp[key] = (self.dp_collective_s(shape, reduce, size, g), self.dp_collective_s(shape, reduce, bucket_size, g),
                             gather, gather_bucket, *self.dp_slowdowns(shape, reduce, bucket_size))
        full, bucket, gather, gather_bucket, s_reduce, s_gather = self._dp[key]
        if not self.p.overlap_dp_allreduce:
            return full + gather
        hidden, hidden_gather = full - bucket, gather - gather_bucket
        return (bucket + max(hidden - window_s, hidden * (1.0 - 1.0 / s_reduce))
                + gather_bucket + hidden_gather * (1.0 - 1.0 / s_gather))

    def dp_slowdowns(self, shape: StageShape, reduce: str, bucket_bytes: float) -> tuple[float, float]:
        """Return the factors (>= 1) by which the compute slows beside one gradient bucket's `reduce`
        (during the backward) and beside one bucket's weight all-gather (during the next forward,
        distributed optimizer), as `models.collectives.overlap_slowdown` gives them at a block's
        memory-bound share; (1, 1) without `overlap_dp_allreduce` or data parallelism."""
        if not self.p.overlap_dp_allreduce or shape.dp <= 1 or bucket_bytes <= 0:
            return 1.0, 1.0
        t = self.layer_times(shape.device_type, shape.tp, 1)
        group = dp_group(shape)
        slow, cl = self._coll.overlap_slowdown, self.p.cluster
        return (slow(cl, reduce, bucket_bytes, group, t.memory_bound_backward, int(self.grad_bytes)),
                slow(cl, "all_gather", bucket_bytes, group, t.memory_bound_forward, self.wbytes)
                if self.p.distributed_optimizer else 1.0)

    def dp_overlap_extra_s(self, shape: StageShape, n_layers: int, first: bool, last: bool, num_stages: int,
                           window_s: float) -> float:
        """Return the seconds `dp_exposed_s` adds to `tail_s`'s lower bound when the stage's last
        backward lasts `window_s` (0 without `overlap_dp_allreduce`)."""
        if not self.p.overlap_dp_allreduce:
            return 0.0
        return (self.dp_exposed_s(shape, n_layers, first, last, num_stages, window_s)
                - self.dp_exposed_s(shape, n_layers, first, last, num_stages, math.inf))

    def optimizer_step_bytes_per_param(self) -> float:
        """Return the HBM bytes one optimizer step moves per parameter.

        Mixed precision (Megatron-LM's MixedPrecisionOptimizer.step, apex FusedAdam): fp32 main
        gradients are unscaled in place with an inf/NaN check (read + write 4 B), read once more for
        the clipping norm (4 B); Adam reads the fp32 main weight, gradient and the optimizer states
        and writes the weight and states back; the main weight is then copied into the model's
        16-bit weight (read 4 B, write `wbytes`), and the gradient buffer is zeroed for the next
        iteration (write `grad_bytes`). 16-bit gradients (`grad_bytes` 2) are first copied into fp32
        main gradients (read 2, write 4). In fp32 there is no main copy and no unscaling.
        With 12 B of states (main weight + two moments) in bf16: 8 + 4 + 28 + 6 + 4 = 50 B.
        """
        states = self.p.optimizer_state_bytes_per_param
        if self.wbytes >= 4:
            return 4.0 + (states + 4.0 + 4.0) + (states + 4.0) + 4.0  # norm; read w, g, states; write w, states; zero g
        grad = 4.0
        copy = 0.0 if self.grad_bytes >= grad else self.grad_bytes + grad
        return copy + 2 * grad + grad + (states + grad) + states + (4.0 + self.wbytes) + self.grad_bytes

    def dp_allreduce_s(self, shape: StageShape, size_bytes: float) -> float:
        """Return the seconds of the stage's data-parallel gradient all-reduce of `size_bytes` per
        device (`dp_collective_s`, elements of `grad_bytes`)."""
        return self.dp_collective_s(shape, "all_reduce", size_bytes, self.grad_bytes)

    def dp_collective_s(self, shape: StageShape, op: str, size_bytes: float, elem_bytes: float | None = None) -> float:
        """Return the seconds of collective `op` ("all_reduce", "reduce_scatter", "all_gather") of
        `size_bytes` per device (the whole vector, as nccl-tests counts it, of `elem_bytes`-byte elements,
        default the storage dtype's) over the stage's data-parallel group: NCCL's model
        (models.collectives: rings on every rail, achieved NVLink bandwidth); 0 without data parallelism."""
        if shape.dp <= 1:
            return 0.0
        group = dp_group(shape)
        width = int(self.wbytes if elem_bytes is None else elem_bytes)
        return float(self._coll.collective_time_s(self.p.cluster, op, size_bytes, group, width))

    def intra(self, dtype: str) -> tuple[float, float]:
        """Return (GB/s, latency s) of the slowest intra-node link among nodes holding `dtype`."""
        links = [self.link(n.name, n.name) for n in self.p.cluster.nodes
                 if any(self.p.cluster.type_key(t) == dtype and c > 0 for t, c in n.gpus.items())]
        link = min(links, key=lambda l: l.bandwidth_GBps)
        return link.bandwidth_GBps, link.latency_s

    def layer(self, dtype: str, tp: int, b: int) -> tuple[float, float]:
        """Return (forward_s, backward_s) of one transformer block at micro-batch `b`, TP `tp`, including
        its TP collectives, without recomputation."""
        key = (dtype, tp, b)
        if key not in self._layer:
            t = self.layer_times(dtype, tp, b)
            self._layer[key] = (t.forward_s + t.tp_comm_s, t.backward_s + t.tp_comm_s)
        return self._layer[key]

    def recompute_s(self, dtype: str, tp: int, b: int, mode: str) -> float:
        """Return the seconds recomputation `mode` adds to one block's backward (0 for "none")."""
        return self.layer_times(dtype, tp, b).recompute_s(mode)

    def extras(self, dtype: str, tp: int, b: int, first: bool, last: bool) -> tuple[float, float]:
        """Return (forward_s, backward_s) the embedding (first stage) and head + loss (last) add."""
        f = g = 0.0
        dev = self.dev(dtype)
        if first:
            m = self._measured(dtype, "embedding", tp, b)
            if m is None:
                m = embedding_times(self.cfg, dev, self.p.dtype, b, self.p.seq_len)
            f, g = f + m[0], g + m[1]
        if last:
            m = self._measured(dtype, "head", tp, b)
            if m is None:
                m = head_times(self.cfg, dev, self.p.dtype, tp, b, self.p.seq_len, self.sweep(dtype),
                               fused_ce=self.p.fused_cross_entropy, wgrad_out_bytes=self.opts.wgrad_out_bytes)
            f, g = f + m[0], g + m[1]
        return f, g

    def stage_params(self, n_layers: int, first: bool, last: bool, num_stages: int = 2) -> float:
        """Return the parameter count of a stage with `n_layers` blocks (+ embedding / head).

        Tied embeddings are held once by a single-stage plan; with several stages the first holds the
        embedding and the last a copy as the head (Megatron), whose gradients are summed (`tied_s`).
        """
        p = n_layers * self.cfg.layer_params()
        if first:
            p += self.cfg.embedding_params()
        if last:
            single = first and num_stages == 1
            p += self.cfg.head_params() if single else self.cfg.vocab * self.cfg.hidden + self.cfg.hidden
        return float(p)

    def tied_s(self, shapes: list[StageShape]) -> float:
        """Return the seconds of the all-reduce of the tied embedding's gradient between the first and
        the last stage (0 when untied or single-stage): vocab x hidden / tp values of `grad_bytes` (Megatron
        all-reduces the embedding's main gradient) over 2 ranks."""
        if not self.cfg.tied_embeddings or len(shapes) < 2:
            return 0.0
        a, z = shapes[0], shapes[-1]
        link = min((self.link(x, y) for x in a.nodes for y in z.nodes), key=lambda l: l.bandwidth_GBps)
        size = self.cfg.vocab * self.cfg.hidden / max(a.tp, z.tp) * self.grad_bytes
        return self._coll.fallback_time_s("all_reduce", size, 2, link.bandwidth_GBps, link.latency_s)

    def activation_bytes(self, tp: int, b: int, recompute: Any) -> float:
        """Return the activation bytes one block keeps per in-flight micro-batch (per device) under
        recomputation mode `recompute` (bools read as full / none)."""
        mode = recompute_mode(recompute)
        sp = self.p.sequence_parallel
        if mode == "full":
            return b * self.p.seq_len * self.cfg.hidden * self.wbytes / (tp if sp else 1)
        flash = self.p.flash_attention or mode == "selective"
        kept = self.cfg.layer_activation_bytes(b, self.p.seq_len, tp, flash=flash, sequence_parallel=sp)
        if self.p.dtype == "fp8":  # the four linear layers' inputs are kept as their 1-byte fp8 copies
            c = self.cfg
            tokens = b * self.p.seq_len
            kept -= tokens * (2 * c.hidden / (tp if sp else 1) + (c.heads * c.dhead + c.ffn_hidden) / tp)
        return kept

    def stage_activation_bytes(self, tp: int, b: int, recompute: Any, n_layers: int) -> float:
        """Return the activation bytes `n_layers` blocks keep per in-flight micro-batch (per device) under
        recomputation `recompute`: "full:K" keeps K blocks' inputs and the other blocks' activations."""
        mode = recompute_mode(recompute)
        k = recomputed_blocks(recompute, n_layers)
        return k * self.activation_bytes(tp, b, "full") + (n_layers - k) * self.activation_bytes(
            tp, b, "none" if mode == "full" else mode)

    def boundary_bytes(self, b: int) -> float:
        """Return the bytes of the activations sent between stages for one micro-batch of `b`."""
        return float(b * self.p.seq_len * self.cfg.hidden * self.wbytes)

    def logits_bytes(self, tp: int, b: int) -> float:
        """Return the bytes of the logits the last stage holds: fp32 logits and their gradient, or with
        `fused_cross_entropy` the 16-bit logits, whose gradient is written over them."""
        if self.p.fused_cross_entropy:
            return float(b * self.p.seq_len * self.cfg.vocab * self.wbytes / tp)
        return 2.0 * b * self.p.seq_len * self.cfg.vocab * 4 / tp


# PyTorch DDP's default gradient bucket (bucket_cap_mb=25): the last bucket's all-reduce cannot
# overlap the backward (`CostModel.dp_exposed_s`).
DDP_BUCKET_BYTES = 25 * 2**20

# Bytes per gradient element FSDP reduce-scatters and holds unsharded until then by default:
# torchtitan's default MixedPrecisionPolicy reduces in fp32 (mixed_precision_reduce = "float32").
FSDP_REDUCE_BYTES = 4.0


def wgrad_bytes(wbytes: float, grad_bytes: float, fused: bool) -> float:
    """Return the HBM bytes per element a weight-gradient GEMM's output costs in each micro-batch when it is
    accumulated into main gradients of `grad_bytes`: in the epilogue (`fused`, Megatron's
    gradient-accumulation fusion) a read and a write of the main gradient (8 in fp32, 4 in 16 bits); else
    the GEMM writes a `wbytes` gradient, which a separate kernel reads and adds into the main gradient
    (12 in fp32, as Megatron-LM ran before the fusion; 8 for 16-bit gradients, as autograd accumulates
    them)."""
    return 2.0 * grad_bytes if fused else 2.0 * wbytes + 2.0 * grad_bytes


def grad_dtype(problem: PoseidonProblem) -> str:
    """Return the dtype a problem's data-parallel gradients are held and reduced in: "fp32", or the 16-bit
    storage dtype ("bf16", "fp16"), as `grad_reduce_bytes` resolves it."""
    fp32 = grad_reduce_bytes(problem.dtype, problem.fsdp, problem.grad_reduce_in_fp32) >= 4
    return "fp32" if fp32 else storage_dtype(problem.dtype)


def grad_reduce_bytes(dtype: str, fsdp: bool, grad_reduce_in_fp32: bool | None) -> float:
    """Return the bytes per element of a stage's data-parallel gradients as they are accumulated, held and
    reduced: 4 with `grad_reduce_in_fp32` true, the storage dtype's with false; unset, the trainer's
    default: fp32 under `fsdp` (`FSDP_REDUCE_BYTES`, torchtitan's) and for bf16 and fp8 (Megatron-LM's
    arguments force accumulate_allreduce_grads_in_fp32 with --bf16), the storage dtype otherwise (fp16:
    Megatron-LM keeps 16-bit gradients and makes their fp32 copy only in the optimizer step)."""
    width = float(DTYPE_BYTES[storage_dtype(dtype)])
    if grad_reduce_in_fp32 is None:
        grad_reduce_in_fp32 = fsdp or storage_dtype(dtype) == "bf16"
    return max(width, FSDP_REDUCE_BYTES) if grad_reduce_in_fp32 else width

# Bytes per element of an fp8 tensor (`fp8_params`: the gathered weights).
FP8_PARAM_BYTES = 1.0

# Bytes per block parameter of the fp8 weight copies Transformer Engine caches in fp8 training: the
# fp8 weight (1) and its transpose (1), which the forward and the input-gradient GEMMs read.
FP8_WEIGHT_BYTES = 2.0


@lru_cache(maxsize=65536)
def in_flight(schedule: str, stage: int, num_stages: int, m: int, interleave: int = 1) -> float:
    """Return the most micro-batches' worth of a stage's activations held at once under the schedule
    (with interleave v, chunk-activations / v: each chunk holds 1/v of the stage's layers)."""
    if interleave > 1:
        return peak_chunks_in_flight(schedule, stage, num_stages, m, interleave) / interleave
    return m if schedule == "gpipe" else min(m, num_stages - stage)


# ------------------------------------------------------------------------------------------------
# Stage evaluation: times and memory for one stage given its shape, layer count and position
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageCost:
    """Predicted figures of one stage (seconds, bytes per device); fits is False when over memory.
    forward_s / backward_s are per micro-batch over all the stage's chunks (embedding / head in)."""

    forward_s: float
    backward_s: float
    allreduce_s: float
    optimizer_s: float
    memory_bytes: float
    recompute: str
    fits: bool


def stage_memory(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
                 m: int, recompute: Any, interleave: int = 1) -> float:
    """Return the peak bytes per device of a stage: weights, gradients and optimizer states of its
    parameters (split by tp), the last stage's logits, and the activations of its in-flight
    micro-batches under recomputation mode `recompute` (full: each block's input, plus one block's
    activations while it is recomputed); the sum of `memory_parts`."""
    return sum(memory_parts(cm, shape, n_layers, b, index, num_stages, m, recompute, interleave).values())


MEMORY_PARTS = ("weights", "gradients", "optimizer states", "FSDP working set", "logits", "activations",
                "recompute buffer")


def memory_parts(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
                 m: int, recompute: Any, interleave: int = 1) -> dict[str, float]:
    """Return a stage's peak bytes per device by part (`MEMORY_PARTS`; their sum is `stage_memory`):
    its parameters' (after tp) weights, gradients and optimizer states (`CostModel.param_parts`), the
    weights with their fp8 copies in fp8 training less the 16-bit ones `fp8_params` drops, FSDP's
    unsharded blocks, the last stage's logits, the activations of its in-flight micro-batches under
    `recompute`, and under full recomputation one block's activations while it re-runs."""
    mode = recompute_mode(recompute)
    first, last = index == 0, index == num_stages - 1
    params = cm.stage_params(n_layers, first, last, num_stages) / shape.tp
    weights, grads, states = (params * x for x in cm.param_parts(shape.dp))
    parts = {"weights": weights + cm.fp8_weight_bytes(n_layers, shape.tp) - cm.fp8_params_saved_bytes(shape, n_layers),
             "gradients": grads, "optimizer states": states,
             "FSDP working set": cm.fsdp_working_bytes(shape.tp),
             "logits": cm.logits_bytes(shape.tp, b) if last else 0.0,
             "activations": (in_flight(cm.p.schedule, index, num_stages, m, interleave)
                             * cm.stage_activation_bytes(shape.tp, b, recompute, n_layers)),
             "recompute buffer": cm.activation_bytes(shape.tp, b, "none") if mode == "full" else 0.0}
    return parts


def recompute_block_s(cm: CostModel, shape: StageShape, b: int, recompute: Any, n_layers: int) -> float:
    """Return the seconds recomputation `recompute` adds to the backward of one block of a stage of
    `n_layers` blocks, averaged over its blocks (under "full:K": K blocks' full recomputation over
    n_layers); the search's walk and `stage_cost` both read it, so they agree to the last bit."""
    mode = recompute_mode(recompute)
    per = cm.recompute_s(shape.device_type, shape.tp, b, mode)
    k = recomputed_blocks(recompute, n_layers)
    if mode != "full" or k == n_layers or n_layers == 0:
        return per
    return k * per / n_layers


def auto_recompute(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
                   m: int, interleave: int = 1) -> tuple[str, float]:
    """Return (recompute label, bytes per device) of the fastest recomputation that fits a stage of
    `n_layers` blocks: none; else the cheaper of selective (if it fits) and full recomputation of the
    fewest blocks that fit ("full:K", K a multiple of `interleave`, or "full" when that is every block);
    when nothing fits, "full" and its bytes."""
    cap = cm.dev(shape.device_type).memory_bytes * cm.p.memory_fraction
    none = stage_memory(cm, shape, n_layers, b, index, num_stages, m, "none", interleave)
    if none <= cap:
        return "none", none
    full = stage_memory(cm, shape, n_layers, b, index, num_stages, m, "full", interleave)
    options: list[tuple[float, str, float]] = []
    sel = stage_memory(cm, shape, n_layers, b, index, num_stages, m, "selective", interleave)
    if sel <= cap:
        options.append((recompute_block_s(cm, shape, b, "selective", n_layers), "selective", sel))
    if full <= cap:
        # the bytes each block recomputed instead of kept saves: (none - full + the one block's buffer) / n
        saving = (none - full + cm.activation_bytes(shape.tp, b, "none")) / n_layers
        k = n_layers if saving <= 0 else max(1, math.ceil((none + cm.activation_bytes(shape.tp, b, "none") - cap)
                                                           / saving))
        k = min(n_layers, -(-k // interleave) * interleave) - interleave
        mem, label = math.inf, "full"
        while mem > cap and k < n_layers:  # one more chunk's worth of blocks while the rounding falls short
            k = min(n_layers, k + interleave)
            label = "full" if k >= n_layers else f"full:{k}"
            mem = stage_memory(cm, shape, n_layers, b, index, num_stages, m, label, interleave)
        options.append((recompute_block_s(cm, shape, b, label, n_layers), label, mem))
    if not options:
        return "full", full
    _, label, mem = min(options, key=lambda o: o[0])
    return label, mem


def stage_cost(cm: CostModel, shape: StageShape, n_layers: int, b: int, index: int, num_stages: int,
               m: int, recompute: str | None = None, interleave: int = 1, tied_s: float = 0.0) -> StageCost:
    """Return the cost of a stage. `recompute` fixes the mode ("full:K" too); None takes the problem's,
    and "auto" the fastest that fits (`auto_recompute`: none, else the cheaper of selective and full
    recomputation of the fewest blocks that fit). `tied_s` (the tied-embedding
    gradient all-reduce) is added to the first and last stages' all-reduce."""
    p = cm.p
    first, last = index == 0, index == num_stages - 1
    f1, g1 = cm.stage_layer(shape, b)
    ef, eg = cm.stage_extras(shape, b, first, last)
    cap = cm.dev(shape.device_type).memory_bytes * p.memory_fraction
    want = recompute or p.recompute
    if want == "auto":
        mode, mem = auto_recompute(cm, shape, n_layers, b, index, num_stages, m, interleave)
    else:
        mode = recompute_label(want)
        mem = stage_memory(cm, shape, n_layers, b, index, num_stages, m, mode, interleave)
    of, ob = stage_call_s(p.layer_costs, shape.device_type)  # the pipeline runtime, once per call
    fwd = n_layers * f1 + ef + of
    bwd = n_layers * (g1 + recompute_block_s(cm, shape, b, mode, n_layers)) + eg + ob
    # the gradient all-reduce, or with overlap_dp_allreduce what outlasts the stage's last backward
    # (one chunk's: bwd / interleave)
    grad = cm.dp_exposed_s(shape, n_layers, first, last, num_stages, bwd / interleave)
    ar = grad + (tied_s if first or last else 0.0)
    opt = cm.optimizer_step_s(shape, n_layers, first, last, num_stages)
    return StageCost(fwd, bwd, ar, opt, mem, mode, mem <= cap)


def p2p_s(cm: CostModel, a: StageShape, b: StageShape, micro_batch: int) -> float:
    """Return seconds to send one micro-batch's activations from stage shape a to b.

    Each replica of `a` sends its share; the slowest link between the two stages' nodes is used.
    """
    link = min((cm.link(x, y) for x in a.nodes for y in b.nodes), key=lambda l: l.bandwidth_GBps)
    return link.transfer_s(cm.boundary_bytes(micro_batch) / a.tp)


def exchanges_s(cm: CostModel, shapes: list[StageShape], b: list[int], p2p: list[float]) -> list[float]:
    """Return the seconds of each blocking pipeline exchange between virtual stages k and k + 1
    (k = chunk * S + stage): the send `p2p[k]` plus, without sequence parallelism, the all-gather
    across TP that rebuilds the tensor from its scatter/gather chunks (Megatron-LM's
    p2p_communication._communicate gathers them after the receive; with sequence parallelism each
    TP rank sends its own sequence slice and nothing is gathered); the slower side's all-gather."""
    S = len(shapes)
    if cm.p.sequence_parallel:
        return list(p2p)
    return [p + max(cm.tp_collective_s(sh.device_type, sh.tp, "all_gather", cm.boundary_bytes(b[k % S]))
                    for sh in (shapes[k % S], shapes[(k + 1) % S])) for k, p in enumerate(p2p)]


# ------------------------------------------------------------------------------------------------
# Evaluating a whole plan
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evaluation:
    """A plan's predicted figures: iteration time (s), per-stage costs, per-virtual-stage sends; `why`
    when infeasible."""

    iteration_time_s: float
    stages: list[StageCost]
    p2p: list[float]
    why: str = ""
    interleave: int = 1


def chunk_lists(cm: CostModel, shapes: list[StageShape], layers: list[int], costs: list[StageCost],
                b: list[int], interleave: int) -> tuple[list[float], list[float]]:
    """Return per-virtual-stage (forward_s, backward_s) lists (k = chunk * S + stage): each chunk
    holds 1/v of its stage's blocks; the embedding sits on the first chunk, the head on the last."""
    S, v = len(shapes), interleave
    if v == 1:
        return [c.forward_s for c in costs], [c.backward_s for c in costs]
    fwd, bwd = [0.0] * (S * v), [0.0] * (S * v)
    for s, (sh, c) in enumerate(zip(shapes, costs)):
        ef, eg = cm.stage_extras(sh, b[s], s == 0, s == S - 1)  # embedding or head (S > 1), FSDP's exposed
        of, ob = stage_call_s(cm.p.layer_costs, sh.device_type)  # every chunk is a call of its own
        for ch in range(v):
            fwd[ch * S + s] = (c.forward_s - ef - of) / v + of
            bwd[ch * S + s] = (c.backward_s - eg - ob) / v + ob
        k = 0 if s == 0 else S * v - 1 if s == S - 1 else -1
        if k >= 0:
            fwd[k] += ef
            bwd[k] += eg
    return fwd, bwd


def evaluate(cm: CostModel, shapes: list[StageShape], layers: list[int], m: int, fast: bool = True,
             recompute: list[str] | None = None, interleave: int = 1,
             record: list[tuple[int, str, int, float, float]] | None = None, check_memory: bool = True) -> Evaluation:
    """Return the predicted figures of stages `shapes` holding `layers[s]` blocks, `m` micro-batches.

    `recompute[s]` fixes stage s's recomputation mode (default: the problem's setting); `interleave`
    v > 1 runs Megatron's interleaved 1F1B with v chunks per stage. The iteration time is inf (with
    `why`) when a stage does not fit in memory (unless `check_memory` is False) or the batch does not
    split evenly. `fast=False` computes the longest path on the networkx DAG; `record` as in
    `iteration_time_fast`.
    """
    S, G, v = len(shapes), cm.p.global_batch, interleave
    if v > 1 and (S < 2 or m % S or any(n % v for n in layers)):
        return Evaluation(math.inf, [], [], f"interleave {v} needs at least 2 stages, micro-batches ({m}) a "
                                            f"multiple of the stages ({S}) and stage layer counts {layers} "
                                            f"divisible by {v}")
    costs: list[StageCost] = []
    tied = cm.tied_s(shapes)
    for s, (sh, n) in enumerate(zip(shapes, layers)):
        if G % (m * sh.dp):
            return Evaluation(math.inf, [], [], f"stage {s}: global batch {G} is not divisible by "
                                                 f"{m} micro-batches x dp {sh.dp}")
        c = stage_cost(cm, sh, n, G // (m * sh.dp), s, S, m, recompute[s] if recompute else None, v, tied)
        if not c.fits and check_memory:
            cap = cm.dev(sh.device_type).memory_bytes * cm.p.memory_fraction
            parts = memory_parts(cm, sh, n, G // (m * sh.dp), s, S, m, c.recompute, v)
            where = ", ".join(f"{k} {x / 2**30:.2f}" for k, x in parts.items() if x > 0)
            return Evaluation(math.inf, [], [], f"stage {s} ({sh.device_type}, {n} layers, tp {sh.tp}, recompute "
                                                 f"{c.recompute}): needs {c.memory_bytes / 2**30:.2f} GiB per "
                                                 f"device ({where}), has {cap / 2**30:.2f} GiB")
        costs.append(c)
    b = [G // (m * sh.dp) for sh in shapes]
    p2p = [p2p_s(cm, shapes[k % S], shapes[(k + 1) % S], b[k % S]) for k in range(S * v - 1)]
    fwd, bwd = chunk_lists(cm, shapes, layers, costs, b, v)
    sends = p2p
    if cm.p.blocking_p2p:  # the exchange holds the sending op's device; the DAG's sends become 0
        fwd, bwd, sends = blocking_exchanges(fwd, bwd, exchanges_s(cm, shapes, b, p2p))
    tail = [c.allreduce_s + c.optimizer_s for c in costs]
    if fast:
        t = iteration_time_fast(fwd, bwd, sends, tail, m, cm.p.schedule, record, v)
    else:
        t = dag_longest_path_s(build_dag(fwd, bwd, sends, tail, m, cm.p.schedule, v))
    return Evaluation(t, costs, p2p, interleave=v)


def shapes_of(plan: PoseidonPlan) -> list[StageShape]:
    """Return the StageShapes of a plan's stages."""
    return [StageShape(s.device_type, s.tp, s.dp, tuple(s.gpu_ids), tuple(s.nodes)) for s in plan.stages]


def predicted_metrics(problem: PoseidonProblem, ev: Evaluation, m: int, shapes: list[StageShape]) -> dict[str, float]:
    """Return the plan's predicted metrics: iteration_time_s, throughput_samples_per_s, tokens_per_s,
    bubble_fraction, devices_used, model_tflops_per_gpu (model FLOPs, no recomputation, per device per
    second, /1e12) and mfu (that over the mean dense peak of the devices used)."""
    t = ev.iteration_time_s
    busy = max(m * (c.forward_s + c.backward_s) for c in ev.stages)
    flops = model_flops_per_sample(problem.model, problem.seq_len) * problem.global_batch
    devices = sum(len(sh.gpu_ids) for sh in shapes)
    peak = sum(problem.cluster.type_of(sh.device_type).peak(problem.dtype) * len(sh.gpu_ids) for sh in shapes) / devices
    tflops = flops / t / devices / 1e12
    return {"iteration_time_s": t, "throughput_samples_per_s": problem.global_batch / t,
            "tokens_per_s": problem.global_batch * problem.seq_len / t, "bubble_fraction": 1.0 - busy / t,
            "devices_used": float(devices), "model_tflops_per_gpu": tflops, "mfu": tflops / peak}


def make_plan(problem: PoseidonProblem, shapes: list[StageShape], layers: list[int], m: int,
              ev: Evaluation | None = None, recompute: list[str] | None = None, interleave: int = 1,
              **fields: Any) -> PoseidonPlan:
    """Return a PoseidonPlan with every predicted figure filled from the DAG model (`recompute` and
    `interleave` as in `evaluate`)."""
    ev = ev or evaluate(CostModel(problem), shapes, layers, m, recompute=recompute, interleave=interleave)
    if not ev.stages:
        raise ValueError(f"the plan cannot run: {ev.why}")
    S = len(shapes)
    stages, start = [], 0
    for s, (sh, n) in enumerate(zip(shapes, layers)):
        c = ev.stages[s]
        stages.append(StagePlan(index=s, device_type=sh.device_type, nodes=list(sh.nodes), gpu_ids=list(sh.gpu_ids),
                                tp=sh.tp, dp=sh.dp, first_layer=start, last_layer=start + n,
                                micro_batch_size=problem.global_batch // (m * sh.dp), recompute=c.recompute,
                                forward_s=c.forward_s, backward_s=c.backward_s,
                                p2p_s=ev.p2p[s] if s < S - 1 else 0.0, allreduce_s=c.allreduce_s,
                                optimizer_s=c.optimizer_s, memory_bytes=c.memory_bytes))
        start += n
    t = ev.iteration_time_s
    predicted = predicted_metrics(problem, ev, m, shapes)
    fields.setdefault("status", Status.FEASIBLE)
    return PoseidonPlan(stages=stages, num_microbatches=m, schedule=problem.schedule, interleave=ev.interleave,
                        iteration_time_s=t, objective=t, objective_name="iteration_time_s", predicted=predicted,
                        **fields)


# ------------------------------------------------------------------------------------------------
# check: written from the constraints, recomputing everything from the problem
# ------------------------------------------------------------------------------------------------

def tp_fits(problem: PoseidonProblem, tp: int, node_counts: list[int]) -> str:
    """Return why tensor-parallel degree `tp` cannot split the model or the nodes ("" when it can):
    Megatron splits attention heads and key/value heads evenly across the TP ranks, and TP groups tile
    each node's devices of the stage's type (`node_counts`: how many each node used holds)."""
    cfg = problem.model
    if cfg.heads % tp or cfg.kv % tp:
        return (f"tp {tp} does not divide the model's {cfg.heads} attention heads"
                + (f" and {cfg.kv} key/value heads" if cfg.kv != cfg.heads else ""))
    bad = sorted({c for c in node_counts if c % tp})
    if bad:
        return f"tp {tp} does not divide the node's GPU count ({', '.join(map(str, bad))} of the type per node)"
    return ""


def _tp_violations(problem: PoseidonProblem, s: StagePlan, devices: dict[int, Any]) -> list[Violation]:
    nodes = {devices[g].node for g in s.gpu_ids if g in devices}
    counts = [sum(1 for d in devices.values() if d.node == n and d.type == s.device_type) for n in sorted(nodes)]
    why = tp_fits(problem, s.tp, counts) if s.tp > 1 else ""
    return [Violation("tp_divides", f"stage {s.index}: {why}", {"stage": s.index, "tp": s.tp})] if why else []


def check(problem: PoseidonProblem, plan: PoseidonPlan) -> list[Violation]:
    """Return the broken constraints of `plan`: devices used once, of the stated type and on the stated
    nodes (the sends and all-reduces are costed over them), at least one micro-batch, layers
    covered once in order, degrees that divide, batch that splits, interleave that fits, memory within
    capacity under each stage's stated recomputation mode, and every stated figure (per-stage
    forward/backward/p2p/all-reduce/optimizer/memory, the iteration time on the networkx DAG, the
    objective and the predicted metrics) recomputed from the problem."""
    out: list[Violation] = []
    cl = problem.cluster
    devices = {d.id: d for d in cl.devices}
    seen: dict[int, int] = {}
    if not plan.stages:
        return [Violation("no_stages", "the plan has no stages")]
    m, G = plan.num_microbatches, problem.global_batch
    if m < 1:
        return [Violation("batch", f"{m} micro-batches; expected at least 1", {"field": "num_microbatches"})]
    expect = 0
    for pos, s in enumerate(plan.stages):
        if s.index != pos:
            out.append(Violation("stage_index", f"stage at position {pos} says index {s.index}",
                                 {"stage": pos, "index": s.index}))
        for g in s.gpu_ids:
            if g not in devices:
                out.append(Violation("unknown_device", f"stage {s.index}: device {g} is not in the cluster "
                                     f"(0..{len(devices) - 1})", {"stage": s.index, "device": g}))
                continue
            if g in seen:
                out.append(Violation("device_reused", f"device {g} is used by stages {seen[g]} and {s.index}",
                                     {"device": g, "stages": [seen[g], s.index]}))
            seen[g] = s.index
            if devices[g].type != s.device_type:
                out.append(Violation("device_type", f"stage {s.index}: device {g} is a {devices[g].type}, "
                                     f"not {s.device_type}", {"stage": s.index, "device": g}))
        # the sends and all-reduces are costed over the stage's nodes: they must be its devices' nodes
        nodes = list(dict.fromkeys(devices[g].node for g in s.gpu_ids if g in devices))
        if list(s.nodes) != nodes:
            out.append(Violation("stage_nodes", f"stage {s.index}: nodes {list(s.nodes)}; its devices sit on "
                                 f"{nodes}", {"stage": s.index}))
        if s.tp * s.dp != len(s.gpu_ids):
            out.append(Violation("degrees", f"stage {s.index}: tp {s.tp} x dp {s.dp} != {len(s.gpu_ids)} devices",
                                 {"stage": s.index}))
        if s.tp > problem.max_tp:
            out.append(Violation("degrees", f"stage {s.index}: tp {s.tp} above max_tp {problem.max_tp}"))
        out += _tp_violations(problem, s, devices)
        for r in range(s.dp):
            group = {devices[g].node for g in s.gpu_ids[r * s.tp:(r + 1) * s.tp] if g in devices}
            if len(group) > 1:
                out.append(Violation("tp_across_nodes", f"stage {s.index}: tensor-parallel group {r} spans "
                                     f"nodes {sorted(group)}", {"stage": s.index}))
        if s.first_layer != expect or s.last_layer <= s.first_layer:
            out.append(Violation("layers", f"stage {s.index}: layers [{s.first_layer}, {s.last_layer}) do not "
                                 f"continue from layer {expect} with at least one layer", {"stage": s.index}))
        expect = max(expect, s.last_layer)
        if G % (m * s.dp) or s.micro_batch_size != G // (m * s.dp):
            out.append(Violation("batch", f"stage {s.index}: global batch {G} != {m} micro-batches x dp {s.dp} "
                                 f"x micro-batch {s.micro_batch_size}", {"stage": s.index}))
    if expect != problem.model.num_layers:
        out.append(Violation("layers", f"the stages cover layers up to {expect}, the model has "
                             f"{problem.model.num_layers}"))
    if out:
        return out
    if problem.schedule != plan.schedule:
        out.append(Violation("schedule", f"the plan says schedule {plan.schedule}, the problem {problem.schedule}"))
    v, S = plan.interleave, len(plan.stages)
    if v > 1 and (S < 2 or m % S or any(s.num_layers % v for s in plan.stages)):
        out.append(Violation("interleave", f"interleave {v} needs at least 2 stages, micro-batches ({m}) a multiple "
                             f"of the stages ({S}) and every stage's layer count divisible by {v}",
                             {"interleave": v}))
    if out:
        return out
    cm = CostModel(problem)
    shapes = shapes_of(plan)
    modes = [s.recompute for s in plan.stages]
    for s, shape in zip(plan.stages, shapes):
        cap = cl.type_of(s.device_type).memory_bytes * problem.memory_fraction
        need = stage_memory(cm, shape, s.num_layers, s.micro_batch_size, s.index, S, m, s.recompute, v)
        if need > cap:
            out.append(Violation("memory", f"stage {s.index} ({s.device_type}, recompute {s.recompute}): needs "
                                 f"{need / 2**30:.2f} GiB per device, capacity {cap / 2**30:.2f} GiB",
                                 {"stage": s.index, "need_bytes": need, "capacity_bytes": cap}))
        k = partial_blocks(s.recompute)
        if k > s.num_layers or k % v:
            out.append(Violation("recompute", f"stage {s.index}: recompute {s.recompute}: K must be at most the "
                                 f"stage's {s.num_layers} blocks and a multiple of the interleave {v}",
                                 {"stage": s.index}))
        if problem.recompute != "auto" and s.recompute != problem.recompute:
            out.append(Violation("recompute", f"stage {s.index}: recompute {s.recompute}, the problem fixes "
                                 f"{problem.recompute}", {"stage": s.index}))
    if out:
        return out
    ev = evaluate(cm, shapes, [s.num_layers for s in plan.stages], m, fast=False, recompute=modes, interleave=v)
    if not ev.stages:
        return [Violation("evaluate", ev.why)]
    for s, c in zip(plan.stages, ev.stages):
        stated = {"forward_s": s.forward_s, "backward_s": s.backward_s, "allreduce_s": s.allreduce_s,
                  "optimizer_s": s.optimizer_s, "memory_bytes": s.memory_bytes,
                  "p2p_s": s.p2p_s}
        model = {"forward_s": c.forward_s, "backward_s": c.backward_s, "allreduce_s": c.allreduce_s,
                 "optimizer_s": c.optimizer_s, "memory_bytes": c.memory_bytes,
                 "p2p_s": ev.p2p[s.index] if s.index < S - 1 else 0.0}
        for key, value in model.items():
            out += figure_violations(f"stages[{s.index}].{key}", stated[key], value)
    if not math.isclose(ev.iteration_time_s, plan.iteration_time_s, rel_tol=1e-6):
        out.append(Violation("predicted_time", f"the plan says {plan.iteration_time_s:.6g} s per iteration; the DAG "
                             f"model gives {ev.iteration_time_s:.6g} s",
                             {"plan_s": plan.iteration_time_s, "dag_s": ev.iteration_time_s}))
    out += stated_figures_violations(plan, ev.iteration_time_s, predicted_metrics(problem, ev, m, shapes))
    return out


# ------------------------------------------------------------------------------------------------
# Presentation, profiles
# ------------------------------------------------------------------------------------------------

def summarize(problem: PoseidonProblem, plan: PoseidonPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare poseidon` prints for one plan."""
    stats = plan.solver.stats if plan.solver else {}
    return {"iteration_time_s": plan.iteration_time_s,
            "samples_per_s": plan.predicted.get("throughput_samples_per_s"),
            "stages": len(plan.stages), "microbatches": plan.num_microbatches,
            "shape": " | ".join(f"{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L" for s in plan.stages),
            "evaluated": stats.get("evaluated"), "pruned": stats.get("pruned")}


def describe(problem: PoseidonProblem, plan: PoseidonPlan) -> list[Table]:
    """Return the stage table of a plan (one row per stage, times in ms, memory in GiB)."""
    rows = []
    for s in plan.stages:
        cap = problem.cluster.type_of(s.device_type).memory_bytes
        rows.append([s.index, s.device_type, len(s.gpu_ids), s.tp, s.dp, layer_range(s.first_layer, s.last_layer),
                     s.micro_batch_size, s.recompute, s.forward_s * 1e3, s.backward_s * 1e3, s.p2p_s * 1e3,
                     s.allreduce_s * 1e3, s.memory_bytes / 2**30, cap / 2**30, ",".join(s.nodes)])
    chunks = f", interleave {plan.interleave}" if plan.interleave > 1 else ""
    return [Table(f"stages ({plan.schedule}{chunks}, {plan.num_microbatches} micro-batches)",
                  ["stage", "type", "gpus", "tp", "dp", "layers", "mb", "recompute", "fwd_ms", "bwd_ms",
                   "p2p_ms", "allreduce_ms", "mem_GiB", "cap_GiB", "nodes"], rows),
            memory_table(problem, plan)]


def memory_table(problem: PoseidonProblem, plan: PoseidonPlan) -> Table:
    """Return the table of each stage's memory per device by part (`memory_parts`, GiB) as the model
    recomputes it from the plan's stages, with the device's capacity and the problem's usable share."""
    cm, shapes, S = CostModel(problem), shapes_of(plan), len(plan.stages)
    rows = []
    for k, (s, sh) in enumerate(zip(plan.stages, shapes)):
        parts = memory_parts(cm, sh, s.num_layers, s.micro_batch_size, k, S, plan.num_microbatches, s.recompute,
                             plan.interleave)
        cap = problem.cluster.type_of(s.device_type).memory_bytes
        rows.append([k, *(parts[p] / 2**30 for p in MEMORY_PARTS), sum(parts.values()) / 2**30,
                     cap * problem.memory_fraction / 2**30])
    return Table(f"memory per device by part, GiB (gradients in {grad_dtype(problem)}; "
                 f"usable: {problem.memory_fraction:g} of the device)",
                 ["stage", *MEMORY_PARTS, "total", "usable"], rows)


def timeline(problem: PoseidonProblem, plan: PoseidonPlan) -> list[tuple[int, str, int, float, float]]:
    """Return (stage, "F"|"B"|"AR", micro-batch, start_s, end_s) of every op of the plan's DAG."""
    out: list[tuple[int, str, int, float, float]] = []
    evaluate(CostModel(problem), shapes_of(plan), [s.num_layers for s in plan.stages], plan.num_microbatches,
             recompute=[s.recompute for s in plan.stages], interleave=plan.interleave, record=out)
    return out


def draw(problem: PoseidonProblem, plan: PoseidonPlan, path: Path) -> None:
    """Write the pipeline timeline (one row per stage, forward / backward / all-reduce) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure

    from gpuplan.viz import PALETTE

    colors = {"F": PALETTE["forward"], "B": PALETTE["backward"], "AR": PALETTE["comm"]}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.5 * len(plan.stages)))
    for s, kind, j, a, b in timeline(problem, plan):
        ax.barh(s, (b - a) * 1e3, left=a * 1e3, color=colors[kind], edgecolor="white", linewidth=0.3)
        if kind != "AR" and len(plan.stages) * plan.num_microbatches <= 64:
            ax.text((a + b) / 2 * 1e3, s, str(j), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(plan.stages)), [f"{s.index}: {s.device_type} {s.tp}x{s.dp}" for s in plan.stages])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{plan.schedule}, {plan.num_microbatches} micro-batches, iteration {plan.iteration_time_s * 1e3:.1f} ms"
                 " (blue forward, orange backward, pink all-reduce + optimizer)")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=120)


def with_profile(problem: PoseidonProblem, profile: Profile) -> PoseidonProblem:
    """Return the problem with its declared devices and model on the profile's measured figures.

    The problem's nodes and device types stay; each type's figures come from the profile, which
    must measure or emulate it (gpuplan.models.profile_map.declared_cluster). The layer table
    must be the solved model's; each declared type gets its rows times its emulated slowdown
    (declared_layer_table). Raises InputError otherwise, with the command that profiles it.
    """
    from gpuplan.models.profile_map import declared_cluster, declared_layer_table, matching_layer_table

    table = matching_layer_table(profile, problem.model, seq_len=problem.seq_len, global_batch=problem.global_batch)
    cluster, backing = declared_cluster(problem.cluster, profile)
    doc = problem.model_dump()
    doc["cluster"] = cluster
    if table is not None:
        bases = {base for base, _ in backing.values()}
        threads = next((d.threads for d in profile.device_types if d.name in bases and d.threads), None)
        doc["layer_costs"] = declared_layer_table(table, backing, threads).model_dump()
    sweep = {}
    for d in profile.device_types:
        peak = d.matmul_tflops.get(problem.dtype) or max(d.matmul_tflops.values(), default=0.0)
        pts = [(p.n, p.tflops / peak) for p in d.matmul if p.dtype == problem.dtype and peak > 0]
        if pts:
            sweep[d.name] = pts
    for declared, (base, slow) in backing.items():
        if base in sweep:
            doc.setdefault("matmul_sweep", {})[declared] = sweep[base]
    return PoseidonProblem.model_validate(doc)


register_model(ModelSpec(
    kind="poseidon", problem_type=PoseidonProblem, plan_type=PoseidonPlan, check=check,
    summarize=summarize, describe=describe, draw=draw, runner="gpuplan.runtime.poseidon:run_plan",
    with_profile=with_profile,
    title="Poseidon: DAG-guided parallelism search for LLM training on heterogeneous clusters"))
