"""Applying a Lagom plan in a torch job: env vars for a launched command, Options per process group.

- `run(problem, plan, command=[...])` (what `gpuplan run lagom PLAN -- torchrun ...` calls) launches
  the command with the plan's NCCL environment applied and reports its exit code and wall time.
  Without a command it runs the compute-under-communication experiment under the plan's
  environment (NCCL with one GPU per rank when available, else gloo on CPU).
- `nccl_options(fields)` builds a `ProcessGroupNCCL.Options` with the plan's min/max CTAs and CGA
  cluster size for one group (None where torch has no NCCL); `new_group(plan, name, ranks)` creates
  that group with them inside a running job.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from gpuplan.errors import InputError


def plan_env(plan: Any, base: dict[str, str] | None = None) -> dict[str, str]:
    """Return `base` (default: this process's environment) with the plan's NCCL variables set."""
    env = dict(os.environ if base is None else base)
    env.update(plan.env)
    return env


def nccl_options(fields: dict[str, Any]) -> Any:
    """Return a ProcessGroupNCCL.Options with `fields` (min_ctas, max_ctas, cga_cluster_size,
    is_high_priority_stream) applied, or None when this torch has no NCCL."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return None
    opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=bool(fields.get("is_high_priority_stream", False)))
    config = getattr(opts, "config", None)
    for key in ("min_ctas", "max_ctas", "cga_cluster_size"):
        if key in fields and config is not None and hasattr(config, key):
            setattr(config, key, int(fields[key]))
    return opts


def new_group(plan: Any, name: str, ranks: list[int]) -> Any:
    """Create the process group `name` of the plan over `ranks` (every rank must call this), with the
    plan's Options under NCCL; other backends get a plain group. Returns the group."""
    import torch.distributed as dist

    if name not in plan.group_options:
        raise InputError(f"the plan has no group {name!r}; it has {', '.join(plan.group_options)}")
    nccl = dist.get_backend() == "nccl"
    options = nccl_options(plan.group_options[name]) if nccl else None
    return dist.new_group(ranks, pg_options=options) if options is not None else dist.new_group(ranks)


def run(problem: Any, plan: Any, command: list[str] | None = None, timeout_s: float | None = None,
        **options: Any) -> dict[str, Any]:
    """Run `command` with the plan's environment (returns exit code, wall time s and the predicted
    iteration time), or without one the compute-under-communication experiment (slowdown)."""
    if not plan.ok:
        raise InputError("an infeasible plan has no settings to apply")
    if command:
        started = time.perf_counter()
        try:
            done = subprocess.run(command, env=plan_env(plan), timeout=timeout_s, check=False)
        except FileNotFoundError:
            raise InputError(f"command not found: {command[0]!r}") from None
        return {"returncode": done.returncode, "wall_s": time.perf_counter() - started,
                "nccl_variables": len(plan.env), "predicted_iteration_s": plan.iteration_s}
    from gpuplan.profiling.lagom_calib import measure_interference

    env_keys = ("NCCL_MIN_CTAS", "NCCL_NTHREADS")
    channels = int(plan.env.get(env_keys[0], 0)) or None
    threads = int(plan.env.get(env_keys[1], 0)) or None
    res = measure_interference(int(options.get("world_size", 2)), channels=channels, threads=threads)
    return {**res, "predicted_iteration_s": plan.iteration_s}
