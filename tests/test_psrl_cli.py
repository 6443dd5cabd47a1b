"""psRL from the command line: solve, check, show --png, compare, psrl trace|stats|exactness."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuplan.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "psrl"


def run(args: list[str]) -> str:
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_solve_check_show_compare(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    run(["solve", "psrl", str(EXAMPLES / "small-agent.yaml"), "-q", "-o", str(plan)])
    assert "valid" in run(["check", str(plan)])
    run(["check", str(plan), "--input", str(EXAMPLES / "small-agent.yaml")])
    out = run(["show", str(plan), "--png", str(tmp_path / "p.png")])
    assert "workers" in out and (tmp_path / "p.png").stat().st_size > 1000
    table = tmp_path / "t.json"
    run(["compare", "psrl", str(EXAMPLES / "small-agent.yaml"), "-q", "--json", str(table)])
    doc = json.loads(table.read_text())
    assert "karmarkar-karp" in json.dumps(doc) and "subtree-greedy" in json.dumps(doc)


def test_tampered_plan_fails_check(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    run(["solve", "psrl", str(EXAMPLES / "small-agent.yaml"), "-q", "-o", str(plan)])
    doc = json.loads(plan.read_text())
    doc["predicted"]["makespan_s"] /= 2
    plan.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["check", str(plan)])
    assert result.exit_code == 1 and "makespan_s" in result.output


def test_trace_stats_round_trip(tmp_path: Path) -> None:
    prob, links = tmp_path / "t.yaml", tmp_path / "t.jsonl"
    out = run(["psrl", "trace", "--tasks", "3", "--rollouts", "2", "--turns", "2-4", "--system-tokens", "500",
               "-o", str(prob), "--jsonl", str(links), "--json", "-"])
    doc = json.loads(out)
    assert doc["dedup_ratio"] > 1
    stats = json.loads(run(["psrl", "stats", str(prob), "--json", "-"]))
    assert stats["raw_tokens"] == doc["raw_tokens"] and stats["dedup_tokens"] == doc["dedup_tokens"]
    again = tmp_path / "again.yaml"
    again.write_text(f"kind: psrl\nworkers: [{{name: g, count: 2}}]\ntrace: {links.name}\n")
    assert json.loads(run(["psrl", "stats", str(again), "--json", "-"]))["raw_tokens"] == doc["raw_tokens"]
    run(["solve", "psrl", str(prob), "-q", "-o", str(tmp_path / "p.json")])


def test_bad_trace_option_is_a_clean_error() -> None:
    result = CliRunner().invoke(main, ["psrl", "trace", "--turns", "a-b"])
    assert result.exit_code == 2 and "MIN-MAX" in result.output


def test_exactness_command() -> None:
    out = json.loads(run(["psrl", "exactness", str(EXAMPLES / "small-agent.yaml"), "--max-tokens", "300",
                          "--hidden", "32", "--json", "-"]))
    assert out["max_rel_grad_error"] < 1e-4 and out["predicted_speedup"] > 1
