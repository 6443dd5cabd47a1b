"""Export a training bundle to torchtitan (tested against the torchtitan 0.3.0 release on PyPI).

torchtitan 0.3.0 reads its job from `--module M --config C` (a config_registry function, which fixes the
model's shape) plus command-line overrides parsed by tyro. The export picks the config function whose
model has the plan's shape (CONFIGS: torchtitan 0.3.0's dense decoder configs, copied here so the export
needs no torchtitan; a test checks them against torchtitan's own registry) or refuses, naming the
nearest ones; `config="MODULE:FUNCTION"` names a config the user provides (its shape is not checked).
It writes into a directory:

- `torchtitan.args`: `--module M --config C` and one override per line: parallel degrees (pipeline,
  tensor, data-parallel replicate), the per-stage module lists (`--parallelism.module_fqns_per_model_part`,
  one comma-separated list per stage: `tok_embeddings` and `layers.i` on the first, `norm`, `lm_head` on
  the last: torchtitan 0.3.0's Decoder attribute names, so uneven layer splits run as planned), the
  micro-batch size, the local batch and sequence length, and activation checkpointing as its subcommand
  (`activation-checkpoint:full`),
- `pp_schedule.csv`: Tessel's schedule as torch.distributed.pipelining's compute-only CSV (one row
  per pipeline rank; F, I, W or B actions), named by `--parallelism.pipeline_parallel_schedule_csv`,
- Lagom's NCCL environment: `nccl.env` when every stage has the same one (run.sh exports it), else
  `nccl-stage{k}.env` per stage (set it on stage k's ranks; a note says so),
- `run.sh`: the torchrun command line: single-node, or `--nnodes N --node-rank "$NODE_RANK"` with a
  static rendezvous at "$MASTER_ADDR:$MASTER_PORT" when the plan's stages span N nodes.

torchtitan places ranks by its mesh order (ParallelDims: pp, dp_replicate, dp_shard, cp, tp; tp
innermost), torchrun gives node r the global ranks after those of nodes 0..r-1: the export numbers the
nodes so that stage k's ranks land on the nodes the plan put it on, and notes where it cannot.
"""

from __future__ import annotations

import shlex
from collections import Counter
from itertools import accumulate, groupby
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.export.common import ExportRefused, TrainingJob, training_job
from gpuplan.io import atomic_write_text

SCHEDULE_CSV = "pp_schedule.csv"
ARGS_FILE = "torchtitan.args"
NCCL_ENV = "nccl.env"
TORCHTITAN_VERSION = "0.3.0"

# The fields of a model's shape the export compares (gpuplan's names; see gpuplan.models.workload).
SHAPE_FIELDS = ("num_layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "tied_embeddings",
                "gated_mlp")


@dataclass(frozen=True)
class TitanConfig:
    """One torchtitan config_registry function: its module, its model_registry flavor and the model's shape."""

    module: str
    function: str
    flavor: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool = True  # torchtitan's decoders all use SwiGLU feed-forwards

    @property
    def name(self) -> str:
        """Return 'module:function'."""
        return f"{self.module}:{self.function}"

    def shape(self) -> dict[str, Any]:
        """Return the shape as {field: value} for SHAPE_FIELDS."""
        return {f: getattr(self, f) for f in SHAPE_FIELDS}


# torchtitan 0.3.0's dense pretraining config functions (variants that only add quantization, another
# attention backend or SFT data are left out; MoE configs too: gpuplan's models are dense). Shapes from
# the flavors the functions pass to model_registry; tests/test_export_torchtitan.py checks this table against
# torchtitan's own registry.
CONFIGS: tuple[TitanConfig, ...] = (
    # torchtitan/models/llama3/config_registry.py (functions) and torchtitan/models/llama3/__init__.py
    # (llama3_configs: _debugmodel, _8b, _70b, _405b; ffn_hidden from compute_ffn_hidden_dim)
    TitanConfig("llama3", "llama3_debugmodel", "debugmodel", 6, 256, 16, 16, 16, 768, 2048, False),
    TitanConfig("llama3", "llama3_8b", "8B", 32, 4096, 32, 8, 128, 14336, 128256, False),
    TitanConfig("llama3", "llama3_70b", "70B", 80, 8192, 64, 8, 128, 28672, 128256, False),
    TitanConfig("llama3", "llama3_405b", "405B", 126, 16384, 128, 8, 128, 53248, 128256, False),
    # torchtitan/models/qwen3/config_registry.py (functions) and torchtitan/models/qwen3/__init__.py
    # (qwen3_configs: _debugmodel, _0_6b, _1_7b, _14b, _32b). Flavors 4B and 8B have no pretraining
    # config function in 0.3.0 (8B only as qwen3_8b_first_85_pct_layers_nvfp4 and sft_qwen3_8b_math).
    TitanConfig("qwen3", "qwen3_debugmodel", "debugmodel", 8, 256, 16, 8, 128, 3072, 2048, True),
    TitanConfig("qwen3", "qwen3_0_6b", "0.6B", 28, 1024, 16, 8, 128, 3072, 151936, True),
    TitanConfig("qwen3", "qwen3_1_7b", "1.7B", 28, 2048, 16, 8, 128, 6144, 151936, True),
    TitanConfig("qwen3", "qwen3_14b", "14B", 40, 5120, 40, 8, 128, 17408, 151936, False),
    TitanConfig("qwen3", "qwen3_32b", "32B", 64, 5120, 64, 8, 128, 25600, 151936, False),
)

# The top-level module names of each module's model, in pipeline order (embedding, layer container,
# final norm, output head): torchtitan/models/common/decoder.py's Decoder.__init__ (Llama3Model and
# Qwen3Model are Decoders), the names torchtitan/distributed/pipeline_parallel.py's split keeps.
DECODER_NAMES = ("tok_embeddings", "layers", "norm", "lm_head")
MODULE_NAMES: dict[str, tuple[str, str, str, str]] = {"llama3": DECODER_NAMES, "qwen3": DECODER_NAMES}


def model_shape(model: dict[str, Any]) -> dict[str, Any]:
    """Return a plan's model (its problem's `model`) as {field: value} for SHAPE_FIELDS, with the
    defaults gpuplan's own model gives (kv heads = heads, head dim = hidden / heads)."""
    from gpuplan.models.workload import TransformerConfig

    m = TransformerConfig.model_validate(model)
    return {"num_layers": m.num_layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv, "head_dim": m.dhead,
            "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "tied_embeddings": m.tied_embeddings,
            "gated_mlp": m.gated_mlp}


def _describe(shape: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items())


def matching_config(model: dict[str, Any]) -> TitanConfig:
    """Return torchtitan's config function whose model has the plan's shape; raise ExportRefused naming the
    shape, the nearest configs (fewest differing fields) and `--config MODULE:FUNCTION` when none has."""
    shape = model_shape(model)
    for c in CONFIGS:
        if c.shape() == shape:
            return c

    def diff(c: TitanConfig) -> list[str]:
        return [f"{f} {c.shape()[f]}" for f in SHAPE_FIELDS if c.shape()[f] != shape[f]]

    near = sorted(CONFIGS, key=lambda c: (len(diff(c)), abs(c.num_layers - shape["num_layers"])))[:3]
    name = f"{model['name']} " if model.get("name") else ""
    raise ExportRefused("torchtitan", [
        f"a config function with the plan's model {name}({_describe(shape)}): torchtitan {TORCHTITAN_VERSION} has "
        "none; nearest: " + "; ".join(f"{c.name} ({', '.join(diff(c))})" for c in near)
        + ". Pass --config MODULE:FUNCTION (config=... in the API) to name a config function you provide "
        "with this shape"])


def _parse_config(config: str) -> tuple[str, str]:
    from gpuplan.errors import InputError

    module, sep, function = config.partition(":")
    if not sep or not module or not function or ":" in function:
        raise InputError(f"--config {config!r}: expected MODULE:FUNCTION (e.g. llama3:llama3_8b), torchtitan's "
                         "--module and --config", field="config", value=config, expected="MODULE:FUNCTION")
    return module, function


def module_fqns(job: TrainingJob, module: str = "llama3") -> list[list[str]]:
    """Return the module names of each (virtual) stage in pipeline order (the module's top-level names)."""
    emb, layers, norm, head = MODULE_NAMES.get(module, DECODER_NAMES)
    out = []
    for k, (a, b) in enumerate(job.layers):
        names = ([emb] if k == 0 else []) + [f"{layers}.{i}" for i in range(a, b)]
        if k == len(job.layers) - 1:
            names += [norm, head]
        out.append(names)
    return out


def env_file_text(env: dict[str, str]) -> str:
    """Return an environment as lines `KEY='value'` a POSIX shell can source: each value quoted, since
    Lagom joins per-collective settings with ';' (`NCCL_ALGO=allreduce:ring;allgather:tree`)."""
    return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))


def schedule_csv(job: TrainingJob) -> str:
    """Return the schedule as torch's compute-only CSV text (row r: rank r's actions in order)."""
    return "".join(",".join(job.actions[r]) + "\n" for r in sorted(job.actions))


def job_args(job: TrainingJob, schedule_path: str, module: str = "llama3") -> list[str]:
    """Return torchtitan's command-line overrides for the job (without --module / --config)."""
    args = ["--parallelism.pipeline_parallel_degree", str(job.num_stages),
            "--parallelism.tensor_parallel_degree", str(job.tp),
            "--parallelism.data_parallel_replicate_degree", str(job.dp),
            "--parallelism.data_parallel_shard_degree", "1",
            "--parallelism.pipeline_parallel_schedule", "1F1B" if job.interleave == 1 else "Interleaved1F1B",
            "--parallelism.pipeline_parallel_schedule_csv", schedule_path,
            "--parallelism.pipeline_parallel_microbatch_size", str(job.micro_batch_size),
            "--parallelism.module_fqns_per_model_part", *[",".join(m) for m in module_fqns(job, module)],
            "--training.local_batch_size", str(job.global_batch // job.dp),
            "--training.global_batch_size", str(job.global_batch),
            "--training.seq_len", str(job.seq_len)]
    if job.tp > 1:
        args.append("--parallelism.enable-sequence-parallel")
    args.append(f"activation-checkpoint:{job.recompute}")  # a tyro subcommand: last
    return args


@dataclass
class Launch:
    """How torchrun starts the job: the nodes in node-rank order, each node's rank count, and notes."""

    nodes: list[str]
    nproc: list[int]
    notes: list[str]

    @property
    def world(self) -> int:
        """Return the number of ranks."""
        return sum(self.nproc)


def launch(job: TrainingJob) -> Launch:
    """Return the torchrun launch of the job from the plan's placement: nodes numbered in the order the
    plan's ranks (stage by stage, torchtitan's mesh order) reach them, so torchrun's rank blocks per node
    put each stage on the plan's nodes; notes for uneven nodes, TP groups across nodes and placements
    torchtitan's rank order cannot follow."""
    world = job.num_stages * job.tp * job.dp
    if not job.stage_gpus or not job.cluster or sum(map(len, job.stage_gpus)) != world:
        return Launch(["localhost"], [world], [])
    from gpuplan.models.cluster import Cluster

    node_of = {d.id: d.node for d in Cluster.model_validate(job.cluster).devices}
    order = [node_of[g] for gpus in job.stage_gpus for g in sorted(gpus)]
    runs = [[n, len(list(g))] for n, g in groupby(order)]  # [node, count] in rank order
    notes = []
    if len(runs) != len({n for n, _ in runs}):
        counts = Counter(order)
        nodes = list(dict.fromkeys(order))
        runs = [[n, counts[n]] for n in nodes]
        notes.append("torchtitan gives each node a block of consecutive ranks (mesh order pp, dp, tp); the plan's "
                     "stages share nodes in another order, so some stages run on other nodes than planned "
                     "(same device type; their links may differ from the plan's)")
    nodes, nproc = [str(n) for n, _ in runs], [int(c) for _, c in runs]
    if len(set(nproc)) > 1:
        notes.append("the plan's ranks do not fill its nodes evenly (" + ", ".join(
            f"{n}: {c}" for n, c in zip(nodes, nproc)) + "): run.sh starts that many on each NODE_RANK; "
            "torchrun numbers ranks node after node")
    starts = list(accumulate(nproc[:-1]))  # the first global rank of each node after node 0
    if job.tp > 1 and any(b % job.tp for b in starts):
        notes.append(f"torchtitan's tensor-parallel groups ({job.tp} consecutive ranks) cross a node boundary "
                     f"(nodes hold {nproc} ranks): those groups run over the inter-node network")
    return Launch(nodes, nproc, notes)


def run_script(job: TrainingJob, args: list[str], lay: Launch, env: dict[str, str] | None) -> str:
    """Return run.sh's text: the (multi-node) torchrun line, exporting `env` (nccl.env) first when given."""
    lines = ["#!/bin/sh", f"# gpuplan export torchtitan: predicted iteration {job.predicted_iteration_s:.6g} s"]
    if env:
        lines += ['set -a  # export the NCCL settings of nccl.env to every rank',
                  f'. "$(dirname "$0")/{NCCL_ENV}"', "set +a"]
    tail = "-m torchtitan.train " + " ".join(shlex.quote(a) for a in args)
    if len(lay.nodes) == 1:
        lines.append(f"torchrun --nproc-per-node {lay.world} {tail}")
        return "\n".join(lines) + "\n"
    lines += [f"# {len(lay.nodes)} nodes: run this on each with NODE_RANK set, MASTER_ADDR and MASTER_PORT those of node 0",
              *[f"#   NODE_RANK={r}: {n} ({c} ranks)" for r, (n, c) in enumerate(zip(lay.nodes, lay.nproc))],
              ': "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}" "${MASTER_PORT:=29500}"']
    if len(set(lay.nproc)) == 1:
        nproc = str(lay.nproc[0])
    else:
        lines.append('case "$NODE_RANK" in')
        lines += [f"  {r}) NPROC={c} ;;" for r, c in enumerate(lay.nproc)]
        lines += ['  *) echo "NODE_RANK must be 0..' + str(len(lay.nodes) - 1) + '" >&2; exit 2 ;;', "esac"]
        nproc = '"$NPROC"'
    # static rendezvous: torchrun honours --node-rank only with it (c10d orders nodes by host name), and the
    # node rank is what puts each stage on the plan's nodes
    lines.append(f'torchrun --nnodes {len(lay.nodes)} --nproc-per-node {nproc} --node-rank "$NODE_RANK" '
                 f'--rdzv-backend static --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" {tail}')
    return "\n".join(lines) + "\n"


def export(bundle: str | Path, out: str | Path, *, config: str | None = None) -> dict[str, Any]:
    """Write the torchtitan job of a bundle into directory `out`; return {"files": [...], "args": [...],
    "notes": [...], "config": "module:function"}. `config` ("MODULE:FUNCTION") names torchtitan's config
    function; without it, the one of CONFIGS with the plan's model shape. Raises ExportRefused when
    torchtitan cannot express the plan (or has no config of its shape), InputError for a bad `config`."""
    job = training_job(bundle, "torchtitan")
    notes = list(job.notes)
    if config is None:
        module, function = matching_config(job.model).name.split(":")
    else:
        module, function = _parse_config(config)
        notes.append(f"--config {module}:{function} was given: gpuplan did not verify that its model has the plan's "
                     f"shape ({_describe(model_shape(job.model))})")
        if module not in MODULE_NAMES:
            notes.append(f"module {module!r} is not one gpuplan knows: the stage module lists use torchtitan's "
                         f"Decoder names ({', '.join(DECODER_NAMES)})")
    lay = launch(job)
    notes += lay.notes
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    csv_path = root / SCHEDULE_CSV
    atomic_write_text(csv_path, schedule_csv(job))
    args = ["--module", module, "--config", function] + job_args(job, str(csv_path), module)
    atomic_write_text(root / ARGS_FILE, "\n".join(args) + "\n")
    files = [str(csv_path), str(root / ARGS_FILE)]
    envs = [job.nccl_env[s] for s in sorted(job.nccl_env)]
    same = bool(envs) and len(envs) == job.num_stages and all(e == envs[0] for e in envs)
    if same:
        path = root / NCCL_ENV
        atomic_write_text(path, env_file_text(envs[0]))
        files.append(str(path))
    else:
        for s, env in sorted(job.nccl_env.items()):
            path = root / f"nccl-stage{s}.env"
            atomic_write_text(path, env_file_text(env))
            files.append(str(path))
        if job.nccl_env:
            ranks = job.tp * job.dp
            notes.append("Lagom's NCCL settings differ per stage: source nccl-stage{k}.env on stage k's ranks "
                         f"(global ranks {ranks}k .. {ranks}k+{ranks - 1}: torchtitan's mesh order); run.sh "
                         "does not, torchrun gives one environment to all ranks of a node")
    atomic_write_text(root / "run.sh", run_script(job, args, lay, envs[0] if same else None))
    files.append(str(root / "run.sh"))
    return {"files": files, "args": args, "notes": notes, "config": f"{module}:{function}"}
