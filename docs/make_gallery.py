"""Regenerate docs/gallery.md and docs/gallery/*.png from the shipped examples.

    python docs/make_gallery.py            # from the repository root; about a minute on 2 cores

Every figure is drawn by the same code the CLI uses (`show --png`, `compare --png`,
`simulate oef --png`, `profile show --png`); nothing here draws on its own. Needs the plot extra.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gpuplan  # noqa: E402
from gpuplan import registry  # noqa: E402
from gpuplan.models.profile import load_profile  # noqa: E402
from gpuplan.viz import compare_figure, jct_cdf_figure, profile_figure  # noqa: E402

OUT = ROOT / "docs" / "gallery"
PAGE = ROOT / "docs" / "gallery.md"

# (kind, example, what the figure shows)
PLANS = [
    ("oef", "examples/oef/four-tenants.yaml", "each job's time share of every GPU type, and the rounds on GPU ids"),
    ("poseidon", "examples/poseidon/h100-a100-small.yaml", "one iteration of the chosen pipeline (per stage)"),
    ("tessel", "examples/tessel/1f1b-4.yaml", "the schedule found, its repetend shaded"),
    ("lagom", "examples/lagom/small.yaml", "compute and communication of the tuned NCCL settings"),
    ("aurora", "examples/aurora/small-2regions.yaml", "when each worker's weights arrive against the step time"),
]
COMPARES = [("oef", "examples/oef/four-tenants.yaml"), ("tessel", "examples/tessel/1f1b-4.yaml")]
TRACE = "examples/oef/trace-100.yaml"
PROFILE = "examples/profile/cpu-2core-quick.json"


def build(time_limit_s: float = 20.0, out_dir: Path = OUT, page: Path = PAGE) -> list[Path]:
    """Draw every gallery figure into `out_dir` and write the page `page` linking them; return the PNG
    paths written."""
    OUT = out_dir
    OUT.mkdir(parents=True, exist_ok=True)

    def _rel(path: Path) -> str:
        return Path(__import__("os").path.relpath(path, page.parent)).as_posix()

    written: list[Path] = []
    lines = ["# Gallery", "",
             "Every figure below is regenerated from the shipped examples by `python docs/make_gallery.py`,",
             "with the code the CLI runs. Colours mean the same thing in every kind (`gpuplan/viz.py`, `PALETTE`):",
             "forward blue, backward orange, weight gradient green, communication pink, exposed communication",
             "vermilion, idle grey; the paper's solver is dark blue and baselines grey in comparisons.", ""]
    lines += ["## Plans (`gpuplan show PLAN --png FILE`)", ""]
    for kind, example, what in PLANS:
        problem = gpuplan.load_problem(ROOT / example)
        plan = gpuplan.solve(problem, time_limit_s=time_limit_s, seed=0)
        png = OUT / f"show-{kind}.png"
        registry.model(kind).draw(problem, plan, png)  # type: ignore[misc]
        written.append(png)
        lines += [f"### {kind}: {what}", "", f"`gpuplan solve {kind} {example} -o plan.json && "
                  f"gpuplan show plan.json --png {kind}.png`", "", f"![{kind} plan]({_rel(png)})", ""]
    lines += ["## Comparisons (`gpuplan compare KIND INPUT --png FILE`)", ""]
    for kind, example in COMPARES:
        rows = gpuplan.compare(gpuplan.load_problem(ROOT / example), time_limit_s=time_limit_s, seed=0)
        png = compare_figure(kind, rows, OUT / f"compare-{kind}.png")
        written.append(png)
        lines += [f"### {kind}: every solver's objective on {example}", "",
                  f"`gpuplan compare {kind} {example} --png compare.png`", "", f"![{kind} comparison]({_rel(png)})",
                  ""]
    from gpuplan.models.oef_trace import load_trace
    from gpuplan.solvers.oef.sim import simulate

    trace = load_trace(ROOT / TRACE)
    policies = ["oef", "gavel-maxmin", "max-throughput", "equal-share"]
    jct = {p: list(simulate(trace, p).jct_s.values()) for p in policies}
    png = jct_cdf_figure(f"oef: JCT of {len(trace.jobs)} jobs of {TRACE} (grid rounds)", jct, OUT / "simulate-oef.png")
    written.append(png)
    lines += ["## Simulation (`gpuplan simulate oef TRACE --png FILE`)", "",
              f"`gpuplan simulate oef {TRACE} " + " ".join(f"--policy {p}" for p in policies) + " --png jct.png`",
              "", f"![JCT CDF]({_rel(png)})", ""]
    png = profile_figure(load_profile(ROOT / PROFILE), OUT / "profile.png")
    written.append(png)
    lines += ["## Profile (`gpuplan profile show FILE --png FILE`)", "",
              f"`gpuplan profile show {PROFILE} --png profile.png`: matmul throughput against size, and each",
              "collective's measured time against message size with the alpha-beta fit the solvers use, and one",
              "transformer layer's forward and backward time against the micro-batch size.", "",
              f"![profile]({_rel(png)})", ""]
    page.write_text("\n".join(lines))
    return written


if __name__ == "__main__":
    started = time.perf_counter()
    paths = build()
    print(f"gallery: {len(paths)} figures and {PAGE.relative_to(ROOT)} written in "
          f"{time.perf_counter() - started:.1f} s")
