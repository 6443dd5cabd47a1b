"""Poseidon benchmark: search time and pruning, optimality gap against exhaustive search, throughput
against the baselines, search time on unseen clusters (one process vs a process pool), the ridge
layer mapping against every cut set, and predicted vs measured iteration time of CPU pipeline runs.
Run: .venv/bin/python benchmarks/poseidon_bench.py [--quick] [--section unseen ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from gpuplan import api
from gpuplan.models.base import Table
from gpuplan.models.poseidon import CostModel, PoseidonProblem
from gpuplan.models.workload import TransformerConfig, model_config, scaled
from gpuplan.registry import no_progress
from gpuplan.render import table_text
from gpuplan.solvers import poseidon as SP


def problem(gpus: dict[str, int], model: str | TransformerConfig, batch: int, **extra: object) -> PoseidonProblem:
    cfg = model if isinstance(model, TransformerConfig) else model_config(model)
    doc = {"kind": "poseidon", "cluster": {"gpus": gpus, "gpus_per_node": 8,
                                           "inter_node": {"bandwidth_GBps": "100 Gbps", "latency_s": "10 us"}},
           "model": cfg.model_dump(), "global_batch": batch, "seq_len": 2048, **extra}
    return api.load_problem(doc)  # type: ignore[return-value]


def timed(prob: PoseidonProblem, solver: str, **kw: object):
    t0 = time.perf_counter()
    plan = api.solve(prob, solver=solver, **kw)
    return plan, time.perf_counter() - t0


def search_section(quick: bool) -> None:
    big = scaled(model_config("gpt3-175b"), hidden=6144)  # 96 layers, 43.8 B parameters
    cases = [
        ("16 GPUs, 2 types", {"A100-80GB": 8, "V100": 8}, "gpt3-1.3b", 64, {"max_stages": 8}, True, 10.0),
        ("16 GPUs, 3 types", {"A100-80GB": 8, "V100": 4, "T4": 4}, "gpt3-2.7b", 64, {"max_stages": 8}, True, 10.0),
        ("64 GPUs, 3 types", {"A100-80GB": 24, "V100": 24, "T4": 16}, "gpt3-2.7b", 128, {}, False, 10.0),
    ]
    if not quick:
        cases += [("64 GPUs, 4 types", {"H100": 16, "A100-80GB": 16, "V100": 16, "T4": 16}, "llama2-13b", 128,
                   {"max_stages": 8}, False, 10.0),
                  ("256 GPUs, 4 types", {"H100": 64, "A100-80GB": 64, "V100-32GB": 64, "L4": 64}, big, 512,
                   {"max_stages": 8}, False, 60.0)]
    rows = []
    for name, gpus, model, batch, extra, exhaustive, target in cases:
        prob = problem(gpus, model, batch, **extra)
        plan, secs = timed(prob, "poseidon")
        st = plan.solver.stats
        row = [name, prob.model.num_layers, st["structures"], st["evaluated"], st["pruned"], secs,
               "yes" if secs <= target else f"NO (> {target:g} s)"]
        if exhaustive:
            full, fsecs = timed(prob, "exhaustive")
            row += [full.solver.stats["evaluated"], fsecs, plan.iteration_time_s / full.iteration_time_s - 1]
        else:
            row += ["-", "-", "-"]
        mega, _ = timed(prob, "megatron")
        metis, msecs = timed(prob, "metis", time_limit_s=120.0)
        row += [mega.iteration_time_s / plan.iteration_time_s if mega.ok else math.nan,
                metis.iteration_time_s / plan.iteration_time_s if metis.ok else math.nan,
                f"{msecs:.1f}" + (" (stopped)" if metis.status.value == "time_limit" else "")]
        if len(gpus) == 1:
            d3, _ = timed(prob, "3d")
            row.append(d3.iteration_time_s / plan.iteration_time_s)
        rows.append(row)
        print(f"  {name}: poseidon {plan.iteration_time_s:.4g} s/iteration, "
              f"{' | '.join(f'{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L' for s in plan.stages)}, "
              f"m={plan.num_microbatches}", flush=True)
    print(table_text(Table("search: Poseidon vs exhaustive (same space) and baselines (throughput ratios = "
                           "baseline iteration time / Poseidon's)",
                           ["instance", "layers", "structures", "evaluated", "pruned", "search_s", "target met",
                            "exh_evaluated", "exh_s", "gap", "x megatron", "x metis", "metis_s"], rows)))
    homog = problem({"A100-80GB": 32}, "gpt3-6.7b", 128, max_stages=8)
    plan, secs = timed(homog, "poseidon")
    d3, _ = timed(homog, "3d")
    print(table_text(Table("homogeneous 32 x A100: Poseidon vs classic 3D config",
                           ["poseidon_s_per_iter", "3d_s_per_iter", "x 3d", "search_s"],
                           [[plan.iteration_time_s, d3.iteration_time_s, d3.iteration_time_s / plan.iteration_time_s,
                             secs]])))


def cpu_s() -> float:
    """Return the CPU seconds this process and its finished children (the search's pool) have used."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


UNSEEN = [  # clusters and models the search was not tuned on: 3-4 types, 64 and 256 GPUs; a 60 s limit each
    ("64 GPUs: 24 H100 + 24 A100-40GB + 16 L4", {"H100": 24, "A100-40GB": 24, "L4": 16}, "llama2-13b", 128, 60.0),
    ("64 GPUs: 16 H100 + 16 A100-80GB + 16 L40S + 16 L4", {"H100": 16, "A100-80GB": 16, "L40S": 16, "L4": 16},
     "qwen3-8b", 128, 60.0),
    ("64 GPUs: 16 H100 + 16 A100-80GB + 16 L40S + 16 L4", {"H100": 16, "A100-80GB": 16, "L40S": 16, "L4": 16},
     "llama2-13b", 128, 60.0),
    ("64 GPUs: 16 H100 + 16 A100-80GB + 16 L40S + 16 L4", {"H100": 16, "A100-80GB": 16, "L40S": 16, "L4": 16},
     "llama2-70b", 128, 60.0),
    ("64 GPUs: 16 H200 + 32 A100-40GB + 16 L40S", {"H200": 16, "A100-40GB": 32, "L40S": 16}, "llama3-8b", 256, 60.0),
    ("256 GPUs: 64 each of H200, H100, A100-80GB, L40S", {"H200": 64, "H100": 64, "A100-80GB": 64, "L40S": 64},
     "qwen3-32b", 512, 60.0),
]


WORK_COUNTERS = ["evaluated", "dag_evaluations", "pruned", "infeasible", "unvisited"]  # Stats fields


def unseen_section(quick: bool) -> None:
    """Search time on unseen clusters, in this process (workers=1) and on every core (process pool):
    CPU seconds (this process and its pool), wall seconds, the pool's wall-clock speed-up, and
    whether both found the same plan time; then the one-process search's work counters (structures
    ridge-mapped, DAG evaluations, structures pruned / infeasible / left unvisited)."""
    import os

    load0 = os.getloadavg()
    rows, work = [], []
    for name, gpus, model, batch, limit in UNSEEN[:1] if quick else UNSEEN:
        prob = problem(gpus, model, batch)
        runs = []
        for workers in (1, None):
            c0, w0 = cpu_s(), time.perf_counter()
            plan = api.solve(prob, solver="poseidon", workers=workers, time_limit_s=limit)
            runs.append((plan, cpu_s() - c0, time.perf_counter() - w0))
        (p1, c1, w1), (pn, cn, wn) = runs
        target = 60.0 if sum(gpus.values()) > 64 else 10.0
        rows.append([name, model, p1.solver.stats["structures"], p1.status.value, f"{c1:.1f}", f"{w1:.1f}",
                     pn.status.value, f"{cn:.1f}", f"{wn:.1f}", f"{w1 / wn:.2f}x",
                     "yes" if math.isclose(p1.iteration_time_s, pn.iteration_time_s, rel_tol=1e-9) else
                     f"{pn.iteration_time_s / p1.iteration_time_s:.4f}",
                     "yes" if c1 <= target and p1.status.value == "optimal" else f"NO (> {target:g} s)",
                     "yes" if wn <= target and pn.status.value == "optimal" else f"NO (> {target:g} s)",
                     f"{pn.iteration_time_s:.4g} s, v={pn.interleave}"])
        work.append([name, model] + [p1.solver.stats[k] for k in WORK_COUNTERS])
        print(f"  {name}: {' | '.join(f'{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L' for s in pn.stages)}, "
              f"m={pn.num_microbatches}, interleave {pn.interleave}", flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(table_text(Table(f"unseen clusters: search in one process vs a process pool on {cores} cores (CPU = this "
                           "process + its pool; a time limit of 60 s on each)",
                           ["instance", "model", "structures", "1 proc status", "1 proc CPU s", "1 proc wall s",
                            "pool status", "pool CPU s", "pool wall s", "pool speed-up", "same optimum",
                            "goal met (1 proc CPU)", "goal met (pool wall)", "plan"], rows)))
    print(table_text(Table("unseen clusters: the one-process search's work counters (deterministic when it ends "
                           "optimal; under the time limit they say how far it got)",
                           ["instance", "model", *WORK_COUNTERS], work)))
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the start {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, at the end "
          f"{load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} on {cores} cores")


def ridge_section(quick: bool) -> None:
    cases = [({"A100-80GB": 8, "V100": 8}, "gpt3-1.3b", 64), ({"A100-80GB": 8, "V100": 4, "T4": 4}, "gpt3-2.7b", 64)]
    rows = []
    for gpus, model, batch in cases[:1] if quick else cases:
        prob = problem(gpus, model, batch, max_stages=4)
        cm = CostModel(prob)
        gaps, ridge_evals, all_evals = [], 0, 0
        structs = [s for s in SP.structures(prob, cm) if s.feasible() and s.S >= 2]
        for s in structs[:: max(1, len(structs) // (60 if quick else 200))]:
            a, b = SP.Stats(), SP.Stats()
            ridge, _ = SP.ridge_map(s, a)
            best, _ = SP.all_cuts_map(s, b)
            gaps.append(ridge / best - 1)
            ridge_evals += a.dag_evaluations
            all_evals += b.dag_evaluations
        gaps.sort()
        rows.append([f"{sum(gpus.values())} GPUs {'/'.join(gpus)}, {prob.model.num_layers} layers", len(gaps),
                     statistics.median(gaps), gaps[int(0.9 * (len(gaps) - 1))], gaps[-1], ridge_evals / len(gaps),
                     all_evals / len(gaps)])
    prob = problem(cases[0][0], cases[0][1], cases[0][2], max_stages=4)
    ridge, rs = timed(prob, "poseidon")
    full, fs = timed(prob, "exhaustive", cuts="all")
    rows.append([f"best plan: Poseidon vs every structure x every cut set ({fs:.0f} s)", full.solver.stats["evaluated"],
                 ridge.iteration_time_s / full.iteration_time_s - 1, "-", "-", ridge.solver.stats["dag_evaluations"],
                 full.solver.stats["dag_evaluations"]])
    print(table_text(Table("ridge layer mapping vs every cut set (gap = ridge time / best cut set - 1; targets: "
                           "median <= 0.1 %, worst <= 2 %)",
                           ["instance", "structures", "median gap", "p90 gap", "worst gap", "DAG evals (ridge)",
                            "DAG evals (all cuts)"], rows)))


def cpu_section(quick: bool) -> None:
    from gpuplan.runtime.poseidon import cpu_problem, run_plan

    cfg = TransformerConfig(name="gpt-cpu", num_layers=8, hidden=256, heads=4, ffn_hidden=1024, vocab=2048,
                            gated_mlp=False)
    rows = []
    for S in ([2] if quick else [2, 3, 4]):
        types = {"cpu": ((S + 1) // 2, 1.0), "cpu-slow2x": (S // 2, 2.0)}
        prob = cpu_problem(cfg, seq_len=128, global_batch=16, types=types, micro_batches=[1, 2, 4], max_stages=S)
        plan = api.solve(prob, num_stages=S)
        out = run_plan(prob, plan, steps=7, warmup=1, calibrate=5)
        meas, fast = out["measured_iteration_s"], out["measured_fastest_iteration_s"]
        pred = out["predicted_cpu_iteration_s"]
        rows.append([S, " | ".join(f"{s.device_type}:{s.num_layers}L" for s in plan.stages), plan.num_microbatches,
                     out["predicted_iteration_s"], pred, out["calibrated_iteration_s"], out["replayed_iteration_s"],
                     meas, fast, pred / meas - 1, pred / fast - 1, out["predicted_iteration_s"] / meas - 1,
                     out["calibrated_iteration_s"] / meas - 1, out["replayed_iteration_s"] / meas - 1])
        print(f"  {S} stages done", flush=True)
    print(table_text(Table(f"CPU pipeline runs (gloo, 1 thread per process, {rows and out['cores']} cores, core sharing "
                           f"rates {rows and [round(r, 2) for r in out['core_sharing_rates']]}, torch "
                           "Schedule1F1B; 'cpu-slow2x' emulated by a 2x calibrated slowdown; target |error| <= 15 % "
                           "for the prediction)",
                           ["stages", "plan", "m", "DAG_s (profile)", "predicted_s (profile + cores)",
                            "calibrated_s", "replay_s", "measured_s (median)", "measured_s (fastest)",
                            "error (prediction)", "error (prediction vs fastest)", "error (DAG)",
                            "error (calibrated)", "error (replay)"], rows)))
    print("prediction: the plan's stage costs from the per-layer profile (one process, measured before the run),\n"
          "the DAG's op order, the workers sharing the cores at the speeds measured just before the run with k\n"
          "workers computing at once (processor sharing; sleeps of the slowdown\n"
          "emulation use no core); DAG: the same without core sharing (the plan's iteration time); calibrated:\n"
          "the DAG fed with each stage timed standalone in its worker, all workers at once; replay: the DAG fed\n"
          "with the per-stage times measured inside the run. Measured: median and fastest of 7 steps (the fastest is\n"
          "the step least disturbed by other jobs on this shared machine); errors against the median unless said.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller instances, fewer runs")
    ap.add_argument("--section", choices=["search", "unseen", "ridge", "cpu"], action="append",
                    help="run only these sections (default: all)")
    args = ap.parse_args()
    print("note: timings on a 2-core machine shared with other engineers' jobs; times are noisy\n")
    sections = {"search": search_section, "unseen": unseen_section, "ridge": ridge_section, "cpu": cpu_section}
    for key, section in sections.items():
        if args.section and key not in args.section:
            continue
        t0 = time.perf_counter()
        section(args.quick)
        print(f"({section.__name__}: {time.perf_counter() - t0:.1f} s)\n", flush=True)


if __name__ == "__main__":
    main()
