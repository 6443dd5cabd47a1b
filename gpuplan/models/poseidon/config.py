"""A fixed Megatron-style parallel configuration (tp, pp, dp, micro-batch, recomputation, interleave)
evaluated by Poseidon's DAG model, the way `gpuplan evaluate poseidon ... --config` and
`gpuplan.evaluate_config` read it.

Devices are taken in cluster order, Megatron's rank order: tensor-parallel ranks fastest, then
data-parallel replicas, then pipeline stages; stage s holds devices [s tp dp, (s+1) tp dp) and an
equal share of the layers (or `layers`, one count per stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, Field, ValidationError

from gpuplan.errors import InfeasibleError, InputError
from gpuplan.io import digest, read_document
from gpuplan.models.base import Schema, input_error_from
from gpuplan.models.poseidon import (CostModel, PoseidonPlan, PoseidonProblem, StageShape, evaluate, make_plan,
                                     recompute_label)
from gpuplan.models.plan import SolverInfo, Status

_ALIASES = {"mb": "micro_batch", "mbs": "micro_batch", "micro_batch_size": "micro_batch", "vp": "interleave",
            "virtual_pipeline": "interleave", "sp": "sequence_parallel", "flash": "flash_attention",
            "t": "tp", "p": "pp", "d": "dp", "ddp_overlap": "overlap_dp_allreduce",
            "overlap_grad_reduce": "overlap_dp_allreduce", "distopt": "distributed_optimizer",
            "use_distributed_optimizer": "distributed_optimizer", "zero1": "distributed_optimizer",
            "zero3": "fsdp", "fully_shard": "fsdp", "data_parallel_shard": "fsdp", "eager": "eager_kernels"}


# "none", "selective", "full" or "full:K" (K of the stage's blocks fully recomputed), normalised
RecomputeLabel = Annotated[str, AfterValidator(recompute_label)]


class ParallelConfig(Schema):
    """tp x pp x dp devices of `device_type` (default: the cluster's first type), `micro_batch`
    sequences per micro-batch, recomputation mode (one for every stage, or one per stage; "full:K":
    K of the stage's blocks fully recomputed, Megatron's --recompute-method block),
    `interleave` chunks per stage; `layers` per stage (default equal); `sequence_parallel` /
    `flash_attention` / `overlap_dp_allreduce` (the DDP in use overlaps the gradient all-reduce with
    the backward: PyTorch DDP, Megatron's --overlap-grad-reduce) / `distributed_optimizer`
    (Megatron's --use-distributed-optimizer: optimizer states sharded over dp, ZeRO stage 1) / `fsdp`
    (FSDP2's fully_shard: weights, gradients and states sharded over dp, ZeRO stage 3; torchtitan's
    data_parallel_shard_degree) / `eager_kernels` (PyTorch eager element-wise kernels, as torchtitan without
    compile) / `composite_norm` (RMSNorm as separate eager kernels) override the problem's assumptions."""

    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1)
    micro_batch: int = Field(default=1, ge=1)
    recompute: RecomputeLabel | list[RecomputeLabel] = "none"
    interleave: int = Field(default=1, ge=1)
    layers: list[int] | None = None
    sequence_parallel: bool | None = None
    flash_attention: bool | None = None
    overlap_dp_allreduce: bool | None = None
    distributed_optimizer: bool | None = None
    fsdp: bool | None = None
    eager_kernels: bool | None = None
    composite_norm: bool | None = None
    device_type: str | None = None


def parse_config(source: str | Path | dict[str, Any] | ParallelConfig) -> ParallelConfig:
    """Return the ParallelConfig of `source`: a config, a mapping, a YAML/JSON file, or the text
    "tp=8,pp=8,dp=12,mb=1,recompute=selective,interleave=2". Raises InputError naming the key,
    value and what was expected."""
    if isinstance(source, ParallelConfig):
        return source
    where: str | None = None
    if isinstance(source, dict):
        data = dict(source)
    elif Path(str(source)).is_file():
        where = str(source)
        data = read_document(source)
        data = data.get("config", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise InputError.at(where, "config", data, "a mapping of tp, pp, dp, mb, recompute, interleave")
    else:
        data = {}
        for item in str(source).split(","):
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            if not eq:
                raise InputError.at(None, "--config", item, "KEY=VALUE items separated by commas, e.g. "
                                    "tp=8,pp=8,dp=12,mb=1,recompute=selective,interleave=2")
            if key.strip() in data:
                raise InputError.at(None, "--config", item, f"each key once; {key.strip()!r} is given twice")
            data[key.strip()] = yaml.safe_load(value.strip())
    named: dict[str, Any] = {}
    for k, v in data.items():  # aliases and case: tp, TP and tensor name one field
        field = _ALIASES.get(str(k).lower(), str(k).lower())
        if field in named:
            raise InputError.at(where, "config" if where else "--config", k,
                                f"each field once; {k!r} names {field!r}, which is already given")
        named[field] = v
    data = named
    rc = data.get("recompute")
    if isinstance(rc, bool):
        data["recompute"] = "full" if rc else "none"
    elif isinstance(rc, list):
        data["recompute"] = [("full" if x else "none") if isinstance(x, bool) else x for x in rc]
    try:
        return ParallelConfig.model_validate(data)
    except ValidationError as exc:
        raise input_error_from(exc, where) from None


def config_problem(problem: PoseidonProblem, config: ParallelConfig) -> PoseidonProblem:
    """Return `problem` with the config's execution assumptions (sequence parallelism, flash
    attention, data-parallel all-reduce overlap, distributed optimizer, FSDP, eager kernels, composite norm)
    and its recomputation mode fixed for every stage."""
    one = isinstance(config.recompute, str) and ":" not in config.recompute  # "full:K" is a stage's, not a problem's
    update: dict[str, Any] = {"recompute": config.recompute if one else "auto"}
    for field in ("sequence_parallel", "flash_attention", "overlap_dp_allreduce", "distributed_optimizer", "fsdp",
                  "eager_kernels", "composite_norm"):
        if getattr(config, field) is not None:
            update[field] = getattr(config, field)
    return PoseidonProblem.model_validate({**problem.model_dump(), **update})


def config_stages(problem: PoseidonProblem, config: ParallelConfig) -> tuple[list[StageShape], list[int], int]:
    """Return (stage shapes, layers per stage, micro-batches) of the config on the problem's cluster.

    Raises InputError when the degrees do not match the devices, a TP group would span nodes, the
    batch does not split or the layers do not divide.
    """
    cl = problem.cluster
    types = list(cl.capacity())
    dtype = cl.type_key(config.device_type) if config.device_type else types[0]
    devs = [d for d in cl.devices if d.type == dtype]
    if not devs:
        raise InputError.at(None, "config.device_type", config.device_type, f"one of {types}")
    tp, pp = config.tp, config.pp
    dp = config.dp or len(devs) // (tp * pp)
    if dp < 1 or tp * pp * dp > len(devs):
        raise InputError.at(None, "config", f"tp={tp} pp={pp} dp={dp}",
                            f"at most {len(devs)} {dtype} devices in all (tp x pp x dp)")
    G, mb = problem.global_batch, config.micro_batch
    if G % (mb * dp):
        raise InputError.at(None, "config.micro_batch", mb, f"a micro-batch with micro-batch x dp ({mb} x {dp}) "
                            f"dividing the global batch {G}")
    m = G // (mb * dp)
    L = problem.model.num_layers
    layers = config.layers or ([L // pp] * pp if L % pp == 0 else [])
    if len(layers) != pp or sum(layers) != L or min(layers) < 1:
        raise InputError.at(None, "config.layers", config.layers or f"{L} / {pp}",
                            f"{pp} positive layer counts summing to the model's {L} layers")
    n = tp * dp
    shapes = []
    for s in range(pp):
        group = devs[s * n:(s + 1) * n]
        for r in range(dp):
            nodes = {d.node for d in group[r * tp:(r + 1) * tp]}
            if len(nodes) > 1:
                raise InputError.at(None, "config.tp", tp, f"tensor-parallel groups inside one node (stage {s} "
                                    f"replica {r} spans {sorted(nodes)})")
        shapes.append(StageShape(dtype, tp, dp, tuple(d.id for d in group),
                                 tuple(dict.fromkeys(d.node for d in group))))
    return shapes, layers, m


def evaluate_config(problem: PoseidonProblem, config: ParallelConfig | dict[str, Any] | str,
                    check_memory: bool = True) -> PoseidonPlan:
    """Return the PoseidonPlan of a fixed configuration, every figure from the DAG model (seconds,
    bytes; predicted model TFLOP/s per GPU and MFU). The plan's problem is `config_problem`'s.

    Raises InfeasibleError when a stage does not fit in memory (unless `check_memory` is False: the
    plan then states the memory it would need) or interleaving does not apply.
    """
    cfg = parse_config(config)
    prob = config_problem(problem, cfg)
    shapes, layers, m = config_stages(prob, cfg)
    cm = CostModel(prob)
    modes = [cfg.recompute] * len(shapes) if isinstance(cfg.recompute, str) else list(cfg.recompute)
    if len(modes) != len(shapes):
        raise InputError.at(None, "config.recompute", cfg.recompute, f"one mode, or one per stage ({len(shapes)})")
    ev = evaluate(cm, shapes, layers, m, recompute=modes, interleave=cfg.interleave, check_memory=check_memory)
    if not ev.stages:
        raise InfeasibleError(f"configuration {config_text(cfg.model_copy(update={'dp': shapes[0].dp}), m)}: "
                              f"{ev.why}")
    plan = make_plan(prob, shapes, layers, m, ev, status=Status.FEASIBLE)
    plan.solver = SolverInfo(name="config", options=cfg.model_dump(exclude_none=True))
    plan.problem = prob.document()
    plan.input_digest = digest(plan.problem)
    return plan


def config_text(cfg: ParallelConfig, m: int | None = None) -> str:
    """Return the config as tp=..,pp=..,dp=..,mb=..,recompute=..,interleave=.. (plus m when given)."""
    text = (f"tp={cfg.tp},pp={cfg.pp},dp={cfg.dp},mb={cfg.micro_batch},recompute={cfg.recompute},"
            f"interleave={cfg.interleave}")
    return text + (f" ({m} micro-batches)" if m is not None else "")
