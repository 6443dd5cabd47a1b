"""Thin shared wrappers around the solver libraries: CP-SAT and cvxpy, time limits, seeds, statuses."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

from gpuplan.errors import InfeasibleError, SolverError
from gpuplan.models.plan import Status

T = TypeVar("T")

CP_MODEL = "ortools.sat.python.cp_model"  # the module CP-SAT models are built with

# Seconds a solver library takes to import the first time on a 2-core machine, measured: OR-Tools' CP-SAT
# module 0.3 s (most of it pandas, which it imports), cvxpy 0.4-0.5 s; rounded up. Under a shorter time
# limit a solver that can answer without the library does so (`cold_import_outlasts`).
COLD_IMPORT_S = {CP_MODEL: 0.5, "cvxpy": 1.0}


def cold_import_s(module: str) -> float:
    """Return the seconds importing `module` (a key of `COLD_IMPORT_S`) is expected to take now: its
    first import's `COLD_IMPORT_S`, or 0 once it is imported."""
    import sys

    return 0.0 if module in sys.modules else COLD_IMPORT_S[module]


def cold_import_outlasts(module: str, time_limit_s: float | None) -> str | None:
    """Return why importing `module` (a key of `COLD_IMPORT_S`) would outlast `time_limit_s` seconds, or
    None when there is no limit, the module is imported already, or its first import fits."""
    cost = cold_import_s(module)
    if time_limit_s is None or cost == 0.0 or time_limit_s >= cost:
        return None
    return f"{module.split('.')[0]}'s first import (about {cost:g} s here) would outlast the {time_limit_s:.3g} s left"


@dataclass
class Deadline:
    """A solve's time limit as a point on the `time.perf_counter` clock (inf: none), for searches made
    of steps that cannot be cut inside (a simulation, a rate search, one op's tuning): `paced` hands out
    the steps while one more of the longest step so far still fits, `cut` records that one was left out
    (`mark` then makes the plan time_limit). Tessel's `solvers.tessel.Clock` is the same idea with
    CP-SAT's deterministic budget and room kept for assembling the plan."""

    at: float = math.inf
    cut: bool = False
    step_s: float = 0.0  # the longest step `paced` has timed
    why: str = ""  # what stopped the last step `attempt` lost to the solve's time limit

    @classmethod
    def after(cls, time_limit_s: float | None, share: float = 1.0) -> "Deadline":
        """Return the deadline `share` of `time_limit_s` seconds from now (none without a limit)."""
        return cls(math.inf if time_limit_s is None else time.perf_counter() + share * time_limit_s)

    def left_s(self) -> float:
        """Return the seconds left (inf without a limit; never below 0)."""
        return max(0.0, self.at - time.perf_counter())

    def allows(self, step_s: float) -> bool:
        """Return True when a step of `step_s` seconds started now ends before the deadline; else record
        the cut and return False."""
        if time.perf_counter() + step_s <= self.at:
            return True
        self.cut = True
        return False

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Time the block as a step (it sets the length `paced` expects of the next one)."""
        started = time.perf_counter()
        yield
        self.step_s = max(self.step_s, time.perf_counter() - started)

    def paced(self, steps: Iterable[T], first_free: bool = True) -> Iterator[T]:
        """Yield `steps` while one more of the longest step timed so far fits before the deadline (the
        time from one item to the next is the step); the first always when `first_free`. Stops, with
        `cut` set, at the first that does not fit."""
        for k, item in enumerate(steps):
            if not (first_free and k == 0) and not self.allows(self.step_s):
                return
            with self.timing():
                yield item

    def attempt(self, fn: Callable[..., T], *args: Any, reserve: bool = True) -> T | None:
        """Return fn(*args) run as a step of a search (gpuplan.sim.core.searching: its simulations stop at
        the solve's time limit, keeping room for the chosen plan's own unless `reserve` is False: the
        plan the search would return now has its figures already); None, with the cut recorded, when
        the limit stopped one of its simulations (SimulationCut)."""
        from gpuplan.sim.core import SimulationCut, searching

        try:
            with searching(reserve):
                return fn(*args)
        except SimulationCut as exc:
            self.cut, self.why = True, str(exc)
            return None

    def mark(self, plan: Any, what: str) -> Any:
        """Return `plan` with status time_limit and a message saying the search stopped after `what` when
        a step was cut; unchanged otherwise."""
        if self.cut:
            plan.status = Status.TIME_LIMIT
            why = f" ({self.why})" if self.why else ""
            cut = f"the time limit stopped the search after {what}{why}; the plan is the best of those"
            plan.message = f"{cut}; {plan.message}" if plan.message else cut
        return plan


@dataclass
class CpSatResult:
    """The outcome of a CP-SAT solve: status, the solver object (to read values) and statistics."""

    status: Status
    solver: Any
    objective: float | None
    bound: float | None
    wall_time_s: float
    stats: dict[str, Any]


def solve_cpsat(model: Any, *, time_limit_s: float | None = None, seed: int = 0, workers: int = 2,
                hint_log: bool = False, deterministic_limit: float | None = None) -> CpSatResult:
    """Solve an OR-Tools CP-SAT model; return its status mapped to the plan statuses.

    `deterministic_limit` bounds CP-SAT's deterministic time (work units, about seconds) instead of
    the wall clock, so that with workers=1 a stopped search gives the same answer on every run.

    Raises InfeasibleError when the model is proven infeasible, SolverError when CP-SAT calls it
    invalid, and returns TIME_LIMIT when the limit ran out with a solution in hand.
    """
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = float(time_limit_s)
    if deterministic_limit is not None:
        solver.parameters.max_deterministic_time = float(deterministic_limit)
    solver.parameters.random_seed = int(seed)
    solver.parameters.num_workers = int(workers)
    solver.parameters.log_search_progress = hint_log
    code = solver.Solve(model)
    stats = {"conflicts": solver.NumConflicts(), "branches": solver.NumBranches()}
    has_objective = model.HasObjective()
    obj = solver.ObjectiveValue() if has_objective and code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    bound = solver.BestObjectiveBound() if has_objective else None
    if code == cp_model.OPTIMAL:
        status = Status.OPTIMAL
    elif code == cp_model.FEASIBLE:
        status = Status.TIME_LIMIT if time_limit_s is not None else Status.FEASIBLE
    elif code == cp_model.INFEASIBLE:
        raise InfeasibleError("the CP-SAT model is infeasible")
    elif code == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT reports an invalid model: {model.Validate()}")
    else:
        raise SolverError("CP-SAT found no solution within the time limit"
                          + (f" of {time_limit_s} s" if time_limit_s else ""))
    return CpSatResult(status, solver, obj, bound, solver.WallTime(), stats)


LP_SOLVERS = ("HIGHS", "CLARABEL", "SCS")
_HIGHS_QUIET = False


def _silence_highs_banner() -> None:
    """Create the process's first HiGHS object with stdout closed: HiGHS prints a banner then."""
    global _HIGHS_QUIET
    if _HIGHS_QUIET:
        return
    _HIGHS_QUIET = True
    import os
    import sys

    try:
        import highspy
    except ImportError:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def add_dense_rows(h: Any, A: Any, lower: Any, upper: Any) -> None:
    """Add the rows lower <= A x <= upper of a dense matrix A to the highspy model `h`, in the row-wise
    sparse form HiGHS takes (its non-zeros only; a model already solved keeps its warm start)."""
    import numpy as np

    nz = np.nonzero(A)
    starts = np.searchsorted(nz[0], np.arange(len(A))).astype(np.int32)
    h.addRows(len(A), lower, upper, len(nz[0]), starts, nz[1].astype(np.int32), A[nz])


def small_lp(cost: Any, A_ub: Any, b_ub: Any, A_eq: Any, b_eq: Any, lower: Any,
             upper: Any) -> tuple[float, list[float]] | None:
    """Return (the minimum of cost x, x) of the dense LP A_ub x <= b_ub, A_eq x = b_eq,
    lower <= x <= upper (inf for no bound), solved by HiGHS's simplex; None unless HiGHS proves it
    optimal. The same LP as `scipy.optimize.linprog(method="highs")` without its set-up, which costs
    about twice the solve on LPs of tens of rows (0.8 ms instead of 2.4 ms for 10 columns and 28
    rows)."""
    import highspy
    import numpy as np

    _silence_highs_banner()
    A = np.vstack([np.asarray(A_ub, dtype=float), np.asarray(A_eq, dtype=float)])
    inf = highspy.kHighsInf
    b_ub, b_eq = np.asarray(b_ub, dtype=float), np.asarray(b_eq, dtype=float)
    row_lo = np.concatenate([np.full(len(b_ub), -inf), b_eq])
    row_hi = np.concatenate([b_ub, b_eq])
    n = A.shape[1]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.addVars(n, np.maximum(np.asarray(lower, dtype=float), -inf), np.minimum(np.asarray(upper, dtype=float), inf))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(cost, dtype=float))
    add_dense_rows(h, A, row_lo, row_hi)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value), [float(x) for x in h.getSolution().col_value]


def solve_cvxpy(problem: Any, *, preferred: tuple[str, ...] = LP_SOLVERS, time_limit_s: float | None = None,
                **kwargs: Any) -> tuple[Status, str]:
    """Solve a cvxpy problem with the first installed solver of `preferred`; return (status, solver name).

    Raises InfeasibleError on a proven infeasible or unbounded problem and SolverError when no
    solver reaches an optimal or nearly optimal point.
    """
    import cvxpy as cp

    installed = set(cp.installed_solvers())
    if "HIGHS" in preferred:
        _silence_highs_banner()
    last_error: Exception | None = None
    for name in preferred:
        if name not in installed:
            continue
        opts = dict(kwargs)
        if time_limit_s is not None and name == "HIGHS":
            opts.setdefault("time_limit", float(time_limit_s))
        try:
            problem.solve(solver=name, **opts)
        except cp.error.SolverError as exc:
            last_error = exc
            continue
        if problem.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            raise InfeasibleError("the convex program is infeasible")
        if problem.status in (cp.UNBOUNDED, cp.UNBOUNDED_INACCURATE):
            raise SolverError("the convex program is unbounded")
        if problem.status == cp.OPTIMAL:
            return Status.OPTIMAL, name
        if problem.status == cp.OPTIMAL_INACCURATE:
            return Status.FEASIBLE, name
        last_error = SolverError(f"{name} ended with status {problem.status}")
    raise SolverError(f"no convex solver succeeded (tried {', '.join(preferred)}): {last_error}")
