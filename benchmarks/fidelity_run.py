"""Fidelity section (c): the docs/index.md profile-solve-run path on this machine.

For 2, 3 and 4 pipeline stages over two emulated device types (`cpu`, and `cpu-slow2x` = the CPU
slowed down 2x), on the model of examples/poseidon/cpu-two-types.yaml:

1. `gpuplan profile --quick --for PROBLEM --cpu-ranks 4 --emulate cpu-slow2x=cpu*2` (once: the
   same model, sequence length and batch for every stage count), run as a command;
2. `gpuplan solve poseidon PROBLEM --profile profile.json --option num_stages=S`, run as a command;
3. the plan run by `gpuplan.api.run` (what `gpuplan run PLAN` calls) with 7 measured steps, after
   waiting (up to --wait seconds) for other processes to leave the cores; a run the contention
   monitor still calls contended is run once more after another wait, and when that one is contended
   too its error is printed but not judged against the target (the measurement is not the plan's own).

Printed per stage count: the plan's own iteration time (the DAG; devices share nothing), the plan
with the workers sharing the idle cores (processor sharing at min(1, cores / k)), the plan with the
core-sharing rates measured just before the run, the measured median and fastest step, per-stage
forward/backward predicted vs measured, and the machine's load before and during the run. Every
prediction uses only figures known before the run; nothing is fitted to the measurement.

Run alone: .venv/bin/python benchmarks/fidelity_run.py [--stages 2,3,4] [--steps 7]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "poseidon" / "cpu-two-types.yaml"
TARGET = 0.15


def _gpuplan(*args: str) -> str:
    """Run the gpuplan command line (this interpreter's) and return its output; raise on failure."""
    cmd = [sys.executable, "-m", "gpuplan.cli", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"gpuplan {' '.join(args)} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done.stdout


def _problem_file(folder: Path, stages: int) -> Path:
    """Write the example problem with ceil(S/2) `cpu` and floor(S/2) `cpu-slow2x` devices."""
    doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    doc["name"] = f"cpu-two-types-{stages}"
    doc["cluster"]["nodes"] = [{"name": "cpu0", "gpus": {"cpu": (stages + 1) // 2, "cpu-slow2x": stages // 2}}]
    path = folder / f"problem-{stages}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _pct(x: float) -> str:
    return f"{x:+.1%}" if not math.isnan(x) else "nan"


def _share(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.0%}"


def run_when_quiet(plan, steps: int, wait_s: float, tries: int = 2) -> tuple[dict, list[str]]:  # type: ignore[no-untyped-def]
    """Return (`api.run` figures, notes): each try waits up to `wait_s` seconds for a quiet machine
    (other processes under 10 % of the cores) and runs the plan; a contended run is retried, at most
    `tries` runs in all; the last run is returned."""
    from gpuplan import api
    from gpuplan.runtime.contention import wait_quiet

    notes = []
    for attempt in range(1, tries + 1):
        window, waited = wait_quiet(wait_s)
        out = api.run(plan, steps=steps)
        notes.append(f"try {attempt}: waited {waited:.0f} s for a quiet machine (others "
                     f"{_share(window.others_share)} of the cores then); contended: "
                     f"{'YES' if out['contended'] else 'no'}")
        if not out["contended"]:
            break
    return out, notes


def section_c(stages: tuple[int, ...] = (2, 3, 4), steps: int = 7, wait_s: float = 120.0) -> list[str]:
    """Return the printed lines of section (c): profile once, then solve and run 2-, 3- and 4-stage
    plans; predicted vs measured iteration and per-stage times (seconds / ms) and the machine load."""
    from gpuplan import api
    from gpuplan.models.base import Table
    from gpuplan.render import table_text

    lines: list[str] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuplan-fidelity-") as tmp:
        folder = Path(tmp)
        problems = {s: _problem_file(folder, s) for s in stages}
        profile = folder / "profile.json"
        from gpuplan.runtime.contention import wait_quiet

        window, waited = wait_quiet(wait_s)  # the profile's layer times are the plans' costs: measure them quietly
        lines.append(f"before the profile: waited {waited:.0f} s for a quiet machine (others "
                     f"{_share(window.others_share)} of the cores then)")
        _gpuplan("profile", "--quick", "-q", "--for", str(problems[max(stages)]), "--cpu-ranks", str(max(stages)),
                 "--emulate", "cpu-slow2x=cpu*2", "-o", str(profile))
        lines.append(f"profile: gpuplan profile --quick --for <problem> --cpu-ranks {max(stages)} "
                     f"--emulate cpu-slow2x=cpu*2 (model of {EXAMPLE.name}, layers timed by process CPU time)")
        for s in stages:
            plan_file = folder / f"plan-{s}.json"
            _gpuplan("solve", "poseidon", str(problems[s]), "--profile", str(profile), "--option", f"num_stages={s}",
                     "-q", "-o", str(plan_file))
            plan = api.load_plan(plan_file)
            out, notes = run_when_quiet(plan, steps, wait_s)
            meas = out["measured_iteration_s"]
            shape = " | ".join(f"{st.device_type}:{st.num_layers}L" for st in plan.stages)
            lines.append(f"{s} stages ({shape}, m={plan.num_microbatches}, {out['world_size']} workers on "
                         f"{out['cores']} cores, sharing rates of its stages measured before the run "
                         f"{[round(r, 2) for r in out['core_sharing_rates']]}, extra CPU time per call after a wait on busy "
                         f"cores: forward {out['cold_forward_s'] * 1e3:.3f} ms, backward "
                         f"{out['cold_backward_s'] * 1e3:.3f} ms; wake-up delay {out['wake_s'] * 1e3:.3f} ms; "
                         f"emulated sleep ends {out['sleep_late_s'] * 1e3:.3f} ms late; stage compute timed the executor's way "
                         f"before the run over the profile's, forward/backward: "
                         f"{', '.join(f'{a:.2f}/{b:.2f}' for a, b in out['compute_ratios'])}; others took "
                         f"{_share(out['probe_others_share'])} of the cores during that probe, "
                         f"{out['probe_attempts']} attempt(s)):")
            lines += [f"  {n}" for n in notes]
            lines.append(f"  iteration: plan {plan.iteration_time_s:.4f} s ({_pct(plan.iteration_time_s / meas - 1)}), "
                         f"plan on idle cores {out['predicted_idle_cpu_iteration_s']:.4f} s "
                         f"({_pct(out['predicted_idle_cpu_iteration_s'] / meas - 1)}), plan with its stages' sharing measured "
                         f"before the run at the profile's compute speed "
                         f"{out['predicted_cpu_profile_speed_iteration_s']:.4f} s "
                         f"({_pct(out['predicted_cpu_profile_speed_iteration_s'] / meas - 1)}), the same with each "
                         f"stage's compute at the speed timed before the run (the prediction for this machine) "
                         f"{out['predicted_cpu_iteration_s']:.4f} s ({_pct(out['predicted_cpu_iteration_s'] / meas - 1)}); "
                         f"measured median {meas:.4f} s, fastest {out['measured_fastest_iteration_s']:.4f} s, "
                         f"steps {[round(x, 4) for x in out['measured_step_s']]}")
            compute_err = 0.0
            for k, st in enumerate(plan.stages):
                fm, bm = out[f"stage{k}_forward_measured_s"], out[f"stage{k}_backward_measured_s"]
                factor = out[f"stage{k}_slowdown"]
                fc, bc = out[f"stage{k}_forward_cpu_measured_s"], out[f"stage{k}_backward_cpu_measured_s"]
                fe, be = st.forward_s / factor / fc - 1, st.backward_s / factor / bc - 1
                compute_err = max(compute_err, abs(fe), abs(be), key=abs)
                lines.append(f"  stage {k} {st.device_type} (x{out[f'stage{k}_slowdown']:g}, {st.num_layers} layers, "
                             f"micro-batch {st.micro_batch_size}): forward plan {st.forward_s * 1e3:.2f} ms / shared "
                             f"{out[f'stage{k}_forward_predicted_cpu_s'] * 1e3:.2f} / measured {fm * 1e3:.2f} "
                             f"({_pct(st.forward_s / fm - 1)}); backward plan {st.backward_s * 1e3:.2f} ms / shared "
                             f"{out[f'stage{k}_backward_predicted_cpu_s'] * 1e3:.2f} / measured {bm * 1e3:.2f} "
                             f"({_pct(st.backward_s / bm - 1)}); compute (process CPU time, no slowdown): forward "
                             f"{st.forward_s / factor * 1e3:.2f} / {fc * 1e3:.2f} ({_pct(fe)}), backward "
                             f"{st.backward_s / factor * 1e3:.2f} / {bc * 1e3:.2f} ({_pct(be)}); timed before the "
                             f"run (no pipeline runtime): forward {out.get(f'stage{k}_forward_now_s', 0) * 1e3:.2f}, "
                             f"backward {out.get(f'stage{k}_backward_now_s', 0) * 1e3:.2f}")
            lines.append(f"  machine: {out['verdict']}")
            err = out["predicted_cpu_iteration_s"] / meas - 1
            prof_speed = out["predicted_cpu_profile_speed_iteration_s"]
            rows.append([s, shape, plan.num_microbatches, plan.iteration_time_s, out["predicted_idle_cpu_iteration_s"],
                         prof_speed, out["predicted_cpu_iteration_s"], meas, out["measured_fastest_iteration_s"],
                         _pct(plan.iteration_time_s / meas - 1),
                         _pct(out["predicted_idle_cpu_iteration_s"] / meas - 1), _pct(prof_speed / meas - 1), _pct(err),
                         "not judged (contended)" if out["contended"] else "yes" if abs(err) <= TARGET else "NO",
                         f"{out['load_before']:.2f}" if out["load_before"] is not None else "?",
                         f"{out['load_during_max']:.2f}" if out["load_during_max"] is not None else "?",
                         _share(out["others_cpu_share_before"]), _share(out["others_cpu_share_during"]),
                         f"{out['step_spread']:.0%}", "YES" if out["contended"] else "no", f"{compute_err:.1%}"])
    lines.append(table_text(Table(
        "profile-solve-run, predicted vs measured iteration (s, median step); plan: the plan's own DAG time; "
        "idle cores: the plan with its workers sharing this machine's idle cores; shared = the prediction for this "
        "machine (gpuplan.runtime.poseidon): the plan with the core-sharing rates of its own stages and their "
        "compute speed (the probe's timing of their modules over the layer table's) measured just before the run; "
        "profile speed: the same at the profile's compute speed; target within 15 % (shared)",
        ["stages", "plan", "m", "plan_s", "idle-cores_s", "profile-speed_s", "shared_s", "measured_s", "fastest_s",
         "error (plan)", "error (idle cores)", "error (profile speed)", "error (shared)", "within 15%", "load before", "load during (max)", "others CPU before",
         "others CPU during", "step spread", "contended", "worst stage compute error (CPU time)"], rows)))
    judged = [r for r in rows if not str(r[13]).startswith("not judged")]
    met = sum(1 for r in judged if r[13] == "yes")
    lines.append(f"target within 15 %: met for {met} of {len(judged)} judged plans"
                 + (f"; {len(rows) - len(judged)} not judged: the machine stayed contended through both tries, "
                    f"so those measurements include other processes' work" if len(judged) < len(rows) else ""))
    lines.append("load: 1-minute load average (during: includes this run's workers); others CPU: the share of "
                 "all cores used by processes other than this run; contended: others used 10 % or more; stage "
                 "compute error: the plan's per-op time without the emulated slowdown vs the op's process CPU time "
                 "in the run (waiting for a core does not count), the worst |error| over stages, forward and backward")
    return lines


def main() -> int:
    """Print section (c) alone."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default="2,3,4", help="comma-separated stage counts (default 2,3,4)")
    parser.add_argument("--steps", type=int, default=7, help="measured steps per run (default 7)")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to wait for a quiet machine before each run (default 120)")
    args = parser.parse_args()
    for line in section_c(tuple(int(x) for x in args.stages.split(",")), args.steps, args.wait):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
