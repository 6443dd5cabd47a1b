"""The discrete-event core every simulated kind shares (serving, RL updates, straggler scheduling).

One event queue ordered by (time, sequence), seeded arrival processes, and the latency statistics
the kinds report (percentiles, SLO attainment). Kinds write their own policies on top; none keeps
its own copy of an event loop. Pure Python and numpy: models/ may import it (no solver, no torch).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Generic, Iterable, Literal, TypeVar

import numpy as np

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
