"""The frame shared by every model: units, clusters, errors, the plan format, the registry."""

from __future__ import annotations

import json
import os

import pytest

from gpuplan import api, registry
from gpuplan.errors import InputError
from gpuplan.io import atomic_write_text, digest, read_document
from gpuplan.models.base import Problem, Violation, validate
from gpuplan.models.cluster import Cluster
from gpuplan.models.plan import Plan, Status, read_plan_document
from gpuplan.models.workload import CATALOG, model_config, scaled
from gpuplan.units import GiB, to_bytes, to_GBps, to_seconds, to_tflops


def test_units_convert_and_refuse_other_dimensions() -> None:
    assert to_bytes("80 GiB") == 80 * GiB
    assert to_bytes(1000) == 1000.0
    assert to_GBps("25 Gbps") == pytest.approx(3.125)
    assert to_GBps("400 MB/s") == pytest.approx(0.4)
    assert to_seconds("5 us") == pytest.approx(5e-6)
    assert to_tflops("312 TFLOPS") == 312.0
    with pytest.raises(ValueError, match="not 'GHz'"):
        to_bytes("80 GHz")
    with pytest.raises(ValueError):
        to_seconds("3 GiB")


def test_cluster_short_form_fills_nodes() -> None:
    c = validate(Cluster, {"gpus": {"V100": 10, "k80": 4}, "gpus_per_node": 4})
    assert c.capacity() == {"V100": 10, "K80": 4}
    assert [len(n.gpus) for n in c.nodes] == [1, 1, 1, 1]
    assert sum(sum(n.gpus.values()) for n in c.nodes) == 14
    assert len(c.devices) == 14 and c.devices[-1].id == 13


def test_cluster_links_and_presets() -> None:
    c = validate(Cluster, {"preset": "dgx-a100x4"})
    assert c.capacity() == {"A100-80GB": 32}
    assert c.link("dgx0", "dgx1").bandwidth_GBps == pytest.approx(25.0)
    assert c.link("dgx0", "dgx0").bandwidth_GBps == 300.0
    c2 = validate(Cluster, {"nodes": [{"name": "a", "gpus": {"H100": 8}}, {"name": "b", "gpus": {"T4": 4}}],
                            "links": [{"a": "a", "b": "b", "bandwidth_GBps": "10 Gbps"}]})
    assert c2.link("b", "a").bandwidth_GBps == pytest.approx(1.25)


@pytest.mark.parametrize("doc, field, words", [
    ({"nodes": [{"name": "a", "gpus": {"X99": 4}}]}, "nodes[0].gpus.X99", "catalog"),
    ({"nodes": [{"name": "a", "gpus": {"V100": -4}}]}, "nodes[0].gpus", "non-negative"),
    ({"nodes": [{"name": "a"}]}, "nodes[0].gpus", "missing"),
    ({"nodes": [{"name": "a", "gpus": {"V100": 4}}], "inter_node": {"bandwidth_GBps": "10 GHz"}},
     "inter_node.bandwidth_GBps", "GHz"),
    ({"gpus": {"V100": 4}, "gpus_per_node": 0}, None, "gpus_per_node"),
])
def test_cluster_errors_name_file_field_value(doc: dict, field: str | None, words: str) -> None:
    with pytest.raises(InputError) as info:
        validate(Cluster, doc, file="bad.yaml")
    text = str(info.value)
    assert text.startswith("bad.yaml: ")
    if field:
        assert field in text
    assert words in text


def test_read_document_errors(tmp_path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_document(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        read_document(bad)
    lst = tmp_path / "list.json"
    lst.write_text("[1]")
    with pytest.raises(InputError, match="mapping"):
        read_document(lst)


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch) -> None:
    target = tmp_path / "plan.json"
    atomic_write_text(target, "old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_workload_catalog_parameter_counts() -> None:
    assert model_config("llama2-7b").total_params() == pytest.approx(6.74e9, rel=0.01)
    assert model_config("LLaMA3-8B").total_params() == pytest.approx(8.03e9, rel=0.01)
    assert model_config("gpt3-175b").total_params() == pytest.approx(175e9, rel=0.01)
    assert model_config("qwen3-8b").total_params() == pytest.approx(8.19e9, rel=0.01)
    with pytest.raises(ValueError, match="catalog"):
        model_config("gpt-5")
    small = scaled(CATALOG["llama3-8b"], num_layers=2, hidden=256, vocab=1000)
    assert small.num_layers == 2 and small.hidden == 256 and small.heads % small.kv == 0


def test_activation_bytes_matches_korthikanti_for_gpt() -> None:
    c = CATALOG["gpt3-1.3b"]
    s, b, h, a = 2048, 2, 2048, 16
    assert c.layer_activation_bytes(b, s, flash=False) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert c.layer_activation_bytes(b, s, tp=4, flash=False, sequence_parallel=False) == \
        pytest.approx(s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4)))


# ---- a tiny model to exercise the registry, solve/check and the plan format -------------------

class ToyProblem(Problem):
    kind: str = "toy"
    values: list[float]


class ToyPlan(Plan):
    choice: int = -1


def _toy_check(problem: ToyProblem, plan: ToyPlan) -> list[Violation]:
    best = max(problem.values)
    if not 0 <= plan.choice < len(problem.values):
        return [Violation("range", f"choice {plan.choice} outside 0..{len(problem.values) - 1}")]
    if problem.values[plan.choice] < best:
        return [Violation("not_max", "a larger value exists")]
    return []


def _toy_solve(problem: ToyProblem, *, time_limit_s, seed, progress) -> ToyPlan:
    i = max(range(len(problem.values)), key=problem.values.__getitem__)
    return ToyPlan(kind="toy", status=Status.OPTIMAL, objective=problem.values[i], choice=i)


@pytest.fixture()
def toy():
    registry.discover()
    registry.register_model(registry.ModelSpec("toy", ToyProblem, ToyPlan, _toy_check,
                                               summarize=lambda p, pl: {"value": pl.objective}))
    registry.register_solver("toy", "argmax", _toy_solve, default=True)
    yield
    registry._MODELS.pop("toy")
    registry._SOLVERS.pop("toy")


def test_solve_check_roundtrip(toy, tmp_path) -> None:
    plan = api.solve("toy", {"values": [1.0, 5.0, 2.0]}, seed=3)
    assert plan.solver.name == "argmax" and plan.solver.seed == 3
    assert plan.input_digest == digest(plan.problem)
    path = plan.save(tmp_path / "p.json")
    back = api.load_plan(path)
    assert isinstance(back, ToyPlan) and back.choice == 1
    assert api.check(None, back) == []
    bad = back.model_copy(update={"choice": 0})
    assert [v.code for v in api.check(None, bad)] == ["not_max"]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "toy", "values": [9.0, 1.0]}))
    assert [v.code for v in api.check(other, back)] == ["input_mismatch"]
    rows = api.compare({"kind": "toy", "values": [3.0]})
    assert rows[0][0] == "argmax" and rows[0][2]["value"] == 3.0


def test_kind_mismatch_and_unknown_kind(toy, tmp_path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("kind: toy\nvalues: [1]\n")
    with pytest.raises(InputError, match="kind"):
        api.load_problem(f, "oef-not-a-kind")
    f.write_text("kind: nope\nvalues: [1]\n")
    with pytest.raises(InputError, match=r"p\.yaml: field 'kind': got 'nope'; expected one of .*toy"):
        api.load_problem(f)
    f.write_text("kind: toy\nvalue: [1]\n")
    with pytest.raises(InputError) as info:
        api.load_problem(f)
    assert str(f) in str(info.value) and "values" in str(info.value)


def test_plan_file_errors(tmp_path) -> None:
    f = tmp_path / "plan.json"
    f.write_text('{"kind": "toy", "schema_version": 99}')
    with pytest.raises(InputError, match="schema_version"):
        read_plan_document(f)
    f.write_text('{"kind": "toy", "sche')
    with pytest.raises(InputError, match="not a JSON plan"):
        read_plan_document(f)


def test_atomic_write_gives_the_usual_file_mode(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "plan.json", "{}")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
