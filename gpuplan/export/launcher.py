"""The launch files every trainer export writes: run.sh (torchrun on one or several nodes, each node's
ranks pinned to the plan's GPUs), Lagom's NCCL settings as env files, and the per-rank wrapper that
applies a stage's own settings when they differ between stages.

torchtitan and Megatron-LM both rank their mesh pp outermost, tp innermost, so the ranks of pipeline
stage k are RANK // (tp x dp) in both; `gpuplan.export.common.node_launch` gives each node its ranks and
GPUs. The scripts name their files by their own directory, so an export directory can be moved.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpuplan.export.common import Launch, TrainingJob
from gpuplan.io import atomic_write_text

NCCL_ENV = "nccl.env"
NCCL_WRAPPER = "nccl_env.sh"
RUN_SCRIPT = "run.sh"
HERE = 'HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1'


def env_file_text(env: dict[str, str]) -> str:
    """Return an environment as lines `KEY='value'` a POSIX shell can source: each value quoted, since
    Lagom joins per-collective settings with ';' (`NCCL_ALGO=allreduce:ring;allgather:tree`)."""
    return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))


def train_tail(trainer: str, per_stage_env: bool) -> str:
    """Return what follows torchrun's own options: `trainer` (the Python module or script and its
    arguments, shell text), through nccl_env.sh when `per_stage_env`."""
    if per_stage_env:  # torchrun runs the wrapper on each rank; it runs the trainer with the stage's settings
        return f'--no-python sh "$HERE/{NCCL_WRAPPER}" "${{PYTHON:-python}}" {trainer}'
    return trainer


def run_script(header: list[str], tail: str, lay: Launch, env: dict[str, str] | None,
               per_stage_env: bool = False, checks: list[str] | None = None) -> str:
    """Return run.sh's text: `header` comment lines, the shell `checks` (lines that stop the script
    with a message when something it needs is unset), the (multi-node) torchrun line running `tail`
    (`train_tail`), each node's ranks pinned to the plan's GPUs (CUDA_VISIBLE_DEVICES, when the plan
    names them), exporting `env` (nccl.env) first when given. The script names its files by its own
    directory ($HERE) and runs the trainer in the caller's directory."""
    lines = ["#!/bin/sh", *header]
    if per_stage_env:
        lines.append("# PYTHON: the interpreter with the trainer installed (default: python on PATH)")
    lines.append(HERE)
    lines += checks or []
    if env:
        lines += ['set -a  # export the NCCL settings of nccl.env to every rank', f'. "$HERE/{NCCL_ENV}"', "set +a"]
    if lay.devices:
        lines.append("export CUDA_DEVICE_ORDER=PCI_BUS_ID  # number GPUs as nvidia-smi does: the plan's GPU indices")
    if len(lay.nodes) == 1:
        if lay.devices:
            lines.append(f"export CUDA_VISIBLE_DEVICES={lay.visible(0)}  # the plan's GPUs of {lay.nodes[0]}")
        lines.append(f"torchrun --nproc-per-node {lay.world} {tail}")
        return "\n".join(lines) + "\n"
    lines += [f"# {len(lay.nodes)} nodes: run this on each with NODE_RANK set, MASTER_ADDR and MASTER_PORT those of node 0",
              *[f"#   NODE_RANK={r}: {n} ({c} ranks)" for r, (n, c) in enumerate(zip(lay.nodes, lay.nproc))],
              ': "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}" "${MASTER_PORT:=29500}"']
    uneven = len(set(lay.nproc)) > 1
    if uneven or lay.devices:
        lines.append('case "$NODE_RANK" in')
        for r, c in enumerate(lay.nproc):
            sets = [f"NPROC={c}"] if uneven else []
            sets += [f"CUDA_VISIBLE_DEVICES={lay.visible(r)}"] if lay.devices else []
            lines.append(f"  {r}) {' '.join(sets)} ;;")
        lines += ['  *) echo "NODE_RANK must be 0..' + str(len(lay.nodes) - 1) + '" >&2; exit 2 ;;', "esac"]
        if lay.devices:
            lines.append("export CUDA_VISIBLE_DEVICES  # this node's GPUs of the plan, in local-rank order")
    nproc = '"$NPROC"' if uneven else str(lay.nproc[0])
    # static rendezvous: torchrun honours --node-rank only with it (c10d orders nodes by host name), and the
    # node rank is what puts each stage on the plan's nodes
    lines.append(f'torchrun --nnodes {len(lay.nodes)} --nproc-per-node {nproc} --node-rank "$NODE_RANK" '
                 f'--rdzv-backend static --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" {tail}')
    return "\n".join(lines) + "\n"


def stage_env_wrapper(job: TrainingJob, trainer: str) -> str:
    """Return nccl_env.sh's text: run by torchrun on every rank, it sources the nccl-stage{k}.env of the
    rank's pipeline stage (k = RANK / (tp dp): the mesh order pp, dp, tp of `trainer`) and execs its
    arguments."""
    ranks, last = job.tp * job.dp, job.num_stages - 1
    lines = ["#!/bin/sh",
             f"# gpuplan export {trainer}: torchrun runs this on every rank (run.sh, --no-python). It exports the",
             f"# Lagom NCCL settings of the rank's pipeline stage (RANK / {ranks}: the mesh order pp, dp, tp)",
             "# from nccl-stage{k}.env beside it, then runs its arguments (the trainer).",
             HERE,
             'case "$RANK" in',
             f"  ''|*[!0-9]*) echo \"{NCCL_WRAPPER}: RANK is '$RANK', not a rank: run it under torchrun\" >&2;"
             " exit 2 ;;",
             "esac",
             f"STAGE=$((RANK / {ranks}))",
             'case "$STAGE" in']
    for k in range(job.num_stages):
        if k in job.nccl_env:
            lines.append(f'  {k}) set -a; . "$HERE/nccl-stage{k}.env"; set +a ;;')
        else:
            lines.append(f"  {k}) ;;  # Lagom set nothing for stage {k}")
    lines += [f'  *) echo "{NCCL_WRAPPER}: RANK $RANK is in stage $STAGE; the plan has stages 0..{last}" >&2;'
              " exit 2 ;;",
              "esac", 'exec "$@"']
    return "\n".join(lines) + "\n"


def write_nccl_env(job: TrainingJob, root: Path, trainer: str, files: list[str], notes: list[str]
                   ) -> tuple[dict[str, str] | None, bool]:
    """Write Lagom's NCCL settings into `root`: one nccl.env when every stage has the same, else
    nccl-stage{k}.env per stage and nccl_env.sh (`stage_env_wrapper`); append the paths to `files` and
    a note when the settings differ per stage. Return (the env run.sh exports, or None; whether run.sh
    starts every rank through nccl_env.sh)."""
    envs = [job.nccl_env[s] for s in sorted(job.nccl_env)]
    if envs and len(envs) == job.num_stages and all(e == envs[0] for e in envs):
        atomic_write_text(root / NCCL_ENV, env_file_text(envs[0]))
        files.append(str(root / NCCL_ENV))
        return envs[0], False
    for s, env in sorted(job.nccl_env.items()):
        path = root / f"nccl-stage{s}.env"
        atomic_write_text(path, env_file_text(env))
        files.append(str(path))
    if not job.nccl_env:
        return None, False
    atomic_write_text(root / NCCL_WRAPPER, stage_env_wrapper(job, trainer))
    files.append(str(root / NCCL_WRAPPER))
    ranks = job.tp * job.dp
    notes.append("Lagom's NCCL settings differ per stage: run.sh starts every rank through "
                 f"{NCCL_WRAPPER}, which exports nccl-stage{{k}}.env on stage k's ranks (global ranks "
                 f"{ranks}k .. {ranks}k+{ranks - 1}: {trainer}'s mesh order) before running the trainer "
                 "with $PYTHON (default: python)")
    return None, True
