"""How busy the machine was around a measurement: load average before and during, the CPU share
other processes took, and the spread of the measured step times, with a plain verdict.

Other processes are every process on the machine (as /proc shows them) that is not this process
or one of its descendants (the run's workers). Their CPU time is read from /proc/PID/stat at the
start and end of a window: cheap (a few ms), Linux only (elsewhere the share is None). Processes
that start and end inside a window are not seen.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpuplan.profiling.timing import quantile

# Other processes taking this share of the machine's cores (or more) make it "contended".
CONTENDED_SHARE = 0.10
# Step times whose (p90 - p10) / median exceeds this are "unsteady".
UNSTEADY_SPREAD = 0.15


def cores() -> int:
    """Return the number of CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_average() -> tuple[float, float, float] | None:
    """Return the 1-, 5- and 15-minute load averages (runnable processes), None where unknown."""
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return None


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def cpu_times() -> dict[int, tuple[int, str, float]] | None:
    """Return pid -> (parent pid, command name, CPU seconds used so far) of every visible process;
    None where /proc is not there."""
    if not os.path.isdir("/proc/self"):
        return None
    tick, out = _ticks(), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.find("(") + 1:text.rfind(")")]
        rest = text[text.rfind(")") + 2:].split()
        # fields after the name: state ppid ... utime (14th of the line) stime (15th)
        out[int(name)] = (int(rest[1]), comm, (int(rest[11]) + int(rest[12])) / tick)
    return out


def _ours(procs: dict[int, tuple[int, str, float]], root: int) -> set[int]:
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return mine


def others_usage(before: dict[int, tuple[int, str, float]] | None, after: dict[int, tuple[int, str, float]] | None,
                 elapsed_s: float, ours: set[int]) -> tuple[float | None, list[tuple[str, float]]]:
    """Return (share of the machine's cores other processes used, in 0..1; the busiest of them as
    (name[pid], share of one core)) between two cpu_times() snapshots `elapsed_s` seconds apart."""
    if before is None or after is None or elapsed_s <= 0:
        return None, []
    used = []
    for pid, (_, comm, t) in after.items():
        if pid in ours:
            continue
        delta = t - (before[pid][2] if pid in before else 0.0)  # a process started inside the window: all of it
        if delta > 0:
            used.append((f"{comm}[{pid}]", delta / elapsed_s))
    used.sort(key=lambda x: -x[1])
    return sum(u for _, u in used) / cores(), [u for u in used[:3] if u[1] >= 0.02]


@dataclass
class Window:
    """What other processes did during one measured window (see `ContentionMonitor`)."""

    elapsed_s: float = 0.0
    others_share: float | None = None
    busiest: list[tuple[str, float]] = field(default_factory=list)
    load_1min: list[float] = field(default_factory=list)


def quiet_window(seconds: float = 0.5) -> Window:
    """Return the other processes' CPU share and the load average over `seconds` in which this
    process does nothing (the machine as the measurement will find it)."""
    la, t0, before = load_average(), time.perf_counter(), cpu_times()
    time.sleep(seconds)
    after, elapsed = cpu_times(), time.perf_counter() - t0
    share, busiest = others_usage(before, after, elapsed, _ours(after or {}, os.getpid()))
    return Window(elapsed, share, busiest, [la[0]] if la else [])


def wait_quiet(max_wait_s: float, window_s: float = 1.0) -> tuple[Window, float]:
    """Return (the last window, seconds waited): `quiet_window(window_s)` repeated until other
    processes used less than CONTENDED_SHARE of the cores (or no share is known), or until
    `max_wait_s` seconds have passed; for benchmarks that should measure on a quiet machine."""
    t0 = time.perf_counter()
    while True:
        window = quiet_window(window_s)
        waited = time.perf_counter() - t0
        if window.others_share is None or window.others_share < CONTENDED_SHARE or waited >= max_wait_s:
            return window, waited


class ContentionMonitor:
    """Context manager sampling the 1-minute load average every `interval_s` and the other
    processes' CPU time over the block (a daemon thread; nothing is left running after it)."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.window = Window()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            la = load_average()
            if la:
                self.window.load_1min.append(la[0])

    def __enter__(self) -> "ContentionMonitor":
        self._t0, self._before = time.perf_counter(), cpu_times()
        la = load_average()
        if la:
            self.window.load_1min.append(la[0])
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        after = cpu_times()
        self.window.elapsed_s = time.perf_counter() - self._t0
        ours = _ours({**(self._before or {}), **(after or {})}, os.getpid())
        self.window.others_share, self.window.busiest = others_usage(self._before, after, self.window.elapsed_s, ours)


def step_spread(times_s: list[float]) -> float:
    """Return (p90 - p10) / median of step times (0 for fewer than two)."""
    if len(times_s) < 2:
        return 0.0
    med = quantile(times_s, 0.5)
    return (quantile(times_s, 0.9) - quantile(times_s, 0.1)) / med if med > 0 else 0.0


def report(before: Window, during: Window, step_times_s: list[float]) -> dict[str, Any]:
    """Return the contention fields of a measurement and a one-line verdict.

    load_before / load_during_max: 1-minute load averages (runnable processes; during includes
    the run's own workers); others_cpu_share_before / _during: the share of the machine's cores
    other processes used (0..1); step_spread: (p90 - p10) / median of the steps; contended: other
    processes used at least CONTENDED_SHARE of the cores before or during the run.
    """
    shares = [s for s in (before.others_share, during.others_share) if s is not None]
    contended = bool(shares) and max(shares) >= CONTENDED_SHARE
    spread = step_spread(step_times_s)
    n = cores()
    out: dict[str, Any] = {
        "cores": n,
        "load_before": before.load_1min[0] if before.load_1min else None,
        "load_during_max": max(during.load_1min) if during.load_1min else None,
        "others_cpu_share_before": before.others_share, "others_cpu_share_during": during.others_share,
        "busiest_others": ", ".join(f"{name} {share:.0%}" for name, share in during.busiest or before.busiest) or "-",
        "step_spread": spread, "contended": contended, "unsteady": spread > UNSTEADY_SPREAD}

    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.0%}"

    load = (f"load average {out['load_before']:.2f} before, up to {out['load_during_max']:.2f} during (this run's "
            f"workers included)" if out["load_before"] is not None and out["load_during_max"] is not None else
            "load average unknown")
    others = (f"other processes used {pct(during.others_share)} of the {n} cores during the run and "
              f"{pct(before.others_share)} before it")
    if contended:
        verdict = (f"CONTENDED: {others} ({out['busiest_others']}); the measured times include waiting for "
                   f"them and are not this plan's own")
    elif shares:
        verdict = f"quiet: {others}"
    else:
        verdict = "load unknown (no /proc): cannot tell whether other processes took the cores"
    steps = f"step times spread {spread:.0%} (p90 - p10 over median{', unsteady' if out['unsteady'] else ''})"
    out["verdict"] = f"{verdict}; {load}; {steps}"
    return out
