"""Lagom calibration and execution: fits recover known constants; the runner applies the plan's env."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from gpuplan.io import read_document
from gpuplan.models.lagom import cost
from gpuplan.models.base import validate
from gpuplan.models.lagom import LagomProblem
from gpuplan.profiling.lagom_calib import fit_collective, fit_interference
from gpuplan.runtime import lagom as runtime
from gpuplan.solvers.lagom import solve_lagom

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lagom"


def test_fit_collective_recovers_known_constants() -> None:
    truth = cost.Link(ranks=8, nodes=1, intra="nvlink", channel_GBps=21.0, cap_GBps=300.0, channels=16,
                      latency_scale=1.7)
    c = cost.Consts()
    rng = np.random.default_rng(3)
    points = []
    for size in [2**k for k in range(14, 31, 2)]:
        for nc in (1, 2, 4, 8, 16, 24):
            t = cost.comm_time_us("all_reduce", size, "ring", "Simple", truth, c, nc, 512, 2 * 2**20)
            points.append((size, nc, float(t) * 1e-6 * (1 + rng.normal(0, 0.01))))
    guess = cost.Link(ranks=8, nodes=1, intra="nvlink", channel_GBps=5.0, cap_GBps=100.0, channels=16)
    fit = fit_collective(points, "all_reduce", guess, c)
    assert fit["channel_GBps"] == pytest.approx(21.0, rel=0.05)
    assert fit["cap_GBps"] == pytest.approx(300.0, rel=0.05)
    assert fit["latency_scale"] == pytest.approx(1.7, rel=0.1)
    assert fit["max_rel_error"] < 0.05


def test_fit_interference_recovers_kappa_and_floor() -> None:
    sms, kappa, floor = 132, 1.3, 0.4
    pts = []
    for nc in (1, 4, 8, 16, 32):
        for nt in (128, 256, 512):
            occ = floor + (1 - floor) * nt / 640
            pts.append((nc, nt, sms / (sms - kappa * nc * occ)))
    fit = fit_interference(pts, sms)
    assert fit["kappa"] == pytest.approx(kappa, rel=1e-6)
    assert fit["occ_floor"] == pytest.approx(floor, rel=1e-6)


def test_nccl_options_absent_without_nccl() -> None:
    import torch.distributed as dist

    opts = runtime.nccl_options({"min_ctas": 2, "max_ctas": 8, "cga_cluster_size": 4})
    if not dist.is_nccl_available():
        assert opts is None
    else:
        assert opts.config.min_ctas == 2 and opts.config.max_ctas == 8


def test_runner_launches_command_with_plan_env(tmp_path) -> None:
    path = EXAMPLES / "small.yaml"
    p = validate(LagomProblem, read_document(path), file=path)
    plan = solve_lagom(p)
    out = tmp_path / "env.txt"
    code = ("import os, sys; open(sys.argv[1], 'w').write("
            "os.environ['NCCL_ALGO'] + '|' + os.environ['NCCL_MAX_CTAS'])")
    res = runtime.run(p, plan, command=[sys.executable, "-c", code, str(out)])
    assert res["returncode"] == 0
    assert out.read_text() == plan.env["NCCL_ALGO"] + "|" + plan.env["NCCL_MAX_CTAS"]
    assert runtime.run(p, plan, command=[sys.executable, "-c", "raise SystemExit(3)"])["returncode"] == 3


def _group_worker(rank: int, world: int, plan_json: str) -> int:
    import torch
    import torch.distributed as dist

    from gpuplan.models.lagom import LagomPlan

    plan = LagomPlan.model_validate_json(plan_json)
    group = runtime.new_group(plan, "dp", list(range(world)))
    t = torch.ones(4)
    dist.all_reduce(t, group=group)
    return int(t[0].item())


@pytest.mark.slow
def test_groups_and_cpu_calibration_run_with_gloo() -> None:
    from gpuplan.profiling.lagom_calib import measure_collectives, measure_interference
    from gpuplan.runtime.launch import run_workers

    path = EXAMPLES / "small.yaml"
    plan = solve_lagom(validate(LagomProblem, read_document(path), file=path))
    assert run_workers(_group_worker, 2, args=(plan.model_dump_json(),)) == [2, 2]
    points = measure_collectives(2, [2**12, 2**16, 2**20], backend="gloo", repeats=3)
    assert len(points) == 3 and all(t > 0 and nc == 1 for _, nc, t in points)
    inter = measure_interference(2, matmul_n=128, iters=10, size_bytes=2**20, backend="gloo")
    assert inter["alone_s"] > 0 and inter["overlapped_s"] > 0 and inter["slowdown"] > 0
