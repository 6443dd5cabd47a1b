"""Straggler workloads: the CSV trace reader (the fields public cluster traces carry) and the seeded
synthetic generator (heavy-tailed task counts, Poisson or gamma arrivals at a target load).

CSV columns (header required; `weight`, `reduce_tasks` and `reduce_task_s` may be left out):
  job_id, arrival_s, weight, map_tasks, reduce_tasks, map_task_s, reduce_task_s
`map_task_s` is one duration (every map task of the job lasts that long, in s) or `;`-separated durations,
one per map task; the same for `reduce_task_s`.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan.errors import InputError

MAX_JOBS = 200_000
MAX_TASKS_PER_PHASE = 10_000
MAX_TASKS = 2_000_000
MAX_TRACE_BYTES = 64 * 2**20
REQUIRED = ("job_id", "arrival_s", "map_tasks", "map_task_s")
OPTIONAL = ("weight", "reduce_tasks", "reduce_task_s")


def _number(text: str, file: str, row: int, column: str, *, integer: bool = False, low: float = 0.0,
            strict: bool = False, high: float = 1e9) -> float:
    where = f"row {row} column {column}"
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        raise InputError.at(file, where, text, "an integer" if integer else "a number") from None
    if not math.isfinite(value) or value < low or (strict and value <= low) or value > high:
        rel = ">" if strict else ">="
        raise InputError.at(file, where, text, f"a finite number {rel} {low:g} and at most {high:g}")
    return value


def _durations(text: str, count: int, file: str, row: int, column: str) -> list[float]:
    parts = [p for p in (text or "").replace(" ", "").split(";") if p != ""]
    if count == 0:
        return []
    if len(parts) == 1:
        return [_number(parts[0], file, row, column, strict=True)] * count
    if len(parts) != count:
        raise InputError.at(file, f"row {row} column {column}", text,
                            f"one duration or {count} ';'-separated durations (one per task)")
    return [_number(p, file, row, column, strict=True) for p in parts]


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Return the jobs of a CSV trace as problem job mappings {id, arrival_s, weight, map_s, reduce_s}
    (durations in s). Raises InputError naming the file, row, column, value and what was expected."""
    from gpuplan.io import read_input_bytes

    file = str(path)
    raw = read_input_bytes(path, limit_bytes=MAX_TRACE_BYTES, what="CSV trace")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{file}: not UTF-8 text; expected a CSV trace", file=file) from None
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise InputError(f"{file}: unreadable CSV ({exc})", file=file) from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{file}: the header lacks {', '.join(missing)}; expected columns "
                         f"{', '.join(REQUIRED + OPTIONAL)}", file=file, field="header", value=header)
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise InputError(f"{file}: unknown column(s) {', '.join(unknown)}; expected "
                         f"{', '.join(REQUIRED + OPTIONAL)}", file=file, field="header", value=unknown)
    jobs: list[dict[str, Any]] = []
    total = 0
    try:
        for i, raw_row in enumerate(reader, start=2):
            row = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else v for k, v in raw_row.items()}
            if None in raw_row or any(not isinstance(v, str) for v in raw_row.values()):
                raise InputError.at(file, f"row {i}", list(raw_row.values()), f"{len(header)} fields as in the header")
            if len(jobs) >= MAX_JOBS:
                raise InputError.at(file, f"row {i}", "more jobs", f"at most {MAX_JOBS:,} jobs")
            maps = int(_number(row["map_tasks"], file, i, "map_tasks", integer=True, low=1, high=MAX_TASKS_PER_PHASE))
            reds = int(_number(row.get("reduce_tasks") or "0", file, i, "reduce_tasks", integer=True,
                               high=MAX_TASKS_PER_PHASE))
            total += maps + reds
            if total > MAX_TASKS:
                raise InputError.at(file, f"row {i}", total, f"at most {MAX_TASKS:,} tasks in all")
            job = {"id": row["job_id"] or str(i - 1),
                   "arrival_s": _number(row["arrival_s"], file, i, "arrival_s"),
                   "weight": _number(row.get("weight") or "1", file, i, "weight", strict=True, high=1e6),
                   "map_s": _durations(row["map_task_s"], maps, file, i, "map_task_s"),
                   "reduce_s": _durations(row.get("reduce_task_s") or "", reds, file, i, "reduce_task_s")}
            if reds and not job["reduce_s"]:
                raise InputError.at(file, f"row {i} column reduce_task_s", "", f"durations of the {reds} reduce tasks")
            jobs.append(job)
    except csv.Error as exc:
        raise InputError(f"{file}: unreadable CSV ({exc})", file=file) from None
    if not jobs:
        raise InputError(f"{file}: no job rows; expected at least one", file=file)
    return jobs


def write_trace(path: str | Path, jobs: list[dict[str, Any]]) -> Path:
    """Write jobs ({id, arrival_s, weight, map_s, reduce_s}) as a CSV trace; return the path."""
    from gpuplan.io import atomic_write_text

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["job_id", "arrival_s", "weight", "map_tasks", "reduce_tasks", "map_task_s", "reduce_task_s"])
    for j in jobs:
        w.writerow([j["id"], f"{j['arrival_s']:.6g}", f"{j.get('weight', 1):g}", len(j["map_s"]), len(j["reduce_s"]),
                    ";".join(f"{x:.6g}" for x in j["map_s"]), ";".join(f"{x:.6g}" for x in j["reduce_s"])])
    return atomic_write_text(path, out.getvalue())


def synthetic_jobs(jobs: int, load: float, slots: int, mean_factor: float, *, seed: int = 0,
                   arrival: str = "poisson", cv: float = 1.0, task_s: float = 1.0, max_map_tasks: int = 50,
                   tail: float = 1.3, reduce_fraction: float = 0.5, weights: tuple[float, ...] = (1.0,)
                   ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Return (arrival_s, weight, map sizes, reduce sizes) of a seeded synthetic workload: map tasks per job
    min(max_map_tasks, floor(U^(-1/tail))) (most jobs small, a heavy tail of large ones); a job's tasks are
    about task_s * U[0.5, 1.5] s each (+-20%), reduce tasks 1.5x that, max(1, maps/4) of them in a
    `reduce_fraction` of the jobs; weights drawn uniformly from `weights`; arrivals (gamma with `cv`, or
    poisson/uniform) at the rate that makes the offered load `load` of the slots (mean copy slowdown
    `mean_factor` included)."""
    from gpuplan.sim.core import arrival_times

    g = np.random.default_rng(seed)
    k = np.minimum(max_map_tasks, np.floor((1.0 - g.random(jobs)) ** (-1.0 / tail))).astype(int)
    scale = task_s * g.uniform(0.5, 1.5, jobs)
    has_reduce = g.random(jobs) < reduce_fraction
    maps, reds = [], []
    for i in range(jobs):
        maps.append(scale[i] * g.uniform(0.8, 1.2, int(k[i])))
        r = max(1, int(k[i]) // 4) if has_reduce[i] else 0
        reds.append(1.5 * scale[i] * g.uniform(0.8, 1.2, r))
    w = np.asarray(weights, dtype=float)[g.integers(0, len(weights), jobs)]
    work = float(np.mean([m.sum() + r.sum() for m, r in zip(maps, reds)])) * mean_factor
    rate = load * slots / work
    arr = arrival_times(jobs, rate, seed=seed + 1, process=arrival, cv=cv)  # type: ignore[arg-type]
    return arr - arr[0], w, maps, reds
