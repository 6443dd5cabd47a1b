"""`check` trusts nothing in a plan file, and `run` refuses a plan that fails check.

Each shipped example is solved once with its default solver and saved; the JSON document is then
tampered with as a person editing the file would (a larger embedded cluster, a raised limit, a
removed guarantee list, NaN numbers, false figures, an 'infeasible' status over a schedule, a digest
of another input) and each tampered plan must fail check with the expected violation code.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from gpuplan import api, registry
from gpuplan.cli import EXIT_VIOLATIONS, main
from gpuplan.models.plan import plan_from_document

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAN = float("nan")
Doc = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Case:
    """One kind's example and where its documents hold what the tampering classes change."""

    example: str
    enlarge: Callable[[Doc], None]          # make the embedded problem's cluster (or workload) larger
    raise_limit: Callable[[Doc], None]      # raise a limit of the embedded problem
    metric: str                             # the main predicted metric (makespan, step time...)
    nan_item: Callable[[Doc], None]         # put a NaN into a per-item figure of the plan
    other_input: Callable[[Doc], None]      # turn the problem into a different (valid) input


def _oef_enlarge(p: Doc) -> None:
    p["cluster"]["nodes"].append({"name": "V100-9", "gpus": {"V100": 8}})


def _tessel_nan(d: Doc) -> None:
    d["schedule"][0][0]["start_s"] = NAN


def _lagom_enlarge(p: Doc) -> None:
    p["groups"]["dp"]["ranks"] *= 2


def _aurora_enlarge(p: Doc) -> None:
    p["workers"].append({**p["workers"][0], "name": "extra"})


def _poseidon_enlarge(p: Doc) -> None:
    p["cluster"]["nodes"][0]["gpus"]["cpu"] += 3


def _omniserve_enlarge(p: Doc) -> None:
    p["cpu_pools"].append({**p["cpu_pools"][0], "name": "extra"})


def _stragglers_enlarge(p: Doc) -> None:
    p["jobs"].append({**p["jobs"][0], "id": "extra"})


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    """Return a function setting a dotted path ([i] for list items) of a document; a callable
    `value` maps the old value to the new one."""
    def apply(doc: Doc) -> None:
        keys: list[Any] = []
        for part in path.split("."):
            name, *idx = part.replace("]", "").split("[")
            keys += ([name] if name else []) + [int(i) for i in idx]
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value(node[keys[-1]]) if callable(value) else value
    return apply


CASES: dict[str, Case] = {
    "oef": Case("oef/four-tenants.yaml", _oef_enlarge, _set("round_tolerance", 1.0), "efficiency",
                _set("shares[0][0]", NAN), _set("round_s", 60.0)),
    "tessel": Case("tessel/hand-2.yaml", _set("devices", 4), _set("memory_limit_bytes", lambda v: [x * 10 for x in v]),
                   "makespan_s", _tessel_nan, _set("microbatches", 4)),
    "lagom": Case("lagom/small.yaml", _lagom_enlarge, _set("grid.max_channels", 64), "iteration_s",
                  _set("windows[0].time_s", NAN), _set("segments[0].compute_s", 0.008)),
    "aurora": Case("aurora/small-2regions.yaml", _aurora_enlarge, _set("max_staleness", 4), "step_time_s",
                   _set("edges[0].rate_GBps", NAN), _set("batch_samples", 32)),
    "poseidon": Case("poseidon/cpu-two-types.yaml", _poseidon_enlarge,
                     _set("cluster.device_types.cpu.memory_bytes", lambda v: v * 100), "iteration_time_s",
                     _set("stages[0].forward_s", NAN), _set("global_batch", 16)),
    "psrl": Case("psrl/small-agent.yaml", _set("workers[0].count", 4), _set("cache_fraction", 0.5), "makespan_s",
                 _set("load_s.gpu0", NAN), _set("exchange_GBps", 5.0)),
    "omniserve": Case("omniserve/llama70b-small.yaml", _omniserve_enlarge, _set("ls.ttft_slo_s", 30.0),
                      "be_output_tokens_per_s", _set("schedule[0].duration_s", NAN), _set("seed", 1)),
    "hetis": Case("hetis/small.yaml", _set("cluster.nodes[0].gpus.A100-80GB", 4), _set("slo.tpot_s", 1.0),
                  "max_rate_per_s", _set("kv_capacity_bytes.0", NAN), _set("trace.seed", 1)),
    "stragglers": Case("stragglers/three-jobs.yaml", _stragglers_enlarge, _set("slots", 64), "weighted_flowtime_s",
                       _set("completion_s[0]", NAN), _set("jobs[0].weight", 5.0)),
}


@pytest.fixture(scope="module")
def solved() -> dict[str, Doc]:
    """Return each kind's plan document, solved once with the default solver (under a 2 s limit: a
    plan cut short is as good a target for tampering as an optimal one)."""
    out = {}
    for kind, case in CASES.items():
        plan = api.solve(api.load_problem(EXAMPLES / case.example), time_limit_s=2)
        assert plan.ok, kind
        out[kind] = json.loads(plan.to_json())
    return out


def _codes(kind: str, doc: Doc, problem: Any = None) -> set[str]:
    plan = plan_from_document(registry.model(kind).plan_type, json.loads(json.dumps(doc)))
    return {v.code for v in api.check(problem, plan)}


def _scale(path: str, factor: float) -> Callable[[Doc], None]:
    return _set(path, lambda v: v * factor)


# (name, tamper(doc, case), the violation codes any one of which must be reported)
GENERIC: list[tuple[str, Callable[[Doc, Case], None], set[str]]] = [
    ("enlarged embedded cluster", lambda d, c: c.enlarge(d["problem"]), {"problem_digest"}),
    ("raised limit", lambda d, c: c.raise_limit(d["problem"]), {"problem_digest"}),
    ("digest of another input", lambda d, c: d.update(input_digest="sha256:" + "0" * 64), {"problem_digest"}),
    ("digest removed", lambda d, c: d.update(input_digest=""), {"digest"}),
    ("NaN predicted metric", lambda d, c: d["predicted"].update({c.metric: NAN}), {"non_finite"}),
    ("NaN per-item figure", lambda d, c: c.nan_item(d), {"non_finite"}),
    ("false objective", lambda d, c: d.update(objective=d["objective"] * 0.5),
     {"figure", "iteration_time", "objective", "predicted_time"}),
    ("false predicted metric", lambda d, c: d["predicted"].update({c.metric: d["predicted"][c.metric] * 0.5}),
     {"figure", "prediction", "predicted_time"}),
    ("infeasible status with a solution", lambda d, c: d.update(status="infeasible"), {"status"}),
    ("unknown solver", lambda d, c: d["solver"].update(name="hand-tuned"), {"unknown_solver"}),
    ("solver removed", lambda d, c: d.update(solver=None), {"unknown_solver"}),
    ("another schema version", lambda d, c: d.update(schema_version=2), {"schema_version"}),
]

def _generic_params() -> list[Any]:
    out = []
    for kind in CASES:
        for name, tamper, codes in GENERIC:
            out.append(pytest.param(kind, tamper, codes, id=f"{kind}: {name}"))
    return out


@pytest.mark.parametrize("kind,tamper,codes", _generic_params())
def test_tampered_plan_is_caught(solved: dict[str, Doc], kind: str, tamper: Callable[[Doc, Case], None],
                                 codes: set[str]) -> None:
    assert _codes(kind, solved[kind]) == set()  # the untampered plan passes
    doc = copy.deepcopy(solved[kind])
    tamper(doc, CASES[kind])
    found = _codes(kind, doc)
    assert found & codes, found


@pytest.mark.parametrize("kind", list(CASES))
def test_plan_for_another_input_is_reported(solved: dict[str, Doc], kind: str) -> None:
    other = copy.deepcopy(solved[kind]["problem"])
    CASES[kind].other_input(other)
    api.load_problem(other)  # a valid problem, only a different one
    assert _codes(kind, solved[kind], other) == {"input_mismatch"}
    assert _codes(kind, solved[kind], EXAMPLES / CASES[kind].example) == set()


SPECIFIC: list[tuple[str, str, Callable[[Doc], None], set[str]]] = [
    # OEF: the guarantees checked are the solver's contract, not the plan's list
    ("stragglers", "false completion time", _scale("completion_s[0]", 0.5), {"figure"}),
    ("stragglers", "false machine time", _scale("predicted.machine_time_s", 0.5), {"figure"}),
    ("stragglers", "reduce copy before its maps",
     _set("schedule", lambda s: [r if r[2] == 0 else r[:3] + [0.0] + r[4:] for r in s]), {"map_before_reduce", "figure"}),
    ("stragglers", "other seed", _set("sim_seed", 7), {"figure"}),
    ("oef", "guarantees removed", _set("guarantees", []), {"guarantees"}),
    ("oef", "unfair shares, guarantees removed",
     lambda d: (_set("guarantees", [])(d), _set("shares", lambda s: [[0.0] * len(r) for r in s[:1]] + s[1:])(d)),
     {"sharing_incentive"}),
    ("oef", "false throughput", _scale("predicted.throughput_steps_per_s", 1.5), {"figure"}),
    ("oef", "false round gap", _set("predicted.round_gap", 0.0), {"figure"}),
    ("oef", "rounds dropped", _set("rounds", []), {"rounds"}),
    # Tessel: every stated per-item figure is recomputed
    ("tessel", "false peak memory (predicted)", _scale("predicted.peak_memory_bytes", 0.5), {"figure"}),
    ("tessel", "false peak memory (per device)", _scale("peak_memory_bytes[0]", 0.5), {"figure"}),
    ("tessel", "false makespan field", _scale("makespan_s", 0.5), {"makespan"}),
    ("tessel", "false bubble ratio", _set("bubble_ratio", 0.0), {"figure"}),
    ("tessel", "false period", _scale("predicted.period_s", 0.5), {"figure"}),
    ("tessel", "lower bound above the makespan", _scale("predicted.lower_bound_s", 3.0), {"figure"}),
    ("tessel", "block time moved into an overlap", _set("schedule[0][1].start_s", lambda v: v - 0.005),
     {"overlap", "duration", "dependency"}),
    ("tessel", "infeasible status over an overlapping schedule",
     lambda d: (_set("schedule[0][1].start_s", 0.0)(d), d.update(status="infeasible")), {"status"}),
    # Lagom: windows, baselines and emitted env vars
    ("lagom", "false window time", _scale("windows[0].time_s", 0.5), {"figure"}),
    ("lagom", "false baseline time", _scale("predicted.iteration_s_nccl_default", 0.5), {"figure"}),
    ("lagom", "false compute-alone time", _scale("predicted.compute_alone_s", 2.0), {"figure"}),
    ("lagom", "false iteration field", _scale("iteration_s", 0.5), {"iteration_time"}),
    ("lagom", "baseline outside NCCL's rules", _set("baselines.nccl-default[0].channels", 0), {"baseline"}),
    ("lagom", "env var the settings do not emit", lambda d: d["env"].update(NCCL_ALGO="Tree"), {"env"}),
    # AuroraRL: transfer times and the tree
    ("aurora", "false arrival time", lambda d: _scale(f"arrival_s.{next(iter(d['arrival_s']))}", 0.5)(d), {"figure"}),
    ("aurora", "false transfer time", _scale("predicted.transfer_s", 0.5), {"figure"}),
    ("aurora", "orphan worker", lambda d: d["edges"].pop(0), {"rollout_worker", "not_a_tree", "figure"}),
    ("aurora", "false objective", _scale("objective", 0.5), {"figure"}),
    # Poseidon: a stage's nodes (its sends and all-reduces are costed over them) and the micro-batches
    ("poseidon", "stage nodes that are not its devices' nodes", _set("stages[0].nodes", ["elsewhere"]),
     {"stage_nodes"}),
    ("poseidon", "stage without nodes", _set("stages[0].nodes", []), {"stage_nodes"}),
    ("poseidon", "zero micro-batches", _set("num_microbatches", 0), {"batch"}),
    ("lagom", "false objective", _scale("objective", 0.5), {"iteration_time"}),
]


@pytest.mark.parametrize("kind,tamper,codes", [pytest.param(k, t, c, id=f"{k}: {n}") for k, n, t, c in SPECIFIC])
def test_model_specific_tampering_is_caught(solved: dict[str, Doc], kind: str, tamper: Callable[[Doc], None],
                                            codes: set[str]) -> None:
    doc = copy.deepcopy(solved[kind])
    tamper(doc)
    found = _codes(kind, doc)
    assert found & codes, found


def test_oef_contract_comes_from_the_registry() -> None:
    assert set(registry.contract("oef", "oef") or ()) == {"sharing_incentive", "envy_free"}
    assert registry.contract("oef", "gavel-maxmin") == ()
    assert registry.contract("oef", "no-such-solver") is None


# examples whose default solve takes more than a few seconds on a small CPU
SLOW_EXAMPLES = {"a100-v100-t4.yaml", "mshape-4.yaml", "llama2-13b-tp8-dp4.yaml", "paper-like.yaml",
                 "paper-12gpu.yaml", "paper-opt30b.yaml"}


def _example_params() -> list[Any]:
    out = []
    for path in sorted(EXAMPLES.glob("*/*.yaml")):
        if "kind:" not in path.read_text(encoding="utf-8"):
            continue  # a trace or a cluster file, not a problem
        slow = path.name in SLOW_EXAMPLES
        out.append(pytest.param(path, id=f"{path.parent.name}/{path.name}",
                                marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("path", _example_params())
def test_untampered_example_plans_pass(path: Path, tmp_path: Path) -> None:
    plan = api.solve(api.load_problem(path), time_limit_s=10)
    saved = api.load_plan(plan.save(tmp_path / "plan.json"))
    assert api.check(None, saved) == []
    assert api.check(path, saved) == []


# ---------------------------------------------------------------- run refuses

CALLED: list[str] = []


def forbidden_runner(problem: Any, plan: Any, **options: Any) -> dict[str, Any]:
    """Stand-in executor: records that it was reached (it must not be, for a rejected plan)."""
    CALLED.append(plan.kind)
    return {"ran": 1}


@pytest.mark.parametrize("kind,tamper", [
    ("tessel", _set("schedule[0][1].start_s", 0.0)),                    # overlapping blocks
    ("tessel", lambda d: (_set("schedule[0][1].start_s", 0.0)(d), d.update(status="infeasible"))),
    ("aurora", lambda d: d["edges"].pop(0)),                            # an orphan worker
    ("oef", lambda d: d.update(guarantees=[], shares=[[0.0] * len(d["shares"][0])] + d["shares"][1:])),
    ("lagom", _scale("predicted.iteration_s", 0.5)),
    ("poseidon", lambda d: d["problem"]["cluster"]["nodes"][0]["gpus"].update(cpu=4)),
])
def test_run_refuses_a_plan_that_fails_check(solved: dict[str, Doc], kind: str, tamper: Callable[[Doc], None],
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = registry.model(kind)
    monkeypatch.setitem(registry._MODELS, kind, dataclasses.replace(spec, runner=f"{__name__}:forbidden_runner"))
    started: list[Any] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("a process started"))
    doc = copy.deepcopy(solved[kind])
    tamper(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    runner = CliRunner()
    extra = ["--", "true"] if kind == "lagom" else []
    checked = runner.invoke(main, ["check", str(path)])
    assert checked.exit_code == EXIT_VIOLATIONS, checked.output
    CALLED.clear()
    res = runner.invoke(main, ["run", kind, str(path), *extra])
    assert res.exit_code == EXIT_VIOLATIONS, res.output
    assert "fails check" in res.output and not CALLED and not started
    # the violations named by run are those check prints
    first = next(line.strip() for line in checked.output.splitlines()[1:] if line.strip().startswith("["))
    assert first in res.output
    with pytest.raises(api.PlanRejected) as info:
        api.run(api.load_plan(path))
    assert info.value.violations and not CALLED


def test_run_reaches_the_executor_for_a_valid_plan(solved: dict[str, Doc], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = registry.model("tessel")
    monkeypatch.setitem(registry._MODELS, "tessel", dataclasses.replace(spec, runner=f"{__name__}:forbidden_runner"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(solved["tessel"]))
    CALLED.clear()
    res = CliRunner().invoke(main, ["run", str(path)])
    assert res.exit_code == 0, res.output
    assert CALLED == ["tessel"]


def test_non_finite_paths_name_the_field() -> None:
    from gpuplan.models.plan import non_finite_paths

    assert non_finite_paths({"a": [1.0, {"b": math.inf}], "c": NAN, "d": 3}) == ["a[1].b", "c"]


def test_infeasible_plan_over_an_overlap_names_both(solved: dict[str, Doc]) -> None:
    doc = copy.deepcopy(solved["tessel"])
    _set("schedule[0][1].start_s", 0.0)(doc)
    doc["status"] = "infeasible"
    assert {"status", "overlap"} <= _codes("tessel", doc)
    clean = {k: v for k, v in doc.items() if k in ("kind", "schema_version", "solver", "input_digest", "problem")}
    assert _codes("tessel", {**clean, "status": "infeasible", "message": "no schedule fits"}) == set()
