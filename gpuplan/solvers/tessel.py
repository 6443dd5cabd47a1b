"""Tessel's solvers: the repetend search with joint completion, an exact CP-SAT schedule, baselines.

Repetend (the paper's method, as a cyclic CP-SAT model): every block b gets a start s_b in [0, P)
and an integer micro-batch lag k_b; instance (b, i) starts at s_b + (i + k_b) P. Dependencies hold
between absolute offsets, devices never overlap modulo P, and the steady-state memory of each
device (a function of the starts and lags) stays under its limit. P is minimised from the busy-time
bound, then the latency of one micro-batch at that P. The pattern is unrolled over N micro-batches
and completed: the first and last in-flight micro-batches are re-solved with CP-SAT jointly with
the repeated middle (shifted as one piece), so warm-up and cool-down add no avoidable steps. Times
are in integer ticks inside CP-SAT; the final plan is timed in seconds by the model's simulator.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuplan.errors import InfeasibleError, SolverError
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.models.tessel import (Entry, Order, Repetend, TesselPlan, TesselProblem, make_plan, makespan_s,
                                   memory_peaks, simulate, topological_order, lower_bound_s, DeadlockError)
from gpuplan.option_rules import MAX_WORKERS, flag, integer, number
from gpuplan.registry import register_solver
from gpuplan.solvers.backends import CP_MODEL, cold_import_s, cold_import_outlasts, solve_cpsat
from gpuplan.solvers import tessel_classic as classic
from gpuplan.units import UPPER_LIMITS

EXACT_MAX_INSTANCES = 600
EXACT_HINT_SHARE = 0.4  # of exact's time limit, the share Tessel's hint may use (its guard's limit)
EXACT_FINISH_SHARE = 0.05  # of exact's time limit, kept for simulating and assembling the plan after CP-SAT
# CP-SAT deterministic-time units per second of one free core, on the repetend models: measured 0.41-0.59
# units per CPU second (4-8 devices, budgets 0.5-2 units) on the project's 2-core machine; the low end, so
# that a budget of X units takes at most about X / DET_PER_WALL_S seconds on an idle core
DET_PER_WALL_S = 0.4
CPSAT_SHARE = 0.5  # under a time limit, the share of it that the period probes' CP-SAT budgets add up to
GUARD_END = 0.9  # under a time limit, no step starts that would end past this share of it (the rest: the plan)


@dataclass
class Clock:
    """The wall-clock guard of one solve: under a time limit, a step starts only when it should end
    (by its estimated cost, or the longest schedule-building step timed so far, in s) before GUARD_END
    of the limit; `cut` names the steps it skipped. Without a limit (limit_s None) every step runs, so
    the plan depends on the input and seed only."""

    started: float
    limit_s: float | None
    cut: list[str] = field(default_factory=list)
    step_s: float = 0.0
    det_left: float = math.inf  # CP-SAT deterministic units left to the repetend searches

    def __post_init__(self) -> None:
        if self.limit_s is not None:
            self.det_left = CPSAT_SHARE * self.limit_s * DET_PER_WALL_S

    def det_budget(self, default: float) -> float:
        """Return the deterministic budget (CP-SAT units) of the next call: `default`, under a limit at most
        half of what is left (at least 0.01)."""
        return default if math.isinf(self.det_left) else max(0.01, min(default, self.det_left / 2))

    def det_spent(self, units: float) -> None:
        """Record deterministic units (CP-SAT) used by a call."""
        self.det_left = max(0.0, self.det_left - units)

    def left_s(self) -> float:
        """Return the seconds left before the guard (inf without a limit)."""
        if self.limit_s is None:
            return math.inf
        return self.started + GUARD_END * self.limit_s - time.perf_counter()

    def allows(self, step: str, cost_s: float | None = None) -> bool:
        """Return whether `step` (estimated cost_s seconds; default the longest step so far) may start and
        leave one more step's time for assembling the plan (steps vary: a list schedule takes up to twice a
        simulation); record it in `cut` when not."""
        if self.left_s() >= (self.step_s if cost_s is None else cost_s) + self.step_s:
            return True
        self.cut.append(step)
        return False

    def timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Return fn(*args, **kwargs), keeping the longest duration (s) as the estimate of the next step."""
        at = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.step_s = max(self.step_s, time.perf_counter() - at)


@dataclass(frozen=True)
class Ticks:
    """The problem in integers for CP-SAT: durations (ticks), memory deltas and limits (units)."""

    dur: dict[str, int]
    mem: dict[str, int]
    limit: list[int | None]
    tick_s: float


def _scale(values: list[float], resolution: int) -> float:
    """Return a unit that makes every value a near-integer multiple, else max/resolution."""
    nonzero = [abs(v) for v in values if abs(v) > 0]
    if not nonzero:
        return 1.0
    base = min(nonzero)
    for k in range(1, 25):
        unit = base / k
        if all(abs(v / unit - round(v / unit)) < 1e-6 * max(1.0, v / unit) for v in nonzero) \
                and max(nonzero) / unit <= 50 * resolution:
            return unit
    return max(nonzero) / resolution


def integerize(problem: TesselProblem, resolution: int = 200) -> Ticks:
    """Return the problem's durations in ticks and memory in integer units (exact when the numbers are
    small multiples of one another, else rounded to 1/resolution of the largest)."""
    tick = _scale([b.duration_s for b in problem.blocks], resolution)
    unit = _scale([b.memory_bytes for b in problem.blocks], resolution)
    dur = {b.name: max(1, round(b.duration_s / tick)) for b in problem.blocks}
    mem = {b.name: (math.ceil(b.memory_bytes / unit - 1e-9) if b.memory_bytes > 0
                    else -math.floor(-b.memory_bytes / unit + 1e-9)) for b in problem.blocks}
    limit = [None if math.isinf(problem.limit(d)) else math.floor(problem.limit(d) / unit + 1e-9)
             for d in range(problem.devices)]
    return Ticks(dur, mem, limit, tick)


def _on_device(problem: TesselProblem) -> list[list[str]]:
    return [[b.name for b in problem.blocks if d in b.devices] for d in range(problem.devices)]


# ---------------------------------------------------------------- repetend


@dataclass
class Pattern:
    """A repetend in ticks: period, per-block start in the period and lag; span = one micro-batch's latency."""

    period: int
    start: dict[str, int]
    lag: dict[str, int]
    span: int
    group: int = 1  # micro-batches per period: keys are "block@j" for j < group when > 1

    def key(self, block: str, microbatch: int) -> str:
        """Return the pattern key of a block instance."""
        return block if self.group == 1 else f"{block}@{microbatch % self.group}"

    def at(self, block: str, microbatch: int) -> int:
        """Return the tick start of a block instance when the pattern is unrolled."""
        key = self.key(block, microbatch)
        return self.start[key] + (microbatch // self.group + self.lag[key]) * self.period

    def in_flight(self) -> int:
        """Return how many micro-batches the pattern keeps in flight (lag spread times group)."""
        return (max(self.lag.values()) - min(self.lag.values()) + 1) * self.group


def _repetend_at(problem: TesselProblem, t: Ticks, period: int, time_limit_s: float, seed: int,
                 optimise: bool, unknown: list[int] | None = None, hint: Pattern | None = None,
                 chains: list[list[str]] | None = None, clock: Clock | None = None) -> Pattern | None:
    """Solve the cyclic model at a fixed period; return the pattern or None when none is found
    (the period is appended to `unknown` when the time limit ran out without a proof). `hint`, a
    pattern at the same period, seeds the search. `chains` lists the copies of one block in a grouped
    problem (see grouped): they start in micro-batch order, the last before the next period's first.
    `clock` is charged the deterministic units used (the whole budget when no pattern is returned)."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    # lags beyond twice the critical path per period only add memory in flight
    kmax = min(len(problem.blocks), 2 * -(-_critical_path(problem, t) // period) + 2)
    s = {b.name: m.new_int_var(0, period - 1, f"s_{b.name}") for b in problem.blocks}
    k = {b.name: m.new_int_var(0, kmax, f"k_{b.name}") for b in problem.blocks}
    off = {n: s[n] + period * k[n] for n in s}
    for b in problem.blocks:
        for a in b.after:
            m.add(off[b.name] >= off[a] + t.dur[a])
            m.add(k[b.name] >= k[a])  # redundant, implied by the line above; helps the search
    for chain in chains or []:
        for x, y in zip(chain, chain[1:]):
            m.add(off[x] <= off[y])
        m.add(off[chain[-1]] <= off[chain[0]] + period)
    on = _on_device(problem)
    for d, names in enumerate(on):
        if sum(t.dur[n] for n in names) > period:
            return None
        ivs = []
        for n in names:
            ivs.append(m.new_interval_var(s[n], t.dur[n], s[n] + t.dur[n], f"i_{n}_{d}"))
            ivs.append(m.new_interval_var(s[n] + period, t.dur[n], s[n] + period + t.dur[n], f"j_{n}_{d}"))
        m.add_no_overlap(ivs)
        if t.limit[d] is None:
            continue
        before: dict[tuple[str, str], Any] = {}
        for a in names:
            for b in names:
                if a < b:
                    o = m.new_bool_var(f"o_{a}_{b}")
                    m.add(s[a] <= s[b]).only_enforce_if(o)
                    m.add(s[a] >= s[b] + 1).only_enforce_if(~o)
                    before[(a, b)], before[(b, a)] = o, ~o
        in_flight = -sum(t.mem[n] * k[n] for n in names)
        for a in names:
            if t.mem[a] <= 0:
                continue
            level = t.mem[a] + sum(t.mem[b] * before[(b, a)] for b in names if b != a)
            m.add(level + in_flight <= t.limit[d])
    m.add_min_equality(0, list(k.values()))
    span = m.new_int_var(0, (kmax + 1) * period + sum(t.dur.values()), "span")
    for n in s:
        m.add(span >= off[n] + t.dur[n])
    if optimise:
        m.minimize(span)
    if hint is not None:
        for n in s:
            m.add_hint(s[n], hint.start[n])
            m.add_hint(k[n], hint.lag[n])
    try:
        # one worker and only a deterministic-time limit (no wall clock): the same input and seed give the
        # same pattern on an idle machine and under load
        res = solve_cpsat(m, time_limit_s=None, deterministic_limit=time_limit_s, seed=seed, workers=1)
    except InfeasibleError:
        if clock is not None:
            clock.det_spent(time_limit_s)
        return None
    except SolverError:
        if clock is not None:
            clock.det_spent(time_limit_s)
        if unknown is not None:
            unknown.append(period)
        return None
    if clock is not None:
        clock.det_spent(res.solver.ResponseProto().deterministic_time)
    v = res.solver.value
    return Pattern(period, {n: v(s[n]) for n in s}, {n: v(k[n]) for n in k}, v(span))


def modulo_pattern(problem: TesselProblem, t: Ticks, period: int) -> Pattern | None:
    """Return a repetend at `period` (ticks) built without a solver, or None. Two constructions: every
    block in topological order at the earliest time after its dependencies whose slot modulo the period
    is free on all its devices (greedy modulo scheduling); and, when every block sits on one device,
    each device's blocks packed back to back in the order of their as-soon-as-possible start modulo the
    period, each lag then the smallest after its dependencies. A pattern is kept only when it satisfies
    every constraint of the cyclic model (_repetend_at): lags within its bound, memory under each limit."""
    order = topological_order(problem.blocks) or []
    if any(sum(t.dur[n] for n in names) > period for names in _on_device(problem)):
        return None
    for build in (_greedy_offsets, _packed_offsets):
        off = build(problem, t, period, order)
        if off is not None and (pat := _valid_pattern(problem, t, period, off)) is not None:
            return pat
    return None


def _greedy_offsets(problem: TesselProblem, t: Ticks, period: int, order: list[str]) -> dict[str, int] | None:
    """Return absolute tick offsets of greedy modulo scheduling in topological order (see modulo_pattern)."""
    used = [[False] * period for _ in range(problem.devices)]
    off: dict[str, int] = {}
    for n in order:
        b = problem.block(n)
        earliest = max((off[a] + t.dur[a] for a in b.after), default=0)
        for at in range(earliest, earliest + period):
            slots = [(at + j) % period for j in range(t.dur[n])]
            if all(not used[d][x] for d in b.devices for x in slots):
                for d in b.devices:
                    for x in slots:
                        used[d][x] = True
                off[n] = at
                break
        else:
            return None
    return off


def _packed_offsets(problem: TesselProblem, t: Ticks, period: int, order: list[str]) -> dict[str, int] | None:
    """Return absolute tick offsets of each device's blocks packed by as-soon-as-possible phase, lags the
    smallest after the dependencies (see modulo_pattern); None when a block spans several devices."""
    if any(len(b.devices) != 1 for b in problem.blocks):
        return None
    asap: dict[str, int] = {}
    for n in order:
        asap[n] = max((asap[a] + t.dur[a] for a in problem.block(n).after), default=0)
    phase: dict[str, int] = {}
    for names in _on_device(problem):
        at = 0
        for n in sorted(names, key=lambda n: (asap[n] % period, asap[n], n)):
            phase[n], at = at, at + t.dur[n]
    off: dict[str, int] = {}
    for n in order:
        earliest = max((off[a] + t.dur[a] for a in problem.block(n).after), default=0)
        off[n] = phase[n] + period * max(0, -(-(earliest - phase[n]) // period))
    return off


def _valid_pattern(problem: TesselProblem, t: Ticks, period: int, off: dict[str, int]) -> Pattern | None:
    """Return the pattern of absolute offsets (ticks) when it meets the cyclic model's lag bound and
    steady-state memory limits (no overlap modulo the period holds by construction), else None."""
    kmax = min(len(problem.blocks), 2 * -(-_critical_path(problem, t) // period) + 2)
    lag = {n: v // period for n, v in off.items()}
    if max(lag.values()) > kmax:
        return None
    start = {n: v % period for n, v in off.items()}
    if not _steady_memory_fits(problem, t, start, lag):
        return None
    return Pattern(period, start, lag, max(v + t.dur[n] for n, v in off.items()))


def _steady_memory_fits(problem: TesselProblem, t: Ticks, start: dict[str, int], lag: dict[str, int]) -> bool:
    """Return whether a cyclic pattern (starts in the period and lags, ticks; keys the blocks of `problem`)
    keeps every device's steady-state memory (units) under its limit at every allocating start."""
    for d, names in enumerate(_on_device(problem)):
        if t.limit[d] is None:
            continue
        in_flight = -sum(t.mem[n] * lag[n] for n in names)
        for a in names:
            if t.mem[a] > 0 and t.mem[a] + sum(t.mem[x] for x in names if x != a and start[x] <= start[a]) \
                    + in_flight > t.limit[d]:
                return False
    return True


def _cyclic_schedule(problem: TesselProblem, t: Ticks, pat: Pattern) -> bool:
    """Return whether `pat` (ticks; keys the blocks of `problem`, the grouped placement when pat.group > 1)
    is a cyclic schedule of it: no two blocks of a device overlap modulo the period (a block may wrap
    around it) and the steady-state memory stays under every limit. Dependencies are not tested: a pattern
    read from a valid schedule keeps that schedule's start times, which meet them."""
    for names in _on_device(problem):
        spans = sorted((pat.start[n], pat.start[n] + t.dur[n]) for n in names)
        nexts = [s for s, _ in spans[1:]] + [spans[0][0] + pat.period] if spans else []  # the first again, a period on
        if any(end > nxt for (_, end), nxt in zip(spans, nexts)):
            return False
    return _steady_memory_fits(problem, t, pat.start, pat.lag)


def _critical_path(problem: TesselProblem, t: Ticks) -> int:
    """Return the longest dependency chain of one micro-batch, in ticks."""
    end: dict[str, int] = {}
    for n in topological_order(problem.blocks) or []:
        end[n] = max((end[a] for a in problem.block(n).after), default=0) + t.dur[n]
    return max(end.values())


def memory_period_bound(problem: TesselProblem, t: Ticks) -> int:
    """Return a lower bound on the period (ticks) from memory: in the steady state a device holds, on
    average over a period, sum(units x holding time) / P of memory, where each allocation is held at
    least the longest dependency path from its block's start to its freeing block's start (see
    holding_pairs); the average is at most the peak, hence at most the limit. 0 where it does not apply."""
    order = topological_order(problem.blocks) or []
    succ: dict[str, list[str]] = {n: [] for n in order}
    for b in problem.blocks:
        for a in b.after:
            succ[a].append(b.name)
    best = 0
    for d in range(problem.devices):
        pairs = holding_pairs(problem, t, d) if t.limit[d] else None
        if not pairs:
            continue
        held = 0
        for a, f, units in pairs:
            dist = {a: 0}
            for n in order[order.index(a):]:
                if n in dist:
                    for x in succ[n]:
                        dist[x] = max(dist.get(x, 0), dist[n] + t.dur[n])
            held += units * dist.get(f, 0)
        best = max(best, -(-held // t.limit[d]))  # type: ignore[operator]
    return best


def sequential_pattern(problem: TesselProblem, t: Ticks) -> Pattern | None:
    """Return the trivial repetend: one micro-batch after the other in topological order (period = the
    sum of all durations, every lag 0), or None when that order exceeds a device's memory limit."""
    start: dict[str, int] = {}
    at = 0
    for n in topological_order(problem.blocks) or []:
        start[n] = at
        at += t.dur[n]
    for d, names in enumerate(_on_device(problem)):
        if t.limit[d] is None:
            continue
        level = 0
        for n in sorted(names, key=start.__getitem__):
            level += t.mem[n]
            if level > t.limit[d]:
                return None
    return Pattern(at, start, {n: 0 for n in start}, at)


def probe_budget(problem: TesselProblem) -> float:
    """Return the default deterministic-time budget (CP-SAT units) of one period probe: a quarter unit
    per device, between 0.2 and 2. Under a wall-clock limit each call gets at most half of the units left
    (Clock.det_budget): CPSAT_SHARE of the limit at DET_PER_WALL_S, minus what earlier calls used
    (deterministic too: one worker)."""
    return max(0.2, min(2.0, 0.25 * problem.devices))


def _busy(problem: TesselProblem, t: Ticks) -> list[int]:
    """Return each device's work per micro-batch (ticks)."""
    return [sum(t.dur[n] for n in names) for names in _on_device(problem)]


def find_repetend(problem: TesselProblem, t: Ticks, *, time_limit_s: float, seed: int,
                  progress: Callable[..., None], latency_search_s: float = 0.0,
                  chains: list[list[str]] | None = None, clock: Clock | None = None
                  ) -> tuple[Pattern, dict[str, Any]]:
    """Return a repetend of smallest period (ticks) and stats; at that period, the one of shortest
    one-micro-batch latency found in latency_search_s deterministic time (default: a tenth of one
    search step's).

    The period starts at the larger of two bounds proven without a solver call, the busy time
    max_d sum of durations on d and the memory bound (memory_period_bound), and grows (doubling, then
    bisection) until the cyclic model is feasible. The largest period, the sum of all durations, always
    has a solution when the problem is feasible: one micro-batch at a time (built directly when the
    topological order fits the memory, else asked of CP-SAT). A period a constructed pattern settles
    (modulo_pattern) needs no solver call. Each probe gets probe_budget (Clock.det_budget); under a
    `clock` with a limit no probe starts that could end past its guard (the periods not probed are left
    unproven, and the smallest feasible period found so far stands). Raises InfeasibleError with numbers
    only when CP-SAT proves that no order of one micro-batch at a time fits the memory, and SolverError
    when it cannot decide that in the time limit.
    """
    clock = clock or Clock(time.perf_counter(), None)
    busy_bound = max(_busy(problem, t))
    mem_bound = memory_period_bound(problem, t)
    lower = max(busy_bound, mem_bound)
    upper = sum(t.dur.values())
    tried: list[int] = []
    unknown: list[int] = []
    constructed: list[int] = []  # periods settled by modulo_pattern, without CP-SAT
    per_call = probe_budget(problem)  # deterministic-time units

    def feasible(period: int) -> Pattern | None:
        tried.append(period)
        progress(None, f"repetend: trying period {period} ticks")
        if chains is None and (quick := modulo_pattern(problem, t, period)) is not None:
            constructed.append(period)  # no solver call needed
            return quick
        return _repetend_at(problem, t, period, clock.det_budget(per_call), seed, optimise=False, unknown=unknown,
                            chains=chains, clock=clock)

    def cost_s() -> float:
        return clock.det_budget(per_call) / DET_PER_WALL_S

    found, bad, step, period = None, lower - 1, 1, min(lower, upper)
    while period < upper and clock.allows(f"period probe {period}", cost_s()):  # `upper` is settled below
        found = feasible(period)
        if found:
            break
        bad, period, step = period, min(upper, period + step), step * 2
    if found is None:
        found = sequential_pattern(problem, t) or _one_at_a_time(
            problem, t, upper, time_limit_s if clock.limit_s is None else
            max(0.05, min(time_limit_s, clock.left_s() * DET_PER_WALL_S)), seed, tried)
    lo, hi = bad + 1, found.period
    not_probed: list[int] = []  # [first, last] period left unprobed by the wall-clock guard
    while lo < hi:
        mid = (lo + hi) // 2
        if not clock.allows(f"period probe {mid}", cost_s()):
            not_probed = [lo, hi - 1]
            break
        p = feasible(mid)
        if p:
            found, hi = p, mid
        else:
            lo = mid + 1
    # the feasibility answers leave the lags arbitrary (micro-batches kept in flight for nothing, which
    # the completion cannot undo): shorten one micro-batch's latency at that period, from the pattern
    budget = clock.det_budget(latency_search_s or per_call / 10)
    if clock.allows("latency pass", budget / DET_PER_WALL_S):
        short = _repetend_at(problem, t, found.period, budget, seed, optimise=True, hint=found, chains=chains,
                             clock=clock)
        if short is not None and short.span < found.span:
            found = short
    return found, {"period_lower_bound_ticks": busy_bound, "period_memory_bound_ticks": mem_bound,
                   "periods_tried": tried, "periods_constructed": constructed, "tick_s": t.tick_s,
                   "probe_budget": per_call, "cpsat_units_left": None if math.isinf(clock.det_left) else clock.det_left,
                   "periods_undecided": sorted(set(unknown)), "periods_not_probed": not_probed,
                   "period_proven_minimal": not unknown and not not_probed}


def _one_at_a_time(problem: TesselProblem, t: Ticks, upper: int, time_limit_s: float, seed: int,
                   tried: list[int]) -> Pattern:
    """Return a repetend at period `upper` (one micro-batch at a time in any order) from CP-SAT; raise
    InfeasibleError when it proves there is none, SolverError when it cannot decide in time."""
    tried.append(upper)
    undecided: list[int] = []
    found = _repetend_at(problem, t, upper, max(1.0, time_limit_s), seed, optimise=False, unknown=undecided)
    if found:
        return found
    if undecided:
        raise SolverError(f"CP-SAT could not decide within {time_limit_s:g} s whether one micro-batch at a "
                          f"time fits the memory (period {upper} ticks); try a longer time limit")
    need = [0.0] * problem.devices
    for b in problem.blocks:
        for d in b.devices:
            need[d] += max(0.0, b.memory_bytes)
    worst = max(range(problem.devices), key=lambda d: need[d] - problem.limit(d))
    raise InfeasibleError(f"no repeating schedule fits the memory: one micro-batch allocates up to "
                          f"{need[worst]:g} bytes on device {worst}, whose limit is "
                          f"{problem.limit(worst):g} bytes (no order of one micro-batch at a time fits)")


def grouped(problem: TesselProblem, group: int) -> tuple[TesselProblem, list[list[str]]]:
    """Return the placement of `group` micro-batches as one (block b of the j-th is "b@j", dependencies
    inside each copy) and the chains of copies of each block; a repetend of it holds `group`
    micro-batches per period, which can express patterns such as interleaved 1F1B's groups of p."""
    blocks = [b.model_copy(update={"name": f"{b.name}@{j}", "after": [f"{a}@{j}" for a in b.after]})
              for j in range(group) for b in problem.blocks]
    chains = [[f"{b.name}@{j}" for j in range(group)] for b in problem.blocks]
    return problem.model_copy(update={"blocks": blocks}), chains


def grouped_ticks(t: Ticks, group: int) -> Ticks:
    """Return the integer problem of `grouped` (the same numbers for every copy)."""
    return Ticks({f"{n}@{j}": v for j in range(group) for n, v in t.dur.items()},
                 {f"{n}@{j}": v for j in range(group) for n, v in t.mem.items()}, t.limit, t.tick_s)


def pattern_from_schedule(problem: TesselProblem, t: Ticks, schedule: list[list[Entry]], group: int,
                          period: int) -> Pattern | None:
    """Return the grouped pattern (keys "block@j", see grouped; `t` its ticks) of a schedule's steady
    state: the first group of `group` micro-batches whose every block starts exactly `period` ticks
    before the same block of the next group, read at that period; None when no group is periodic."""
    n = problem.microbatches
    at = {(e.block, e.microbatch): round(e.start_s / t.tick_s) for dev in schedule for e in dev}
    periodic = [g for g in range(n // group - 1)
                if all(at[(b.name, (g + 1) * group + j)] - at[(b.name, g * group + j)] == period
                       for b in problem.blocks for j in range(group))]
    gp = grouped(problem, group)[0]
    for g in periodic:  # two groups a period apart need not make a cyclic schedule: keep the first that is one
        first = {f"{b.name}@{j}": at[(b.name, g * group + j)] for b in problem.blocks for j in range(group)}
        origin = min(first.values())
        start = {k: (v - origin) % period for k, v in first.items()}
        lag = {k: (v - origin) // period for k, v in first.items()}
        span = max(v - origin + t.dur[k] for k, v in first.items())
        pat = Pattern(period, start, lag, span, group)
        if _cyclic_schedule(gp, t, pat):
            return pat
    return None


def unroll(problem: TesselProblem, pat: Pattern) -> Order:
    """Return per-device orders of the pattern repeated over the problem's N micro-batches."""
    times: list[list[tuple[int, str, int]]] = [[] for _ in range(problem.devices)]
    for b in problem.blocks:
        for i in range(problem.microbatches):
            at = pat.at(b.name, i)
            for d in b.devices:
                times[d].append((at, b.name, i))
    return [[(n, i) for _, n, i in sorted(dev)] for dev in times]


# ---------------------------------------------------------------- full / completion CP-SAT


def holding_pairs(problem: TesselProblem, t: Ticks, device: int) -> list[tuple[str, str, int]] | None:
    """Return how one micro-batch's memory on `device` is held: (allocating block, freeing block,
    units), each free matched to allocations among its ancestors, most recent first; None when some
    free has no allocation before it. Memory at any time is then the sum of the held amounts, so a
    cumulative constraint replaces the (much heavier) reservoir."""
    order = topological_order(problem.blocks) or []
    ancestors: dict[str, set[str]] = {}
    for n in order:
        ancestors[n] = set().union(*[ancestors[a] | {a} for a in problem.block(n).after]) if problem.block(n).after \
            else set()
    open_: list[list[Any]] = []  # [block, units left], in topological order
    pairs: list[tuple[str, str, int]] = []
    for n in order:
        if device not in problem.block(n).devices or t.mem[n] == 0:
            continue
        if t.mem[n] > 0:
            open_.append([n, t.mem[n]])
            continue
        need = -t.mem[n]
        for item in reversed(open_):
            if need == 0:
                break
            if item[0] in ancestors[n] and item[1] > 0:
                take = min(need, item[1])
                pairs.append((item[0], n, take))
                item[1] -= take
                need -= take
        if need:
            return None
    return pairs if all(item[1] == 0 for item in open_) else None


def schedule_cpsat(problem: TesselProblem, t: Ticks, base: dict[tuple[str, int], int], horizon: int, *,
                   free: set[int] | None, time_limit_s: float, seed: int, workers: int,
                   deterministic: bool = False, deadline: float = math.inf) -> tuple[Order, Any]:
    """Solve the whole N-micro-batch schedule with CP-SAT (intervals, no-overlap, reservoir memory).

    `base` gives tick starts: a hint for free micro-batches, and the positions of the others, which
    move together by one shift (free=None frees all: the exact model). deterministic=True bounds
    CP-SAT's deterministic time with one worker instead of the wall clock. Returns per-device orders and
    the CP-SAT result. Raises InfeasibleError when no schedule within `horizon` ticks exists. `deadline`
    (perf_counter s) caps CP-SAT's wall limit at what is left once the model is built.
    """
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    n_mb = problem.microbatches
    is_free = (lambda i: True) if free is None else (lambda i: i in free)
    shift = m.new_int_var(-horizon, 0, "shift") if free is not None and len(free) < n_mb else None
    start: dict[tuple[str, int], Any] = {}
    for b in problem.blocks:
        for i in range(n_mb):
            if is_free(i):
                v = m.new_int_var(0, max(0, horizon - t.dur[b.name]), f"t_{b.name}_{i}")
                if (b.name, i) in base:
                    m.add_hint(v, base[(b.name, i)])
                start[(b.name, i)] = v
            else:
                start[(b.name, i)] = base[(b.name, i)] + shift
    if shift is not None:
        m.add(min(base[key] for key in base if not is_free(key[1])) + shift >= 0)
    for b in problem.blocks:
        for i in range(n_mb):
            for a in b.after:
                if is_free(i):
                    m.add(start[(b.name, i)] >= start[(a, i)] + t.dur[a])
            if i + 1 < n_mb and (is_free(i) or is_free(i + 1)):
                m.add(start[(b.name, i)] <= start[(b.name, i + 1)])
    for d, names in enumerate(_on_device(problem)):
        ivs = [m.new_fixed_size_interval_var(start[(n, i)], t.dur[n], f"iv_{n}_{i}_{d}")
               for n in names for i in range(n_mb)]
        m.add_no_overlap(ivs)
        if t.limit[d] is None:
            continue
        pairs = holding_pairs(problem, t, d)
        if pairs is not None:  # memory held from an allocation's start to its free's start
            held = []
            for a, f, units in pairs:
                for i in range(n_mb):
                    if is_free(i):
                        size: Any = m.new_int_var(0, horizon, f"len_{a}_{f}_{i}_{d}")
                        m.add(size == start[(f, i)] - start[(a, i)])
                    else:  # both ends move with the same shift
                        size = base[(f, i)] - base[(a, i)]
                    held.append((m.new_interval_var(start[(a, i)], size, start[(f, i)], f"hold_{a}_{f}_{i}_{d}"),
                                 units))
            m.add_cumulative([h for h, _ in held], [u for _, u in held], t.limit[d])
        else:
            keys = [(n, i) for n in names for i in range(n_mb) if t.mem[n] != 0]
            low = -sum(abs(t.mem[n]) for n, _ in keys)
            m.add_reservoir_constraint([start[key] for key in keys], [t.mem[n] for n, _ in keys],
                                       low, t.limit[d])
    end = m.new_int_var(0, horizon, "makespan")
    for (n, i), v in start.items():
        m.add(end >= v + t.dur[n])
    if shift is not None:
        m.add_hint(shift, 0)
    if base:  # a complete hint (CP-SAT ignores partial ones too easily)
        m.add_hint(end, min(horizon, max(base[(n, i)] + t.dur[n] for (n, i) in base)))
    m.minimize(end)
    if deterministic:  # one worker, deterministic time: the same answer on every run
        res = solve_cpsat(m, time_limit_s=None, deterministic_limit=time_limit_s, seed=seed, workers=1)
    else:
        left = max(0.01, min(time_limit_s, deadline - time.perf_counter()))
        res = solve_cpsat(m, time_limit_s=left, seed=seed, workers=workers)
    val = res.solver.value
    ticks: list[list[tuple[int, str, int]]] = [[] for _ in range(problem.devices)]
    for (n, i), v in start.items():
        at = val(v) if not isinstance(v, int) else v
        for d in problem.block(n).devices:
            ticks[d].append((at, n, i))
    return [[(n, i) for _, n, i in sorted(dev)] for dev in ticks], res


def _unrolled(problem: TesselProblem, pat: Pattern) -> list[list[Entry]]:
    """Return the pattern unrolled over N micro-batches and left-shifted (s); raise InfeasibleError
    when its warm-up exceeds a device's memory."""
    schedule = simulate(problem, unroll(problem, pat))
    if not _fits(problem, schedule):
        raise InfeasibleError("the unrolled repetend exceeds memory during warm-up; "
                              f"peaks {memory_peaks(problem, schedule)} bytes")
    return schedule


def _tick_starts(schedule: list[list[Entry]], tick_s: float) -> dict[tuple[str, int], int]:
    return {(e.block, e.microbatch): round(e.start_s / tick_s) for dev in schedule for e in dev}


def _fits(problem: TesselProblem, schedule: list[list[Entry]]) -> bool:
    return all(p <= problem.limit(d) * (1 + 1e-9) + 1e-9 for d, p in enumerate(memory_peaks(problem, schedule)))


# ---------------------------------------------------------------- the solvers


RANK = {"backward_input": 0, "backward": 0, "forward": 1, "backward_weight": 2, "other": 1}


def complete(problem: TesselProblem, pat: Pattern, clock: Clock | None = None
             ) -> tuple[list[list[Entry]], dict[str, Any]]:
    """Return the best full schedule (s) built around the repetend, and what each candidate gave.

    Candidates: the pattern unrolled and left-shifted; and list schedules of all N micro-batches at
    once (warm-up, steady state and cool-down together) whose priorities come from the pattern:
    an instance's unrolled start time, optionally after its kind (input gradients before forwards
    before weight gradients), with at most `window` micro-batches admitted ahead of the oldest
    unfinished one (window = the pattern's micro-batches in flight, + 0..3, or unbounded); and the
    same list schedules of the reversed problem, read backwards (see reversed_problem). Under a `clock`
    with a limit the unrolled pattern is always built; a candidate after it starts only when the clock
    allows one more schedule (the skipped ones are listed in clock.cut).
    """
    clock = clock or Clock(time.perf_counter(), None)
    base = {(b.name, i): pat.at(b.name, i) for b in problem.blocks for i in range(problem.microbatches)}
    kinds = {b.name: b.kind for b in problem.blocks}
    width = pat.in_flight()
    found: dict[str, float] = {}
    best = clock.timed(_unrolled, problem, pat)
    found["unrolled"] = best_s = makespan_s(best)
    priorities: dict[str, Callable[[str, int], tuple]] = {
        "time": lambda n, i: (base[(n, i)], n),
        "kind": lambda n, i: (RANK[kinds[n]], base[(n, i)], n)}
    for pname, prio in priorities.items():
        for window in (None, width, width + 1, width + 2, width + 3):
            if not clock.allows(f"completion {pname}/{window}"):
                continue
            try:
                cand = clock.timed(classic.list_schedule, problem, prio, window=window)
            except InfeasibleError:
                found[f"{pname}/{window}"] = float("nan")
                continue
            found[f"{pname}/{window}"] = cand_s = makespan_s(cand)
            if cand_s < best_s - 1e-9 and _fits(problem, cand):
                best, best_s = cand, cand_s
    # the same in reverse: schedule the reversed problem (dependencies flipped, memory negated) from
    # the end, with the reversed pattern's priorities, then run its per-device orders forwards. This
    # packs the cool-down as tightly as the forward pass packs the warm-up.
    rev = reversed_problem(problem)
    n, dur = problem.microbatches, {b.name: b.duration_s for b in problem.blocks}
    rbase = {(b.name, i): -pat.at(b.name, n - 1 - i) - dur[b.name] / 1e6 for b in problem.blocks for i in range(n)}
    for window in (None, width, width + 1, width + 2, width + 3):
        key = f"reverse/{window}"
        if not clock.allows(f"completion {key}"):
            continue
        try:
            back = clock.timed(classic.list_schedule, rev, lambda a, i: (rbase[(a, i)], a), window=window)
            orders = [[(e.block, n - 1 - e.microbatch) for e in sorted(dev, key=lambda e: -e.end_s)] for dev in back]
            cand = simulate(problem, orders)
        except (InfeasibleError, DeadlockError):
            found[key] = float("nan")
            continue
        found[key] = cand_s = makespan_s(cand)
        if cand_s < best_s - 1e-9 and _fits(problem, cand):
            best, best_s = cand, cand_s
    return best, {"completion_candidates_s": found}


def reversed_problem(problem: TesselProblem) -> TesselProblem:
    """Return the problem with every dependency flipped and every memory delta negated (same limits):
    a schedule of it, read backwards in time, is a schedule of the original."""
    succ: dict[str, list[str]] = {b.name: [] for b in problem.blocks}
    for b in problem.blocks:
        for a in b.after:
            succ[a].append(b.name)
    blocks = [b.model_copy(update={"after": succ[b.name], "memory_bytes": -b.memory_bytes}) for b in problem.blocks]
    return problem.model_copy(update={"blocks": blocks})


GROUP_MAX_BLOCKS = 512  # the grouped repetend search runs up to this many blocks (group x blocks)
SEED_GROUPS = 6  # groups of micro-batches in the run the grouped repetend's seed is read from


def _group_size(problem: TesselProblem) -> int:
    """Return the micro-batches per period of the second repetend search (the device count, as in
    interleaved 1F1B), or 1 when it does not apply (one device, too few micro-batches, too large)."""
    k = problem.devices
    if k <= 1 or problem.microbatches < k or k * len(problem.blocks) > GROUP_MAX_BLOCKS:
        return 1
    return k


def solve_tessel(problem: TesselProblem, *, time_limit_s: float | None = None, seed: int = 0,
                 progress: Callable[..., None], workers: int = 2, completion: bool = True,
                 polish_s: float = 0.0, latency_search_s: float = 0.0, floor: bool = True) -> TesselPlan:
    """Return Tessel's schedule: the minimum-period repetend, then its completion over N micro-batches.

    floor=True also runs every baseline that applies (cheap list schedules) and returns the best of
    them when it is shorter, so Tessel is never worse than a baseline on the same input; stats
    `schedule_from` names where the schedule came from. When the best baseline already meets the lower
    bound no repetend can beat it: it is returned as optimal without a search (stats `search_skipped`).
    Every CP-SAT call runs on one worker under a deterministic-time limit only, so the plan does not
    depend on the machine's load.

    time_limit_s (wall seconds) caps those deterministic budgets (CPSAT_SHARE of it at DET_PER_WALL_S
    units per second, shared out by Clock.det_budget; see probe_budget) and arms a wall-clock guard
    (Clock): no step (period probe, completion candidate, baseline, grouped search) starts that could end
    past GUARD_END of the limit; the best plan in hand is then returned with status time_limit (stats
    `time_limit_cut` names the skipped steps). Without a limit the guard is off and every call gets its
    default budget. A plan can differ under load only when the guard cut the search.

    When the completed schedule misses the lower bound, a second search looks for a repetend of p
    micro-batches per period (p devices; see grouped) and keeps it when its schedule is shorter.
    completion=False keeps the unrolled, left-shifted pattern. latency_search_s sets the CP-SAT
    deterministic time spent on the pattern's one-micro-batch latency (0: a tenth of one search
    step's). The polish is a CP-SAT pass that re-solves the first and last in-flight micro-batches
    jointly with the repeated middle (moved as one piece) for polish_s deterministic seconds (off by
    default: on the benchmark shapes it rarely pays for its time; skipped when the schedule already
    meets the lower bound). Plan times are seconds; stats hold ticks and timings.
    """
    started = time.perf_counter()
    clock = Clock(started, time_limit_s)
    spans: dict[int, tuple[list[list[Entry]], float]] = {}

    def span(schedule: list[list[Entry]]) -> float:  # makespan_s, once per schedule (long runs: ~0.1 s each)
        if id(schedule) not in spans:
            spans[id(schedule)] = (schedule, makespan_s(schedule))
        return spans[id(schedule)][1]

    limit = float(time_limit_s or 20.0)
    t = integerize(problem)
    bound = lower_bound_s(problem)
    base_plan = best_baseline(problem, clock)  # the floor, and the seed of the grouped repetend
    stats: dict[str, Any] = {}
    if floor and base_plan is not None and base_plan.makespan_s <= bound * (1 + 1e-9):
        # no repetend can beat a schedule at the lower bound: return it, with the repetend it repeats (None
        # when its steady state does not repeat, e.g. GPipe at small N)
        pat, own = _baseline_pattern(problem, t, base_plan)
        stats.update(search_skipped=f"{base_plan.schedule_name} meets the lower bound {bound:g} s",
                     best_baseline={base_plan.schedule_name: base_plan.makespan_s},
                     schedule_from=base_plan.schedule_name, search_s=time.perf_counter() - started,
                     time_limit_cut=clock.cut[:20], period_ticks=pat.period if pat else None,
                     group=pat.group if pat else None,
                     period_proven_minimal=pat is not None and pat.period == pat.group * max(_busy(problem, t)))
        rep = None if pat is None else _record(problem, t, base_plan.schedule, pat, window=own)
        plan = make_plan(problem, base_plan.schedule, "tessel", Status.OPTIMAL, rep)
        plan.predicted["search_s"] = stats["search_s"]
        plan.solver = SolverInfo(name="tessel", stats=stats)
        progress(1.0, "done")
        return plan
    floored = floor and base_plan is not None
    pat: Pattern | None = None  # stays None when the guard stops the search before any repetend: the floor stands
    # (under a limit shorter than CP-SAT's first import in this process, the search is not started)
    if not floored or clock.allows("OR-Tools' first import", cold_import_s(CP_MODEL)):
        try:
            pat, more = find_repetend(problem, t, time_limit_s=limit * 0.8, seed=seed, progress=progress,
                                      latency_search_s=latency_search_s, clock=clock)
            stats.update(more)
        except SolverError:
            if not (floored and clock.cut):
                raise
    stats["repetend_search_s"] = time.perf_counter() - started
    schedule: list[list[Entry]] | None = None
    # the unrolled repetend is one more schedule of N micro-batches: with a floor in hand, only if time allows
    if pat is not None and (base_plan is None or not floor or clock.allows("completion")):
        if completion:
            progress(0.6, "completing warm-up and cool-down")
            schedule, more = complete(problem, pat, clock)
            stats.update(more)
        else:
            schedule = clock.timed(_unrolled, problem, pat)
    group = _group_size(problem)
    if pat is not None and schedule is not None and group > 1 and span(schedule) > bound * (1 + 1e-9) \
            and clock.allows("grouped repetend"):
        # a repetend of `group` micro-batches per period can express patterns one micro-batch cannot
        # (interleaved 1F1B runs micro-batches in groups of p). The free grouped search is too hard for
        # CP-SAT in the budget, so it is seeded by the best baseline's periodic steady state at `group`
        # busy periods, confirmed (or repaired) by CP-SAT, and completed like any repetend
        progress(0.7, f"repetend of {group} micro-batches")
        gp, chains = grouped(problem, group)
        gt = grouped_ticks(t, group)
        period = group * stats["period_lower_bound_ticks"]
        # the steady state does not depend on N: read it from the shortest baseline with a periodic one
        # on a run of SEED_GROUPS groups (its cost does not grow with N), else from this run's best baseline
        seed_pat, seeded_by = None, None
        longer = problem.model_copy(update={"microbatches": SEED_GROUPS * group})
        sources = [(longer, plan_) for plan_ in baseline_plans(longer, clock)]
        for src, src_plan in sources + [(problem, base_plan)]:
            if src_plan is not None and seed_pat is None:
                seed_pat = pattern_from_schedule(src, gt, src_plan.schedule, group, period)
                seeded_by = f"{src_plan.schedule_name} at N={src.microbatches}"
        budget = clock.det_budget(probe_budget(problem))
        gpat = None if seed_pat is None or not clock.allows("grouped pattern", budget / DET_PER_WALL_S) else \
            _repetend_at(gp, gt, period, budget, seed, optimise=False, hint=seed_pat, chains=chains, clock=clock)
        stats["grouped"] = {"group": group, "period_ticks": period, "seeded_by": seeded_by if seed_pat else None,
                            "found": gpat is not None}
        if gpat is not None and clock.allows("grouped completion"):
            gpat.group = group
            try:
                gsched, gmore = complete(problem, gpat, clock) if completion else \
                    (clock.timed(_unrolled, problem, gpat), {})
            except InfeasibleError as exc:
                stats["grouped"]["error"] = str(exc)[:200]
            else:
                stats["grouped"]["makespan_s"] = span(gsched)
                if span(gsched) < span(schedule) - 1e-9:
                    pat, schedule = gpat, gsched
                    stats.update(gmore)
        stats["repetend_search_s"] = time.perf_counter() - started
    width = pat.in_flight() if pat is not None else 0
    at_bound = schedule is not None and span(schedule) <= bound * (1 + 1e-9)
    stats["polish_skipped_at_bound"] = at_bound
    if polish_s > 0 and problem.microbatches > 1 and schedule is not None and not at_bound \
            and clock.allows("polish", polish_s / DET_PER_WALL_S):
        n = problem.microbatches
        free = set(range(min(n, width))) | set(range(max(0, n - width), n))
        base = _tick_starts(schedule, t.tick_s)
        try:
            orders2, res = schedule_cpsat(problem, t, base, round(span(schedule) / t.tick_s) + 1, free=free,
                                          time_limit_s=polish_s, seed=seed, workers=workers, deterministic=True)
            sched2 = simulate(problem, orders2)
            if span(sched2) < span(schedule) - 1e-9 and _fits(problem, sched2):
                schedule = sched2
            stats["polish_status"] = res.status.value
        except Exception as exc:  # noqa: BLE001 - polishing is optional; keep the completed plan
            stats["polish_error"] = str(exc)[:200]
    stats["schedule_from"] = "repetend"
    if floor and base_plan is not None:  # never worse than a baseline run on the same input: the best is the floor
        stats["best_baseline"] = {base_plan.schedule_name: base_plan.makespan_s}
        if schedule is None or base_plan.makespan_s < span(schedule) - 1e-9:
            schedule = base_plan.schedule
            stats["schedule_from"] = base_plan.schedule_name
    assert schedule is not None  # without a floor the unrolled repetend is always built
    stats["search_s"] = time.perf_counter() - started
    rep = None if pat is None else _record(problem, t, schedule, pat, window=stats["schedule_from"] == "repetend")
    at_bound = span(schedule) <= bound * (1 + 1e-9)  # then proven optimal
    status, message = Status.OPTIMAL if at_bound else Status.FEASIBLE, ""
    if clock.cut and not at_bound:
        status = Status.TIME_LIMIT
        message = (f"time limit {time_limit_s:g} s: the best plan in hand ({stats['schedule_from']}); "
                   f"{len(clock.cut)} step(s) not started, first: {clock.cut[0]}")
    stats["time_limit_cut"] = clock.cut[:20]
    plan = make_plan(problem, schedule, "tessel", status, rep, message=message)
    plan.predicted["search_s"] = stats["search_s"]
    plan.solver = SolverInfo(name="tessel", stats={**stats, "period_ticks": pat.period if pat else None,
                                                   "group": pat.group if pat else None,
                                                   "microbatches_in_flight": width})
    progress(1.0, "done")
    return plan


def _record(problem: TesselProblem, t: Ticks, schedule: list[list[Entry]], pat: Pattern, window: bool) -> Repetend:
    """Return the plan's Repetend (s) of a pattern; `window` marks one period of the schedule's steady state."""
    return Repetend(period_s=pat.period * t.tick_s / pat.group,
                    offset_s={n: v * t.tick_s for n, v in pat.start.items()}, lag=dict(pat.lag),
                    window_s=_window(problem, schedule, pat.period * t.tick_s) if window else None,
                    copies=max(0, (problem.microbatches - pat.in_flight()) // pat.group + 1), group=pat.group)


def steady_pattern(problem: TesselProblem, t: Ticks, schedule: list[list[Entry]]) -> Pattern | None:
    """Return the repetend a schedule already repeats (ticks): one micro-batch every busy period, else a
    group of p every p busy periods (see pattern_from_schedule); None when its steady state is neither."""
    busy = max(_busy(problem, t))
    for group in sorted({1, _group_size(problem)}):
        pat = pattern_from_schedule(problem, grouped_ticks(t, group), schedule, group, group * busy)
        if pat is not None and group == 1:  # the keys of one micro-batch per period are the block names
            pat = Pattern(pat.period, {k[:-2]: v for k, v in pat.start.items()},
                          {k[:-2]: v for k, v in pat.lag.items()}, pat.span)
        if pat is not None:
            return pat
    return None


def _baseline_pattern(problem: TesselProblem, t: Ticks, plan: TesselPlan) -> tuple[Pattern | None, bool]:
    """Return the repetend a baseline's schedule repeats (see steady_pattern) and whether it was read from
    the plan itself, else from the same baseline on a run of SEED_GROUPS groups of p micro-batches (the
    steady state does not depend on N; short runs may have none); (None, False) when neither repeats."""
    pat = steady_pattern(problem, t, plan.schedule)
    if pat is not None:
        return pat, True
    build, applicable = BASELINES[plan.schedule_name]
    longer = problem.model_copy(update={"microbatches": SEED_GROUPS * max(1, problem.devices)})
    if pat is None and longer.microbatches > problem.microbatches and applicable(longer) is None:
        try:
            sched = build(longer)
        except (InfeasibleError, DeadlockError):
            return None, False
        if _fits(longer, sched):
            pat = steady_pattern(longer, t, sched)
    return pat, False


def _window(problem: TesselProblem, schedule: list[list[Entry]], period_s: float) -> tuple[float, float] | None:
    """Return one period of the steady state: from the start of the middle micro-batch's first block."""
    first = topological_order(problem.blocks)[0]  # type: ignore[index]
    mid = problem.microbatches // 2
    at = [e.start_s for dev in schedule for e in dev if e.block == first and e.microbatch == mid]
    return (at[0], at[0] + period_s) if at else None


def solve_exact(problem: TesselProblem, *, time_limit_s: float | None = None, seed: int = 0,
                progress: Callable[..., None], workers: int = 2) -> TesselPlan:
    """Return the exact CP-SAT schedule of all N micro-batches (optimal, or the best found in the limit),
    started from the best of Tessel's schedule and every applicable baseline as a hint and upper bound;
    without one CP-SAT searches alone within the sequential horizon (N times the sum of all durations).
    predicted["proven_bound_s"] is the makespan bound (s) CP-SAT proved (or the model's lower bound),
    so the gap of any schedule to the optimum is known even when the time limit stops the search.
    Under time_limit_s (wall s, counted from the start) Tessel's hint runs under EXACT_HINT_SHARE of it
    and CP-SAT gets what the hint, the baselines and building its model left, less EXACT_FINISH_SHARE
    for assembling the plan; without one, Tessel runs unlimited and CP-SAT gets 30 s."""
    started = time.perf_counter()
    limit = float(time_limit_s or 30.0)
    t = integerize(problem)
    try:  # under a time limit Tessel gets EXACT_HINT_SHARE of it, CP-SAT the rest
        hint: TesselPlan | None = solve_tessel(
            problem, time_limit_s=None if time_limit_s is None else EXACT_HINT_SHARE * limit, seed=seed,
            progress=progress, workers=workers)
    except (InfeasibleError, SolverError):  # the exact model decides on its own
        hint = None
    tessel_hint = hint is not None
    base_plan = best_baseline(problem)  # Tessel already floors with it; it still hints when Tessel fails
    if base_plan is not None and (hint is None or base_plan.makespan_s < hint.makespan_s - 1e-9):
        hint = base_plan
    hint_from = None if hint is None else (hint.solver.stats.get("schedule_from", "tessel")
                                           if hint.solver and hint.schedule_name == "tessel" else hint.schedule_name)
    if hint is not None:
        base = _tick_starts(hint.schedule, t.tick_s)
        horizon = int(hint.makespan_s / t.tick_s * 1.02) + max(t.dur.values())
    else:
        base, horizon = {}, problem.microbatches * sum(t.dur.values())

    def hint_plan(hint: TesselPlan, status: Status, message: str = "") -> TesselPlan:
        plan = make_plan(problem, hint.schedule, "exact", status, message=message)
        plan.predicted["proven_bound_s"] = plan.predicted["lower_bound_s"]
        plan.solver = SolverInfo(name="exact", stats={"hint_from": hint_from, "tessel_hint": tessel_hint,
                                                      "bound_s": plan.predicted["lower_bound_s"]})
        return plan

    if hint is not None and hint.makespan_s <= lower_bound_s(problem) * (1 + 1e-9):
        return hint_plan(hint, Status.OPTIMAL)  # the hint meets the lower bound: nothing for CP-SAT to prove
    # the limit counts from the start: CP-SAT gets what the hint and the model building left
    deadline = math.inf if time_limit_s is None else started + (1 - EXACT_FINISH_SHARE) * limit
    if hint is not None and (why := cold_import_outlasts(CP_MODEL, None if time_limit_s is None else
                                                         deadline - time.perf_counter())):
        return hint_plan(hint, Status.TIME_LIMIT, f"{why}; the hint ({hint_from}) is shown")
    progress(0.3, "exact CP-SAT schedule")
    try:
        orders, res = schedule_cpsat(problem, t, base, horizon, free=None, time_limit_s=limit, seed=seed,
                                     workers=workers, deadline=deadline)
    except SolverError:  # nothing better found in time: the hint stands, unproven
        if hint is None:
            raise
        return hint_plan(hint, Status.TIME_LIMIT,
                         f"CP-SAT found no schedule in the limit; the hint ({hint_from}) is shown")
    except InfeasibleError as exc:
        if hint is not None:  # only the horizon is infeasible: the hint is already the best schedule
            return hint_plan(hint, Status.FEASIBLE)
        raise InfeasibleError(f"no schedule of {problem.microbatches} micro-batches fits the memory limits "
                              f"{[problem.limit(d) for d in range(problem.devices)]} bytes within "
                              f"{horizon * t.tick_s:g} s (one micro-batch after the other)") from exc
    schedule = simulate(problem, orders)
    if hint is not None and makespan_s(schedule) > hint.makespan_s + 1e-9:
        schedule = hint.schedule
    bound_s = max(lower_bound_s(problem), (res.bound or 0) * t.tick_s)
    status = Status.OPTIMAL if makespan_s(schedule) <= bound_s * (1 + 1e-9) + 1e-9 else res.status
    plan = make_plan(problem, schedule, "exact", status)
    plan.predicted["lower_bound_s"] = bound_s
    plan.predicted["proven_bound_s"] = bound_s
    if status != Status.OPTIMAL:
        plan.message = (f"best found {plan.makespan_s:g} s, proven bound {bound_s:g} s "
                        f"(gap {100 * (plan.makespan_s / bound_s - 1):.1f}%)" if bound_s > 0 else "")
    plan.solver = SolverInfo(name="exact", stats={"bound_s": bound_s, "cpsat_wall_s": res.wall_time_s,
                                                  "tessel_hint": tessel_hint, "hint_from": hint_from,
                                                  **res.stats})
    return plan


def _exact_applies(problem: TesselProblem) -> str | None:
    n = problem.microbatches * len(problem.blocks)
    return None if n <= EXACT_MAX_INSTANCES else \
        f"{n} block instances > {EXACT_MAX_INSTANCES}"


def _checked(problem: TesselProblem, schedule: list[list[Entry]], name: str) -> TesselPlan:
    peaks = memory_peaks(problem, schedule)
    for d, p in enumerate(peaks):
        if p > problem.limit(d) * (1 + 1e-9) + 1e-9:
            raise InfeasibleError(f"{name} needs {p:g} bytes on device {d}; its limit is {problem.limit(d):g} bytes")
    return make_plan(problem, schedule, name, Status.FEASIBLE)


def _baseline(name: str, build: Callable[[TesselProblem], list[list[Entry]]]) -> Callable[..., TesselPlan]:
    def fn(problem: TesselProblem, *, time_limit_s: float | None = None, seed: int = 0,
           progress: Callable[..., None], **_: Any) -> TesselPlan:
        return _checked(problem, build(problem), name)
    fn.__name__ = f"solve_{name}"
    return fn


def _interleaved_chunks(problem: TesselProblem) -> int:
    st = classic.stages(problem) or {}
    return max(1, len(st) // problem.devices)


def _interleaved_reason(problem: TesselProblem) -> str | None:
    v = _interleaved_chunks(problem)
    reason = classic.pipeline_reason(problem, chunks=v)
    if reason:
        return reason
    if v > 1 and problem.microbatches % problem.devices:
        return f"needs micro-batches ({problem.microbatches}) divisible by devices ({problem.devices})"
    return None


def _zb(in_flight: Callable[[TesselProblem, int], float],
        handcrafted: Callable[[TesselProblem], list[tuple[Callable[[int], int], Callable[[int], int]]]] | None = None
        ) -> Callable[[TesselProblem], list[list[Entry]]]:
    """Return a zero-bubble builder: the shortest of the paper's handcrafted orders (`handcrafted` gives
    (warm-up, W delay) per device rule) and the greedy list schedule, among those within the memory of
    `in_flight` micro-batches per device."""
    def build(problem: TesselProblem) -> list[list[Entry]]:
        cap = classic.one_f_one_b_cap(problem, lambda d: in_flight(problem, d))
        candidates: list[list[list[Entry]]] = []
        for warmup, delay in (handcrafted(problem) if handcrafted else []):
            try:
                candidates.append(simulate(problem, classic.zero_bubble_orders(problem, warmup, delay)))
            except DeadlockError:
                continue
        try:
            candidates.append(classic.list_schedule(problem, classic.zb_priority(problem), cap=cap))
        except InfeasibleError:
            pass
        fit = [c for c in candidates
               if all(pk <= cap[d] * (1 + 1e-9) + 1e-9 for d, pk in enumerate(memory_peaks(problem, c)))]
        if not fit:
            raise InfeasibleError(f"no zero-bubble order fits the memory caps {cap} bytes")
        return min(fit, key=makespan_s)  # the first of equals: the handcrafted order
    return build


def _h1_rules(problem: TesselProblem) -> list[tuple[Callable[[int], int], Callable[[int], int]]]:
    """ZB-H1 (warm-up p-1-r, W delayed by r), then 1F1B with a split backward (W at once)."""
    p = problem.devices
    return [(lambda r: p - 1 - r, lambda r: r), (lambda r: p - 1 - r, lambda r: 0)]


def _h2_rules(problem: TesselProblem) -> list[tuple[Callable[[int], int], Callable[[int], int]]]:
    """ZB-H2 (warm-up 2(p-1-r), W delayed by 2r), then the ZB-H1 rules (fewer in flight)."""
    p = problem.devices
    return [(lambda r: 2 * (p - 1 - r), lambda r: 2 * r)] + _h1_rules(problem)


def _textbook_1f1b(problem: TesselProblem) -> list[list[Entry]]:
    """Return 1F1B with the backward fused (B and W as one block that passes the gradient upstream only
    when both are done): the textbook (m + p - 1)(F + B + W) makespan."""
    fused = classic.fused_problem(problem)
    return classic.unfuse(problem, simulate(fused, classic.interleaved_orders(fused, 1)))


def _split_reason(problem: TesselProblem) -> str | None:
    if not any(b.kind == "backward_weight" for b in problem.blocks):
        return "needs the backward split into input (B) and weight (W) blocks"
    return None


def _gpipe_reason(problem: TesselProblem) -> str | None:
    return classic.pipeline_reason(problem, chunks=_interleaved_chunks(problem))


TESSEL_RULES = {
    "workers": integer(1, MAX_WORKERS),  # CP-SAT search workers (the polish)
    "completion": flag(),
    "floor": flag(),
    # deterministic CP-SAT seconds, at most the 1e9 s every input quantity in seconds is bounded by (gpuplan.units)
    "polish_s": number(0, UPPER_LIMITS["s"], low_open=True, special={0: "off"}),
    "latency_search_s": number(0, UPPER_LIMITS["s"], low_open=True,
                               special={0: "automatic: a tenth of one search step's budget"}),
}
"""The domain of Tessel's options, which registry.check_options enforces."""

register_solver("tessel", "tessel", solve_tessel, role="paper", default=True,
                description="repetend (cyclic CP-SAT, min period under memory) + joint warm-up/cool-down completion",
                option_rules=TESSEL_RULES)


def solve_tessel_unrolled(problem: TesselProblem, *, time_limit_s: float | None = None, seed: int = 0,
                          progress: Callable[..., None], workers: int = 2, polish_s: float = 0.0,
                          latency_search_s: float = 0.0) -> TesselPlan:
    """Return the minimum-period repetend unrolled over the micro-batches and left-shifted, without
    Tessel's completion step or its baseline floor (solve_tessel with completion=False, floor=False;
    the other options as there: time_limit_s in wall seconds, polish_s and latency_search_s in
    deterministic CP-SAT seconds)."""
    return solve_tessel(problem, time_limit_s=time_limit_s, seed=seed, progress=progress, workers=workers,
                        completion=False, polish_s=polish_s, latency_search_s=latency_search_s, floor=False)


register_solver("tessel", "tessel-unrolled", solve_tessel_unrolled, role="variant",
                description="the repetend unrolled and left-shifted, without the completion step or the baseline floor",
                option_rules={k: TESSEL_RULES[k] for k in ("workers", "polish_s", "latency_search_s")})
register_solver("tessel", "exact", solve_exact, role="exact", applicable=_exact_applies,
                description="CP-SAT over every block instance (intervals, no-overlap, reservoir memory)",
                option_rules={"workers": TESSEL_RULES["workers"]})
BASELINES: dict[str, tuple[Callable[[TesselProblem], list[list[Entry]]], Callable[[TesselProblem], str | None]]] = {}


def _register_baseline(name: str, build: Callable[[TesselProblem], list[list[Entry]]],
                       applicable: Callable[[TesselProblem], str | None], description: str) -> None:
    """Register a baseline and keep it in BASELINES, which Tessel and exact run as their floor."""
    BASELINES[name] = (build, applicable)
    register_solver("tessel", name, _baseline(name, build), role="baseline", applicable=applicable,
                    description=description)


def baseline_plans(problem: TesselProblem, clock: Clock | None = None) -> list[TesselPlan]:
    """Return the plan of every baseline that applies and fits the memory, shortest first (ties in
    registration order). Under a `clock` with a limit, once one plan is in hand a baseline starts only
    when the clock allows one more schedule (the skipped ones are listed in clock.cut)."""
    clock = clock or Clock(time.perf_counter(), None)
    plans: list[TesselPlan] = []
    for name, (build, applicable) in BASELINES.items():
        if applicable(problem) is not None:
            continue
        if plans and not clock.allows(f"baseline {name}"):
            continue
        try:
            plans.append(clock.timed(lambda: _checked(problem, build(problem), name)))
        except (InfeasibleError, DeadlockError):
            continue
    return sorted(plans, key=lambda plan: plan.makespan_s)


def best_baseline(problem: TesselProblem, clock: Clock | None = None) -> TesselPlan | None:
    """Return the shortest plan of every baseline that applies and fits the memory (None when none does);
    ties go to the first registered. `clock`: see baseline_plans."""
    plans = baseline_plans(problem, clock)
    return plans[0] if plans else None


_register_baseline("gpipe", lambda p: simulate(p, classic.gpipe_orders(p)), _gpipe_reason,
                   "all forwards, then all backwards")
_register_baseline("1f1b", lambda p: simulate(p, classic.interleaved_orders(p, 1)),
                   lambda p: classic.pipeline_reason(p, chunks=1),
                   "PipeDream-flush / DAPPLE one-forward-one-backward; on a split backward W follows its B at once "
                   "but the gradient leaves with B: m(F+B+W) + (p-1)(F+B), stronger than the textbook "
                   "(m+p-1)(F+B+W) of 1f1b-textbook")
_register_baseline("1f1b-textbook", _textbook_1f1b,
                   lambda p: classic.pipeline_reason(p, chunks=1) or _split_reason(p),
                   "textbook 1F1B: the backward as one block (B then W) before the gradient moves upstream: "
                   "(m+p-1)(F+B+W)")
_register_baseline("interleaved-1f1b", lambda p: simulate(p, classic.interleaved_orders(p, _interleaved_chunks(p))),
                   _interleaved_reason, "Megatron's interleaved 1F1B (virtual stages)")
_register_baseline("zb-h1", _zb(lambda p, d: p.devices, _h1_rules),
                   lambda p: classic.pipeline_reason(p, chunks=1) or _split_reason(p),
                   "zero bubble H1: 1F1B's memory, W of micro-batch j after the B of j+r on device r (the paper's "
                   "order: m(F+B+W) + (p-1)(F+B-W) when W <= F, m >= p), or the greedy order when shorter")
_register_baseline("zb-h2", _zb(lambda p, d: 2 * p.devices - 1, _h2_rules),
                   lambda p: classic.pipeline_reason(p, chunks=1) or _split_reason(p),
                   "zero bubble H2: up to 2p-1 micro-batches in flight, 2(p-1-r) warm-up forwards, W delayed by "
                   "2r (m(F+B+W) + (p-1)(F+B-2W) when B >= 2W, m >= 2p-1), or ZB-H1 / the greedy order when shorter")
_register_baseline("zb-v", _zb(lambda p, d: p.devices), lambda p: classic.pipeline_reason(p, v_shape=True)
                   or _split_reason(p), "zero bubble V: two chunks per device in a V, 1F1B's memory")
_register_baseline("chimera", _zb(lambda p, d: p.devices), classic.chimera_reason,
                   "Chimera-style bidirectional pipelines, greedy, p micro-batch pairs in flight")
