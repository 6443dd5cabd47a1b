"""Fidelity section (a): Poseidon's time model against published, measured Megatron-LM training runs.

Each row of benchmarks/data/published_training_runs.yaml (source, model shape, GPUs, TP/PP/DP,
micro-batch, recomputation, interleaving, sequence parallelism, global batch, the published figure)
is evaluated as a FIXED configuration through the public API (`gpuplan.evaluate_config`) on a
DGX A100 cluster of the stated size; nothing is fitted to these numbers.

ratio = predicted throughput / published throughput (>1: the model is too fast). For rows
published in teraFLOP/s per GPU the predicted figure uses the paper's own FLOP count (Narayanan et
al. eq. 3); for rows published as iteration times, the ratio is published time / predicted time.

Run alone: .venv/bin/python benchmarks/fidelity_training.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

DATA = ROOT / "data" / "published_training_runs.yaml"
TOLERANCE = 0.15


def narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Return Narayanan et al. (SC'21) eq. 3: FLOPs of one iteration with full recomputation."""
    return 96.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def problem_of(row: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """Return the poseidon problem document of one published run."""
    h = row["hidden"]
    return {"kind": "poseidon",
            "cluster": {"gpus": {d["gpu"]: row["gpus"]}, "gpus_per_node": d["gpus_per_node"],
                        "inter_node": {"bandwidth_GBps": f"{d['nic_Gbps']} Gbps", "latency_s": "5 us",
                                       "nics_per_node": d["nics_per_node"]}},
            "model": {"name": f"gpt-{row['name'].split()[0].lower()}", "num_layers": row["layers"], "hidden": h,
                      "heads": row["heads"], "ffn_hidden": 4 * h, "vocab": d["vocab"], "gated_mlp": False,
                      "tied_embeddings": True, "max_seq_len": d["seq_len"]},
            "global_batch": row["global_batch"], "seq_len": d["seq_len"], "dtype": d["dtype"],
            "flash_attention": d["flash_attention"], "sequence_parallel": row["sequence_parallel"],
            "max_tp": 8, "max_stages": max(16, row["pp"]), "max_microbatches": 4096}


def evaluate_row(row: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """Return the predicted figures of one published run: iteration time, published-metric
    prediction, ratio, memory need per GPU and whether it fits."""
    import gpuplan

    problem = gpuplan.load_problem(problem_of(row, d))
    dp = row["gpus"] // (row["tp"] * row["pp"])
    config = {"tp": row["tp"], "pp": row["pp"], "dp": dp, "mb": row["micro_batch"], "recompute": row["recompute"],
              "interleave": row["interleave"], "sequence_parallel": row["sequence_parallel"]}
    plan = gpuplan.evaluate_config(problem, config, check_memory=False)
    t = plan.iteration_time_s
    cap = problem.cluster.type_of(d["gpu"]).memory_bytes
    need = max(s.memory_bytes for s in plan.stages)
    if row["metric"] == "tflops_per_gpu":
        flops = narayanan_flops(row["global_batch"], d["seq_len"], row["layers"], row["hidden"], d["vocab"])
        predicted = flops / t / row["gpus"] / 1e12
        ratio = predicted / row["published"]
    else:
        predicted = t
        ratio = row["published"] / t
    return {"dp": dp, "t": t, "predicted": predicted, "ratio": ratio, "mfu": plan.predicted["mfu"],
            "need_GiB": need / 2**30, "cap_GiB": cap / 2**30, "bubble": plan.predicted["bubble_fraction"]}


def section_a() -> list[str]:
    """Return the printed lines of section (a): one per published run with its settings, the
    published and predicted figure, the ratio and whether it is within 15%, then a summary."""
    doc = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    d, rows = doc["defaults"], doc["runs"]
    lines = ["(a) Poseidon time model vs published measured training runs (fixed configs, A100-80GB, "
             f"{DATA.name}); ratio = predicted / published throughput",
             f"{'source':<14}{'model':<13}{'GPUs':>5} {'tp':>2} {'pp':>3} {'dp':>3} {'mb':>3} {'recomp':<9}{'v':>2} "
             f"{'SP':<3}{'published':>11}{'predicted':>11}{'ratio':>7}  within15%  MFU    mem/GPU"]
    ratios = []
    for row in rows:
        started = time.perf_counter()
        r = evaluate_row(row, d)
        unit = "TF/s" if row["metric"] == "tflops_per_gpu" else "s"
        ok = abs(r["ratio"] - 1.0) <= TOLERANCE
        ratios.append(r["ratio"])
        mem = f"{r['need_GiB']:.0f}/{r['cap_GiB']:.0f} GiB" + ("" if r["need_GiB"] <= r["cap_GiB"] else " OVER")
        lines.append(f"{row['source']:<14}{row['name']:<13}{row['gpus']:>5} {row['tp']:>2} {row['pp']:>3} "
                     f"{r['dp']:>3} {row['micro_batch']:>3} {row['recompute']:<9}{row['interleave']:>2} "
                     f"{'y' if row['sequence_parallel'] else 'n':<3}{row['published']:>8.2f} {unit:<3}"
                     f"{r['predicted']:>8.2f} {unit:<3}{r['ratio']:>6.2f}  {'yes' if ok else 'NO':<9}  "
                     f"{r['mfu'] * 100:4.1f}%  {mem}  ({time.perf_counter() - started:.1f} s)")
    inside = sum(abs(x - 1.0) <= TOLERANCE for x in ratios)
    lines.append(f"within 15%: {inside}/{len(ratios)}; ratio min {min(ratios):.2f}, max {max(ratios):.2f}, "
                 f"geometric mean {_gmean(ratios):.3f}")
    lines += layer_lines(doc)
    lines += WHY_MISSES
    return lines


WHY_MISSES = [
    "why rows miss (every miss is the model being too fast; nothing is tuned to close it):",
    "  * the per-layer check isolates it: one layer's forward is predicted ~15% under Table 4 while the",
    "    SP saving and the recomputation deltas come out close, i.e. GEMM and element-wise kernels in situ",
    "    run below the best-shape matmul ceiling (MAMF: CUDA 12.1, 2023) and the 90% HBM streaming rate",
    "    the model assumes;",
    "  * 2021 vs 2022 software: the same 1T pipeline (pp 64, 512 micro-batches, full recomputation) was",
    "    measured at 163 TF/s per GPU (narayanan21) and 177 TF/s (korthikanti22: 94.42 s by eq. 3); the",
    "    model predicts one figure for both, so the 2021 rows carry ~9% more gap;",
    "  * not modelled, each small by our estimate and all in the direction of the miss: Megatron's blocking",
    "    p2p (it synchronises after each exchange), fp32 main-grad accumulation per micro-batch (DDP=local),",
    "    the optimizer's grad-norm / copy passes; modelled as not overlapped although Megatron overlaps the",
    "    backward TP all-reduce with the weight-gradient GEMM (the other direction).",
]


def layer_lines(doc: dict[str, Any]) -> list[str]:
    """Return the per-layer check: one block's forward and backward (TP collectives and what the
    recomputation mode re-runs included) against Korthikanti et al. Table 4."""
    import gpuplan
    from gpuplan.models.poseidon import CostModel

    d, spec = doc["defaults"], doc["layer_runs"]
    lay = spec["layer"]
    out = [f"one layer of the 22B model ({spec['source']} Table 4; tp {lay['tp']}, micro-batch {lay['micro_batch']}): "
           "published vs predicted ms, ratio = published / predicted time"]
    for row in spec["rows"]:
        run = {"name": "22B", "layers": 48, "hidden": lay["hidden"], "heads": lay["heads"], "gpus": lay["tp"],
               "global_batch": lay["micro_batch"], "sequence_parallel": row["sequence_parallel"], "pp": 1}
        problem = gpuplan.load_problem(problem_of(run, d))
        cm = CostModel(problem)
        f, g = cm.layer(d["gpu"], lay["tp"], lay["micro_batch"])
        g += cm.recompute_s(d["gpu"], lay["tp"], lay["micro_batch"], row["recompute"])
        rf, rb = row["forward_ms"] / (f * 1e3), row["backward_ms"] / (g * 1e3)
        out.append(f"  {row['name']:<24} fwd {row['forward_ms']:5.1f} vs {f * 1e3:5.2f} ({rf:.2f})   "
                   f"bwd {row['backward_ms']:5.1f} vs {g * 1e3:5.2f} ({rb:.2f})   "
                   f"{'yes' if max(abs(rf - 1), abs(rb - 1)) <= TOLERANCE else 'NO'}")
    return out


def _gmean(xs: list[float]) -> float:
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs))


if __name__ == "__main__":
    for line in section_a():
        print(line, flush=True)
