"""Lagom on real GPUs: calibrate with NCCL, then predicted vs measured compute slowdown per (channels, threads).

Run on a machine with >= 2 CUDA GPUs: .venv/bin/python benchmarks/lagom_gpu.py [--quick]
(on fewer GPUs it says so and measures nothing). Steps, a few minutes in all:
1. all_reduce among the local GPUs per size and channel count (NCCL_MIN_CTAS = NCCL_MAX_CTAS),
   fitted to the model: per-channel bandwidth, link cap, latency scale;
2. a matmul loop alone and under back-to-back all_reduces for several (channels, threads): the
   measured slowdown next to the model's, with MAPE and Spearman rho, and the fitted kappa/occ_floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuplan.models.lagom import cost  # noqa: E402
from gpuplan.models.base import Table  # noqa: E402
from gpuplan.profiling.lagom_calib import fit_collective, fit_interference, measure_collectives, \
    measure_interference  # noqa: E402
from gpuplan.render import table_text  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import numpy as np
    import torch
    from scipy.stats import spearmanr

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(f"lagom_gpu: needs at least 2 CUDA GPUs for NCCL, found {gpus}; nothing measured")
        return
    world = min(gpus, 8)
    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, float(getattr(props, "L2_cache_size", 50 * 2**20))
    sizes = [2**k for k in range(16, 29, 4 if args.quick else 2)]
    channels = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    points = measure_collectives(world, sizes, channels, backend="nccl", repeats=5)
    guess = cost.Link(ranks=world, nodes=1, intra="nvlink", channel_GBps=20.0, cap_GBps=300.0, channels=16)
    fit = fit_collective(points, "all_reduce", guess, cost.Consts())
    print(table_text(Table(f"all_reduce fit, {world} x {props.name}", ["field", "value"],
                           [[k, v] for k, v in fit.items()])))
    link = cost.Link(ranks=world, nodes=1, intra="nvlink", channel_GBps=fit["channel_GBps"], cap_GBps=fit["cap_GBps"],
                     channels=16, latency_scale=fit["latency_scale"])
    dev = cost.Device(sms, 3350.0, l2)
    size = 256 * 2**20
    sweep = [(1, 256), (4, 256), (8, 512), (16, 512)] if args.quick else \
        [(1, 128), (2, 256), (4, 256), (8, 256), (8, 512), (16, 512), (32, 512)]
    rows, measured, predicted = [], [], []
    for nc, nt in sweep:
        res = measure_interference(world, matmul_n=8192, iters=20, size_bytes=size, channels=nc, threads=nt,
                                   backend="nccl")
        model = float(cost.slowdown("all_reduce", size, "ring", "Simple", link, cost.Consts(), dev, 0.0, nc, nt,
                                    2 * 2**20))
        rows.append([nc, nt, res["alone_s"] * 1e3, res["overlapped_s"] * 1e3, res["slowdown"], model])
        measured.append(res["slowdown"])
        predicted.append(model)
    inter = fit_interference([(r[0], r[1], r[4]) for r in rows], sms)
    mape = float(np.mean(np.abs(np.array(predicted) / np.array(measured) - 1)))
    print(table_text(Table("matmul slowdown under all_reduce (256 MiB, ring/Simple)",
                           ["channels", "threads", "alone ms", "overlapped ms", "measured", "model"], rows)))
    print(f"MAPE {100 * mape:.1f} %, Spearman rho {spearmanr(measured, predicted)[0]:.2f}; "
          f"fitted kappa {inter['kappa']:.3f}, occ_floor {inter['occ_floor']:.3f}")


if __name__ == "__main__":
    main()
