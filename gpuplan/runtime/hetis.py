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
bandwidths (decode attention is memory-bound).

The prediction is the Hetis cost model's step with every term measured on this machine, in the same
processes, before the timed steps (compute terms by the thread's CPU time, so other jobs waiting for
the cores do not inflate them): per layer,

    dense + bookkeeping + max(A_0, max over workers w of (rtt_w + factor_w x A_w + late_w))

dense: the primary's QKV, output projection and MLP; bookkeeping: splitting the queries by rank and
joining the outputs (timed after a dense layer, as the run meets it); A_k = sum over the requests
with heads on rank k of a0 + a1 x heads x context: a0 per attention call, a1 per head-token timed on
probe caches larger than the CPU's last-level cache (the run's caches are: decode attention reads its
KV from memory; the earlier cache-resident probes priced it 2-6x too cheap, the main cause of the
-21 % to -54 % misses); rtt_w: the round trip of worker w's real message, timed after the primary
computed a dense layer (the worker sat blocked in its receive, so its wake-up is part of it); late_w:
how much longer than asked the worker's emulated sleep lasts (gpuplan.runtime.poseidon.sleep_overshoot_s
at its own sleep length). The run records the same terms as measured phases (wall and CPU time) and
the machine's contention (gpuplan.runtime.contention): on a contended machine the wall times include
waiting for cores and wake-ups behind other jobs, and the comparison is not judged.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpuplan.errors import InputError
from gpuplan.models.base import Table

# probe caches of the attention calibration, bytes in all: beyond a CPU's last-level cache (32 MiB here)
STREAM_BYTES = 128 << 20
# round trips timed per worker in the calibration
RTT_SAMPLES = 9


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


def _time(fn: Any, repeats: int = 7, *, clock: Any = time.perf_counter, after: Any = None) -> float:
    """Return the median time (s, by `clock`: wall by default, time.thread_time for the calling thread's
    CPU time) of fn() over `repeats` runs after one warm-up; `after`, when given, runs untimed before each
    call (the operation the run does before it, so fn meets the caches as in the run)."""
    fn()
    out = []
    for _ in range(repeats):
        if after is not None:
            after()
        t = clock()
        fn()
        out.append(clock() - t)
    return float(np.median(out))


def _split_queries(q: Any, heads: np.ndarray) -> list[list[Any]]:
    """Return, per rank, the list over requests of the query rows of its heads (q: R x H x d)."""
    R, world = heads.shape
    start = np.zeros(R, dtype=np.int64)
    parts = []
    for k in range(world):
        parts.append([q[r, start[r]:start[r] + heads[r, k]] for r in range(R)])
        start += heads[:, k]
    return parts


def _assemble(local: list[Any], got: list[list[Any]], R: int) -> Any:
    """Return the R x hidden attention output from the primary's heads and each worker's (in rank order)."""
    import torch

    world = len(got)
    return torch.cat([torch.cat([local[r]] + [got[w][r] for w in range(1, world)]).reshape(1, -1) for r in range(R)])


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One process of the run (rank 0: primary, others: attention workers); returns its calibration and,
    on rank 0, the measured step times and their phases (seconds per step, summed over layers)."""
    import torch
    import torch.distributed as dist

    from gpuplan.profiling.serving import decode_attention
    from gpuplan.runtime.poseidon import sleep_overshoot_s

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
    clock, cpu = time.perf_counter, time.thread_time
    if rank == 0:
        wqkv = torch.randn(hidden, 3 * hidden) / hidden ** 0.5
        wo = torch.randn(hidden, hidden) / hidden ** 0.5
        up = torch.randn(hidden, 4 * hidden) / hidden ** 0.5
        down = torch.randn(4 * hidden, hidden) / hidden ** 0.5
        x = torch.randn(R, hidden)
    # calibration, one process at a time (the others wait in a barrier and use no core). The attention line:
    # a0 per request call (tiny tensors) and a1 per head-token read from memory, timed on probe caches of
    # STREAM_BYTES in all (beyond a CPU's last-level cache, as the run's caches are: decode attention reads
    # its KV from memory; cache-resident probes under-priced it several-fold). On the primary the dense part
    # of a layer and the layer's bookkeeping (splitting queries by rank, joining outputs); on a worker how
    # late its emulated sleep ends (its own sleep length)
    chunk_tokens, chunk_heads = 1024, 4
    n_chunks = max(2, STREAM_BYTES // (2 * chunk_heads * chunk_tokens * d * 4))
    stream = [(torch.randn(chunk_heads, chunk_tokens, d), torch.randn(chunk_heads, chunk_tokens, d))
              for _ in range(n_chunks)]
    tiny = (torch.randn(1, 1, d), torch.randn(1, 1, d))
    qp, q1 = torch.randn(chunk_heads, 1, d), torch.randn(1, d)
    with torch.inference_mode():
        for turn in range(world):
            dist.barrier()
            if turn != rank:
                continue
            out["a0_s"] = _time(lambda: decode_attention(q1.unsqueeze(1), *tiny).squeeze(1), 25, clock=cpu)
            per_chunk = _time(lambda: [decode_attention(qp, k, v) for k, v in stream], 5, clock=cpu) / n_chunks
            out["a1_s"] = max(0.0, per_chunk - out["a0_s"]) / (chunk_heads * chunk_tokens)
            own = sum(out["a0_s"] + out["a1_s"] * mine[r] * ctx[r] for r in range(R) if mine[r])
            out["attention_line_s"] = own
            if rank == 0:
                def dense() -> Any:
                    return ((x @ wqkv)[:, :hidden] @ wo + x) @ up @ down
                out["dense_layer_s"] = _time(dense, 15, clock=cpu)
                qkv0 = x @ wqkv
                fake = [[]] + [list(torch.split(torch.randn(int(heads[:, w].sum()), d), heads[:, w].tolist()))
                               for w in range(1, world)]

                def book() -> None:
                    parts = _split_queries(qkv0[:, :hidden].reshape(R, H, d), heads)
                    for w in range(1, world):
                        torch.cat(parts[w]).contiguous()
                    _assemble(parts[0], fake, R)
                out["book_layer_s"] = _time(book, 15, clock=cpu, after=dense)
            elif factor > 1:
                out["sleep_late_s"] = sleep_overshoot_s((factor - 1) * own, 30)
        del stream
        dist.barrier()
        if rank == 0:
            # each worker's round trip with its real message size, timed as the run meets it: after the
            # primary computed a dense layer while the worker sat blocked in its receive (its core may have
            # gone idle or to another process: the wake-up is part of the round trip)
            rtt = []
            for w in range(1, world):
                ping = torch.zeros(int(heads[:, w].sum()), d)
                got = []
                for _ in range(RTT_SAMPLES + 1):
                    dense()
                    t = clock()
                    dist.send(ping, w)
                    dist.recv(ping, w)
                    got.append(clock() - t)
                rtt.append(float(np.median(got[1:])))
            out["rtt_s"] = rtt
            steps, phases = [], []
            for step in range(spec["warmup"] + spec["steps"]):
                t0 = clock()
                ph = dict.fromkeys(("dense", "book", "send", "local", "wait", "dense_cpu", "book_cpu", "local_cpu"),
                                   0.0)
                h = x
                for layer in range(L):
                    ca = cpu()
                    a = clock()
                    qkv = h @ wqkv
                    b, cb = clock(), cpu()
                    parts = _split_queries(qkv[:, :hidden].reshape(R, H, d), heads)
                    msgs = [torch.cat(parts[w]).contiguous() for w in range(1, world)]
                    c, cc = clock(), cpu()
                    for w in range(1, world):  # one message per worker and layer: its heads of every request
                        dist.send(msgs[w - 1], w)
                    e, ce = clock(), cpu()
                    local = attend(layer, parts[0])
                    f, cf = clock(), cpu()
                    got: list[list[Any]] = [[] for _ in range(world)]
                    for w in range(1, world):
                        buf = torch.empty(int(heads[:, w].sum()), d)
                        dist.recv(buf, w)
                        got[w] = list(torch.split(buf, heads[:, w].tolist()))
                    g_, cg = clock(), cpu()
                    o = _assemble(local, got, R)
                    i, ci = clock(), cpu()
                    h = (o @ wo + h) @ up @ down
                    j, cj = clock(), cpu()
                    ph["dense"] += (b - a) + (j - i)
                    ph["book"] += (c - b) + (i - g_)
                    ph["send"] += e - c
                    ph["local"] += f - e
                    ph["wait"] += g_ - f
                    ph["dense_cpu"] += (cb - ca) + (cj - ci)
                    ph["book_cpu"] += (cc - cb) + (ci - cg)
                    ph["local_cpu"] += cf - ce
                if step >= spec["warmup"]:
                    steps.append(clock() - t0)
                    phases.append(ph)
            out["steps_s"] = steps
            out["phases_s"] = {k: float(np.median([p[k] for p in phases])) for k in phases[0]}
        else:
            for _ in range(RTT_SAMPLES + 1):  # the round-trip calibration (one warm-up)
                ping = torch.zeros(int(mine.sum()), d)
                dist.recv(ping, 0)
                dist.send(ping, 0)
            late, busy, busy_cpu = [], [], []
            for step in range(spec["warmup"] + spec["steps"]):
                for layer in range(L):
                    buf = torch.empty(int(mine.sum()), d)
                    dist.recv(buf, 0)
                    q = list(torch.split(buf, mine.tolist()))
                    t0, c0 = clock(), cpu()
                    o = attend(layer, q)
                    spent = clock() - t0
                    busy_cpu.append(cpu() - c0)
                    if factor > 1:
                        t1 = clock()
                        time.sleep((factor - 1) * spent)
                        late.append(clock() - t1 - (factor - 1) * spent)
                    busy.append(spent)
                    dist.send(torch.cat([o[r] for r in range(R) if mine[r]]).contiguous(), 0)
            out["measured_attention_layer_s"] = float(np.median(busy))
            out["measured_attention_layer_cpu_s"] = float(np.median(busy_cpu))
            out["measured_sleep_late_s"] = float(np.median(late)) if late else 0.0
    return out


def _predict(spec: dict[str, Any], res: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the predicted decode step (s) and its per-layer terms from the calibration of every rank:
    dense + bookkeeping + max(the primary's attention line, max over workers of round trip + factor x
    attention line + late sleep)."""
    heads, ctx, factors = np.array(spec["heads"]), spec["ctx"], spec["factors"]
    R, world = heads.shape

    def att(k: int) -> float:
        c = res[k]
        return sum(c["a0_s"] + c["a1_s"] * heads[r, k] * ctx[r] for r in range(R) if heads[r, k])

    prim = res[0]
    path = [att(0)] + [prim["rtt_s"][k - 1] + factors[k] * att(k) + res[k].get("sleep_late_s", 0.0)
                       for k in range(1, world)]
    terms = {"dense": prim["dense_layer_s"], "book": prim["book_layer_s"], "local": att(0),
             "exchange": max(0.0, max(path) - att(0))}
    return {"per_rank_s": [att(0)] + [factors[k] * att(k) for k in range(1, world)], "path_s": path,
            "terms_s": terms, "step_s": spec["layers"] * (terms["dense"] + terms["book"] + max(path))}


def run_plan(problem: Any, plan: Any, *, command: list[str] | None = None, steps: int = 5, warmup: int = 2,
             layers: int = 2, head_dim: int = 32, max_ctx: int = 512, max_workers: int = 3, seed: int = 0,
             quiet_wait_s: float = 0.0, timeout_s: float = 300.0) -> dict[str, Any]:
    """Execute the plan's snapshot decode batch on gloo processes (see the module docstring); return
    measured and predicted per-step latency (s), their relative error, the per-layer terms predicted and
    measured (s), per-rank heads and factors, how busy the machine was (gpuplan.runtime.contention), and
    the report tables. `quiet_wait_s`: wait up to this long for other processes to leave the cores
    before launching. A `command` is refused: a Hetis plan runs its own emulation."""
    if command:
        raise InputError("a hetis plan runs its own emulation; it launches no command", field="command",
                         value=command)
    from gpuplan.runtime import contention
    from gpuplan.runtime.launch import run_workers
    from gpuplan.runtime.report import TOLERANCE, contention_warnings, machine_table, off, pct, rel_error

    for name, v, lo, hi in (("steps", steps, 1, 1000), ("warmup", warmup, 0, 100), ("layers", layers, 1, 64),
                            ("head_dim", head_dim, 4, 256), ("max_ctx", max_ctx, 16, 8192),
                            ("max_workers", max_workers, 1, 8), ("quiet_wait_s", quiet_wait_s, 0, 3600)):
        if not (isinstance(v, (int, float)) and np.isfinite(v) and lo <= v <= hi):
            raise InputError(f"run option {name}: {v}; expected {lo}..{hi}", field=name, value=v)
    ranks, types, factors, heads = _mapping(problem, plan, max_workers)
    req = problem.requests()
    R = heads.shape[0]
    ctx = [int(min(max_ctx, req.prompt_tokens[r] + problem.o_pred() / 2)) for r in range(R)]
    world = len(ranks)
    spec = {"heads": heads.tolist(), "ctx": ctx, "head_dim": head_dim, "layers": layers, "factors": factors,
            "steps": steps, "warmup": warmup, "seed": seed}
    before = contention.wait_quiet(quiet_wait_s)[0] if quiet_wait_s > 0 else contention.quiet_window()
    with contention.ContentionMonitor() as monitor:
        res = run_workers(_worker, world, args=(spec,), threads=1, timeout_s=timeout_s)
    prim = res[0]
    measured = float(np.median(prim["steps_s"]))
    pred = _predict(spec, res)
    predicted = float(pred["step_s"])
    err = rel_error(predicted, measured)
    ph = prim["phases_s"]
    got = {"dense": ph["dense"] / layers, "book": ph["book"] / layers, "local": ph["local"] / layers,
           "exchange": (ph["send"] + ph["wait"]) / layers}
    got_cpu = {"dense": ph["dense_cpu"] / layers, "book": ph["book_cpu"] / layers, "local": ph["local_cpu"] / layers}
    machine = contention.report(before, monitor.window, prim["steps_s"])
    rows = [[k, ",".join(map(str, ranks[k])) or "-", types[k], factors[k], int(heads[:, k].sum()),
             1e3 * pred["per_rank_s"][k],
             1e3 * (res[k]["measured_attention_layer_s"] * factors[k] if k else got["local"]),
             1e3 * res[k].get("sleep_late_s", 0.0), 1e3 * res[k].get("measured_sleep_late_s", 0.0)]
            for k in range(world)]
    names = {"dense": "dense (QKV, out projection, MLP)", "book": "splitting queries, joining outputs",
             "local": "primary's heads (attention)",
             "exchange": "waiting for the workers (sends, round trips, their attention and late sleeps)"}
    terms = [[names[k], 1e3 * pred["terms_s"][k], 1e3 * got[k], pct(rel_error(pred["terms_s"][k], got[k]))
              if got[k] > 0 else "-", 1e3 * got_cpu[k] if k in got_cpu else "-"] for k in names]
    report = [Table("ranks (rank 0: primary with the primary devices' heads)",
                    ["rank", "devices", "type", "slowdown", "heads (snapshot)", "attention ms/layer predicted",
                     "measured", "late sleep ms predicted", "measured"], rows),
              Table("one layer of the decode step: predicted terms vs measured phases (ms)",
                    ["term", "predicted", "measured", "error", "its CPU time (no waiting for a core)"], terms),
              Table("decode step: predicted vs measured", ["measure", "predicted", "measured", "error"],
                    [["step_s", predicted, measured, pct(err)]]),
              machine_table(machine)]
    warnings = contention_warnings(machine)
    if off(predicted, measured):
        warnings.append(f"the predicted step is {pct(err)} off the measured one (tolerance {TOLERANCE:.0%})")
    return {"measured_step_s": measured, "predicted_step_s": predicted, "relative_error": float(err),
            "ranks": world, "requests": R, "layers": layers, "dense_layer_s": prim["dense_layer_s"],
            "book_layer_s": prim["book_layer_s"], "rtt_s": [float(x) for x in prim["rtt_s"]],
            "sleep_late_s": [float(r.get("sleep_late_s", 0.0)) for r in res],
            "a0_s": [float(r["a0_s"]) for r in res], "a1_s": [float(r["a1_s"]) for r in res],
            "predicted_terms_s": {k: float(v) for k, v in pred["terms_s"].items()},
            "measured_terms_s": {k: float(v) for k, v in got.items()},
            "measured_terms_cpu_s": {k: float(v) for k, v in got_cpu.items()}, "steps_s": [float(x) for x in prim["steps_s"]],
            "factors": [float(f) for f in factors], "machine": machine, "report": report, "warnings": warnings}
