"""Straggler scheduling: jobs of parallel map and reduce tasks on N slots whose copies run at varying
speeds; policies choose which tasks run and how many redundant copies (clones, speculative copies) each
gets, to minimise the weighted flowtime sum_j w_j (C_j - a_j).

The papers (Huanle Xu et al.): redundancy with opportunistic checkpointing (SRPT+R, Fair+R, LAPS+R; TPDS
2019), task cloning (SRPTMS+C; ICDCS 2015), speculative execution (SCA, SDA, ESE and the workload threshold;
INFOCOM 2015 / TPDS 2016); the baselines Mantri, LATE, Dolly, heSRPT, SRPT and fair sharing. The policies'
rules are reconstructions from the public abstracts (docs/stragglers.md says which parts are whose).

A plan names a policy, its parameters and the simulation seed, and states the simulated figures
(weighted flowtime, per-job completion, machine time) and, for small instances, every copy segment.
`check` re-simulates (problem, policy, parameters, seed) with gpuplan.sim.tasks, compares every figure, and
verifies map-before-reduce, slot capacity and one winning copy per task on the recorded schedule itself.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from gpuplan.models.base import Problem, Schema, Table, Violation, document_path
from gpuplan.models.plan import Plan, figure_violations, stated_figures_violations
from gpuplan.models.stragglers.speedup import Variability
from gpuplan.models.stragglers.trace import MAX_JOBS, MAX_TASKS, MAX_TASKS_PER_PHASE, read_trace, synthetic_jobs
from gpuplan.registry import ModelSpec, register_model
from gpuplan.units import Seconds

MAX_SLOTS = 100_000
RECORD_AUTO_TASKS = 300        # `record_schedule: auto` records the copies of instances this small
RECORD_MAX_TASKS = 5_000       # `always` records up to this many tasks
MAX_SCHEDULE_ROWS = 200_000    # a longer schedule is dropped (the figures are still checked)
SCHEDULE_COLUMNS = ["job", "task", "phase", "start_s", "end_s", "share", "won"]

PositiveSeconds = Annotated[Seconds, Field(gt=0)]


class JobSpec(Schema):
    """One job: arrival time (s), weight, and the nominal sizes (s) of its map and reduce tasks (a task's
    mean duration on one copy)."""

    id: str | int
    arrival_s: Seconds = Field(ge=0)
    weight: float = Field(default=1.0, gt=0, le=1e6)
    map_s: list[PositiveSeconds] = Field(min_length=1, max_length=MAX_TASKS_PER_PHASE)
    reduce_s: list[PositiveSeconds] = Field(default_factory=list, max_length=MAX_TASKS_PER_PHASE)


class VariabilitySpec(Schema):
    """Task-time variability: `pareto` slowdowns with shape `alpha`, or `uniform` machine speeds U[1-a, 1+a]."""

    model: Literal["pareto", "uniform"] = "pareto"
    alpha: float = Field(default=1.5, ge=1.1, le=100)
    a: float = Field(default=0.5, ge=0, le=0.95)

    def build(self) -> Variability:
        """Return the Variability object of this spec."""
        return Variability(self.model, self.alpha, self.a)


def _expected_map_tasks(max_map: int, tail: float) -> float:
    return float(sum(x ** -tail for x in range(1, max_map + 1)))


class WorkloadSpec(Schema):
    """A seeded synthetic workload (see gpuplan.models.stragglers.trace.synthetic_jobs)."""

    jobs: int = Field(ge=1, le=MAX_JOBS)
    load: float = Field(gt=0, le=1.5)
    arrival: Literal["poisson", "gamma", "uniform"] = "poisson"
    cv: float = Field(default=1.0, gt=0, le=100)
    seed: int = Field(default=0, ge=0, le=2**32)
    task_s: PositiveSeconds = 1.0
    max_map_tasks: int = Field(default=50, ge=1, le=1000)
    tail: float = Field(default=1.3, ge=1.01, le=10)
    reduce_fraction: float = Field(default=0.5, ge=0, le=1)
    weights: list[Annotated[float, Field(gt=0, le=1e6)]] = Field(default_factory=lambda: [1.0], min_length=1,
                                                                 max_length=16)

    @model_validator(mode="after")
    def _bounded(self) -> "WorkloadSpec":
        expected = self.jobs * 1.5 * _expected_map_tasks(self.max_map_tasks, self.tail)
        if expected > MAX_TASKS:
            raise ValueError(f"at jobs: a workload of at most {MAX_TASKS:,} tasks, but {self.jobs:,} jobs of this "
                             f"shape hold about {expected:,.0f}")
        return self


class StragglersProblem(Problem):
    """N slots, a variability model, and jobs: listed, read from a CSV trace, or generated."""

    kind: Literal["stragglers"] = "stragglers"
    slots: int = Field(ge=1, le=MAX_SLOTS)
    variability: VariabilitySpec = Field(default_factory=VariabilitySpec)
    jobs: list[JobSpec] | None = Field(default=None, min_length=1, max_length=MAX_JOBS)
    workload: WorkloadSpec | None = None
    tick_s: PositiveSeconds | None = None
    monitoring: Literal["elapsed", "progress"] = "elapsed"
    record_schedule: Literal["auto", "always", "never"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _read_trace(cls, data: Any, info: Any) -> Any:
        """Replace `trace: FILE.csv` by the jobs it holds (so a plan embeds them and checks anywhere)."""
        if not isinstance(data, dict) or "trace" not in data:
            return data

        data = dict(data)
        trace = data.pop("trace")
        if not isinstance(trace, str) or not trace:
            raise ValueError(f"at trace: the path of a CSV trace, not {trace!r}")
        if "jobs" in data:
            raise ValueError("at trace: either trace or jobs, not both")
        data["jobs"] = read_trace(document_path(trace, info))
        return data

    @model_validator(mode="after")
    def _one_source(self) -> "StragglersProblem":
        if (self.jobs is None) == (self.workload is None):
            raise ValueError("at jobs: exactly one of jobs, trace (a CSV file) or workload")
        if self.jobs is not None:
            total = sum(len(j.map_s) + len(j.reduce_s) for j in self.jobs)
            if total > MAX_TASKS:
                raise ValueError(f"at jobs: at most {MAX_TASKS:,} tasks in all, not {total:,}")
            ids = [str(j.id) for j in self.jobs]
            if len(set(ids)) != len(ids):
                dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
                raise ValueError(f"at jobs: distinct job ids, but {dup} repeat")
        if self.tick_s is not None:
            sizes = self.task_sizes()
            if self.tick_s < 0.01 * float(sizes.mean()):
                raise ValueError(f"at tick_s: at least 1% of the mean task size ({0.01 * float(sizes.mean()):.4g} s), "
                                 f"not {self.tick_s!r}")
        return self

    # -- derived

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Return (arrival_s, weight, map sizes per job, reduce sizes per job), computed once."""
        if self.jobs is not None:
            return (np.array([j.arrival_s for j in self.jobs], dtype=float),
                    np.array([j.weight for j in self.jobs], dtype=float),
                    [np.array(j.map_s, dtype=float) for j in self.jobs],
                    [np.array(j.reduce_s, dtype=float) for j in self.jobs])
        w = self.workload
        assert w is not None
        return synthetic_jobs(w.jobs, w.load, self.slots, self.variability.build().mean_factor(), seed=w.seed,
                              arrival=w.arrival, cv=w.cv, task_s=w.task_s, max_map_tasks=w.max_map_tasks,
                              tail=w.tail, reduce_fraction=w.reduce_fraction, weights=tuple(w.weights))

    def sim_workload(self) -> Any:
        """Return the gpuplan.sim.tasks.Workload of this problem."""
        from gpuplan.sim.tasks import Workload

        return Workload(*self.arrays)

    def job_ids(self) -> list[str]:
        """Return the job ids in order (listed ids, or j0, j1, ... for a generated workload)."""
        if self.jobs is not None:
            return [str(j.id) for j in self.jobs]
        return [f"j{i}" for i in range(len(self.arrays[0]))]

    def task_sizes(self) -> np.ndarray:
        """Return every task's nominal size (s)."""
        _, _, maps, reds = self.arrays
        return np.concatenate(maps + reds)

    def tasks(self) -> int:
        """Return the number of tasks."""
        return int(self.task_sizes().size)

    def offered_load(self) -> float:
        """Return the offered load: expected machine time per second over the slots (the workload's
        `load`; for listed jobs (n - 1) / arrival span * mean job work * E[X] / N, capped at 1e6)."""
        if self.workload is not None:
            return float(self.workload.load)
        arr, _, maps, reds = self.arrays
        work = float(sum(m.sum() + r.sum() for m, r in zip(maps, reds))) / len(arr)
        span = float(arr.max() - arr.min())
        if len(arr) < 2 or span <= 0:
            return 1e6
        return min(1e6, (len(arr) - 1) / span * work * self.variability.build().mean_factor() / self.slots)

    def record(self) -> bool:
        """Return whether plans record every copy segment (small instances, or `always`)."""
        n = self.tasks()
        if self.record_schedule == "never":
            return False
        if self.record_schedule == "always":
            return n <= RECORD_MAX_TASKS
        return n <= RECORD_AUTO_TASKS


# ---------------------------------------------------------------- the plan

class StragglersPlan(Plan):
    """A policy, its parameters and seed; the per-job completion times (s, job order) and, for small
    instances, every copy segment [job, task, phase, start_s, end_s, share, won]."""

    kind: str = "stragglers"
    policy: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    sim_seed: int = 0
    completion_s: list[float] = Field(default_factory=list)
    schedule: list[list[float]] | None = None


def simulate_problem(problem: StragglersProblem, policy: str, params: dict[str, Any], seed: int,
                     record: bool | None = None) -> tuple[Any, dict[str, float]]:
    """Run `policy` on the problem; return (SimResult, figures). Figures: the run's (see SimResult.figures)
    plus offered_load, jobs and tasks. Raises KeyError (unknown policy) or ValueError (bad parameter)."""
    from gpuplan.sim.tasks import simulate

    wl = problem.sim_workload()
    load = problem.offered_load()
    res = simulate(wl, problem.slots, problem.variability.build(), policy, seed=seed, params=params, load=load,
                   tick_s=problem.tick_s, monitoring=problem.monitoring, record=problem.record() if record is None else record)
    figs = res.figures(wl)
    figs.update({"offered_load": load, "jobs": float(wl.jobs), "tasks": float(wl.tasks())})
    return res, figs


def plan_from_run(problem: StragglersProblem, res: Any, figs: dict[str, float], seed: int) -> StragglersPlan:
    """Return the feasible plan stating a simulation's result."""
    from gpuplan.models.plan import Status

    sched = None
    if res.schedule is not None and len(res.schedule) <= MAX_SCHEDULE_ROWS:
        sched = [[float(j), float(t), float(p), s, e, sh, 1.0 if w else 0.0] for j, t, p, s, e, sh, w in res.schedule]
    return StragglersPlan(status=Status.FEASIBLE, policy=res.policy, params=dict(res.params), sim_seed=seed,
                          completion_s=[float(c) for c in res.completion_s], schedule=sched,
                          objective=figs["weighted_flowtime_s"], objective_name="weighted_flowtime_s",
                          predicted=figs)


# ---------------------------------------------------------------- check

def schedule_violations(problem: StragglersProblem, rows: list[list[float]], completion: list[float]) -> list[Violation]:
    """Return the violations of a recorded schedule, from the problem alone: rows name real tasks; times are
    ordered and not before the job's arrival; shares in (0, 1]; at every instant the shares held sum to at
    most N (slot capacity); no reduce copy starts before its job's last map task finished (map before
    reduce); every task has exactly one winning segment; each job completes when its last task does."""
    out: list[Violation] = []
    arr, _, maps, reds = problem.arrays
    n = len(arr)
    tol = 1e-9
    won: dict[tuple[int, int], float] = {}
    events: list[tuple[float, int, float]] = []
    for i, row in enumerate(rows):
        if len(row) != len(SCHEDULE_COLUMNS):
            out.append(Violation("schedule", f"schedule row {i} has {len(row)} fields; expected "
                                 f"{', '.join(SCHEDULE_COLUMNS)}", {"row": i}))
            continue
        j, t, ph, s, e, sh, w = row
        if not (float(j).is_integer() and 0 <= j < n) or not float(t).is_integer():
            out.append(Violation("schedule", f"schedule row {i} names job {j!r}, not one of the {n} jobs", {"row": i}))
            continue
        j, t = int(j), int(t)
        k = maps[j].size
        if not (0 <= t < k + reds[j].size) or ph != (0 if t < k else 1):
            out.append(Violation("schedule", f"schedule row {i}: job {j} has no {('map', 'reduce')[int(ph == 1)]} "
                                 f"task {t}", {"row": i}))
            continue
        if not (e >= s - tol and s >= arr[j] - tol):
            out.append(Violation("schedule_time", f"schedule row {i}: job {j} task {t} runs {s:.6g}..{e:.6g} s; a "
                                 f"copy starts at or after the job's arrival {arr[j]:.6g} s and ends after it starts",
                                 {"row": i}))
        if not (0 < sh <= 1 + tol):
            out.append(Violation("schedule_share", f"schedule row {i}: share {sh!r}; expected a part of one slot "
                                 "in (0, 1]", {"row": i}))
        if w not in (0.0, 1.0):
            out.append(Violation("schedule", f"schedule row {i}: won {w!r}; expected 0 or 1", {"row": i}))
        elif w == 1.0:
            if (j, t) in won:
                out.append(Violation("two_winners", f"job {j} task {t} finishes twice", {"job": j, "task": t}))
            won[(j, t)] = e
        if e > s:
            events.append((s, 1, sh))
            events.append((e, 0, -sh))
    if out:
        return out
    events.sort(key=lambda x: (x[0], x[1]))
    held, worst, at = 0.0, 0.0, 0.0
    for time_s, _, d in events:
        held += d
        if held > worst:
            worst, at = held, time_s
    if worst > problem.slots + 1e-6:
        out.append(Violation("capacity", f"the schedule holds {worst:.6g} slots at {at:.6g} s; the cluster has "
                             f"{problem.slots}", {"held": worst, "time_s": at}))
    for j in range(n):
        k = maps[j].size
        ends = [won.get((j, t)) for t in range(k + reds[j].size)]
        missing = [t for t, e in enumerate(ends) if e is None]
        if missing:
            out.append(Violation("unfinished_task", f"job {j}: task(s) {missing[:5]} never finish in the schedule",
                                 {"job": j, "tasks": missing[:5]}))
            continue
        map_done = max(ends[:k])
        if j < len(completion):
            out += figure_violations(f"completion_s[{j}] (from the schedule)", completion[j], max(ends))
        if reds[j].size:
            first_reduce = min((r[3] for r in rows if int(r[0]) == j and r[2] == 1), default=math.inf)
            if first_reduce < map_done - tol:
                out.append(Violation("map_before_reduce", f"job {j}: a reduce copy starts at {first_reduce:.6g} s, "
                                     f"before its map phase ends at {map_done:.6g} s", {"job": j}))
    return out


def check(problem: StragglersProblem, plan: StragglersPlan) -> list[Violation]:
    """Return the violations of `plan`: an unknown policy or parameter; the recorded schedule's capacity,
    map-before-reduce and completions (schedule_violations); a solver other than the policy or a seed other
    than sim_seed (solver_run_violations); every stated figure (completion times, predicted metrics,
    objective, parameters the policy derived, the schedule) against a re-simulation of (problem, policy,
    the solver's options (else the plan's parameters), seed); and the LP figures of the solver's stats
    (lp_bound_violations)."""
    from gpuplan.sim.tasks import POLICIES

    out: list[Violation] = []
    if plan.policy not in POLICIES:
        return [Violation("policy", f"policy {plan.policy!r} is not one of {', '.join(sorted(POLICIES))}",
                          {"policy": plan.policy})]
    if len(plan.completion_s) != len(problem.arrays[0]):
        out.append(Violation("figure", f"the plan states {len(plan.completion_s)} completion times; the problem "
                             f"has {len(problem.arrays[0])} jobs", {"field": "completion_s"}))
    if plan.schedule is not None:
        out += schedule_violations(problem, plan.schedule, plan.completion_s)
    # a solver runs its policy with its options as the parameters (the policy derives those left at 0) and
    # its seed: re-simulate with what the solver states it ran with, so the plan's params must follow
    own = {k: v for k, v in plan.params.items() if k in POLICIES[plan.policy].defaults}
    source = "params"
    if plan.solver is not None:
        out += solver_run_violations(plan)
        own, source = dict(plan.solver.options), "solver.options"
    try:
        res, figs = simulate_problem(problem, plan.policy, own, plan.sim_seed,
                                     record=plan.schedule is not None)
    except (KeyError, ValueError, TypeError) as exc:
        return out + [Violation("params", f"policy {plan.policy} cannot run with {source} {own}: {exc}",
                                {"params": own})]
    for k, v in res.params.items():
        if k not in plan.params or plan.params[k] != v:
            out.append(Violation("params", f"the plan states {k} = {plan.params.get(k)!r} for {plan.policy}; the "
                                 f"policy run with {source} {own} has {v!r}", {"param": k}))
    extra = sorted(set(plan.params) - set(res.params))
    if extra:
        out.append(Violation("params", f"the plan states parameters {extra} that {plan.policy} does not have"))
    if len(plan.completion_s) == len(res.completion_s):
        out += figure_violations("completion_s", plan.completion_s, [float(c) for c in res.completion_s])
    out += stated_figures_violations(plan, figs["weighted_flowtime_s"], figs)
    if plan.solver is not None:
        out += lp_bound_violations(problem, plan.solver.stats, figs["weighted_flowtime_s"])
    if plan.schedule is not None and res.schedule is not None:
        if len(plan.schedule) != len(res.schedule):
            out.append(Violation("figure", f"the plan records {len(plan.schedule)} copy segments; the policy "
                                 f"runs {len(res.schedule)}", {"field": "schedule"}))
        else:
            bad = next((i for i, (a, b) in enumerate(zip(plan.schedule, res.schedule))
                        if figure_violations("row", list(a), [float(x) for x in b])), None)
            if bad is not None:
                out.append(Violation("figure", f"schedule row {bad} is {plan.schedule[bad]}; re-simulated it is "
                                     f"{[float(x) for x in res.schedule[bad]]}", {"field": f"schedule[{bad}]"}))
    return out


def solver_run_violations(plan: StragglersPlan) -> list[Violation]:
    """Return the violations of what the plan's solver states it ran: every solver simulates the policy of
    its own name with its seed, so solver.name must be the plan's policy (`policy`) and solver.seed its
    sim_seed (`params`); [] when they agree. (solver.options are checked by simulating with them.)"""
    assert plan.solver is not None
    out: list[Violation] = []
    if plan.solver.name != plan.policy:
        out.append(Violation("policy", f"the plan's solver is {plan.solver.name!r} but its policy is "
                             f"{plan.policy!r}; each solver runs the policy of its name",
                             {"solver": plan.solver.name, "policy": plan.policy}))
    if plan.solver.seed != plan.sim_seed:
        out.append(Violation("params", f"the plan states solver.seed = {plan.solver.seed!r} but sim_seed = "
                             f"{plan.sim_seed!r}; the solver simulates with its seed", {"param": "sim_seed"}))
    return out


def critical_paths_s(problem: StragglersProblem) -> list[float]:
    """Return each job's critical path (s): (longest map + longest reduce task) / h(inf); no job finishes
    sooner after its arrival, however many copies its tasks run (the LP bound's F_j >= term)."""
    _, _, maps, reds = problem.arrays
    h_sup = problem.variability.build().h_limit()
    return [(float(m.max()) + (float(r.max()) if r.size else 0.0)) / h_sup for m, r in zip(maps, reds)]


def critical_path_floor(problem: StragglersProblem) -> float:
    """Return sum_j w_j x critical path_j (s): a floor both LPs of the solvers' stats hold."""
    return float(sum(wj * c for wj, c in zip(problem.arrays[1], critical_paths_s(problem))))


def lp_bound_violations(problem: StragglersProblem, stats: dict[str, Any], flowtime: float) -> list[Violation]:
    """Return `figure` violations of the LP figures a plan's solver stats state: lp_bound_s (a lower bound
    on every policy's weighted flowtime) above the recomputed `flowtime`, or either LP value (lp_bound_s,
    lp_fluid_s: the fluid LP, not a bound on one run) below the critical-path floor both LPs hold; and
    over_lp_bound unequal to flowtime / lp_bound_s. [] when they hold or the stats state none."""
    out: list[Violation] = []
    floor = critical_path_floor(problem)
    for key in ("lp_bound_s", "lp_fluid_s"):
        if key not in stats:
            continue
        value = stats[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out += figure_violations(f"solver.stats.{key}", value, floor)
        elif value < floor * (1 - 1e-5) - 1e-6:  # the LP solver's tolerance
            out.append(Violation("figure", f"the plan states solver.stats.{key} = {value:.6g}, below the "
                                 f"critical-path floor {floor:.6g} of its LP", {"field": f"solver.stats.{key}",
                                                                                "stated": value, "floor": floor}))
        elif key == "lp_bound_s" and value > flowtime * (1 + 1e-5) + 1e-6:  # the LP solver's tolerance
            out.append(Violation("figure", f"the plan states solver.stats.lp_bound_s = {value:.6g}, above its "
                                 f"weighted flowtime {flowtime:.6g}: a lower bound it is not",
                                 {"field": "solver.stats.lp_bound_s", "stated": value, "recomputed": flowtime}))
    bound = stats.get("lp_bound_s")
    if "over_lp_bound" in stats and isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0:
        out += figure_violations("solver.stats.over_lp_bound", stats["over_lp_bound"], flowtime / bound)
    return out


# ---------------------------------------------------------------- presentation

def summarize(problem: StragglersProblem, plan: StragglersPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare stragglers` prints: weighted and mean flowtime (s), machine time
    (slot-s), copies, and the gap to the LP lower bound when the solver computed one."""
    p = plan.predicted
    out: dict[str, Any] = {"policy": plan.policy}
    if "regime" in plan.params:
        out["regime"] = plan.params["regime"]
    out.update({"weighted_flowtime_s": p.get("weighted_flowtime_s"), "mean_flowtime_s": p.get("mean_flowtime_s"),
                "machine_time_s": p.get("machine_time_s"), "copies_started": p.get("copies_started")})
    stats = plan.solver.stats if plan.solver else {}
    if isinstance(stats.get("lp_bound_s"), (int, float)) and stats["lp_bound_s"] > 0:
        out["over_lp_bound"] = float(p.get("weighted_flowtime_s", math.nan)) / float(stats["lp_bound_s"])
    return out


def describe(problem: StragglersProblem, plan: StragglersPlan) -> list[Table]:
    """Return the policy's parameters and the first 50 jobs' completions as tables for `gpuplan show`."""
    arr, w, maps, reds = problem.arrays
    ids = problem.job_ids()
    rows = []
    for j in range(min(50, len(arr))):
        c = plan.completion_s[j] if j < len(plan.completion_s) else math.nan
        rows.append([ids[j], float(arr[j]), float(w[j]), int(maps[j].size), int(reds[j].size), c, c - float(arr[j])])
    params = [[k, v] for k, v in sorted(plan.params.items())] + [["seed", plan.sim_seed]]
    more = f" (first 50 of {len(arr)})" if len(arr) > 50 else ""
    return [Table(f"policy {plan.policy}", ["parameter", "value"], params),
            Table(f"jobs{more}", ["job", "arrival_s", "weight", "maps", "reduces", "completion_s", "flowtime_s"], rows)]


def draw(problem: StragglersProblem, plan: StragglersPlan, path: Any) -> None:
    """Write a PNG: a Gantt chart of every copy, one row per task (job.m0, job.r0; winning copies above,
    killed copies hatched below, bar height the slot share) when the plan records its schedule, else each
    job's flowtime against its arrival."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure
    from gpuplan.viz import PALETTE, legend_outside

    arr = problem.arrays[0]
    ids = problem.job_ids()
    if plan.schedule:
        maps = problem.arrays[2]
        rows = sorted({(int(r[0]), int(r[1])) for r in plan.schedule})
        fig, ax = plt.subplots(figsize=(14, 0.3 * len(rows) + 2))
        ypos = {jt: i for i, jt in enumerate(rows)}
        seen: set[str] = set()
        for j, t, ph, s, e, sh, w in plan.schedule:
            label = ("map" if ph == 0 else "reduce") + ("" if w else " (killed copy)")
            colour = PALETTE["forward"] if ph == 0 else PALETTE["backward"]
            y = ypos[(int(j), int(t))] + (0.12 if w else -0.22)
            ax.barh(y, e - s, left=s, height=(0.55 if w else 0.3) * max(sh, 0.2), color=colour,
                    alpha=0.9 if w else 0.35, hatch=None if w else "//", edgecolor="k", linewidth=0.3,
                    label=None if label in seen else label)
            seen.add(label)
        ax.scatter([arr[j] for j, _ in rows], [ypos[r] for r in rows], marker="|", color="k", s=80, label="arrival")
        names = [f"{ids[j]}.{'m' if t < maps[j].size else 'r'}{t if t < maps[j].size else t - maps[j].size}"
                 for j, t in rows]
        ax.set_yticks(range(len(rows)), names, fontsize=7 if len(rows) > 40 else 9)
        ax.set_xlabel("time (s)")
        ax.set_title(f"{problem.name or 'stragglers'}: {plan.policy} on {problem.slots} slots, weighted flowtime "
                     f"{plan.predicted.get('weighted_flowtime_s', math.nan):.4g} s")
        legend_outside(ax)
    else:
        fig, ax = plt.subplots(figsize=(10, 5))
        flow = np.asarray(plan.completion_s) - arr[:len(plan.completion_s)]
        ax.scatter(arr[:len(flow)], flow, s=4, color=PALETTE["forward"])
        ax.set_yscale("log")
        ax.set_xlabel("arrival (s)")
        ax.set_ylabel("flowtime (s)")
        ax.set_title(f"{problem.name or 'stragglers'}: {plan.policy}, flowtime per job")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=100)


register_model(ModelSpec("stragglers", StragglersProblem, StragglersPlan, check, summarize=summarize,
                         describe=describe, draw=draw,
                         title="Straggler scheduling: redundancy, task cloning and speculative execution"))
