"""Export a training bundle to Megatron-LM's command-line arguments (pretrain_gpt.py).

Degrees (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`; data parallelism is the
world size over their product), the model's shape, micro and global batch, sequence length, the
uneven layer split as `--pipeline-model-parallel-layout` (E the embedding, t a transformer layer, L
the loss/head, | between stages, virtual stages in pipeline order with interleaving), recomputation, sequence parallelism and flash attention.

`--max-position-embeddings` is the model's own position length (its max_seq_len); a plan whose sequence
is longer is refused (Megatron-LM asserts max_position_embeddings >= seq_length). The result's `nodes`
give each node's rank count and the plan's GPUs of it (CUDA_VISIBLE_DEVICES), in the node order that puts
each stage on its planned node (Megatron ranks tp innermost, pp outermost).

With an output directory the export also writes the launch (`gpuplan.export.launcher`, as torchtitan's):
`megatron.args` (the plan's arguments, then a short benchmark run's: `BENCHMARK_ARGS`), Lagom's NCCL env
files (per stage through nccl_env.sh when they differ) and run.sh, which runs
"$MEGATRON_LM/pretrain_gpt.py" under torchrun with the plan's node ranks and GPUs. Without arguments it
trains on Megatron's mock data (`--mock-data`, the NullTokenizer with the plan's vocabulary), which is
what a comparison of predicted and measured iteration time needs; arguments given to run.sh come last,
so they add the data of a real run (`--data-path ... --tokenizer-type ...`) or override the benchmark's
(`--train-iters 1000`: Megatron-LM's argparse keeps the last value).

Megatron-LM runs its own 1F1B schedule: it has no way to load an arbitrary per-rank action list, so
Tessel's schedule is not exported (the notes say so, and the export reports the 1F1B prediction).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gpuplan.export import launcher
from gpuplan.export.common import (ExportRefused, Launch, TrainingJob, check_seq_len, model_max_seq_len, node_launch,
                                   training_job)
from gpuplan.io import atomic_write_text, make_output_dir
from gpuplan.models.poseidon import partial_blocks

ARGS_FILE = "megatron.args"
# A short run to time the plan: 20 iterations, each logged (Megatron-LM prints "elapsed time per
# iteration (ms)"), no evaluation; the learning rate only has to be set.
BENCHMARK_ARGS = ["--train-iters", "20", "--lr", "1.0e-4", "--log-interval", "1", "--eval-iters", "0"]


def layout(job: TrainingJob) -> str:
    """Return the pipeline layout string of the job's stages (e.g. 'Et*7|t*8|t*9L')."""
    parts = []
    for k, (a, b) in enumerate(job.layers):
        n = b - a
        body = f"t*{n}" if n > 1 else ("t" if n == 1 else "")
        parts.append(("E" if k == 0 else "") + body + ("L" if k == len(job.layers) - 1 else ""))
    return "|".join(parts)


def job_args(job: TrainingJob) -> list[str]:
    """Return Megatron-LM's arguments for the job; raise ExportRefused when its sequence is longer than the
    model's positions (`--max-position-embeddings`) or the plan uses FSDP (ZeRO-3) over dp > 1."""
    m = job.model
    if job.fsdp and job.dp > 1:
        raise ExportRefused("Megatron-LM", [
            f"the plan shards weights, gradients and optimizer states over its {job.dp} data-parallel replicas "
            "(FSDP, ZeRO-3); this export writes Megatron-LM's DDP and distributed-optimizer (ZeRO-1) settings "
            "only, whose memory and communication differ from the plan's"])
    positions = model_max_seq_len(job)
    check_seq_len(job, "Megatron-LM", [("the plan's model max_seq_len, Megatron-LM's --max-position-embeddings",
                                        positions)])
    args = ["--tensor-model-parallel-size", str(job.tp), "--pipeline-model-parallel-size", str(job.num_stages),
            "--num-layers", str(m["num_layers"]), "--hidden-size", str(m["hidden"]),
            "--num-attention-heads", str(m["heads"]), "--ffn-hidden-size", str(m["ffn_hidden"]),
            "--seq-length", str(job.seq_len), "--max-position-embeddings", str(positions),
            "--micro-batch-size", str(job.micro_batch_size), "--global-batch-size", str(job.global_batch)]
    if m.get("kv_heads") and m["kv_heads"] != m["heads"]:
        args += ["--group-query-attention", "--num-query-groups", str(m["kv_heads"])]
    if m.get("head_dim") and m["head_dim"] * m["heads"] != m["hidden"]:  # Megatron's default: hidden / heads
        args += ["--kv-channels", str(m["head_dim"])]
    if not m.get("tied_embeddings", True):  # Megatron ties the embedding and output weights by default
        args.append("--untie-embeddings-and-output-weights")
    if m.get("gated_mlp", True):
        args.append("--swiglu")
    if job.num_stages > 1:
        args += ["--pipeline-model-parallel-layout", layout(job)]
    if job.interleave > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(job.interleave)]
    if job.tp > 1:
        args.append("--sequence-parallel")
        if job.tp_comm_overlap:  # the plan's times hide the TP collectives beside their GEMMs (userbuffers)
            args.append("--tp-comm-overlap")
    if job.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif partial_blocks(job.recompute):  # K of each stage's blocks: Megatron counts them per model chunk
        per_chunk = max(1, partial_blocks(job.recompute) // job.interleave)
        args += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                 str(per_chunk)]
    elif job.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    if job.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if job.overlap_dp_allreduce:  # the plan's time hides the gradient reduction (and the weights' gather)
        args.append("--overlap-grad-reduce")
        if job.distributed_optimizer:
            args.append("--overlap-param-gather")
    if job.dtype == "fp8":  # Transformer Engine's fp8 recipe: E4M3 forward, E5M2 gradients, bf16 elsewhere
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                 "tensorwise" if job.fp8_recipe == "current" else "delayed", "--transformer-impl", "transformer_engine"]
        if job.fp8_params:  # the plan's memory holds the block weights in fp8 only, gathered in fp8
            args.append("--fp8-param-gather")
    elif job.dtype == "bf16":
        args.append("--bf16")
    elif job.dtype == "fp16":
        args.append("--fp16")
    # the plan's gradients: Megatron-LM holds and reduces them in fp32 with --bf16 and in fp16 with --fp16
    if job.dtype in ("bf16", "fp8") and not job.grad_reduce_in_fp32:
        args.append("--grad-reduce-in-bf16")
    elif job.dtype == "fp16" and job.grad_reduce_in_fp32:
        args.append("--accumulate-allreduce-grads-in-fp32")
    if not job.gradient_accumulation_fusion:  # the plan's backward adds each weight gradient in its own kernel
        args.append("--no-gradient-accumulation-fusion")
    if job.fused_cross_entropy:  # the plan's head time and memory assume Transformer Engine's fused loss
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    return args


def mock_data_args(job: TrainingJob, notes: list[str]) -> list[str]:
    """Return the arguments that train on Megatron-LM's mock data with the plan's vocabulary: its
    NullTokenizer has `--vocab-size` + 1 tokens (the last is the end of document), padded to a multiple
    of `--make-vocab-size-divisible-by` x tp; with 1 the embedding holds the plan's vocabulary, or the
    next multiple of tp (noted)."""
    vocab = int(job.model["vocab"])
    if vocab % job.tp:
        notes.append(f"Megatron-LM pads the vocabulary to a multiple of tp {job.tp}: {vocab} -> "
                     f"{-(-vocab // job.tp) * job.tp} rows in the embedding and the output head")
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
            "--make-vocab-size-divisible-by", "1"]


def run_script(job: TrainingJob, args: list[str], lay: Launch, env: dict[str, str] | None, data: list[str],
               per_stage_env: bool = False) -> str:
    """Return run.sh's text (`gpuplan.export.launcher.run_script`): torchrun of
    "$MEGATRON_LM/pretrain_gpt.py" with `args`, then `data` when run.sh gets no arguments, else its
    arguments ("$@")."""
    header = [f"# gpuplan export megatron: predicted iteration {job.predicted_iteration_s:.6g} s "
              "(Megatron-LM logs \"elapsed time per iteration (ms)\")",
              "# MEGATRON_LM: your Megatron-LM checkout. Without arguments it trains on mock data; arguments",
              "# are passed to pretrain_gpt.py last (real data: --data-path ... --tokenizer-type ...)."]
    checks = [': "${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout (the directory of pretrain_gpt.py)}"',
              f'[ "$#" -gt 0 ] || set -- {" ".join(shlex.quote(a) for a in data)}']
    trainer = '"$MEGATRON_LM/pretrain_gpt.py" ' + " ".join(shlex.quote(a) for a in args) + ' "$@"'
    return launcher.run_script(header, launcher.train_tail(trainer, per_stage_env), lay, env, per_stage_env, checks)


def export(bundle: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Return Megatron-LM's arguments for a bundle ({"args": [...], "env": {stage: {...}}, "world_size": N,
    "nodes": [{"node", "node_rank", "ranks", "cuda_visible_devices"}, ...] ([] when the plan names no placement),
    "notes": [...], "files": [...]}); with `out`, also write the launch directory there (megatron.args,
    NCCL env files, run.sh; "files" lists them). Raises ExportRefused when Megatron-LM cannot express the plan."""
    job = training_job(bundle, "Megatron-LM")
    args = job_args(job)
    lay = node_launch(job, "Megatron-LM")
    notes = list(job.notes) + lay.notes
    nodes = [{"node": n, "node_rank": r, "ranks": c, "cuda_visible_devices": lay.visible(r)}
             for r, (n, c) in enumerate(zip(lay.nodes, lay.nproc))] if lay.devices else []
    if job.attention_library == "sdpa" and job.device_arch == "hopper":
        notes.append("the plan's attention times are PyTorch SDPA's kernel (FlashAttention-2 on Hopper); Megatron-LM "
                     "runs Transformer Engine's, cuDNN's on Hopper, about 1.7x faster per attention: expect the run "
                     "faster than predicted, or plan with --attention-library te")
    notes.append("Megatron-LM runs its own 1F1B: Tessel's schedule "
                 f"({'zero-bubble split backward' if job.split_backward else 'plain backward'}) is not exported")
    files: list[str] = []
    if out is not None:
        root = make_output_dir(out, "Megatron-LM export directory")
        run_args = args + BENCHMARK_ARGS
        atomic_write_text(root / ARGS_FILE, "\n".join(run_args) + "\n")
        files.append(str(root / ARGS_FILE))
        env, per_stage = launcher.write_nccl_env(job, root, "Megatron-LM", files, notes)
        script = run_script(job, run_args, lay, env, mock_data_args(job, notes), per_stage)
        atomic_write_text(root / launcher.RUN_SCRIPT, script)
        files.append(str(root / launcher.RUN_SCRIPT))
    return {"args": args, "env": job.nccl_env, "world_size": job.num_stages * job.tp * job.dp, "nodes": nodes,
            "notes": notes, "files": files}
