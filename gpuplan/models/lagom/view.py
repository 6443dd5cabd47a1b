"""How Lagom plans are shown and compared: `compare` columns, `gpuplan show` tables, the timeline PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplan.models.base import Table
from gpuplan.models.lagom.compiled import Theta
from gpuplan.models.lagom.plan import LagomPlan, timeline
from gpuplan.models.lagom.problem import LagomProblem


def _nccl_default(problem: LagomProblem) -> list[Theta]:
    comp = problem.compiled
    return [comp.nccl_default(i) for i in range(len(comp.ops))]


def summarize(problem: LagomProblem, plan: LagomPlan) -> dict[str, Any]:
    """Return the `compare` columns: iteration (ms), speedup over NCCL's default, exposed comm (ms),
    the worst compute slowdown, and the cost-model evaluations of the search."""
    comp = problem.compiled
    thetas = plan.thetas()
    default_us = comp.iteration_us(_nccl_default(problem))
    it_us = comp.iteration_us(thetas)
    compute_us = sum(w.compute_us for w in comp.windows)
    slow = max((float(comp.slowdown(i, t)) for i, t in enumerate(thetas) if comp.windows[comp.window_of[i]].compute_us),
               default=1.0)
    stats = plan.solver.stats if plan.solver else {}
    return {"iteration_ms": it_us / 1e3, "speedup_vs_nccl": default_us / it_us,
            "exposed_ms": (it_us - compute_us) / 1e3, "max_slowdown": slow,
            "evaluations": stats.get("evaluations", 0)}


def _short(t: Theta) -> str:
    chunk = f"{t.chunk_bytes // 1024}K" if t.chunk_bytes < 2**20 else f"{t.chunk_bytes / 2**20:g}M"
    proto = {"Simple": "S"}.get(t.proto, t.proto)
    return f"{t.algo[0].upper()}/{proto} {t.channels}c {t.threads}t {chunk}"


def describe(problem: LagomProblem, plan: LagomPlan) -> list[Table]:
    """Return tables: the iteration under NCCL's default / AutoCCL-style / this plan side by side, the
    per-op settings and communication times (ms) under each, the windows with their bounding lane,
    the env vars and the per-group Options."""
    comp = problem.compiled
    columns = {"nccl-default": _nccl_default(problem)}
    if "autoccl" in plan.baselines:
        columns["autoccl"] = plan.thetas("autoccl")
    columns["plan"] = plan.thetas()
    compute_us = sum(w.compute_us for w in comp.windows)
    default_us = comp.iteration_us(columns["nccl-default"])
    side = []
    for name, thetas in columns.items():
        it = comp.iteration_us(thetas)
        side.append([name, it / 1e3, (it - compute_us) / 1e3, default_us / it])
    head = ["op", "MB", "window"] + [f"{n} (ms)" for n in columns] + ["plan slowdown"]
    rows = []
    for i, op in enumerate(comp.ops):
        win = comp.windows[comp.window_of[i]]
        row: list[Any] = [op.name, op.size_bytes / 1e6, win.name if win.compute_us else "exposed"]
        row += [f"{_short(th[i])}: {float(comp.comm_us(i, th[i])) / 1e3:.3g}" for th in columns.values()]
        row.append(float(comp.slowdown(i, columns["plan"][i])) if win.compute_us else None)
        rows.append(row)
    wins = Table("windows (critical path: the bounding lane of each)",
                 ["window", "bound", "start ms", "compute ms", "comm ms", "time ms", "ops"],
                 [[w.name, w.bound, w.start_s * 1e3, w.compute_s * 1e3, w.comm_s * 1e3, w.time_s * 1e3,
                   ",".join(w.ops)] for w in plan.windows])
    tables = [Table("predicted iteration: NCCL default / AutoCCL-style / this plan",
                    ["settings", "iteration ms", "beyond compute ms", "speedup vs NCCL"], side),
              Table("per op: algo/proto channels threads chunk: communication ms", head, rows), wins,
              Table("environment (NCCL reads it once per process)", ["variable", "value"],
                    [[k, v] for k, v in plan.env.items()]),
              Table("per process group: ProcessGroupNCCL.Options", ["group", "min_ctas", "max_ctas", "cga_cluster_size"],
                    [[g, o["min_ctas"], o["max_ctas"], o["cga_cluster_size"]] for g, o in plan.group_options.items()])]
    if plan.notes:
        tables.append(Table("notes", ["note"], [[n] for n in plan.notes]))
    return tables


def _draw_lanes(ax: Any, problem: LagomProblem, windows: list[Any], thetas: list[Theta], label: str) -> float:
    """Draw one settings' computation and communication lanes on `ax` (ms); return its iteration (ms)."""
    from gpuplan.viz import PALETTE

    comp = problem.compiled
    idx = {o.name: i for i, o in enumerate(comp.ops)}
    colors = {"compute": PALETTE["forward"], "comm": PALETTE["comm"], "exposed": PALETTE["exposed"]}
    for w, win in zip(windows, comp.windows):
        start = w.start_s * 1e3
        if win.compute_us:
            ax.broken_barh([(start, w.compute_s * 1e3)], (10, 8), facecolors=colors["compute"],
                           alpha=1.0 if w.bound != "comm" else 0.45, edgecolor="white", linewidth=0.3)
        t = start
        stretch = 1 + comp.consts.psi if win.compute_us else 1.0
        for name in w.ops:
            d = float(comp.comm_us(idx[name], thetas[idx[name]])) * stretch * comp.ops[idx[name]].count / 1e3
            ax.broken_barh([(t, d)], (0, 8), facecolors=colors[w.bound if w.bound == "exposed" else "comm"],
                           edgecolor="white", linewidth=0.3)
            t += d
    total_ms = max((w.start_s + w.time_s) * 1e3 for w in windows) if windows else 0.0
    ax.set_yticks([4, 14], ["communication", "computation"])
    ax.set_title(f"{label}: iteration {total_ms:.3f} ms", fontsize=10, loc="left")
    return total_ms


def draw(problem: LagomProblem, plan: LagomPlan, path: Path) -> None:
    """Write a PNG of the overlapped timeline (ms) under NCCL's default settings and under this plan's,
    one above the other on the same time axis: a computation lane and a communication lane each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from gpuplan.io import atomic_write_figure
    from gpuplan.viz import PALETTE

    default = _nccl_default(problem)
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(12, 4.8), sharex=True)
    base_ms = _draw_lanes(ax0, problem, timeline(problem, default), default, "NCCL default settings")
    plan_ms = _draw_lanes(ax1, problem, plan.windows, plan.thetas(), "this plan's settings")
    ax1.set_xlabel("time (ms)")
    ratio = base_ms / plan_ms if plan_ms else 1.0
    fig.suptitle(f"{problem.name or 'lagom'}: " + (f"iteration {100 * (1 - plan_ms / base_ms):.2g}% shorter than with NCCL's default settings"
                                                   if ratio > 1 + 1e-3 else "NCCL's default settings are already best"),
                 fontsize=11)
    handles = [Patch(color=PALETTE["forward"], label="computation"),
               Patch(color=PALETTE["forward"], alpha=0.45, label="computation (window bound by comm)"),
               Patch(color=PALETTE["comm"], label="communication (overlapped)"),
               Patch(color=PALETTE["exposed"], label="communication (exposed)")]
    ax0.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)
