"""Lagom: co-tune NCCL's communication parameters for overlapped computation and communication.

A problem is one training iteration: computation segments in order, and the communication ops that
overlap them (or none: exposed). Each op has a collective, a size, a group (ranks, nodes, link
type). A plan gives every op a setting theta = (algorithm, protocol, channels, threads, chunk).
The iteration time is the sum of overlapped windows (cost.window_time_us), each bounded by
its compute lane or its communication lane; the bounding lanes form the critical path.

Write a workload out (segments + ops), let `from_model` build one from a catalog transformer and a
DP x TP layout, or `from_poseidon` from one stage of a Poseidon plan (gpuplan.compose.lagom_poseidon). With
`profile: FILE` (or `--profile`) the groups' bandwidth caps and latencies come from its measured
collectives.

Modules: problem.py (the input and its shorthand forms, with_profile), workload.py (`from_model`),
cost.py (NCCL's tuning model extended to channels / threads / chunk, and interference), compiled.py (the
problem as the cost model sees it), plan.py (the plan and make_plan), emit.py (env vars and per-group
Options), verify.py (check), view.py (tables and the timeline PNG).
"""

from __future__ import annotations

from gpuplan.models.lagom.compiled import Compiled, Theta, Window
from gpuplan.models.lagom.cost import Consts
from gpuplan.models.lagom.plan import LagomPlan, OpSetting, WindowTiming, make_plan, timeline
from gpuplan.models.lagom.problem import (GPU_EXTRA, CommOp, FromModel, Grid, Group, Hardware, LagomProblem, Segment,
                                          with_profile)
from gpuplan.models.lagom.verify import check
from gpuplan.models.lagom.view import describe, draw, summarize
from gpuplan.models.lagom.workload import workload_from_model
from gpuplan.registry import ModelSpec, register_model

register_model(ModelSpec("lagom", LagomProblem, LagomPlan, check, summarize=summarize, describe=describe,
                         draw=draw, runner="gpuplan.runtime.lagom:run", with_profile=with_profile,
                         title="Lagom: co-tuned communication parameters for overlapped training"))

__all__ = ["GPU_EXTRA", "CommOp", "Compiled", "Consts", "FromModel", "Grid", "Group", "Hardware", "LagomPlan",
           "LagomProblem", "OpSetting", "Segment", "Theta", "Window", "WindowTiming", "check", "describe", "draw",
           "make_plan", "summarize", "timeline", "with_profile", "workload_from_model"]
