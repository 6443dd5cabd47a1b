"""Straggler-scheduling solvers: one per policy of gpuplan.sim.tasks, each a seeded simulation of the
problem's jobs under that policy (the plan states its figures and, for small instances, its schedule).

paper     srptms-c (default), srpt-r, fair-r, laps-r, sca, sda, ese, threshold (SCA/SDA below the workload
          threshold, ESE above)
baseline  mantri, late, dolly, hesrpt (optimal allocation for known sizes with concave speedup), srpt,
          fair (no redundancy), fifo
Every plan's solver stats carry the LP lower bound (gpuplan.solvers.stragglers_lp) on small instances.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuplan.errors import InputError
from gpuplan.models.stragglers import StragglersPlan, StragglersProblem, plan_from_run, simulate_problem
from gpuplan.models.plan import SolverInfo
from gpuplan.registry import Progress, no_progress, register_solver
from gpuplan.sim.tasks import POLICIES
from gpuplan.solvers.stragglers_lp import bound_stats

PAPER = {
    "srptms-c": "SRPTMS+C: weighted SRPT with task cloning, map before reduce (Xu & Lau, ICDCS 2015)",
    "srpt-r": "SRPT+R: SRPT with redundant copies and opportunistic checkpointing (Xu et al., TPDS 2019)",
    "fair-r": "Fair+R: equal shares of a multitasking cluster as redundant copies, checkpointing",
    "laps-r": "LAPS+R(beta): the latest beta fraction of jobs share the cluster, redundant copies",
    "sca": "SCA: clones per job chosen up front by utility per machine time (light load; Xu & Lau)",
    "sda": "SDA: one copy per task, d copies for stragglers detected at tau (light load; Xu & Lau)",
    "ese": "ESE: Mantri's rules with SRPT order and a flowtime-saved test for duplicates (heavy load)",
    "threshold": "the workload threshold: SCA/SDA below rho*, ESE above (Xu & Lau)",
}
BASELINE = {
    "mantri": "Mantri (OSDI 2010): kill/restart and duplicate rules, FIFO jobs",
    "late": "LATE (OSDI 2008): speculate the slowest-rate tasks with the longest time left, 10% cap",
    "dolly": "Dolly (NSDI 2013): clone small jobs up front within a 5% budget",
    "hesrpt": "heSRPT: optimal allocation for known sizes with speedup k^p fitted to h",
    "srpt": "SRPT without redundancy (preemptive-resume)",
    "fair": "fair sharing without redundancy (max-min, time-shared)",
    "fifo": "FIFO, one copy per task, no speculation",
}


def _solver(policy: str) -> Callable[..., StragglersPlan]:
    def solve(problem: StragglersProblem, *, time_limit_s: float | None = None, seed: int = 0,
              progress: Progress = no_progress, **params: Any) -> StragglersPlan:
        started = time.perf_counter()
        progress(0.0, f"simulating {len(problem.arrays[0])} jobs under {policy}")
        try:
            res, figs = simulate_problem(problem, policy, params, seed)
        except ValueError as exc:
            raise InputError(f"solver {policy}: {exc}", field="option", value=params) from None
        plan = plan_from_run(problem, res, figs, seed)
        stats: dict[str, Any] = {"events": res.events}
        progress(0.8, "LP lower bound")
        left = None if time_limit_s is None else max(time_limit_s - (time.perf_counter() - started), 0.0)
        stats.update(bound_stats(problem, time_limit_s=left))
        if stats.get("lp_bound_s"):
            stats["over_lp_bound"] = figs["weighted_flowtime_s"] / stats["lp_bound_s"]
        plan.solver = SolverInfo(name=policy, stats=stats)
        progress(1.0, "done")
        return plan

    solve.__name__ = f"solve_{policy.replace('-', '_')}"
    solve.__doc__ = f"Return the plan of a seeded simulation under {policy} (figures in s, slot-s)."
    return solve


for _name, _text in PAPER.items():
    register_solver("stragglers", _name, _solver(_name), role="paper", default=_name == "srptms-c",
                    description=_text, options=POLICIES[_name].defaults, option_rules=POLICIES[_name].rules)
for _name, _text in BASELINE.items():
    register_solver("stragglers", _name, _solver(_name), role="baseline", description=_text,
                    options=POLICIES[_name].defaults, option_rules=POLICIES[_name].rules)
