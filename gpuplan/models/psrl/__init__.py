"""psRL: training-time prefix sharing for agentic RL updates (kind `psrl`).

A batch of RL samples as a prefix forest, GPU workers with speeds and memory, and a plan saying which
worker trains which samples, which shared prefixes are computed where or exchanged (K/V forward,
dK/dV backward), the micro-batch order per worker and the KV-cache blocks. See core.py for the
cost model, cache.py for block sizes and Belady eviction, traces.py for trace generation and reading.
"""

from __future__ import annotations

from gpuplan.models.psrl.core import (PsrlPlan, PsrlProblem, cache_stats, check, finish_plan, metrics, worker_loads,
                                      worker_memory, with_profile)
from gpuplan.models.psrl.view import describe, draw, summarize
from gpuplan.registry import ModelSpec, register_model

register_model(ModelSpec("psrl", PsrlProblem, PsrlPlan, check, summarize=summarize, describe=describe, draw=draw,
                         runner="gpuplan.runtime.psrl:run_plan", with_profile=with_profile,
                         title="psRL: training-time prefix sharing for agentic RL updates"))

__all__ = ["PsrlPlan", "PsrlProblem", "cache_stats", "check", "finish_plan", "metrics", "worker_loads",
           "worker_memory"]
