"""The input of the OEF trace simulator: a cluster, job types with per-GPU speeds, and arriving jobs.

    cluster: {gpus: {V100: 8, P100: 8, K80: 16}, gpus_per_node: 4}
    round_s: 360                     # one scheduling round
    scaling_efficiency: 0.9          # throughput kept per doubling of a job's GPUs
    job_types:
      resnet50: {V100: 2.9, P100: 0.95, K80: 0.29}     # steps/s on ONE GPU of each type
    tenants: {vision: 2.0}           # optional weights (default 1)
    jobs:
      - {name: j0, type: resnet50, gpus: 2, steps: 40000, arrival_s: 0, tenant: vision}

    measured:                        # optional: measured steps/s of the WHOLE job per GPU count
      resnet18: {2: {V100: 24.0, K80: 6.1}, 4: {V100: 70.0}}

A job on g GPUs runs at its measured throughput for (type, g) when `measured` has an entry for g
(0 on a GPU type missing there: the job cannot run on it with g GPUs), else at
g * speed * scaling_efficiency ** log2(g) steps/s. `normalisation` / `reference_type` are passed
to every allocation (see gpuplan.models.oef.normaliser).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpuplan.models.base import Schema, validate
from gpuplan.models.cluster import Cluster
from gpuplan.models.oef import check_reference_type, check_speed_table
from gpuplan.io import read_document


class TraceJob(Schema):
    """One job of a trace: its type, GPUs at once, length in steps, arrival time (s), tenant."""

    name: str
    type: str
    gpus: int = Field(default=1, ge=1)
    steps: float = Field(gt=0)
    arrival_s: float = Field(default=0.0, ge=0)
    tenant: str | None = None


class Trace(Schema):
    """A trace for `gpuplan simulate oef`: cluster, round length, job types, tenants, jobs."""

    name: str | None = None
    source: str | None = None
    cluster: Cluster
    round_s: float = Field(default=360.0, gt=0)
    scaling_efficiency: float = Field(default=0.9, gt=0, le=1)
    job_types: dict[str, dict[str, float]] = Field(min_length=1)
    measured: dict[str, dict[int, dict[str, float]]] = Field(default_factory=dict)
    # space sharing: job type -> other job type -> GPUs of each -> GPU type -> [own, other] steps/s
    colocated: dict[str, dict[str, dict[int, dict[str, list[float]]]]] = Field(default_factory=dict)
    normalisation: Literal["slowest", "best", "reference", "jobs"] = "slowest"
    reference_type: str | None = None
    tenants: dict[str, float] = Field(default_factory=dict)
    jobs: list[TraceJob] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> "Trace":
        cap = self.cluster.capacity()
        check_speed_table(self.cluster, self.job_types, "job_types")
        check_reference_type(self.cluster, self.normalisation, self.reference_type)
        for name, per_count in self.measured.items():
            if name not in self.job_types:
                raise ValueError(f"at measured.{name}: a key of job_types ({', '.join(self.job_types)}), "
                                 f"not {name!r}")
            for g, speeds in per_count.items():
                if g < 1:
                    raise ValueError(f"at measured.{name}: GPU counts >= 1, not {g}")
                check_speed_table(self.cluster, {f"{name}.{g}": speeds}, "measured")
        for a_type, others in self.colocated.items():
            for b_type, per_count in others.items():
                for name in (a_type, b_type):
                    if name not in self.job_types:
                        raise ValueError(f"at colocated.{a_type}.{b_type}: job types of job_types, not {name!r}")
                for g, per_gpu in per_count.items():
                    for t, pair in per_gpu.items():
                        self.cluster.type_key(t)
                        if len(pair) != 2 or any(not (x >= 0 and math.isfinite(x)) for x in pair):
                            raise ValueError(f"at colocated.{a_type}.{b_type}.{g}.{t}: [own, other] non-negative "
                                             f"steps/s, not {pair!r}")
        for t, w in self.tenants.items():
            if w <= 0:
                raise ValueError(f"at tenants.{t}: a positive weight, not {w}")
        names: set[str] = set()
        for i, job in enumerate(self.jobs):
            if job.name in names:
                raise ValueError(f"at jobs[{i}].name: distinct job names, but {job.name!r} repeats")
            names.add(job.name)
            if job.type not in self.job_types:
                raise ValueError(f"at jobs[{i}].type: a key of job_types ({', '.join(self.job_types)}), "
                                 f"not {job.type!r}")
            speeds = self.throughput(job)
            if not any(x > 0 for x in speeds.values()):
                raise ValueError(f"at jobs[{i}]: a job that fits on some GPU type it can use "
                                 f"({job.gpus} GPUs of a type with a positive speed in job_types/measured for "
                                 f"{job.type!r}; "
                                 f"cluster has {cap})")
        return self

    def throughput(self, job: TraceJob) -> dict[str, float]:
        """Return the job's steps/s on its GPUs of each cluster type (0 where it cannot run)."""
        cap = self.cluster.capacity()
        factor = job.gpus * self.scaling_efficiency ** math.log2(job.gpus)
        out = {t: 0.0 for t in cap}
        measured = self.measured.get(job.type, {}).get(job.gpus)
        if measured is not None:
            for t, x in measured.items():
                key = self.cluster.type_key(t)
                if key in cap and cap[key] >= job.gpus:
                    out[key] = float(x)
            return out
        for t, x in self.job_types[job.type].items():
            key = self.cluster.type_key(t)
            if key in cap and cap[key] >= job.gpus:
                out[key] = x * factor
        return out


def pair_throughput(trace: Trace, a: TraceJob, b: TraceJob, gpu_type: str) -> tuple[float, float] | None:
    """Return (a's, b's) steps/s when jobs a and b share the same GPUs of `gpu_type` (space
    sharing), or None when the trace has no measurement for the pair (they then cannot share)."""
    if a.gpus != b.gpus:
        return None
    per_gpu = trace.colocated.get(a.type, {}).get(b.type, {}).get(a.gpus)
    if not per_gpu:
        return None
    for t, pair in per_gpu.items():
        if trace.cluster.type_key(t) == gpu_type:
            return float(pair[0]), float(pair[1])
    return None


def load_trace(path: str | Path) -> Trace:
    """Return the validated Trace in a YAML/JSON file; raise InputError naming file and field."""
    return validate(Trace, read_document(path), file=path)
