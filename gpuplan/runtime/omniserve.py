"""OmniServe on this machine: BE attention really computed by CPU worker processes with torch while a
"GPU" process runs the dense modules of a tiny model, with queues between them (piggybacking).

The GPU process loops over iterations; in each it walks the layers; at layer l it merges the BE rows
whose layer-l attention came back from a worker (at most one layer per request per iteration, as the
model states), runs out-projection + MLP + the next layer's QKV for them beside `ls_tokens` LS rows,
and ships each merged request's next query to its worker. A request that finishes its last layer emits
a token. Workers hold the BE requests' KV caches and answer queries with scaled dot-product attention.

Measured BE tokens/s is compared with the OmniServe latency model's prediction from figures profiled
in the same run: f_D (staircase over tokens, per layer), the CPU attention time (line in KV tokens)
and the per-row queue cost:  T = sum_l f_D(n_ls + b_l) + rows * c_q,  tokens/s = rows / (L T),
with rows = B L / (L + 1) when the workers keep pace (a request's next-token query leaves at the end of
an iteration, so each token takes L + 1 iterations), else the rows the workers finish within T.
"""

from __future__ import annotations

import math
import queue
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.errors import InputError


@dataclass(frozen=True)
class TinyShape:
    """The emulated model: layers, hidden width, attention heads (= KV heads), head width, MLP width."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    head_dim: int = 64
    ffn: int = 688


class TinyModel:
    """Dense weights of a tiny transformer (fp32, CPU): QKV, out-projection and a gated MLP per layer."""

    def __init__(self, shape: TinyShape = TinyShape(), seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        h, f = shape.hidden, shape.ffn
        qkv = 3 * shape.heads * shape.head_dim
        s = 1.0 / math.sqrt(h)
        self.shape = shape
        self.w = [{"qkv": torch.randn(h, qkv, generator=g) * s, "o": torch.randn(h, h, generator=g) * s,
                   "up": torch.randn(h, 2 * f, generator=g) * s, "down": torch.randn(f, h, generator=g) / math.sqrt(f)}
                  for _ in range(shape.layers)]

    def dense(self, layer: int, attn_out: Any, resid: Any) -> tuple[Any, Any]:
        """Return (the next layer's QKV, the new residual) of rows after attention at `layer` (torch tensors)."""
        import torch

        w = self.w[layer]
        x = resid + attn_out @ w["o"]
        a, b = (x @ w["up"]).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(a) * b) @ w["down"]
        nxt = self.w[(layer + 1) % self.shape.layers]
        return x @ nxt["qkv"], x


def _min_times(fns: list[Any], repeats: int) -> np.ndarray:
    """Return the least time (s) of each function over `repeats` interleaved passes (one call of each per
    pass, after a warm-up): on a shared machine the minimum is the call least disturbed by other jobs, and
    interleaving spreads a burst of load over every sample instead of a few."""
    for fn in fns:
        fn()
    best = np.full(len(fns), math.inf)
    for _ in range(repeats):
        for j, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[j] = min(best[j], time.perf_counter() - t0)
    return best


def profile_dense(model: TinyModel, tokens: np.ndarray, repeats: int = 15) -> np.ndarray:
    """Return the measured time (s, least of `repeats` interleaved passes) of one layer's dense modules for
    each token count."""
    import torch

    torch.set_num_threads(1)
    h = model.shape.hidden
    xs = [torch.randn(int(n), h) for n in np.asarray(tokens).tolist()]
    return _min_times([lambda x=x: model.dense(0, x, x) for x in xs], repeats)


def _attend(q: Any, k: Any, v: Any) -> Any:
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q[None, :, None, :], k[None], v[None])[0, :, 0, :]


def profile_attention(model: TinyModel, ctx: np.ndarray, repeats: int = 15) -> np.ndarray:
    """Return the measured time (s, least of `repeats` interleaved passes) of one layer of decode attention
    for one request per KV length."""
    import torch

    torch.set_num_threads(1)
    s = model.shape
    fns = []
    for c in np.asarray(ctx).tolist():
        k = torch.randn(s.heads, int(c), s.head_dim)
        v = torch.randn(s.heads, int(c), s.head_dim)
        q = torch.randn(s.heads, s.head_dim)
        fns.append(lambda q=q, k=k, v=v: _attend(q, k, v))
    return _min_times(fns, repeats)


def _worker(rank: int, shape: TinyShape, ctx: dict[int, int], inbox: Any, outbox: Any) -> None:
    """A CPU pool: holds the KV caches of its BE requests, answers (request, layer, q) with attention."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1000 + rank)
    kv = {rid: [(torch.randn(shape.heads, c, shape.head_dim, generator=g),
                 torch.randn(shape.heads, c, shape.head_dim, generator=g)) for _ in range(shape.layers)]
          for rid, c in ctx.items()}
    outbox.put(("ready", rank))
    while True:
        msg = inbox.get()
        if msg is None:
            return
        batch = [msg]
        while True:
            try:
                m = inbox.get_nowait()
            except queue.Empty:
                break
            if m is None:
                return
            batch.append(m)
        out = []
        t0 = time.perf_counter()
        for rid, layer, q in batch:
            k, v = kv[rid][layer]
            out.append((rid, layer, _attend(torch.from_numpy(q).reshape(shape.heads, shape.head_dim), k, v)
                        .reshape(-1).numpy()))
        outbox.put((time.perf_counter() - t0, out))


def run_piggyback(*, be_requests: int = 16, ctx: int = 1024, ls_tokens: int = 64, workers: int = 1,
                  duration_s: float = 3.0, shape: TinyShape = TinyShape(), timeout_s: float = 120.0) -> dict[str, float]:
    """Run the piggybacking executor; return measured and predicted BE tokens/s, iteration time (s), and the
    profiled figures (f_D per layer at the batch, attention s per request-layer, queue cost per row)."""
    import torch
    import torch.multiprocessing as mp

    if not (1 <= be_requests <= 256 and 16 <= ctx <= 16384 and 0 <= ls_tokens <= 4096 and 1 <= workers <= 8
            and 0.2 <= duration_s <= 60):
        raise InputError("omniserve run: be_requests 1..256, ctx 16..16384, ls_tokens 0..4096, workers 1..8, "
                         f"duration_s 0.2..60; got {be_requests}, {ctx}, {ls_tokens}, {workers}, {duration_s}")
    torch.set_num_threads(1)
    model = TinyModel(shape)
    L, h = shape.layers, shape.hidden
    qd = shape.heads * shape.head_dim
    mpc = mp.get_context("spawn")
    inboxes = [mpc.Queue() for _ in range(workers)]
    outbox = mpc.Queue()
    owner = {rid: rid % workers for rid in range(be_requests)}
    procs = [mpc.Process(target=_worker, args=(w, shape, {r: ctx for r in owner if owner[r] == w}, inboxes[w], outbox),
                         daemon=True) for w in range(workers)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + timeout_s
        started = 0
        while started < workers:
            if time.monotonic() > deadline:
                raise TimeoutError("omniserve run: CPU workers did not start in time")
            msg = outbox.get(timeout=timeout_s)
            started += msg[0] == "ready"
        rng = np.random.default_rng(0)
        ls_x = torch.randn(ls_tokens, h)
        resid = {rid: torch.randn(h) for rid in range(be_requests)}
        pending: dict[int, tuple[int, Any]] = {}
        last_iter = {rid: -1 for rid in range(be_requests)}
        for rid in range(be_requests):   # spread the requests over the layers' phases
            inboxes[owner[rid]].put((rid, rid % L, rng.standard_normal(qd).astype(np.float32)))
        tokens = iterations = rows_total = 0
        dense_n: list[int] = []
        dense_s: list[float] = []
        attn_s = attn_rows = 0.0
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < duration_s:
            for layer in range(L):
                while True:
                    try:
                        spent, got = outbox.get_nowait()
                    except queue.Empty:
                        break
                    attn_s += spent
                    attn_rows += len(got)
                    for rid, lay, out in got:
                        pending[rid] = (lay, out)
                rows = [rid for rid, (lay, _) in pending.items() if lay == layer and last_iter[rid] != iterations]
                if not rows and not ls_tokens:
                    continue
                attn = torch.cat([torch.zeros(ls_tokens, h)] + [torch.from_numpy(pending[r][1]).reshape(1, h)
                                                                 for r in rows]) if rows else torch.zeros(ls_tokens, h)
                res = torch.cat([ls_x] + [resid[r].reshape(1, h) for r in rows]) if rows else ls_x
                t0 = time.perf_counter()
                qkv, x = model.dense(layer, attn, res)
                dense_s.append(time.perf_counter() - t0)
                dense_n.append(ls_tokens + len(rows))
                for j, rid in enumerate(rows, start=ls_tokens):
                    del pending[rid]
                    last_iter[rid] = iterations
                    resid[rid] = x[j]
                    nxt = (layer + 1) % L
                    if nxt == 0:
                        tokens += 1
                    inboxes[owner[rid]].put((rid, nxt, qkv[j, :qd].numpy().copy()))
                rows_total += len(rows)
            iterations += 1
            if not all(p.is_alive() for p in procs):
                raise RuntimeError("omniserve run: a CPU attention worker died")
        elapsed = time.perf_counter() - t_start
    finally:
        for ib in inboxes:
            ib.put(None)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    measured = tokens / elapsed
    from gpuplan.sim.latency import LinearLatency, StaircaseLatency

    # the latency model fitted on the samples profiled during the run: f_D over the dense calls, the
    # workers' attention time per request-layer, the GPU process's other time per piggybacked row
    dn, ds = np.asarray(dense_n, dtype=float), np.asarray(dense_s)
    fd = StaircaseLatency.fit(dn, ds) if len(np.unique(dn)) > 1 else LinearLatency(float(np.median(ds)), 0.0)
    t_attn = attn_s / max(attn_rows, 1.0)
    c_row = max(0.0, elapsed - float(ds.sum())) / max(rows_total, 1)
    inrun = _predict(fd, L, be_requests, ls_tokens, workers, t_attn, c_row)
    # and fitted on a profile taken before the run (offline: a busy machine's load shifts in between)
    grid = np.unique(np.linspace(max(1, ls_tokens), ls_tokens + be_requests, 6).astype(int))
    fd_off = StaircaseLatency.fit(grid, profile_dense(model, grid)) if len(grid) > 1 else fd
    t_off = float(LinearLatency.fit(np.array([ctx // 2, ctx]), profile_attention(model, np.array([ctx // 2, ctx])))(ctx))
    offline = _predict(fd_off, L, be_requests, ls_tokens, workers, t_off, _queue_cost(qd, h))
    return {"measured_be_tokens_per_s": measured, "predicted_be_tokens_per_s": inrun[0],
            "relative_error": abs(measured - inrun[0]) / inrun[0] if inrun[0] > 0 else math.inf,
            "offline_predicted_be_tokens_per_s": offline[0],
            "offline_relative_error": abs(measured - offline[0]) / offline[0] if offline[0] > 0 else math.inf,
            "measured_iteration_s": elapsed / max(iterations, 1), "predicted_iteration_s": inrun[1],
            "measured_rows_per_iteration": rows_total / max(iterations, 1), "predicted_rows_per_iteration": inrun[2],
            "iterations": float(iterations), "attention_per_request_layer_s": t_attn, "gpu_cost_per_row_s": c_row,
            "be_requests": float(be_requests), "ctx_tokens": float(ctx), "ls_tokens": float(ls_tokens),
            "workers": float(workers)}


def _predict(fd: Any, L: int, B: int, ls_tokens: int, workers: int, t_attn: float, c_row: float) -> tuple[float, float, float]:
    """Return (BE tokens/s, iteration s, rows per iteration) the OmniServe model predicts: an in-flight
    request advances one layer per iteration, except that its next token's layer-0 query leaves at the end
    of an iteration and merges in the iteration after next (L + 1 iterations per token), so B L / (L + 1)
    rows per iteration when the workers keep pace, else the rows they finish in T;
    T = sum over layers of f_D(ls_tokens + rows / L) + rows * c_row (fixed point)."""
    full = B * L / (L + 1.0)
    rows = full
    T = L * float(fd(ls_tokens + rows / L)) + rows * c_row
    for _ in range(100):
        rows = min(full, workers * T / t_attn) if t_attn > 0 else full
        T_new = L * float(fd(ls_tokens + rows / L)) + rows * c_row
        if abs(T_new - T) <= 1e-12 * max(T, 1e-12):
            break
        T = T_new
    return rows / (L * T), T, rows


def _queue_cost(qd: int, h: int, n: int = 400) -> float:
    """Return the GPU process's cost (s) per piggybacked row of queue traffic: one put of a query and
    one get of an attention output, through a multiprocessing queue to itself (median of batches)."""
    import torch.multiprocessing as mp

    q = mp.get_context("spawn").Queue()
    x = np.zeros(qd, dtype=np.float32)
    y = [(0, 0, np.zeros(h, dtype=np.float32))]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            q.put((0, 0, x))
        for _ in range(n):
            q.get()
        for _ in range(n // 8):
            q.put(y * 8)
        for _ in range(n // 8):
            q.get()
        times.append((time.perf_counter() - t0) / n)
    q.close()
    return float(np.median(times))


def run_plan(problem: Any, plan: Any, *, be_requests: int = 16, ctx: int = 1024, ls_tokens: int = 64,
             workers: int = 1, duration_s: float = 3.0, **_: Any) -> dict[str, Any]:
    """`gpuplan run` for omniserve plans: execute piggybacking on this machine with a tiny model (CPU worker
    processes computing BE attention, a "GPU" process running the dense modules); return measured vs
    predicted BE tokens/s. Only plans of the omniserve policy piggyback."""
    if plan.policy != "omniserve":
        raise InputError(f"omniserve run: the plan's policy is {plan.policy!r}; only 'omniserve' plans piggyback "
                         "BE attention from CPU workers", field="policy", value=plan.policy, expected="omniserve")
    return run_piggyback(be_requests=be_requests, ctx=ctx, ls_tokens=ls_tokens, workers=workers, duration_s=duration_s)


__all__ = ["TinyModel", "TinyShape", "profile_attention", "profile_dense", "run_piggyback", "run_plan"]
