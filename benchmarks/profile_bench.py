"""Profiler benchmark: predicted vs measured forward+backward time of stacks of 2, 4 and 8 layers.

Run: .venv/bin/python benchmarks/profile_bench.py [--quick] [--model NAME] [--rounds R]

The per-layer cost is measured exactly as `gpuplan profile` measures it for its layer table
(real gpuplan.runtime.gpt Blocks, CPU, fixed threads); the prediction for k layers is k times that
cost; the measurement is one end-to-end forward+backward pass through k distinct stacked Blocks.
With one thread per device both are timed by process CPU time, which other jobs on a shared
machine do not inflate (wall time otherwise).
The per-layer timing and the stacks are measured in interleaved rounds so that a change of
machine load hits both (target: within 10% on CPU). Also printed: the prediction from the
one-shot table taken before the rounds, and (without --quick) the alpha-beta fit quality of
every gloo collective between 2 CPU processes (4 KiB .. 64 MiB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuplan.models.base import Table  # noqa: E402
from gpuplan.models.workload import model_config, scaled  # noqa: E402
from gpuplan.profiling import collectives as coll  # noqa: E402
from gpuplan.profiling.layers import LayerPlan, layer_table, validate_stacks  # noqa: E402
from gpuplan.profiling.profile import cpu_threads, torch_threads  # noqa: E402
from gpuplan.render import table_text  # noqa: E402

TARGET = 0.10


def stack_rows(model: str, shapes: list[tuple[int, int]], hidden: int, rounds: int, repeats: int,
               threads: int) -> list[list]:
    """Return one row per (shape, k): predicted, measured, error, and the one-shot table's error."""
    cfg = scaled(model_config(model), num_layers=8, hidden=hidden, vocab=8192)
    rows = []
    with torch_threads(threads):
        for mb, seq in shapes:
            plan = LayerPlan(cfg, model, "benchmark", [mb], [seq], "fp32")
            table = layer_table(plan, "cpu", "cpu", repeats=repeats)
            for c in validate_stacks(table, "cpu", stacks=(2, 4, 8), rounds=rounds, repeats=repeats):
                table_err = (c.table_predicted_s - c.measured_s) / c.measured_s
                min_err = (c.predicted_min_s - c.measured_min_s) / c.measured_min_s
                rows.append([f"mb={mb} seq={seq}", c.layers, c.predicted_s * 1e3, c.measured_s * 1e3,
                             f"{c.rel_error:+.1%}", c.predicted_min_s * 1e3, c.measured_min_s * 1e3,
                             f"{min_err:+.1%}", f"{table_err:+.1%}", f"{c.measured_spread:.0%}"])
    return rows


def collective_rows(threads: int) -> list[list]:
    """Return one row per gloo collective over 2 processes: fit alpha, bandwidth, errors, largest busbw."""
    rows = []
    for c in coll.measure_local(2, sizes=coll.sizes_between(4 * coll.KiB, 64 * coll.MiB), repeats=5, threads=threads):
        top = c.points[-1]
        rows.append([c.op, c.fit.alpha_s * 1e6, c.fit.bandwidth_GBps, f"{c.fit.mean_rel_error:.1%}",
                     f"{c.fit.max_rel_error:.1%}", top.busbw_GBps,
                     sum(not p.timing.reliable for p in c.points)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape, a narrower layer, two rounds")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    threads = cpu_threads(2)
    shapes = [(1, 128)] if args.quick else [(1, 128), (2, 256)]
    hidden = 256 if args.quick else 512
    rounds = args.rounds or (2 if args.quick else 3)
    print(f"profile benchmark: {args.model} scaled to hidden {hidden}, fp32, CPU with {threads} thread(s) "
          f"per device ({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}), {rounds} rounds, "
          f"clock: {'process CPU time' if threads == 1 else 'wall'}")
    t0 = time.perf_counter()
    rows = stack_rows(args.model, shapes, hidden, rounds, 5 if args.quick else 4, threads)
    print(table_text(Table("stacks of layers: forward+backward, predicted = k x per-layer cost",
                           ["shape", "layers", "pred ms (median)", "meas ms (median)", "error",
                            "pred ms (fastest)", "meas ms (fastest)", "error", "one-shot table error",
                            "meas spread"], rows)))
    for label, col in (("median", 4), ("fastest run", 7)):
        worst = max(abs(float(r[col].rstrip("%"))) for r in rows) / 100
        print(f"{label}: worst |error| {worst:.1%} (target {TARGET:.0%}): {'met' if worst <= TARGET else 'MISSED'}")
    print(f"{time.perf_counter() - t0:.0f} s; load average now {os.getloadavg()[0]:.1f}")
    if not args.quick:
        t1 = time.perf_counter()
        print()
        print(table_text(Table("gloo collectives, 2 CPU processes, 4 KiB .. 64 MiB: fit t = alpha + S / bandwidth",
                               ["op", "alpha us", "fit GB/s", "mean fit err", "max fit err", "busbw 64 MiB GB/s",
                                "unreliable points"], collective_rows(threads))))
        print(f"{time.perf_counter() - t1:.0f} s")


if __name__ == "__main__":
    main()
