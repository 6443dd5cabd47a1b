"""Gavel's formats (Narayanan et al., OSDI '20; github.com/stanford-futuredata/gavel, MIT licence)
read into gpuplan's OEF trace (gpuplan.models.oef_trace.Trace), and a job generator that draws
from the same distributions as Gavel's `utils.generate_job`.

Gavel's trace file: one job per line, ten tab-separated columns: job type (e.g.
"ResNet-18 (batch size 128)"), command, working directory, steps flag, needs-data-dir (0/1),
total steps, scale factor (GPUs at once), priority weight, SLO (-1: none), arrival time (s).

Gavel's throughput JSON (`simulation_throughputs.json`): worker type (v100, p100, k80, and
`*_unconsolidated` rows) -> "('<job type>', <scale factor>)" -> {"null": steps/s of the whole job
alone, "('<other type>', <sf>)": [own, other] steps/s when the two share the GPUs}. The isolated
("null") figures make the job types; the co-location pairs are read on request
(read_gavel_colocations, load_gavel(..., space_sharing=True)) into the trace's `colocated` table.

Conversion: one gpuplan job type per Gavel job type, `job_types` holding its 1-GPU throughputs and
`measured` its whole-job throughputs for every other scale factor the trace uses (Gavel's
multi-GPU throughputs are measured, not scaled: ResNet-18 (batch size 64) runs 18, 24 and 70
steps/s on 1, 2 and 4 V100s). A job with a priority weight other than 1 becomes a tenant of that
weight. GPU types are upper-cased (v100 -> V100).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan.errors import InputError
from gpuplan.io import read_input_bytes
from gpuplan.models.base import validate
from gpuplan.models.oef_trace import Trace

# (Gavel JobTable): model name -> can it run on more than one GPU (`distributed`)
GAVEL_JOB_TABLE: list[tuple[str, bool]] = (
    [(f"ResNet-18 (batch size {b})", True) for b in (16, 32, 64, 128, 256)]
    + [(f"ResNet-50 (batch size {b})", True) for b in (16, 32, 64, 128)]
    + [(f"Transformer (batch size {b})", True) for b in (16, 32, 64, 128, 256)]
    + [(f"LM (batch size {b})", True) for b in (5, 10, 20, 40, 80)]
    + [(f"Recommendation (batch size {b})", False) for b in (512, 1024, 2048, 4096, 8192)]
    + [("A3C", False), ("CycleGAN", False)])

_KEY = re.compile(r"^\('(.*)', (\d+)\)$")


@dataclass(frozen=True)
class GavelJob:
    """One line of a Gavel trace: job type, total steps, GPUs at once, priority weight, arrival (s)."""

    job_type: str
    steps: int
    scale_factor: int
    priority_weight: float
    arrival_s: float


Throughputs = dict[str, dict[tuple[str, int], float]]


def gpu_type(worker_type: str) -> str:
    """Return gpuplan's spelling of a Gavel worker type (v100 -> V100)."""
    return worker_type.upper()


def read_gavel_throughputs(path: str | Path) -> Throughputs:
    """Return worker type -> (job type, scale factor) -> isolated steps/s from Gavel's JSON.

    `*_unconsolidated` rows are skipped. Raises InputError naming the file and the bad key/value.
    """
    return _throughputs(_read_json(path), path)


def _read_json(path: str | Path) -> dict[str, Any]:
    """Return Gavel's throughput JSON as read; raise InputError naming the file when it is unreadable
    or not a mapping."""
    try:
        raw = json.loads(read_input_bytes(path, what="Gavel throughput JSON"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read Gavel's throughput JSON: {exc}", file=str(path)) from exc
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a mapping of worker type to job types, not {type(raw).__name__}",
                         file=str(path), expected="Gavel's simulation_throughputs.json")
    return raw


def _throughputs(raw: dict[str, Any], path: str | Path) -> Throughputs:
    """Return the isolated steps/s of Gavel's throughput JSON `raw` (read from `path`)."""
    out: Throughputs = {}
    for worker, table in raw.items():
        if worker.endswith("_unconsolidated"):
            continue
        if not isinstance(table, dict):
            raise InputError(f"{path}: at {worker}: a mapping of job types, not {table!r:.60}", file=str(path),
                             field=worker)
        rows: dict[tuple[str, int], float] = {}
        for key, entry in table.items():
            m = _KEY.match(key)
            if m is None:
                raise InputError(f"{path}: at {worker}.{key}: a key \"('<job type>', <scale factor>)\"",
                                 file=str(path), field=f"{worker}.{key}", value=key)
            value = entry.get("null") if isinstance(entry, dict) else None
            if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
                raise InputError(f"{path}: at {worker}.{key}.null: a non-negative steps/s, not {value!r}",
                                 file=str(path), field=f"{worker}.{key}.null", value=value)
            rows[(m.group(1), int(m.group(2)))] = float(value)
        out[worker] = rows
    if not out:
        raise InputError(f"{path}: no worker types", file=str(path), expected="e.g. v100, p100, k80")
    return out


Colocations = dict[str, dict[tuple[tuple[str, int], tuple[str, int]], tuple[float, float]]]


def read_gavel_colocations(path: str | Path) -> Colocations:
    """Return worker type -> ((job type, sf), (other type, sf)) -> (own, other) steps/s when the two
    share the same GPUs (Gavel's co-location entries; empty where the file has none). Malformed
    entries raise InputError naming the file and the key."""
    return _colocations(_read_json(path), path)


def _colocations(raw: dict[str, Any], path: str | Path) -> Colocations:
    """Return the co-location pairs of Gavel's throughput JSON `raw` (read from `path`)."""
    out: Colocations = {}
    for worker, table in raw.items():
        if worker.endswith("_unconsolidated") or not isinstance(table, dict):
            continue
        rows: dict[tuple[tuple[str, int], tuple[str, int]], tuple[float, float]] = {}
        for key, entry in table.items():
            m = _KEY.match(key)
            if m is None or not isinstance(entry, dict):
                continue
            for other, pair in entry.items():
                if other == "null":
                    continue
                n = _KEY.match(other)
                ok = (n is not None and isinstance(pair, list) and len(pair) == 2
                      and all(isinstance(x, (int, float)) and x >= 0 and math.isfinite(x) for x in pair))
                if not ok or n is None:
                    raise InputError(f"{path}: at {worker}.{key}.{other}: a pair [own, other] of non-negative "
                                     f"steps/s, not {pair!r}", file=str(path), field=f"{worker}.{key}.{other}")
                rows[((m.group(1), int(m.group(2))), (n.group(1), int(n.group(2))))] = (float(pair[0]),
                                                                                          float(pair[1]))
        out[worker] = rows
    return out


def read_gavel_trace(path: str | Path) -> list[GavelJob]:
    """Return the jobs of a Gavel trace file (ten tab-separated columns per line, see module doc)."""
    try:
        lines = read_input_bytes(path, what="Gavel trace").decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read Gavel trace: {exc}", file=str(path)) from exc
    jobs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise InputError(f"{path}: line {n}: 10 tab-separated columns (job type, command, directory, "
                             f"steps flag, needs data dir, total steps, scale factor, priority, SLO, arrival), "
                             f"not {len(cols)}", file=str(path), field=f"line {n}", value=len(cols))
        try:
            job = GavelJob(cols[0], int(cols[5]), int(cols[6]), float(cols[7]), float(cols[9]))
        except ValueError as exc:
            raise InputError(f"{path}: line {n}: numbers in columns 6-8 and 10 ({exc})", file=str(path),
                             field=f"line {n}") from exc
        if job.steps <= 0 or job.scale_factor < 1 or job.priority_weight <= 0 or job.arrival_s < 0:
            raise InputError(f"{path}: line {n}: positive steps, scale factor >= 1, positive priority and "
                             f"arrival >= 0, not {job}", file=str(path), field=f"line {n}")
        jobs.append(job)
    if not jobs:
        raise InputError(f"{path}: no jobs", file=str(path), expected="Gavel trace lines")
    return jobs


def to_trace(jobs: list[GavelJob], throughputs: Throughputs, cluster_gpus: dict[str, int], *,
             round_s: float = 360.0, name: str | None = None, source: str | None = None,
             normalisation: str = "slowest", reference_type: str | None = None,
             where: str = "trace", colocations: Colocations | None = None) -> Trace:
    """Return gpuplan's Trace of Gavel jobs: job types from the throughput table (measured per scale
    factor), cluster `cluster_gpus` (Gavel worker type or GPU type -> count), rounds of `round_s` s.

    Raises InputError when a job's (type, scale factor) is missing from the table (`where` names
    the trace in the message). `colocations` (read_gavel_colocations) fill the trace's `colocated`
    table for the pairs of its job types that share a GPU count (space sharing).
    """
    gpus = {gpu_type(t): int(c) for t, c in cluster_gpus.items()}
    workers = {gpu_type(w): w for w in throughputs}
    for t in gpus:
        if t not in workers:
            raise InputError(f"cluster type {t!r} has no column in the throughput table ({', '.join(workers)})",
                             field="cluster", value=t)
    job_types: dict[str, dict[str, float]] = {}
    measured: dict[str, dict[int, dict[str, float]]] = {}
    for i, job in enumerate(jobs):
        for g in sorted({1, job.scale_factor}):
            row = {t: throughputs[workers[t]].get((job.job_type, g)) for t in gpus}
            if all(v is None for v in row.values()):
                raise InputError(f"{where}: job {i} ({job.job_type!r} on {g} GPUs) is not in the throughput "
                                 "table", field=f"jobs[{i}]", value=(job.job_type, g))
            speeds = {t: float(v or 0.0) for t, v in row.items()}
            if g == 1:
                job_types[job.job_type] = speeds
            else:
                measured.setdefault(job.job_type, {})[g] = speeds
    out_jobs: list[dict[str, Any]] = []
    tenants: dict[str, float] = {}
    for i, job in enumerate(jobs):
        entry: dict[str, Any] = {"name": f"j{i:04d}", "type": job.job_type, "gpus": job.scale_factor,
                                 "steps": job.steps, "arrival_s": job.arrival_s}
        if job.priority_weight != 1.0:
            entry["tenant"] = entry["name"]
            tenants[entry["name"]] = job.priority_weight
        out_jobs.append(entry)
    colocated: dict[str, dict[str, dict[int, dict[str, list[float]]]]] = {}
    if colocations:
        kinds = sorted({(j.job_type, j.scale_factor) for j in jobs})
        for a in kinds:
            for b in kinds:
                if a[1] != b[1]:
                    continue
                row = {t: colocations.get(workers[t], {}).get((a, b)) for t in gpus}
                row = {t: [v[0], v[1]] for t, v in row.items() if v is not None}
                if row:
                    colocated.setdefault(a[0], {}).setdefault(b[0], {})[a[1]] = row
    per_node = math.gcd(*gpus.values()) if any(gpus.values()) else 1
    doc: dict[str, Any] = {"name": name, "source": source,
                           "cluster": {"gpus": gpus, "gpus_per_node": max(1, min(per_node, 8))},
                           "round_s": round_s, "job_types": job_types, "measured": measured,
                           "colocated": colocated,
                           "normalisation": normalisation, "reference_type": reference_type,
                           "tenants": tenants, "jobs": out_jobs}
    return validate(Trace, {k: v for k, v in doc.items() if v is not None}, file=where)


def load_gavel(trace_path: str | Path, throughputs_path: str | Path, cluster_gpus: dict[str, int],
               **kw: Any) -> Trace:
    """Return gpuplan's Trace of a Gavel trace file and throughput JSON (see to_trace)."""
    raw = _read_json(throughputs_path)
    table = _throughputs(raw, throughputs_path)
    if kw.pop("space_sharing", False):
        kw["colocations"] = _colocations(raw, throughputs_path)
    return to_trace(read_gavel_trace(trace_path), table, cluster_gpus, where=str(trace_path),
                    name=kw.pop("name", Path(trace_path).stem), **kw)


def philly_scale_factor(u: float) -> int:
    """Return the GPUs-at-once for a uniform draw u, Gavel's Philly-derived split (70/10/15/5%
    for 1/2/4/8 GPUs)."""
    return 1 if u < 0.7 else 2 if u < 0.8 else 4 if u < 0.95 else 8


def philly_duration_s(rng: np.random.Generator) -> float:
    """Return a job duration (s) as Gavel draws it: 60 * 10**U(1.5, 3) with probability 0.8,
    else 60 * 10**U(3, 4) (about 32 min to 17 h, and 17 h to 7 days)."""
    if rng.random() >= 0.8:
        return 60 * 10 ** rng.uniform(3, 4)
    return 60 * 10 ** rng.uniform(1.5, 3)


def generate_jobs(throughputs: Throughputs, n_jobs: int, jobs_per_hour: float, seed: int, *,
                  multi_gpu: bool = True, reference_worker: str = "v100",
                  max_duration_s: float | None = None) -> list[GavelJob]:
    """Return `n_jobs` jobs drawn as Gavel's generator does (utils.generate_job): scale factor from
    the Philly split (multi_gpu), a job type uniform over Gavel's job table among those that can
    use that many GPUs, a Philly duration turned into steps at the reference worker's measured
    throughput, Poisson arrivals at `jobs_per_hour` (0: all at t = 0). Uses numpy's generator, so
    the draws follow Gavel's distributions, not its exact random stream. `max_duration_s` caps
    durations (to keep a benchmark short; None: Gavel's distribution unchanged)."""
    rng = np.random.default_rng(seed)
    table = throughputs[reference_worker]
    jobs, t = [], 0.0
    for _ in range(n_jobs):
        g = philly_scale_factor(float(rng.uniform())) if multi_gpu else 1
        duration = philly_duration_s(rng)
        if max_duration_s is not None:
            duration = min(duration, max_duration_s)
        choices = [m for m, dist in GAVEL_JOB_TABLE if (g == 1 or dist) and table.get((m, g), 0) > 0]
        model = choices[int(rng.integers(len(choices)))]
        steps = max(1, int(duration * table[(model, g)]))
        jobs.append(GavelJob(model, steps, g, 1.0, round(t, 3)))
        if jobs_per_hour > 0:
            t += float(rng.exponential(3600.0 / jobs_per_hour))
    return jobs


def gavel_trace_text(jobs: list[GavelJob]) -> str:
    """Return jobs as a Gavel trace file's text (ten tab-separated columns; command, directory and
    steps flag written as '-', which Gavel's simulator does not use), so Gavel's own simulator can
    replay a generated trace."""
    return "".join(f"{j.job_type}\t-\t-\t-\t0\t{j.steps}\t{j.scale_factor}\t{j.priority_weight:g}\t-1.000000\t"
                   f"{j.arrival_s:f}\n" for j in jobs)
