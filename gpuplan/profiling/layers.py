"""Per-layer costs of real transformer layers: forward and backward time, activation bytes.

The layers are the very modules the executors run (gpuplan.runtime.gpt: Block, Embedding, Head).
Activation bytes are what a part keeps for its backward pass: on CPU counted with saved-tensor
hooks (each saved storage once, parameters excluded, the part's input included); on CUDA read
from the allocator (memory still held after the forward pass, plus the peak during forward and
backward). The head is timed with the loss, as the last pipeline stage runs it.

On a small machine a catalog model is profiled in a scaled configuration (narrower, smaller
vocabulary, shorter sequences); the table says so (`scaled_from`, `scaling_note`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from gpuplan.models.profile import LayerCost, LayerTable, StackCheck
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, model_config, scaled
from gpuplan.profiling.compute import TORCH_DTYPES
from gpuplan.profiling.timing import clock_for, measure, spread_of



@dataclass(frozen=True)
class LayerPlan:
    """What to profile: the configuration, where it was scaled from and why, and the shapes."""

    config: TransformerConfig
    scaled_from: str | None
    note: str
    micro_batches: list[int]
    seq_lens: list[int]
    dtype: str


def layer_plan(model: str, device: Any, *, quick: bool = False) -> LayerPlan:
    """Return what to profile for catalog model `model` on `device`.

    On CUDA the catalog shape itself in bf16 (sequences up to 4096, capped by the model's).
    On CPU a scaled copy in fp32: hidden 256 (quick) or 512, vocabulary 8192, short sequences.
    """
    cfg = model_config(model)
    if str(device).startswith("cuda"):
        seqs = [s for s in ([1024, 2048] if quick else [1024, 2048, 4096]) if s <= cfg.max_seq_len]
        return LayerPlan(cfg, None, "", [1] if quick else [1, 2, 4], seqs or [cfg.max_seq_len], "bf16")
    hidden, vocab = (256, 8192) if quick else (512, 8192)
    small = scaled(cfg, num_layers=min(cfg.num_layers, 8), hidden=min(hidden, cfg.hidden),
                   vocab=min(vocab, cfg.vocab))
    seqs = [128] if quick else [128, 256]
    note = (f"profiled on CPU in a scaled configuration: hidden {small.hidden} (of {cfg.hidden}), "
            f"{small.heads} heads of width {small.dhead}, FFN {small.ffn_hidden}, vocabulary {small.vocab} "
            f"(of {cfg.vocab}), sequences {seqs} (model allows {cfg.max_seq_len}), fp32")
    return LayerPlan(small, cfg.name, note, [1, 2] if quick else [1, 2, 4], seqs, "fp32")


def exact_layer_plan(config: TransformerConfig, device: Any, *, seq_lens: list[int], micro_batches: list[int]
                     ) -> LayerPlan:
    """Return what to profile for an explicitly given model shape: that shape itself, unscaled,
    at the given sequence lengths and micro-batch sizes (fp32 on CPU, bf16 on CUDA)."""
    too_long = [s for s in seq_lens if s > config.max_seq_len]
    if too_long:
        raise ValueError(f"sequence lengths up to the model's max_seq_len {config.max_seq_len}, not {too_long}")
    return LayerPlan(config, None, "", sorted(set(micro_batches)), sorted(set(seq_lens)),
                     "bf16" if str(device).startswith("cuda") else "fp32")


def block_saved_bytes(cfg: TransformerConfig, batch: int, seq: int, dtype: str = "fp32") -> float:
    """Return the bytes gpuplan.runtime.gpt.Block saves for backward (what the hooks should count).

    Per token, in the activation dtype: the input and the residual after attention (2h), each
    RMSNorm's normalised value before the weight and its output (4h), Q, K and V as attention
    sees them (3 heads*dhead: grouped K/V are repeated to every head first), the attention output
    (heads*dhead), and in the MLP the up projection and its activation (2 ffn; gated: gate, up,
    silu(gate) and their product, 4 ffn). Plus each norm's reciprocal RMS (2 values per token)
    and, in fp32, the attention kernel's log-sum-exp (one per head and token).
    """
    e = DTYPE_BYTES[dtype]
    tokens = batch * seq
    h, a, f = cfg.hidden, cfg.heads * cfg.dhead, cfg.ffn_hidden
    per_token = 6 * h + 4 * a + (4 if cfg.gated_mlp else 2) * f + 2
    return float(tokens * (per_token * e + 4 * cfg.heads))


def saved_tensor_bytes(run: Callable[[], Any], exclude: list[Any]) -> int:
    """Return the bytes of the distinct storages autograd saves while `run()` executes.

    Storages of the tensors in `exclude` (the parameters) are not counted.
    """
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


@dataclass(frozen=True)
class _Part:
    """One profiled part: its module, how to make its input, and its forward pass.

    `chain` > 1 times `chain` applications of the module in one graph and divides by `chain`, so
    the fixed cost of a pass (starting the autograd engine, the first allocation) is spread as it
    is in a deep stack rather than charged in full to every layer.
    """

    name: str
    module: Any
    make_input: Callable[[], Any]
    forward: Callable[[Any], Any]
    chain: int = 1


def _repeat(module: Any, times: int) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        for _ in range(times):
            x = module(x)
        return x

    return run


def _parts(cfg: TransformerConfig, batch: int, seq: int, device: Any, tdtype: Any, chain: int) -> list[_Part]:
    import torch

    from gpuplan.runtime import gpt

    tokens, targets = gpt.synthetic_batch(cfg, batch, seq)
    tokens, targets = tokens.to(device), targets.to(device)
    g = torch.Generator().manual_seed(batch * 100003 + seq)
    x0 = torch.randn(batch, seq, cfg.hidden, generator=g).to(device=device, dtype=tdtype)

    def act() -> Any:
        return x0.detach().clone().requires_grad_(True)

    blk = gpt.block(cfg, 0).to(device=device, dtype=tdtype)
    emb = gpt.embedding(cfg).to(device=device, dtype=tdtype)
    hd = gpt.head(cfg).to(device=device, dtype=tdtype)
    return [_Part("layer", blk, act, _repeat(blk, chain), chain),
            _Part("embedding", emb, lambda: tokens, emb),
            _Part("head", hd, act, lambda x: gpt.lm_loss(hd(x), targets))]


def calls_for(device: Any) -> str:
    """Return how the layer table times calls on `device`: "after-wait" on CPU, "back-to-back" on CUDA."""
    return "back-to-back" if str(device).startswith("cuda") else "after-wait"


def after_wait(fn: Callable[[], Any], setup: Callable[[], Any] | None, device: Any
               ) -> tuple[Callable[[], None], Callable[[], None]]:
    """Return (fn, setup) for `timing.measure` that time `fn` the way the layer table times calls on
    `device`: on CPU each call follows `setup` and then an idle wait as long as the previous timed call
    took (wall time), as each forward and backward of a pipeline stage follows a receive or an
    emulated sleep; on a virtual machine's cores such a call took 25-40 % more CPU time than
    back-to-back calls (gpt-tiny blocks, 1 and 4 per call; docs/profiling.md). On CUDA unchanged
    (kernel launches run ahead of the GPU)."""
    last = [0.0]
    wait = calls_for(device) == "after-wait"

    def timed() -> None:
        t0 = time.perf_counter()
        fn()
        last[0] = time.perf_counter() - t0

    def prepare() -> None:
        if setup is not None:
            setup()
        if wait:
            time.sleep(last[0])

    return timed, prepare


def _time_part(part: _Part, device: Any, repeats: int) -> tuple[Any, Any]:
    """Return (forward Spread, backward Spread) of one application of a part, in seconds (each call
    timed as `after_wait` says)."""
    import torch

    held: dict[str, Any] = {}

    def setup_forward() -> None:
        held["x"] = part.make_input()

    def forward() -> None:
        held["y"] = part.forward(held["x"])

    def setup_backward() -> None:
        y = part.forward(part.make_input())
        held["y"], held["g"] = y, torch.ones_like(y)

    clock = clock_for(device)
    fn, setup = after_wait(forward, setup_forward, device)
    fwd = measure(fn, setup=setup, device=device, warmup=2, repeats=repeats, clock=clock)
    fn, setup = after_wait(lambda: held["y"].backward(held["g"]), setup_backward, device)
    bwd = measure(fn, setup=setup, device=device, warmup=2, repeats=repeats, clock=clock)
    held.clear()
    if part.chain > 1:
        fwd, bwd = _per_application(fwd, part.chain), _per_application(bwd, part.chain)
    return fwd, bwd


def _activation_bytes(part: _Part, device: Any) -> tuple[int, int | None]:
    """Return (bytes kept for backward, peak bytes above the input or None) of one application.

    CPU: saved-tensor hooks. CUDA: allocator figures around one forward and backward pass.
    """
    import torch

    single = part.module if part.chain > 1 else part.forward
    x = part.make_input()
    if not str(device).startswith("cuda"):
        return saved_tensor_bytes(lambda: single(x), list(part.module.parameters())), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    y = single(x)
    torch.cuda.synchronize(device)
    after = torch.cuda.memory_allocated(device)
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    out_bytes = y.numel() * y.element_size()
    in_bytes = x.numel() * x.element_size()
    return int(after - before - out_bytes + in_bytes), int(peak)


def _combine(spreads: list[Any]) -> tuple[float, float]:
    """Return (median of the rounds' medians in s, relative spread): the wider of one round's spread
    and that of the rounds' medians."""
    across = spread_of([sp.median_s for sp in spreads])
    return across.median_s, max(across.rel_spread, max(sp.rel_spread for sp in spreads))


def _per_application(spread: Any, chain: int) -> Any:
    """Return a Spread of `chain` chained applications divided into one application's share."""
    return spread.model_copy(update={"median_s": spread.median_s / chain, "min_s": spread.min_s / chain,
                                     "max_s": spread.max_s / chain})


def rounds_for(device: Any) -> int:
    """Return in how many rounds, spread over the whole layer profile, each part is timed on `device`:
    4 on CPU, whose speed on a shared virtual machine drifts by 20 % and more within seconds (one
    round is a snapshot of a few tens of milliseconds), 1 on CUDA."""
    return 1 if str(device).startswith("cuda") else 4


def layer_table(plan: LayerPlan, device: Any, device_type: str, *, repeats: int = 5,
                progress: Callable[[str], None] | None = None, stage_calls: bool = True) -> LayerTable:
    """Return the LayerTable of `plan` measured on `device` (times in s, activations in bytes).

    Every part at every shape is timed in `rounds_for(device)` rounds of `repeats` calls, the rounds
    going over all shapes in turn; its figure is the median of the rounds' medians, its spread the
    wider of one round's spread and the rounds' medians' spread.
    With `stage_calls`, also the pipeline runtime's overhead per forward and per backward call of a
    stage (`gpuplan.profiling.stage_calls`, at the smallest micro-batch and sequence, where the
    difference of two timings is least blurred by the compute's own noise), in seconds.
    """
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[plan.dtype])
    chain = 2 if str(device).startswith("cuda") else 4
    shapes = [(mb, seq) for mb in plan.micro_batches for seq in plan.seq_lens]
    timed: dict[tuple[int, int, str], list[tuple[Any, Any]]] = {}
    activations: dict[tuple[int, int, str], tuple[int, int | None]] = {}  # bytes kept, peak bytes
    rounds = rounds_for(device)
    for r in range(rounds):
        for mb, seq in shapes:
            if progress is not None:
                progress(f"layers: micro-batch {mb}, sequence {seq}"
                         + (f" (round {r + 1} of {rounds})" if rounds > 1 else ""))
            # built again each round: one shape's modules in memory at a time (a catalog shape on CUDA)
            for part in _parts(plan.config, mb, seq, device, tdtype, chain):
                timed.setdefault((mb, seq, part.name), []).append(_time_part(part, device, repeats))
                if r == 0:
                    activations[(mb, seq, part.name)] = _activation_bytes(part, device)
    costs = []
    for (mb, seq, name), (act, peak) in activations.items():
        fwd, bwd = (_combine([t[i] for t in timed[(mb, seq, name)]]) for i in (0, 1))
        costs.append(LayerCost(device_type=device_type, part=name, micro_batch=mb, seq_len=seq,  # type: ignore[arg-type]
                               forward_s=fwd[0], backward_s=bwd[0], activation_bytes=act,
                               forward_spread=fwd[1], backward_spread=bwd[1], peak_bytes=peak))
    overheads = {}
    if stage_calls:
        from gpuplan.profiling.stage_calls import stage_call_overhead

        if progress is not None:
            progress("layers: pipeline runtime overhead per stage call")
        over = stage_call_overhead(plan.config, min(plan.micro_batches), min(plan.seq_lens), device, tdtype,
                                   clock=clock_for(device))
        overheads = {"stage_call_forward_s": over.forward_s, "stage_call_backward_s": over.backward_s}
    return LayerTable(model=plan.config.name, config=plan.config.model_dump(mode="json"),
                      scaled_from=plan.scaled_from, scaling_note=plan.note, dtype=plan.dtype, costs=costs,
                      clock=clock_for(device), calls=calls_for(device), **overheads)


def predicted_stack_s(table: LayerTable, layers: int, micro_batch: int, seq_len: int) -> float:
    """Return the forward+backward time (s) of `layers` stacked layers predicted from the table."""
    for c in table.costs:
        if c.part == "layer" and c.micro_batch == micro_batch and c.seq_len == seq_len:
            return layers * (c.forward_s + c.backward_s)
    raise KeyError(f"no layer cost at micro-batch {micro_batch}, sequence {seq_len}")


def _stack_step(cfg: TransformerConfig, layers: int, micro_batch: int, seq_len: int, device: Any,
                dtype: str) -> Callable[[], None]:
    """Return a function running one forward+backward pass through `layers` stacked Blocks."""
    import torch

    from gpuplan.runtime import gpt

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    stack = torch.nn.Sequential(*[gpt.block(cfg, i) for i in range(layers)]).to(device=device, dtype=tdtype)
    g = torch.Generator().manual_seed(micro_batch * 100003 + seq_len)
    x0 = torch.randn(micro_batch, seq_len, cfg.hidden, generator=g).to(device=device, dtype=tdtype)

    def step() -> None:
        y = stack(x0.detach().clone().requires_grad_(True))
        y.backward(torch.ones_like(y))

    return step


def validate_stacks(table: LayerTable, device: Any, *, stacks: tuple[int, ...] = (2, 4, 8), rounds: int = 3,
                    repeats: int = 5, progress: Callable[[str], None] | None = None) -> list[StackCheck]:
    """Predict the forward+backward time of k stacked layers from per-layer costs, measure it, per k.

    Uses the table's first (micro-batch, sequence length). In each of `rounds` rounds the layer is
    timed again exactly as the table times it, then every stack end to end; predicted = k x the
    median per-layer cost, measured = the median stack time. Interleaving the two keeps a change
    of machine load between them from passing for a prediction error. `table_predicted_s` is
    k x the table's own figure. The *_min_s figures use the fastest run instead of the median (the
    estimate least disturbed by other work on a shared machine). Times in seconds;
    rel_error = (predicted - measured) / measured.
    """
    import torch

    cfg = TransformerConfig.model_validate(table.config)
    first = next(c for c in table.costs if c.part == "layer")
    mb, seq = first.micro_batch, first.seq_len
    tdtype = getattr(torch, TORCH_DTYPES[table.dtype])
    chain = 2 if str(device).startswith("cuda") else 4
    layer_part = _parts(cfg, mb, seq, device, tdtype, chain)[0]
    steps = {k: _stack_step(cfg, k, mb, seq, device, table.dtype) for k in stacks}
    per_layer: list[float] = []
    per_layer_min = float("inf")
    measured: dict[int, list[float]] = {k: [] for k in stacks}
    measured_min: dict[int, float] = {k: float("inf") for k in stacks}
    spreads: dict[int, float] = {}
    for r in range(rounds):
        if progress is not None:
            progress(f"validate: round {r + 1} of {rounds}")
        fwd, bwd = _time_part(layer_part, device, repeats)
        per_layer.append(fwd.median_s + bwd.median_s)
        per_layer_min = min(per_layer_min, fwd.min_s + bwd.min_s)
        for k, step in steps.items():
            fn, setup = after_wait(step, None, device)
            spread = measure(fn, setup=setup, device=device, warmup=1, repeats=repeats, clock=clock_for(device))
            measured[k].append(spread.median_s)
            measured_min[k] = min(measured_min[k], spread.min_s)
            spreads[k] = max(spreads.get(k, 0.0), spread.rel_spread)
    layer_s = spread_of(per_layer).median_s
    out = []
    for k in stacks:
        m = spread_of(measured[k]).median_s
        out.append(StackCheck(layers=k, micro_batch=mb, seq_len=seq, predicted_s=k * layer_s, measured_s=m,
                              rel_error=(k * layer_s - m) / m, measured_spread=spreads[k],
                              table_predicted_s=predicted_stack_s(table, k, mb, seq),
                              predicted_min_s=k * per_layer_min, measured_min_s=measured_min[k]))
    return out
