"""The training composer: Poseidon -> Tessel -> Lagom, the bundle, its check, and `gpuplan plan train`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.compose import check_bundle, compose, read_manifest, write_bundle
from gpuplan.compose.pipeline import composed_time_s, stage_tails_s, tessel_problem, weight_fraction
from gpuplan.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "examples/poseidon/cpu-two-types.yaml"
# Two small GPU nodes of different types: every stage communicates over NCCL, so Lagom has work.
GPU = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 2}},
                                                 {"name": "a0", "gpus": {"A100-80GB": 2}}],
                                       "inter_node": {"bandwidth_GBps": "100 Gbps", "latency_s": "5 us"}},
       "model": "gpt3-1.3b", "global_batch": 16, "seq_len": 1024}


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpu") / "bundle"
    gpuplan.plan_training(str(CPU), output=out, time_limit_s=5)
    return out


@pytest.fixture(scope="module")
def gpu_comp() -> gpuplan.Plan:
    poseidon = gpuplan.solve("poseidon", GPU, time_limit_s=5)
    return compose(poseidon, time_limit_s=5)


def test_split_backward_keeps_the_stage_time() -> None:
    plan = gpuplan.solve("poseidon", str(CPU), time_limit_s=5).document()
    split, fused = tessel_problem(plan), tessel_problem(plan, split=False)
    for s, st in enumerate(plan["stages"]):
        dur = {b.name: b.duration_s for b in split.blocks}
        assert 0 < weight_fraction(plan, st) <= 0.5
        fdur = {b.name: b.duration_s for b in fused.blocks}
        assert dur[f"B{s}"] + dur[f"W{s}"] == pytest.approx(fdur[f"B{s}"])
    assert split.microbatches == plan["num_microbatches"] and split.devices == len(plan["stages"])
    # memory: at least what Poseidon's 1F1B holds on each stage
    assert all(c >= min(plan["num_microbatches"], len(plan["stages"]) - s)
               for s, c in enumerate(split.memory_limit_bytes))  # type: ignore[union-attr]


def test_bundle_is_valid_and_never_slower(cpu_bundle: Path) -> None:
    manifest = read_manifest(cpu_bundle)
    assert check_bundle(cpu_bundle) == []
    p = manifest["predicted"]
    assert p["iteration_time_s"] <= p["baseline_iteration_time_s"] * (1 + 1e-9)
    assert {"poseidon.json", "tessel.json"} <= set(manifest["files"])
    assert all(f["sha256"].startswith("sha256:") for f in manifest["files"].values())
    # CPU stages have no NCCL knobs: no Lagom plan, scale 1, and the note says so
    assert manifest["scales"] == [1.0, 1.0] and any("NCCL" in n for n in manifest["notes"])


def test_gpu_composition_uses_lagom_and_is_never_slower(gpu_comp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = gpu_comp
    assert c.lagom, "every GPU stage communicates, so each gets Lagom settings"
    assert all(0 < s <= 1 for s in c.scales)
    base = c.predicted["baseline_iteration_time_s"]
    assert c.predicted["iteration_time_s"] <= base * (1 + 1e-9)
    assert c.predicted["tessel_iteration_time_s"] <= base * (1 + 1e-9)
    # the stated time is the schedule's: recompute it
    doc = c.poseidon.document()
    assert composed_time_s(c.tessel.schedule, stage_tails_s(doc, c.scales)) == pytest.approx(
        c.predicted["iteration_time_s"])
    rows = c.gains()
    assert [r["iteration_time_s"] for r in rows][0] == base
    write_bundle(tmp_path / "b", c)
    assert check_bundle(tmp_path / "b") == []


def _restamp(bundle: Path, name: str) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    from gpuplan.compose.bundle import file_sha256

    manifest["files"][name]["sha256"] = file_sha256(bundle / name)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_check_catches_an_edited_file(cpu_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    doc = json.loads((b / "tessel.json").read_text())
    doc["makespan_s"] *= 0.5
    (b / "tessel.json").write_text(json.dumps(doc))
    assert any("digest" in v.message for v in check_bundle(b))


def test_check_catches_plans_that_disagree(cpu_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    poseidon = json.loads((b / "poseidon.json").read_text())
    # a schedule of the same stages with other micro-batches, stamped as if it belonged
    half = {**poseidon, "num_microbatches": poseidon["num_microbatches"] // 2}
    other = gpuplan.solve(tessel_problem(half, split=False),
                          solver="1f1b" if poseidon["interleave"] == 1 else "interleaved-1f1b")
    other.save(b / "tessel.json")
    _restamp(b, "tessel.json")
    codes = [v.code for v in check_bundle(b)]
    assert "agreement.microbatches" in codes


def test_check_catches_a_schedule_of_other_stage_times(cpu_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["scales"] = [0.5, 1.0]   # the schedule was not solved for these times
    (b / "manifest.json").write_text(json.dumps(manifest))
    codes = [v.code for v in check_bundle(b)]
    assert "agreement.tessel" in codes


def test_check_catches_a_wrong_prediction(cpu_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["predicted"]["iteration_time_s"] *= 0.9
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert [v.code for v in check_bundle(b)] == ["predicted.iteration_time_s"]


def _scaled(path: tuple, factor: float):  # type: ignore[no-untyped-def]
    def tamper(m: dict) -> None:  # type: ignore[type-arg]
        *head, last = path
        for k in head:
            m = m[k]
        m[last] = m[last] * factor
    return tamper


@pytest.mark.parametrize("tamper,code", [
    pytest.param(lambda m: m["stages"][0].update(layers=[0, 1]), "agreement.stages", id="stage layers"),
    pytest.param(lambda m: m["stages"][0].update(tp=2), "agreement.stages", id="stage tp"),
    pytest.param(lambda m: m.update(num_microbatches=m["num_microbatches"] * 4), "agreement.microbatches",
                 id="micro-batches"),
    pytest.param(_scaled(("predicted", "baseline_iteration_time_s"), 2.0), "predicted.baseline_iteration_time_s",
                 id="baseline time"),
    pytest.param(_scaled(("predicted", "poseidon_iteration_time_s"), 0.5), "predicted.poseidon_iteration_time_s",
                 id="Poseidon time"),
    pytest.param(lambda m: m["predicted"].update(gain_over_baseline=0.5), "predicted.gain_over_baseline",
                 id="gain"),
    pytest.param(lambda m: m["gains"][2].update(gain_over_baseline=0.5), "gains", id="gains row"),
    pytest.param(_scaled(("predicted", "tessel_iteration_time_s"), 0.5), "gains", id="Tessel time"),
    pytest.param(lambda m: m["files"]["tessel.json"].update(kind="poseidon"), "files.tessel.json", id="file kind"),
    pytest.param(lambda m: m["composition"].update(method="joint"), "composition", id="composition method"),
    pytest.param(lambda m: m["composition"].update(rounds="2"), "composition", id="rounds not a count"),
    pytest.param(lambda m: m["composition"].update(converged=False), "composition", id="unconverged, unsaid"),
])
def test_check_trusts_no_figure_of_the_manifest(cpu_bundle: Path, tmp_path: Path, tamper, code: str) -> None:  # type: ignore[no-untyped-def]
    """The manifest's stages, micro-batches, times and gains (what `show` prints) are recomputed from
    the plans: a manifest edited after composing is caught even with its files' digests intact."""
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    manifest = json.loads((b / "manifest.json").read_text())
    tamper(manifest)
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert code in [v.code for v in check_bundle(b)]


def test_scales_claim_no_speed_up_the_lagom_plans_do_not_give(gpu_comp: gpuplan.Plan, tmp_path: Path) -> None:
    b = tmp_path / "b"
    write_bundle(b, gpu_comp)
    assert check_bundle(b) == []
    manifest = json.loads((b / "manifest.json").read_text())
    tuned = [s for s in range(len(manifest["scales"])) if f"lagom-stage{s}.json" in manifest["files"]]
    assert tuned
    for s, factor in ((tuned[0], 0.5), (tuned[0], 1.5)):  # faster than Lagom gives; slower than no tuning
        edited = json.loads(json.dumps(manifest))
        edited["scales"][s] = min(edited["scales"][s] * factor, 1.5)
        (b / "manifest.json").write_text(json.dumps(edited))
        assert "scales" in [v.code for v in check_bundle(b)], factor
    edited = json.loads(json.dumps(manifest))
    edited["scales"] = [1.0] * len(manifest["scales"])             # no speed-up claimed is a valid claim
    (b / "manifest.json").write_text(json.dumps(edited))
    assert "scales" not in [v.code for v in check_bundle(b)]


def test_not_a_bundle_is_named(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(InputError, match="kind"):
        check_bundle(tmp_path)


def test_cli_plan_train_check_show(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "bundle"
    r = runner.invoke(main, ["plan", "train", str(CPU), "--time-limit", "5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "+ Tessel schedule" in r.output and "bundle written" in r.output
    r = runner.invoke(main, ["check", str(out)])
    assert r.exit_code == 0 and "valid" in r.output, r.output
    r = runner.invoke(main, ["show", str(out), "--png", str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "t.png").stat().st_size > 1000
    doc = json.loads((out / "poseidon.json").read_text())
    doc["num_microbatches"] += 1
    (out / "poseidon.json").write_text(json.dumps(doc))
    r = runner.invoke(main, ["check", str(out)])
    assert r.exit_code == 1 and "poseidon.json" in r.output


@pytest.mark.slow
def test_run_bundle_executes_the_plan(cpu_bundle: Path) -> None:
    """The bundle runs (Poseidon's split, Tessel's schedule on gloo) and its first loss is the one-process
    loss of the same model on the same batch: the schedule computes the model, not something else."""
    import torch

    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt
    from gpuplan.runtime.bundle import run_bundle

    out = run_bundle(cpu_bundle, steps=1, warmup=0)
    assert out["measured_iteration_s"] > 0 and out["predicted_iteration_s"] > 0
    assert all(d > 0 for name, d in out["block_durations_s"].items() if not name.startswith("B0"))
    plan = gpuplan.load_plan(cpu_bundle / "poseidon.json")
    from gpuplan.runtime.poseidon import runnable_config

    cfg, seq, _ = runnable_config(gpuplan.plan_problem(plan))  # type: ignore[arg-type]
    cfg = TransformerConfig.model_validate(cfg.model_dump())
    m, mb = plan.num_microbatches, plan.stages[0].micro_batch_size  # type: ignore[attr-defined]
    tokens, targets = gpt.synthetic_batch(cfg, m * mb, seq, seed=0)
    model = gpt.model(cfg, 0)
    with torch.no_grad():
        want = sum(float(gpt.lm_loss(model(tokens[i * mb:(i + 1) * mb]), targets[i * mb:(i + 1) * mb]))
                   for i in range(m)) / m
    assert out["losses"][0] == pytest.approx(want, rel=1e-5)


def test_shared_cores_time() -> None:
    """With every rate 1 the core-sharing time is the schedule's own; two blocks at half speed take twice."""
    from gpuplan.models.tessel import orders_of
    from gpuplan.runtime.bundle import shared_cores_time_s

    plan = gpuplan.solve("poseidon", str(CPU), time_limit_s=5).document()
    prob = tessel_problem(plan)
    sched = gpuplan.solve(prob, time_limit_s=3)
    tails = stage_tails_s(plan)
    alone = shared_cores_time_s(prob, orders_of(sched.schedule), [1.0, 1.0], tails)
    assert alone == pytest.approx(composed_time_s(sched.schedule, tails))
    halved = shared_cores_time_s(prob, orders_of(sched.schedule), [1.0, 0.5], tails)
    assert alone < halved < 2 * alone
    pair = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}, {"name": "b", "devices": [1], "duration_s": 1.0}]})
    assert shared_cores_time_s(pair, [[("a", 0)], [("b", 0)]], [1.0, 0.5], [0.0, 0.0]) == pytest.approx(2.0)


def test_shared_cores_wake_and_extra() -> None:
    """The wake-up delay is charged to a device idle when its input arrives, not to a busy one; the
    extra CPU time per call lengthens that block (times computed by hand)."""
    from gpuplan.runtime.bundle import shared_cores_time_s

    chain = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}, {"name": "b", "devices": [1], "duration_s": 1.0,
                                                            "after": ["a"]},
        {"name": "c", "devices": [0], "duration_s": 1.0, "after": ["b"]}]})
    orders = [[("a", 0), ("c", 0)], [("b", 0)]]
    assert shared_cores_time_s(chain, orders, [1.0, 0.5], [0.0, 0.0]) == pytest.approx(3.0)
    # a ends 1.0; b waits idle, wakes at 1.25, ends 2.25; c waits idle, wakes at 2.5, ends 3.5
    assert shared_cores_time_s(chain, orders, [1.0, 0.5], [0.0, 0.0], wake_s=0.25) == pytest.approx(3.5)
    # 0.5 s extra on a: a ends 1.5, b 1.75-2.75, c 3.0-4.0
    assert shared_cores_time_s(chain, orders, [1.0, 0.5], [0.0, 0.0], wake_s=0.25,
                               extra_s={"a": 0.5}) == pytest.approx(4.0)
    busy = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}, {"name": "x", "devices": [1], "duration_s": 2.0},
        {"name": "b", "devices": [1], "duration_s": 1.0, "after": ["a"]}]})
    # x and a at half speed: a ends 2.0 while x (1.0 left) is busy, alone then: x ends 3.0; b's input
    # came while device 1 computed, so no wake-up: b 3.0-4.0
    assert shared_cores_time_s(busy, [[("a", 0)], [("x", 0), ("b", 0)]], [1.0, 0.5], [0.0, 0.0],
                               wake_s=0.25) == pytest.approx(4.0)


@pytest.mark.parametrize("max_rounds", [1, 2, 4])
def test_a_bundle_agrees_with_itself_with_or_without_a_fixed_point(max_rounds: int, tmp_path: Path) -> None:
    """Was: when the Tessel/Lagom rounds ran out with the schedule's order still changing, the bundle shipped
    the last order with Lagom plans made for the order before it, and failed its own check (export refused)."""
    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]},
           "model": "gpt3-1.3b", "global_batch": 16, "seq_len": 1024, "fsdp": True}
    comp = compose(gpuplan.evaluate_config(doc, "tp=1,pp=2,dp=2,mb=1,recompute=none"), time_limit_s=3,
                   max_rounds=max_rounds)
    write_bundle(tmp_path / "b", comp)
    assert check_bundle(tmp_path / "b") == []
    assert comp.converged or any("without a fixed point" in note for note in comp.notes)
    assert comp.predicted["iteration_time_s"] <= comp.predicted["baseline_iteration_time_s"] + 1e-12


def test_a_scale_within_the_fixed_points_tolerance_is_no_claim(gpu_comp: gpuplan.Plan, tmp_path: Path) -> None:
    """The Tessel/Lagom iteration stops when the scales move by at most SCALE_TOLERANCE, so a stated scale may
    lie that far below its Lagom plan's tuned / default time (found when a stage's scale stopped 1.1e-7 below
    its plan's), and no further."""
    from gpuplan.compose.pipeline import SCALE_TOLERANCE

    b = tmp_path / "b"
    write_bundle(b, gpu_comp)
    manifest = json.loads((b / "manifest.json").read_text())
    s = next(s for s in range(len(manifest["scales"])) if f"lagom-stage{s}.json" in manifest["files"])
    lagom = gpuplan.load_plan(b / f"lagom-stage{s}.json")
    low = lagom.iteration_s / lagom.predicted["iteration_s_nccl_default"]  # type: ignore[attr-defined]
    for below, flagged in ((SCALE_TOLERANCE / 10, False), (SCALE_TOLERANCE * 10, True)):
        edited = json.loads(json.dumps(manifest))
        edited["scales"][s] = low - below
        (b / "manifest.json").write_text(json.dumps(edited))
        assert ("scales" in [v.code for v in check_bundle(b)]) is flagged, below
