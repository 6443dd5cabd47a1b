"""`gpuplan solve|compare|check|show stragglers` and `gpuplan simulate stragglers` on the shipped examples."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuplan.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "stragglers"


def test_solve_check_show_through_the_cli(tmp_path: Path) -> None:
    r = CliRunner()
    plan = tmp_path / "plan.json"
    res = r.invoke(main, ["solve", "stragglers", str(EXAMPLES / "three-jobs.yaml"), "--solver", "srptms-c",
                          "-o", str(plan), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(plan.read_text())
    assert doc["kind"] == "stragglers" and doc["policy"] == "srptms-c" and doc["schedule"]
    assert doc["solver"]["stats"]["lp_bound_s"] <= doc["objective"]
    res = r.invoke(main, ["check", str(plan)])
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["show", str(plan), "--png", str(tmp_path / "g.png")])
    assert res.exit_code == 0 and (tmp_path / "g.png").stat().st_size > 0, res.output
    doc["completion_s"][1] += 1.0
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    res = r.invoke(main, ["check", str(tmp_path / "bad.json")])
    assert res.exit_code == 1 and "completion_s" in res.output


def test_compare_lists_every_policy(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["compare", "stragglers", str(EXAMPLES / "small-trace.yaml"), "-q",
                                    "--json", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "t.json").read_text()
    for name in ("srptms-c", "mantri", "late", "dolly", "hesrpt", "threshold", "laps-r"):
        assert name in text


def test_simulate_across_loads(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["simulate", "stragglers", str(EXAMPLES / "small-trace.yaml"), "--policy",
                                    "srptms-c", "--policy", "sca", "--load", "0.3", "--load", "0.8", "-q",
                                    "--json", str(tmp_path / "s.json"), "--png", str(tmp_path / "l.png")])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "s.json").read_text())
    rows = rows["result"] if isinstance(rows, dict) and "result" in rows else rows
    got = {(r["policy"], round(r["load"], 2)) for r in rows}
    assert {("srptms-c", 0.3), ("sca", 0.8), ("mantri", 0.3)} <= got
    assert all(r["over_lp_bound"] >= 1.0 for r in rows)
    assert (tmp_path / "l.png").stat().st_size > 0


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    r = CliRunner()
    bad = tmp_path / "p.yaml"
    bad.write_text("kind: stragglers\nslots: 0\njobs: [{id: a, arrival_s: 0, map_s: [1]}]\n")
    res = r.invoke(main, ["solve", "stragglers", str(bad), "-q"])
    assert res.exit_code == 2 and "slots" in res.output
    res = r.invoke(main, ["solve", "stragglers", str(EXAMPLES / "three-jobs.yaml"), "-q", "--option", "eps=x"])
    assert res.exit_code == 2
    res = r.invoke(main, ["simulate", "stragglers", str(EXAMPLES / "three-jobs.yaml"), "--policy", "nope"])
    assert res.exit_code == 2 and "nope" in res.output
