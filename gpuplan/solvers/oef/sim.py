"""Trace-driven, round-based simulation of an OEF policy (or a baseline) on a cluster.

Every round (`round_s` seconds) the jobs that have arrived and not finished are the problem; when
that set changes the policy re-allocates (a registered oef solver, shares only). Each round the
jobs most behind their shares run on whole GPUs (gpuplan.solvers.oef.rounds.choose, owed rounds
carried across re-allocations, as Gavel's round-based mechanism does). A job that finishes inside
a round leaves at its exact finish time; its GPUs idle until the round ends.

`mechanism='gavel'` replays Gavel's simulator instead (scheduler.py of Narayanan et al.): rounds
that end when their last job does, work-conserving filling of idle GPUs, priorities
share / (time received / time given on the type) since the last reset, and re-allocation at most
every `resolve_every_s` (Gavel: 1,920 s); see simulate_gavel_rounds.

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

from gpuplan.models.oef import OefProblem, arrays, envy_pairs, equal_share, reference_speed, utilities
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
    useful_gpu_s: float = 0.0           # work done, in GPU-seconds of each job's reference type
    min_si_ratio: float = math.inf      # worst sharing-incentive ratio over every allocation
    envy_allocations: int = 0           # allocations with at least one envy pair
    max_envy: float = 0.0               # largest relative envy over every allocation
    idle_fit_rounds: int = 0            # rounds that left GPUs idle which a waiting job could use

    def figures(self) -> dict[str, float]:
        """Return the summary: avg and p95 JCT (h), makespan (h), utilisation, FTF mean/max,
        useful throughput (reference-GPU equivalents: work in GPU-seconds of each job's reference
        type over the makespan), and the fairness of every allocation made (worst SI ratio,
        allocations with envy, largest relative envy)."""
        jct = np.array(list(self.jct_s.values()))
        rho = np.array(list(self.ftf.values()))
        return {"avg_jct_h": float(jct.mean() / 3600), "p95_jct_h": float(np.percentile(jct, 95) / 3600),
                "makespan_h": self.makespan_s / 3600, "utilisation": self.utilisation,
                "ftf_mean": float(rho.mean()), "ftf_max": float(rho.max()),
                "ftf_above_1": float((rho > 1 + 1e-9).mean()), "reallocations": float(self.reallocations),
                "useful_gpus": self.useful_gpu_s / max(self.makespan_s, 1e-9),
                "min_si_ratio": self.min_si_ratio, "envy_allocations": float(self.envy_allocations),
                "max_envy": self.max_envy, "idle_fit_rounds": float(self.idle_fit_rounds)}


MECHANISMS = ("grid", "gavel")


def simulate(trace: Trace, policy: str = "oef", *, mechanism: str = "grid", resolve_every_s: float = 1920.0,
             work_conserving: bool = True, max_rounds: int = 100_000, solver_options: dict[str, Any] | None = None,
             space_sharing: bool = False,
             progress: Callable[[float | None, str], None] = no_progress) -> SimResult:
    """Return the SimResult of running `trace` under the registered oef solver `policy`.

    mechanism 'grid' (default): rounds on a fixed grid of `round_s`, re-allocation at every
    arrival and finish, only jobs owed rounds run. 'gavel': Gavel's round mechanism (see
    simulate_gavel_rounds) with `resolve_every_s` (0: every event) and `work_conserving`.
    `solver_options` go to every allocation (e.g. {"tie_break": "efficiency"}); `space_sharing`
    (gavel mechanism only) packs waiting jobs onto running jobs' GPUs by measured co-location.
    """
    if mechanism == "gavel":
        return simulate_gavel_rounds(trace, policy, resolve_every_s=resolve_every_s,
                                     work_conserving=work_conserving, max_rounds=max_rounds,
                                     solver_options=solver_options, space_sharing=space_sharing,
                                     progress=progress)
    if mechanism != "grid":
        raise ValueError(f"mechanism: one of {', '.join(MECHANISMS)}, not {mechanism!r}")
    if space_sharing:
        raise ValueError("space_sharing: only with mechanism='gavel'")
    from gpuplan.solvers.oef.rounds import choose

    types, capacity, jobs, tput, ref = _prepare(trace)
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
            share = _allocate(trace, active, policy, result, solver_options)
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
            result.useful_gpu_s += run * j.gpus * rate / ref[j.name]
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
        _count_round(result, policy, max_rounds, len(jobs), progress)
    _finish(result, jobs, tput, capacity, population, busy)
    return result


def _prepare(trace: Trace) -> tuple[list[str], np.ndarray, list[Any], dict[str, np.ndarray], dict[str, float]]:
    """Return the cluster's GPU types, their GPU counts, the jobs by arrival, each job's steps/s per
    type and its reference speed (steps/s, the unit of useful work; see models.oef.reference_speed)."""
    cap = trace.cluster.capacity()
    types = list(cap)
    capacity = np.array([cap[t] for t in types], dtype=float)
    jobs = sorted(trace.jobs, key=lambda j: (j.arrival_s, j.name))
    speeds = {j.name: trace.throughput(j) for j in jobs}
    tput = {name: np.array([x[t] for t in types]) for name, x in speeds.items()}
    ref = {name: reference_speed(trace.cluster, x, trace.reference_type, cap) for name, x in speeds.items()}
    return types, capacity, jobs, tput, ref


def _count_round(result: Any, policy: str, max_rounds: int, n_jobs: int, progress: Any) -> None:
    """Count one more round of `result`, report progress every 25 rounds, and raise SolverError past
    `max_rounds` (a trace too long for its round length, or one that never finishes); return None."""
    from gpuplan.errors import SolverError

    result.rounds += 1
    if result.rounds >= max_rounds:
        raise SolverError(f"{policy}: the trace is not finished after {max_rounds:,} rounds "
                          f"({len(result.jct_s)} of {n_jobs} jobs done): each round is the trace's round_s, "
                          "so a longer round_s simulates a longer trace in as many rounds")
    if result.rounds % 25 == 0:
        progress(len(result.jct_s) / n_jobs, f"{policy}: {len(result.jct_s)}/{n_jobs} jobs done")


def _finish(result: SimResult, jobs: list[Any], tput: dict[str, np.ndarray], capacity: np.ndarray,
            population: dict[str, list[int]], busy_gpu_s: float) -> None:
    """Fill in makespan (s), utilisation and finish-time fairness of a finished simulation."""
    start = jobs[0].arrival_s
    end = max(j.arrival_s + result.jct_s[j.name] for j in jobs)
    result.makespan_s = float(end - start)
    result.utilisation = float(busy_gpu_s / (capacity.sum() * max(result.makespan_s, 1e-9)))
    for j in jobs:
        n = float(np.mean(population[j.name]))
        iso = np.minimum(capacity / (n * j.gpus), 1.0)
        iso = iso / max(iso.sum(), 1.0) * (tput[j.name] > 0)
        result.ftf[j.name] = result.jct_s[j.name] / (j.steps / float(tput[j.name] @ iso))


def _pack(trace: Trace, active: list[Any], queue: list[Any], running: dict[str, int],
          tput: dict[str, np.ndarray], types: list[str]) -> dict[str, tuple[str, float]]:
    """Space sharing: place each waiting job (queue order) on the GPUs of a running job of the same
    GPU count whose pair, by the trace's measured co-location throughputs, does more normalised work
    than the running job alone (own/isolated + other/isolated > 1), the best such partner first.
    Adds the packed jobs to `running`; returns job -> (partner, its steps/s while sharing)."""
    from gpuplan.models.oef_trace import pair_throughput

    shared: dict[str, tuple[str, float]] = {}
    alone = [j for j in active if j.name in running]
    seen: set[str] = set()
    for entry in queue:
        j = entry[4]
        if j.name in running or j.name in seen:
            continue
        seen.add(j.name)
        best, best_gain = None, 1e-9
        for r in alone:
            if r.name in shared:
                continue
            k = running[r.name]
            pair = pair_throughput(trace, j, r, types[k])
            if pair is None or tput[j.name][k] <= 0 or min(pair) <= 0:
                continue
            gain = pair[0] / tput[j.name][k] + pair[1] / tput[r.name][k] - 1.0
            if gain > best_gain:
                best, best_gain = (r, pair), gain
        if best is not None:
            r, (own, other) = best
            running[j.name] = running[r.name]
            shared[j.name] = (r.name, own)
            shared[r.name] = (j.name, other)
    return shared


def simulate_gavel_rounds(trace: Trace, policy: str = "oef", *, resolve_every_s: float = 1920.0,
                          work_conserving: bool = True, max_rounds: int = 100_000,
                          solver_options: dict[str, Any] | None = None, space_sharing: bool = False,
                          progress: Callable[[float | None, str], None] = no_progress) -> SimResult:
    """Return the SimResult of `trace` under `policy` with Gavel's round mechanism (scheduler.py).

    - A round starts when the previous one ends; jobs that arrived by then join. Each scheduled
      job runs min(floor(throughput x round_s), steps left) steps, and the round ends when its
      last job does (so rounds are shorter than `round_s` when every job finishes early).
    - Accounting since the last reset: every job starts a reset with round_s / 2 s on each type;
      a job's priority on type j is X[i, j] / (its time on j / all jobs' time on j), 0 where
      X[i, j] = 0. Per type (in the cluster's order), jobs go by descending (priority, deficit,
      share); a job runs once per round, on the first type that has room for its GPUs.
    - work_conserving: jobs with priority 0 (no share on a type, or arrived after the last
      re-allocation) still fill GPUs left idle, as Gavel does; False leaves those GPUs idle.
    - Re-allocation (and reset of the accounting, the owed time carried as deficits) when jobs
      arrived or finished and at least `resolve_every_s` passed since the last one (Gavel: 1,920 s;
      0: at every event). Finish time of a job = end of its last step; JCT from its arrival.
    - space_sharing: after that, waiting jobs may share a running job's GPUs where the trace's
      measured co-location throughputs make the pair do more work than the running job alone
      (see _pack; a greedy fill, not Gavel's packed LP: allocations stay per job).
    """
    types, capacity, jobs, tput, ref = _prepare(trace)
    m = len(types)
    left = {j.name: float(math.ceil(j.steps)) for j in jobs}
    half = trace.round_s / 2.0
    job_time: dict[str, np.ndarray] = {}
    deficit: dict[str, np.ndarray] = {}
    worker_time = np.zeros(m)
    alloc: dict[str, np.ndarray] = {}
    population: dict[str, list[int]] = {j.name: [] for j in jobs}
    result = SimResult(policy)
    active: list[Any] = []
    pending = list(jobs)
    t = jobs[0].arrival_s
    last_reset, need_update, busy = 0.0, False, 0.0
    while pending or active:
        while pending and pending[0].arrival_s <= t:
            j = pending.pop(0)
            active.append(j)
            job_time[j.name] = np.full(m, half)
            deficit[j.name] = np.zeros(m)
            need_update = True
        if not active:
            t = pending[0].arrival_s
            last_reset = 0.0
            continue
        if need_update and (last_reset == 0.0 or t - last_reset >= resolve_every_s):
            elapsed = t - last_reset
            for j in active:
                X = alloc.get(j.name, np.zeros(m))
                deficit[j.name] += X * elapsed - (job_time[j.name] - half)
                job_time[j.name] = np.full(m, half)
            worker_time = np.full(m, half * len(active))
            last_reset = t
            alloc = _allocate(trace, active, policy, result, solver_options)
            result.reallocations += 1
            need_update = False
        queue = []
        for k in range(m):
            entries = []
            for order, j in enumerate(active):
                X = float(alloc[j.name][k]) if j.name in alloc else 0.0
                if X <= 0 or tput[j.name][k] <= 0:
                    prio = 0.0
                elif worker_time[k] <= 0:
                    prio = X * 1e9
                else:
                    prio = X / (job_time[j.name][k] / worker_time[k])
                entries.append((-prio, -float(deficit[j.name][k]), -X, order, j, k))
            queue += sorted(entries, key=lambda e: e[:4])
        free = capacity.copy()
        running: dict[str, int] = {}
        for neg_prio, _, _, _, j, k in queue:
            if free[k] <= 0 or j.name in running or tput[j.name][k] <= 0:
                continue
            if neg_prio >= 0 and not work_conserving:
                continue
            if j.gpus > free[k]:
                continue
            free[k] -= j.gpus
            running[j.name] = k
        shared = _pack(trace, active, queue, running, tput, types) if space_sharing else {}
        if any(j.name not in running and bool(((tput[j.name] > 0) & (free >= j.gpus)).any()) for j in active):
            result.idle_fit_rounds += 1
        for j in active:
            population[j.name].append(len(active))
        end, done = t, []
        runs: dict[str, float] = {}
        for j in active:
            if j.name not in running:
                continue
            k = running[j.name]
            rate = shared[j.name][1] if j.name in shared else tput[j.name][k]
            steps = min(max(math.floor(rate * trace.round_s), 1.0), left[j.name])
            runs[j.name] = run = steps / rate
            left[j.name] -= steps
            job_time[j.name][k] += run
            worker_time[k] += run
            result.useful_gpu_s += run * j.gpus * rate / ref[j.name]
            end = max(end, t + run)
            if left[j.name] <= 0:
                result.jct_s[j.name] = t + run - j.arrival_s
                done.append(j)
        for j in active:                     # a shared GPU is busy while either job of the pair runs
            if j.name not in runs:
                continue
            if j.name not in shared:
                busy += runs[j.name] * j.gpus
            elif j.name < shared[j.name][0]:
                busy += max(runs[j.name], runs[shared[j.name][0]]) * j.gpus
        for j in done:
            active.remove(j)
            del job_time[j.name], deficit[j.name]
            need_update = True
        if not running:                     # nothing fits (cannot happen for valid traces): wait a round
            end = t + trace.round_s
        t = end
        _count_round(result, policy, max_rounds, len(jobs), progress)
    _finish(result, jobs, tput, capacity, population, busy)
    return result


def _allocate(trace: Trace, active: list[Any], policy: str, result: SimResult | None = None,
              solver_options: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Return each active job's time fractions per type under `policy` (a registered oef solver);
    with `result`, fold the allocation's SI ratios and envy into it."""
    from gpuplan import api

    by_tenant: dict[str, list[Any]] = {}
    for j in active:
        by_tenant.setdefault(j.tenant or j.name, []).append(j)
    tenants = [{"name": name, "weight": trace.tenants.get(name, 1.0),
                "jobs": [{"name": j.name, "gpus": j.gpus,
                          "throughput": {t: x for t, x in trace.throughput(j).items() if x > 0}} for j in js]}
               for name, js in by_tenant.items()]
    problem = OefProblem(cluster=trace.cluster, tenants=tenants, rounds=0, normalisation=trace.normalisation,
                         reference_type=trace.reference_type)
    plan = api.solve(problem, solver=policy, **(solver_options or {}))
    order = [j.name for js in by_tenant.values() for j in js]          # the plan's job order
    X = plan.matrix()
    if result is not None:
        a = arrays(problem)
        si = utilities(a, X) / np.maximum(utilities(a, equal_share(a)), 1e-12)
        pairs, worst, _ = envy_pairs(a, X)
        result.min_si_ratio = min(result.min_si_ratio, float(si.min()))
        result.envy_allocations += int(pairs > 0)
        result.max_envy = max(result.max_envy, worst)
    return dict(zip(order, X))
