"""Trace-driven, round-based simulation of an OEF policy (or a baseline) on a cluster.

Every round (`round_s` seconds) the jobs that have arrived and not finished are the problem; when
that set changes the policy re-allocates (a registered oef solver, shares only). Each round the
jobs most behind their shares run on whole GPUs (gpuplan.solvers.oef_rounds.choose, owed rounds
carried across re-allocations, as Gavel's round-based mechanism does). A job that finishes inside
a round leaves at its exact finish time; its GPUs idle until the round ends.

Reported per policy: average and 95th-percentile job completion time (JCT, s), makespan (s),
utilisation (busy GPU-seconds over GPUs x makespan) and finish-time fairness
rho = JCT / (steps / throughput on a 1/N split of the cluster), N the average number of jobs in the
system during the job's life (Themis's measure; rho <= 1 means no worse than its own 1/N cluster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gpuplan.models.oef import OefProblem
from gpuplan.models.oef_trace import Trace
from gpuplan.registry import no_progress


@dataclass
class SimResult:
    """What a simulation measured (times in seconds)."""

    policy: str
    jct_s: dict[str, float] = field(default_factory=dict)
    ftf: dict[str, float] = field(default_factory=dict)
    makespan_s: float = 0.0
    utilisation: float = 0.0
    reallocations: int = 0
    rounds: int = 0

    def figures(self) -> dict[str, float]:
        """Return the summary: avg and p95 JCT (h), makespan (h), utilisation, FTF mean/max."""
        jct = np.array(list(self.jct_s.values()))
        rho = np.array(list(self.ftf.values()))
        return {"avg_jct_h": float(jct.mean() / 3600), "p95_jct_h": float(np.percentile(jct, 95) / 3600),
                "makespan_h": self.makespan_s / 3600, "utilisation": self.utilisation,
                "ftf_mean": float(rho.mean()), "ftf_max": float(rho.max()),
                "ftf_above_1": float((rho > 1 + 1e-9).mean()), "reallocations": float(self.reallocations)}


def simulate(trace: Trace, policy: str = "oef", *, max_rounds: int = 100_000,
             progress: Callable[[float | None, str], None] = no_progress) -> SimResult:
    """Return the SimResult of running `trace` under the registered oef solver `policy`."""
    from gpuplan.solvers.oef_rounds import choose

    cap = trace.cluster.capacity()
    types = list(cap)
    capacity = np.array([cap[t] for t in types], dtype=float)
    jobs = sorted(trace.jobs, key=lambda j: (j.arrival_s, j.name))
    tput = {j.name: np.array([trace.throughput(j)[t] for t in types]) for j in jobs}
    left = {j.name: float(j.steps) for j in jobs}
    owed = {j.name: np.zeros(len(types)) for j in jobs}
    share: dict[str, np.ndarray] = {}
    population: dict[str, list[int]] = {j.name: [] for j in jobs}
    result = SimResult(policy)
    active: list[Any] = []
    pending = list(jobs)
    t = math.ceil(jobs[0].arrival_s / trace.round_s) * trace.round_s
    changed, busy = True, 0.0
    while pending or active:
        while pending and pending[0].arrival_s <= t:
            active.append(pending.pop(0))
            changed = True
        if not active:                     # idle: jump to the first round after the next arrival
            t = math.ceil(pending[0].arrival_s / trace.round_s) * trace.round_s
            continue
        if changed:
            share = _allocate(trace, active, policy)
            result.reallocations += 1
            changed = False
        for j in active:
            population[j.name].append(len(active))
        X = np.array([share[j.name] for j in active])
        O = np.array([owed[j.name] for j in active]) + X
        gpus = np.array([j.gpus for j in active], dtype=float)
        done = []
        for i, k in choose(O, X > 1e-9, gpus, capacity):
            j = active[i]
            O[i, k] -= 1
            rate = tput[j.name][k]
            need = left[j.name] / rate
            run = min(need, trace.round_s)
            busy += run * j.gpus
            left[j.name] -= rate * run
            if need <= trace.round_s:
                result.jct_s[j.name] = t + need - j.arrival_s
                done.append(j)
        for i, j in enumerate(active):
            owed[j.name] = O[i]
        for j in done:
            active.remove(j)
            changed = True
        t += trace.round_s
        result.rounds += 1
        if result.rounds >= max_rounds:
            raise RuntimeError(f"{policy}: trace not finished after {max_rounds} rounds")
        if result.rounds % 25 == 0:
            progress(len(result.jct_s) / len(jobs), f"{policy}: {len(result.jct_s)}/{len(jobs)} jobs done")
    start = jobs[0].arrival_s
    end = max(j.arrival_s + result.jct_s[j.name] for j in jobs)
    result.makespan_s = float(end - start)
    result.utilisation = float(busy / (capacity.sum() * result.makespan_s))
    for j in jobs:
        n = float(np.mean(population[j.name]))
        iso = np.minimum(capacity / (n * j.gpus), 1.0)
        iso = iso / max(iso.sum(), 1.0) * (tput[j.name] > 0)
        result.ftf[j.name] = result.jct_s[j.name] / (j.steps / float(tput[j.name] @ iso))
    return result


def _allocate(trace: Trace, active: list[Any], policy: str) -> dict[str, np.ndarray]:
    """Return each active job's time fractions per type under `policy` (a registered oef solver)."""
    from gpuplan import api

    by_tenant: dict[str, list[Any]] = {}
    for j in active:
        by_tenant.setdefault(j.tenant or j.name, []).append(j)
    tenants = [{"name": name, "weight": trace.tenants.get(name, 1.0),
                "jobs": [{"name": j.name, "gpus": j.gpus,
                          "throughput": {t: x for t, x in trace.throughput(j).items() if x > 0}} for j in js]}
               for name, js in by_tenant.items()]
    problem = OefProblem(cluster=trace.cluster, tenants=tenants, rounds=0)
    plan = api.solve(problem, solver=policy)
    order = [j.name for js in by_tenant.values() for j in js]          # the plan's job order
    return dict(zip(order, plan.matrix()))
