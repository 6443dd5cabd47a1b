"""The CLI round trip on the README's main job: solve -> plan file -> check -> show --png -> compare,
and bad input files reported through the CLI with file, field, value and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "oef" / "four-tenants.yaml"


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, res.output


def test_round_trip(tmp_path) -> None:
    plan = tmp_path / "oef-plan.json"
    code, out = run("solve", "oef", EXAMPLE, "-o", plan, "-q")
    assert code == 0, out
    assert "plan written" in out and plan.exists()
    doc = json.loads(plan.read_text())
    assert doc["kind"] == "oef" and doc["status"] == "optimal" and doc["solver"]["name"] == "oef"
    code, out = run("check", plan, "--input", EXAMPLE)
    assert code == 0 and "valid" in out, out
    png = tmp_path / "oef.png"
    code, out = run("show", plan, "--png", png)
    assert code == 0, out
    assert "envy pairs" in out and png.read_bytes()[:4] == b"\x89PNG"
    code, out = run("compare", "oef", EXAMPLE, "-q", "--json", tmp_path / "c.json")
    assert code == 0, out
    rows = {r["solver"]: r for r in json.loads((tmp_path / "c.json").read_text())}
    assert {"oef", "oef-si", "oef-noncoop", "gavel-maxmin", "maxmin-agnostic", "max-throughput",
            "equal-share"} <= set(rows)
    assert rows["oef"]["envy_pairs"] == 0 and rows["oef"]["min_si_ratio"] >= 1 - 1e-6


def test_check_reports_a_tampered_plan(tmp_path) -> None:
    plan = tmp_path / "p.json"
    assert run("solve", "oef", EXAMPLE, "-o", plan, "-q")[0] == 0
    doc = json.loads(plan.read_text())
    doc["shares"][0] = [1.0] + [0.0] * (len(doc["types"]) - 1)     # job 0 takes a full V100 slot...
    doc["shares"][1] = [1.0] + [0.0] * (len(doc["types"]) - 1)     # ...and so does job 1
    doc["shares"][2] = [1.0] + [0.0] * (len(doc["types"]) - 1)
    plan.write_text(json.dumps(doc))
    code, out = run("check", plan)
    assert code == 1 and "violation" in out and "capacity" in out, out


def test_bad_input_files(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("V100: 3.3", "V100: -3.3"))
    code, out = run("solve", "oef", bad, "-o", tmp_path / "p.json", "-q")
    assert code == 2 and str(bad) in out and "job_types.resnet50.V100" in out and "non-negative" in out
    bad.write_text(EXAMPLE.read_text().replace("gpus: 4}", "gpus: many}"))
    code, out = run("solve", "oef", bad, "-q")
    assert code == 2 and "gpus" in out and "'many'" in out
    code, out = run("solve", "oef", tmp_path / "missing.yaml", "-q")
    assert code == 2 and "no such file" in out


def test_simulate_command(tmp_path) -> None:
    trace = tmp_path / "t.yaml"
    text = (ROOT / "examples" / "oef" / "trace-100.yaml").read_text()
    head, jobs = text.split("\njobs:\n")
    trace.write_text(head + "\njobs:\n" + "\n".join(jobs.splitlines()[:8]) + "\n")
    code, out = run("simulate", "oef", trace, "--policy", "oef", "--policy", "equal-share", "-q",
                    "--json", tmp_path / "s.json")
    assert code == 0, out
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["policy"] for r in rows] == ["oef", "equal-share"] and rows[0]["avg_jct_h"] > 0
