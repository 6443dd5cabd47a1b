"""OEF solvers: the cooperative OEF convex program (EF + SI, the default), the SI-only variant, the
non-cooperative strategy-proof mechanism (Partial Allocation over Nash welfare), and the baselines
(Gavel's heterogeneity-aware max-min, agnostic max-min, max total throughput, equal share).

Jobs with identical speedup vector, GPUs-at-once and weight form one *class*: every program here is
symmetric in identical jobs and convex, so an optimum gives them equal rows, and one row per class
suffices. EF constraints then number (#classes)^2, not (#jobs)^2. With distinct jobs (a real
cluster) that is still n^2: the EF and SI LPs go to HiGHS through solvers/oef/ef.py, which adds
envy rows on demand from an exact oracle over all pairs and returns the full LP's optimum.

Modules: this one (the programs and their registration), ef.py (the EF LP by row generation, its time
budget and certified gap), market.py (the equal-incomes market and its convex combination), dual.py
(the group Lagrangian dual bound), groups.py (the grouped restriction), hull.py (the per-job mix LP),
rounds.py (whole-GPU rounds on GPU ids), sim.py (the job-trace simulator).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from gpuplan.models.oef import (EF, PE, POLICY_LABELS, SI, Arrays, OefPlan, OefProblem, arrays, efficiency, envy_factor,
                                equal_share, realised_fractions)
from gpuplan.models.plan import SolverInfo, Status
from gpuplan.option_rules import integer, one_of
from gpuplan.registry import register_solver
from gpuplan.solvers.backends import solve_cvxpy


@dataclass(frozen=True)
class Classes:
    """Jobs grouped by (speedup vector, GPUs-at-once, weight): one representative row per class
    (`first`: the index of each class's first job)."""

    of_job: np.ndarray
    first: np.ndarray
    count: np.ndarray
    V: np.ndarray
    gpus: np.ndarray
    weight: np.ndarray
    usable: np.ndarray
    capacity: np.ndarray


def classes(a: Arrays) -> Classes:
    """Return the classes of identical jobs (rows rounded to 9 significant digits for grouping)."""
    key = np.column_stack([np.round(a.V, 9), a.gpus, np.round(a.weight, 12), a.usable])
    _, first, inverse, count = np.unique(key, axis=0, return_index=True, return_inverse=True,
                                         return_counts=True)
    return Classes(inverse.ravel(), first, count.astype(float), a.V[first], a.gpus[first], a.weight[first],
                   a.usable[first], a.capacity)


def _matrices(c: Classes) -> dict[str, Any]:
    """Return the sparse LP data over y = vec(Y) (row-major, classes x types): per-class time
    `rows`, per-type GPUs `cap`, and per-class normalised throughput `own`."""
    from gpuplan.solvers.oef.ef import lp_matrices

    rows, cap, own = lp_matrices(c.V, c.count * c.gpus)
    return {"rows": rows, "cap": cap, "own": own}


def envy_rows(c: Classes, si_ref: np.ndarray) -> tuple[Any, np.ndarray]:
    """Return the EF constraints as a sparse matrix E (E @ y <= 0) and each row's envious class i,
    one row per ordered class pair
    (i, k): theta[i, k] V_i . Y_k - V_i . Y_i. Pairs where even k's best bundle (all of its time on
    the type i values most among those k may use) cannot reach i's SI level are implied by SI and
    left out."""
    from gpuplan.solvers.oef.ef import envy_block

    k = len(c.V)
    theta = envy_factor(c.gpus, c.weight)
    best = np.max(c.V[:, None, :] * c.usable[None, :, :], axis=2)       # best[i, q]
    I, K = np.nonzero((theta * best > si_ref[:, None] * (1 - 1e-9)) & ~np.eye(k, dtype=bool))
    return envy_block(c.V, c.weight / c.gpus, I, K), I


def lp_allocation(c: Classes, *, fairness: str, si_ref: np.ndarray | None = None,
                  time_limit_s: float | None = None, method: str = "cuts", fallback: np.ndarray | None = None,
                  tie_break: str = "solver", groups: int = 0, dual_groups: int = 100
                  ) -> tuple[np.ndarray, Status, dict[str, Any]]:
    """Return the class rows (time fractions, classes x types) of an LP policy, its status, stats.

    fairness: 'ef' (max efficiency s.t. SI and EF), 'si' (s.t. SI), 'none' (max efficiency),
    'maxmin' (Gavel's heterogeneity-aware max-min), 'agnostic' (max-min of weighted GPU time).
    The constraints are sparse matrices over vec(Y), so building the LP costs little beyond HiGHS.
    The EF and SI LPs go to HiGHS directly with row generation for EF (ef_cutting_planes) unless
    method='cvxpy', which hands all EF rows to cvxpy + HiGHS at once (same optimum, n^2 rows: the
    reference for small inputs). `fallback`: envy-free SI class rows a time limit may return.
    tie_break (max-min LPs, which are degenerate): 'solver' keeps the interior point the solver
    returns (as Gavel's ECOS does); 'efficiency' then maximises efficiency among the max-min optima
    (min within 1e-7 of the optimum; HiGHS), so the result does not depend on the solver.
    """
    if tie_break not in ("solver", "efficiency"):
        from gpuplan.errors import InputError

        raise InputError(f"option tie_break: 'solver' or 'efficiency', not {tie_break!r}", field="option.tie_break",
                         value=tie_break, expected="solver | efficiency")
    k, m = c.V.shape
    if fairness in ("ef", "si") and method == "cuts" and si_ref is not None:
        return ef_cutting_planes(c, si_ref, time_limit_s, fallback=fallback, envy=fairness == "ef",
                                 groups=groups, dual_groups=dual_groups)
    import cvxpy as cp

    M = _matrices(c)
    y = cp.Variable(k * m, name="Y")
    cons = [y >= 0, y <= c.usable.ravel().astype(float), M["rows"] @ y <= 1, M["cap"] @ y <= c.capacity]
    own = M["own"] @ y
    stats: dict[str, Any] = {}
    if fairness in ("ef", "si", "none"):
        objective = cp.Maximize((c.count * c.gpus) @ own)
        if fairness in ("ef", "si"):
            cons.append(own >= si_ref)
        if fairness == "ef" and k > 1:
            E, _ = envy_rows(c, si_ref)
            stats = {"ef_rows": int(E.shape[0]), "ef_rows_implied_by_si": k * (k - 1) - int(E.shape[0])}
            if E.shape[0]:
                cons.append(E @ y <= 0)
    else:
        t = cp.Variable(name="t")
        if fairness == "maxmin":
            # Gavel: p_i = throughput on a capacity-proportional mix of types
            p = (c.V * c.usable) @ c.capacity / c.capacity.sum()
            cons.append(cp.multiply(c.gpus / (c.weight * p), own) >= t)
        else:
            cons.append(cp.multiply(c.gpus / c.weight, M["rows"] @ y) >= t)
        objective = cp.Maximize(t)
    prob = cp.Problem(objective, cons)
    # Gavel solves its max-min LP with an interior-point method (ECOS), which ends inside the optimal
    # face (jobs not at the bottleneck keep their extra throughput); Clarabel does the same here.
    # The efficiency LPs go to HiGHS's primal simplex (an exact vertex; on the EF LP it is 4-25x
    # faster than HiGHS's default dual simplex, its IPM or Clarabel, measured on the benchmark inputs).
    if fairness in ("ef", "si", "none"):
        from gpuplan.errors import SolverError

        try:
            status, _ = solve_cvxpy(prob, preferred=("HIGHS",), time_limit_s=time_limit_s, simplex_strategy=4)
        except SolverError:
            if time_limit_s is None or fallback is None or fairness == "none":
                raise
            # the reference route has no partial plan: a time limit returns the equal split (SI, EF)
            stats["message"] = (f"time limit of {time_limit_s:.3g} s reached before cvxpy's LP finished: the plan "
                                "is the equal split (method=cuts returns a better plan with a certified gap)")
            return fallback.copy(), Status.TIME_LIMIT, stats
    else:
        status, _ = solve_cvxpy(prob, preferred=("CLARABEL", "HIGHS"), time_limit_s=time_limit_s)
        if tie_break == "efficiency" and t.value is not None:
            best = float(t.value)
            floor = t >= best - 1e-7 * max(abs(best), 1.0)
            second = cp.Problem(cp.Maximize((c.count * c.gpus) @ own), cons + [floor])
            status, _ = solve_cvxpy(second, preferred=("HIGHS",), time_limit_s=time_limit_s)
    return np.asarray(y.value, dtype=float).reshape(k, m), status, stats


def ef_cutting_planes(c: Classes, si_ref: np.ndarray, time_limit_s: float | None = None,
                      fallback: np.ndarray | None = None, envy: bool = True, groups: int = 0,
                      dual_groups: int = 100) -> tuple[np.ndarray, Status, dict[str, Any]]:
    """Return (class rows, status, stats) of max efficiency s.t. SI (and EF when `envy`).

    Row generation with an exact separation oracle over all class pairs (see solvers/oef/ef.py):
    the result is the full LP's optimum. `fallback` (class rows of an envy-free, SI allocation,
    e.g. the equal split) is what a time limit mixes the last relaxed optimum with; then the status
    is TIME_LIMIT and stats carry the certified gap and a `message`. groups > 0: with a time limit,
    also try the EF LP restricted to that many groups of similar jobs (solvers/oef/groups.py).
    dual_groups: groups of the dual bound's relaxation at a time limit (solvers/oef/dual.py; 0: none).
    """
    from gpuplan.solvers.oef.ef import solve_ef_lp

    res = solve_ef_lp(c.V, c.usable, c.count * c.gpus, c.capacity, c.weight / c.gpus, si_ref, fallback,
                      envy=envy, time_limit_s=time_limit_s, groups=groups, weight=c.weight, gpus=c.gpus,
                      dual=dual_groups > 0, dual_groups=max(dual_groups, 1))
    stats = dict(res.stats)
    if res.message:
        stats["message"] = res.message
    return res.Y, res.status, stats


class NashWelfare:
    """The Nash-welfare (Eisenberg-Gale) program over classes, built once with cvxpy parameters so
    the Partial Allocation mechanism re-solves it cheaply with one class member removed."""

    def __init__(self, c: Classes) -> None:
        import cvxpy as cp

        k, m = c.V.shape
        self.c = c
        self.V = cp.Parameter((k, m), nonneg=True)
        self.allowed = cp.Parameter((k, m), nonneg=True)
        self.size = cp.Parameter(k, nonneg=True)          # count * gpus
        self.logw = cp.Parameter(k, nonneg=True)          # count * weight (0: class absent)
        self.absent = cp.Parameter(k, nonneg=True)
        self.Y = cp.Variable((k, m))
        z = cp.Variable(k)
        u = cp.sum(cp.multiply(self.V, self.Y), axis=1)
        cons = [self.Y >= 0, self.Y <= self.allowed, cp.sum(self.Y, axis=1) <= 1,
                self.size @ self.Y <= c.capacity, z <= cp.log(u + self.absent)]
        self.problem = cp.Problem(cp.Maximize(self.logw @ z), cons)
        self.V.value = c.V

    def solve(self, count: np.ndarray) -> np.ndarray:
        """Return the class rows maximising sum count_c w_c log U_c with `count` jobs per class."""
        present = (count > 0).astype(float)
        self.allowed.value = self.c.usable * present[:, None]
        self.size.value = count * self.c.gpus
        self.logw.value = count * self.c.weight
        self.absent.value = 1.0 - present
        with warnings.catch_warnings():      # "may be inaccurate": accepted, the status says FEASIBLE
            warnings.simplefilter("ignore", UserWarning)
            solve_cvxpy(self.problem, preferred=("CLARABEL", "SCS"))
        return np.clip(np.asarray(self.Y.value, dtype=float), 0.0, None) * self.c.usable


def partial_allocation(c: Classes, progress: Callable[[float | None, str], None] | None = None,
                       nw: NashWelfare | None = None, time_limit_s: float | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Return (class rows, discount factors) of the Partial Allocation mechanism (Cole, Gkatzelis,
    Goel): the Nash-welfare allocation, each job keeping the fraction
    f_i = prod_{k != i} (U_k(X*) / U_k(X*_{-i}))^{w_k / w_i} of its bundle, X*_{-i} the Nash-welfare
    allocation without job i. Truthful for these (degree-1 homogeneous) utilities. `nw` reuses a
    compiled NashWelfare of the same shape (the strategy-proofness probe re-runs it many times).
    Raises SolverError when `time_limit_s` runs out (a partial result would not be strategy-proof)."""
    from gpuplan.errors import SolverError

    started = time.perf_counter()
    if nw is None:
        nw = NashWelfare(c)
    else:                                  # a compiled program of the same shape: new speeds only
        nw.c, nw.V.value = c, c.V
    Y = nw.solve(c.count)
    U = np.maximum((c.V * Y).sum(axis=1), 1e-300)
    f = np.ones(len(c.count))
    for q in range(len(c.count)):
        if progress:
            progress(q / len(c.count), f"partial allocation: class {q + 1} of {len(c.count)}")
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            raise SolverError(f"partial allocation: time limit of {time_limit_s:.3g} s reached after "
                              f"{q} of {len(c.count)} classes (it needs one Nash-welfare solve per class)")
        others = c.count.copy()
        others[q] -= 1
        Yq = nw.solve(others)
        Uq = np.maximum((c.V * Yq).sum(axis=1), 1e-300)
        live = others > 0
        log_f = (others[live] * c.weight[live] / c.weight[q] * (np.log(U[live]) - np.log(Uq[live]))).sum()
        f[q] = min(1.0, float(np.exp(log_f)))
    return Y * f[:, None], f


def _plan(problem: OefProblem, a: Arrays, c: Classes, Y: np.ndarray, *,
          guarantees: list[str], status: Status, name: str, stats: dict[str, Any],
          progress: Callable[[float | None, str], None], message: str = "") -> OefPlan:
    """Return the OefPlan of class rows Y: job rows, rounds on GPU ids, efficiency as objective.

    A plan stopped by the time limit claims no Pareto efficiency; a plan whose rounds miss the
    problem's round_tolerance is 'feasible', not 'optimal', and its message says by how much.
    """
    from gpuplan.solvers.oef.rounds import schedule

    X = np.clip(Y[c.of_job], 0.0, 1.0) * a.usable
    X = X / np.maximum(X.sum(axis=1), 1.0)[:, None]
    rounds: list[Any] = []
    predicted = {"efficiency": efficiency(a, X), "throughput_steps_per_s": float((a.T * X).sum())}
    if status is Status.TIME_LIMIT:
        guarantees = [g for g in guarantees if g != PE]
    if problem.rounds:
        progress(0.9, f"laying out {problem.rounds} rounds on GPU ids")
        rounds = schedule(problem, a, X, problem.rounds)
        predicted["round_gap"] = float(np.abs(realised_fractions(a, rounds) - X).max())
    notes = [message] if message else []
    if predicted.get("round_gap", 0.0) > problem.round_tolerance + 1e-9:
        notes.append(f"the rounds realise the shares only within {predicted['round_gap']:.3f} of the time "
                     f"(tolerance {problem.round_tolerance}): some shares cannot be packed into whole-GPU rounds, "
                     "so check reports round_share; the shares themselves are as solved")
        if status is Status.OPTIMAL:
            status = Status.FEASIBLE
    return OefPlan(kind="oef", status=status, objective=predicted["efficiency"], message="; ".join(notes),
                   objective_name="efficiency (sum of GPUs x speedup over slowest type)",
                   predicted=predicted,
                   policy=POLICY_LABELS[name], guarantees=guarantees, types=a.types, jobs=a.names,
                   shares=[[float(v) for v in row] for row in X], round_s=problem.round_s, rounds=rounds,
                   solver=SolverInfo(name=name, stats={"jobs": len(a.names), "classes": len(c.count),
                                                       "types": len(a.types), **stats}))


MAX_DUAL_GROUPS = 1000         # the dual bound holds jobs x groups multipliers
ROUND_S_PER_JOB = 2e-5        # laying out one round on GPU ids, per job (busy 2-core machine)


def solver_time_s(time_limit_s: float | None, started: float, arrays_s: float, jobs: int, rounds: int) -> float | None:
    """Return the seconds the allocation may take so the whole solve ends within `time_limit_s`
    (None: no limit): the limit, less what has run since `started` (perf_counter), less what comes
    after the allocation: the plan, the frame's copy of the problem into it and its digest (about
    2x the time `arrays` took, `arrays_s`: both walk every job, so the estimate follows the
    machine's load) and the rounds on GPU ids; at most 40% of the limit is set aside."""
    if time_limit_s is None:
        return None
    after = min(0.4 * time_limit_s, 2.0 * arrays_s + ROUND_S_PER_JOB * jobs * rounds)
    return max(time_limit_s - after - (time.perf_counter() - started), 0.0)


def _lp_plan(problem: OefProblem, fairness: str, guarantees: list[str], name: str, time_limit_s: float | None,
             progress: Callable[[float | None, str], None], **lp_options: Any) -> OefPlan:
    """Return the plan of one LP policy (`lp_allocation`'s `fairness`) with the options it reads."""
    started = time.perf_counter()
    a = arrays(problem)
    arrays_s = time.perf_counter() - started
    c = classes(a)
    progress(0.1, f"{POLICY_LABELS[name]}: {len(a.names)} jobs in {len(c.count)} classes")
    E = equal_share(a)[c.first]
    ref = (c.V * E).sum(axis=1)
    limit = solver_time_s(time_limit_s, started, arrays_s, len(a.names), problem.rounds)
    Y, status, stats = lp_allocation(c, fairness=fairness, si_ref=ref, time_limit_s=limit, fallback=E, **lp_options)
    message = str(stats.pop("message", ""))
    return _plan(problem, a, c, Y, guarantees=guarantees, status=status, name=name,
                 stats=stats, progress=progress, message=message)


def _lp_solver(fairness: str, guarantees: list[str], name: str) -> Callable[..., OefPlan]:
    """Return the solver function of an LP policy; its signature holds only the options that policy
    reads (the registry refuses any other): method, groups and dual_groups for the SI/EF LPs, tie_break
    for the max-min ones, none for max efficiency."""
    policy = POLICY_LABELS[name]
    if fairness in ("ef", "si"):
        def solve(problem: OefProblem, *, time_limit_s: float | None = None, seed: int = 0,
                  progress: Callable[[float | None, str], None], method: str = "cuts", groups: int = 0,
                  dual_groups: int = 100) -> OefPlan:
            return _lp_plan(problem, fairness, guarantees, name, time_limit_s, progress, method=method,
                            groups=int(groups), dual_groups=int(dual_groups))

        solve.__doc__ = (f"Return the {policy} plan (LP, HiGHS; option method=cuts|cvxpy: row generation or "
                         "every EF row to cvxpy at once, groups=N: with a time limit, also try one bundle per "
                         "group of similar jobs, dual_groups=N: groups of the dual bound a time limit "
                         "certifies the plan with, 0 for none).")
    elif fairness in ("maxmin", "agnostic"):
        def solve(problem: OefProblem, *, time_limit_s: float | None = None, seed: int = 0,  # type: ignore[misc]
                  progress: Callable[[float | None, str], None], tie_break: str = "solver") -> OefPlan:
            return _lp_plan(problem, fairness, guarantees, name, time_limit_s, progress, tie_break=tie_break)

        solve.__doc__ = (f"Return the {policy} plan (max-min LP; option tie_break=solver|efficiency: keep the "
                         "solver's interior optimum, or the most efficient of the max-min optima).")
    else:
        def solve(problem: OefProblem, *, time_limit_s: float | None = None, seed: int = 0,  # type: ignore[misc]
                  progress: Callable[[float | None, str], None]) -> OefPlan:
            return _lp_plan(problem, fairness, guarantees, name, time_limit_s, progress)

        solve.__doc__ = f"Return the {policy} plan (LP, HiGHS; no options)."
    return solve


def solve_partial_allocation(problem: OefProblem, *, time_limit_s: float | None = None, seed: int = 0,
                             progress: Callable[[float | None, str], None], **_: Any) -> OefPlan:
    """Return the non-cooperative OEF plan: Partial Allocation over Nash welfare (strategy-proof).
    When `time_limit_s` (s) runs out before every class's Nash-welfare solve, a partial result would
    not be strategy-proof: the plan is then the weighted equal split (which no report can move: it
    reads only weights, GPU counts and usable types), with status time_limit and a message saying so."""
    from gpuplan.errors import SolverError

    a = arrays(problem)
    c = classes(a)
    try:  # a fifth of the limit stays for the plan and its rounds on GPU ids
        Y, f = partial_allocation(c, progress, time_limit_s=None if time_limit_s is None else 0.8 * time_limit_s)
    except SolverError as e:
        if time_limit_s is None:
            raise
        return _plan(problem, a, c, equal_share(a)[c.first], guarantees=[], status=Status.TIME_LIMIT, name="oef-noncoop", stats={"plan_from": "equal split"},
                     progress=progress, message=f"{e}; the plan is the weighted equal split instead (strategy-proof "
                     f"and sharing-incentive; a partial result of the mechanism would not be strategy-proof): "
                     f"raise the time limit for the mechanism's allocation")
    return _plan(problem, a, c, Y, guarantees=[],
                 status=Status.OPTIMAL, name="oef-noncoop",
                 stats={"min_discount": float(f.min()), "mean_discount": float(f.mean())}, progress=progress)


def solve_equal_share(problem: OefProblem, *, time_limit_s: float | None = None, seed: int = 0,
                      progress: Callable[[float | None, str], None], **_: Any) -> OefPlan:
    """Return the equal-share plan: every job gets its weighted 1/n of each usable type."""
    a = arrays(problem)
    c = classes(a)
    Y = equal_share(a)[c.first]
    return _plan(problem, a, c, Y, guarantees=[SI], status=Status.OPTIMAL,
                 name="equal-share", stats={}, progress=progress)


EFFICIENCY_LP_RULES = {
    "method": one_of("cuts", "cvxpy"),             # the EF/SI LP: row generation, or every EF row to cvxpy
    "groups": integer(1, special={0: "off: no grouped restriction"}),
    "dual_groups": integer(1, MAX_DUAL_GROUPS, special={0: "no dual bound"}),
}
"""The domain of the SI/EF LP policies' options (oef, oef-si), which registry.check_options enforces."""
MAXMIN_LP_RULES = {"tie_break": one_of("solver", "efficiency")}
"""The domain of the max-min LP policies' option (gavel-maxmin, maxmin-agnostic)."""

register_solver("oef", "oef", _lp_solver("ef", [SI, EF], "oef"), role="paper",
                default=True, description="max efficiency s.t. sharing incentive and envy-freeness (LP)",
                guarantees=(SI, EF), option_rules=EFFICIENCY_LP_RULES)
register_solver("oef", "oef-si", _lp_solver("si", [SI, PE], "oef-si"),
                role="variant", description="max efficiency s.t. sharing incentive (accepts envy; Pareto efficient)",
                guarantees=(SI, PE), option_rules=EFFICIENCY_LP_RULES)
register_solver("oef", "oef-noncoop", solve_partial_allocation, role="variant",
                description="strategy-proof: partial allocation over Nash welfare (Cole-Gkatzelis-Goel)")
register_solver("oef", "gavel-maxmin", _lp_solver("maxmin", [], "gavel-maxmin"), role="baseline",
                description="Gavel's LAS: max-min of throughput over capacity-proportional throughput",
                option_rules=MAXMIN_LP_RULES)
register_solver("oef", "maxmin-agnostic", _lp_solver("agnostic", [], "maxmin-agnostic"), role="baseline",
                description="max-min of weighted GPU time, blind to GPU types", option_rules=MAXMIN_LP_RULES)
register_solver("oef", "max-throughput", _lp_solver("none", [PE], "max-throughput"),
                role="baseline", description="max efficiency, no fairness", guarantees=(PE,))
register_solver("oef", "equal-share", solve_equal_share, role="baseline",
                description="weighted equal split of every GPU type", guarantees=(SI,))
