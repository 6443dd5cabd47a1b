"""The discrete-event core every simulated kind shares (serving, RL updates, straggler scheduling).

One event queue ordered by (time, sequence), seeded arrival processes, and the latency statistics
the kinds report (percentiles, SLO attainment). Kinds write their own policies on top; none keeps
its own copy of an event loop. Pure Python and numpy: models/ may import it (no solver, no torch).
"""

from __future__ import annotations

import heapq
import math
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, Iterable, Iterator, Literal, TypeVar

import numpy as np

from gpuplan.errors import SolverError

T = TypeVar("T")

ArrivalProcess = Literal["poisson", "gamma", "uniform"]


@dataclass(order=True)
class Event(Generic[T]):
    """One event: when it happens (s), a tie-breaking sequence number, and what it carries."""

    time_s: float
    seq: int
    payload: T = field(compare=False)


class EventQueue(Generic[T]):
    """A priority queue of events by time (s); events at the same time leave in the order they came.

    Deterministic: no hashing or object identity decides an order, so a seed replays exactly.
    """

    def __init__(self) -> None:
        # (time, seq, payload) tuples: tuple comparison in C, never reaching the payload (seq is unique)
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0

    def push(self, time_s: float, payload: T) -> Event[T]:
        """Schedule `payload` at `time_s` (s); return the event. Refuses a non-finite time."""
        if not math.isfinite(time_s):
            raise ValueError(f"event time {time_s!r} is not finite")
        entry = (float(time_s), self._seq, payload)
        self._seq += 1
        heapq.heappush(self._heap, entry)
        return Event(*entry)

    def pop(self) -> Event[T]:
        """Remove and return the earliest event (IndexError when empty)."""
        return Event(*heapq.heappop(self._heap))

    def peek_time(self) -> float:
        """Return the earliest event's time (s), or +inf when the queue is empty."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_until(self, time_s: float) -> list[Event[T]]:
        """Remove and return every event at or before `time_s` (s), earliest first."""
        out: list[Event[T]] = []
        while self._heap and self._heap[0][0] <= time_s:
            out.append(Event(*heapq.heappop(self._heap)))
        return out

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


# ------------------------------------------------------------------ the solve's clock


class SimulationCut(SolverError):
    """A search's simulation reached the solve's time limit before it finished (`solve_clock`): its
    figures do not exist, and the search drops the candidate it was rating (`Deadline.attempt`)."""


@dataclass
class SolveClock:
    """The time limit the simulations of one solve's search obey, on the `time.perf_counter` clock (inf:
    none). Only simulations inside `searching` are cut: they stop at `at - longest_s` (`longest_s` the
    longest simulation finished so far, seconds; before any has finished, half-way to `at`), so that the
    simulation of the chosen plan's own figures, which always runs to its end, still fits after them;
    or at `at` where the search says the plan it would return now needs no simulation of its own
    (`searching(reserve=False)`). A solve thus overruns its limit only by the least work that makes one
    plan."""

    at: float = math.inf
    longest_s: float = 0.0
    reserves: list[bool] = field(default_factory=list)  # one per `searching` block open, innermost last
    open_stop: float | None = None  # the stop of the simulation running in a search (its parts share it)

    def stop_at(self, now: float) -> float:
        """Return when a simulation started at `now` must stop (perf_counter seconds; inf: never)."""
        if not self.reserves or self.at == math.inf:
            return math.inf
        if not self.reserves[-1]:
            return self.at
        return self.at - self.longest_s if self.longest_s else now + 0.5 * (self.at - now)


_CLOCK: ContextVar[SolveClock] = ContextVar("gpuplan_solve_clock", default=SolveClock())


@contextmanager
def solve_clock(time_limit_s: float | None) -> Iterator[SolveClock]:
    """Run the block as one solve whose searches' simulations stop by `time_limit_s` seconds from now
    (none: never; see SolveClock); yields the clock."""
    clock = SolveClock(math.inf if time_limit_s is None else time.perf_counter() + time_limit_s)
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


@contextmanager
def searching(reserve: bool = True) -> Iterator[None]:
    """Run the block as part of a search: its simulations stop by the solve's time limit, keeping room for
    the chosen plan's own simulation unless `reserve` is False (SolveClock)."""
    clock = _CLOCK.get()
    clock.reserves.append(reserve)
    try:
        yield
    finally:
        clock.reserves.pop()
        clock.open_stop = None  # a simulation the block left unfinished (cut, or an error) is over


class SimulationWatch:
    """One simulation's check against the solve's clock: `tick` once per iteration (the clock is read
    every 32), `done` at the end (it records the simulation's length). Inside a search it raises
    SimulationCut when the stop passes, or at once when the longest simulation so far would not end
    before it. A watch opened while another runs (an engine's run inside a whole plan's) is part of
    that simulation: it shares its stop and records nothing."""

    EVERY = 32

    def __init__(self, what: str) -> None:
        self.clock, self.what, self.n = _CLOCK.get(), what, 0
        self.started = time.perf_counter()
        running = self.clock.open_stop
        self.part = running is not None
        if running is not None:
            self.stop = running
            return
        self.stop = self.clock.stop_at(self.started)
        if self.stop < math.inf:
            self.clock.open_stop = self.stop
        if self.started + self.clock.longest_s > self.stop:
            keep = ", and the chosen plan's own simulation must follow" if self.clock.reserves[-1] else ""
            raise SimulationCut(f"a simulation of {what} would not end in the time limit (the longest so far took "
                                f"{self.clock.longest_s:.2g} s, {max(0.0, self.clock.at - self.started):.2g} s are "
                                f"left{keep})")

    def tick(self) -> None:
        """Count one iteration; raise SimulationCut when the clock has passed the stop."""
        self.n += 1
        if self.n % self.EVERY == 0 and self.stop < math.inf:
            now = time.perf_counter()
            if now > self.stop:
                raise SimulationCut(f"the time limit stopped a simulation of {self.what} after "
                                    f"{now - self.started:.2g} s")

    def done(self) -> None:
        """Record that the simulation finished (its length, for the room a search keeps)."""
        if not self.part:
            self.clock.open_stop = None
            self.clock.longest_s = max(self.clock.longest_s, time.perf_counter() - self.started)


def rng(seed: int) -> np.random.Generator:
    """Return the numpy generator every simulator draws from (PCG64 seeded with `seed`)."""
    return np.random.default_rng(seed)


def arrival_times(n: int, rate_per_s: float, *, seed: int = 0, process: ArrivalProcess = "poisson",
                  cv: float = 1.0, start_s: float = 0.0) -> np.ndarray:
    """Return `n` increasing arrival times (s) at mean `rate_per_s` arrivals per second.

    poisson: exponential gaps. gamma: gamma gaps with coefficient of variation `cv` (cv > 1 is
    bursty, cv = 1 is Poisson, cv < 1 smoother). uniform: evenly spaced gaps of 1/rate.
    """
    if n < 0:
        raise ValueError(f"n = {n}; expected a count >= 0")
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"rate {rate_per_s!r} arrivals/s; expected a finite rate > 0")
    mean_gap = 1.0 / rate_per_s
    if process == "uniform":
        gaps = np.full(n, mean_gap)
    elif process == "poisson":
        gaps = rng(seed).exponential(mean_gap, n)
    elif process == "gamma":
        if not (math.isfinite(cv) and cv > 0):
            raise ValueError(f"cv {cv!r}; expected a finite coefficient of variation > 0")
        shape = 1.0 / (cv * cv)
        gaps = rng(seed).gamma(shape, mean_gap / shape, n)
    else:
        raise ValueError(f"arrival process {process!r}; expected poisson, gamma or uniform")
    return start_s + np.cumsum(gaps)


def percentile(values: Iterable[float] | np.ndarray, q: float) -> float:
    """Return the q-th percentile (q in [0, 100]) of `values`, linear interpolation; nan when empty."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q))


def attainment(values: Iterable[float] | np.ndarray, limit: float) -> float:
    """Return the fraction of `values` at or below `limit` (1.0 when there are none); nan counts as a miss."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if arr.size == 0:
        return 1.0
    return float(np.count_nonzero(arr <= limit) / arr.size)


def summary(values: Iterable[float] | np.ndarray) -> dict[str, Any]:
    """Return {count, mean, p50, p90, p95, p99, max} of `values` (same unit as the values)."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p90": math.nan, "p95": math.nan,
                "p99": math.nan, "max": math.nan}
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return {"count": int(arr.size), "mean": float(arr.mean()), "p50": float(p50), "p90": float(p90),
            "p95": float(p95), "p99": float(p99), "max": float(arr.max())}
