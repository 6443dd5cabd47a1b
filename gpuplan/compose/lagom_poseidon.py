"""A Lagom workload from a Poseidon plan: the communication of one pipeline stage and what it overlaps.

Reads the plan document (JSON mapping) only: `problem` (model shape, seq_len, dtype, cluster) and
`stages` (device type, nodes, tp, dp, layers, micro-batch size, forward_s / backward_s per
micro-batch) and `num_microbatches`. For the chosen stage (default: the one with the most compute
per iteration, the pipeline's bottleneck) it builds:

- segments: the stage's forward and backward of every micro-batch (Poseidon's times, which already
  hold its tensor-parallel all-reduces and, under FSDP, the blocks' gathers and reduce-scatters with
  the slowdown they cause; their cost is counted again below, so the workload errs on the side of
  more communication),
- tensor-parallel all-reduces (tp > 1): two per layer and pass of b*s*h activations, exposed,
  `count` = layers of the stage,
- pipeline sends (send_recv of b*s*h activations) to the next stage under the next micro-batch's
  forward, and of gradients to the previous stage under the next backward,
- the data-parallel gradient reduction (dp > 1): one bucket per layer under the last backward.

Groups that cross nodes get the cluster's NICs per node (`Cluster.nics`), as many of them as the
group's GPUs on a node can drive (collectives.usable_nics: a GPU reaches the NICs of its own PCIe
switch): a pipeline send pair drives one rail, a data-parallel group with k GPUs per node k rails.
"""

from __future__ import annotations

from typing import Any

from gpuplan.models.cluster import Cluster
from gpuplan.models.collectives import usable_nics
from gpuplan.models.poseidon import FP8_PARAM_BYTES, grad_reduce_bytes
from gpuplan.models.workload import DTYPE_BYTES, model_config, storage_dtype


def _stage_index(stages: list[dict[str, Any]], m: int, stage: int | None) -> int:
    if stage is not None:
        if not 0 <= stage < len(stages):
            raise ValueError(f"at from_poseidon.stage: a stage index in 0..{len(stages) - 1}, not {stage}")
        return stage
    return max(range(len(stages)), key=lambda i: m * (stages[i].get("forward_s", 0) + stages[i].get("backward_s", 0)))


def group_nics(cluster: Cluster | None, nodes: list[str], ranks_per_node: int) -> int:
    """Return the NICs per node a group with `ranks_per_node` GPUs on each of `nodes` can drive: the
    fewest over those nodes (all the cluster's nodes when none of `nodes` is one of them); 1 without a
    cluster."""
    if cluster is None:
        return 1
    known = {n.name for n in cluster.nodes}
    names = [x for x in nodes if x in known] or sorted(known)
    return min(usable_nics(cluster, x, max(1, ranks_per_node)) for x in names)


def workload_from_poseidon(plan: dict[str, Any], stage: int | None = None) -> dict[str, Any]:
    """Return the Lagom problem fields (hardware, groups, segments, ops) for one stage of a Poseidon plan.

    Raises ValueError ("at from_poseidon...: expected ...") when the document is not a usable plan.
    """
    if plan.get("kind") != "poseidon" or not plan.get("stages"):
        raise ValueError(f"at from_poseidon.plan: a solved Poseidon plan with stages, not kind={plan.get('kind')!r}")
    problem = plan.get("problem") or {}
    try:
        cfg = model_config(problem["model"])
        seq = int(problem["seq_len"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"at from_poseidon.plan: the plan's embedded problem with model and seq_len ({exc})") from None
    width = DTYPE_BYTES.get(storage_dtype(str(problem.get("dtype", "bf16"))), 2)
    stages = plan["stages"]
    m = int(plan.get("num_microbatches", 1))
    k = _stage_index(stages, m, stage)
    st = stages[k]
    tp, dp, b = int(st.get("tp", 1)), int(st.get("dp", 1)), int(st.get("micro_batch_size", 1))
    layers = int(st.get("last_layer", 0)) - int(st.get("first_layer", 0))
    cluster = Cluster.model_validate(problem["cluster"]) if "cluster" in problem else None
    inter = cluster.inter_node.bandwidth_GBps if cluster else 12.5
    act = b * seq * cfg.hidden * width
    segments = [{"name": f"fwd-mb{j}", "compute_s": float(st.get("forward_s", 0.0))} for j in range(m)]
    segments += [{"name": f"bwd-mb{j}", "compute_s": float(st.get("backward_s", 0.0))} for j in range(m)]
    groups: dict[str, Any] = {}
    ops: list[dict[str, Any]] = []
    if tp > 1 and layers:
        groups["tp"] = {"ranks": tp, "nodes": 1}
        for j in range(m):
            for kind in ("fwd", "bwd"):
                ops.append({"name": f"tp-{kind}-mb{j}", "collective": "all_reduce", "size_bytes": act,
                            "group": "tp", "count": 2 * layers})
    for side, other in (("next", k + 1), ("prev", k - 1)):
        if not 0 <= other < len(stages):
            continue
        cross = set(st.get("nodes", [])) != set(stages[other].get("nodes", [])) or len(st.get("nodes", [])) > 1
        group = f"pp-{side}"
        pair_nodes = list(st.get("nodes", [])) + list(stages[other].get("nodes", []))
        net = {"inter_GBps": inter, "nics": group_nics(cluster, pair_nodes, 1)} if cross else {}
        groups[group] = {"ranks": 2, "nodes": 2 if cross else 1, **net}
        kind = "fwd" if side == "next" else "bwd"
        for j in range(m):
            ops.append({"name": f"send-{side}-mb{j}", "collective": "send_recv", "size_bytes": act, "group": group,
                        "overlaps": f"{kind}-mb{j + 1}" if j + 1 < m else None})
    if dp > 1 and layers:
        nodes = len(set(st.get("nodes", []))) or 1
        dp_nodes = nodes if dp % nodes == 0 else 1
        net = {"inter_GBps": inter, "nics": group_nics(cluster, list(st.get("nodes", [])), dp // dp_nodes)}
        groups["dp"] = {"ranks": dp, "nodes": dp_nodes, **(net if dp_nodes > 1 else {})}
        # the gradients in the plan's reduce dtype (models.poseidon.grad_reduce_bytes: fp32 by default in bf16)
        grads = cfg.layer_params() / tp * grad_reduce_bytes(str(problem.get("dtype", "bf16")), bool(problem.get("fsdp")),
                                                           problem.get("grad_reduce_in_fp32"))
        # the block weights' gathers move their fp8 copies with fp8_params (models.poseidon.CostModel.gather_bytes)
        weights = cfg.layer_params() / tp * (FP8_PARAM_BYTES if problem.get("fp8_params") else width)
        if problem.get("fsdp"):
            # FSDP (ZeRO-3): each micro-batch gathers every block's weights beside the forward and again
            # beside the backward, and reduce-scatters its gradients beside the backward
            for j in range(m):
                ops.append({"name": f"fsdp-gather-fwd-mb{j}", "collective": "all_gather", "size_bytes": weights,
                            "group": "dp", "overlaps": f"fwd-mb{j}", "count": layers})
                ops.append({"name": f"fsdp-gather-bwd-mb{j}", "collective": "all_gather", "size_bytes": weights,
                            "group": "dp", "overlaps": f"bwd-mb{j}", "count": layers})
                ops.append({"name": f"fsdp-grads-mb{j}", "collective": "reduce_scatter",
                            "size_bytes": grads, "group": "dp",
                            "overlaps": f"bwd-mb{j}", "count": layers})
        elif problem.get("distributed_optimizer"):
            # ZeRO-1: the gradients are reduce-scattered under the last backward and the updated weights
            # all-gathered, under the next iteration's first forward with --overlap-param-gather
            ops.append({"name": "dp-grads", "collective": "reduce_scatter", "size_bytes": grads, "group": "dp",
                        "overlaps": f"bwd-mb{m - 1}", "count": layers})
            ops.append({"name": "dp-params", "collective": "all_gather", "size_bytes": weights, "group": "dp",
                        "overlaps": "fwd-mb0" if problem.get("overlap_dp_allreduce") else None, "count": layers})
        else:
            ops.append({"name": "dp-grads", "collective": "all_reduce", "size_bytes": grads, "group": "dp",
                        "overlaps": f"bwd-mb{m - 1}", "count": layers})
    if not ops:
        raise ValueError(f"at from_poseidon.stage: stage {k} communicates nothing (tp=1, dp=1, one stage)")
    return {"name": f"poseidon stage {k} of {len(stages)} ({cfg.name}, tp={tp}, dp={dp}, m={m})",
            "hardware": {"gpu": st.get("device_type", "H100")}, "groups": groups, "segments": segments, "ops": ops}
