"""OEF on Gavel's own traces: every policy replayed with Gavel's round mechanism, beside Gavel's own
simulator where it can be run.

Traces (all on Gavel's physical cluster, 8 V100 / 16 P100 / 24 K80, rounds of 360 s, Gavel's
measured throughputs, examples/oef/gavel/):
  - Gavel's public physical-cluster traces: the continuous-arrival one (96 jobs over 12.9 h) and
    the static one (100 jobs at t = 0);
  - traces from a generator that follows Gavel's (gpuplan.models.gavel_trace.generate_jobs:
    Philly scale factors and durations, Poisson arrivals): 100 jobs each at 2 and 4 jobs/hour,
    seeds 0-2 (--quick: 40 jobs, seed 0).
Policies: gavel-maxmin (Gavel's LAS), maxmin-agnostic, both also with the tie-break
tie_break=efficiency (max efficiency among the max-min optima), both gavel-maxmin and oef [jobs]
also with space sharing (measured 1-GPU co-location throughputs; Gavel's own packed policy fails
on current numpy, so it has no column), cooperative OEF with the paper's
normalisation (slowest type), with each job's best type, and with 'jobs' (progress per job in
V100-equivalents), and oef-si with 'jobs'. All use Gavel's mechanism: work-conserving rounds,
re-allocation at most every 1,920 s, rounds that end with their last job.

Gavel's own simulator: set GAVEL_SCHEDULER_DIR to Gavel's `scheduler/` directory (RPC stubs built
with `make rpc_stubs`) and GAVEL_PYTHON to a Python with its dependencies (grpcio, psutil, cvxpy,
ecos, scikit-learn, matrix_completion, preconditions); it is then run on the same trace files
(max_min_fairness_perf and max_min_fairness, ECOS, seed 0). Without them its columns say 'not run'.

Run: .venv/bin/python benchmarks/oef_gavel_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from gpuplan.models.base import Table
from gpuplan.models.gavel_trace import gavel_trace_text, generate_jobs, load_gavel, read_gavel_throughputs
from gpuplan.render import table_text
from gpuplan.solvers.oef.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
GAVEL = ROOT / "examples" / "oef" / "gavel"
TPUT = GAVEL / "simulation_throughputs_colocated.json"     # isolated figures + 1-GPU co-location pairs
CLUSTER = {"v100": 8, "p100": 16, "k80": 24}
# (label, solver, normalisation, solver options)
TIE = {"tie_break": "efficiency"}
POLICIES = [("gavel-maxmin", "gavel-maxmin", "jobs", {}), ("maxmin-agnostic", "maxmin-agnostic", "jobs", {}),
            ("gavel-maxmin [tie: eff.]", "gavel-maxmin", "jobs", TIE),
            ("maxmin-agnostic [tie: eff.]", "maxmin-agnostic", "jobs", TIE),
            ("oef [slowest]", "oef", "slowest", {}), ("oef [best]", "oef", "best", {}), ("oef [jobs]", "oef", "jobs", {}),
            ("oef-si [jobs]", "oef-si", "jobs", {}),
            ("gavel-maxmin + sharing", "gavel-maxmin", "jobs", {}), ("oef [jobs] + sharing", "oef", "jobs", {})]
GAVEL_POLICIES = {"gavel-maxmin": "max_min_fairness_perf", "maxmin-agnostic": "max_min_fairness"}
TARGET = "oef [jobs]"


def traces(quick: bool, folder: Path) -> list[tuple[str, Path]]:
    """Return (label, Gavel-format trace file) for the public traces and the generated ones."""
    out = [("Gavel continuous (96 jobs)", GAVEL / "physical_max_min_fairness.trace"),
           ("Gavel static (100 jobs)", GAVEL / "physical_minimize_makespan.trace")]
    table = read_gavel_throughputs(TPUT)
    n, seeds = (40, [0]) if quick else (100, [0, 1, 2])
    for rate in (2.0, 4.0):
        for seed in seeds:
            path = folder / f"generated_{rate:g}ph_seed{seed}.trace"
            path.write_text(gavel_trace_text(generate_jobs(table, n, rate, seed)))
            out.append((f"generated {n} jobs {rate:g}/h seed {seed}", path))
    return out


def run_gavel(path: Path, policy: str) -> dict[str, float] | None:
    """Return Gavel's own simulator's avg and p95 JCT (h) on a trace file, or None when it cannot run."""
    where, python = os.environ.get("GAVEL_SCHEDULER_DIR"), os.environ.get("GAVEL_PYTHON")
    if not where or not python:
        return None
    cmd = [python, "scripts/drivers/simulate_scheduler_with_trace.py", "-t", str(path.resolve()), "-p", policy,
           "-c", "{v100}:{p100}:{k80}".format(**CLUSTER), "--seed", "0", "--solver", "ECOS"]
    try:
        done = subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout + done.stderr
    jct = [float(x) for x in re.findall(r"^Job \d+: ([0-9.]+)$", text, flags=re.M)]
    avg = re.search(r"Average job completion time: ([0-9.]+) seconds", text)
    if avg is None or not jct:
        return None
    return {"avg_jct_h": float(avg.group(1)) / 3600, "p95_jct_h": float(np.percentile(jct, 95)) / 3600}


def section_gavel(quick: bool = False) -> list[str]:
    """Return the printed lines of the Gavel-traces section: one table per trace (every policy,
    Gavel's own simulator beside), then the targets (gavel-maxmin within 5% of Gavel's simulator;
    cooperative OEF's average JCT below Gavel's max-min with SI and EF kept) met or missed."""
    lines: list[str] = []
    checks_gavel: list[str] = []
    margins: list[tuple[str, float, float | None, bool]] = []
    tied: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in traces(quick, Path(tmp)):
            trace = load_gavel(path, TPUT, CLUSTER, reference_type="V100", space_sharing=True)
            rows, avg = [], {}
            fair_ok = True
            for name, solver, norm, options in POLICIES:
                t0 = time.perf_counter()
                tr = trace.model_copy(update={"normalisation": norm})
                res = simulate(tr, solver, mechanism="gavel", resolve_every_s=1920, solver_options=options,
                               space_sharing=name.endswith("+ sharing"))
                f = res.figures()
                avg[name] = f["avg_jct_h"]
                if name == TARGET:
                    fair_ok = f["min_si_ratio"] >= 1 - 1e-6 and f["envy_allocations"] == 0
                rows.append([name, f["avg_jct_h"], f["p95_jct_h"], f["makespan_h"], f["useful_gpus"],
                             f["ftf_mean"], f["ftf_max"], f["min_si_ratio"], int(f["envy_allocations"]),
                             time.perf_counter() - t0])
            own = {}
            for name, gp in GAVEL_POLICIES.items():
                t0 = time.perf_counter()
                g = run_gavel(path, gp)
                own[name] = g
                rows.append([f"Gavel's simulator: {gp}", g["avg_jct_h"] if g else "not run",
                             g["p95_jct_h"] if g else "-", "-", "-", "-", "-", "-", "-",
                             time.perf_counter() - t0 if g else "-"])
            lines += table_text(Table(f"Gavel trace: {label}, {len(trace.jobs)} jobs, 8 V100 / 16 P100 / 24 K80",
                                      ["policy", "avg JCT (h)", "p95 JCT (h)", "makespan (h)",
                                       "useful V100-eq GPUs", "FTF mean", "FTF max", "worst SI ratio",
                                       "allocs with envy", "wall (s)"], rows)).splitlines()
            g = own["gavel-maxmin"]
            if g:
                gap = avg["gavel-maxmin"] / g["avg_jct_h"] - 1
                checks_gavel.append(f"   {label}: gavel-maxmin {avg['gavel-maxmin']:.3f} h vs Gavel's simulator "
                                    f"{g['avg_jct_h']:.3f} h ({gap:+.1%}) -> {'met' if abs(gap) <= 0.05 else 'MISSED'}")
            else:
                checks_gavel.append(f"   {label}: Gavel's simulator not run (set GAVEL_SCHEDULER_DIR and GAVEL_PYTHON)")
            margins.append((label, 1 - avg[TARGET] / avg["gavel-maxmin"],
                            1 - avg[TARGET] / g["avg_jct_h"] if g else None, fair_ok))
            tied.append(f"   {label}: {TARGET} {avg[TARGET]:.3f} h, gavel-maxmin [tie: eff.] "
                        f"{avg['gavel-maxmin [tie: eff.]']:.3f} h ({1 - avg[TARGET] / avg['gavel-maxmin [tie: eff.]']:+.1%} "
                        f"cut), maxmin-agnostic [tie: eff.] {avg['maxmin-agnostic [tie: eff.]']:.3f} h")
    lines.append("")
    lines.append(" target: gavel-maxmin within 5% of Gavel's own simulator (average JCT)")
    lines += checks_gavel
    lines.append(f" target: cooperative OEF ({TARGET}) average JCT below Gavel's max-min on every trace, "
                 "SI and EF kept in every allocation")
    for label, ours, theirs, fair in margins:
        vs = f", {theirs:+.1%} vs Gavel's simulator" if theirs is not None else ""
        ok = ours > 0 and (theirs is None or theirs > 0) and fair
        lines.append(f"   {label}: average JCT cut {ours:+.1%} vs gavel-maxmin{vs}; SI+EF kept: {fair} -> "
                     f"{'met' if ok else 'MISSED'}")
    lines.append(" not a target: max-min with the efficiency tie-break (max efficiency among max-min optima, "
                 "same normalisation), beside OEF")
    lines += tied
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="generated traces of 40 jobs, one seed")
    args = ap.parse_args()
    t0 = time.perf_counter()
    for line in section_gavel(args.quick):
        print(line, flush=True)
    print(f" section wall time: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
