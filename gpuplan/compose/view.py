"""The composed timeline of a training bundle as a PNG: Tessel's schedule on Poseidon's stages, each
stage's gradient reduction and optimizer step after its last block (times with Lagom's settings)."""

from __future__ import annotations

from pathlib import Path

from gpuplan.compose.bundle import load_bundle
from gpuplan.compose.pipeline import composed_time_s, stage_tails_s

from gpuplan.viz import PALETTE  # noqa: E402  (one palette across kinds)

COLOURS = {"F": PALETTE["forward"], "B": PALETTE["backward"], "W": PALETTE["weight"], "tail": PALETTE["idle"]}


def draw_bundle(directory: str | Path, path: Path) -> None:
    """Write a Gantt chart PNG of the bundle's composed iteration: one row per stage (device type, tp x
    dp), forward / input-gradient / weight-gradient blocks by micro-batch, then the stage's tail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from gpuplan.io import atomic_write_figure

    manifest, plans = load_bundle(directory)
    doc = plans["poseidon.json"].document()
    schedule = plans["tessel.json"].schedule  # type: ignore[attr-defined]
    tails = stage_tails_s(doc, [float(x) for x in manifest["scales"]])
    total = composed_time_s(schedule, tails)
    n = len(schedule)
    fig, ax = plt.subplots(figsize=(14.0, 0.55 * n + 1.6))
    for d, dev in enumerate(schedule):
        end = max((e.end_s for e in dev), default=0.0)
        for e in dev:
            ax.barh(d, e.end_s - e.start_s, left=e.start_s, height=0.8, color=COLOURS.get(e.block[0], "tab:purple"),
                    edgecolor="black", linewidth=0.3)
        ax.barh(d, tails[d], left=end, height=0.8, color=COLOURS["tail"], edgecolor="black", linewidth=0.3)
    st = doc["stages"]
    ax.set_yticks(range(n), [f"stage {s}: {st[s]['device_type']} {st[s]['tp']}x{st[s]['dp']}" for s in range(n)])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    base = manifest["predicted"].get("baseline_iteration_time_s", total)
    ax.set_title(f"composed iteration {total:.4g} s (Poseidon + 1F1B + NCCL defaults: {base:.4g} s)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in
                       (("forward", COLOURS["F"]), ("backward (input)", COLOURS["B"]),
                        ("backward (weight)", COLOURS["W"]), ("grad reduce + optimizer", COLOURS["tail"]))],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)
