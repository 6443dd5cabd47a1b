"""psRL plan views: the figures `compare` prints, the tables `show` prints, and the PNG `show --png` draws."""

from __future__ import annotations

from typing import Any

from gpuplan.models.base import Table
from gpuplan.models.psrl.core import PsrlPlan, PsrlProblem


def summarize(problem: PsrlProblem, plan: PsrlPlan) -> dict[str, Any]:
    """Return the figures `gpuplan compare psrl` prints for a plan (times in s, tokens, bytes)."""
    p = plan.predicted
    return {"sharing": plan.sharing, "makespan_s": p.get("makespan_s"), "imbalance": p.get("imbalance"),
            "computed_tokens": p.get("computed_tokens"), "dedup_tokens": p.get("dedup_tokens"),
            "exchanged_GB": (p.get("exchanged_bytes") or 0.0) / 1e9, "hit_rate": p.get("hit_rate")}


def _worker_parts(problem: PsrlProblem, plan: PsrlPlan) -> list[tuple[str, float, float, int, int, float]]:
    """Return per worker (name, compute s, exchange s, samples, nodes computed, memory GiB)."""
    f = problem.built
    nidx = {nid: i for i, nid in enumerate(f.ids)}
    rows = []
    for w, name in enumerate(problem.worker_names()):
        recv = sum(problem.comm_s[nidx[n]] for n in plan.received.get(name, []) if n in nidx)
        load = plan.load_s.get(name, 0.0)
        rows.append((name, load - recv, recv, sum(1 for x in plan.sample_worker if x == name),
                     len(plan.computed.get(name, [])), plan.memory_bytes.get(name, 0.0) / 2**30))
    return rows


def describe(problem: PsrlProblem, plan: PsrlPlan) -> list[Table]:
    """Return the per-worker loads and the batch's token figures as tables for `gpuplan show`."""
    rows = [[n, c, r, s, k, len(plan.received.get(n, [])), m, plan.hit_rate.get(n)]
            for n, c, r, s, k, m in _worker_parts(problem, plan)]
    p = plan.predicted
    batch = Table("batch", ["samples", "nodes", "raw_tokens", "dedup_tokens", "computed_tokens", "makespan_s",
                            "imbalance", "hit_rate"],
                  [[problem.built.n_samples, problem.built.n_nodes, p.get("raw_tokens"), p.get("dedup_tokens"),
                    p.get("computed_tokens"), p.get("makespan_s"), p.get("imbalance"), p.get("hit_rate")]])
    return [Table(f"workers (sharing: {plan.sharing})", ["worker", "compute_s", "exchange_s", "samples",
                                                          "nodes_computed", "nodes_received", "memory_GiB",
                                                          "hit_rate"], rows), batch]


def draw(problem: PsrlProblem, plan: PsrlPlan, path: Any) -> None:
    """Write a PNG: per-worker load bars (compute and K/V exchange) and, for small batches, the forest
    with each node coloured by the worker computing it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure
    from gpuplan.viz import PALETTE, legend_outside

    parts = _worker_parts(problem, plan)
    f = problem.built
    small = f.n_nodes <= 400
    fig, axes = plt.subplots(1, 2 if small else 1, figsize=(16 if small else 9, 0.35 * len(parts) + 3))
    ax = axes[0] if small else axes
    for i, (name, comp, recv, *_rest) in enumerate(parts):
        ax.barh(i, comp, color=PALETTE["forward"], label="compute (forward + backward)" if i == 0 else None)
        ax.barh(i, recv, left=comp, color=PALETTE["comm"], label="K/V + dK/dV exchange" if i == 0 else None)
    ax.axvline(plan.predicted.get("makespan_s", 0.0), color="k", ls="--", label="makespan")
    ax.set_yticks(range(len(parts)), [p[0] for p in parts])
    ax.set_xlabel("modelled update time (s)")
    ax.set_title(f"{problem.name or 'psrl'}: per-worker load ({plan.solver.name if plan.solver else 'plan'})")
    legend_outside(ax)
    if small:
        tree = axes[1]
        owner: dict[int, int] = {}
        names = problem.worker_names()
        nidx = {nid: i for i, nid in enumerate(f.ids)}
        for w, n in enumerate(names):
            for nid in plan.computed.get(n, []):
                owner.setdefault(nidx.get(nid, -1), w)
        x = {}
        leaves = 0
        for v in range(f.n_nodes - 1, -1, -1):  # children before parents (reverse topological)
            if not f.children[v]:
                x[v] = float(leaves)
                leaves += 1
            else:
                x[v] = sum(x[c] for c in f.children[v]) / len(f.children[v])
        cmap = plt.get_cmap("tab20")
        for v in range(f.n_nodes):
            p = f.parent[v]
            if p >= 0:
                tree.plot([x[p], x[v]], [f.pos[v], f.pos[v]], color="0.8", lw=0.8)
            tree.plot([x[v], x[v]], [f.pos[v], f.pos[v] + f.tokens[v]], lw=3,
                      color=cmap(owner[v] % 20) if v in owner else "0.6")
        from matplotlib.lines import Line2D

        shown = sorted(set(owner.values()))[:20]
        tree.legend([Line2D([0], [0], color=cmap(w % 20), lw=3) for w in shown], [names[w] for w in shown],
                    fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="computed on",
                    title_fontsize=7)
        tree.invert_yaxis()
        tree.set_ylabel("token position")
        tree.set_xticks([])
        tree.set_title("prefix forest (segments coloured by the worker computing them)")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=100)
