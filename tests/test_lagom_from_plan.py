"""`gpuplan solve|compare lagom PLAN.json`: a Poseidon plan file read directly, as `from_poseidon:` reads it;
CPU (gloo) stages are refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuplan import api
from gpuplan.cli import main
from gpuplan.compose.lagom_input import lagom_problem_from_plan, nccl_bottleneck_stage
from gpuplan.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("poseidon")
    out = {}
    for name, src in (("gpu", "h100-a100-small.yaml"), ("cpu", "cpu-two-types.yaml")):
        plan = api.solve(api.load_problem(ROOT / "examples/poseidon" / src), time_limit_s=20, seed=0)
        assert plan.ok
        plan.save(d / f"{name}.json")
        out[name] = d / f"{name}.json"
    return out


def test_plan_file_builds_the_from_poseidon_problem(plans: dict[str, Path], tmp_path: Path) -> None:
    doc = json.loads(plans["gpu"].read_text())
    for stage in range(len(doc["stages"])):
        (tmp_path / "p.yaml").write_text(f"kind: lagom\nfrom_poseidon: {{plan: {plans['gpu']}, stage: {stage}}}\n")
        expected = api.load_problem(tmp_path / "p.yaml")
        assert lagom_problem_from_plan(doc, stage).document() == expected.document()
    # the default stage is the bottleneck, as from_poseidon's default (every stage is on a GPU here)
    (tmp_path / "d.yaml").write_text(f"kind: lagom\nfrom_poseidon: {{plan: {plans['gpu']}}}\n")
    assert lagom_problem_from_plan(doc).document() == api.load_problem(tmp_path / "d.yaml").document()


def test_solve_and_compare_lagom_take_a_plan_file(plans: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "lagom.json"
    r = CliRunner().invoke(main, ["solve", "lagom", str(plans["gpu"]), "--stage", "2", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "lagom" and doc["status"] in ("optimal", "feasible")
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0
    r = CliRunner().invoke(main, ["compare", "lagom", str(plans["gpu"]), "--json"])
    assert r.exit_code == 0, r.output
    assert {row["solver"] for row in json.loads(r.stdout)} >= {"nccl-default"}


def test_cpu_stages_are_refused_with_the_reason(plans: dict[str, Path]) -> None:
    r = CliRunner().invoke(main, ["solve", "lagom", str(plans["cpu"]), "-q"])
    assert r.exit_code == 2 and "gloo" in r.stderr and str(plans["cpu"]) in r.stderr
    mixed = json.loads(plans["gpu"].read_text())
    mixed["stages"][3]["device_type"] = "cpu"
    with pytest.raises(InputError, match=r"stages\[3\].device_type.*gloo"):
        lagom_problem_from_plan(mixed, 3, file="mixed.json")
    assert nccl_bottleneck_stage(mixed) != 3  # the default skips the CPU stage


def test_bad_stage_and_stage_on_a_problem_file(plans: dict[str, Path]) -> None:
    r = CliRunner().invoke(main, ["solve", "lagom", str(plans["gpu"]), "--stage", "9", "-q"])
    assert r.exit_code == 2 and "0..3" in r.stderr
    r = CliRunner().invoke(main, ["solve", "lagom", str(ROOT / "examples/lagom/small.yaml"), "--stage", "0", "-q"])
    assert r.exit_code == 2 and "--stage" in r.stderr


def test_a_poseidon_problem_is_pointed_to_solve_poseidon_first() -> None:
    src = ROOT / "examples/poseidon/h100-a100-small.yaml"
    r = CliRunner().invoke(main, ["solve", "lagom", str(src), "-q"])
    assert r.exit_code == 2 and "solve poseidon" in r.stderr and "'stages'" in r.stderr
