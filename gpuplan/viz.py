"""Figures shared across kinds: one palette, one legend convention, every axis with its unit.

Convention: the legend sits outside the axes on the right (never over data); titles say what is
drawn and on which input; time axes are in seconds (or a stated multiple); the same thing has the
same colour in every kind (PALETTE). Solver roles and policies get the colours of ROLE_COLOURS
and SERIES in a fixed order. matplotlib is imported only when a figure is drawn (the `plot` extra).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from gpuplan.errors import InputError

# One colour per meaning, for every kind's figures (colour-blind safe: Okabe-Ito).
PALETTE: dict[str, str] = {
    "forward": "#0072B2",      # blue
    "backward": "#E69F00",     # orange (backward input gradient, or whole backward)
    "weight": "#009E73",       # green (weight gradient / split backward W)
    "comm": "#CC79A7",         # purple-pink: collectives and transfers
    "exposed": "#D55E00",      # vermilion: communication not hidden behind compute
    "idle": "#BBBBBB",         # grey
    "repetend": "#F0E442",     # yellow band
    "measured": "#000000",     # black: measured points
    "predicted": "#56B4E9",    # sky blue: model predictions
}

# Series (policies, solvers, dtypes) in a fixed order.
SERIES: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442",
                           "#000000", "#999999")

ROLE_COLOURS: dict[str, str] = {"paper": "#0072B2", "variant": "#56B4E9", "exact": "#009E73",
                                "baseline": "#999999"}


def series_colour(i: int) -> str:
    """Return the i-th series colour (cycles)."""
    return SERIES[i % len(SERIES)]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_outside(ax: Any, **kwargs: Any) -> None:
    """Place the legend of `ax` outside the axes on the right, so it never hides data; return None."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kwargs)


def _save(fig: Any, path: Path) -> Path:
    from gpuplan.io import atomic_write_figure

    fig.tight_layout()
    return atomic_write_figure(fig, path)


def compare_figure(kind: str, rows: Sequence[tuple[str, Any, dict[str, Any]]], path: Path) -> Path:
    """Draw a bar chart of every solver's objective (rows as returned by gpuplan.compare: (solver,
    plan, summary)) to `path`; solvers without a solution get an empty slot labelled with their status.
    Return the path. The axis is labelled with the plan's objective name (its unit included)."""
    from gpuplan import registry

    roles = {s.name: s.role for s in registry.solvers(kind)}
    names, values, colours, notes = [], [], [], []
    objective_name = ""
    for name, plan, summary in rows:
        value = getattr(plan, "objective", None) if plan is not None else None
        objective_name = objective_name or (getattr(plan, "objective_name", "") if plan is not None else "")
        ok = plan is not None and getattr(plan, "ok", False) and value is not None and math.isfinite(value)
        names.append(name)
        values.append(float(value) if ok else 0.0)
        colours.append(ROLE_COLOURS.get(roles.get(name, "baseline"), "#999999"))
        reason = getattr(plan, "message", "") if plan is not None and not ok else ""
        notes.append("" if ok else str(summary.get("status", "no plan")) + (f": {reason}" if reason else ""))
    if not names:
        raise InputError("compare --png: no solver ran, nothing to draw", field="--solvers")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(names) + 2), 4.2))
    bars = ax.bar(range(len(names)), values, color=colours, edgecolor="black", linewidth=0.4)
    for i, (b, note) in enumerate(zip(bars, notes)):
        text = note if note else f"{values[i]:.4g}"
        ax.annotate(text if len(text) <= 48 else text[:47] + "…", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                    fontsize=7, rotation=90 if note else 0, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    import textwrap

    ax.set_ylabel("\n".join(textwrap.wrap(objective_name or "objective", 34)), fontsize=9)
    ax.set_title(f"{kind}: every solver's objective on the same input")
    from matplotlib.patches import Patch

    used = [r for r in ROLE_COLOURS if r in {roles.get(n, "baseline") for n in names}]
    ax.legend(handles=[Patch(color=ROLE_COLOURS[r], label=r) for r in used], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, title="solver role")
    ax.margins(y=0.15)
    return _save(fig, path)


def jct_cdf_figure(title: str, jct_by_policy: dict[str, Sequence[float]], path: Path) -> Path:
    """Draw the empirical CDF of job completion times (hours) per policy to `path`; return the path."""
    if not jct_by_policy or not any(len(v) for v in jct_by_policy.values()):
        raise InputError("simulate --png: no job finished, nothing to draw", field="--png")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (policy, values) in enumerate(jct_by_policy.items()):
        hours = sorted(v / 3600.0 for v in values)
        if not hours:
            continue
        fractions = [(k + 1) / len(hours) for k in range(len(hours))]
        ax.step(hours, fractions, where="post", color=series_colour(i), label=policy, linewidth=1.4)
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs finished (CDF)")
    ax.set_ylim(0, 1.02)
    if max(max(v) for v in jct_by_policy.values() if len(v)) / max(min(min(v) for v in jct_by_policy.values()
                                                                         if len(v)), 1e-9) > 100:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    legend_outside(ax, title="policy")
    return _save(fig, path)


def profile_figure(profile: Any, path: Path) -> Path:
    """Draw a profile: matmul throughput (TFLOP/s) against matrix size per device type and dtype,
    each collective's measured time (s) against message size (bytes) with its alpha-beta fit, and
    (when the profile timed layers) one transformer layer's forward and backward time (ms) against
    the micro-batch size. Return the path."""
    plt = _pyplot()
    layer_costs = [c for t in getattr(profile, "layers", []) for c in t.costs if c.part == "layer" and c.tp == 1]
    rows = 3 if layer_costs else 2
    fig, axes = plt.subplots(rows, 1, figsize=(11, 3.6 * rows + 0.5))
    ax1, ax2 = axes[0], axes[1]
    i = 0
    for dt in profile.device_types:
        by_dtype: dict[str, list[Any]] = {}
        for point in dt.matmul:
            by_dtype.setdefault(point.dtype, []).append(point)
        for dtype, points in by_dtype.items():
            points.sort(key=lambda p: p.n)
            ax1.plot([p.n for p in points], [p.tflops for p in points], marker="o", color=series_colour(i),
                     label=f"{dt.name} {dtype}")
            i += 1
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("square matmul size n (n x n x n)")
    ax1.set_ylabel("measured throughput (TFLOP/s)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("matmul: measured throughput")
    ax1.grid(alpha=0.3)
    if i:
        legend_outside(ax1)
    for j, c in enumerate(profile.collectives):
        colour = series_colour(j)
        sizes = [p.size_bytes for p in c.points]
        label = f"{c.op} {c.backend} x{c.group_size} ({c.scope.replace('_', '-')})"
        ax2.plot(sizes, [p.timing.median_s for p in c.points], "o", color=colour, markersize=4,
                 label=f"{label}: measured (median)")
        if c.fit is not None and sizes:
            lo, hi = min(sizes), max(sizes)
            xs = [lo * (hi / lo) ** (k / 40) for k in range(41)] if hi > lo else [lo]
            ax2.plot(xs, [c.fit.time_s(x) for x in xs], "-", color=colour, linewidth=1,
                     label=f"fit: {c.fit.alpha_s * 1e6:.3g} us + size / {c.fit.bandwidth_GBps:.3g} GB/s")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("message size (bytes)")
    ax2.set_ylabel("time (s)")
    ax2.set_title("collectives: measured time and alpha-beta fit")
    ax2.grid(alpha=0.3)
    if profile.collectives:
        legend_outside(ax2)
    if layer_costs:
        ax3 = axes[2]
        markers = "osD^v<>"
        groups: dict[tuple[str, int], list[Any]] = {}
        for c in layer_costs:
            groups.setdefault((c.device_type, c.seq_len), []).append(c)
        for g, ((device, seq), costs) in enumerate(sorted(groups.items())):
            costs.sort(key=lambda c: c.micro_batch)
            mb = [c.micro_batch for c in costs]
            ax3.plot(mb, [c.forward_s * 1e3 for c in costs], marker=markers[g % len(markers)],
                     color=PALETTE["forward"], label=f"{device}, seq {seq}: forward")
            ax3.plot(mb, [c.backward_s * 1e3 for c in costs], marker=markers[g % len(markers)], linestyle="--",
                     color=PALETTE["backward"], label=f"{device}, seq {seq}: backward")
        from matplotlib.ticker import MaxNLocator

        ax3.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax3.set_xlabel("micro-batch size (sequences)")
        ax3.set_ylabel("time per layer (ms)")
        ax3.set_ylim(bottom=0)
        ax3.set_title("one transformer layer: measured time", fontsize=10)
        ax3.grid(alpha=0.3)
        legend_outside(ax3)
    fig.suptitle(f"profile of {profile.host} (torch {profile.torch_version})", fontsize=10)
    return _save(fig, path)


def relay_tree(ax: Any, edges: Sequence[tuple[str, str, float]], arrival_s: dict[str, float],
               region: dict[str, str], root: str) -> None:
    """Draw a relay tree on `ax` as a transfer timeline: each node at the time (s) it holds the whole
    payload (the root at 0), one row per node in depth-first order; an arrow per edge (parent, child,
    rate in Gb/s) labelled with its rate; nodes coloured by region with a key outside. Return None."""
    children: dict[str, list[str]] = {}
    for parent, child, _ in edges:
        children.setdefault(parent, []).append(child)
    order: list[str] = []

    def visit(node: str) -> None:
        order.append(node)
        for c in sorted(children.get(node, []), key=lambda c: arrival_s.get(c, 0.0)):
            visit(c)

    visit(root)
    row = {n: i for i, n in enumerate(order)}
    regions = list(dict.fromkeys(region.get(n, "?") for n in order))
    colour = {r: series_colour(i) for i, r in enumerate(regions)}
    x = {n: (0.0 if n == root else arrival_s.get(n, 0.0)) for n in order}
    for parent, child, gbps in edges:
        if parent not in row or child not in row:
            continue
        ax.annotate("", xy=(x[child], row[child]), xytext=(x[parent], row[parent]),
                    arrowprops={"arrowstyle": "->", "color": PALETTE["comm"], "lw": 1.2})
        ax.text((x[parent] + x[child]) / 2, (row[parent] + row[child]) / 2, f"{gbps:.3g} Gb/s", fontsize=7,
                ha="center", va="bottom", color="#444444")
    seen: set[str] = set()
    for n in order:
        r = region.get(n, "?")
        ax.scatter([x[n]], [row[n]], s=90, color=colour[r], edgecolor="black", zorder=3,
                   label=r if r not in seen else None)
        seen.add(r)
    ax.set_yticks(range(len(order)), order)
    ax.invert_yaxis()
    ax.set_xlabel("time the whole payload is held (s)")
    ax.set_title("relay tree: who sends to whom, and when each worker has the weights", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.12, y=0.1)
    legend_outside(ax, title="region")


def _series_pairs(columns: Sequence[str]) -> list[tuple[str, list[int], int]]:
    """Return (what, predicted column indices, measured column index) for each measured column of a
    report table whose predictions sit beside it ("fwd plan", "fwd shared" next to "fwd measured";
    "predicted_s" next to "measured_s"; "plan" next to "measured")."""
    out = []
    for m, name in enumerate(columns):
        low = name.lower()
        if "measured" not in low or "error" in low or "/" in low:
            continue
        prefix = low.replace("measured", "").replace("_s", "").strip(" _")
        preds = [i for i, c in enumerate(columns) if i != m and "error" not in c.lower() and "/" not in c
                 and any(w in c.lower() for w in ("plan", "predicted", "shared"))
                 and c.lower().replace("predicted", "").replace("plan", "").replace("shared", "")
                 .replace("_s", "").strip(" _") == prefix]
        if preds:
            out.append((prefix, preds, m))
    return out


def run_figure(title: str, tables: Sequence[Any], path: Path) -> Path:
    """Draw predicted next to measured for every report table of `gpuplan run` that pairs them (one
    panel per table, one group of bars per row: each prediction, then the measurement in black).
    Units follow the table: columns ending in _s are seconds, tables titled '(ms...' are ms. Return
    the path; raise InputError when no table pairs a prediction with a measurement."""
    panels = [(t, _series_pairs(t.columns)) for t in tables]
    panels = [(t, pairs) for t, pairs in panels if pairs and t.rows]
    if not panels:
        raise InputError("run --png: the run reported no predicted-vs-measured table to draw", field="--png")
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels) + 0.6), squeeze=False)
    for ax, (table, pairs) in zip(axes[:, 0], panels):
        series: list[tuple[str, int, str]] = []
        for what, preds, m in pairs:
            for k, p in enumerate(preds):
                series.append((table.columns[p], p, series_colour(k + 1) if k else PALETTE["predicted"]))
            series.append((table.columns[m], m, PALETTE["measured"]))
        width = 0.8 / len(series)
        labels = [" ".join(str(c) for c in row[:2] if isinstance(c, str)) or str(row[0]) for row in table.rows]
        for j, (name, col, colour) in enumerate(series):
            values = [row[col] if isinstance(row[col], (int, float)) and not isinstance(row[col], bool) else 0.0
                      for row in table.rows]
            ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(values))], values, width,
                   color=colour, label=name, edgecolor="black", linewidth=0.3)
        ax.set_xticks(range(len(labels)), [lab[:40] for lab in labels], fontsize=7, rotation=15, ha="right")
        unit = "s" if any(table.columns[c].endswith("_s") for _, c, _ in series) else (
            "ms" if "(ms" in table.title else "value as in the table")
        ax.set_ylabel(f"time ({unit})" if unit in ("s", "ms") else unit)
        head = table.title.split(";")[0][:110]
        ax.set_title(head + ")" * (head.count("(") - head.count(")")), fontsize=9, loc="left")
        legend_outside(ax)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)
