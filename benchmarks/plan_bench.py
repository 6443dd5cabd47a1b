"""Composed training plans (gpuplan plan train): Poseidon -> Tessel -> Lagom against the defaults.

Section (a), per cluster (the shipped heterogeneous examples and 2-3 GPU-type clusters of 64-512
GPUs): the composed plan's predicted iteration time against Poseidon + 1F1B + NCCL defaults and
against the best classic configuration (the `megatron` and `3d` baselines: equal stages and degrees)
+ 1F1B + NCCL defaults, and the wall time each step's search took.
Section (b), on this machine: a composed CPU plan of 2-4 stages (profiled here) run with gloo,
measured against predicted (target: within 15 %), each profile and run after waiting for a quiet
machine; a run still contended is retried once, then reported but not judged against the target.

Run: .venv/bin/python benchmarks/plan_bench.py [--quick] [--skip-run | --run-only]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuplan import api
from gpuplan.compose import compose, write_bundle
from gpuplan.models.base import Table
from gpuplan.render import table_text

ROOT = Path(__file__).resolve().parents[1]
CPU_TYPES = {  # as examples/poseidon/cpu-two-types.yaml declares them; the profile replaces the figures
    "cpu": {"name": "cpu", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10, "peak_tflops": {"fp32": 0.05},
            "intra_node_GBps": 2},
    "cpu-slow2x": {"name": "cpu-slow2x", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                   "peak_tflops": {"fp32": 0.025}, "intra_node_GBps": 2}}
NET = {"bandwidth_GBps": "200 Gbps", "latency_s": "5 us", "nics_per_node": 8}


def _cluster(nodes: dict[str, int]) -> dict[str, Any]:
    out = []
    for gpu, count in nodes.items():
        out += [{"name": f"{gpu.lower()}-{i}", "gpus": {gpu: 8}} for i in range(count)]
    return {"nodes": out, "inter_node": NET}


LARGE = [  # (name, nodes of 8 GPUs per type, model, global batch, sequence)
    ("64 GPUs: 4 H100 + 4 A100 nodes", {"H100": 4, "A100-80GB": 4}, "llama2-7b", 256, 4096),
    ("256 GPUs: 16 H100 + 12 A100 + 4 L40S nodes", {"H100": 16, "A100-80GB": 12, "L40S": 4}, "llama2-13b", 512, 4096),
    ("512 GPUs: 32 H200 + 32 H100 nodes", {"H200": 32, "H100": 32}, "llama2-70b", 1024, 4096),
]
SHIPPED = [("h100-a100-small.yaml", None, None, None), ("a100-v100-t4.yaml", None, None, None),
           ("cluster-l4-a10.yaml", "gpt3-1.3b", 64, 2048)]  # a cluster file only: model, batch, sequence


def best_classic(problem: Any, time_limit_s: float) -> tuple[str, float]:
    """Return (solver, iteration s) of the best classic equal-stage configuration that applies."""
    best = ("none", float("inf"))
    for row in api.compare(problem, solvers=["megatron", "3d"], time_limit_s=time_limit_s):
        name, plan, _ = row
        if plan is not None and plan.ok and plan.iteration_time_s < best[1]:  # type: ignore[attr-defined]
            best = (name, plan.iteration_time_s)  # type: ignore[attr-defined]
    return best


def section_a(quick: bool, time_limit_s: float) -> None:
    from gpuplan.compose import training_problem

    cases: list[tuple[str, Any]] = [(f"{f}" + (f" ({m})" if m else ""), training_problem(
        str(ROOT / "examples/poseidon" / f), m, batch=b, seq=q)) for f, m, b, q in SHIPPED]
    for name, nodes, model, batch, seq in (LARGE[:2] if quick else LARGE):
        doc = {"kind": "poseidon", "cluster": _cluster(nodes), "model": model, "global_batch": batch, "seq_len": seq}
        cases.append((name, api.load_problem(doc)))
    rows, steps = [], []
    for name, problem in cases:
        t0 = time.perf_counter()
        poseidon = api.solve(problem, solver="poseidon", time_limit_s=time_limit_s)
        t_pos = time.perf_counter() - t0
        if not poseidon.ok:
            rows.append([name, "infeasible", "-", "-", "-", "-", "-"])
            continue
        comp = compose(poseidon, time_limit_s=time_limit_s)
        classic_name, classic_s = best_classic(problem, time_limit_s)
        p = comp.predicted
        shape = " | ".join(f"{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L"  # type: ignore[attr-defined]
                           for s in poseidon.stages)  # type: ignore[attr-defined]
        rows.append([name, shape + f" m={poseidon.num_microbatches} v={poseidon.interleave}",  # type: ignore[attr-defined]
                     p["iteration_time_s"], p["baseline_iteration_time_s"],
                     f"{100 * (1 - p['iteration_time_s'] / p['baseline_iteration_time_s']):.2f}%",
                     f"{classic_s:.4g} ({classic_name})",
                     f"{100 * (1 - p['iteration_time_s'] / classic_s):.2f}%"])
        steps.append([name, t_pos, comp.step_times_s["tessel_s"], comp.step_times_s["lagom_s"], comp.rounds,
                      "yes" if comp.converged else "no",
                      f"{100 * (1 - p['tessel_iteration_time_s'] / p['baseline_iteration_time_s']):.2f}%",
                      f"{100 * (1 - p['iteration_time_s'] / p['tessel_iteration_time_s']):.2f}%"])
        print(f"  done: {name}", file=sys.stderr, flush=True)
    print(table_text(Table("(a) predicted iteration time (s): composed vs Poseidon + 1F1B + NCCL defaults vs best "
                           "classic config + 1F1B + NCCL defaults",
                           ["cluster", "Poseidon plan", "composed s", "Poseidon+1F1B+NCCL s", "gain",
                            "classic s (solver)", "gain vs classic"], rows)))
    print(table_text(Table("(a) search wall time per step (s) and each step's own gain",
                           ["cluster", "Poseidon s", "Tessel s", "Lagom s", "rounds", "fixed point",
                            "Tessel gain", "Lagom gain"], steps)))


def section_b(quick: bool, wait_s: float = 120.0) -> None:
    from click.testing import CliRunner

    from gpuplan.cli import main
    from gpuplan.compose import plan_training
    from gpuplan.errors import InputError
    from gpuplan.runtime.bundle import run_bundle
    from gpuplan.runtime.contention import wait_quiet

    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for stages in ([2] if quick else [2, 3, 4]):
            # a small GPT whose blocks last milliseconds on one core (the runtime's per-action cost stays small)
            doc = {"kind": "poseidon", "name": f"cpu-{stages}",
                   "cluster": {"device_types": CPU_TYPES,
                               "nodes": [{"name": "cpu0", "gpus": {"cpu": (stages + 1) // 2,
                                                                   "cpu-slow2x": stages // 2}}]},
                   "model": {"name": "gpt-cpu", "num_layers": 8, "hidden": 256, "heads": 4, "ffn_hidden": 1024,
                             "vocab": 2048, "gated_mlp": False},
                   "global_batch": 16, "seq_len": 128, "dtype": "fp32", "optimizer_state_bytes_per_param": 0,
                   "max_tp": 1, "max_stages": stages}
            example = Path(tmp) / f"cpu-{stages}.yaml"
            example.write_text(json.dumps(doc))
            prof = Path(tmp) / f"profile-{stages}.json"
            wait_quiet(wait_s)  # the profile's layer times are the plan's costs: measure them quietly
            r = CliRunner().invoke(main, ["profile", "--quick", "--for", str(example), "--emulate",
                                          "cpu-slow2x=cpu*2", "-o", str(prof)])
            if r.exit_code != 0:
                print(f"(b) profile failed: {r.output}")
                return
            bundle = Path(tmp) / f"b{stages}"
            comp = plan_training(str(example), profile=prof, output=bundle, time_limit_s=10)
            shape = " | ".join(f"{s.device_type}:dp{s.dp}:{s.num_layers}L"  # type: ignore[attr-defined]
                               for s in comp.poseidon.stages)  # type: ignore[attr-defined]
            try:
                for attempt in (1, 2):  # a run the monitor calls contended is retried once, after a wait
                    window, waited = wait_quiet(wait_s)
                    got = run_bundle(bundle, steps=3 if quick else 5)
                    notes.append(f"{stages} devices, try {attempt}: waited {waited:.0f} s for a quiet machine "
                                 f"(others {window.others_share or 0:.0%} of the cores then); contended: "
                                 f"{'YES' if got['contended'] else 'no'}; executor: {got['executor']}; sleep "
                                 f"late {1e3 * got['sleep_late_s']:.3f} ms; {got['verdict']}")
                    notes += [f"    {line}" for line in table_text(got["report"][-1]).splitlines()]
                    if not got["contended"]:
                        break
            except InputError as exc:  # a plan the CPU executor cannot run
                rows.append([f"{stages} devices: {shape}", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                             "-", "-", f"not run: {exc}"])
                continue
            err = got["predicted_here_error"]
            rows.append([f"{stages} devices: {shape} v={comp.poseidon.interleave}",  # type: ignore[attr-defined]
                         got["predicted_iteration_s"], got["predicted_here_profile_speed_iteration_s"],
                         got["predicted_here_iteration_s"], got["retimed_iteration_s"],
                         got["measured_iteration_s"], f"{100 * got['error']:+.1f}%",
                         f"{100 * got['predicted_here_profile_speed_error']:+.1f}%",
                         f"{100 * got['predicted_here_error']:+.1f}%",
                         f"{100 * got['predicted_here_plan_reduce_error']:+.1f}%", f"{100 * got['retimed_error']:+.1f}%",
                         " ".join(f"{a:.2f}/{b:.2f}" for a, b in got["compute_ratios"]),
                         f"{1e3 * got['cold_forward_s']:.3f}/{1e3 * got['cold_backward_s']:.3f}/"
                         f"{1e3 * got['wake_s']:.3f}", "YES" if got.get("contended") else "no",
                         "not judged (contended)" if got.get("contended") else "yes" if abs(err) <= 0.15 else "NO"])
    print(table_text(Table("(b) this machine (gloo, CPU): composed plan measured vs predicted (error = (predicted - "
                           "measured) / measured)",
                           ["plan", "predicted s", "profile speed s", "for this machine s", "re-timed s",
                            "measured s", "error", "profile-speed error", "for-this-machine error",
                            "with the plan's all-reduce error", "re-timed error",
                            "stage compute now/profile F/B", "cold F/B, wake ms", "contended",
                            "for-this-machine within 15%"], rows)))
    print("  for this machine: the composed schedule on this machine's cores (sharing rates of the plan's own "
          "stages, each chunk's compute at the speed the probe timed its modules at (per virtual stage, forward/"
          "backward ratio over the profile's figure for the same modules), cold calls, wake-up, late sleeps, each "
          "data-parallel group's gradient reduction alone and next to the other stages' compute; all measured before "
          "the run); with the plan's all-reduce: the same with the plan's all-reduce figure after the last block "
          "instead of the measured reduction; profile speed: the prediction for this machine at the profile's "
          "compute speed")
    for n in notes:
        print(f"  {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="Two large clusters, one CPU run, shorter limits.")
    ap.add_argument("--skip-run", action="store_true", help="Skip section (b) (the CPU run).")
    ap.add_argument("--run-only", action="store_true", help="Only section (b) (the CPU run).")
    ap.add_argument("--wait", type=float, default=120.0,
                    help="Seconds to wait for a quiet machine before each CPU profile and run (default 120).")
    args = ap.parse_args()
    if not args.run_only:
        section_a(args.quick, 5.0 if args.quick else 15.0)
    if not args.skip_run:
        section_b(args.quick, args.wait)


if __name__ == "__main__":
    main()
