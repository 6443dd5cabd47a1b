"""An envy-free, SI plan from a market: competitive equilibrium from (weighted) equal incomes.

Every job i is a buyer with budget w_i (its weight) who may hold at most g_i GPUs at once; GPU
type j has C_j GPUs at price p_j. At prices p a buyer demands the bundle z_i (GPUs per type) that
maximises V_i . z over its budget set {z >= 0 on its usable types, p . z <= w_i, sum_j z_j <= g_i}
(a knapsack with two constraints: some optimum uses one or two types, so all are enumerated).
In time fractions x_i = z_i / g_i. Two facts make any prices useful, not only clearing ones:

* **Envy-freeness, exactly OEF's.** Job i can afford s z_k with s = min(w_i / w_k, g_i / g_k)
  (cost s p . z_k <= s w_k <= w_i, GPUs s sum z_k <= g_i), so V_i . z_i >= s V_i . z_k, i.e.
  U_i(x_i) >= min(1, w_i g_k / (w_k g_i)) U_i(x_k) = theta_ik U_i(x_k) (models/oef.envy_factor).
  Types i cannot use are worth 0 to it, so they change nothing.
* **Sharing incentive** when p . C <= sum w: the equal split's bundle of job i costs
  alpha_i (w_i / W) p . C <= w_i and holds at most g_i GPUs, so it is in i's budget set.

So the demand at any prices with p . C <= W is envy-free and SI; only capacity can fail. The plan
is the demand mixed with the equal split E (envy-free, SI, within capacity; every envy, SI and
capacity row is linear in the allocation, so the mix keeps all three) by the smallest t that fits
capacity. Prices come from tatonnement (p_j *= exp(eta excess_j / C_j), scaled to p . C <= W),
and the best mix over the iterations is kept. Deterministic; O(iterations x n x m^2) flops.
The oracle of solvers/oef/ef.py still verifies the result (floating point), and the
caller mixes back with E if it finds any envy. Clearing prices would give a competitive equilibrium
(Pareto efficient, envy-free, SI); tatonnement with linear utilities oscillates, so the last
iterations' demands are also returned as candidates for a per-job mix LP (solvers/oef/hull.py).

**Mixing the demands.** Every envy row and every capacity and SI row is linear in the allocation,
so any convex combination of envy-free allocations is envy-free. The demands of every tatonnement
iteration, at every budget exponent, are envy-free (whatever the prices); E is envy-free and SI. So
the best convex combination sum_q lam_q X_q (+ lam_E E) within capacity and SI is an envy-free SI
plan: an LP with one column per demand (their efficiency, GPUs per type and utilities are recorded
as the tatonnement runs) and m capacity rows, plus the SI rows, which are generated on demand (a
row only for a job whose utility is below its SI level in some demand, only when the combination
breaks it). Tatonnement oscillates around clearing prices, so demands above and below capacity
combine to fill it with no share of E; and a demand that is not SI alone (budget exponent < 1)
can still enter. The chosen demands (at most m + 1 + the SI rows that bind) are recomputed from
their prices and budgets (deterministic).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuplan.solvers.backends import add_dense_rows


def demand(V: np.ndarray, usable: np.ndarray, price: np.ndarray, budget: np.ndarray, gpus: np.ndarray
           ) -> np.ndarray:
    """Return each buyer's demand in GPUs per type (n x m): max V_i . z s.t. price . z <= budget_i,
    sum z <= gpus_i, z >= 0 on usable types (first best bundle on ties)."""
    n, m = V.shape
    rows = np.arange(n)
    single = np.minimum(gpus[:, None], budget[:, None] / np.maximum(price, 1e-300)[None, :])
    value = np.where(usable, V * single, -1.0)
    arg = value.argmax(axis=1)
    best = value[rows, arg]
    Z = np.zeros((n, m))
    Z[rows, arg] = single[rows, arg]
    for j in range(m):
        for q in range(j + 1, m):
            d = price[j] - price[q]
            if abs(d) <= 1e-12 * max(price[j], price[q]):
                continue          # equal prices: a single type is as good
            zj = (budget - price[q] * gpus) / d
            zq = gpus - zj
            ok = usable[:, j] & usable[:, q] & (zj > 0) & (zq > 0)
            val = np.where(ok, V[:, j] * zj + V[:, q] * zq, -1.0)
            idx = np.nonzero(val > best * (1 + 1e-12))[0]
            if len(idx):
                Z[idx] = 0.0
                Z[idx, j] = zj[idx]
                Z[idx, q] = zq[idx]
                best[idx] = val[idx]
    return Z


def capacity_mix(X: np.ndarray, E: np.ndarray, size: np.ndarray, capacity: np.ndarray) -> float:
    """Return the smallest t in [0, 1] with (1 - t) X + t E within capacity (E must be); row r of
    an allocation holds size_r x its time fractions in GPUs."""
    DX = (size[:, None] * X).sum(axis=0)
    DE = (size[:, None] * E).sum(axis=0)
    over = DX > capacity
    if not over.any():
        return 0.0
    need = (DX[over] - capacity[over]) / np.maximum(DX[over] - DE[over], 1e-300)
    return float(min(1.0, max(0.0, need.max() * (1 + 1e-12) + 1e-15)))


@dataclass
class MarketPoints:
    """The demands met during tatonnement, for the convex-combination LP (combine_demands): per
    demand its budgets' index, prices, efficiency (slowest-GPU equivalents), GPUs per type used and
    per-row utilities."""

    budgets: list[np.ndarray] = field(default_factory=list)
    budget_of: list[int] = field(default_factory=list)
    price: list[np.ndarray] = field(default_factory=list)
    efficiency: list[float] = field(default_factory=list)
    use: list[np.ndarray] = field(default_factory=list)
    utility: list[np.ndarray] = field(default_factory=list)

    def add(self, price: np.ndarray, eff: float, use: np.ndarray, utility: np.ndarray) -> None:
        """Record the demand at `price` under the latest budgets, unless it repeats the last one."""
        if (self.use and self.budget_of[-1] == len(self.budgets) - 1 and self.efficiency[-1] == eff
                and np.array_equal(self.use[-1], use)):
            return
        self.budget_of.append(len(self.budgets) - 1)
        self.price.append(price.copy())
        self.efficiency.append(eff)
        self.use.append(use)
        self.utility.append(utility)


def market_allocation(V: np.ndarray, usable: np.ndarray, weight: np.ndarray, gpus: np.ndarray,
                      size: np.ndarray, capacity: np.ndarray, E: np.ndarray, *, iterations: int = 300,
                      keep: int = 4, time_limit_s: float | None = None, price: np.ndarray | None = None,
                      eta: float = 0.5, points: MarketPoints | None = None
                      ) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
    """Return (best plan, the last `keep` distinct demands, stats): the plan is a market demand
    (time fractions, rows x m) mixed with the equal split E to fit capacity, the most efficient
    (sum size_r V_r . x_r, slowest-GPU equivalents) over the tatonnement iterations.

    Rows are jobs or classes of identical jobs: weight and gpus are one job's, size is the GPUs
    the row's time fractions multiply (count x gpus), so W and capacity count every job. `price`:
    starting prices (scaled to p . C <= W; default W / sum C each), `eta` the first step; stats
    carry the last prices as "price" (a warm start for another run). `points`: where every raw
    demand is recorded (with these budgets) for combine_demands.
    """
    started = time.perf_counter()
    W = float((weight * size / gpus).sum())      # every job's budget: classes count each member
    if price is None:
        price = np.full(len(capacity), W / float(capacity.sum()))
    else:
        price = np.maximum(np.asarray(price, dtype=float), 1e-12)
        price = price * min(1.0, W / float(price @ capacity))
    best, best_eff, best_t = E, float((size * (V * E).sum(axis=1)).sum()), 1.0
    recent: list[np.ndarray] = []
    if points is not None:
        points.budgets.append(weight)
    it = 0
    for it in range(1, iterations + 1):
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            break
        X = demand(V, usable, price, weight, gpus) / gpus[:, None]
        if points is not None:
            U = (V * X).sum(axis=1)
            points.add(price, float((size * U).sum()), (size[:, None] * X).sum(axis=0), U)
        t = capacity_mix(X, E, size, capacity)
        Y = (1 - t) * X + t * E
        eff = float((size * (V * Y).sum(axis=1)).sum())
        if eff > best_eff:
            best, best_eff, best_t = Y, eff, t
        if not any(np.array_equal(X, r) for r in recent):
            recent = (recent + [X])[-keep:]
        excess = (size[:, None] * X).sum(axis=0) - capacity
        price = price * np.exp(eta * excess / capacity)
        if price @ capacity > W:               # keeps the equal split affordable: SI
            price *= W / float(price @ capacity)
        eta = max(0.02, eta * 0.99)
    return best, recent, {"market_iterations": it, "market_mix_with_equal_share": best_t,
                          "market_efficiency": best_eff, "price": price}


def budgets(weight: np.ndarray, gpus: np.ndarray, exponent: float) -> np.ndarray:
    """Return each job's budget w_i^a g_i^(1 - a) (a = exponent in [0, 1]; a = 1: the weights).

    Any such budgets keep the market's demand envy-free in OEF's sense: b_i / b_k =
    (w_i / w_k)^a (g_i / g_k)^(1 - a) >= min(w_i / w_k, g_i / g_k) = s, so job i can afford s z_k.
    Only a = 1 guarantees SI; smaller a moves money to jobs holding more GPUs, which the
    efficiency objective (sum of GPUs x U) weighs more.
    """
    return weight ** exponent * gpus ** (1.0 - exponent)


def combine_demands(points: MarketPoints, V: np.ndarray, usable: np.ndarray, gpus: np.ndarray, size: np.ndarray,
                    capacity: np.ndarray, E: np.ndarray, si_ref: np.ndarray, *, time_limit_s: float | None = None,
                    max_rounds: int = 200, per_round: int = 100) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Return (the most efficient convex combination of the recorded demands and E within capacity
    and SI, as time fractions rows x m, or None when the LP did not finish; stats).

    Columns: the demands in `points` and E; rows: capacity (GPUs per type), sum lam = 1, and SI rows
    sum_q (U_iq - r_i) lam_q >= 0 added on demand (only jobs below r_i in some demand can need one;
    each round adds the `per_round` the combination breaks most; HiGHS's dual simplex, warm). The result is verified in floating point:
    capacity by the smallest mix with E (capacity_mix), SI with no tolerance beyond 1e-9 relative
    (None if it fails). Envy-free because every column is (see the module docstring).
    """
    import highspy

    from gpuplan.solvers.backends import _silence_highs_banner

    _silence_highs_banner()
    started = time.perf_counter()
    Q = len(points.efficiency)
    stats: dict[str, Any] = {"market_demands": Q}
    if not Q:
        return None, stats
    UE = (V * E).sum(axis=1)
    eff = np.append(points.efficiency, float((size * UE).sum()))
    use = np.column_stack(points.use + [(size[:, None] * E).sum(axis=0)])          # m x (Q + 1)
    low = np.full(len(si_ref), np.inf)
    for u in points.utility:
        np.minimum(low, u, out=low)
    risk = np.nonzero(low < si_ref)[0]                     # the only jobs whose SI row can bind
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    cols = np.arange(Q + 1, dtype=np.int32)
    h.addVars(Q + 1, np.zeros(Q + 1), np.ones(Q + 1))
    h.changeColsCost(Q + 1, cols, -eff)

    add_dense_rows(h, np.vstack([use, np.ones((1, Q + 1))]),
                   np.append(np.full(len(capacity), -highspy.kHighsInf), 1.0), np.append(capacity, 1.0))
    rows = np.zeros(0, dtype=int)
    lam = np.zeros(Q + 1)
    for _ in range(max_rounds):
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - started)
        if left is not None and left <= 0:
            return None, stats
        if left is not None:
            h.setOptionValue("time_limit", float(h.getRunTime() + left))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None, stats
        lam = np.clip(np.asarray(h.getSolution().col_value), 0.0, None)
        lam /= lam.sum()
        on = np.nonzero(lam[:Q] > 0)[0]
        slack = lam[Q] * si_ref[risk] + sum(lam[q] * points.utility[q][risk] for q in on) - si_ref[risk]
        bad = np.nonzero(slack < 1e-12 * si_ref[risk])[0]
        bad = bad[~np.isin(risk[bad], rows)]
        if not len(bad):
            break
        new = risk[bad[np.argsort(slack[bad] / np.maximum(si_ref[risk[bad]], 1e-12))[:per_round]]]
        rows = np.concatenate([rows, new])                 # the most violated first, `per_round` at most
        A = np.column_stack([u[new] for u in points.utility] + [si_ref[new]]) - si_ref[new, None]
        add_dense_rows(h, A, np.zeros(len(new)), np.full(len(new), highspy.kHighsInf))
    else:
        return None, stats
    stats["market_si_rows"] = int(len(rows))
    on = np.nonzero(lam[:Q] > 0)[0]
    X = lam[Q] * E
    for q in on:
        b = points.budgets[points.budget_of[q]]
        X = X + lam[q] * demand(V, usable, points.price[q], b, gpus) / gpus[:, None]
    t = capacity_mix(X, E, size, capacity)
    X = (1 - t) * X + t * E
    stats.update({"market_combined": int(len(on)), "market_combined_share_of_equal_split": float(lam[Q] + t),
                  "market_combine_seconds": time.perf_counter() - started})
    if not ((V * X).sum(axis=1) >= si_ref * (1 - 1e-9)).all():
        return None, stats
    return X, stats


def best_market(V: np.ndarray, usable: np.ndarray, weight: np.ndarray, gpus: np.ndarray, size: np.ndarray,
                capacity: np.ndarray, E: np.ndarray, si_ref: np.ndarray, *,
                exponents: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25, 0.0), time_limit_s: float | None = None,
                combine: bool = True, combine_share: float = 0.15
                ) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
    """Return (plan, recent demands, stats): the market plan, rows x m time fractions, envy-free and
    SI; efficiency in slowest-GPU equivalents.

    Without `combine`: market_allocation's plan for the most efficient budget exponent (see budgets)
    whose plan is SI (U_i >= si_ref_i, no tolerance), trying `exponents` in order and stopping at the
    first that is not SI; a = 1 (SI by the argument above) first. With it (default): every exponent
    runs (within 1 - combine_share of the limit; each warm-started from the previous prices) and
    the plan is the better of that and combine_demands' convex combination of every demand met
    (stats: market_plan says which; market_budget_exponent stays the best single exponent's).
    """
    started = time.perf_counter()
    best: tuple[np.ndarray, list[np.ndarray], dict[str, Any]] | None = None
    price: np.ndarray | None = None
    points = MarketPoints() if combine else None
    run_s = None if time_limit_s is None else time_limit_s * ((1 - combine_share) if combine else 1.0)
    for q, a in enumerate(exponents):
        left = None if run_s is None else run_s - (time.perf_counter() - started)
        if best is not None and left is not None and left <= 0:
            break
        share = None if left is None else left / (len(exponents) - q)
        plan, recent, stats = market_allocation(V, usable, budgets(weight, gpus, a), gpus, size, capacity, E,
                                                time_limit_s=share, price=price,
                                                eta=0.5 if price is None else 0.2,
                                                iterations=300 if price is None else 150, points=points)
        price = stats.pop("price")                      # the next exponent starts from these prices
        if best is not None and not ((V * plan).sum(axis=1) >= si_ref).all():
            if combine:
                continue                                # its demands still enter the combination
            break
        stats["market_budget_exponent"] = a
        if best is None or stats["market_efficiency"] > best[2]["market_efficiency"]:
            best = (plan, recent, stats)
    assert best is not None
    if points is None:
        return best
    left = None if time_limit_s is None else max(time_limit_s - (time.perf_counter() - started), 0.0)
    X, stats = combine_demands(points, V, usable, gpus, size, capacity, E, si_ref, time_limit_s=left)
    plan, recent, best_stats = best
    best_stats.update(stats)
    if X is not None:
        eff = float((size * (V * X).sum(axis=1)).sum())
        if eff > best_stats["market_efficiency"]:
            best_stats.update({"market_efficiency": eff, "market_plan": "combination of demands"})
            plan = X
    return plan, recent, best_stats


def capacity_price_bound(V: np.ndarray, usable: np.ndarray, size: np.ndarray, capacity: np.ndarray, *,
                         iterations: int = 200) -> float:
    """Return an upper bound on max sum_r size_r V_r . x_r s.t. time (sum_j x_rj <= 1), usable types
    and capacity, hence on every OEF LP (slowest-GPU equivalents), by Lagrangian duality.

    For any prices pi >= 0 on capacity, L(pi) = pi . C + sum_r max(0, max_j size_r (V_rj - pi_j)) is
    at least that maximum (weak duality: the time rows stay as constraints, each row picks its best
    type or nothing). Prices are improved by multiplicative subgradient steps (excess demand over
    capacity) and the smallest L found is returned; O(iterations x rows x types).
    """
    Vu = np.where(usable, V, -np.inf)
    pi = np.array([float(np.mean(V[usable[:, j], j])) if usable[:, j].any() else 0.0 for j in range(V.shape[1])])
    best = np.inf
    eta = 0.5
    rows = np.arange(len(V))
    for _ in range(iterations):
        gain = size[:, None] * (Vu - pi[None, :])
        j = gain.argmax(axis=1)
        top = gain[rows, j]
        take = top > 0
        best = min(best, float(pi @ capacity + top[take].sum()))
        used = np.bincount(j[take], weights=size[take], minlength=len(capacity))
        pi = np.maximum(pi * np.exp(eta * (used - capacity) / capacity), 1e-12)
        eta = max(0.01, eta * 0.98)
    return best
