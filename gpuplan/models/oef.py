"""OEF (Mo, Xu, Lau; Middleware '24): fair and efficient shares of heterogeneous GPU types.

Tenants own jobs; a job runs on `gpus` GPUs of one type at a time and has a measured throughput
(steps/s of the whole job) on each GPU type it can use. An allocation X gives every job a time
fraction X[i, j] on each type j (Gavel's form): job i then holds gpus_i * X[i, j] GPUs of type j on
average, and its throughput is sum_j T[i, j] X[i, j].

Normalisation (one for every policy): a job's *normalised throughput* is its throughput divided by
its throughput on its slowest type of the cluster (its speedup vector V[i] = T[i] / min_j T[i, j],
the minimum over the cluster's types with a positive throughput, whether the job fits there or not), so
U_i(X) = sum_j V[i, j] X[i, j]; *efficiency* is sum_i gpus_i * U_i(X), in slowest-GPU-equivalents
(a cluster of K80s fully busy with jobs whose slowest type is K80 scores its GPU count).

Fairness principals are jobs; a tenant's weight is split equally among its jobs (a tenant of
weight w with k jobs behaves as k users of weight w/k, OEF's replication trick in reverse).

- sharing incentive (SI): U_i(X) >= U_i(E_i), E the weighted equal split of every type, each row
  scaled down to at most all of the time (Gavel's `isolated` allocation; see equal_share);
- envy-freeness (EF): job i does not prefer job k's GPUs, scaled by the weights w_i / w_k and
  truncated to the g_i GPUs i can use at once: U_i(X_i) >= min(1, w_i g_k / (w_k g_i)) U_i(X_k);
- Pareto efficiency (PE): no allocation raises one job's U without lowering another's (an LP).

`check` verifies capacity and row limits always, the fairness properties the plan's solver promises
(its contract in the registry) and any the plan claims besides, and every figure the plan states
(recomputed); `assess` returns every figure (efficiency, SI ratios, envy pairs, Pareto gain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from gpuplan.models.base import Problem, Schema, Table, Violation
from gpuplan.models.catalog import canonical_name
from gpuplan.models.cluster import Cluster
from gpuplan.models.plan import Plan, figure_violations, stated_figures_violations
from gpuplan.registry import ModelSpec, register_model

SI, EF, PE = "sharing_incentive", "envy_free", "pareto_efficient"
# the policy each registered solver computes, as a plan names it (solver name -> label)
POLICY_LABELS = {
    "oef": "cooperative OEF (EF + SI)", "oef-si": "cooperative OEF, SI only",
    "oef-noncoop": "non-cooperative OEF (partial allocation)", "gavel-maxmin": "Gavel max-min (heterogeneity-aware)",
    "maxmin-agnostic": "max-min, heterogeneity-agnostic", "max-throughput": "max total throughput",
    "equal-share": "equal share",
}
REL_TOL, ABS_TOL = 1e-6, 1e-7


class Job(Schema):
    """A job: GPUs it runs on at once, and its throughput (steps/s of the whole job) per GPU type.

    Give `throughput` directly or name a `type` from the problem's `job_types`. A type missing
    from the throughput mapping (or 0) is one the job cannot use.
    """

    name: str
    gpus: int = Field(default=1, ge=1)
    type: str | None = None
    throughput: dict[str, float] | None = None

    @field_validator("throughput")
    @classmethod
    def _non_negative(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for t, x in (v or {}).items():
            if not (isinstance(x, (int, float)) and x >= 0 and math.isfinite(x)):
                raise ValueError(f"at {t}: a non-negative throughput in steps/s, not {x!r}")
        return v


class Tenant(Schema):
    """A tenant: a priority weight (split equally among its jobs) and one or more jobs."""

    name: str
    weight: float = Field(default=1.0, gt=0)
    jobs: list[Job] = Field(min_length=1)


class OefProblem(Problem):
    """An OEF problem: a cluster, tenants with jobs, optional job types, and the rounds to plan.

    rounds: how many scheduling rounds of `round_s` seconds the plan lays out on GPU ids
    (0: shares only); round_tolerance: the largest allowed gap between a job's realised time
    fraction over the rounds and its fractional share.
    """

    kind: Literal["oef"] = "oef"
    cluster: Cluster
    job_types: dict[str, dict[str, float]] = Field(default_factory=dict)
    tenants: list[Tenant] = Field(min_length=1)
    rounds: int = Field(default=20, ge=0, le=1000)
    round_s: float = Field(default=360.0, gt=0)
    round_tolerance: float = Field(default=0.1, gt=0, le=1)
    # what a job's normalised throughput (and so efficiency) is measured against; see normaliser()
    normalisation: Literal["slowest", "best", "reference", "jobs"] = "slowest"
    reference_type: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "OefProblem":
        cap = self.cluster.capacity()
        check_speed_table(self.cluster, self.job_types, "job_types")
        check_reference_type(self.cluster, self.normalisation, self.reference_type)
        seen: set[str] = set()
        known: dict[str, str] = {}  # type name -> canonical name (a few names, repeated by every job)
        for a, tenant in enumerate(self.tenants):
            if tenant.name in seen:
                raise ValueError(f"at tenants[{a}].name: distinct tenant names, but {tenant.name!r} repeats")
            seen.add(tenant.name)
            names: set[str] = set()
            for b, job in enumerate(tenant.jobs):
                where = f"tenants[{a}].jobs[{b}]"
                if job.name in names:
                    raise ValueError(f"at {where}.name: distinct job names within a tenant, "
                                     f"but {job.name!r} repeats")
                names.add(job.name)
                if (job.type is None) == (job.throughput is None):
                    raise ValueError(f"at {where}: exactly one of 'type' (a key of job_types) "
                                     "or 'throughput' (steps/s per GPU type)")
                if job.type is not None and job.type not in self.job_types:
                    known = ", ".join(self.job_types) or "none declared"
                    raise ValueError(f"at {where}.type: a key of job_types ({known}), not {job.type!r}")
                tput = job.throughput if job.throughput is not None else self.job_types[job.type or ""]
                usable = {}
                for t, x in tput.items():
                    key = known.get(t) or known.setdefault(t, _known_type(self.cluster, t, f"{where}.throughput.{t}"))
                    if key in cap and x > 0:
                        usable[key] = x
                if not usable:
                    raise ValueError(f"at {where}: a positive throughput on at least one GPU type of the "
                                     f"cluster ({', '.join(cap)}); got {dict(tput)}")
                fits = [t for t in usable if cap[t] >= job.gpus]
                if not fits:
                    raise ValueError(f"at {where}.gpus: at most the GPUs of a usable type "
                                     f"({', '.join(f'{t}: {cap[t]}' for t in usable)}), not {job.gpus}")
        return self


def check_reference_type(cluster: Cluster, normalisation: str, reference_type: str | None) -> None:
    """Refuse a `reference_type` that is not a GPU type of the cluster (given with any normalisation:
    a misspelt type is never meant), or none with normalisation 'reference'; return None otherwise.
    Raises ValueError worded 'at reference_type: ...' for validators."""
    cap = cluster.capacity()
    if reference_type is None:
        if normalisation == "reference":
            raise ValueError("at reference_type: a GPU type of the cluster when normalisation is "
                             "'reference', not missing")
        return
    if cluster.type_key(reference_type) not in cap:
        raise ValueError(f"at reference_type: a GPU type of the cluster ({', '.join(cap)}), not {reference_type!r}")


def check_speed_table(cluster: Cluster, table: dict[str, dict[str, float]], field: str) -> None:
    """Raise ValueError naming `field.<name>.<type>` for an unknown GPU type or a negative speed."""
    for name, speeds in table.items():
        for t, x in speeds.items():
            _known_type(cluster, t, f"{field}.{name}.{t}")
            if not (isinstance(x, (int, float)) and x >= 0 and math.isfinite(x)):
                raise ValueError(f"at {field}.{name}.{t}: a non-negative throughput in steps/s, not {x!r}")


def _known_type(cluster: Cluster, name: str, where: str) -> str:
    """Return the canonical name of a GPU type, or raise ValueError naming the field."""
    if name in cluster.device_types:
        return name
    key = canonical_name(name)
    if key is None:
        raise ValueError(f"at {where}: a GPU type of the catalog or of the cluster, not {name!r}")
    return key


@dataclass(frozen=True)
class Arrays:
    """The problem as arrays, jobs in file order (tenant by tenant), types in cluster order.

    T: throughput (steps/s) with usable-only entries (n x m); V: speedup vs the job's slowest type
    in the cluster; gpus, weight: per job; capacity: GPUs per type.
    """

    types: list[str]
    capacity: np.ndarray
    names: list[str]
    tenants: list[str]
    T: np.ndarray
    V: np.ndarray
    gpus: np.ndarray
    weight: np.ndarray

    @property
    def usable(self) -> np.ndarray:
        """Return the mask of (job, type) pairs a job can run on: positive throughput, enough GPUs."""
        return (self.T > 0) & (self.gpus[:, None] <= self.capacity[None, :])


def reference_speed(cluster: Cluster, tput: Mapping[str, float], reference_type: str | None = None,
                    cap: dict[str, int] | None = None) -> float:
    """Return a job's reference speed (steps/s): its throughput on `reference_type` where that is a type
    of the cluster it runs on (positive throughput), else on its fastest type of the cluster; 0.0 when it
    runs on none. `tput` maps type names (any spelling) to steps/s; `cap`: the cluster's capacity()
    when the caller has it (it walks every device). The one definition behind normaliser() and the
    trace simulators' unit of useful work."""
    cap = cluster.capacity() if cap is None else cap
    speeds = {key: float(x) for key, x in ((cluster.type_key(t), x) for t, x in tput.items())
              if x > 0 and key in cap}
    if not speeds:
        return 0.0
    if reference_type is not None:
        ref = speeds.get(cluster.type_key(reference_type), 0.0)
        if ref > 0:
            return ref
    return max(speeds.values())


def normaliser(problem: OefProblem, tput: dict[str, float], slowest: float, gpus: int = 1,
               cap: dict[str, int] | None = None) -> float:
    """Return the steps/s a job's throughput is divided by (its speedup vector's unit).

    'slowest' (the paper's speedup vector, default): the job's slowest type of the cluster;
    'best': its fastest type (normalised throughput = fraction of its best speed, useful work in
    best-GPU-equivalents); 'reference': its speed on `reference_type` (e.g. V100-equivalents, the
    unit Gavel's traces measure job lengths in), the fastest type where it cannot use that one;
    'jobs': as 'reference' (or 'best' without a reference type) times the job's GPUs, so that
    efficiency (GPUs x normalised throughput) counts jobs' progress, each job in units of its own
    reference speed: the sum average JCT responds to, where the others weight a job by its GPUs.
    Only the efficiency objective depends on it: SI, EF and max-min are unchanged by scaling a row.
    `cap`: the cluster's capacity() when the caller has it (it walks every device).
    """
    if problem.normalisation == "slowest":         # first: capacity() walks every device
        return slowest
    scale = float(gpus) if problem.normalisation == "jobs" else 1.0
    ref_type = problem.reference_type if problem.normalisation in ("reference", "jobs") else None
    speed = reference_speed(problem.cluster, tput, ref_type, cap)
    return speed * scale if speed > 0 else slowest


def arrays(problem: OefProblem) -> Arrays:
    """Return the problem as arrays (see Arrays)."""
    cap = problem.cluster.capacity()
    types = list(cap)
    index = {t: j for j, t in enumerate(types)}
    rows, refs, names, tenants, gpus, weight = [], [], [], [], [], []
    for tenant in problem.tenants:
        for job in tenant.jobs:
            tput = job.throughput if job.throughput is not None else problem.job_types[job.type or ""]
            row = np.zeros(len(types))
            slowest = np.inf                     # over the cluster's types, whether the job fits or not
            for t, x in tput.items():
                key = problem.cluster.type_key(t)
                if key in index and x > 0:
                    slowest = min(slowest, float(x))
                    if cap[key] >= job.gpus:
                        row[index[key]] = float(x)
            rows.append(row)
            refs.append(normaliser(problem, tput, slowest, job.gpus, cap))
            names.append(f"{tenant.name}/{job.name}")
            tenants.append(tenant.name)
            gpus.append(job.gpus)
            weight.append(tenant.weight / len(tenant.jobs))
    T = np.array(rows)
    ref = np.array(refs)
    return Arrays(types, np.array([cap[t] for t in types], dtype=float), names, tenants, T,
                  T / ref[:, None], np.array(gpus, dtype=float), np.array(weight))


def equal_share(a: Arrays) -> np.ndarray:
    """Return the weighted equal split E (time fractions, n x m), Gavel's `isolated` allocation.

    Every job gets weight/total-weight of each type's GPUs as a time fraction of its GPUs-at-once;
    a row summing to more than 1 is scaled down to 1 (over all types), then the types the job
    cannot use are dropped. With this scaling E itself is envy-free, so SI and EF are always
    jointly feasible.
    """
    E = (a.weight[:, None] / a.weight.sum()) * a.capacity[None, :] / a.gpus[:, None]
    return E / np.maximum(E.sum(axis=1), 1.0)[:, None] * a.usable


def envy_factor(gpus: np.ndarray, weight: np.ndarray, rows: slice | None = None) -> np.ndarray:
    """Return theta[i, k] = min(1, (w_i g_k) / (w_k g_i)): the part of job k's bundle, scaled to
    i's weight, that job i can use with its g_i GPUs at once (i envies k when
    theta[i, k] U_i(X_k) > U_i(X_i))."""
    r = slice(None) if rows is None else rows
    return np.minimum(1.0, (weight[r, None] * gpus[None, :]) / (weight[None, :] * gpus[r, None]))


def utilities(a: Arrays, X: np.ndarray) -> np.ndarray:
    """Return each job's normalised throughput U_i(X_i) (multiples of its slowest-type speed)."""
    return (a.V * X).sum(axis=1)


def efficiency(a: Arrays, X: np.ndarray) -> float:
    """Return overall efficiency: sum of gpus_i * U_i, in slowest-GPU-equivalents."""
    return float((a.gpus * utilities(a, X)).sum())


def envy_pairs(a: Arrays, X: np.ndarray, *, chunk: int = 512) -> tuple[int, float, list[tuple[int, int, float]]]:
    """Return (number of envy pairs, largest relative envy, up to 10 largest (i, k, envy)).

    Envy of i towards k: theta[i, k] * U_i(X_k) / U_i(X_i) - 1 (see envy_factor; relative; pairs
    above the tolerance count). Computed in row chunks so 5000 jobs stay small in memory.
    """
    own = utilities(a, X)
    count, worst, top = 0, 0.0, []
    for lo in range(0, len(own), chunk):
        hi = min(lo + chunk, len(own))
        value = a.V[lo:hi] @ X.T                                  # U_i(X_k)
        gap = envy_factor(a.gpus, a.weight, slice(lo, hi)) * value - own[lo:hi, None]
        np.fill_diagonal(gap[:, lo:hi], 0.0)
        bad = gap > REL_TOL * np.maximum(own[lo:hi, None], 1.0) + ABS_TOL
        count += int(bad.sum())
        if bad.any():
            rel = np.where(bad, gap / np.maximum(own[lo:hi, None], ABS_TOL), 0.0)
            worst = max(worst, float(rel.max()))
            for r, k in zip(*np.nonzero(bad)):
                top.append((lo + int(r), int(k), float(rel[r, k])))
            top = sorted(top, key=lambda t: -t[2])[:10]
    return count, worst, top


def pareto_gain(a: Arrays, X: np.ndarray) -> float:
    """Return the largest relative efficiency gain of an allocation that lowers no job's U (an LP).

    0 means X is Pareto efficient; a positive value means a Pareto improvement exists. Solved with
    scipy's HiGHS, independently of the solvers.
    """
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, diags, eye, kron, vstack

    n, m = X.shape
    per_gpu = diags(np.repeat(a.gpus, m))
    cap_rows = kron(csr_matrix(np.ones((1, n))), eye(m)) @ per_gpu       # sum_i g_i X[i, j]
    row_sums = kron(eye(n), csr_matrix(np.ones((1, m))))                   # sum_j X[i, j]
    util_rows = -(row_sums @ diags(a.V.ravel()))                           # -U_i(X')
    A = vstack([cap_rows, row_sums, util_rows]).tocsr()
    b = np.concatenate([a.capacity, np.ones(n), -utilities(a, X) * (1 - 1e-9)])
    c = -(np.repeat(a.gpus, m) * a.V.ravel())
    bounds = np.column_stack([np.zeros(n * m), np.where(a.usable.ravel(), 1.0, 0.0)])
    res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0:
        return 0.0
    now = efficiency(a, X)
    return max(0.0, (-res.fun - now) / max(now, ABS_TOL))


Round = list[tuple[int, str, list[int]]]


class OefPlan(Plan):
    """An OEF plan: time fractions per job and GPU type, the claimed guarantees, and the rounds.

    `shares[i][j]` is the fraction of time job `jobs[i]` runs on type `types[j]` (with its GPUs).
    `rounds[r]` lists (job index, GPU type, GPU ids) for every job that runs in round r.
    """

    kind: str = "oef"
    policy: str = ""
    guarantees: list[str] = Field(default_factory=list)
    types: list[str] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)
    shares: list[list[float]] = Field(default_factory=list)
    round_s: float = 0.0
    rounds: list[Round] = Field(default_factory=list)

    def matrix(self) -> np.ndarray:
        """Return the shares as an (jobs x types) array."""
        return np.array(self.shares, dtype=float).reshape(len(self.jobs), len(self.types))


def assess(problem: OefProblem, plan: OefPlan, *, pareto: bool = True) -> dict[str, Any]:
    """Return every figure of an allocation: efficiency (slowest-GPU-equivalents), worst SI ratio,
    envy pairs and the largest relative envy, Pareto gain (LP), GPUs used per type, and the
    largest gap between realised round shares and the fractional shares."""
    a = arrays(problem)
    X = plan.matrix()
    U = utilities(a, X)
    ref = utilities(a, equal_share(a))
    si = U / np.maximum(ref, ABS_TOL)
    pairs, worst, top = envy_pairs(a, X)
    out: dict[str, Any] = {
        "efficiency": efficiency(a, X),
        "min_si_ratio": float(si.min()),
        "envy_pairs": pairs,
        "max_envy": worst,
        "top_envy": top,
        "gpus_used": {t: float((a.gpus * X[:, j]).sum()) for j, t in enumerate(a.types)},
        "si_ratio": si,
    }
    if pareto:
        out["pareto_gain"] = pareto_gain(a, X)
    if plan.rounds:
        out["round_gap"] = float(np.abs(realised_fractions(a, plan.rounds) - X).max())
    return out


def realised_fractions(a: Arrays, rounds: list[Round]) -> np.ndarray:
    """Return the time fraction each job ran on each type over `rounds` (n x m)."""
    R = np.zeros((len(a.names), len(a.types)))
    col = {t: j for j, t in enumerate(a.types)}
    for rnd in rounds:
        for i, t, _ in rnd:
            if 0 <= i < len(a.names) and t in col:
                R[i, col[t]] += 1
    return R / max(len(rounds), 1)


def check(problem: OefProblem, plan: OefPlan) -> list[Violation]:
    """Return the violations of an OEF plan: shape, bounds, capacity, per-job time, the claimed
    fairness properties (SI, EF, PE), and the rounds (valid GPU ids, sizes, realised shares)."""
    a = arrays(problem)
    if plan.types != a.types or plan.jobs != a.names:
        return [Violation("mismatch", "the plan's jobs or GPU types differ from the problem's",
                          {"plan_types": plan.types, "types": a.types})]
    try:
        X = plan.matrix()
    except ValueError:
        return [Violation("mismatch", f"shares must be {len(a.names)} rows of {len(a.types)} numbers")]
    out: list[Violation] = []
    for i, j in zip(*np.nonzero((X < -ABS_TOL) | ((X > ABS_TOL) & ~a.usable))):
        out.append(Violation("bad_share", f"{a.names[i]} has share {X[i, j]:.4g} of {a.types[j]} "
                             "(negative, or a type it cannot use)", {"job": a.names[i], "type": a.types[j]}))
    rows = X.sum(axis=1)
    for i in np.nonzero(rows > 1 + REL_TOL)[0]:
        out.append(Violation("time", f"{a.names[i]} runs {rows[i]:.6g} of the time (> 1)",
                             {"job": a.names[i], "time": float(rows[i])}))
    used = (a.gpus[:, None] * X).sum(axis=0)
    for j in np.nonzero(used > a.capacity * (1 + REL_TOL) + ABS_TOL)[0]:
        out.append(Violation("capacity", f"{a.types[j]}: {used[j]:.6g} GPUs allocated, {a.capacity[j]:.0f} exist",
                             {"type": a.types[j], "used": float(used[j]), "capacity": float(a.capacity[j])}))
    promised, contract_out = promised_guarantees(plan)
    out += contract_out
    if SI in promised:
        U, ref = utilities(a, X), utilities(a, equal_share(a))
        for i in np.nonzero(U < ref * (1 - REL_TOL) - ABS_TOL)[0]:
            out.append(Violation("sharing_incentive", f"{a.names[i]} gets {U[i]:.6g}, below its equal "
                                 f"share's {ref[i]:.6g} (ratio {U[i] / ref[i]:.4f})",
                                 {"job": a.names[i], "ratio": float(U[i] / ref[i])}))
    if EF in promised:
        count, worst, top = envy_pairs(a, X)
        if count:
            i, k, size = top[0]
            out.append(Violation("envy", f"{count} envy pair(s); largest: {a.names[i]} envies {a.names[k]} "
                                 f"by {size:.3%}", {"pairs": count, "max_envy": worst,
                                                    "top": [(a.names[p], a.names[q], e) for p, q, e in top]}))
    if PE in promised:
        gain = pareto_gain(a, X)
        if gain > 1e-5:
            out.append(Violation("pareto", f"a Pareto improvement raises efficiency by {gain:.3%} "
                                 "without lowering any job", {"gain": gain}))
    out += _check_rounds(problem, a, plan, X)
    out += _check_figures(problem, a, plan, X)
    return out


def promised_guarantees(plan: OefPlan) -> tuple[set[str], list[Violation]]:
    """Return (the fairness properties to enforce, violations of the plan's statement of them).

    What a plan must satisfy is its solver's contract in the registry (solver name -> guarantees),
    plus anything the plan claims besides; a plan whose `guarantees` list differs from its solver's
    contract misstates it. A plan without solver info (made by hand) is held to what it claims.
    """
    from gpuplan.registry import contract

    claimed = set(plan.guarantees)
    if plan.solver is None:
        return claimed, []
    promised = contract("oef", plan.solver.name)
    if promised is None:   # an unknown solver: the frame's check reports it
        return claimed, []
    out = []
    if claimed != set(promised):
        out.append(Violation("guarantees", f"the plan states guarantees {sorted(claimed)}; its solver "
                             f"{plan.solver.name!r} promises {sorted(promised)}",
                             {"stated": sorted(claimed), "contract": sorted(promised)}))
    return claimed | set(promised), out


def _check_figures(problem: OefProblem, a: Arrays, plan: OefPlan, X: np.ndarray) -> list[Violation]:
    """Return violations of the figures the plan states: objective (efficiency, slowest-GPU
    equivalents), predicted efficiency, throughput (steps/s) and round gap, the round length (s) and
    the number of rounds, each recomputed from the problem and the shares."""
    predicted = {"efficiency": efficiency(a, X), "throughput_steps_per_s": float((a.T * X).sum())}
    if plan.rounds:
        predicted["round_gap"] = float(np.abs(realised_fractions(a, plan.rounds) - X).max())
    objective = predicted["efficiency"] if plan.objective is not None or plan.solver is not None else None
    out = stated_figures_violations(plan, objective, predicted)
    out += _solver_claims(plan, predicted["efficiency"])
    if not plan.rounds and "round_gap" in plan.predicted:
        out.append(Violation("figure", "the plan states predicted.round_gap but lays out no rounds",
                             {"field": "predicted.round_gap"}))
    if plan.solver is not None and len(plan.rounds) != problem.rounds:
        out.append(Violation("rounds", f"the plan lays out {len(plan.rounds)} rounds; the problem asks for "
                             f"{problem.rounds}", {"rounds": len(plan.rounds), "expected": problem.rounds}))
    if plan.rounds and (plan.solver is not None or plan.round_s) and plan.round_s != problem.round_s:
        out += figure_violations("round_s", plan.round_s, problem.round_s)
    return out


def _solver_claims(plan: OefPlan, efficiency_now: float) -> list[Violation]:
    """Return violations of what the plan says of its solver: the policy it names must be its
    solver's, and a stated upper bound on the optimum (solver.stats.upper_bound, efficiency) may not
    lie below the plan's efficiency, nor the certified gap and efficiency differ from them."""
    if plan.solver is None:
        return []
    out: list[Violation] = []
    label = POLICY_LABELS.get(plan.solver.name)
    if label is not None and plan.policy != label:
        out.append(Violation("policy", f"the plan names its policy {plan.policy!r}; solver {plan.solver.name!r} "
                             f"computes {label!r}", {"stated": plan.policy, "expected": label}))
    stats = plan.solver.stats
    bound = stats.get("upper_bound")
    if bound is None:
        return out
    if not isinstance(bound, (int, float)) or isinstance(bound, bool) or bound < efficiency_now * (1 - REL_TOL) - ABS_TOL:
        out.append(Violation("figure", f"solver.stats.upper_bound = {bound!r} is below the plan's own efficiency "
                             f"{efficiency_now:.6g}: it bounds nothing", {"field": "solver.stats.upper_bound"}))
        return out
    if "efficiency" in stats:
        out += figure_violations("solver.stats.efficiency", stats["efficiency"], efficiency_now)
    if stats.get("certified_gap") is not None:
        gap = (bound - efficiency_now) / max(bound, 1e-12)
        out += figure_violations("solver.stats.certified_gap", stats["certified_gap"], gap, abs_tol=1e-6)
    return out


def _check_rounds(problem: OefProblem, a: Arrays, plan: OefPlan, X: np.ndarray) -> list[Violation]:
    """Return violations of the rounds: GPU ids of the right type used once, sizes, realised shares."""
    if not plan.rounds:
        return []
    out: list[Violation] = []
    devices = problem.cluster.devices
    for r, rnd in enumerate(plan.rounds):
        used: set[int] = set()
        ran: set[int] = set()
        for i, t, ids in rnd:
            if not 0 <= i < len(a.names) or i in ran:
                out.append(Violation("round", f"round {r}: job index {i} is unknown or runs twice"))
                continue
            ran.add(i)
            bad = [g for g in ids if not 0 <= g < len(devices) or devices[g].type != t or g in used]
            twice = sorted({g for g in ids if list(ids).count(g) > 1})
            if bad or twice or len(ids) != a.gpus[i]:
                out.append(Violation("round", f"round {r}: {a.names[i]} on {t} GPUs {ids}: needs {a.gpus[i]:.0f} "
                                     f"distinct {t} GPUs (bad ids {bad}, listed twice {twice})",
                                     {"round": r, "job": a.names[i]}))
            used.update(ids)
    gap = np.abs(realised_fractions(a, plan.rounds) - X)
    if gap.max() > problem.round_tolerance + 1e-9:
        i, j = np.unravel_index(int(gap.argmax()), gap.shape)
        out.append(Violation("round_share", f"{a.names[i]} runs {gap[i, j]:.3f} off its {a.types[j]} share over "
                             f"{len(plan.rounds)} rounds (tolerance {problem.round_tolerance})",
                             {"gap": float(gap[i, j])}))
    return out


def nodes_per_job(problem: OefProblem, plan: OefPlan) -> float:
    """Return the mean number of nodes a running job spans per round (1 is ideal)."""
    devices = problem.cluster.devices
    spans = [len({devices[g].node for g in ids}) for rnd in plan.rounds for _, _, ids in rnd]
    return float(np.mean(spans)) if spans else 0.0


def summarize(problem: OefProblem, plan: OefPlan) -> dict[str, Any]:
    """Return the compare columns: efficiency, worst SI ratio, envy pairs, the largest envy relative to
    the envious job's own utility (U_i(X_k) / U_i(X_i) - 1: huge when a job gets almost nothing), and
    the Pareto gap (the efficiency fraction a reallocation that lowers no job would add; 0 = Pareto
    efficient, and envy-freeness can forbid closing it)."""
    f = assess(problem, plan)
    return {"efficiency": f["efficiency"], "min_si_ratio": f["min_si_ratio"], "envy_pairs": f["envy_pairs"],
            "max_envy_rel": f["max_envy"], "pareto_gap": f["pareto_gain"]}


def describe(problem: OefProblem, plan: OefPlan) -> list[Table]:
    """Return tables: per-job shares and figures, per-tenant totals, and the plan's figures."""
    a = arrays(problem)
    X = plan.matrix()
    f = assess(problem, plan)
    U = utilities(a, X)
    rows = [[a.names[i], int(a.gpus[i])] + [float(x) for x in X[i]] + [float(U[i]), float(f["si_ratio"][i])]
            for i in range(min(len(a.names), 60))]
    jobs = Table(f"shares (time fraction per GPU type){'; first 60 jobs' if len(a.names) > 60 else ''}",
                 ["job", "gpus"] + a.types + ["norm. throughput", "SI ratio"], rows)
    tenant_rows = []
    for t in dict.fromkeys(a.tenants):
        idx = [i for i, x in enumerate(a.tenants) if x == t]
        tenant_rows.append([t, len(idx), float((a.gpus[idx] * U[idx]).sum()),
                            float(f["si_ratio"][idx].min())])
    tenants = Table("tenants", ["tenant", "jobs", "efficiency", "worst SI ratio"], tenant_rows)
    figures = [["policy", plan.policy], ["guarantees", ", ".join(plan.guarantees) or "-"],
               ["efficiency (slowest-GPU equivalents)", f["efficiency"]],
               ["worst sharing-incentive ratio", f["min_si_ratio"]], ["envy pairs", f["envy_pairs"]],
               ["largest envy (relative: U_i(X_k) / U_i(X_i) - 1; huge when a job gets almost nothing)",
                f["max_envy"]],
               ["Pareto gap (efficiency a reallocation lowering no job would add, fraction; 0 = Pareto "
                "efficient; envy-freeness can forbid it)", f["pareto_gain"]]]
    figures += [[f"{t} GPUs used", v] for t, v in f["gpus_used"].items()]
    if plan.rounds:
        figures += [["rounds", len(plan.rounds)], ["largest round-share gap", f["round_gap"]],
                    ["nodes per running job", nodes_per_job(problem, plan)]]
    return [jobs, tenants, Table("figures", ["figure", "value"], figures)]


def draw(problem: OefProblem, plan: OefPlan, path: Path) -> None:
    """Write a PNG: shares per job stacked by GPU type, and GPU occupancy over the rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = arrays(problem)
    X = plan.matrix()
    n = min(len(a.names), 40)
    fig, axes = plt.subplots(1, 2 if plan.rounds else 1, figsize=(13 if plan.rounds else 7, 5), squeeze=False)
    ax = axes[0][0]
    bottom = np.zeros(n)
    from gpuplan.viz import legend_outside, series_colour

    for j, t in enumerate(a.types):
        gpus = a.gpus[:n] * X[:n, j]
        ax.barh(range(n), gpus, left=bottom, label=t, color=series_colour(j))
        bottom += gpus
    ax.set_yticks(range(n), a.names[:n], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GPUs held on average (time fraction x GPUs)")
    ax.set_title(f"{plan.policy or plan.kind}: shares per job")
    legend_outside(ax, title="GPU type")
    if plan.rounds:
        grid = np.full((len(problem.cluster.devices), len(plan.rounds)), np.nan)
        for r, rnd in enumerate(plan.rounds):
            for i, _, ids in rnd:
                grid[ids, r] = i
        ax2 = axes[0][1]
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator

        jobs_seen = sorted({int(i) for i in grid[~np.isnan(grid)]})
        cmap = ListedColormap([plt.get_cmap("tab20")(k % 20) for k in range(max(len(a.names), 1))])
        ax2.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, vmin=-0.5,
                   vmax=max(len(a.names), 1) - 0.5)
        ax2.set_xlabel("round (index)")
        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(jobs_seen) <= 20:  # a key is readable up to 20 jobs; beyond, colours repeat
            ax2.legend(handles=[Patch(color=cmap(k), label=a.names[k]) for k in jobs_seen], title="job",
                       loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        first: dict[str, list[int]] = {}
        for d in problem.cluster.devices:
            first.setdefault(d.type, []).append(d.id)
        ax2.set_yticks([ids[0] for ids in first.values()],
                       [f"{t} {ids[0]}-{ids[-1]}" for t, ids in first.items()], fontsize=8)
        ax2.set_ylabel("GPU ids")
        ax2.set_title("which job runs on which GPU (colour = job; white = idle)")
    fig.tight_layout()
    from gpuplan.io import atomic_write_figure

    atomic_write_figure(fig, path, dpi=110)


register_model(ModelSpec("oef", OefProblem, OefPlan, check, summarize=summarize, describe=describe, draw=draw,
                         title="fair, efficient shares of heterogeneous GPU types (OEF, Middleware '24)"))
