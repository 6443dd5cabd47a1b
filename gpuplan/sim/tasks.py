"""The straggler simulator: jobs of parallel tasks (map, then reduce) on N slots, task copies whose speeds
vary, and pluggable policies that start, clone, restart and kill copies (the `stragglers` kind).

Built on the shared discrete-event core (gpuplan.sim.core: EventQueue, rng). A task of nominal size s
runs on a copy at speed v (drawn from the variability model when the copy starts; X = 1/v its slowdown)
for s / (v * share) seconds of progress, `share` being the part of a slot the copy holds (1 on a
non-multitasking cluster; less when machines time-share copies). A task finishes when its first copy
does; its other copies are killed then.

Two families of policies:
  allotment  (SRPT, SRPT+R, Fair, Fair+R, LAPS+R, heSRPT) recompute every job's machines at each event
             and preempt freely; with opportunistic checkpointing the fastest copy's progress is saved at
             every event and all copies (old and new) resume from it, so preemption loses nothing.
  slot-filling (SRPTMS+C, SCA, SDA, ESE, Mantri, LATE, Dolly, FIFO) start copies on free slots, never
             preempt a task's first copy, and lose a killed copy's progress.

Pure Python and numpy (models/ may import it); deterministic: the same workload, policy, parameters and
seed replay the same schedule.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from gpuplan.models.stragglers.speedup import Variability, dolly_copies, sda_expectations
from gpuplan.option_rules import OptionRule, integer, number, one_of
from gpuplan.sim.core import EventQueue, rng as make_rng

ARRIVE, FINISH, TICK, PROBE = 0, 1, 2, 3
EPS = 1e-9
MAX_EVENTS = 50_000_000  # a run past this many events is a bug, not a workload
# the rule of every policy's `max_copies`: 0 copies would leave a task unrun, and more copies of one task
# than a large cluster's slots could never run (the simulator allocates per copy)
MAX_COPIES = integer(1, 4096)
PROBABILITY = number(0, 1)  # the rule of a probability, quantile or fraction of the slots


@dataclass(frozen=True)
class Workload:
    """Jobs to simulate: arrival times (s), weights, and per job the nominal sizes (s) of its map and
    reduce tasks (a reduce task may start only after every map task of its job finished)."""

    arrival_s: np.ndarray
    weight: np.ndarray
    map_s: list[np.ndarray]
    reduce_s: list[np.ndarray]

    @property
    def jobs(self) -> int:
        """Return the number of jobs."""
        return int(self.arrival_s.size)

    def tasks(self) -> int:
        """Return the number of tasks of all jobs."""
        return int(sum(m.size for m in self.map_s) + sum(r.size for r in self.reduce_s))

    def work_s(self) -> np.ndarray:
        """Return each job's nominal work: the sum of its task sizes (s)."""
        return np.array([float(m.sum() + r.sum()) for m, r in zip(self.map_s, self.reduce_s)])


@dataclass
class SimResult:
    """What a run produced: per-job completion times (s), machine time used (slot-seconds, shares
    included), copy counts, and (when recorded) every copy segment
    (job, task, phase, start_s, end_s, share, won): phase 0 map, 1 reduce; won marks the segment that
    finished its task."""

    completion_s: np.ndarray
    machine_time_s: float
    copies_started: int
    copies_killed: int
    events: int
    policy: str
    params: dict[str, Any]
    schedule: list[tuple[int, int, int, float, float, float, bool]] | None = None

    def figures(self, workload: Workload) -> dict[str, float]:
        """Return the run's figures: weighted_flowtime_s (sum of w_j (C_j - a_j)), mean_flowtime_s,
        mean_slowdown (flowtime over nominal work spread on one slot per task), machine_time_s,
        useful_time_s (sum of nominal task sizes), makespan_s, copies_started, copies_killed."""
        flow = self.completion_s - workload.arrival_s
        work = workload.work_s()
        crit = np.array([float(m.max(initial=0.0) + r.max(initial=0.0)) for m, r in
                         zip(workload.map_s, workload.reduce_s)])
        return {
            "weighted_flowtime_s": float(np.sum(workload.weight * flow)),
            "mean_flowtime_s": float(flow.mean()) if flow.size else 0.0,
            "mean_slowdown": float(np.mean(flow / np.maximum(crit, EPS))) if flow.size else 0.0,
            "machine_time_s": float(self.machine_time_s),
            "useful_time_s": float(work.sum()),
            "makespan_s": float(self.completion_s.max() - workload.arrival_s.min()) if flow.size else 0.0,
            "copies_started": float(self.copies_started),
            "copies_killed": float(self.copies_killed),
        }


class _Copy:
    __slots__ = ("speed", "share", "t0", "p0", "seg")

    def __init__(self, speed: float, share: float, t0: float, p0: float) -> None:
        self.speed, self.share, self.t0, self.p0, self.seg = speed, share, t0, p0, t0


class _Task:
    __slots__ = ("job", "idx", "phase", "size", "prog", "copies", "ver", "done", "restarts", "spec", "first_s")

    def __init__(self, job: "_Job", idx: int, phase: int, size: float) -> None:
        self.job, self.idx, self.phase, self.size = job, idx, phase, size
        self.prog = 0.0
        self.copies: list[_Copy] = []
        self.ver = 0
        self.done = False
        self.restarts = 0
        self.spec = False
        self.first_s = math.nan


class _Job:
    __slots__ = ("idx", "arrival", "weight", "maps", "reduces", "maps_left", "left", "remaining", "pending",
                 "running", "copies_r")

    def __init__(self, idx: int, arrival: float, weight: float, maps: np.ndarray, reduces: np.ndarray) -> None:
        self.idx, self.arrival, self.weight = idx, arrival, weight
        self.maps = [_Task(self, i, 0, float(s)) for i, s in enumerate(maps)]
        self.reduces = [_Task(self, len(self.maps) + i, 1, float(s)) for i, s in enumerate(reduces)]
        self.maps_left = len(self.maps)
        self.left = len(self.maps) + len(self.reduces)
        self.remaining = float(maps.sum() + reduces.sum())
        self.pending: deque[_Task] = deque(self.maps)
        self.running: dict[_Task, None] = {}
        self.copies_r = 0  # copies per task a cloning policy chose for this job (0: not chosen yet)


def copy_progress(task: _Task, c: _Copy, now: float) -> float:
    """Return the fraction of `task` copy `c` has done at `now` (s)."""
    return c.p0 + (now - c.t0) * c.speed * c.share / task.size


def copy_remaining_s(task: _Task, c: _Copy, now: float) -> float:
    """Return the seconds copy `c` still needs to finish `task` at its current speed and share."""
    return (1.0 - copy_progress(task, c, now)) * task.size / (c.speed * c.share)


def residual_factor(var: Variability, e: float) -> float:
    """Return E[X - e | X > e] for a copy's slowdown X after it ran e task sizes without finishing: the
    expected remaining time (in task sizes) when only the elapsed time is observed. Pareto: for e >= x_m,
    alpha e / (alpha - 1) - e (it grows with e: decreasing hazard); uniform speeds: closed form."""
    if var.model == "pareto":
        return max(e, var.x_m) * var.alpha / (var.alpha - 1) - e
    lo, hi = 1 / (1 + var.a), 1 / (1 - var.a) if var.a < 1 else math.inf
    if var.a == 0:
        return max(0.0, 1.0 - e)
    ee = min(max(e, lo), hi * (1 - 1e-12))
    mean = math.log(hi / ee) / (1 / ee - 1 / hi)
    return max(0.0, mean - e)


class Sim:
    """One run: the state of jobs, tasks and copies, the event queue, and the primitives policies use
    (start_copy, kill_copy, set_share, checkpoint). `free` is the unheld slot capacity."""

    def __init__(self, workload: Workload, slots: int, var: Variability, policy: "Policy", seed: int,
                 record: bool, tick_s: float, monitoring: str = "elapsed") -> None:
        self.wl, self.N, self.var, self.policy = workload, slots, var, policy
        self.exact = monitoring == "progress"
        self.rng = make_rng(seed)
        self.q: EventQueue[tuple[Any, ...]] = EventQueue()
        self.now = 0.0
        self.busy = 0.0
        self.tick_s = tick_s
        self.resume = policy.checkpoint
        self.jobs_all: list[_Job | None] = [None] * workload.jobs
        self.active: dict[_Job, None] = {}
        self.waiting: dict[_Job, None] = {}   # jobs with pending runnable tasks
        self.running: dict[_Task, None] = {}  # tasks with at least one copy
        self.multi: dict[_Task, None] = {}    # tasks with two or more copies
        self.copies = 0
        self.completion = np.full(workload.jobs, np.nan)
        self.machine_time = 0.0
        self.started = 0
        self.killed = 0
        self.schedule: list[tuple[int, int, int, float, float, float, bool]] | None = [] if record else None
        self._ticking = False

    # -- queries

    @property
    def free(self) -> float:
        """Return the slot capacity not held by any copy."""
        return self.N - self.busy

    def t_rem(self, task: _Task, c: _Copy) -> float:
        """Return what a monitoring policy estimates copy `c` of `task` still needs (s): the exact remaining
        time with progress reports (`monitoring: progress`), else the expected residual time given only
        how long the copy has run (`monitoring: elapsed`)."""
        if self.exact:
            return copy_remaining_s(task, c, self.now)
        e = (self.now - c.t0) * c.share / task.size
        return task.size * residual_factor(self.var, e) / c.share

    def observed_progress(self, task: _Task, c: _Copy) -> float:
        """Return the progress fraction a monitoring policy sees for copy `c`: exact with progress reports,
        else elapsed / (elapsed + estimated remaining)."""
        if self.exact:
            return copy_progress(task, c, self.now)
        el = self.now - c.t0
        return el / (el + self.t_rem(task, c)) if el > 0 else 0.0

    def load_now(self) -> int:
        """Return the number of jobs in the system."""
        return len(self.active)

    # -- primitives

    def _segment(self, task: _Task, c: _Copy, won: bool) -> None:
        self.machine_time += (self.now - c.seg) * c.share
        if self.schedule is not None:
            self.schedule.append((task.job.idx, task.idx, task.phase, c.seg, self.now, c.share, won))
        c.seg = self.now

    def start_copy(self, task: _Task, share: float = 1.0, quantile: float = 0.0, resched: bool = True) -> _Copy:
        """Start a copy of `task` holding `share` of a slot; its speed is drawn now (from the speeds above
        the `quantile` when > 0). Returns the copy."""
        job = task.job
        p0 = task.prog if self.resume else 0.0
        if self.resume and task.copies:
            p0 = max(p0, max(copy_progress(task, c, self.now) for c in task.copies))
        c = _Copy(self.var.speed(self.rng, quantile), share, self.now, p0)
        if not task.copies:
            try:
                job.pending.remove(task)
            except ValueError:
                pass
            if not job.pending:
                self.waiting.pop(job, None)
            job.running[task] = None
            self.running[task] = None
            if math.isnan(task.first_s):
                task.first_s = self.now
        else:
            self.multi[task] = None
        task.copies.append(c)
        self.busy += share
        self.copies += 1
        self.started += 1
        if resched:
            self.reschedule(task)
        return c

    def kill_copy(self, task: _Task, c: _Copy, resched: bool = True) -> None:
        """Kill copy `c` of `task`; with checkpointing its progress is kept, else lost with it. A task left
        without copies goes back to the front of its job's pending tasks."""
        if self.resume:
            task.prog = max(task.prog, copy_progress(task, c, self.now))
        self._segment(task, c, False)
        task.copies.remove(c)
        self.busy -= c.share
        self.copies -= 1
        self.killed += 1
        if len(task.copies) < 2:
            self.multi.pop(task, None)
        if not task.copies:
            job = task.job
            del job.running[task]
            del self.running[task]
            job.pending.appendleft(task)
            self.waiting[job] = None
            task.ver += 1
        elif resched:
            self.reschedule(task)

    def set_share(self, task: _Task, c: _Copy, share: float) -> None:
        """Change the slot share of a running copy (its progress so far is kept)."""
        if abs(share - c.share) <= EPS:
            return
        c.p0 = copy_progress(task, c, self.now)
        c.t0 = self.now
        self._segment(task, c, False)
        self.busy += share - c.share
        c.share = share

    def checkpoint(self, task: _Task) -> None:
        """Save the fastest copy's progress of `task` and restart every copy from it (opportunistic
        checkpointing)."""
        if not task.copies:
            return
        p = max(copy_progress(task, c, self.now) for c in task.copies)
        task.prog = p
        for c in task.copies:
            c.p0, c.t0 = p, self.now

    def reschedule(self, task: _Task) -> None:
        """Push the event of `task`'s next completion (its fastest copy), invalidating the previous one."""
        task.ver += 1
        if task.copies:
            now = self.now
            t = min(c.t0 + max(0.0, 1.0 - c.p0) * task.size / (c.speed * c.share) for c in task.copies)
            self.q.push(max(t, now), (FINISH, task, task.ver))

    # -- events

    def _finish(self, task: _Task) -> None:
        now = self.now
        best = min(task.copies, key=lambda c: c.t0 + max(0.0, 1.0 - c.p0) * task.size / (c.speed * c.share))
        for c in task.copies:
            self._segment(task, c, c is best)
            self.busy -= c.share
        self.killed += len(task.copies) - 1
        self.copies -= len(task.copies)
        task.copies = []
        task.done = True
        task.prog = 1.0
        self.multi.pop(task, None)
        job = task.job
        del job.running[task]
        del self.running[task]
        job.left -= 1
        job.remaining -= task.size
        if task.phase == 0:
            job.maps_left -= 1
            if job.maps_left == 0 and job.reduces:
                job.pending.extend(job.reduces)
                job.copies_r = 0
                self.waiting[job] = None
        if job.left == 0:
            self.completion[job.idx] = now
            del self.active[job]
            self.waiting.pop(job, None)
            self.policy.on_done(self, job)

    def _arrive(self, j: int) -> None:
        wl = self.wl
        job = _Job(j, float(wl.arrival_s[j]), float(wl.weight[j]), wl.map_s[j], wl.reduce_s[j])
        self.jobs_all[j] = job
        self.active[job] = None
        self.waiting[job] = None
        self.policy.on_arrival(self, job)
        if self.policy.tick and not self._ticking:
            self._ticking = True
            self.q.push(self.now + self.tick_s, (TICK,))

    def run(self) -> SimResult:
        """Simulate every job to completion; return the result."""
        wl = self.wl
        order = np.argsort(wl.arrival_s, kind="stable")
        nxt = 0
        if wl.jobs:
            self.q.push(float(wl.arrival_s[order[0]]), (ARRIVE, int(order[0])))
            nxt = 1
        events = 0
        ticks, tick_budget = 0, 20 * (wl.tasks() + wl.jobs) + 100_000
        policy = self.policy
        while self.q:
            t = self.q.peek_time()
            batch = self.q.pop_until(t)
            self.now = t
            acted = False
            tick = False
            for ev in batch:
                kind = ev.payload[0]
                events += 1
                if kind == FINISH:
                    task, ver = ev.payload[1], ev.payload[2]
                    if ver != task.ver or task.done or not task.copies:
                        continue
                    self._finish(task)
                    acted = True
                elif kind == ARRIVE:
                    self._arrive(ev.payload[1])
                    if nxt < wl.jobs:
                        self.q.push(float(wl.arrival_s[order[nxt]]), (ARRIVE, int(order[nxt])))
                        nxt += 1
                    acted = True
                elif kind == TICK:
                    tick = True
                    acted = True
                    ticks += 1
                    if ticks > tick_budget:
                        raise ValueError(f"{policy.name} passed {tick_budget:,} monitoring ticks of {self.tick_s:.3g} s "
                                         f"at t = {t:.4g} s; raise tick_s (a task runs far longer than the period)")
                    if self.active:
                        self.q.push(t + self.tick_s, (TICK,))
                    else:
                        self._ticking = False
                elif kind == PROBE:
                    task, c = ev.payload[1], ev.payload[2]
                    if not task.done and c in task.copies:
                        policy.on_probe(self, task)
                        acted = True
            if events > MAX_EVENTS:
                raise RuntimeError(f"simulation passed {MAX_EVENTS} events; the policy does not make progress")
            if acted:
                policy.decide(self, tick)
                if self.busy > self.N + 1e-6:
                    raise AssertionError(f"policy {policy.name} holds {self.busy} slots of {self.N} at {t}")
        if np.isnan(self.completion).any():
            raise RuntimeError(f"policy {policy.name} left {int(np.isnan(self.completion).sum())} jobs unfinished")
        return SimResult(self.completion, self.machine_time, self.started, self.killed, events, policy.name,
                         dict(policy.params), self.schedule)


# ---------------------------------------------------------------- policies

@dataclass
class Context:
    """What a policy may know besides the running state: the variability model, the slots, the offered
    load (fraction of slot capacity), the tick period (s) and the median task count of a job."""

    var: Variability
    slots: int
    load: float
    tick_s: float
    median_tasks: int


class Policy:
    """Base of every policy: `decide` runs after each batch of simultaneous events (tick True at a
    monitoring tick); `checkpoint` selects opportunistic checkpointing (allotment policies). `defaults`
    are the parameters it reads, `rules` the domain of each (the registry refuses values outside it)."""

    name = "policy"
    checkpoint = False
    tick = False
    defaults: dict[str, Any] = {}
    rules: dict[str, OptionRule] = {}

    def __init__(self, ctx: Context, **params: Any) -> None:
        self.ctx = ctx
        self.params = {**self.defaults, **params}

    def on_arrival(self, sim: Sim, job: _Job) -> None:
        """Called when `job` arrives (before decide)."""

    def on_done(self, sim: Sim, job: _Job) -> None:
        """Called when `job` completes."""

    def on_probe(self, sim: Sim, task: _Task) -> None:
        """Called at a probe event a policy scheduled for `task`."""

    def decide(self, sim: Sim, tick: bool) -> None:
        """Start, clone, restart or kill copies; return None."""
        raise NotImplementedError


# -- allotment policies (preemptive, opportunistic checkpointing)

def _runnable(job: _Job) -> list[_Task]:
    """Return the tasks of `job` that may run now: running ones first (index order), then pending."""
    return sorted(job.running, key=lambda t: t.idx) + sorted(job.pending, key=lambda t: t.idx)


def spread(tasks: list[_Task], x: float, redundant: bool, multitask: bool, max_copies: int) -> list[tuple[_Task, int, float]]:
    """Return (task, copies, share) turning `x` machines for a job into copies of its runnable `tasks`.

    Integer mode (multitask False): floor(x) copies of share 1; fewer machines than tasks run the first
    floor(x) tasks; more become redundant copies spread evenly (at most max_copies per task). Multitask:
    x < k tasks time-share x (share x/k each); x >= k with redundancy runs ceil(x) copies (capped), each
    of share x / copies."""
    k = len(tasks)
    if k == 0 or x <= EPS:
        return []
    if not multitask:
        n = int(math.floor(x + EPS))
        if n <= k or not redundant:
            return [(t, 1, 1.0) for t in tasks[:min(n, k)]]
        per, extra = divmod(min(n, k * max_copies), k)
        return [(t, per + (1 if i < extra else 0), 1.0) for i, t in enumerate(tasks)]
    if x < k - EPS or not redundant:
        share = min(1.0, x / k)
        return [(t, 1, share) for t in tasks]
    total = min(int(math.ceil(x - EPS)), k * max_copies)
    share = min(1.0, x / total)
    per, extra = divmod(total, k)
    return [(t, per + (1 if i < extra else 0), share) for i, t in enumerate(tasks)]


class AllotmentPolicy(Policy):
    """Recompute each job's machines at every event, then reconcile copies (keeping the fastest)."""

    checkpoint = True
    redundant = True
    multitask = False
    defaults = {"max_copies": 8}
    rules = {"max_copies": MAX_COPIES}

    def allot(self, sim: Sim) -> list[tuple[_Task, int, float]]:
        """Return the desired (task, copies, share) of this event."""
        raise NotImplementedError

    def decide(self, sim: Sim, tick: bool) -> None:
        for task in list(sim.multi):
            sim.checkpoint(task)
        want = self.allot(sim)
        desired = {t: (c, s) for t, c, s in want}
        for task in list(sim.running):
            if task not in desired:
                for c in list(task.copies):
                    sim.kill_copy(task, c, resched=False)
        touched = []
        for task, (n, share) in desired.items():  # shrink first, so capacity is free before growing
            if len(task.copies) > n:
                for c in sorted(task.copies, key=lambda c: c.speed)[:len(task.copies) - n]:
                    sim.kill_copy(task, c, resched=False)
                touched.append(task)
            for c in task.copies:
                if c.share > share + EPS:
                    sim.set_share(task, c, share)
                    touched.append(task)
        for task, (n, share) in desired.items():
            for c in task.copies:
                if c.share < share - EPS:
                    sim.set_share(task, c, share)
                    touched.append(task)
            while len(task.copies) < n:
                sim.start_copy(task, share, resched=False)
                touched.append(task)
        seen: set[int] = set()
        for task in touched:
            if id(task) not in seen and not task.done:
                seen.add(id(task))
                sim.reschedule(task)


def _srpt_order(sim: Sim, weighted: bool) -> list[_Job]:
    if weighted:
        return sorted(sim.active, key=lambda j: (j.remaining / j.weight, j.arrival, j.idx))
    return sorted(sim.active, key=lambda j: (j.remaining, j.arrival, j.idx))


class SRPT(AllotmentPolicy):
    """SRPT (no redundancy): jobs by smallest remaining work get one slot per runnable task, preemptive-resume."""

    name = "srpt"
    redundant = False
    defaults: dict[str, Any] = {}
    rules: dict[str, OptionRule] = {}

    def allot(self, sim: Sim) -> list[tuple[_Task, int, float]]:
        free = sim.N
        out: list[tuple[_Task, int, float]] = []
        jobs = _srpt_order(sim, False)
        groups = []
        for job in jobs:
            if free <= 0:
                break
            tasks = _runnable(job)[:free]
            free -= len(tasks)
            groups.append(tasks)
            out += [(t, 1, 1.0) for t in tasks]
        if self.redundant and free > 0 and out:
            cap = int(self.params.get("max_copies", 1))
            T = len(out)
            base = min(cap, sim.N // T)
            left = sim.N - base * T if base < cap else 0
            copies = [base] * T
            for i in range(T):  # the leftover machines go to the smallest jobs' tasks (SRPT order)
                if left <= 0:
                    break
                if copies[i] < cap:
                    copies[i] += 1
                    left -= 1
            out = [(t, c, 1.0) for (t, _, _), c in zip(out, copies)]
        return out


class SRPTR(SRPT):
    """SRPT+R (Xu et al., TPDS 2019): SRPT order; when fewer runnable tasks than machines, every task gets
    floor(N/T) copies and the leftover machines go to the smallest jobs (even spread: concave h)."""

    name = "srpt-r"
    redundant = True
    defaults = {"max_copies": 8}
    rules = {"max_copies": MAX_COPIES}


class FairR(AllotmentPolicy):
    """Fair+R (Xu et al.): every job gets N/n(t) machines of a multitasking cluster, as redundant copies
    when the share exceeds its runnable tasks."""

    name = "fair-r"
    multitask = True

    def shares(self, sim: Sim, jobs: list[_Job]) -> list[float]:
        """Return the machines of each job in `jobs`."""
        return [sim.N / len(jobs)] * len(jobs) if jobs else []

    def chosen(self, sim: Sim) -> list[_Job]:
        """Return the jobs that share the cluster now."""
        return list(sim.active)

    def allot(self, sim: Sim) -> list[tuple[_Task, int, float]]:
        jobs = self.chosen(sim)
        out: list[tuple[_Task, int, float]] = []
        for job, x in zip(jobs, self.shares(sim, jobs)):
            out += spread(_runnable(job), x, self.redundant, True, int(self.params.get("max_copies", 1)))
        return out


class Fair(FairR):
    """Fair sharing without redundancy: max-min fair machines (water-filling, at most one per runnable
    task), time-shared."""

    name = "fair"
    redundant = False
    defaults: dict[str, Any] = {}
    rules: dict[str, OptionRule] = {}

    def shares(self, sim: Sim, jobs: list[_Job]) -> list[float]:
        caps = [len(j.running) + len(j.pending) for j in jobs]
        out = [0.0] * len(jobs)
        left, todo = float(sim.N), sorted(range(len(jobs)), key=lambda i: caps[i])
        while todo:
            level = left / len(todo)
            i = todo[0]
            if caps[i] <= level:
                out[i] = caps[i]
                left -= caps[i]
                todo.pop(0)
            else:
                for i in todo:
                    out[i] = level
                break
        return out


class LAPSR(FairR):
    """LAPS+R(beta) (Xu et al.): the ceil(beta n(t)) latest-arrived jobs share the cluster equally, as
    redundant copies."""

    name = "laps-r"
    defaults = {"max_copies": 8, "beta": 0.5}
    rules = {"max_copies": MAX_COPIES, "beta": number(0, 1, low_open=True)}  # the latest share of the jobs

    def chosen(self, sim: Sim) -> list[_Job]:
        jobs = list(sim.active)  # arrival order
        k = max(1, math.ceil(float(self.params["beta"]) * len(jobs) - EPS)) if jobs else 0
        return jobs[len(jobs) - k:]


def hesrpt_exponent(var: Variability, slots: int) -> float:
    """Return p of the power-law speedup s(k) = k^p closest (least squares on logs, k = 2..min(slots, 16))
    to h; clipped to [0.05, 0.95] (heSRPT needs p < 1)."""
    ks = np.arange(2, max(3, min(slots, 16) + 1))
    logs = np.log(ks)
    p = float(np.sum(logs * np.log([var.h(int(k)) for k in ks])) / np.sum(logs * logs))
    return min(0.95, max(0.05, p))


class HeSRPT(FairR):
    """heSRPT (Berg, Vesilo, Harchol-Balter): with M jobs sorted by remaining size, largest first, job i gets
    theta_i = (i/M)^c - ((i-1)/M)^c of the machines, c = 1/(1-p) for s(k) = k^p; optimal flowtime for known
    sizes with that concave speedup. p is fitted to h."""

    name = "hesrpt"
    defaults = {"max_copies": 8, "p": 0.0}
    rules = {"max_copies": MAX_COPIES,  # p: the speedup exponent of k^p (c = 1/(1-p) needs p < 1)
             "p": number(0, 1, low_open=True, high_open=True, special={0: "automatic: fitted to h"})}

    def chosen(self, sim: Sim) -> list[_Job]:
        return sorted(sim.active, key=lambda j: (-j.remaining, -j.arrival, -j.idx))

    def shares(self, sim: Sim, jobs: list[_Job]) -> list[float]:
        p = float(self.params["p"]) or hesrpt_exponent(self.ctx.var, sim.N)
        c = 1.0 / (1.0 - p)
        M = len(jobs)
        return [sim.N * ((i / M) ** c - ((i - 1) / M) ** c) for i in range(1, M + 1)]


# -- slot-filling policies (non-preemptive first copies, no checkpointing)

def _fifo_key(j: _Job) -> tuple[float, int]:
    return (j.arrival, j.idx)


def _wsrpt_key(j: _Job) -> tuple[float, float, int]:
    return (j.remaining / j.weight, j.arrival, j.idx)


class SlotPolicy(Policy):
    """Start pending tasks on free slots, jobs in `key` order (FIFO by default), `copies_for` copies each."""

    key: Callable[[_Job], Any] = staticmethod(_fifo_key)

    def copies_for(self, sim: Sim, job: _Job, task: _Task) -> int:
        """Return how many copies to start for a pending task (1 without cloning)."""
        return 1

    def fill(self, sim: Sim) -> None:
        """Start pending tasks while slots are free, the best job (by key) first."""
        while sim.waiting and sim.free >= 1 - EPS:
            job = min(sim.waiting, key=self.key)
            while job.pending and sim.free >= 1 - EPS:
                task = job.pending[0]
                n = max(1, min(self.copies_for(sim, job, task), int(sim.free + EPS)))
                for _ in range(n):
                    sim.start_copy(task, resched=False)
                sim.reschedule(task)
                self.started(sim, task)

    def started(self, sim: Sim, task: _Task) -> None:
        """Called after a pending task's copies started."""

    def decide(self, sim: Sim, tick: bool) -> None:
        self.fill(sim)


class FIFO(SlotPolicy):
    """FIFO: jobs in arrival order, one copy per task, no speculation."""

    name = "fifo"


def _elapsed(sim: Sim, c: _Copy) -> float:
    return sim.now - c.t0


def kill_slower_copies(sim: Sim) -> None:
    """For every task with several copies, keep the copy that finishes first and kill the rest."""
    for task in list(sim.multi):
        best = min(task.copies, key=lambda c: sim.t_rem(task, c))
        for c in list(task.copies):
            if c is not best:
                sim.kill_copy(task, c, resched=False)
        sim.reschedule(task)


def mantri_restarts(sim: Sim, var: Variability, delta_s: float, max_restarts: int) -> None:
    """Mantri's rule while tasks wait for slots: kill and restart a copy whose remaining time exceeds a fresh
    copy's mean by more than one period `delta_s` (s; t_rem > E[t_new] + delta_s), at most `max_restarts`
    times a task."""
    mean = var.mean_factor()
    for task in list(sim.running):
        if len(task.copies) != 1 or task.restarts >= max_restarts:
            continue
        c = task.copies[0]
        if _elapsed(sim, c) < delta_s - EPS:
            continue
        if sim.t_rem(task, c) > mean * task.size + delta_s:
            sim.kill_copy(task, c, resched=False)
            task.restarts += 1
            sim.start_copy(task)


def mantri_duplicate_ok(sim: Sim, var: Variability, task: _Task, delta: float) -> tuple[bool, float]:
    """Return (passes Mantri's resource test, the task's remaining time in s): with c copies running,
    P(t_rem > t_new (c+1)/c) > delta, t_rem the best copy's remaining time, t_new a fresh copy's time."""
    c = len(task.copies)
    t_rem = min(sim.t_rem(task, cp) for cp in task.copies)
    return var.cdf(t_rem * c / ((c + 1) * task.size)) > delta, t_rem


class Mantri(SlotPolicy):
    """Mantri (Ananthanarayanan et al., OSDI 2010) on FIFO job order: every period T (the simulator's tick_s),
    kill all but each task's fastest copy; while tasks wait, restart a copy with t_rem > E[t_new] + T (at
    most `max_restarts` = 3 times); with free slots and nothing waiting, duplicate a task when
    P(t_rem > t_new (c+1)/c) > delta (the option `delta`, a probability: 0.25) and E[t_new] - t_rem < rho T
    (rho = 3). Progress reports are exact after one period."""

    name = "mantri"
    tick = True
    defaults = {"delta": 0.25, "rho": 3.0, "max_restarts": 3}
    rules = {"delta": PROBABILITY,  # the duplicate test's threshold on P(t_rem > t_new (c+1)/c); the period is tick_s
             "rho": number(0),      # E[t_new] - t_rem < rho periods
             "max_restarts": integer(0)}

    def decide(self, sim: Sim, tick: bool) -> None:
        var, d = self.ctx.var, self.ctx.tick_s
        if tick:
            kill_slower_copies(sim)
            if sim.waiting:
                mantri_restarts(sim, var, d, int(self.params["max_restarts"]))
        self.fill(sim)
        if not sim.waiting and sim.free >= 1 - EPS:
            self.duplicate(sim)

    def duplicate(self, sim: Sim) -> None:
        """Start one more copy of the tasks that pass Mantri's duplicate tests, longest remaining first."""
        var, d = self.ctx.var, self.ctx.tick_s
        mean = var.mean_factor()
        cands = []
        for task in sim.running:
            if any(_elapsed(sim, c) < d - EPS for c in task.copies):
                continue
            ok, t_rem = mantri_duplicate_ok(sim, var, task, float(self.params["delta"]))
            if ok and mean * task.size - t_rem < float(self.params["rho"]) * d:
                cands.append((-t_rem, task.job.idx, task.idx, task))
        for *_, task in sorted(cands, key=lambda x: x[:3]):
            if sim.free < 1 - EPS:
                break
            sim.start_copy(task)


class LATE(SlotPolicy):
    """LATE (Zaharia et al., OSDI 2008) on FIFO job order: with free slots and no pending task, speculate the
    running task with the longest estimated time left among those whose progress rate is below the 25th
    percentile, at most one speculative copy per task, speculative copies at most 10% of the slots, each
    placed on a node faster than the 25th percentile (its speed drawn above that quantile)."""

    name = "late"
    tick = True
    defaults = {"slow_task": 0.25, "slow_node": 0.25, "cap": 0.1}
    rules = {"slow_task": PROBABILITY, "slow_node": PROBABILITY,  # quantiles of progress rates, of node speeds
             "cap": PROBABILITY}                                  # speculative copies, a fraction of the slots

    def decide(self, sim: Sim, tick: bool) -> None:
        self.fill(sim)
        if sim.waiting or sim.free < 1 - EPS or not sim.running:
            return
        now, d = sim.now, self.ctx.tick_s
        rates = []
        for task in sim.running:
            for c in task.copies:
                el = now - c.t0
                if el >= d - EPS:
                    rates.append(sim.observed_progress(task, c) / el)
        if not rates:
            return
        thresh = float(np.quantile(rates, float(self.params["slow_task"])))
        spec_running = sum(1 for t in sim.multi)
        cap = max(1, int(float(self.params["cap"]) * sim.N))
        cands = []
        for task in sim.running:
            if task.spec or len(task.copies) != 1:
                continue
            c = task.copies[0]
            el = now - c.t0
            if el < d - EPS:
                continue
            rate = sim.observed_progress(task, c) / el
            if rate < thresh:
                cands.append((-sim.t_rem(task, c), task.job.idx, task.idx, task))
        for *_, task in sorted(cands, key=lambda x: x[:3]):
            if sim.free < 1 - EPS or spec_running >= cap:
                break
            sim.start_copy(task, quantile=float(self.params["slow_node"]))
            task.spec = True
            spec_running += 1


class Dolly(SlotPolicy):
    """Dolly (Ananthanarayanan et al., NSDI 2013) on FIFO job order: a small job (at most `small_tasks` tasks)
    runs every task as c clones, c the fewest with 1 - (1 - p^c)^n <= target, within a budget of `budget`
    of the slots for extra copies."""

    name = "dolly"
    defaults = {"p": 0.05, "target": 0.05, "max_copies": 3, "budget": 0.05, "small_tasks": 10}
    rules = {"p": PROBABILITY, "target": PROBABILITY,  # a copy's, a job's straggler probability
             "max_copies": MAX_COPIES, "budget": PROBABILITY,  # budget: extra copies, a fraction of the slots
             "small_tasks": integer(1, special={0: "no job is cloned"})}  # the largest job (tasks) cloned

    def copies_for(self, sim: Sim, job: _Job, task: _Task) -> int:
        n = len(job.maps) + len(job.reduces)
        if n > int(self.params["small_tasks"]):
            return 1
        c = dolly_copies(float(self.params["p"]), n, float(self.params["target"]), int(self.params["max_copies"]))
        extra_now = sim.copies - len(sim.running)
        room = int(math.floor(float(self.params["budget"]) * sim.N + EPS)) - extra_now
        return 1 + max(0, min(c - 1, room))


def reclaim_clones(sim: Sim, key: Callable[[_Job], Any]) -> None:
    """While a pending task waits and no slot is free, kill one clone (a copy beyond a task's first) of the
    lowest-priority job by `key`, the copy that has shown the least progress."""
    while sim.waiting and sim.free < 1 - EPS and sim.multi:
        task = max(sim.multi, key=lambda t: (key(t.job), t.idx))
        c = min(task.copies, key=lambda c: sim.observed_progress(task, c))
        sim.kill_copy(task, c)


class SRPTMSC(SlotPolicy):
    """SRPTMS+C (Xu & Lau, ICDCS 2015): weighted SRPT order (highest w_j / remaining work first), map tasks
    before reduce; every pending task gets one copy in that order; machines left over become clones of the
    top-priority jobs' running tasks, spread evenly over a job's tasks, up to the copies r whose marginal
    speedup h(r) - h(r-1) is at least eps. Clones are given back (killed) when a pending task needs a slot."""

    name = "srptms-c"
    key = staticmethod(_wsrpt_key)
    defaults = {"eps": 0.1}
    # the least marginal speedup h(r) - h(r-1) of one more copy: above 1 too (pareto alpha < 1.5 has
    # h(2) - h(1) = 1 / (2 (alpha - 1)) > 1); 0: as many copies as max_copies() allows (64)
    rules = {"eps": number(0)}

    def max_copies(self) -> int:
        """Return the most copies per task: the largest r with h(r) - h(r-1) >= eps (at least 1)."""
        var, eps = self.ctx.var, float(self.params["eps"])
        r = 1
        while r < 64 and var.h(r + 1) - var.h(r) >= eps - EPS:
            r += 1
        return r

    def decide(self, sim: Sim, tick: bool) -> None:
        reclaim_clones(sim, self.key)
        self.fill(sim)
        if sim.waiting or sim.free < 1 - EPS:
            return
        cap = self.max_copies()
        if cap <= 1:
            return
        for job in sorted({t.job: None for t in sim.running}, key=self.key):
            tasks = sorted(job.running, key=lambda t: t.idx)
            for level in range(2, cap + 1):
                for task in tasks:
                    if len(task.copies) < level:
                        if sim.free < 1 - EPS:
                            return
                        sim.start_copy(task)


class SCA(SlotPolicy):
    """SCA, the Smart Cloning Algorithm (Xu & Lau, INFOCOM 2015) for light load, FIFO job order. Its program
    (research note 4.3): choose r_i copies per task of every job i in the system to maximise
    sum_i -w_i E[T_job(m_i, r_i)] s_i - gamma m_i r_i E[min_r] s_i subject to sum_i m_i r_i <= N (s_i the mean
    task size), solved by greedy marginal allocation (E[T_job] is convex decreasing in r). The program's job
    set changes at arrivals and departures, so it is re-solved there (`resolve` 1, the default): when a job's
    phase starts its m pending tasks get the r maximising its utility within the free slots; with idle slots
    and nothing pending, the running jobs' remaining tasks are raised from r to r + 1 copies, the job with the
    best marginal utility per extra slot first, while it grows and fits. Clones are given back when a pending
    task needs a slot. `resolve` 0 decides once per phase start (no re-solve at departures)."""

    name = "sca"
    defaults = {"gamma": 0.1, "max_copies": 4, "resolve": 1}
    rules = {"gamma": number(0), "max_copies": MAX_COPIES, "resolve": one_of(0, 1)}  # gamma: machine time's weight

    def decide(self, sim: Sim, tick: bool) -> None:
        reclaim_clones(sim, _fifo_key)  # re-solving at an arrival: first copies before clones
        self.fill(sim)
        if int(self.params["resolve"]) and not sim.waiting and sim.free >= 1 - EPS:
            self.top_up(sim)

    def utility(self, job: _Job, m: int, r: int, s: float) -> float:
        """Return SCA's utility of running m tasks of mean size s (s) on r copies each."""
        var = self.ctx.var
        return -job.weight * var.job_time(m, r) * s - float(self.params["gamma"]) * m * r * var.mean_min_factor(r) * s

    def top_up(self, sim: Sim) -> None:
        """Re-solve at a departure by greedy marginal allocation: with slots idle and nothing pending, among
        the running jobs whose remaining m tasks can go from r to r + 1 copies within the free slots and gain
        utility, raise the one with the largest gain per extra slot (ties: FIFO), until none qualifies."""
        cap = int(self.params["max_copies"])
        jobs = sorted({t.job: None for t in sim.running}, key=_fifo_key)
        while jobs:
            best: tuple[float, int, _Job, int] | None = None
            for i, job in enumerate(jobs):
                tasks = list(job.running)
                if not tasks:
                    continue
                m = len(tasks)
                r = min(len(t.copies) for t in tasks)
                need = sum(max(0, r + 1 - len(t.copies)) for t in tasks)
                if r >= cap or need < 1 or need > sim.free + EPS:
                    continue
                s = sum(t.size for t in tasks) / m
                gain = self.utility(job, m, r + 1, s) - self.utility(job, m, r, s)
                if gain <= EPS:
                    continue
                key = (-gain / need, i, job, r)
                if best is None or key[:2] < best[:2]:
                    best = key
            if best is None:
                break
            _, _, job, r = best
            for t in list(job.running):
                while len(t.copies) < r + 1:
                    sim.start_copy(t, resched=False)
                sim.reschedule(t)

    def copies_for(self, sim: Sim, job: _Job, task: _Task) -> int:
        if job.copies_r:
            return job.copies_r
        var = self.ctx.var
        m = len(job.pending)
        s = sum(t.size for t in job.pending) / m
        free = int(sim.free + EPS)
        best, best_val = 1, -math.inf
        for r in range(1, int(self.params["max_copies"]) + 1):
            if m * r > free and r > 1:
                break
            val = self.utility(job, m, r, s)
            if val > best_val + EPS:
                best, best_val = r, val
        job.copies_r = best
        return best


SDA_TAUS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
"""SDA's candidate check times, in multiples of the fastest possible task time (the Pareto floor x_m)."""
SDA_COPIES = (1, 2, 3)
"""SDA's candidate numbers of extra copies for a detected straggler."""


def sda_choice(var: Variability, m: int, gamma: float, target: float = 0.0) -> tuple[float, int]:
    """Return SDA's (tau in floor units, d extra copies) for a job of m unit tasks, from the exact Pareto (or
    uniform) order statistics of sda_expectations: with `target` > 0, the least expected machine time per task
    subject to E[T_job] <= target * E[T_job] without detection (the fastest choice when none meets it); else
    the least E[T_job] + gamma m E[machine time per task] (SCA's utility with w = 1). Candidates: tau in
    SDA_TAUS x floor, d in SDA_COPIES; ties go to the earlier candidate (deterministic)."""
    floor = var.floor()
    base = var.job_time(m, 1)
    cands = []
    for tau_f in SDA_TAUS:
        for d in SDA_COPIES:
            job, machine = sda_expectations(var, m, tau_f * floor, d)
            cands.append((tau_f, d, job, machine))
    if target > 0:
        ok = [c for c in cands if c[2] <= target * base + 1e-12]
        best = min(ok, key=lambda c: c[3]) if ok else min(cands, key=lambda c: c[2])
    else:
        best = min(cands, key=lambda c: c[2] + gamma * m * c[3])
    return best[0], best[1]


class SDA(SlotPolicy):
    """SDA, the Straggler Detection Algorithm (Xu & Lau) for light load, FIFO job order: one copy per task; a
    task still running `tau` floor-times its size after it started is a straggler (Pareto's decreasing hazard)
    and gets `d` more copies (as free slots allow). tau and d come from sda_choice for the median job unless
    given: the weighted sum with `gamma`, or the least machine time meeting `target` (a fraction of the
    undetected job time) when target > 0."""

    name = "sda"
    defaults = {"gamma": 0.1, "tau": 0.0, "d": 0, "target": 0.0}
    rules = {"gamma": number(0),
             "tau": number(0, low_open=True, special={0: "automatic: from sda_choice"}),  # in floor units
             "d": integer(1, special={0: "automatic: from sda_choice"}),
             "target": number(0, 1, low_open=True, special={0: "off: weigh machine time by gamma"})}

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(ctx, **params)
        if not float(self.params["tau"]) or not int(self.params["d"]):
            tau, d = sda_choice(ctx.var, max(1, ctx.median_tasks), float(self.params["gamma"]),
                                float(self.params["target"]))
            self.params["tau"] = float(self.params["tau"]) or tau
            self.params["d"] = int(self.params["d"]) or d

    def started(self, sim: Sim, task: _Task) -> None:
        c = task.copies[0]
        sim.q.push(sim.now + float(self.params["tau"]) * self.ctx.var.floor() * task.size, (PROBE, task, c))

    def on_probe(self, sim: Sim, task: _Task) -> None:
        if len(task.copies) == 1:
            for _ in range(min(int(self.params["d"]), int(sim.free + EPS))):
                sim.start_copy(task, resched=False)
            sim.reschedule(task)


class ESE(SlotPolicy):
    """ESE, Enhanced Speculative Execution (Xu & Lau) for heavy load: jobs by smallest weighted remaining
    work; Mantri's kill-slower and restart rules every period; on a free slot, duplicate the running straggler
    that passes Mantri's resource test and is its job's last task when the job's expected flowtime saved,
    w (t_rem - E[min(t_rem, t_new)]), exceeds the delay the copy imposes on waiting work,
    W_waiting E[min(t_rem, t_new)] / N; else start the next pending task."""

    name = "ese"
    tick = True
    key = staticmethod(_wsrpt_key)
    defaults = {"delta": 0.25, "max_restarts": 3}
    rules = {"delta": PROBABILITY, "max_restarts": integer(0)}  # as Mantri's

    def decide(self, sim: Sim, tick: bool) -> None:
        var, d = self.ctx.var, self.ctx.tick_s
        if tick:
            kill_slower_copies(sim)
            if sim.waiting:
                mantri_restarts(sim, var, d, int(self.params["max_restarts"]))
        if sim.free < 1 - EPS:
            return
        cands = self.stragglers(sim)
        w_wait = sum(j.weight for j in sim.waiting)
        for saved, dur, task in cands:
            if sim.free < 1 - EPS:
                break
            if saved > w_wait * dur / sim.N:
                sim.start_copy(task)
        self.fill(sim)

    def stragglers(self, sim: Sim) -> list[tuple[float, float, _Task]]:
        """Return (flowtime saved, copy's expected duration, task) of each duplicate candidate, best first."""
        var, d = self.ctx.var, self.ctx.tick_s
        out = []
        longest: dict[_Job, float] = {}
        for task in sim.running:
            job = task.job
            if job.pending or len(task.copies) > 1 or _elapsed(sim, task.copies[0]) < d - EPS:
                continue
            ok, t_rem = mantri_duplicate_ok(sim, var, task, float(self.params["delta"]))
            if not ok:
                continue
            if job not in longest:
                longest[job] = max(min(sim.t_rem(t, c) for c in t.copies) for t in job.running)
            if t_rem < longest[job] - EPS:
                continue  # another task of the job finishes later: no flowtime saved
            dur = task.size * var.mean_min_with(t_rem / task.size)
            saved = job.weight * (t_rem - dur)
            out.append((saved, dur, task))
        out.sort(key=lambda x: (-x[0], x[2].job.idx, x[2].idx))
        return out


def sca_copies(var: Variability, m: int, gamma: float = 0.1, max_copies: int = 4, weight: float = 1.0) -> int:
    """Return SCA's unconstrained copies per task r* for a job of m unit tasks: the r in 1..max_copies
    maximising -weight E[T_job(m, r)] - gamma m r E[min_r] (SCA's utility with ample slots; ties: fewer)."""
    best, best_val = 1, -math.inf
    for r in range(1, max(1, max_copies) + 1):
        val = -weight * var.job_time(m, r) - gamma * m * r * var.mean_min_factor(r)
        if val > best_val + EPS:
            best, best_val = r, val
    return best


def threshold_load(var: Variability, m: int = 1, gamma: float = 0.1, max_copies: int = 4) -> float:
    """Return the workload threshold rho* (a fraction of slot capacity) below which SCA's light-load regime
    applies: rho* = E[X] / (r* E[min_r*]), r* = sca_copies(var, m, gamma, max_copies) for the median job (m
    tasks, w = 1); for Pareto speeds that is h(r*) / r*.

    Derivation (our reconstruction from SCA's program, research note 4.3; no fitted constant): SCA maximises
    its utility subject to sum_i m_i r_i <= N. Light load is where that capacity constraint is slack, so every
    job gets its unconstrained r*. Cloning a task on r* copies multiplies its expected machine time by
    c = r* E[min_r*] / E[X], so the cloned cluster's offered load is c rho, and by Little's law the busy slots
    stay below N only while rho < 1 / c. Above it the program's constraint binds on average, SCA's clones are
    reclaimed as fast as they start, and the heavy-load regime (ESE) applies. When SCA would not clone the
    median job at all (r* = 1) there is no light-load regime: rho* = 0. Pareto alpha 1.2: r* = 4, rho* = 1.19
    (always SCA); alpha 1.5: r* = 3, 0.78; alpha 2, m = 1-2: r* = 3, 0.56; uniform a = 0.5, m = 2: r* = 2,
    0.62."""
    r = sca_copies(var, m, gamma, max_copies)
    if r <= 1:
        return 0.0
    return var.mean_factor() / (r * var.mean_min_factor(r))


def ps_crossover_load(var: Variability, m: int = 1, r: int = 2) -> float:
    """Return the M/G/1 processor-sharing crossover load of cloning every task of a job of m tasks on r copies
    (the previous threshold, kept for comparison): cloning multiplies a task's expected machine time by
    c = r / h(r) and divides the job's expected time by g = E[T_job(m, 1)] / E[T_job(m, r)]; with flowtime
    E[T] / (1 - utilisation) it pays while rho < (g - 1) / (g c - 1) (when g c > 1), capped at h(r) / r."""
    g = var.job_time(m, 1) / var.job_time(m, r)
    c = r / var.h(r)
    stable = 1.0 / c
    if g * c <= 1.0 + 1e-12:
        return stable
    return min(stable, (g - 1.0) / (g * c - 1.0))


class Threshold(Policy):
    """The speculative-execution switch (Xu & Lau): below the workload threshold run the light-load policy
    (`light`: sca or sda), at or above it ESE. Reports the regime it chose in its parameters."""

    name = "threshold"
    defaults = {"light": "sca", "rho_star": 0.0}
    rules = {"light": one_of("sca", "sda"),
             "rho_star": number(0, low_open=True, special={0: "automatic: threshold_load"})}  # an offered load

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(ctx, **params)
        rho_star = float(self.params["rho_star"]) or threshold_load(
            ctx.var, max(1, ctx.median_tasks), float(SCA.defaults["gamma"]), int(SCA.defaults["max_copies"]))
        self.params["rho_star"] = rho_star
        light = str(self.params["light"])
        if light not in ("sca", "sda"):
            raise ValueError(f"light {light!r}; expected sca or sda")
        self.inner: Policy = (POLICIES[light](ctx) if ctx.load < rho_star else ESE(ctx))
        self.params["regime"] = self.inner.name
        self.tick = self.inner.tick
        self.checkpoint = self.inner.checkpoint

    def on_arrival(self, sim: Sim, job: _Job) -> None:
        self.inner.on_arrival(sim, job)

    def on_probe(self, sim: Sim, task: _Task) -> None:
        self.inner.on_probe(sim, task)

    def decide(self, sim: Sim, tick: bool) -> None:
        self.inner.decide(sim, tick)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    SRPTR, FairR, LAPSR, SRPTMSC, SCA, SDA, ESE, Threshold, SRPT, Fair, FIFO, Mantri, LATE, Dolly, HeSRPT)}
"""Every policy by name."""


def policy_params(name: str) -> dict[str, Any]:
    """Return the parameters policy `name` reads, with their defaults; KeyError when unknown."""
    return dict(POLICIES[name].defaults)


# ---------------------------------------------------------------- the vectorised engine

SHARED_POLICIES = ("fair-r", "laps-r", "hesrpt", "fair")
"""The time-shared allotment policies the vectorised engine runs (every runnable task of a chosen job holds a
copy, so a job's allotment is one share and a copy count per task)."""


def _shared_allotment(pol: FairR, N: int, jobs: list[int], remaining: list[float], arrival: list[float],
                      runnable: list[list[int]], hesrpt_p: float = 0.0) -> tuple[list[int], list[float]]:
    """Return (chosen job ids in the policy's order, machines of each) for the time-shared policies, from job
    ids (arrival order), remaining work (s), arrival times (s) and runnable task lists: FairR.chosen/shares on
    plain data (`hesrpt_p`: heSRPT's exponent when already fitted)."""
    name = pol.name
    if name == "laps-r":
        k = max(1, math.ceil(float(pol.params["beta"]) * len(jobs) - EPS)) if jobs else 0
        jobs = jobs[len(jobs) - k:]
    elif name == "hesrpt":
        jobs = sorted(jobs, key=lambda j: (-remaining[j], -arrival[j], -j))
    if not jobs:
        return jobs, []
    if name == "fair":
        caps = [len(runnable[j]) for j in jobs]
        out = [0.0] * len(jobs)
        left, todo = float(N), sorted(range(len(jobs)), key=lambda i: caps[i])
        pos = 0
        while pos < len(todo):
            level = left / (len(todo) - pos)
            i = todo[pos]
            if caps[i] <= level:
                out[i] = caps[i]
                left -= caps[i]
                pos += 1
            else:
                for i in todo[pos:]:
                    out[i] = level
                break
        return jobs, out
    if name == "hesrpt":
        p = hesrpt_p or float(pol.params["p"]) or hesrpt_exponent(pol.ctx.var, N)
        c = 1.0 / (1.0 - p)
        M = len(jobs)
        cum = (np.arange(M + 1) / M) ** c
        return jobs, list(N * np.diff(cum))
    return jobs, [N / len(jobs)] * len(jobs)


def simulate_shared(workload: Workload, slots: int, var: Variability, pol: FairR, seed: int,
                    record: bool) -> SimResult:
    """Run a time-shared allotment policy (SHARED_POLICIES) with opportunistic checkpointing, vectorised over the
    running tasks: between two events every running task progresses at share * (its best copy's speed) / size,
    so one numpy step advances them all and finds the next completion; allotments are recomputed only at
    arrival and departure epochs. Same rules, random draws (one speed per started copy, in allotment order) and
    event order (one arrival per epoch) as the event-queue engine; returns the SimResult (times in s)."""
    wl = workload
    J = wl.jobs
    N = slots
    rng = make_rng(seed)
    redundant = pol.redundant
    maxc = int(pol.params.get("max_copies", 1))
    first: list[int] = []
    sizes_l: list[float] = []
    nmaps: list[int] = []
    nreds: list[int] = []
    for m, r in zip(wl.map_s, wl.reduce_s):
        first.append(len(sizes_l))
        nmaps.append(int(m.size))
        nreds.append(int(r.size))
        sizes_l.extend(m.tolist())
        sizes_l.extend(r.tolist())
    T = len(sizes_l)
    size = np.array(sizes_l, dtype=float)
    prog = np.zeros(T)
    vmax = np.zeros(T)
    speeds: list[list[float]] = [[] for _ in range(T)]
    segs: list[list[float]] = [[] for _ in range(T)] if record else []
    share_arr = np.zeros(T)
    ncop = np.zeros(T, dtype=np.int64)
    mark = np.zeros(T, dtype=np.int64)
    epoch = 0
    schedule: list[tuple[int, int, int, float, float, float, bool]] | None = [] if record else None
    runnable: list[list[int]] = [[] for _ in range(J)]
    maps_left = list(nmaps)
    left = [a + b for a, b in zip(nmaps, nreds)]
    remaining = [float(m.sum() + r.sum()) for m, r in zip(wl.map_s, wl.reduce_s)]
    completion = np.full(J, np.nan)
    order = np.argsort(wl.arrival_s, kind="stable").tolist()
    arrival = wl.arrival_s.astype(float).tolist()
    active: dict[int, None] = {}
    act = np.zeros(0, dtype=np.int64)
    act_l: list[int] = []
    rate = np.zeros(0)
    busy = 0.0
    machine = 0.0
    started = killed = events = 0
    now = arrival[order[0]] if J else 0.0
    ai = 0
    max_events = MAX_EVENTS
    hesrpt_p = (float(pol.params["p"]) or hesrpt_exponent(var, N)) if pol.name == "hesrpt" else 0.0

    _task_job = [0] * T
    for j in range(J):
        for t in range(first[j], first[j] + nmaps[j] + nreds[j]):
            _task_job[t] = j

    def emit(t: int, i: int, won: bool) -> None:
        j = _task_job[t]
        idx = t - first[j]
        seg = segs[t]
        schedule.append((j, idx, 0 if idx < nmaps[j] else 1, seg[i], now, float(share_arr[t]), won))  # type: ignore[union-attr]
        seg[i] = now

    while ai < J or active:
        if act_l:
            tfin = now + (1.0 - prog[act]) / rate
            k = int(np.argmin(tfin))
            tf = float(tfin[k])
        else:
            tfin = None
            tf = math.inf
        ta = arrival[order[ai]] if ai < J else math.inf
        t_next = min(tf, ta)
        if act_l:
            dt = t_next - now
            prog[act] += dt * rate
            machine += dt * busy
        now = t_next
        done: list[int] = []
        if tf <= ta and tfin is not None:
            done = act[tfin == tf].tolist()
        for t in done:
            events += 1
            j = _task_job[t]
            ncp = len(speeds[t])
            if record:
                best = max(range(ncp), key=lambda i: (speeds[t][i], -i))
                for i in range(ncp):
                    emit(t, i, i == best)
            killed += ncp - 1
            speeds[t] = []
            ncop[t] = 0
            prog[t] = 1.0
            runnable[j].remove(t)
            left[j] -= 1
            remaining[j] -= sizes_l[t]
            if t < first[j] + nmaps[j]:
                maps_left[j] -= 1
                if maps_left[j] == 0 and nreds[j]:
                    runnable[j] = list(range(first[j] + nmaps[j], first[j] + nmaps[j] + nreds[j]))
            if left[j] == 0:
                completion[j] = now
                del active[j]
        if ta <= tf:
            j = order[ai]
            ai += 1
            events += 1
            active[j] = None
            runnable[j] = list(range(first[j], first[j] + nmaps[j]))
            if not nmaps[j]:
                runnable[j] = list(range(first[j], first[j] + nreds[j]))
                maps_left[j] = 0
        if events > max_events:
            raise RuntimeError(f"simulation passed {max_events} events; the policy does not make progress")
        # -- the allotment of this epoch
        jobs, xs = _shared_allotment(pol, N, list(active), remaining, arrival, runnable, hesrpt_p)
        new_l: list[int] = []
        new_share: list[float] = []
        new_cop: list[int] = []
        for j, x in zip(jobs, xs):
            tasks = runnable[j]
            k = len(tasks)
            if k == 0 or x <= EPS:
                continue
            new_l.extend(tasks)
            if x < k - EPS or not redundant:
                new_share.extend([min(1.0, x / k)] * k)
                new_cop.extend([1] * k)
            else:
                total = min(int(math.ceil(x - EPS)), k * maxc)
                per, extra = divmod(total, k)
                new_share.extend([min(1.0, x / total)] * k)
                new_cop.extend([per + 1] * extra + [per] * (k - extra))
        epoch += 1
        new = np.array(new_l, dtype=np.int64)
        mark[new] = epoch
        for t in act[mark[act] != epoch].tolist():  # no longer allotted: every copy killed, progress kept
            n_old = len(speeds[t])
            if n_old:
                if record:
                    for i in range(n_old):
                        emit(t, i, False)
                    segs[t] = []
                killed += n_old
                speeds[t] = []
                ncop[t] = 0
        cop = np.array(new_cop, dtype=np.int64)
        sh = np.array(new_share)
        diff = ncop[new] != cop
        changed = new[diff].tolist()
        for t, n in zip(changed, cop[diff].tolist()):  # shrink first (slowest copies)
            sp = speeds[t]
            if len(sp) > n:
                drop = sorted(range(len(sp)), key=lambda i: sp[i])[:len(sp) - n]
                for i in sorted(drop, reverse=True):
                    if record:
                        emit(t, i, False)
                        del segs[t][i]
                    del sp[i]
                killed += len(drop)
                vmax[t] = max(sp)
        old_sh = share_arr[new]
        held = np.array([len(speeds[t]) for t in new_l], dtype=np.int64) if record else None
        resh = np.abs(sh - old_sh) > EPS
        if record:
            for t in new[resh & (held > 0)].tolist():
                for i in range(len(speeds[t])):
                    emit(t, i, False)
        share_arr[new] = np.where(resh | (ncop[new] == 0), sh, old_sh)
        for t, n in zip(changed, cop[diff].tolist()):  # then new copies, in allotment order
            sp = speeds[t]
            grow = n - len(sp)
            if grow > 0:
                for _ in range(grow):
                    sp.append(var.speed(rng, 0.0))
                    if record:
                        segs[t].append(now)
                started += grow
                vmax[t] = max(sp)
        ncop[new] = cop
        act = new
        act_l = new_l
        shares_now = share_arr[new]
        busy = float(cop @ shares_now) if new_l else 0.0
        rate = shares_now * vmax[new] / size[new] if new_l else np.zeros(0)
        if busy > N + 1e-6:
            raise AssertionError(f"policy {pol.name} holds {busy} slots of {N} at {now}")
    if np.isnan(completion).any():
        raise RuntimeError(f"policy {pol.name} left {int(np.isnan(completion).sum())} jobs unfinished")
    return SimResult(completion, machine, started, killed, events, pol.name, dict(pol.params), schedule)


def simulate(workload: Workload, slots: int, var: Variability, policy: str, *, seed: int = 0,
             params: dict[str, Any] | None = None, load: float = 0.5, tick_s: float | None = None,
             record: bool = False, monitoring: str = "elapsed", engine: str = "auto") -> SimResult:
    """Run `workload` on `slots` slots under `policy` (a key of POLICIES) with the variability model `var`;
    return the SimResult (times in s). `load` is the offered load the threshold policy sees; `tick_s` the
    monitoring period of Mantri, LATE and ESE (default a quarter of the mean task size); `record` keeps
    every copy segment; `monitoring` what Mantri, LATE, ESE and SRPTMS+C see of a running copy (its elapsed
time only, or exact progress); `engine` "auto" runs the time-shared policies (SHARED_POLICIES) on the vectorised
engine (simulate_shared) and the rest on the event queue, "events" runs every policy on the event queue.
Raises KeyError for an unknown policy, ValueError for a bad parameter."""
    if policy not in POLICIES:
        raise KeyError(policy)
    cls = POLICIES[policy]
    params = dict(params or {})
    unknown = set(params) - set(cls.defaults)
    if unknown:
        raise ValueError(f"policy {policy} has no parameter {sorted(unknown)}; it reads {sorted(cls.defaults)}")
    sizes = np.concatenate([*workload.map_s, *workload.reduce_s]) if workload.jobs else np.ones(1)
    tick = float(tick_s) if tick_s else 0.25 * float(sizes.mean())
    counts = [m.size + r.size for m, r in zip(workload.map_s, workload.reduce_s)]
    ctx = Context(var, slots, load, tick, int(np.median(counts)) if counts else 1)
    pol = cls(ctx, **params)
    if monitoring not in ("elapsed", "progress"):
        raise ValueError(f"monitoring {monitoring!r}; expected elapsed or progress")
    if engine not in ("auto", "events"):
        raise ValueError(f"engine {engine!r}; expected auto or events")
    if engine == "auto" and policy in SHARED_POLICIES:
        return simulate_shared(workload, slots, var, pol, seed, record)  # type: ignore[arg-type]
    return Sim(workload, slots, var, pol, seed, record, tick, monitoring).run()
