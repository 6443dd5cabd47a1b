"""Export a training bundle to torchtitan (tested against the torchtitan 0.3.0 release on PyPI).

torchtitan 0.3.0 reads its job from `--module M --config C` (a config_registry function) plus
command-line overrides parsed by tyro. The export writes into a directory:

- `torchtitan.args`: one override per line: parallel degrees (pipeline, tensor, data-parallel
  replicate), the per-stage module lists (`--parallelism.module_fqns_per_model_part`, one
  comma-separated list per stage: `tok_embeddings` and `layers.i` on the first, `norm`, `output` on
  the last, so uneven layer splits run as planned), the micro-batch size, the local batch and
  sequence length, and activation checkpointing as its subcommand (`activation-checkpoint:full`),
- `pp_schedule.csv`: Tessel's schedule as torch.distributed.pipelining's compute-only CSV (one row
  per pipeline rank; F, I, W or B actions), named by `--parallelism.pipeline_parallel_schedule_csv`,
- `nccl-stage{k}.env`: Lagom's NCCL environment of stage k (set it on that stage's ranks),
- `run.sh`: the torchrun command line.

The model's shape comes from the config function named (gpuplan cannot check it without importing
torchtitan's model registry); the module names are those of torchtitan's decoder models.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gpuplan.export.common import TrainingJob, training_job
from gpuplan.io import atomic_write_text

SCHEDULE_CSV = "pp_schedule.csv"
ARGS_FILE = "torchtitan.args"


def module_fqns(job: TrainingJob) -> list[list[str]]:
    """Return the module names of each (virtual) stage in pipeline order (torchtitan's decoder naming)."""
    out = []
    for k, (a, b) in enumerate(job.layers):
        names = (["tok_embeddings"] if k == 0 else []) + [f"layers.{i}" for i in range(a, b)]
        if k == len(job.layers) - 1:
            names += ["norm", "output"]
        out.append(names)
    return out


def schedule_csv(job: TrainingJob) -> str:
    """Return the schedule as torch's compute-only CSV text (row r: rank r's actions in order)."""
    return "".join(",".join(job.actions[r]) + "\n" for r in sorted(job.actions))


def job_args(job: TrainingJob, schedule_path: str) -> list[str]:
    """Return torchtitan's command-line overrides for the job (without --module / --config)."""
    args = ["--parallelism.pipeline_parallel_degree", str(job.num_stages),
            "--parallelism.tensor_parallel_degree", str(job.tp),
            "--parallelism.data_parallel_replicate_degree", str(job.dp),
            "--parallelism.data_parallel_shard_degree", "1",
            "--parallelism.pipeline_parallel_schedule", "1F1B" if job.interleave == 1 else "Interleaved1F1B",
            "--parallelism.pipeline_parallel_schedule_csv", schedule_path,
            "--parallelism.pipeline_parallel_microbatch_size", str(job.micro_batch_size),
            "--parallelism.module_fqns_per_model_part", *[",".join(m) for m in module_fqns(job)],
            "--training.local_batch_size", str(job.global_batch // job.dp),
            "--training.global_batch_size", str(job.global_batch),
            "--training.seq_len", str(job.seq_len)]
    if job.tp > 1:
        args.append("--parallelism.enable-sequence-parallel")
    args.append(f"activation-checkpoint:{job.recompute}")  # a tyro subcommand: last
    return args


def export(bundle: str | Path, out: str | Path, *, module: str = "llama3",
           config: str = "llama3_debugmodel") -> dict[str, Any]:
    """Write the torchtitan job of a bundle into directory `out`; return {"files": [...], "args": [...],
    "notes": [...]}. Raises ExportRefused when torchtitan cannot express the plan."""
    job = training_job(bundle, "torchtitan")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    csv_path = root / SCHEDULE_CSV
    atomic_write_text(csv_path, schedule_csv(job))
    args = ["--module", module, "--config", config] + job_args(job, str(csv_path))
    atomic_write_text(root / ARGS_FILE, "\n".join(args) + "\n")
    files = [str(csv_path), str(root / ARGS_FILE)]
    for s, env in sorted(job.nccl_env.items()):
        path = root / f"nccl-stage{s}.env"
        atomic_write_text(path, "".join(f"{k}={v}\n" for k, v in sorted(env.items())))
        files.append(str(path))
    world = job.num_stages * job.tp * job.dp
    notes = list(job.notes)
    if job.nccl_env:
        notes.append("Lagom's NCCL settings differ per stage: source nccl-stage{k}.env on stage k's ranks "
                     "(torchrun sets one environment per node)")
    script = ("#!/bin/sh\n# gpuplan export torchtitan: predicted iteration "
              f"{job.predicted_iteration_s:.6g} s\n"
              f"torchrun --nproc-per-node {world} -m torchtitan.train "
              + " ".join(shlex.quote(a) for a in args) + "\n")
    atomic_write_text(root / "run.sh", script)
    files.append(str(root / "run.sh"))
    return {"files": files, "args": args, "notes": notes}
