"""Scripting and figures: --json documents hold their documented keys, piped output has no box
drawing, solver and run options are listed with types and defaults, run options are validated,
every --png writes a PNG, --help shows a worked example and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
OEF = str(ROOT / "examples/oef/four-tenants.yaml")
LAGOM = str(ROOT / "examples/lagom/small.yaml")
PROFILE = str(ROOT / "examples/profile/cpu-2core-quick.json")
BOX = set("│┃─━┏┓┗┛┌┐└┘├┤┬┴┼╭╮╯╰═║")

PLAN_KEYS = {"command", "plan_file", "kind", "status", "objective_name", "objective", "predicted", "solver",
             "seed", "solve_time_s", "message", "input_digest", "tables"}


def invoke(*args: object) -> tuple[int, str]:
    """Run `gpuplan ARGS` (stdout not a terminal); return the exit code and stdout."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout


def _png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 5000


@pytest.fixture(scope="module")
def oef_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = tmp_path_factory.mktemp("plans") / "oef.json"
    code, out = invoke("solve", "oef", OEF, "-o", plan, "-q")
    assert code == 0, out
    return plan


def test_solve_json_is_one_document_with_documented_keys(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    code, out = invoke("solve", "oef", OEF, "-o", plan, "--json")
    assert code == 0
    doc = json.loads(out)  # the whole of stdout is one document
    assert PLAN_KEYS <= set(doc) and doc["command"] == "solve" and doc["status"] == "optimal"
    assert doc["objective"] == pytest.approx(json.loads(plan.read_text())["objective"])
    assert all({"title", "columns", "rows"} <= set(t) for t in doc["tables"])


def test_check_show_list_json(oef_plan: Path, tmp_path: Path) -> None:
    code, out = invoke("check", oef_plan, "--json")
    assert code == 0
    assert json.loads(out) == {"command": "check", "plan_file": str(oef_plan), "kind": "oef",
                               "status": "optimal", "valid": True, "violations": []}
    png = tmp_path / "s.png"
    code, out = invoke("show", oef_plan, "--json", "--png", png)
    doc = json.loads(out)
    assert code == 0 and PLAN_KEYS | {"valid", "violations", "png"} <= set(doc) and doc["png"] == str(png)
    _png(png)
    titles = [t["title"] for t in doc["tables"]]
    assert "plan" in titles and len(titles) > 1
    code, out = invoke("list", "--json")
    rows = json.loads(out)["solvers"]
    assert code == 0 and {"kind", "solver", "role", "default", "description"} <= set(rows[0])
    assert {r["kind"] for r in rows} >= {"oef", "poseidon", "tessel", "lagom", "aurora"}


def test_check_json_reports_violations_with_exit_1(oef_plan: Path, tmp_path: Path) -> None:
    doc = json.loads(oef_plan.read_text())
    doc["objective"] = doc["objective"] * 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, out = invoke("check", bad, "--json")
    got = json.loads(out)
    assert code == 1 and got["valid"] is False and got["violations"]


def test_compare_json_and_png(tmp_path: Path) -> None:
    png = tmp_path / "c.png"
    code, out = invoke("compare", "oef", OEF, "-q", "--json", "--png", png)
    assert code == 0
    rows = json.loads(out)
    assert {"solver", "status"} <= set(rows[0]) and {r["solver"] for r in rows} >= {"oef", "max-throughput"}
    _png(png)
    target = tmp_path / "c.json"  # --json FILE still writes the file and prints the table
    code, out = invoke("compare", "lagom", LAGOM, "-q", "--json", target)
    assert code == 0 and "nccl-default" in out and json.loads(target.read_text())


def test_piped_output_has_no_box_drawing(oef_plan: Path) -> None:
    for args in (("show", oef_plan), ("list",), ("list", "--options", "oef"), ("profile", "show", PROFILE)):
        code, out = invoke(*args)
        assert code == 0, out
        assert not BOX & set(out), args
        assert out.strip()


def test_list_options_types_and_defaults() -> None:
    code, out = invoke("list", "--options", "poseidon", "--json")
    assert code == 0
    doc = json.loads(out)
    rows = {(r["scope"], r["name"]): r for r in doc["options"]}
    assert rows[("solve --solver poseidon", "prune")]["type"] == "bool"
    assert rows[("solve --solver poseidon", "prune")]["default"] == "True"
    assert rows[("run", "steps")]["type"] == "int" and rows[("run", "steps")]["default"] == "3"
    code, out = invoke("list", "--options", "nope")
    assert code == 2


def test_run_options_are_validated_before_running(tmp_path: Path) -> None:
    plan = tmp_path / "t.json"
    assert invoke("solve", "tessel", ROOT / "examples/tessel/hand-2.yaml", "-o", plan, "-q")[0] == 0
    r = CliRunner().invoke(main, ["run", str(plan), "--option", "stepz=2"])
    assert r.exit_code == 2 and "stepz" in r.output and "steps" in r.output
    r = CliRunner().invoke(main, ["run", str(plan), "--option", "steps=two"])
    assert r.exit_code == 2 and "expected a int" in r.output


def test_simulate_json_and_png(tmp_path: Path) -> None:
    trace = tmp_path / "t.yaml"
    text = (ROOT / "examples/oef/trace-100.yaml").read_text()
    head, jobs = text.split("\njobs:\n")
    trace.write_text(head + "\njobs:\n" + "\n".join(jobs.splitlines()[:8]) + "\n")
    png = tmp_path / "jct.png"
    code, out = invoke("simulate", "oef", trace, "--policy", "oef", "--policy", "equal-share", "-q",
                       "--json", "--png", png)
    assert code == 0
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == ["oef", "equal-share"] and rows[0]["avg_jct_h"] > 0
    _png(png)


def test_profile_show_png_json_and_show_points_to_it(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    code, out = invoke("profile", "show", PROFILE, "--png", png, "--json")
    assert code == 0 and json.loads(out)["tables"]
    _png(png)
    r = CliRunner().invoke(main, ["show", PROFILE])
    assert r.exit_code == 2 and "gpuplan profile show" in r.output


def test_help_has_examples_and_exit_codes() -> None:
    for args in (["solve", "aurora"], ["compare", "oef"], ["check"], ["show"], ["run"], ["list"],
                 ["simulate", "oef"], ["profile", "show"], []):
        r = CliRunner().invoke(main, args + ["--help"])
        assert r.exit_code == 0
        assert "Example" in r.output and "Exit codes" in r.output, args
    r = CliRunner().invoke(main, ["solve", "aurora", "--help"])
    assert "Solve an aurora problem" in r.output
    assert "--option KEY=VALUE" in CliRunner().invoke(main, ["run", "--help"]).output
    solve_help = " ".join(CliRunner().invoke(main, ["solve", "poseidon", "--help"]).output.split())
    from gpuplan import registry

    for spec in registry.solvers("poseidon"):  # each solver's option keys, as the registry reads them
        names = sorted(registry.solver_options(spec))
        if names:
            assert f"{spec.name}: {', '.join(names)}" in solve_help


def test_verbose_logs_on_stderr(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["-v", "solve", "oef", OEF, "-o", str(tmp_path / "p.json"), "--json"])
    assert r.exit_code == 0
    json.loads(r.stdout)
    assert "solving oef" in r.stderr


def test_doctor_json_says_what_works() -> None:
    """doctor --json holds the documented keys; with torch installed (the test extra) profile works,
    and the torch facts agree with torch itself."""
    import torch

    code, out = invoke("doctor", "--json")
    doc = json.loads(out)
    assert code == 0 and {"python", "cpus", "host_memory_bytes", "host_free_bytes", "torch", "matplotlib",
                          "commands"} <= set(doc)
    assert doc["torch"]["version"] == str(torch.__version__)
    assert len(doc["torch"]["cuda_devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert doc["commands"]["profile"]["works"] is True and doc["commands"]["solve"]["works"] is True
    assert doc["host_free_bytes"] is None or 0 < doc["host_free_bytes"] <= doc["host_memory_bytes"]
    code, out = invoke("doctor")
    assert code == 0 and "commands" in out and "gloo" in out


@pytest.mark.slow
def test_gallery_script_draws_every_figure(tmp_path: Path) -> None:
    """docs/make_gallery.py (the script that regenerates docs/gallery.md) draws every figure."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_gallery", ROOT / "docs" / "make_gallery.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    page = tmp_path / "gallery.md"
    paths = module.build(time_limit_s=10.0, out_dir=tmp_path / "gallery", page=page)
    assert len(paths) >= 9
    text = page.read_text()
    for path in paths:
        _png(path)
        assert f"gallery/{path.name}" in text


def test_run_figure_pairs_predictions_with_measurements(tmp_path: Path) -> None:
    """run --png's chart finds the predicted/measured column pairs of the runners' report tables
    (tessel's predicted_s/measured_s and plan/measured, poseidon's fwd plan/fwd shared/fwd measured)."""
    from gpuplan.models.base import Table
    from gpuplan.viz import _series_pairs, run_figure

    assert _series_pairs(["prediction", "predicted_s", "measured_s", "error"]) == [("", [1], 2)]
    assert _series_pairs(["block", "kind", "devices", "plan", "measured", "error"]) == [("", [3], 4)]
    cols = ["stage", "type", "fwd plan", "fwd shared", "fwd measured", "fwd error", "bwd plan", "bwd measured",
            "fwd compute plan / CPU time"]
    assert _series_pairs(cols) == [("fwd", [2, 3], 4), ("bwd", [6], 7)]
    tables = [Table("step: predicted vs measured (median of 3 steps; error)", ["prediction", "predicted_s",
                                                                               "measured_s", "error"],
                    [["makespan", 0.4, 1.5, "-74%"]]),
              Table("machine", ["what", "value"], [["cores", 2]])]
    _png(run_figure("run", tables, tmp_path / "r.png"))
    from gpuplan.errors import InputError

    with pytest.raises(InputError, match="no predicted-vs-measured"):
        run_figure("run", tables[1:], tmp_path / "none.png")


@pytest.mark.slow
def test_run_json_and_png_end_to_end(tmp_path: Path) -> None:
    """gpuplan run PLAN --option steps=1 --json --png: one document with the documented keys (the
    measured figures under result, report tables as title/columns/rows) and a predicted-vs-measured PNG."""
    plan = tmp_path / "t.json"
    assert invoke("solve", "tessel", ROOT / "examples/tessel/hand-2.yaml", "-o", plan, "-q")[0] == 0
    png = tmp_path / "run.png"
    code, out = invoke("run", plan, "--option", "steps=1", "--option", "threads=1", "--json", "--png", png)
    assert code == 0, out
    doc = json.loads(out)
    assert {"command", "plan_file", "kind", "result"} <= set(doc) and doc["kind"] == "tessel"
    assert doc["result"]["measured_step_s"] > 0
    assert all({"title", "columns", "rows"} <= set(t) for t in doc["result"]["report"])
    _png(png)


def test_doctor_reads_cuda_devices_and_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a (stubbed) CUDA device and NCCL, doctor lists the device with its free memory, NCCL's
    version, and says run uses NCCL (no GPU is needed for this test)."""
    import types

    import torch
    import torch.distributed as dist

    from gpuplan.doctor import diagnose, tables

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="NVIDIA H200", total_memory=140 * gib, major=9, minor=0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (100 * gib, 140 * gib))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    report = diagnose()
    assert report["torch"]["cuda_devices"] == [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 140 * gib,
                                                "free_bytes": 100 * gib, "capability": "9.0"}]
    assert report["torch"]["nccl"] == {"available": True, "version": "2.21.5"}
    assert "nccl" in report["commands"]["run"]["why"] and "1 CUDA GPU" in report["commands"]["profile"]["why"]
    assert [t.title for t in tables(report)] == ["this machine", "CUDA devices", "commands"]


# --json on the model-specific verbs and on training bundles (keys: docs/index.md, Scripting)

POSEIDON = ROOT / "examples/poseidon/h100-a100-small.yaml"
CPU_POSEIDON = ROOT / "examples/poseidon/cpu-two-types.yaml"
BUNDLE_KEYS = {"command", "plan_file", "kind", "predicted", "gains", "tables"}


def _tables_ok(doc: dict) -> bool:
    return all({"title", "columns", "rows"} <= set(t) for t in doc["tables"])


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A training bundle of the shipped CPU Poseidon example, from `plan train --json`."""
    out = tmp_path_factory.mktemp("bundle") / "b"
    code, text = invoke("plan", "train", CPU_POSEIDON, "--time-limit", 5, "-o", out, "--json")
    assert code == 0, text
    return out, json.loads(text)


def test_plan_train_json(cpu_bundle: tuple[Path, dict]) -> None:
    out, doc = cpu_bundle
    assert BUNDLE_KEYS | {"bundle"} <= set(doc) and doc["command"] == "plan train"
    assert doc["bundle"] == doc["plan_file"] == str(out) and doc["kind"] == "training-bundle"
    manifest = json.loads((out / "manifest.json").read_text())
    assert doc["predicted"] == pytest.approx(manifest["predicted"]) and _tables_ok(doc)
    assert [g["step"] for g in doc["gains"]] == [g["step"] for g in manifest["gains"]]


def test_check_and_show_bundle_json(cpu_bundle: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = cpu_bundle
    code, text = invoke("check", out, "--json")
    assert code == 0, text
    assert json.loads(text) == {"command": "check", "plan_file": str(out), "kind": "training-bundle",
                                "status": None, "valid": True, "violations": []}
    code, text = invoke("show", out, "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert BUNDLE_KEYS | {"valid", "violations", "png"} <= set(doc) and doc["command"] == "show"
    assert doc["valid"] is True and doc["png"] is None and _tables_ok(doc)
    # a tampered bundle: check --json says so with exit code 1, show --json too, and nothing else on stdout
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    plan = json.loads((bad / "poseidon.json").read_text())
    plan["num_microbatches"] += 1
    (bad / "poseidon.json").write_text(json.dumps(plan))
    code, text = invoke("check", bad, "--json")
    doc = json.loads(text)
    assert code == 1 and doc["valid"] is False and doc["violations"]
    code, text = invoke("show", bad, "--json")
    assert code == 1 and json.loads(text)["valid"] is False


@pytest.mark.slow
def test_run_bundle_json(cpu_bundle: tuple[Path, dict]) -> None:
    out, _ = cpu_bundle
    code, text = invoke("run", out, "--option", "steps=1", "--option", "warmup=0", "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert set(doc) == {"command", "plan_file", "kind", "result"} and doc["kind"] == "training-bundle"
    assert doc["result"]["measured_iteration_s"] > 0


def test_evaluate_poseidon_json(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    code, text = invoke("evaluate", "poseidon", POSEIDON, "--config", "tp=2,pp=2,dp=1,mb=1,recompute=none",
                        "-o", plan, "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert {"command", "configuration", "iteration_time_s", "throughput_samples_per_s", "tokens_per_s",
            "model_tflops_per_gpu", "mfu", "bubble_fraction", "search", "plan_file", "tables"} <= set(doc)
    assert doc["command"] == "evaluate poseidon" and doc["search"] is None and doc["plan_file"] == str(plan)
    saved = json.loads(plan.read_text())
    assert doc["iteration_time_s"] == pytest.approx(saved["objective"]) and doc["configuration"]["tp"] == 2
    assert 0 < doc["mfu"] < 1 and _tables_ok(doc)


def test_export_json(tmp_path: Path) -> None:
    import gpuplan
    from gpuplan.compose import compose, write_bundle

    one_node = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]},
                "model": "gpt3-1.3b", "global_batch": 16, "seq_len": 1024}
    bundle = tmp_path / "bundle"
    write_bundle(bundle, compose(gpuplan.evaluate_config(one_node, "tp=2,pp=2,dp=1,mb=1,recompute=none"),
                                 time_limit_s=3))
    code, text = invoke("export", "megatron", bundle, "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert set(doc) == {"command", "bundle", "output", "args", "env", "nodes", "notes", "files"}
    assert doc["command"] == "export megatron" and doc["files"] == []
    assert [n["ranks"] for n in doc["nodes"]] == [4] and doc["nodes"][0]["node"] == "h0"
    assert doc["args"][doc["args"].index("--tensor-model-parallel-size") + 1] == "2" and doc["output"] is None
    code, text = invoke("export", "megatron", bundle, "--launch-dir", tmp_path / "mg", "--json")
    assert code == 0, text
    assert {Path(f).name for f in json.loads(text)["files"]} >= {"megatron.args", "run.sh"}
    out = tmp_path / "tt"
    code, text = invoke("export", "torchtitan", bundle, "-o", out, "--config", "llama3:llama3_debugmodel", "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert set(doc) == {"command", "bundle", "output", "files", "notes"} and doc["command"] == "export torchtitan"
    assert doc["files"] and all(Path(f).is_file() for f in doc["files"])


def test_delta_json(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    old = {"w": torch.randn(200, 100, generator=g)}
    new = {"w": old["w"].clone()}
    new["w"][0, :5] += 1
    safetensors_torch.save_file(old, str(tmp_path / "old.safetensors"))
    safetensors_torch.save_file(new, str(tmp_path / "new.safetensors"))
    old_f, new_f, delta = tmp_path / "old.safetensors", tmp_path / "new.safetensors", tmp_path / "d.delta"
    code, text = invoke("delta", "encode", old_f, new_f, "-o", delta, "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert {"command", "output", "delta_bytes", "dense_bytes", "elements", "changed", "density", "ratio",
            "records", "encodings", "encode_s", "import_s"} <= set(doc)
    assert doc["command"] == "delta encode" and doc["changed"] == 5 and doc["delta_bytes"] == delta.stat().st_size
    code, text = invoke("delta", "decode", old_f, delta, "-o", tmp_path / "n.safetensors", "--json")
    assert code == 0, text
    assert json.loads(text) == {"command": "delta decode", "output": str(tmp_path / "n.safetensors"), "tensors": 1,
                                "format": "safetensors", "digests_verified": True}
    code, text = invoke("delta", "stats", old_f, new_f, "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert {"command", "dense_bytes", "delta_bytes", "ratio", "entropy_bound_bytes", "of_bound", "encodings",
            "tables"} <= set(doc) and doc["command"] == "delta stats" and _tables_ok(doc)
    assert doc["tables"][0]["rows"] == [["w", doc["tables"][0]["rows"][0][1], 20000, 5, pytest.approx(0.025)]]
