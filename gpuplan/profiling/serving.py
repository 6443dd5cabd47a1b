"""Profiling for the serving kinds: measured iteration times of the dense modules and of decode attention.

`profile_dense(cfg, tokens_list)` times one iteration's dense GEMMs (QKV and output projections,
the MLP) of `layers` transformer layers for each token count; `profile_decode_attention(cfg,
kv_tokens_list)` times decode attention (one query token per request against its KV cache) for
each number of KV tokens read. Both return (x, seconds) samples that gpuplan.sim.latency's
StaircaseLatency.fit / LinearLatency.fit turn into module latency models (and relative_errors
validates on held-out samples). torch is imported lazily; on CPU with one torch thread the
process's CPU time is the clock (other jobs on a shared machine do not inflate it).
"""

from __future__ import annotations

from typing import Any

from gpuplan.models.workload import TransformerConfig

MAX_TOKENS = 1 << 16
MAX_KV_TOKENS = 1 << 22


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def dense_modules(cfg: TransformerConfig, layers: int = 1, *, dtype: str = "fp32", device: str = "cpu",
                  seed: int = 0) -> list[Any]:
    """Return the weight matrices of `layers` layers' dense modules (torch tensors, [in, out]): QKV,
    output projection, MLP up (and gate) and down."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, d = cfg.hidden, cfg.dhead
    shapes = [(h, (cfg.heads + 2 * cfg.kv) * d), (cfg.heads * d, h), (h, cfg.ffn_hidden * (2 if cfg.gated_mlp else 1)),
              (cfg.ffn_hidden, h)]
    return [(torch.randn(a, b, generator=g) / a ** 0.5).to(device=device, dtype=_torch_dtype(dtype))
            for _ in range(layers) for a, b in shapes]


def dense_step(weights: list[Any], x: Any) -> Any:
    """Run one iteration's dense modules on activations x [tokens, hidden]; return the output."""
    out = x
    for k in range(0, len(weights), 4):
        qkv, o, up, down = weights[k:k + 4]
        a = out @ qkv
        out = out + a[:, : o.shape[0]] @ o
        u = out @ up
        if u.shape[1] != down.shape[0]:
            half = u.shape[1] // 2
            u = u[:, :half] * u[:, half:]
        out = out + u @ down
    return out


def profile_dense(cfg: TransformerConfig, tokens_list: list[int], *, layers: int = 1, dtype: str = "fp32",
                  device: str = "cpu", repeats: int = 5, clock: str | None = None,
                  statistic: str = "min", rounds: int = 3) -> list[tuple[int, float]]:
    """Return (tokens, seconds) samples: the time of one iteration's dense modules of `layers` layers over
    `tokens` tokens, for each entry of tokens_list; `statistic` "min" (the least contended of the repeats,
    the default on a shared machine) or "median" over `rounds` interleaved passes of `repeats` timings.
    Raises ValueError on a bad count."""
    import torch

    from gpuplan.profiling.timing import clock_for, measure

    if not tokens_list or any(not 1 <= n <= MAX_TOKENS for n in tokens_list):
        raise ValueError(f"tokens_list: 1..{MAX_TOKENS} tokens each, at least one entry; got {tokens_list!r}")
    weights = dense_modules(cfg, layers, dtype=dtype, device=device)
    clock = clock or clock_for(device)
    xs = {n: torch.randn(n, cfg.hidden, dtype=_torch_dtype(dtype), device=device) for n in tokens_list}
    with torch.inference_mode():
        return _rounds(tokens_list, lambda n: measure(lambda: dense_step(weights, xs[n]), device=device,
                                                      repeats=repeats, clock=clock), rounds, statistic)


def _rounds(sizes: list[int], timed: Any, rounds: int, statistic: str) -> list[tuple[int, float]]:
    """Return (size, seconds) per size, measured in `rounds` interleaved passes over all sizes (so a burst
    of load on a shared machine touches every size alike); the least contended (min) or the median."""
    got: dict[int, list[Any]] = {n: [] for n in sizes}
    for _ in range(max(1, rounds)):
        for n in sizes:
            got[n].append(timed(n))
    if statistic == "min":
        return [(int(n), float(min(s.min_s for s in got[n]))) for n in sizes]
    return [(int(n), float(sorted(s.median_s for s in got[n])[len(got[n]) // 2])) for n in sizes]


def decode_attention(q: Any, k: Any, v: Any) -> Any:
    """Return decode attention of queries q [batch, heads, 1, d] over caches k, v [batch, heads, ctx, d]."""
    import torch

    scores = torch.matmul(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def profile_decode_attention(cfg: TransformerConfig, kv_tokens_list: list[int], *, heads: int | None = None,
                             batch: int = 1, layers: int = 1, dtype: str = "fp32", device: str = "cpu",
                             repeats: int = 5, clock: str | None = None,
                             statistic: str = "min", rounds: int = 3) -> list[tuple[int, float]]:
    """Return (KV tokens read, seconds) samples of decode attention (`statistic` as in profile_dense):
    `batch` requests with ctx =
    kv_tokens / batch each, `heads` KV heads (default: the model's), over `layers` layers. The x of a
    sample is the whole KV tokens read (batch * ctx), as latency.decode_attention_latency counts them."""
    import torch

    from gpuplan.profiling.timing import clock_for, measure

    if not kv_tokens_list or any(not batch <= n <= MAX_KV_TOKENS for n in kv_tokens_list):
        raise ValueError(f"kv_tokens_list: {batch}..{MAX_KV_TOKENS} tokens each, at least one; got {kv_tokens_list!r}")
    h = heads or cfg.kv
    d = cfg.dhead
    clock = clock or clock_for(device)
    td = _torch_dtype(dtype)
    sizes = [max(1, n // batch) * batch for n in kv_tokens_list]
    data = {}
    for n in sizes:
        ctx = n // batch
        data[n] = (torch.randn(batch, h, 1, d, dtype=td, device=device),
                   [(torch.randn(batch, h, ctx, d, dtype=td, device=device),
                     torch.randn(batch, h, ctx, d, dtype=td, device=device)) for _ in range(layers)])

    def timed(n: int) -> Any:
        q, kv = data[n]

        def run() -> None:
            for k, v in kv:
                decode_attention(q, k, v)

        return measure(run, device=device, repeats=repeats, clock=clock)

    with torch.inference_mode():
        return _rounds(sizes, timed, rounds, statistic)
