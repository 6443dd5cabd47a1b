"""The envy-free OEF LP at cluster scale: row generation with an exact separation oracle.

The LP is: maximise sum_i g_i V_i . x_i subject to feasibility (time <= 1, capacity), sharing
incentive (V_i . x_i >= s_i) and n(n-1) envy rows theta_ik V_i . x_k - V_i . x_i <= 0, with
theta_ik = min(1, rho_i / rho_k), rho = weight / gpus (see models/oef.envy_factor).

Exactness. HiGHS solves the LP with a subset of the envy rows (a relaxation: its optimum bounds the
full LP from above). The oracle (`violated_envy`) then evaluates *every* ordered pair (i, k): it
forms theta_ik V_i . x_k - U_i for all pairs in row blocks (one matrix product per block, so
O(n^2 m) flops and O(block x n) memory, never n^2 rows), dropping exact duplicates of (bundle, rho)
first (identical bundles of equal rho give identical values). When no pair is violated beyond the
tolerance, the relaxation's optimum is feasible for the full LP, hence optimal for it. Rows are
added per round: for each envious job its `top` most violated rows, and for each envied bundle the
row of the job that envies it most (relative to its own utility); and, in the first round, for
each bundle and each GPU type the row of the job that would envy a bundle on that type most (they
stop the LP from handing the same kind of bundle to another job in every round). Rows that are
slack and carry no dual are dropped every few rounds, so the LP keeps roughly the binding rows
(dropping non-binding rows leaves the current vertex optimal, so the bound stays valid).

A time limit returns the best envy-free SI plan in hand: the equal-incomes market allocation
(solvers/oef/market.py: envy-free and SI at any prices; by default the best convex combination of
every demand its tatonnement met, within capacity and SI), the per-job mix LP over it, the last relaxed
optimum and the equal split E (solvers/oef/hull.py), or the smallest global mix (1 - t) X + t E
(envy_free_mix: each row is linear, so the largest t any pair needs is exact); the certified upper
bound is the smallest of the last relaxation's value, a Lagrangian capacity-price bound and the
Lagrangian dual of the group relaxation (solvers/oef/dual.py: n x groups rows, no LP). A time limit
is one deadline (Budget): a step that ends in an all-pairs oracle pass starts only with room for it.
A limit too short for row generation to get anywhere (SHORT_LIMIT_S) runs no LP round: the market
and the dual bound (which then groups jobs by their market bundles too) share all of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gpuplan.models.plan import Status

TOL = 1e-9                       # violation threshold, relative to max(U_i, 1)


def _candidates(X: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Return one job index per distinct non-zero (bundle, rho): the bundles an oracle must test."""
    key = np.round(np.column_stack([X, rho]), 12)
    _, first = np.unique(key, axis=0, return_index=True)
    first = np.sort(first)
    return first[np.abs(X[first]).sum(axis=1) > 0]


def _theta_scale(gap: np.ndarray, rho_rows: np.ndarray, levels: np.ndarray, bounds: np.ndarray) -> None:
    """Multiply gap (rows x columns sorted by rho) in place by theta = min(1, rho_i / rho_k): one
    per-row factor per rho level of the columns (levels[q] holds columns bounds[q]:bounds[q+1])."""
    for q, level in enumerate(levels):
        lo, hi = bounds[q], bounds[q + 1]
        f = np.minimum(1.0, rho_rows / level)
        if (f < 1.0).any():
            gap[:, lo:hi] *= f[:, None]


def _by_rho(cols: np.ndarray, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (columns sorted by rho, stably; the distinct rho levels; each level's slice bounds)."""
    order = np.argsort(rho[cols], kind="stable")
    cols = cols[order]
    levels, start = np.unique(rho[cols], return_index=True)
    return cols, levels, np.append(start, len(cols))


def violated_envy(V: np.ndarray, X: np.ndarray, rho: np.ndarray, *, top: int = 3, block: int = 1024
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Return (i, k, gap, largest relative envy) of the envy rows to add, from all n(n-1) pairs.

    gap = theta_ik V_i . x_k - U_i (normalised throughput; > TOL max(U_i, 1) is a violation). The
    pairs returned are, for every envious job i, its `top` largest gaps, and for every envied
    bundle k the job with the largest gap / U_i among those it violates; duplicates removed. The
    largest relative envy (gap / max(U_i, 1e-9), 0 when none) covers every pair. One BLAS product
    per block of rows and a few passes over it: O(n x bundles x m) flops, O(block x bundles) memory.
    """
    n = len(V)
    U = (V * X).sum(axis=1)
    cand = _candidates(X, rho)
    if not len(cand):
        return np.zeros(0, int), np.zeros(0, int), np.zeros(0), 0.0
    cand, levels, bounds = _by_rho(cand, rho)
    pos = np.full(n, -1)
    pos[cand] = np.arange(len(cand))                      # where each job's own bundle sits
    XcT = np.ascontiguousarray(X[cand].T)
    I, K, G = [], [], []
    col_best = np.full(len(cand), -np.inf)
    col_arg = np.zeros(len(cand), dtype=int)
    worst = 0.0
    t = min(top, len(cand))
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        gap = V[lo:hi] @ XcT
        _theta_scale(gap, rho[lo:hi], levels, bounds)
        gap -= U[lo:hi, None]
        own = np.nonzero(pos[lo:hi] >= 0)[0]
        gap[own, pos[lo + own]] = -np.inf                 # a job never envies itself
        tol = TOL * np.maximum(U[lo:hi], 1.0)
        inv = 1.0 / np.maximum(U[lo:hi], 1e-9)
        rows = np.nonzero(gap.max(axis=1) > tol)[0]       # envious rows of this block
        if not len(rows):
            continue
        sub = gap[rows]
        kk = np.argpartition(-sub, t - 1, axis=1)[:, :t]
        vv = np.take_along_axis(sub, kk, axis=1)
        r, s = np.nonzero(vv > tol[rows, None])
        I.append(lo + rows[r])
        K.append(cand[kk[r, s]])
        G.append(vv[r, s])
        rel = sub * inv[rows, None]
        rel[sub <= tol[rows, None]] = -np.inf
        arg = np.argmax(rel, axis=0)
        val = rel[arg, np.arange(len(cand))]
        better = val > col_best
        col_best[better] = val[better]
        col_arg[better] = lo + rows[arg[better]]
        worst = max(worst, float(val.max()))
    hit = np.isfinite(col_best)
    I.append(col_arg[hit])
    K.append(cand[hit])
    G.append(col_best[hit] * np.maximum(U[col_arg[hit]], 1e-9))
    i, k, g = np.concatenate(I), np.concatenate(K), np.concatenate(G)
    _, keep = np.unique(i * n + k, return_index=True)
    return i[keep], k[keep], g[keep], worst


def envy_free_mix(V: np.ndarray, X: np.ndarray, E: np.ndarray, rho: np.ndarray, *, block: int = 1024,
                  tol: float = TOL) -> float:
    """Return the smallest t in [0, 1] such that (1 - t) X + t E has no envy (E must be envy-free):
    no pair's gap above tol x max(U_i, 1) (check allows 1e-6 relative).

    Every envy row is linear in the allocation, so pair (i, k) with value a at X and b <= 0 at E
    needs t >= a / (a - b) when a > 0 (t = 1 when b = 0); the answer is the largest need.
    """
    n = len(V)
    UX, UE = (V * X).sum(axis=1), (V * E).sum(axis=1)
    key = np.round(np.column_stack([X, E, rho]), 12)        # identical columns give identical rows:
    _, cols = np.unique(key, axis=0, return_index=True)     # each distinct (x_k, e_k, rho_k) once
    cols, levels, bounds = _by_rho(cols, rho)
    pos = np.full(n, -1)
    pos[cols] = np.arange(len(cols))
    XcT = np.ascontiguousarray(X[cols].T)
    need = 0.0
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        a = V[lo:hi] @ XcT
        _theta_scale(a, rho[lo:hi], levels, bounds)
        a -= UX[lo:hi, None]
        own = np.nonzero(pos[lo:hi] >= 0)[0]
        a[own, pos[lo + own]] = 0.0                          # a job never envies itself
        tol_r = tol * np.maximum(UX[lo:hi], 1.0)
        rows = np.nonzero(a.max(axis=1) > tol_r)[0]
        if len(rows):                                        # E's rows only where X's are violated
            r, q = np.nonzero(a[rows] > tol_r[rows, None])
            r = rows[r]
            theta = np.minimum(1.0, rho[lo + r] / rho[cols[q]])
            b = theta * (V[lo + r] * E[cols[q]]).sum(axis=1) - UE[lo + r]
            if (b >= -TOL).any():
                return 1.0
            need = max(need, float((a[r, q] / (a[r, q] - b)).max()))
    return 0.0 if need == 0.0 else min(1.0, need * (1 + 1e-9) + 1e-12)


@dataclass
class EfResult:
    """Class rows (time fractions), status, the certified upper bound on efficiency, stats."""

    Y: np.ndarray
    status: Status
    upper_bound: float
    message: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


class Budget:
    """The deadline of a time-limited solve and the measured cost of the all-pairs oracle.

    The oracle (violated_envy, envy_free_mix) costs about `per_entry_s` x rows x bundles x types
    seconds (several passes over a rows x bundles block): a step that ends with an oracle call is
    only started when the deadline leaves room for that call as well.
    """

    def __init__(self, limit_s: float | None, per_entry_s: float = 5e-9) -> None:
        self.end = None if limit_s is None else time.perf_counter() + limit_s
        self.per_entry_s = per_entry_s

    def left(self) -> float | None:
        """Return the seconds left before the deadline (None without a limit; may be negative)."""
        return None if self.end is None else self.end - time.perf_counter()

    def oracle_s(self, rows: int, bundles: int, types: int) -> float:
        """Return the estimated seconds of one oracle pass over rows x bundles x types."""
        return self.per_entry_s * rows * max(bundles, 1) * types

    def measured(self, seconds: float, rows: int, bundles: int, types: int) -> None:
        """Record the seconds an oracle pass over rows x bundles x types took (the estimate follows
        the latest measurement, never below a tenth of the default)."""
        self.per_entry_s = max(seconds / max(rows * max(bundles, 1) * types, 1), 5e-10)


MARKET_FIRST_SIZE = 10_000      # rows x types from which a time-limited solve runs the market first
# A time limit under SHORT_LIMIT_S x (rows x types)^1.5 leaves the LP rounds no use, so the market
# and the dual bound get all of it. Measured: row generation reached the optimum of 1,000 distinct
# jobs x 3 types in 8.7-19 s (29-32 rounds) and of 1,000 x 8 in 18-48 s (28-35 rounds) at load 2-10;
# both the rounds and each LP grow with the jobs, about as (rows x types)^1.5 (5.3e-5 to 1.2e-4 and
# 2.5e-5 to 6.7e-5 s times it); the bound after the first few rounds (7,114 to 6,744 at 1,000 x 8)
# is far above the dual bound's (about 6,000). A fifth of the fastest of those: 1e-5.
SHORT_LIMIT_S = 1e-5


def _market_plan(V: np.ndarray, usable: np.ndarray, weight: np.ndarray, gpus: np.ndarray, size: np.ndarray,
                 capacity: np.ndarray, E: np.ndarray, si_ref: np.ndarray, rho: np.ndarray,
                 budget_s: float | None) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
    """Return (the market plan, its last demands, stats) from solvers/oef/market.best_market within
    `budget_s`, mixed back with E if the all-pairs oracle finds envy (floating point; the market's
    demand is envy-free in exact arithmetic)."""
    from gpuplan.solvers.oef.market import best_market

    M, recent, stats = best_market(V, usable, weight, gpus, size, capacity, E, si_ref, time_limit_s=budget_s)
    t_fix = envy_free_mix(V, M, E, rho)
    return (1 - t_fix) * M + t_fix * E, recent, stats


def _dual(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray,
          si_ref: np.ndarray, groups: int, budget_s: float | None, plan: np.ndarray | None = None
          ) -> tuple[float, dict[str, Any]]:
    """Return solvers/oef/dual.group_dual_bound's (upper bound, stats) within `budget_s`; `plan` (an
    envy-free plan, rows x types, or None): its rows join the grouping's coordinates."""
    from gpuplan.solvers.oef.dual import group_dual_bound

    return group_dual_bound(V, usable, size, capacity, rho, si_ref, groups=groups, time_limit_s=budget_s,
                            features=plan)


def _efficiency(size: np.ndarray, V: np.ndarray, Y: np.ndarray) -> float:
    """Return sum_r size_r V_r . y_r (slowest-GPU equivalents for job rows with size = GPUs)."""
    return float((size * (V * Y).sum(axis=1)).sum())


def lp_matrices(V: np.ndarray, size: np.ndarray) -> tuple[Any, Any, Any]:
    """Return the sparse LP rows over y = vec(Y) (row-major, rows x types): per-row time `rows`,
    per-type GPUs `cap` (row r weighs size[r]) and per-row normalised throughput `own`."""
    from scipy.sparse import csr_matrix, diags, eye, kron

    k, m = V.shape
    rows = kron(eye(k), csr_matrix(np.ones((1, m)))).tocsr()
    cap = kron(csr_matrix(size[None, :]), eye(m)).tocsr()
    return rows, cap, (rows @ diags(V.ravel())).tocsr()


def add_rows(h: Any, A: Any, upper: np.ndarray) -> None:
    """Add the rows A y <= upper to the HiGHS model h."""
    import highspy

    A = A.tocsr()
    h.addRows(A.shape[0], np.full(A.shape[0], -highspy.kHighsInf), upper, A.nnz, A.indptr[:-1].astype(np.int32),
              A.indices.astype(np.int32), A.data)


def envy_block(V: np.ndarray, rho: np.ndarray, I: np.ndarray, K: np.ndarray) -> Any:
    """Return the sparse rows theta_ik V_i . y_k - V_i . y_i over vec(Y) for the pairs (I, K)."""
    from scipy.sparse import csr_matrix

    k, m = V.shape
    theta = np.minimum(1.0, rho[I] / rho[K])
    j = np.arange(m)
    r = np.repeat(np.arange(len(I)), m)
    data = np.concatenate([(theta[:, None] * V[I]).ravel(), -V[I].ravel()])
    cols = np.concatenate([(K[:, None] * m + j).ravel(), (I[:, None] * m + j).ravel()])
    A = csr_matrix((data, (np.concatenate([r, r]), cols)), shape=(len(I), k * m))
    A.sum_duplicates()
    return A


def _first_round_rows(V: np.ndarray, usable: np.ndarray, rho: np.ndarray, U: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Return pairs (i, k): for each bundle k and type j, the job i with the largest
    theta_ik V_ij / U_i (the one a bundle of k on type j alone would make envious first)."""
    Is, Ks = [], []
    for level in np.unique(rho):
        ks = np.nonzero(rho == level)[0]
        score = (np.minimum(1.0, rho / level)[:, None] * V * usable) / np.maximum(U, 1e-9)[:, None]
        for i in np.unique(np.argmax(score, axis=0)):
            Is.append(np.full(len(ks), i))
            Ks.append(ks)
    I, K = np.concatenate(Is), np.concatenate(Ks)
    return I[I != K], K[I != K]


def solve_ef_lp(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, rho: np.ndarray,
                si_ref: np.ndarray, E: np.ndarray | None, *, envy: bool = True, time_limit_s: float | None = None,
                top: int = 3, drop_every: int = 3, max_rounds: int = 1000, groups: int = 0, hull: bool = True,
                market: bool = True, hull_share: float = 0.35, weight: np.ndarray | None = None,
                dual: bool = True, dual_groups: int = 100,
                gpus: np.ndarray | None = None, progress: Callable[[float | None, str], None] | None = None) -> EfResult:
    """Return max sum_c size_c V_c . y_c s.t. time, capacity, SI (U >= si_ref) and, if `envy`, EF.

    V, usable: rows x types; size: weight of each row in the objective and the capacity rows (GPUs x
    jobs of the class); rho: weight / gpus per row; E: an envy-free, SI-feasible allocation used
    when the time limit stops the rounds (None: none). groups > 0 (with a time limit and envy):
    first solve the EF LP restricted to one bundle per group of similar jobs (solvers/oef/groups.py)
    within half the limit, and return it instead of the mix with E when it is better. hull (with
    envy, when the rounds stop before the optimum): the plan is the best per-job mix of the last
    relaxed optimum, the best envy-free plan in hand and E (solvers/oef/hull.py). market (with envy,
    at a time limit; needs each row's `weight` and `gpus`, rows being jobs or classes of one job):
    the equal-incomes market allocation (solvers/oef/market.py) joins the candidates and replaces E
    as the plan to fall back on when it is better. dual (with envy and a time limit): the Lagrangian
    dual of the group relaxation (solvers/oef/dual.py, `dual_groups` groups) adds an upper bound
    that needs no envy rows. With a time limit, the rounds of envy rows get its first
    1 - `hull_share`; if they stop before the optimum, the market gets 40% of what is left, the dual
    bound 85% of the rest, and the per-job mix LP what remains when it leaves room for its oracle
    passes. From MARKET_FIRST_SIZE rows x types up, the market and the dual bound run first instead
    (35% and 30% of the limit; 50% and 75% of the rest when one all-pairs oracle pass takes over a tenth
    of it, so that no two LP rounds fit), then the rounds up to 90% of the limit. Every step ending
    in an all-pairs oracle pass starts only when the deadline leaves room for that pass (Budget).
    Raises InfeasibleError if the LP is infeasible, SolverError if HiGHS fails without a time limit.
    """
    import highspy
    from scipy.sparse import vstack

    from gpuplan.errors import InfeasibleError, SolverError
    from gpuplan.solvers.backends import _silence_highs_banner

    _silence_highs_banner()
    started = time.perf_counter()
    budget = Budget(time_limit_s)
    k, m = V.shape
    n = k * m
    full_oracle = lambda: budget.oracle_s(k, k, m)         # noqa: E731 - a bundle per row (an LP vertex)
    price_bound = np.inf
    if time_limit_s is not None:           # valid without any LP (weaker): computed first, its cost is fixed
        from gpuplan.solvers.oef.market import capacity_price_bound

        price_bound = capacity_price_bound(V, usable, size, capacity, iterations=50)
    grouped: np.ndarray | None = None
    group_stats: dict[str, Any] = {}
    if groups and envy and k > groups and time_limit_s is not None:
        from gpuplan.solvers.oef.groups import group_jobs, grouped_ef_lp

        labels = group_jobs(V, usable, rho, groups)
        grouped, group_stats = grouped_ef_lp(V, usable, size, capacity, rho, si_ref, labels,
                                             time_limit_s=time_limit_s / 2)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    built = False

    def build() -> None:
        """Put the variables, time, capacity and SI rows into the HiGHS model (once, when the first
        round starts: a limit that leaves no room for a round skips it)."""
        rows, cap, own = lp_matrices(V, size)
        h.addVars(n, np.zeros(n), usable.ravel().astype(float))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), -(np.repeat(size, m) * V.ravel()))
        add_rows(h, vstack([rows, cap, -own]), np.concatenate([np.ones(k), capacity, -si_ref]))

    base = 2 * k + m
    pairs = np.zeros((0, 2), dtype=np.int64)          # (i, k) of the envy rows now in the LP, in row order
    added = dropped = 0
    rounds_done = 0
    X_last: np.ndarray | None = None
    bound = np.inf
    worst = 0.0
    last_drop_obj = np.inf

    use_dual = envy and dual and time_limit_s is not None and k > 2
    reserve = envy and (hull or market or use_dual)   # the last part of the limit: market, dual bound, hull
    rounds_limit_s = time_limit_s if time_limit_s is None or not reserve else time_limit_s * (1 - hull_share)
    use_market = envy and market and weight is not None and gpus is not None
    early: tuple[np.ndarray, list[np.ndarray], dict[str, Any]] | None = None
    dual_bound, dual_stats = np.inf, {}
    short = time_limit_s is not None and time_limit_s < SHORT_LIMIT_S * (k * m) ** 1.5
    if time_limit_s is not None and (k * m >= MARKET_FIRST_SIZE or short) and (use_market or use_dual):
        # large: the first LP alone may not fit in a short limit, so the market's plan and the dual
        # bound come first; the LP rounds get what is left (up to 90% of the limit)
        # one oracle pass above a tenth of the limit: two LP rounds (the least that improves on the
        # SI-only bound) will not fit, so the market and the dual bound get all of the time; a short
        # limit (see SHORT_LIMIT_S): no LP round at all
        hopeless = short or full_oracle() > 0.1 * time_limit_s
        if use_market:
            early = _market_plan(V, usable, weight, gpus, size, capacity, E, si_ref, rho,
                                 (0.5 if hopeless else 0.35) * time_limit_s)
        if use_dual:
            left = budget.left() or 0.0
            dual_s = ((0.9 if short else 0.75) * left if hopeless
                      else min(0.3 * time_limit_s, left - 0.1 * time_limit_s))
            dual_bound, dual_stats = _dual(V, usable, size, capacity, rho, si_ref, dual_groups, max(dual_s, 0.0),
                                           early[0] if early is not None else None)
        rounds_limit_s = 0.0 if short else 0.9 * time_limit_s

    def remaining() -> float | None:
        """Seconds the next LP round may take: the rounds' share, less one oracle pass after it."""
        if rounds_limit_s is None:
            return None
        return rounds_limit_s - (time.perf_counter() - started) - full_oracle()

    def add_pairs(I: np.ndarray, K: np.ndarray) -> int:
        nonlocal pairs
        key = I.astype(np.int64) * k + K
        have = pairs[:, 0] * k + pairs[:, 1]
        new = ~np.isin(key, have)
        I, K = I[new], K[new]
        if len(I):
            add_rows(h, envy_block(V, rho, I, K), np.zeros(len(I)))
            pairs = np.vstack([pairs, np.column_stack([I, K])])
        return len(I)

    timed_out = False
    for rnd in range(1, max_rounds + 1):
        left = remaining()
        if not built and (left is None or left > 0):
            build()
            built = True
            left = remaining()
        if left is not None:
            if left <= 0:
                timed_out = True
                break
            h.setOptionValue("time_limit", float(h.getRunTime() + left))     # HiGHS counts all its runs
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            raise InfeasibleError("the OEF LP (time, capacity, sharing incentive"
                                  f"{', envy-freeness' if envy else ''}) is infeasible")
        if status == highspy.HighsModelStatus.kTimeLimit:
            timed_out = True
            break
        if status != highspy.HighsModelStatus.kOptimal:
            raise SolverError(f"HiGHS ended with {h.modelStatusToString(status)} in round {rnd} of envy rows")
        sol = h.getSolution()
        X_last = np.asarray(sol.col_value).reshape(k, m)
        bound = -h.getInfo().objective_function_value
        rounds_done = rnd
        if not envy or k < 2:
            worst = 0.0
            break
        t_or = time.perf_counter()
        I, K, _, worst = violated_envy(V, X_last, rho, top=top)
        budget.measured(time.perf_counter() - t_or, k, k, m)
        if progress:
            progress(None, f"envy rows: round {rnd}, {len(pairs)} rows in the LP, {len(I)} violated, "
                           f"bound {bound:.6g}")
        if not len(I):
            break
        if drop_every and rnd % drop_every == 0 and len(pairs) and bound < last_drop_obj * (1 - 1e-12):
            dual = np.asarray(sol.row_dual)[base:]
            act = np.asarray(sol.row_value)[base:]
            slack = np.nonzero((np.abs(dual) < 1e-12) & (act < -1e-7))[0]
            if len(slack):
                h.deleteRows(len(slack), (base + slack).astype(np.int32))
                pairs = np.delete(pairs, slack, axis=0)
                dropped += len(slack)
            last_drop_obj = bound
        if rnd == 1:
            U = (V * X_last).sum(axis=1)
            I0, K0 = _first_round_rows(V, usable, rho, U)
            added += add_pairs(I0, K0)
        added += add_pairs(I, K)
    else:
        timed_out = True
    stats = {"ef_rows_added": int(added), "ef_rows_dropped": int(dropped), "ef_rows_final": int(len(pairs)),
             "lp_rounds": rounds_done, "upper_bound": float(bound) if np.isfinite(bound) else None}
    if not timed_out:
        return EfResult(X_last if X_last is not None else np.zeros((k, m)), Status.OPTIMAL, bound, "", stats)
    if E is None:
        raise SolverError(f"time limit of {time_limit_s} s reached before the first LP finished")
    stats.update(group_stats)
    anchor, anchor_from = E, "the equal split"
    if grouped is not None and _efficiency(size, V, grouped) > _efficiency(size, V, anchor):
        anchor, anchor_from = grouped, f"the EF LP restricted to one bundle per group ({group_stats.get('groups')} groups)"
    recent: list[np.ndarray] = []
    # the per-job mix LP runs an oracle pass per round and one at the end: only with room for three
    if use_market and early is None:
        left = budget.left()
        early = _market_plan(V, usable, weight, gpus, size, capacity, E, si_ref, rho,
                             None if left is None else max((0.4 if use_dual else 0.9) * left, 0.0))
    if use_dual and not dual_stats:
        left = budget.left()
        dual_bound, dual_stats = _dual(V, usable, size, capacity, rho, si_ref, dual_groups,
                                       None if left is None else max(0.85 * left, 0.0),
                                       early[0] if early is not None else None)
    stats.update(dual_stats)
    if use_market:
        M, recent, market_stats = early
        stats.update(market_stats)
        if _efficiency(size, V, M) > _efficiency(size, V, anchor):
            anchor, anchor_from = M, ("the market allocation (equal incomes; the best convex combination of its "
                                      "demands and the equal split within capacity and SI)"
                                      if market_stats.get("market_plan") else
                                      "the market allocation (equal incomes; mixed with the equal split to fit "
                                      "capacity)")
    t: float | None = None
    if X_last is None and not recent:
        Y, how = anchor, anchor_from
    elif not envy:
        Y, how = (X_last, "the last relaxed optimum") if X_last is not None else (anchor, anchor_from)
    elif hull and not (budget.left() is None or budget.left() > 3 * full_oracle() + 0.05):
        Y, how = anchor, anchor_from
        stats["hull_skipped"] = "no time left for the per-job mix LP and its oracle passes"
    elif hull:
        from gpuplan.solvers.oef.hull import hull_ef_lp

        cands = [anchor] + ([X_last] if X_last is not None else []) + recent + ([E] if anchor is not E else [])
        left = budget.left()
        Y, hull_stats = hull_ef_lp(V, size, capacity, rho, si_ref, cands, top=top, oracle_s=full_oracle(),
                                   time_limit_s=None if left is None else max(left - 1.2 * full_oracle(), 0.0))
        stats.update(hull_stats)
        how = (f"the best per-job mix of {anchor_from}, the last relaxed optimum"
               f"{', the last market demands' if recent else ''}{'' if anchor is E else ' and the equal split'}"
               f"{'' if hull_stats['hull_finished'] else ' (its rounds stopped: mixed back with the first)'}")
        if hull_stats.get("hull_mix_back") == 1.0 or "hull_mix_back" not in hull_stats:
            how = anchor_from                      # the mix LP did not get past its first candidate
    elif X_last is not None:
        t = envy_free_mix(V, X_last, anchor, rho)
        Y = (1 - t) * X_last + t * anchor
        how = f"a mix of the last relaxed optimum with {anchor_from} (t = {t:.3g})"
    else:
        Y, how = anchor, anchor_from
    eff = _efficiency(size, V, Y)
    if eff < _efficiency(size, V, anchor):          # a stopped hull mixes back; never below what is in hand
        Y, how, eff = anchor, anchor_from, _efficiency(size, V, anchor)
    stats["plan_from"] = how
    if not np.isfinite(price_bound):      # rounds stopped by max_rounds without a time limit
        from gpuplan.solvers.oef.market import capacity_price_bound

        price_bound = capacity_price_bound(V, usable, size, capacity)
    sources = {"the last relaxation": bound, "capacity prices (Lagrangian, no envy rows)": price_bound,
               f"the Lagrangian dual of the group relaxation ({dual_stats.get('dual_groups')} groups)": dual_bound}
    source = min(sources, key=lambda s: sources[s])
    bound = sources[source]
    stats["upper_bound"] = float(bound)
    gap = (bound - eff) / max(bound, 1e-12) if np.isfinite(bound) else None
    stats.update({"mix_with_equal_share": t, "largest_relative_envy_of_relaxation": worst,
                  "certified_gap": gap, "efficiency": eff, "bound_from": source})
    where = (f"at most {gap:.2%} below the optimum ({source} bounds it at {bound:.6g})"
             if gap is not None else "with no bound on the optimum")
    share = "" if time_limit_s is None else f" ({time_limit_s:.3g} s for the allocation)"
    message = (f"time limit reached{share} after {rounds_done} LP round(s) of envy rows: this "
               f"envy-free plan is {how}; it is {where}")
    return EfResult(Y, Status.TIME_LIMIT, bound, message, stats)
