"""Time-limit benchmark: does `--time-limit T` hold? Every shipped example, every solver that applies to
it, solved in this process under one limit, each solve's wall time against T side by side.

Run: .venv/bin/python benchmarks/time_limits_bench.py [--limit T] [--kinds hetis,omniserve] [--fresh]

--fresh runs each solve as users do, `gpuplan solve` in a new process, and judges the plan's own solve
time (solver.wall_time_s: from the solve's start, so a solver library's first import counts, Python's
start-up and reading the input do not); the process's whole wall time is printed beside it.

A solve may overrun T only by the least work that makes one plan (docs/index.md, "Time limits"): a
search stops at T, but the first candidate a serving search rates and the chosen plan's own simulation
run to their end, and such a plan's message says how long the solve took. The table marks every solve
over 1.1 T + 50 ms and whether its plan says so; the load average before and after is printed, since the
machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuplan import api, registry  # noqa: E402
from gpuplan.errors import GpuplanError  # noqa: E402
from gpuplan.models.base import Table  # noqa: E402
from gpuplan.render import table_text  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=float, default=1.0, help="the time limit of every solve (s)")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    ap.add_argument("--fresh", action="store_true", help="each solve by the CLI in a new process")
    args = ap.parse_args()
    registry.discover()
    kinds = [k for k in registry.kinds() if not args.kinds or k in args.kinds.split(",")]
    load0 = os.getloadavg()
    rows, over, said = [], 0, 0
    for kind in kinds:
        for path in sorted((ROOT / "examples" / kind).glob("*.yaml")):
            try:
                prob = api.load_problem(path)
            except GpuplanError:
                continue  # a trace or cluster file, not a problem
            for spec in registry.solvers(kind):
                if spec.applicable and spec.applicable(prob):
                    continue
                from gpuplan.solvers import hetis  # a fresh search each time: no ratings kept from before

                hetis._STAGE_A_RATED.clear()
                hetis._STATIC_CACHE.clear()
                started = time.perf_counter()
                process_s = None
                if args.fresh:
                    wall, status, message = fresh_solve(kind, path, spec.name, args.limit)
                    process_s = time.perf_counter() - started
                else:
                    try:
                        plan = api.solve(prob, solver=spec.name, time_limit_s=args.limit)
                        status, message = plan.status.value, plan.message or ""
                    except GpuplanError as exc:
                        status, message = f"error ({type(exc).__name__})", str(exc)
                    wall = time.perf_counter() - started
                past = wall > 1.1 * args.limit + 0.05
                says = "past its time limit" in message
                over += past
                said += past and says
                rows.append([kind, path.name, spec.name, f"{wall:.2f}", f"{wall / args.limit:.2f}x", status,
                             ("yes" if says else "NO") if past else ""]
                            + ([f"{process_s:.2f}"] if args.fresh else []))
                print(f"  {kind} {path.name} {spec.name}: {wall:.2f} s, {status}", flush=True)
    load1 = os.getloadavg()
    how = ("the plan's solve time, `gpuplan solve` in a new process each" if args.fresh else
           "api.solve in this process")
    print(table_text(Table(f"every shipped example x every solver under --time-limit {args.limit:g} s (wall s of "
                           f"{how})",
                           ["kind", "example", "solver", "wall s", "wall / limit", "status",
                            "over 1.1x: plan says so"] + (["process wall s"] if args.fresh else []), rows)))
    print(f"{len(rows)} solves; {over} over 1.1 x the limit + 50 ms, {said} of them with a plan saying how long "
          f"it took (the rest are errors)")
    print(f"load average (1, 5, 15 min) before {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, after "
          f"{load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} on {os.cpu_count()} cores")


def fresh_solve(kind: str, path: Path, solver: str, limit: float) -> tuple[float, str, str]:
    """Return (the plan's solve wall seconds, status, message) of `gpuplan solve` run in a new process;
    for a solve that writes no plan, the process's wall seconds, "error (exit N)" and its last stderr line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gpuplan.cli", "solve", kind, str(path), "--solver", solver,
                               "--time-limit", f"{limit:g}", "-o", str(out)], capture_output=True, text=True,
                              cwd=ROOT)
        if not out.exists():
            last = (proc.stderr.strip().splitlines() or [""])[-1]
            return time.perf_counter() - started, f"error (exit {proc.returncode})", last
        plan = json.loads(out.read_text())
        return float(plan["solver"]["wall_time_s"]), str(plan["status"]), str(plan.get("message") or "")


if __name__ == "__main__":
    main()
