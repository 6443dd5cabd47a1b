"""Hetis plans for people: compare figures, `gpuplan show` tables, and the PNG (head map, SLO curves)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.models.base import Table


def _layout(plan: Any) -> str:
    parts = []
    for r in plan.replicas:
        stages = "+".join(f"{len(s.devices)}x{s.layers}L" for s in r.stages)
        parts.append(f"{r.phase[0]}:{stages}" if r.phase != "both" else stages)
    return " | ".join(parts)


def summarize(problem: Any, plan: Any) -> dict[str, Any]:
    """Return the figures `gpuplan compare hetis` prints for a plan."""
    p = plan.predicted
    return {"layout": _layout(plan), "dispatch": plan.dispatch + (" + re-dispatch" if plan.redispatch else ""),
            "max_rate_per_s": p.get("max_rate_per_s"), "ttft_p95_s": p.get("ttft_p_s"),
            "tpot_p95_s": p.get("tpot_p_s"), "attainment": p.get("attainment"),
            "usable_kv_GB": plan.usable_kv_bytes / 1e9, "dense_step_ms": 1e3 * p.get("dense_step_s", float("nan")),
            "snapshot_attention_ms": 1e3 * p["snapshot_attention_s"] if "snapshot_attention_s" in p else None}


def describe(problem: Any, plan: Any) -> list[Table]:
    """Return the layout, the per-device KV capacity and heads, and the figures as tables."""
    devs = {d.id: d for d in problem.cluster.devices}
    rows = []
    for k, r in enumerate(plan.replicas):
        for j, s in enumerate(r.stages):
            types = sorted({devs[d].type for d in s.devices if d in devs})
            rows.append([k, r.phase, r.share, j, ",".join(map(str, s.devices)), "/".join(types), s.layers])
    tables = [Table(f"layout ({plan.dispatch}{', re-dispatch' if plan.redispatch else ''})",
                    ["replica", "phase", "share", "stage", "devices", "type", "layers"], rows)]
    heads = {}
    for a in plan.head_map:
        for d, c in a.heads.items():
            heads[d] = heads.get(d, 0) + c
    krows = [[d, devs[int(d)].type if int(d) in devs else "?", v / 1e9, heads.get(d, 0),
              plan.static_heads.get(d, "")] for d, v in plan.kv_capacity_bytes.items()]
    tables.append(Table(f"KV capacity per device (usable in all: {plan.usable_kv_bytes / 1e9:.1f} GB)",
                        ["device", "type", "KV GB", f"heads in snapshot ({plan.snapshot_dispatch or '-'})",
                         "static heads"], krows))
    tables.append(Table("predicted", ["figure", "value"], [[k, v] for k, v in plan.predicted.items()]))
    if plan.stage_a:
        tables.append(Table(f"Stage A candidates (delta = {problem.delta:.0%})", list(plan.stage_a[0]),
                            [list(c.values()) for c in plan.stage_a]))
    return tables


def rate_curve(problem: Any, plan: Any, rates: list[float]) -> list[dict[str, float]]:
    """Return SLO attainment, goodput and output tokens/s of the plan at each request rate."""
    from gpuplan.models.hetis import simulated, slo_figures

    out = []
    for r in rates:
        res, _ = simulated(problem, plan, r)
        f = slo_figures(problem, res)
        out.append({"rate_per_s": r, **f, "tokens_per_s": res.throughput()["output_tokens_per_s"]})
    return out


def draw(problem: Any, plan: Any, path: Any) -> None:
    """Write a PNG: heads (snapshot) and KV capacity per device, and SLO attainment / throughput vs rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 4.8))
    devs = {d.id: d for d in problem.cluster.devices}
    ids = [int(d) for d in plan.kv_capacity_bytes]
    x = np.arange(len(ids))
    if plan.head_map:
        bottom = np.zeros(len(ids))
        cmap = plt.get_cmap("tab20")
        for r, a in enumerate(plan.head_map):
            h = np.array([a.heads.get(str(d), 0) for d in ids], dtype=float)
            ax.bar(x, h, bottom=bottom, color=cmap(r % 20), label=f"req {a.request}" if r < 8 else None)
            bottom += h
        ax.set_ylabel(f"KV heads of the first {len(plan.head_map)} requests ({plan.snapshot_dispatch})")
    else:
        ax.bar(x, [plan.kv_capacity_bytes[str(d)] / 1e9 for d in ids], color="tab:blue")
        ax.set_ylabel("usable KV (GB)")
    ax.set_xticks(x, [f"{d}\n{devs[d].type}" if d in devs else str(d) for d in ids], fontsize=7)
    ax.set_title(f"{problem.name or 'hetis'}: {plan.dispatch} ({plan.solver.name if plan.solver else ''})")
    if plan.head_map:
        ax.legend(fontsize=7, loc="upper right")
    top = max(plan.predicted.get("max_rate_per_s", 0.0), problem.trace.rate_per_s) * 1.5
    rates = list(np.linspace(top / 6, top, 6))
    curve = rate_curve(problem, plan, rates)
    bx.plot(rates, [c["attainment"] for c in curve], "o-", label="SLO attainment")
    bx.set_xlabel("request rate (1/s)")
    bx.set_ylabel("SLO attainment")
    bx.set_ylim(0, 1.05)
    cx = bx.twinx()
    cx.plot(rates, [c["tokens_per_s"] for c in curve], "s--", color="tab:orange", label="output tokens/s")
    cx.set_ylabel("output tokens/s")
    bx.axvline(plan.predicted.get("max_rate_per_s", 0.0), color="k", ls=":", label="max rate meeting SLOs")
    bx.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=100)
