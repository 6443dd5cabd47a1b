"""Executing a Hetis plan on this machine: real attention heads on gloo processes emulating device types.

`run_plan(problem, plan)` (what `gpuplan run PLAN` calls) takes the plan's snapshot head map (the
trace's first requests, KV heads per attention device) onto a tiny model of the same head count:
rank 0 is the primary (it runs the dense part of each layer: QKV projection, output projection
and MLP, and the attention of the heads on the first stage's devices); every other rank is an attention
worker holding the KV caches of the heads dispatched to one attention device (at most
`max_workers`; further devices' heads join the worker of the same type, else the last one). Each
decode step, per layer, the primary ships each worker the queries of its heads, the workers compute
decode attention over their caches with torch and send the outputs back.

A device type slower than the fastest attention device is emulated as the Poseidon runner does: after
computing, a worker sleeps (factor - 1) times its compute time, factor = the ratio of HBM
bandwidths (decode attention is memory-bound). The prediction is the Hetis cost model's step,
sum over layers of dense + max(primary attention, max over workers of factor * attention) + the
workers' message round trips (the primary exchanges with them one after another), with the dense time, the attention line (a0 per request + a1 per head-token) and the
round trip calibrated on this machine in the same processes before the timed steps.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpuplan.errors import InputError
from gpuplan.models.base import Table


def _mapping(problem: Any, plan: Any, max_workers: int) -> tuple[list[list[int]], list[str], list[float], np.ndarray]:
    """Return (device ids per rank, type per rank, slowdown factor per rank, R x ranks head counts):
    rank 0 holds every primary device's heads."""
    from gpuplan.models.hetis import head_matrix
    from gpuplan.models.hetis.cost import gpus_of

    if not plan.head_map:
        raise InputError("this plan has no head map to execute (tensor-parallel baselines have none); run a "
                         "plan of hetis, hetis-lp, exact or heads-by-memory", field="head_map")
    n, bad = head_matrix(problem, plan)
    if bad:
        raise InputError(f"the plan's head map: {bad[0].message}", field="head_map")
    devs = sorted(plan.attention_devices)
    g = {x.id: x for x in gpus_of(problem)}
    prim = set(plan.replicas[0].stages[0].devices)  # the primary process runs the first stage's devices
    fastest = max(g[d].bandwidth_Bps for d in devs)
    ranks: list[list[int]] = [[]]
    for d in devs:
        if d in prim:
            ranks[0].append(d)
    workers = sorted((d for d in devs if d not in prim and n[:, devs.index(d)].sum() > 0),
                     key=lambda d: (-int(n[:, devs.index(d)].sum()), d))
    for d in workers[:max_workers]:
        ranks.append([d])
    for d in workers[max_workers:]:
        same = [k for k in range(1, len(ranks)) if g[ranks[k][0]].type == g[d].type]
        ranks[same[0] if same else len(ranks) - 1].append(d)
    heads = np.zeros((n.shape[0], len(ranks)), dtype=np.int64)
    for k, ds in enumerate(ranks):
        for d in ds:
            heads[:, k] += n[:, devs.index(d)]
    types = [g[ds[0]].type if ds else "primary" for ds in ranks]
    factors = [fastest / g[ds[0]].bandwidth_Bps if ds else 1.0 for ds in ranks]
    return ranks, types, factors, heads


def _time(fn: Any, repeats: int = 7) -> float:
    """Return the median wall time (s) of fn() over `repeats` runs after one warm-up."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return float(np.median(out))


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One process of the run (rank 0: primary, others: attention workers); returns its calibration and,
    on rank 0, the measured step times."""
    import torch
    import torch.distributed as dist

    from gpuplan.profiling.serving import decode_attention

    torch.manual_seed(spec["seed"] + rank)
    d, L = spec["head_dim"], spec["layers"]
    heads = np.array(spec["heads"])            # R x ranks
    ctx = spec["ctx"]
    R = heads.shape[0]
    mine = heads[:, rank]
    caches = [[(torch.randn(int(mine[r]), ctx[r], d), torch.randn(int(mine[r]), ctx[r], d)) for r in range(R)]
              for _ in range(L)]

    def attend(layer: int, q: list[Any]) -> list[Any]:
        return [decode_attention(q[r].unsqueeze(1), caches[layer][r][0], caches[layer][r][1]).squeeze(1)
                if mine[r] else q[r] for r in range(R)]

    factor = spec["factors"][rank]
    out: dict[str, Any] = {"rank": rank}
    H = int(heads.sum(axis=1)[0])
    hidden = H * d
    if rank == 0:
        wqkv = torch.randn(hidden, 3 * hidden) / hidden ** 0.5
        wo = torch.randn(hidden, hidden) / hidden ** 0.5
        up = torch.randn(hidden, 4 * hidden) / hidden ** 0.5
        down = torch.randn(4 * hidden, hidden) / hidden ** 0.5
        x = torch.randn(R, hidden)
    # calibration, one process at a time (the others wait in a barrier and use no core): the attention
    # line a0 (per request call) + a1 (per head-token), and on the primary the dense part of a layer
    probe = [(torch.randn(4, 128, d), torch.randn(4, 128, d)), (torch.randn(4, 1024, d), torch.randn(4, 1024, d))]
    qp = torch.randn(4, 1, d)
    with torch.inference_mode():
        for turn in range(world):
            dist.barrier()
            if turn != rank:
                continue
            t_small = _time(lambda: decode_attention(qp, *probe[0]), 15)
            t_big = _time(lambda: decode_attention(qp, *probe[1]), 15)
            out["a1_s"] = max(0.0, (t_big - t_small) / (4 * (1024 - 128)))
            out["a0_s"] = max(0.0, t_small - out["a1_s"] * 4 * 128)
            if rank == 0:
                out["dense_layer_s"] = _time(lambda: ((x @ wqkv)[:, :hidden] @ wo + x) @ up @ down, 15)
        dist.barrier()
        if rank == 0:
            rtt = []
            for w in range(1, world):
                ping = torch.zeros(R, 1, d)

                def roundtrip(w: int = w, ping: Any = ping) -> None:
                    dist.send(ping, w)
                    dist.recv(ping, w)
                rtt.append(_time(roundtrip, 9))
            out["rtt_s"] = rtt
            steps = []
            for step in range(spec["warmup"] + spec["steps"]):
                t0 = time.perf_counter()
                h = x
                for layer in range(L):
                    qkv = h @ wqkv
                    q = qkv[:, :hidden].reshape(R, H, d)
                    start = np.zeros(R, dtype=np.int64)
                    parts = []
                    for k in range(world):
                        parts.append([q[r, start[r]:start[r] + heads[r, k]] for r in range(R)])
                        start += heads[:, k]
                    for w in range(1, world):  # one message per worker and layer: its heads of every request
                        dist.send(torch.cat(parts[w]).contiguous(), w)
                    local = attend(layer, parts[0])
                    got: list[list[Any]] = [[] for _ in range(world)]
                    for w in range(1, world):
                        buf = torch.empty(int(heads[:, w].sum()), d)
                        dist.recv(buf, w)
                        got[w] = list(torch.split(buf, heads[:, w].tolist()))
                    o = torch.cat([torch.cat([local[r]] + [got[w][r] for w in range(1, world)]).reshape(1, -1)
                                   for r in range(R)])
                    h = (o @ wo + h) @ up @ down
                if step >= spec["warmup"]:
                    steps.append(time.perf_counter() - t0)
            out["steps_s"] = steps
        else:
            for _ in range(9 + 1):  # the round-trip calibration (one warm-up + 9)
                ping = torch.zeros(R, 1, d)
                dist.recv(ping, 0)
                dist.send(ping, 0)
            for _ in range(spec["warmup"] + spec["steps"]):
                for layer in range(L):
                    buf = torch.empty(int(mine.sum()), d)
                    dist.recv(buf, 0)
                    q = list(torch.split(buf, mine.tolist()))
                    t0 = time.perf_counter()
                    o = attend(layer, q)
                    spent = time.perf_counter() - t0
                    if factor > 1:
                        time.sleep((factor - 1) * spent)
                    dist.send(torch.cat([o[r] for r in range(R) if mine[r]]).contiguous(), 0)
    return out


def run_plan(problem: Any, plan: Any, *, command: list[str] | None = None, steps: int = 5, warmup: int = 2,
             layers: int = 2, head_dim: int = 32, max_ctx: int = 512, max_workers: int = 3, seed: int = 0,
             timeout_s: float = 300.0) -> dict[str, Any]:
    """Execute the plan's snapshot decode batch on gloo processes (see the module docstring); return
    measured and predicted per-step latency (s), their relative error, per-rank heads and factors, and
    the report tables. A `command` is refused: a Hetis plan runs its own emulation."""
    if command:
        raise InputError("a hetis plan runs its own emulation; it launches no command", field="command",
                         value=command)
    from gpuplan.models.hetis import head_matrix  # noqa: F401  (validated by _mapping)
    from gpuplan.runtime.launch import run_workers
    from gpuplan.runtime.report import TOLERANCE, off, pct, rel_error

    for name, v, lo, hi in (("steps", steps, 1, 1000), ("warmup", warmup, 0, 100), ("layers", layers, 1, 64),
                            ("head_dim", head_dim, 4, 256), ("max_ctx", max_ctx, 16, 8192),
                            ("max_workers", max_workers, 1, 8)):
        if not lo <= v <= hi:
            raise InputError(f"run option {name}: {v}; expected {lo}..{hi}", field=name, value=v)
    ranks, types, factors, heads = _mapping(problem, plan, max_workers)
    req = problem.requests()
    R = heads.shape[0]
    ctx = [int(min(max_ctx, req.prompt_tokens[r] + problem.o_pred() / 2)) for r in range(R)]
    world = len(ranks)
    spec = {"heads": heads.tolist(), "ctx": ctx, "head_dim": head_dim, "layers": layers, "factors": factors,
            "steps": steps, "warmup": warmup, "seed": seed}
    res = run_workers(_worker, world, args=(spec,), threads=1, timeout_s=timeout_s)
    prim = res[0]
    measured = float(np.median(prim["steps_s"]))

    def att(k: int) -> float:
        c = res[k]
        return sum(c["a0_s"] + c["a1_s"] * heads[r, k] * ctx[r] for r in range(R) if heads[r, k])

    per_rank = [att(0)] + [factors[k] * att(k) for k in range(1, world)]
    # the primary sends to and receives from the workers one after another: their round trips add up
    predicted = layers * (prim["dense_layer_s"] + max(per_rank) + sum(prim["rtt_s"]))
    err = rel_error(predicted, measured)
    rows = [[k, ",".join(map(str, ranks[k])) or "-", types[k], factors[k], int(heads[:, k].sum()),
             1e3 * per_rank[k]] for k in range(world)]
    report = [Table("ranks (rank 0: primary with the primary devices' heads)",
                    ["rank", "devices", "type", "slowdown", "heads (snapshot)", "attention ms/layer"], rows),
              Table("decode step: predicted vs measured", ["measure", "predicted", "measured", "error"],
                    [["step_s", predicted, measured, pct(err)]])]
    warnings = []
    if off(predicted, measured):
        warnings.append(f"the predicted step is {pct(err)} off the measured one (tolerance {TOLERANCE:.0%}); on a "
                        "busy machine the processes wait for cores")
    return {"measured_step_s": measured, "predicted_step_s": float(predicted), "relative_error": float(err),
            "ranks": world, "requests": R, "layers": layers, "dense_layer_s": prim["dense_layer_s"],
            "rtt_s": [float(x) for x in prim["rtt_s"]], "factors": [float(f) for f in factors], "report": report, "warnings": warnings}
