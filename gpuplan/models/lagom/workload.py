"""Lagom's `from_model` workload: one training iteration of a catalog transformer under a DP x TP layout,
as groups, computation segments and communication ops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuplan.models.workload import DTYPE_BYTES, model_config

if TYPE_CHECKING:
    from gpuplan.models.lagom.problem import FromModel, Hardware


def workload_from_model(fm: FromModel, hw: Hardware) -> dict[str, Any]:
    """Return groups, segments and ops of one iteration of `fm` on `hw` (times in s, sizes in bytes).

    Per layer: forward and backward (2x) segments at mfu x peak / tp; with tp > 1 two exposed
    all-reduces of b*s*h activations per layer and pass; data parallelism reduces each layer's
    gradients during the next layer's backward (reduce_scatter with fsdp, which also all-gathers the
    next layer's weights during the current forward); the first layer's are exposed.
    """
    cfg = model_config(fm.model)
    width = DTYPE_BYTES.get(fm.dtype, 2)
    rate = hw.peak_tflops(fm.dtype) * 1e12 * fm.mfu
    L = cfg.num_layers
    fwd_s = cfg.layer_forward_flops(fm.micro_batch, fm.seq_len) / fm.tp / rate
    segments = [{"name": f"fwd{i}", "compute_s": fwd_s, "memory_bound": fm.memory_bound} for i in range(L)]
    segments += [{"name": f"bwd{i}", "compute_s": 2 * fwd_s, "memory_bound": fm.memory_bound}
                 for i in reversed(range(L))]
    groups: dict[str, Any] = {}
    ops: list[dict[str, Any]] = []
    if fm.tp > 1:
        groups["tp"] = {"ranks": fm.tp, "nodes": 1, "intra": fm.intra, "nvls": fm.nvls}
        act = fm.micro_batch * fm.seq_len * cfg.hidden * width
        for i in range(L):
            ops += [{"name": f"tp-fwd{i}-{part}", "collective": "all_reduce", "size_bytes": act, "group": "tp"}
                    for part in ("attn", "mlp")]
        for i in reversed(range(L)):
            ops += [{"name": f"tp-bwd{i}-{part}", "collective": "all_reduce", "size_bytes": act, "group": "tp"}
                    for part in ("mlp", "attn")]
    if fm.dp > 1:
        dp_ppn = max(1, min(fm.dp, fm.gpus_per_node // fm.tp))
        while fm.dp % dp_ppn:
            dp_ppn -= 1
        dp_nodes = fm.dp // dp_ppn
        groups["dp"] = {"ranks": fm.dp, "nodes": dp_nodes, "intra": fm.intra, "nvls": fm.nvls}
        if dp_nodes > 1:
            if fm.inter_GBps is None:
                raise ValueError(f"at from_model.inter_GBps: the network bandwidth per rank; the data-parallel "
                                 f"group spans {dp_nodes} nodes")
            groups["dp"]["inter_GBps"] = fm.inter_GBps
            groups["dp"]["nics"] = fm.nics
        grads = cfg.layer_params() / fm.tp * width
        if fm.fsdp:
            ops += [{"name": f"ag{i}", "collective": "all_gather", "size_bytes": grads, "group": "dp",
                     "overlaps": f"fwd{i - 1}" if i else None} for i in range(L)]
        coll = "reduce_scatter" if fm.fsdp else "all_reduce"
        ops += [{"name": f"grad{i}", "collective": coll, "size_bytes": grads, "group": "dp",
                 "overlaps": f"bwd{i - 1}" if i else None} for i in reversed(range(L))]
    return {"name": f"{cfg.name} dp={fm.dp} tp={fm.tp}", "groups": groups, "segments": segments, "ops": ops}
