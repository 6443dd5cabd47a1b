"""Export a training bundle to torchtitan (tested against the torchtitan 0.3.0 release on PyPI).

torchtitan 0.3.0 reads its job from `--module M --config C` (a config_registry function, which fixes the
model's shape) plus command-line overrides parsed by tyro. The export picks the config function whose
model has the plan's shape (CONFIGS: torchtitan 0.3.0's dense decoder configs, copied here so the export
needs no torchtitan; a test checks them against torchtitan's own registry) or refuses, naming the
nearest ones; `config="MODULE:FUNCTION"` names a config the user provides (its shape is not checked).
It writes into a directory:

- `torchtitan.args`: `--module M --config C` and one override per line: parallel degrees (pipeline,
  tensor, data-parallel replicate; or data-parallel shard, FSDP, when the plan's problem has `fsdp`), the per-stage module lists (`--parallelism.module_fqns_per_model_part`,
  one comma-separated list per stage: `tok_embeddings` and `layers.i` on the first, `norm`, `lm_head` on
  the last: torchtitan 0.3.0's Decoder attribute names, so uneven layer splits run as planned), the
  micro-batch size, the local batch and sequence length, `--compile.enable` unless the plan assumed
  PyTorch's eager kernels (`eager_kernels`: its times assume fused element-wise kernels, which
  torch.compile gives torchtitan), and activation checkpointing as its subcommand
  (`activation-checkpoint:full`; the plan's selective recomputation as `none`: `titan_checkpointing`),
- `pp_schedule.csv`: Tessel's schedule as torch.distributed.pipelining's compute-only CSV (one row
  per pipeline rank; F, I, W or B actions), named by `--parallelism.pipeline_parallel_schedule_csv`
  relative to the export directory (torchtitan opens it from its working directory; run.sh passes
  "$HERE/pp_schedule.csv", HERE being run.sh's own directory, so the directory can be moved or copied),
- Lagom's NCCL environment: `nccl.env` when every stage has the same one (run.sh exports it), else
  `nccl-stage{k}.env` per stage and `nccl_env.sh`, the per-rank wrapper run.sh starts every rank through
  (torchrun --no-python): it sources the env file of the rank's stage (RANK / (tp dp)) and execs the trainer,
- `run.sh`: the torchrun command line: single-node, or `--nnodes N --node-rank "$NODE_RANK"` with a
  static rendezvous at "$MASTER_ADDR:$MASTER_PORT" when the plan's stages span N nodes; each node's
  ranks pinned to the plan's GPUs of it (CUDA_VISIBLE_DEVICES in local-rank order, CUDA_DEVICE_ORDER=PCI_BUS_ID).

torchtitan places ranks by its mesh order (ParallelDims: pp, dp_replicate, dp_shard, cp, tp; tp
innermost), torchrun gives node r the global ranks after those of nodes 0..r-1 and torchtitan gives
LOCAL_RANK i the i-th visible GPU: the export numbers the nodes so that stage k's ranks land on the nodes
the plan put it on (notes where it cannot) and lists each node's GPUs in the order its ranks use them.
A sequence longer than the model's max_seq_len or the config's RoPE length is refused (torchtitan 0.3.0's
Decoder.Config.update_from_config raises ValueError at start).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.export import launcher
from gpuplan.export.common import (ExportRefused, Launch, TrainingJob, check_seq_len, model_max_seq_len, node_launch,
                                   training_job)
from gpuplan.export.launcher import RUN_SCRIPT, train_tail
from gpuplan.io import atomic_write_text, make_output_dir
from gpuplan.models.poseidon import partial_blocks

SCHEDULE_CSV = "pp_schedule.csv"
ARGS_FILE = "torchtitan.args"
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
    max_seq_len: int  # the RoPE cache length of the flavor: torchtitan refuses a longer training.seq_len
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
    # (llama3_configs: _debugmodel, _8b, _70b, _405b; ffn_hidden from compute_ffn_hidden_dim; RoPE max_seq_len 131072)
    TitanConfig("llama3", "llama3_debugmodel", "debugmodel", 6, 256, 16, 16, 16, 768, 2048, False, 131072),
    TitanConfig("llama3", "llama3_8b", "8B", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    TitanConfig("llama3", "llama3_70b", "70B", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072),
    TitanConfig("llama3", "llama3_405b", "405B", 126, 16384, 128, 8, 128, 53248, 128256, False, 131072),
    # torchtitan/models/qwen3/config_registry.py (functions) and torchtitan/models/qwen3/__init__.py
    # (qwen3_configs: _debugmodel, _0_6b, _1_7b, _14b, _32b; RoPE max_seq_len 4096 for the debug model, else
    # 40960). Flavors 4B and 8B have no pretraining
    # config function in 0.3.0 (8B only as qwen3_8b_first_85_pct_layers_nvfp4 and sft_qwen3_8b_math).
    TitanConfig("qwen3", "qwen3_debugmodel", "debugmodel", 8, 256, 16, 8, 128, 3072, 2048, True, 4096),
    TitanConfig("qwen3", "qwen3_0_6b", "0.6B", 28, 1024, 16, 8, 128, 3072, 151936, True, 40960),
    TitanConfig("qwen3", "qwen3_1_7b", "1.7B", 28, 2048, 16, 8, 128, 6144, 151936, True, 40960),
    TitanConfig("qwen3", "qwen3_14b", "14B", 40, 5120, 40, 8, 128, 17408, 151936, False, 40960),
    TitanConfig("qwen3", "qwen3_32b", "32B", 64, 5120, 64, 8, 128, 25600, 151936, False, 40960),
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


def schedule_csv(job: TrainingJob) -> str:
    """Return the schedule as torch's compute-only CSV text (row r: rank r's actions in order)."""
    return "".join(",".join(job.actions[r]) + "\n" for r in sorted(job.actions))


def job_args(job: TrainingJob, schedule_path: str = SCHEDULE_CSV, module: str = "llama3") -> list[str]:
    """Return torchtitan's command-line overrides for the job (without --module / --config); the schedule
    CSV is named `schedule_path` (torchtitan opens it relative to its working directory)."""
    args = ["--parallelism.pipeline_parallel_degree", str(job.num_stages),
            "--parallelism.tensor_parallel_degree", str(job.tp),
            "--parallelism.data_parallel_replicate_degree", "1" if job.fsdp else str(job.dp),
            "--parallelism.data_parallel_shard_degree", str(job.dp) if job.fsdp else "1",
            "--parallelism.pipeline_parallel_schedule", "1F1B" if job.interleave == 1 else "Interleaved1F1B",
            "--parallelism.pipeline_parallel_schedule_csv", schedule_path,
            "--parallelism.pipeline_parallel_microbatch_size", str(job.micro_batch_size),
            "--parallelism.module_fqns_per_model_part", *[",".join(m) for m in module_fqns(job, module)],
            # without a pipeline torchtitan runs its local batch at once and accumulates global / (local x dp)
            # steps: the plan's micro-batch; with one, the local batch is split into pipeline micro-batches
            "--training.local_batch_size", str(job.micro_batch_size if job.num_stages == 1 else job.global_batch // job.dp),
            "--training.global_batch_size", str(job.global_batch),
            "--training.seq_len", str(job.seq_len)]
    if job.tp > 1:
        args.append("--parallelism.enable-sequence-parallel")
    if not job.eager_kernels:  # the plan's times assume fused element-wise kernels: torch.compile fuses them
        args.append("--compile.enable")
    args.append(f"activation-checkpoint:{titan_checkpointing(job.recompute)}")  # a tyro subcommand: last
    return args


def titan_checkpointing(recompute: str) -> str:
    """Return torchtitan's activation-checkpoint subcommand for the plan's recomputation mode: "full" and
    "none" as they are; the plan's "selective" (Megatron's: the attention core recomputed) as "none",
    since torchtitan's attention is SDPA's fused kernel, which keeps no scores and recomputes them in
    its backward anyway. torchtitan's own "selective" recomputes every other matmul and the element-wise
    ops of each block: slower than the plan predicts (`SELECTIVE_NOTE`). The plan's "full:K" (K of a
    stage's blocks) as "full": torchtitan's config has no count of blocks (`PARTIAL_NOTE`)."""
    if partial_blocks(recompute):
        return "full"
    return "none" if recompute == "selective" else recompute


SELECTIVE_NOTE = ("the plan's selective recomputation (Megatron's: the attention core) is exported as "
                  "activation-checkpoint:none: torchtitan's fused SDPA attention already keeps no scores and "
                  "recomputes them in its backward, while torchtitan's 'selective' would recompute every other "
                  "matmul of each block, slower than the plan")


PARTIAL_NOTE = ("the plan recomputes {k} blocks of a stage (the others keep their activations); torchtitan's "
                "activation checkpointing has no count of blocks, so activation-checkpoint:full is exported: it "
                "recomputes every block, using less memory and running slower than the plan predicts")


def launch(job: TrainingJob) -> Launch:
    """Return torchrun's launch of the job from the plan's placement (gpuplan.export.common.node_launch:
    node ranks in the order the plan's ranks reach the nodes, each node's GPUs, notes)."""
    return node_launch(job, "torchtitan")


def _train_command(args: list[str], per_stage_env: bool) -> str:
    """Return torchrun's arguments after its own options: the trainer and its (shell-quoted) overrides, the
    schedule CSV named beside the script ("$HERE/pp_schedule.csv"), through nccl_env.sh when `per_stage_env`."""
    quoted = [shlex.quote(a) for a in args]
    if SCHEDULE_CSV in args:
        quoted[args.index(SCHEDULE_CSV)] = f'"$HERE/{SCHEDULE_CSV}"'
    return train_tail("-m torchtitan.train " + " ".join(quoted), per_stage_env)


def run_script(job: TrainingJob, args: list[str], lay: Launch, env: dict[str, str] | None,
               per_stage_env: bool = False) -> str:
    """Return run.sh's text (`gpuplan.export.launcher.run_script`) running torchtitan with `args`: each
    node's ranks pinned to the plan's GPUs, exporting `env` (nccl.env) first when given, each rank's
    stage settings through nccl_env.sh when `per_stage_env`."""
    header = [f"# gpuplan export torchtitan: predicted iteration {job.predicted_iteration_s:.6g} s",
              "# Run it from the directory torchtitan is to work in (its asset and output paths are relative to",
              "# it); this script finds its own files beside itself, wherever the export directory was moved."]
    return launcher.run_script(header, _train_command(args, per_stage_env), lay, env, per_stage_env)


def _check_config(job: TrainingJob, module: str, function: str, notes: list[str]) -> None:
    """Raise ExportRefused for what torchtitan 0.3.0's Decoder.Config.update_from_config refuses at start
    under config `module:function`: a training.seq_len longer than the plan's model max_seq_len or the
    config's RoPE length, weight tying with pipeline_parallel_degree > 1; and fp8 training or the
    distributed optimizer (ZeRO-1), which the export has no setting for. A config outside CONFIGS is not
    checked against torchtitan's limits (noted); return None."""
    if job.dtype == "fp8":
        raise ExportRefused("torchtitan", [
            f"fp8 training: torchtitan {TORCHTITAN_VERSION} switches float8 linears on in its Python config "
            "functions (a torchao converter), which this export does not write"])
    if job.distributed_optimizer and not job.fsdp and job.dp > 1:
        raise ExportRefused("torchtitan", [
            f"the plan shards only the optimizer states over its {job.dp} data-parallel replicas (distributed "
            f"optimizer, ZeRO stage 1); torchtitan {TORCHTITAN_VERSION} replicates them "
            "(data_parallel_replicate_degree) or shards weights and gradients too (FSDP, "
            "data_parallel_shard_degree): plan with fsdp (--fsdp) to export FSDP"])
    if job.fsdp and not job.grad_reduce_in_fp32:
        notes.append(f"the plan reduces its gradients in 16 bits; torchtitan {TORCHTITAN_VERSION}'s FSDP reduces them in "
                     "fp32 only (training.mixed_precision_reduce), twice the bytes the plan's reduce-scatters move")
    if job.fused_cross_entropy:
        notes.append(f"the plan's times and memory assume a fused cross-entropy on 16-bit logits; torchtitan "
                     f"{TORCHTITAN_VERSION} computes its loss on fp32 logits (slower, and 4x the logits' memory)")
    limits = [("the plan's model max_seq_len", model_max_seq_len(job))]
    known = next((c for c in CONFIGS if c.name == f"{module}:{function}"), None)
    if known is None:
        notes.append(f"gpuplan did not check the plan's seq_len {job.seq_len} against {module}:{function}'s RoPE "
                     "max_seq_len: torchtitan refuses at start a training.seq_len longer than it")
    else:
        limits.append((f"{known.name}'s RoPE max_seq_len in torchtitan {TORCHTITAN_VERSION}, which refuses at start "
                       "a longer training.seq_len", known.max_seq_len))
        if known.tied_embeddings and job.num_stages > 1:
            raise ExportRefused("torchtitan", [
                f"pipeline parallelism of a model with tied embeddings: {known.name} ties tok_embeddings and "
                f"lm_head, and torchtitan {TORCHTITAN_VERSION} raises NotImplementedError at start for a "
                f"pipeline_parallel_degree above 1 (the plan has {job.num_stages} stages)"])
    check_seq_len(job, "torchtitan", limits)


def export(bundle: str | Path, out: str | Path, *, config: str | None = None) -> dict[str, Any]:
    """Write the torchtitan job of a bundle into directory `out`; return {"files": [...], "args": [...],
    "notes": [...], "config": "module:function"}. `config` ("MODULE:FUNCTION") names torchtitan's config
    function; without it, the one of CONFIGS with the plan's model shape. The files name each other
    relative to `out`, so the directory can be moved. Raises ExportRefused when torchtitan cannot express
    the plan (no config of its shape, a sequence longer than the model's, tied embeddings across pipeline
    stages), InputError for a bad `config`."""
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
    _check_config(job, module, function, notes)
    if job.recompute == "selective":
        notes.append(SELECTIVE_NOTE)
    if partial_blocks(job.recompute):
        notes.append(PARTIAL_NOTE.format(k=partial_blocks(job.recompute)))
    if job.device_arch == "hopper":
        te = job.attention_library == "te"
        notes.append("the plan's attention times are " + ("Transformer Engine's kernel's (cuDNN's on Hopper, about "
                     "1.7x FlashAttention-2's rate)" if te else "FlashAttention-2's (PyTorch SDPA's kernel)")
                     + f"; torchtitan {TORCHTITAN_VERSION}'s model configs run FlexAttention (attn_backend 'flex', "
                     "Triton kernels), whose rate the model does not have"
                     + (": expect attention slower than predicted, or plan with --attention-library sdpa for "
                        "FlashAttention-2's rates, the nearest measured kernel" if te else ""))
    if job.tp_comm_overlap and job.tp > 1:
        notes.append("the plan's times hide the TP collectives beside their GEMMs (Transformer Engine's userbuffers, "
                     "the problem's tp_comm_overlap); torchtitan runs them exposed unless its async tensor "
                     "parallelism (with torch.compile) is switched on, so expect the TP stages slower than predicted")
    lay = launch(job)
    notes += lay.notes
    root = make_output_dir(out, "torchtitan export directory")
    csv_path = root / SCHEDULE_CSV
    atomic_write_text(csv_path, schedule_csv(job))
    # relative: torchtitan.args names the CSV as torchtitan opens it from the export directory; run.sh
    # passes it as "$HERE/pp_schedule.csv"
    args = ["--module", module, "--config", function] + job_args(job, SCHEDULE_CSV, module)
    atomic_write_text(root / ARGS_FILE, "\n".join(args) + "\n")
    files = [str(csv_path), str(root / ARGS_FILE)]
    env, per_stage = launcher.write_nccl_env(job, root, "torchtitan", files, notes)
    atomic_write_text(root / RUN_SCRIPT, run_script(job, args, lay, env, per_stage))
    files.append(str(root / RUN_SCRIPT))
    return {"files": files, "args": args, "notes": notes, "config": f"{module}:{function}"}
