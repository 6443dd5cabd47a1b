"""Fidelity section (d): Poseidon's search at scale against the best classic 3D configuration.

On clusters of 1,000-3,000 GPUs (GPT-3 175B on 1,024 A100s; the 530B and 1T GPT models of
Narayanan et al. 2021 on 2,240 and 3,072 A100s; a 1,024-GPU mix of H100s and A100s), under a time
limit: Poseidon's plan against the best classic configuration of the same space in the same model
(every TP x PP x DP grid with TP inside a node, every micro-batch count that divides the batch,
layers split evenly; on the mixed cluster also the Megatron-style mixes of equal stages), and the
published configuration where there is one. Prints iteration seconds of each, the ratio
(classic / Poseidon: >= 1 means Poseidon is no slower), the search's wall time against its limit,
its status, and where its plan came from (the search itself or one of its seeds).

Run alone: .venv/bin/python benchmarks/fidelity_search.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

from gpuplan import api  # noqa: E402
from gpuplan.models.base import Table  # noqa: E402
from gpuplan.models.poseidon import CostModel, PoseidonPlan, PoseidonProblem  # noqa: E402
from gpuplan.render import table_text  # noqa: E402
from gpuplan.solvers import poseidon as SP  # noqa: E402

# DGX A100 / DGX H100 networking: eight 200 Gb/s (A100) compute NICs per node
NETWORK = {"bandwidth_GBps": "200 Gbps", "latency_s": "5 us", "nics_per_node": 8}

# (name, model, GPUs by type, global batch, time limit s, published (stages, tp, micro-batches) or None)
CASES: list[tuple[str, str, dict[str, int], int, float, tuple[int, int, int] | None]] = [
    ("GPT-3 175B, 1,024 A100", "gpt3-175b", {"A100-80GB": 1024}, 1536, 30.0, None),
    ("530B, 2,240 A100", "gpt-530b", {"A100-80GB": 2240}, 2240, 30.0, (35, 8, 280)),
    ("1T, 3,072 A100", "gpt-1t", {"A100-80GB": 3072}, 3072, 60.0, (64, 8, 512)),
    ("175B, 512 H100 + 512 A100", "gpt3-175b", {"H100": 512, "A100-80GB": 512}, 1536, 60.0, None),
]


def problem(model: str, gpus: dict[str, int], batch: int) -> PoseidonProblem:
    """Return the problem: `gpus` in nodes of 8, multi-rail network, sequence length 2048."""
    doc = {"kind": "poseidon", "model": model, "global_batch": batch, "seq_len": 2048,
           "cluster": {"gpus": gpus, "gpus_per_node": 8, "inter_node": NETWORK}}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


def shape(plan: PoseidonPlan) -> str:
    """Return a plan's configuration in one short string: per type, stages x (tp x dp); micro-batches."""
    parts: list[str] = []
    for s in plan.stages:
        key = f"{s.device_type} TP{s.tp} DP{s.dp}"
        if parts and parts[-1].endswith(key):
            head, _, rest = parts[-1].partition("x ")
            parts[-1] = f"{int(head) + 1}x {rest}"
        else:
            parts.append(f"1x {key}")
    return f"{' | '.join(parts)}, m={plan.num_microbatches}"


def best_classic_s(prob: PoseidonProblem) -> tuple[float, str, float]:
    """Return (seconds, description, wall seconds) of the best classic configuration of the space."""
    started = time.perf_counter()
    cm = CostModel(prob)
    opts = SP.type_options(prob)
    configs = SP.grid_configs(prob, opts) + (SP.megatron_configs(prob, opts) if len(opts) > 1 else [])
    (t, st, layers), label, _ = SP.best_classic(cm, configs)
    wall = time.perf_counter() - started
    if st is None:
        return t, "none fits", wall
    desc = f"{label}: {st.S} stages TP{st.shapes[0].tp} DP{st.shapes[0].dp}, m={st.m}"
    return t, desc, wall


def published_s(prob: PoseidonProblem, config: tuple[int, int, int] | None) -> float | None:
    """Return the seconds of the published (stages, tp, micro-batches) configuration, evenly split."""
    if config is None:
        return None
    stages, tp, m = config
    cm = CostModel(prob)
    (opts,) = SP.type_options(prob).values()
    o = next(o for o in opts if o.stages == stages and o.tp == tp)
    st = SP.Structure(cm, list(o.shapes), m)
    return st.time(SP.uniform_layers(prob.model.num_layers, stages))


def section_d(quick: bool = False) -> list[str]:
    """Return the printed lines of section (d): one row per case, then the verdict lines."""
    rows: list[list[Any]] = []
    lines: list[str] = []
    worst_ratio, worst_overrun = float("inf"), 0.0
    if not quick:  # a short limit with cold caches: the seeds must fit in it too
        name, model, gpus, batch, _, _ = CASES[2]
        prob = problem(model, gpus, batch)
        started = time.perf_counter()
        plan = api.solve(prob, solver="poseidon", time_limit_s=10.0)
        wall = time.perf_counter() - started
        worst_overrun = max(worst_overrun, wall / 10.0 - 1)
        lines.append(f"  cold start, {name}, limit 10 s: {plan.iteration_time_s:.4g} s per iteration "
                     f"({plan.solver.stats.get('best_from')}), wall {wall:.2f} s, {plan.status.value}")
    for name, model, gpus, batch, limit, published in (CASES[:2] if quick else CASES):
        prob = problem(model, gpus, batch)
        started = time.perf_counter()  # first, so its wall time includes cold caches
        plan = api.solve(prob, solver="poseidon", time_limit_s=limit)
        wall = time.perf_counter() - started
        classic, classic_desc, classic_wall = best_classic_s(prob)
        pub = published_s(prob, published)
        if not plan.ok:
            rows.append([name, "-", classic, "-", "-", f"{wall:.1f}/{limit:g}", plan.status.value, "-"])
            continue
        t = plan.iteration_time_s
        ratio = classic / t
        worst_ratio = min(worst_ratio, ratio)
        worst_overrun = max(worst_overrun, wall / limit - 1)
        rows.append([name, t, classic, pub if pub is not None else "-", ratio, f"{wall:.1f} / {limit:g}",
                     plan.status.value, plan.solver.stats.get("best_from", "-")])
        lines.append(f"  {name}: poseidon {shape(plan)}; best classic {classic_desc} "
                     f"(found in {classic_wall:.1f} s, caches warm)")
    table = Table("(d) Poseidon under a time limit vs the best classic 3D configuration (seconds per iteration; "
                  "ratio = classic / Poseidon)",
                  ["case", "poseidon_s", "best_classic_s", "published_cfg_s", "ratio", "wall_s / limit_s",
                   "status", "plan from"], rows)
    out = table_text(table).splitlines() + lines
    name, model, gpus, batch, _, _ = CASES[-1]
    if not quick:  # anytime: the same mixed-cluster search under shorter limits
        prob = problem(model, gpus, batch)
        for limit in (10.0, 30.0):
            started = time.perf_counter()
            plan = api.solve(prob, solver="poseidon", time_limit_s=limit)
            wall = time.perf_counter() - started
            worst_overrun = max(worst_overrun, wall / limit - 1)
            out.append(f"  anytime, {name}, limit {limit:g} s: {plan.iteration_time_s:.4g} s per iteration "
                       f"({plan.solver.stats.get('best_from')}), wall {wall:.1f} s, {plan.status.value}")
    out.append(f"worst ratio classic/poseidon: {worst_ratio:.4f} (target >= 1: never slower than a classic config)")
    out.append(f"worst time-limit overrun: {100 * worst_overrun:+.1f}% (target <= +10%)")
    return out


def main() -> None:
    """Print section (d)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the two first cases only")
    args = parser.parse_args()
    for line in section_d(args.quick):
        print(line, flush=True)


if __name__ == "__main__":
    main()
