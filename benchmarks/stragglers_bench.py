"""Straggler scheduling: weighted flowtime of every policy against Mantri across loads and task-time
variability, the gap to the LP lower bound on small instances, and the paper targets.

    python benchmarks/stragglers_bench.py              # default: ~1-2 minutes on a busy 2-core machine
    python benchmarks/stragglers_bench.py --big        # also time 100,000 jobs under nine policies

Main table: a generated workload (heavy-tailed task counts, Poisson arrivals, weights 1-3) on --slots
slots; per variability model and offered load, each policy's weighted flowtime divided by Mantri's
(lower is better; one seed unless --seeds). Targets (research note section 4.5 and issue 14):
SRPTMS+C at least 20% below Mantri at heavy load (0.9), SCA or SDA at least 40% below Mantri at light load
(0.3), and the workload threshold choosing the better of its two regimes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuplan.models.stragglers import StragglersProblem, simulate_problem
from gpuplan.solvers.stragglers_lp import lower_bound

VARIABILITY = [("pareto a=1.2", {"model": "pareto", "alpha": 1.2}), ("pareto a=1.5", {"model": "pareto", "alpha": 1.5}),
               ("pareto a=2", {"model": "pareto", "alpha": 2.0}), ("uniform a=0.5", {"model": "uniform", "a": 0.5})]
LOADS = [0.3, 0.5, 0.7, 0.9]
ALL = ["srptms-c", "srpt-r", "fair-r", "laps-r", "sca", "sda", "ese", "threshold", "late", "dolly", "hesrpt",
       "srpt", "fair", "fifo"]
SWEEP = ["srptms-c", "srpt-r", "sca", "sda", "ese", "threshold", "late", "dolly"]
SHORT = {"srptms-c": "SRPTMS+C", "srpt-r": "SRPT+R", "fair-r": "Fair+R", "laps-r": "LAPS+R", "sca": "SCA",
         "sda": "SDA", "ese": "ESE", "threshold": "thresh", "late": "LATE", "dolly": "Dolly", "hesrpt": "heSRPT",
         "srpt": "SRPT", "fair": "Fair", "fifo": "FIFO", "mantri": "Mantri"}


def run(problem: StragglersProblem, policy: str, seeds: int, params: dict | None = None) -> tuple[float, str]:
    """Return (mean weighted flowtime over seeds (s), the threshold policy's regime and rho*, or '')."""
    values, regime = [], ""
    for seed in range(seeds):
        res, figs = simulate_problem(problem, policy, dict(params or {}), seed, record=False)
        values.append(figs["weighted_flowtime_s"])
        if "regime" in res.params:
            regime = f"{res.params['regime']} {float(res.params['rho_star']):.3f}"
        if policy == "sda":
            regime = f"tau {float(res.params['tau']):g} x_m, d {int(res.params['d'])}"
    return float(np.mean(values)), regime


def main() -> None:
    """Print the tables and the targets."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--monitoring", choices=["elapsed", "progress"], default="elapsed")
    ap.add_argument("--big", action="store_true", help="also time 100,000 jobs (fifo, mantri, srptms-c, srpt-r, threshold)")
    args = ap.parse_args()
    started = time.perf_counter()
    print(f"stragglers: {args.jobs} generated jobs per cell on {args.slots} slots, {args.seeds} seed(s), monitoring "
          f"{args.monitoring}; weighted flowtime / Mantri's (lower is better). Wall times are on a shared, busy "
          "machine.\n")
    cols = ["variability", "load", "Mantri (s)"] + [SHORT[p] for p in ALL]
    print(" | ".join(f"{c:>8}" for c in cols))
    results: dict[tuple[str, float], dict[str, float]] = {}
    regimes: dict[tuple[str, float], str] = {}
    sda_choice: dict[str, str] = {}
    resolve: dict[str, float] = {}
    for label, var in VARIABILITY:
        policies = ALL if label == "pareto a=1.5" else SWEEP
        for load in LOADS:
            prob = StragglersProblem(slots=args.slots, variability=var, monitoring=args.monitoring,
                                     workload={"jobs": args.jobs, "load": load, "seed": 1, "weights": [1, 2, 3]})
            row = {"mantri": run(prob, "mantri", args.seeds)[0]}
            for p in policies:
                row[p], reg = run(prob, p, args.seeds)
                if p == "threshold":
                    regimes[(label, load)] = reg
                elif p == "sda":
                    sda_choice[label] = reg
            if load == 0.3:  # SCA deciding once per phase start, without re-solving its program at departures
                resolve[label] = run(prob, "sca", args.seeds, {"resolve": 0})[0] / row["mantri"]
            results[(label, load)] = row
            m = row["mantri"]
            cells = [f"{label:>8}", f"{load:>8.1f}", f"{m:>8.0f}"] + [
                f"{row[p] / m:>8.3f}" if p in row else f"{'':>8}" for p in ALL]
            print(" | ".join(cells), flush=True)
    print("\nthreshold regime chosen (rho* = E[X] / (r* E[min_r*]), where SCA's capacity constraint binds on "
          "average; r* SCA's unconstrained copies for the median job, w = 1):")
    right = total = 0
    for (label, load), reg_rho in regimes.items():
        reg, rho = reg_rho.split()
        row = results[(label, load)]
        better = "sca" if row["sca"] <= row["ese"] else "ese"
        total += 1
        right += reg == better
        print(f"  {label:>13} load {load:.1f}: rho* {rho}, chose {reg.upper():3}  (SCA {row['sca'] / row['mantri']:.3f}, "
              f"ESE {row['ese'] / row['mantri']:.3f} of Mantri) {'ok' if reg == better else 'WORSE REGIME'}")

    print("\nLP lower bound on small instances (30 jobs, 8 slots, load 0.7): weighted flowtime / bound "
          "(bound: every copy at the fastest speed, h(inf)); fluid LP with the expected h beside it")
    small_cols = ["variability", "bound (s)", "fluid/bnd"] + [SHORT[p] for p in ["mantri"] + ALL]
    print(" | ".join(f"{c:>8}" for c in small_cols))
    for label, var in VARIABILITY:
        prob = StragglersProblem(slots=8, variability=var, monitoring=args.monitoring,
                                 workload={"jobs": 30, "load": 0.7, "seed": 3, "weights": [1, 2, 3], "max_map_tasks": 12})
        bound, fluid = lower_bound(prob, "limit"), lower_bound(prob, "h")
        cells = [f"{label:>8}", f"{bound:>8.1f}", f"{fluid / bound:>8.3f}"]
        for p in ["mantri"] + ALL:
            cells.append(f"{run(prob, p, 3)[0] / bound:>8.2f}")
        print(" | ".join(cells), flush=True)

    print("\ntargets:")
    for label, _ in VARIABILITY:
        heavy, light = results[(label, 0.9)], results[(label, 0.3)]
        r_heavy = heavy["srptms-c"] / heavy["mantri"]
        r_light = min(light["sca"], light["sda"]) / light["mantri"]
        print(f"  {label:>13}: SRPTMS+C at load 0.9 = {r_heavy:.3f} of Mantri ({(1 - r_heavy) * 100:+.0f}% below; "
              f"target >= 20%: {'met' if r_heavy <= 0.8 else 'NOT met'}); best of SCA/SDA at load 0.3 = "
              f"{r_light:.3f} ({(1 - r_light) * 100:+.0f}% below; target >= 40%: {'met' if r_light <= 0.6 else 'NOT met'})")
    print(f"  threshold picked the better regime in {right} of {total} cells")
    print("\nSDA's (tau, d) from the order statistics (median job, gamma 0.1): " +
          "; ".join(f"{label}: {c}" for label, c in sda_choice.items()))
    print("SCA without the departure re-solve (resolve=0) at load 0.3, of Mantri: " +
          "; ".join(f"{label}: {r:.3f}" for label, r in resolve.items()))
    if args.big:
        print("\n100,000 jobs (pareto a=1.5, load 0.7, 50 slots): wall time per policy")
        prob = StragglersProblem(slots=50, variability={"model": "pareto", "alpha": 1.5},
                                 workload={"jobs": 100_000, "load": 0.7, "seed": 1, "max_map_tasks": 20})
        prob.arrays  # generate once, outside the timing
        for p in ("fifo", "mantri", "srptms-c", "srpt-r", "threshold", "fair-r", "laps-r", "hesrpt", "fair"):
            t = time.perf_counter()
            res, figs = simulate_problem(prob, p, {}, 0, record=False)
            print(f"  {p:>9}: {time.perf_counter() - t:6.1f} s, {res.events:,} events, "
                  f"{figs['tasks']:,.0f} tasks", flush=True)
    print(f"\nbenchmark wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
