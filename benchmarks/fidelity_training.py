"""Fidelity section (a): Poseidon's time model against published, measured Megatron-LM training runs.

Each row of benchmarks/data/published_training_runs.yaml (source, model shape, GPUs, TP/PP/DP,
micro-batch, recomputation, interleaving, sequence parallelism, global batch, the published figure)
is evaluated as a FIXED configuration through the public API (`gpuplan.evaluate_config`) on a
DGX A100 cluster of the stated size; nothing is fitted to these numbers.

ratio = predicted throughput / published throughput (>1: the model is too fast). For rows
published in teraFLOP/s per GPU the predicted figure uses the paper's own FLOP count (Narayanan et
al. eq. 3); for rows published as iteration times, the ratio is published time / predicted time.

Run alone: .venv/bin/python benchmarks/fidelity_training.py [--ablation]
(--ablation: what each term of the per-operation model contributes, each reverted alone)
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
    lines += pair_lines(doc)
    lines += layer_lines(doc)
    lines += WHY_MISSES
    return lines


WHY_MISSES = [
    "why rows miss (every miss is the model being too fast; nothing is tuned to close it):",
    "  * the two sources measured the same pipelines at different speeds (the lines above): the 1T pipeline",
    "    (pp 64, tp 8, 512 micro-batches of 1, full recomputation) took 102.6 s in narayanan21 (163 TF/s, NGC",
    "    PyTorch 20.12: CUDA 11.1) and 94.4 s in korthikanti22; the 530B pipeline (280 micro-batches) 54.1 s",
    "    with 3 interleaved chunks vs 49.1 s without, although interleaving shrinks the bubble from 12% to 4%.",
    "    The model's differences between the pair (dp all-reduce, interleaving) are a few percent and go the",
    "    other way for 530B, so one set of constants cannot meet both sources: the model sits at the 2022",
    "    level (0.97-1.06 on korthikanti22's full-recompute rows) and every narayanan21 row inherits the gap;",
    "  * Megatron-LM's blocking pipeline exchange is not yet in the model's schedule: _communicate waits for",
    "    batch_isend_irecv, calls torch.cuda.synchronize() and then all-gathers the scatter/gather chunks",
    "    across TP, so the device idles for the send + all-gather after every forward and backward",
    "    (models.poseidon_cost.blocking_exchanges folds it in; wiring it into models/poseidon.py and the",
    "    search's own walk is pending): it moves the narayanan21 pipelined rows by 1-3% (530B 1.16 -> 1.13);",
    "  * 22B sel+SP (one micro-batch per iteration): the per-iteration terms weigh ~10% there; the",
    "    optimizer step moves Megatron's ~50 B/param (unscale + inf check 8, grad norm 4, Adam 28, fp32 ->",
    "    16-bit copy 6, zeroing 4) at the streaming fraction of HBM (models/poseidon.py);",
    "  * not modelled: kernel launches (17 per layer forward, a few us each, asynchronous and hidden behind",
    "    milliseconds of GPU work); the backward TP all-reduce is counted in full although Megatron (2022)",
    "    overlaps it with the weight-gradient GEMM: modelling that would make it faster still.",
]


def pipeline_seconds(row: dict[str, Any], d: dict[str, Any]) -> float:
    """Return the published seconds of one iteration of a row (iteration time as published, or Narayanan
    et al. eq. 3 FLOPs over the published TF/s per GPU times the GPUs)."""
    if row["metric"] == "iteration_time_s":
        return float(row["published"])
    flops = narayanan_flops(row["global_batch"], d["seq_len"], row["layers"], row["hidden"], d["vocab"])
    return flops / (row["published"] * 1e12 * row["gpus"])


def same_pipeline_pairs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return (narayanan21 row, korthikanti22 row) pairs that run the same pipeline: the same model,
    tp, pp, micro-batch, full recomputation and micro-batches per pipeline (they differ only in dp and
    interleaving), so each replica does the same work per iteration."""
    rows = doc["runs"]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        dp = r["gpus"] // (r["tp"] * r["pp"])
        return (r["layers"], r["hidden"], r["tp"], r["pp"], r["micro_batch"], r["global_batch"] // (r["micro_batch"] * dp))

    olds = [r for r in rows if r["source"] == "narayanan21"]
    news = [r for r in rows if r["source"] == "korthikanti22" and r["recompute"] == "full"]
    return [(a, b) for a in olds for b in news if key(a) == key(b)]


def pair_lines(doc: dict[str, Any]) -> list[str]:
    """Return one line per same-pipeline pair: each source's published iteration seconds, how much
    slower the narayanan21 run measured, and how much slower the model predicts it."""
    d = doc["defaults"]
    out = ["same pipeline in both sources (same model, tp, pp, micro-batch, micro-batches per pipeline; "
           "measured and predicted narayanan21 / korthikanti22 iteration time):"]
    for a, b in same_pipeline_pairs(doc):
        ta, tb = pipeline_seconds(a, d), pipeline_seconds(b, d)
        pa, pb = evaluate_row(a, d)["t"], evaluate_row(b, d)["t"]
        dpa, dpb = (r["gpus"] // (r["tp"] * r["pp"]) for r in (a, b))
        out.append(f"  {a['name']:<5} narayanan21 {ta:6.2f} s (dp {dpa}, v {a['interleave']}) vs korthikanti22 "
                   f"{tb:6.2f} s (dp {dpb}, v {b['interleave']}): measured {ta / tb:.3f}x, predicted {pa / pb:.3f}x")
    return out


def breakdown_lines(problem: Any, gpu: str, tp: int, b: int, published_fwd_ms: float) -> list[str]:
    """Return the per-operation forward/backward breakdown (ms and share of the forward) of one
    block of `problem` on `gpu` at TP `tp`, micro-batch `b`, and what the TP all-reduce achieves."""
    from gpuplan.models.poseidon import CostModel
    from gpuplan.models.poseidon_cost import layer_ops

    cm = CostModel(problem)
    ops = layer_ops(cm.cfg, cm.dev(gpu), problem.dtype, tp, b, problem.seq_len, cm.opts,
                    lambda op, size: cm.tp_collective_s(gpu, tp, op, size), cm.sweep(gpu))
    fwd = sum(o.forward_s for o in ops)
    out = [f"  per operation (baseline row; {len(ops)} ops, forward {fwd * 1e3:.2f} ms vs {published_fwd_ms} "
           "published):", f"    {'operation':<36}{'fwd ms':>8}{'bwd ms':>8}{'fwd %':>7}"]
    for o in ops:
        out.append(f"    {o.name:<36}{o.forward_s * 1e3:8.3f}{o.backward_s * 1e3:8.3f}{100 * o.forward_s / fwd:6.1f}%")
    size = b * problem.seq_len * cm.cfg.hidden * 2
    t = cm.tp_collective_s(gpu, tp, "all_reduce", size)
    out.append(f"    TP all-reduce of {size / 1e6:.1f} MB over {tp} GPUs: {t * 1e3:.3f} ms = "
               f"{size / t * 2 * (tp - 1) / tp / 1e9:.0f} GB/s bus bandwidth (NCCL model; nccl-tests on "
               "8x A100-SXM4-80GB NVSwitch reports ~200-230 GB/s)")
    return out


def layer_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Return one dict per Korthikanti et al. Table 4 row: its name, the problem, the published and
    predicted forward / backward seconds of one block (TP collectives and what the recomputation
    mode re-runs included) and the ratios published / predicted."""
    import gpuplan
    from gpuplan.models.poseidon import CostModel

    d, spec = doc["defaults"], doc["layer_runs"]
    lay = spec["layer"]
    out = []
    for row in spec["rows"]:
        run = {"name": "22B", "layers": 48, "hidden": lay["hidden"], "heads": lay["heads"], "gpus": lay["tp"],
               "global_batch": lay["micro_batch"], "sequence_parallel": row["sequence_parallel"], "pp": 1}
        problem = gpuplan.load_problem(problem_of(run, d))
        cm = CostModel(problem)
        f, g = cm.layer(d["gpu"], lay["tp"], lay["micro_batch"])
        g += cm.recompute_s(d["gpu"], lay["tp"], lay["micro_batch"], row["recompute"])
        out.append({"row": row, "problem": problem, "fwd_s": f, "bwd_s": g,
                    "fwd_ratio": row["forward_ms"] / (f * 1e3), "bwd_ratio": row["backward_ms"] / (g * 1e3)})
    return out


def layer_lines(doc: dict[str, Any]) -> list[str]:
    """Return the per-layer check against Korthikanti et al. Table 4 (one line per row, see
    `layer_rows`) followed by the per-operation breakdown of its first row."""
    d, spec = doc["defaults"], doc["layer_runs"]
    lay = spec["layer"]
    out = [f"one layer of the 22B model ({spec['source']} Table 4; tp {lay['tp']}, micro-batch {lay['micro_batch']}): "
           "published vs predicted ms, ratio = published / predicted time"]
    rows = layer_rows(doc)
    for r in rows:
        row, f, g, rf, rb = r["row"], r["fwd_s"], r["bwd_s"], r["fwd_ratio"], r["bwd_ratio"]
        out.append(f"  {row['name']:<24} fwd {row['forward_ms']:5.1f} vs {f * 1e3:5.2f} ({rf:.2f})   "
                   f"bwd {row['backward_ms']:5.1f} vs {g * 1e3:5.2f} ({rb:.2f})   "
                   f"{'yes' if max(abs(rf - 1), abs(rb - 1)) <= TOLERANCE else 'NO'}")
    out += breakdown_lines(rows[0]["problem"], d["gpu"], lay["tp"], lay["micro_batch"], rows[0]["row"]["forward_ms"])
    return out


def _gmean(xs: list[float]) -> float:
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ablation_lines() -> list[str]:
    """Return what each term of the per-operation model contributes: the runs within 15% and the
    geometric mean of the 18 ratios with that one term reverted to the earlier assumption (the GEMM
    epilogue overlapped on Ampere; weight gradients written once in 16 bits; 10 + 10 bytes per logit
    of cross-entropy), each alone, then all three."""
    from gpuplan.models import poseidon_cost as C

    doc = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    d, rows = doc["defaults"], doc["runs"]
    saved = (C.OVERLAPPED_EPILOGUE_ARCHS, C.MAIN_GRAD_BYTES, C.ce_bytes_per_logit)
    reverts = {"epilogue overlapped (roofline max)": {"epi": True},
               "weight gradients in 16 bits": {"grad": True},
               "cross-entropy 10 + 10 B/logit": {"ce": True},
               "all three": {"epi": True, "grad": True, "ce": True}}
    out = ["contribution of each term (reverted alone): runs within 15%, geometric mean of the ratios"]
    try:
        for name, r in [("as modelled", {})] + list(reverts.items()):
            C.OVERLAPPED_EPILOGUE_ARCHS = saved[0] + (("ampere",) if r.get("epi") else ())
            C.MAIN_GRAD_BYTES = 2.0 if r.get("grad") else saved[1]
            C.ce_bytes_per_logit = (lambda w: (w + 8.0, w + 8.0)) if r.get("ce") else saved[2]
            ratios = [evaluate_row(row, d)["ratio"] for row in rows]
            inside = sum(abs(x - 1.0) <= TOLERANCE for x in ratios)
            out.append(f"  {name:<38}{inside:>3}/{len(ratios)}   geometric mean {_gmean(ratios):.3f}")
    finally:
        C.OVERLAPPED_EPILOGUE_ARCHS, C.MAIN_GRAD_BYTES, C.ce_bytes_per_logit = saved
    return out


if __name__ == "__main__":
    for line in section_a():
        print(line, flush=True)
    if "--ablation" in sys.argv[1:]:
        for line in ablation_lines():
            print(line, flush=True)
