"""Timing of one measurement: warm-up, repeated timed runs, median and spread, refusal of wide spreads.

On CPU a run is timed with `time.perf_counter` (clock="wall") or, for single-threaded work on a
machine shared with other jobs, with the process's CPU time (clock="cpu": time spent waiting for a
core taken by someone else is not counted); on CUDA with a pair of CUDA events around the run and
a synchronisation before reading them, so asynchronous kernel launches are not mistaken for work
done. A figure whose spread (p90 - p10) / median is wider than `max_rel_spread` is
re-measured with twice the repeats (up to `retries` times) and, if still too wide, marked
unreliable (`Spread.reliable = False`) so the caller can say so.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuplan.models.profile import Spread

DEFAULT_MAX_REL_SPREAD = 0.25


def quantile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) of `values` by linear interpolation between sorted values."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def spread_of(times_s: list[float], max_rel_spread: float = DEFAULT_MAX_REL_SPREAD) -> Spread:
    """Return the Spread (seconds) of a list of timings: median, min, max, (p90 - p10) / median."""
    med = quantile(times_s, 0.5)
    rel = (quantile(times_s, 0.9) - quantile(times_s, 0.1)) / med if med > 0 else 0.0
    return Spread(median_s=med, min_s=min(times_s), max_s=max(times_s), repeats=len(times_s),
                  rel_spread=rel, reliable=rel <= max_rel_spread)


def clock_for(device: Any) -> str:
    """Return the clock to time work on `device` with: "cpu" (process CPU time) for single-threaded
    CPU work, which other jobs on a shared machine do not inflate; "wall" otherwise."""
    import torch

    return "cpu" if not str(device).startswith("cuda") and torch.get_num_threads() == 1 else "wall"


def timer_for(device: Any, clock: str = "wall") -> Callable[[Callable[[], Any]], float]:
    """Return a function that runs fn() once on `device` and returns its duration in seconds.

    CUDA devices are timed with a pair of events and a synchronisation; anything else with
    time.perf_counter, or time.process_time when `clock` is "cpu".
    """
    if not str(device).startswith("cuda"):
        return _process_timer if clock == "cpu" else _wall_timer
    import torch

    def timed(fn: Callable[[], Any]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # ms -> s

    return timed


def _wall_timer(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _process_timer(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(fn: Callable[[], Any], *, device: Any = "cpu", warmup: int = 2, repeats: int = 5,
            setup: Callable[[], Any] | None = None, max_rel_spread: float = DEFAULT_MAX_REL_SPREAD,
            retries: int = 1, budget_s: float | None = None, clock: str = "wall") -> Spread:
    """Time `fn()` and return its Spread in seconds.

    `setup()` (untimed) runs before every call, e.g. a forward pass before a timed backward.
    `device` is "cpu" or a CUDA device (str or torch.device): CUDA runs are timed with events.
    A spread wider than `max_rel_spread` triggers up to `retries` re-measurements with twice the
    repeats; a figure still too wide comes back with `reliable=False`. `budget_s` caps the time
    spent: repeats stop early (never below 3) once it is used up. `clock` "cpu" times CPU work by
    the process's CPU time (see the module docstring).
    """
    timer = timer_for(device, clock)
    for _ in range(warmup):
        if setup is not None:
            setup()
        timer(fn)
    t_start = time.perf_counter()
    n = repeats
    result: Spread | None = None
    for attempt in range(retries + 1):
        times: list[float] = []
        for i in range(n):
            if setup is not None:
                setup()
            times.append(timer(fn))
            if budget_s is not None and i >= 2 and time.perf_counter() - t_start > budget_s:
                break
        result = spread_of(times, max_rel_spread)
        over_budget = budget_s is not None and time.perf_counter() - t_start > budget_s
        if result.reliable or over_budget:
            break
        n *= 2
    assert result is not None
    return result
