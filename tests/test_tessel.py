"""Tessel: placements, the classic schedules' closed forms, the repetend search vs exact, check."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.models.tessel import (DeadlockError, Entry, TesselPlan, TesselProblem, check, makespan_s, simulate)
from gpuplan.solvers import tessel_classic as classic


def problem(shape: str, p: int, m: int, *, f: float = 1.0, b: float = 2.0, w: float = 0.0, chunks: int = 2,
            memory: float | None = None) -> TesselProblem:
    doc = {"kind": "tessel", "microbatches": m,
           "shape": {"name": shape, "devices": p, "forward_s": f, "backward_s": b, "backward_weight_s": w,
                     "chunks": chunks}}
    if memory is not None:
        doc["memory_limit_bytes"] = memory
    return api.load_problem(doc)  # type: ignore[return-value]


def idle_per_device(plan: TesselPlan, prob: TesselProblem) -> float:
    return plan.makespan_s - prob.busy_s()[0] * prob.microbatches


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8), (8, 16)])
def test_gpipe_and_1f1b_have_the_closed_form_bubble(p: int, m: int) -> None:
    prob = problem("1f1b", p, m)
    for name in ("gpipe", "1f1b"):
        plan = api.solve(prob, solver=name)
        assert not check(prob, plan)
        assert plan.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
    one = api.solve(prob, solver="1f1b")
    assert one.peak_memory_bytes[0] == pytest.approx(min(p, m))  # p activations on the first stage
    assert api.solve(prob, solver="gpipe").peak_memory_bytes[0] == pytest.approx(m)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 2)])
def test_interleaved_1f1b_has_the_closed_form_bubble(p: int, m: int, v: int) -> None:
    prob = problem("interleaved", p, m, chunks=v)
    plan = api.solve(prob, solver="interleaved-1f1b")
    assert not check(prob, plan)
    assert plan.bubble_ratio == pytest.approx(((p - 1) / v) / (m + (p - 1) / v))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zero_bubble_h1_h2_and_v_bubbles(p: int, m: int) -> None:
    prob = problem("1f1b", p, m, b=1.0, w=1.0)
    h1 = api.solve(prob, solver="zb-h1")
    assert not check(prob, h1)
    assert idle_per_device(h1, prob) == pytest.approx((p - 1) * (1 + 1 - 1))  # (p-1)(F+B-W)
    assert max(h1.peak_memory_bytes) <= p + 1e-9  # 1F1B's peak
    h2 = api.solve(prob, solver="zb-h2")
    assert not check(prob, h2) and max(h2.peak_memory_bytes) <= 2 * p - 1 + 1e-9
    # with equal times the last device cannot start before (p-1)F: H2 reaches that bound
    assert h2.makespan_s == pytest.approx(p - 1 + 3 * m)
    vprob = problem("vshape", p, m, b=1.0, w=1.0)
    zbv = api.solve(vprob, solver="zb-v")
    assert not check(vprob, zbv)
    assert zbv.makespan_s == pytest.approx(p - 1 + 6 * m)  # only the unavoidable start delay
    assert max(zbv.peak_memory_bytes) <= 2 * p + 1e-9  # p micro-batches of both chunks


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 16)])
def test_tessel_on_the_1f1b_placement_is_no_worse_than_1f1b_at_its_memory(p: int, m: int, split: bool) -> None:
    base = problem("1f1b", p, m, b=1.0 if split else 2.0, w=1.0 if split else 0.0)
    one = api.solve(base, solver="1f1b")
    prob = problem("1f1b", p, m, b=1.0 if split else 2.0, w=1.0 if split else 0.0,
                   memory=max(one.peak_memory_bytes))
    plan = api.solve(prob, solver="tessel")
    assert not check(prob, plan)
    assert plan.makespan_s <= one.makespan_s + 1e-9
    assert plan.repetend is not None and plan.repetend.period_s == pytest.approx(max(prob.busy_s()))


def test_repetend_period_meets_the_busy_bound_on_standard_shapes() -> None:
    for shape, mem in (("vshape", 8.0), ("tp_pp", 8.0), ("chimera", None)):
        prob = problem(shape, 4, 8, b=1.0, w=1.0, memory=mem)
        # the search itself (with the floor, a baseline at the lower bound is returned without a search)
        plan = api.solve(prob, solver="tessel-unrolled")
        assert not check(prob, plan), shape
        assert plan.repetend is not None
        assert plan.repetend.period_s == pytest.approx(max(prob.busy_s())), shape
        assert api.solve(prob, solver="tessel").makespan_s <= plan.makespan_s + 1e-9


@st.composite
def small_problems(draw: st.DrawFn) -> TesselProblem:
    d = draw(st.integers(2, 3))
    n = draw(st.integers(2, 4))
    blocks = []
    for j in range(n):
        devs = sorted(draw(st.sets(st.integers(0, d - 1), min_size=1, max_size=2)))
        after = [f"b{k}" for k in range(j) if draw(st.booleans())] or ([f"b{j - 1}"] if j else [])
        blocks.append({"name": f"b{j}", "devices": devs, "duration_s": draw(st.integers(1, 3)), "after": after})
    # a forward/backward pair of memory on a device of the first and the last block
    if blocks[0]["devices"] == blocks[-1]["devices"] and n > 1:
        blocks[0]["memory_bytes"], blocks[-1]["memory_bytes"] = 1.0, -1.0
    mem = draw(st.sampled_from([None, 2.0, 3.0]))
    doc = {"kind": "tessel", "devices": d, "microbatches": draw(st.integers(2, 5)), "blocks": blocks}
    if mem is not None:
        doc["memory_limit_bytes"] = mem
    return api.load_problem(doc)  # type: ignore[return-value]


GAP_SMALL = 0.20  # stated gap to the exact optimum on tiny instances (N <= 5: one tick in 8 is 12.5%)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_tessel_is_valid_and_near_exact_on_small_placements(prob: TesselProblem) -> None:
    plan = api.solve(prob, solver="tessel")
    assert not check(prob, plan)
    exact = api.solve(prob, solver="exact", time_limit_s=10)
    assert not check(prob, exact)
    assert exact.makespan_s <= plan.makespan_s + 1e-9
    assert plan.makespan_s <= (1 + GAP_SMALL) * exact.makespan_s + 1e-9
    # the makespan can never beat the busiest device
    assert exact.makespan_s >= max(prob.busy_s()) * prob.microbatches - 1e-9


def regression_spanning_blocks() -> TesselProblem:
    """Blocks on two devices each whose minimal period is the sum of all durations (found by hypothesis)."""
    blocks = [{"name": "b0", "devices": [0, 2], "duration_s": 1, "memory_bytes": 1.0},
              {"name": "b1", "devices": [1, 2], "duration_s": 2, "after": ["b0"]},
              {"name": "b2", "devices": [0, 1], "duration_s": 2, "after": ["b1"]},
              {"name": "b3", "devices": [0, 2], "duration_s": 1, "memory_bytes": -1.0, "after": ["b2"]}]
    return api.load_problem({"kind": "tessel", "devices": 3, "microbatches": 2, "blocks": blocks})  # type: ignore


def test_repetend_search_reaches_the_one_at_a_time_period() -> None:
    # periods 4 and 5 have no repetend; the search used to stop before trying 6 (= one micro-batch at a time)
    prob = regression_spanning_blocks()
    plan = api.solve(prob, solver="tessel")
    assert plan.ok and not check(prob, plan)
    assert plan.repetend is not None and plan.repetend.period_s == pytest.approx(6.0)
    exact = api.solve(prob, solver="exact", time_limit_s=10)
    assert exact.ok and not check(prob, exact)
    assert max(prob.busy_s()) * prob.microbatches - 1e-9 <= exact.makespan_s <= plan.makespan_s + 1e-9


def test_repetend_lags_are_not_left_arbitrary() -> None:
    # period 3 is feasible with any lags; lags (0, 2, 3, 4) made Tessel 10 s against the exact 8 s
    blocks = [{"name": "b0", "devices": [1], "duration_s": 2},
              {"name": "b1", "devices": [0, 1], "duration_s": 1, "after": ["b0"]},
              {"name": "b2", "devices": [0], "duration_s": 1, "after": ["b1"]},
              {"name": "b3", "devices": [0], "duration_s": 1, "after": ["b2"]}]
    prob = api.load_problem({"kind": "tessel", "devices": 2, "microbatches": 2, "blocks": blocks})
    plan = api.solve(prob, solver="tessel")
    assert not check(prob, plan) and plan.makespan_s == pytest.approx(8.0)
    assert api.solve(prob, solver="exact", time_limit_s=10).makespan_s == pytest.approx(8.0)


def test_exact_does_not_need_the_tessel_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuplan.errors import SolverError
    from gpuplan.solvers import tessel as solvers

    def no_hint(*_: object, **__: object) -> TesselPlan:
        raise SolverError("no repetend in the limit")
    prob = problem("1f1b", 2, 3, memory=2.0)
    expected = api.solve(prob, solver="exact", time_limit_s=10).makespan_s
    monkeypatch.setattr(solvers, "solve_tessel", no_hint)
    plan = api.solve(prob, solver="exact", time_limit_s=10)
    assert plan.ok and not check(prob, plan) and not plan.solver.stats["tessel_hint"]
    assert plan.makespan_s == pytest.approx(expected)


def test_check_rejects_hand_made_violations() -> None:
    prob = problem("1f1b", 2, 2, memory=1.0)
    good = api.solve(problem("1f1b", 2, 2, memory=2.0), solver="1f1b")
    # memory: the same 1F1B plan against a 1-byte limit keeps two activations on device 0
    codes = {v.code for v in check(prob, good)}
    assert "memory" in codes
    prob2 = problem("1f1b", 2, 2)
    sched = [list(dev) for dev in good.schedule]
    # dependency: start B1#0 before F1#0 ends
    dev1 = [e.model_copy(update={"start_s": e.start_s - 1, "end_s": e.end_s - 1}) if e.block == "B1"
            and e.microbatch == 0 else e for e in sched[1]]
    bad = good.model_copy(update={"schedule": [sched[0], dev1]})
    assert "dependency" in {v.code for v in check(prob2, bad)}
    # overlap: two entries of device 0 at the same time
    dev0 = [e.model_copy(update={"start_s": 0.0, "end_s": 1.0}) if e.block == "F0" else e for e in sched[0]]
    bad = good.model_copy(update={"schedule": [dev0, sched[1]]})
    assert "overlap" in {v.code for v in check(prob2, bad)}
    # missing instance and a wrong makespan
    bad = good.model_copy(update={"schedule": [sched[0][1:], sched[1]], "makespan_s": 1.0})
    codes = {v.code for v in check(prob2, bad)}
    assert {"missing", "makespan"} <= codes
    assert not check(prob2, good)


def test_bad_placements_are_refused_with_the_field() -> None:
    base = {"kind": "tessel", "devices": 2, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1, "memory_bytes": 1},
        {"name": "b", "devices": [1], "duration_s": 1, "after": ["a"]},
        {"name": "c", "devices": [0], "duration_s": 1, "after": ["b"], "memory_bytes": -1}]}
    api.load_problem(base)
    with pytest.raises(InputError, match=r"blocks\[1\]\.devices.*0\.\.1, got 5"):
        api.load_problem({**base, "blocks": [base["blocks"][0], {**base["blocks"][1], "devices": [5]},
                                             base["blocks"][2]]})
    with pytest.raises(InputError, match="cycle"):
        api.load_problem({**base, "blocks": [{**base["blocks"][0], "after": ["c"]}] + base["blocks"][1:]})
    with pytest.raises(InputError, match="sum to 0"):
        api.load_problem({**base, "blocks": base["blocks"][:2]})
    with pytest.raises(InputError, match="duration_s"):
        api.load_problem({**base, "blocks": [{**base["blocks"][0], "duration_s": -1}] + base["blocks"][1:]})


def test_too_little_memory_is_infeasible_with_numbers() -> None:
    prob = problem("vshape", 2, 4, memory=1.0)  # one micro-batch keeps 2 activations on each device
    plan = api.solve(prob, solver="tessel")
    assert not plan.ok and "2 bytes" in plan.message and "limit is 1 bytes" in plan.message


def test_simulator_reports_a_deadlock() -> None:
    prob = problem("1f1b", 2, 1)
    with pytest.raises(DeadlockError, match="device 0 waits at B0#0"):
        simulate(prob, [[("B0", 0), ("F0", 0)], [("F1", 0), ("B1", 0)]])


def test_plan_round_trip_show_and_draw(tmp_path) -> None:
    prob = problem("vshape", 2, 4, b=1.0, w=1.0)
    plan = api.solve(prob, solver="tessel")
    path = plan.save(tmp_path / "plan.json")
    back = api.load_plan(path)
    assert isinstance(back, TesselPlan) and back.makespan_s == plan.makespan_s
    assert not api.check(None, back)
    from gpuplan import registry

    spec = registry.model("tessel")
    tables = spec.describe(prob, back)
    assert tables[0].rows and tables[1].title.startswith("repetend")
    spec.draw(prob, back, tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").read_bytes()[:4] == b"\x89PNG"


def test_solvers_are_deterministic() -> None:
    prob = problem("tp_pp", 4, 8, b=1.0, w=1.0, memory=6.0)
    a, b = api.solve(prob, solver="tessel", seed=3), api.solve(prob, solver="tessel", seed=3)
    assert [[(e.block, e.microbatch, e.start_s) for e in d] for d in a.schedule] == \
        [[(e.block, e.microbatch, e.start_s) for e in d] for d in b.schedule]


def test_classic_schedules_refuse_other_placements() -> None:
    prob = problem("tp_pp", 4, 8)
    assert classic.pipeline_reason(prob, chunks=1) is not None
    rows = {name: s for name, _, s in api.compare(prob, solvers=["1f1b", "zb-v", "chimera"])}
    assert all(str(s["status"]).startswith("skipped") for s in rows.values())


def test_makespan_and_entries_agree() -> None:
    prob = problem("1f1b", 2, 2)
    plan = api.solve(prob, solver="gpipe")
    assert makespan_s(plan.schedule) == plan.makespan_s
    assert all(isinstance(e, Entry) for d in plan.schedule for e in d)


def test_a_poseidon_plan_becomes_a_1f1b_placement() -> None:
    from gpuplan.compose.tessel_poseidon import problem_from_poseidon

    plan = {"kind": "poseidon", "status": "optimal", "num_microbatches": 6, "stages": [
        {"index": 0, "forward_s": 0.02, "backward_s": 0.04, "p2p_s": 0.001},
        {"index": 1, "forward_s": 0.03, "backward_s": 0.06, "p2p_s": 0.001},
        {"index": 2, "forward_s": 0.02, "backward_s": 0.04, "p2p_s": 0.0}]}
    prob = problem_from_poseidon(plan)
    assert prob.devices == 3 and prob.microbatches == 6
    assert prob.block("F0").duration_s == pytest.approx(0.021) and prob.block("B1").duration_s == pytest.approx(0.061)
    assert [prob.limit(d) for d in range(3)] == [3.0, 2.0, 1.0]  # 1F1B's in-flight micro-batches
    one = api.solve(prob, solver="1f1b")
    assert not check(prob, one)  # Poseidon's own schedule fits the memory it was checked for
    tessel = api.solve(prob, solver="tessel")
    assert not check(prob, tessel) and tessel.makespan_s <= one.makespan_s + 1e-9
    with pytest.raises(InputError, match="feasible Poseidon plan"):
        problem_from_poseidon({"kind": "poseidon", "status": "infeasible", "stages": []})


def test_inference_placements_report_latency_and_stream_throughput() -> None:
    prob = api.load_problem({"kind": "tessel", "microbatches": 6,
                             "shape": {"name": "vshape", "devices": 2, "forward_s": 1.0, "inference": True}})
    assert prob.mode == "inference" and {b.kind for b in prob.blocks} == {"forward"}
    plan = api.solve(prob, solver="tessel")
    assert not check(prob, plan)
    assert plan.repetend is not None and plan.repetend.period_s == pytest.approx(2.0)
    assert plan.predicted["batch_latency_s"] == pytest.approx(plan.makespan_s)
    assert plan.predicted["stream_throughput_mb_per_s"] == pytest.approx(0.5)
    assert plan.makespan_s == pytest.approx(plan.predicted["lower_bound_s"])


def test_cli_solve_compare_check_show(tmp_path) -> None:
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from gpuplan.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "tessel" / "1f1b-4.yaml"
    runner = CliRunner()
    out = tmp_path / "plan.json"
    res = runner.invoke(main, ["solve", "tessel", str(example), "--microbatches", "4", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = api.load_plan(out)
    assert plan.problem["microbatches"] == 4 and plan.schedule_name == "tessel"  # type: ignore[attr-defined]
    assert runner.invoke(main, ["check", str(out)]).exit_code == 0
    res = runner.invoke(main, ["show", str(out), "--png", str(tmp_path / "g.png")])
    assert res.exit_code == 0 and (tmp_path / "g.png").exists()
    table = tmp_path / "cmp.json"
    res = runner.invoke(main, ["compare", "tessel", str(example), "-n", "4", "-q", "--solvers", "tessel,1f1b,zb-v",
                               "--json", str(table)])
    assert res.exit_code == 0, res.output
    rows = {r["solver"]: r for r in json.loads(table.read_text())}
    assert rows["tessel"]["makespan_s"] <= rows["1f1b"]["makespan_s"]
    assert str(rows["zb-v"]["status"]).startswith("skipped")
    res = runner.invoke(main, ["solve", "tessel", str(example), "--memory-limit", "-1", "-q", "-o", str(out)])
    assert res.exit_code == 2 and "memory_limit_bytes" in res.output


# ---------------------------------------------------------------- check: the repetend and the solver's figures

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tessel"


@pytest.fixture(scope="module")
def solved_docs() -> dict[str, dict]:
    """Return plan documents to tamper with: Tessel (grouped repetend, completed) and its unrolled variant on
    hand-2, Tessel returning a baseline at the bound (1f1b-4), a baseline, exact on a small placement, and
    Tessel above the bound."""
    import json

    hand, one = api.load_problem(EXAMPLES / "hand-2.yaml"), api.load_problem(EXAMPLES / "1f1b-4.yaml")
    plans = {"tessel": api.solve(hand, time_limit_s=2), "unrolled": api.solve(hand, solver="tessel-unrolled"),
             "skipped": api.solve(one, time_limit_s=2), "baseline": api.solve(one, solver="1f1b"),
             "exact": api.solve(problem("1f1b", 2, 3, w=1.0), solver="exact", time_limit_s=5),
             # durations rounded to CP-SAT's ticks, a makespan above the lower bound
             "irregular": api.solve(problem("1f1b", 4, 8, f=1.37, b=2.91, w=0.83, memory=4.0), time_limit_s=2)}
    assert plans["tessel"].repetend.group == 2 and "completion_candidates_s" in plans["tessel"].solver.stats
    assert "search_skipped" in plans["skipped"].solver.stats
    return {name: json.loads(plan.to_json()) for name, plan in plans.items()}


def _violations(doc: dict) -> list:
    """Return the violations api.check finds in a plan document (its embedded problem)."""
    from gpuplan.models.plan import plan_from_document

    return api.check(None, plan_from_document(TesselPlan, doc))


def _scaled(section: str, key: str, fn: Callable[[Any, dict], Any]) -> Callable[[dict], None]:
    """Return a tamper setting doc[section...][key] to fn(old value, doc) (section: a dotted path of mappings)."""
    def apply(doc: dict) -> None:
        node = doc
        for part in section.split("."):
            node = node[part]
        node[key] = fn(node[key], doc)
    return apply


def _period_halved(doc: dict) -> None:
    for node, key in ((doc["repetend"], "period_s"), (doc["predicted"], "period_s")):
        node[key] *= 0.5
    doc["predicted"]["stream_throughput_mb_per_s"] *= 2


def _offset_onto(doc: dict) -> None:
    doc["repetend"]["offset_s"]["F2@0"] = doc["repetend"]["offset_s"]["F1@1"]  # both on device 1


def _frees_late(doc: dict) -> None:  # B0 frees 1 GB on device 0: three periods later keeps 3 GB more in flight
    for k in ("B0@0", "B0@1"):
        doc["repetend"]["lag"][k] += 3


def _baseline_returned(doc: dict) -> None:  # the makespan of the baseline the plan is, raised
    stats = doc["solver"]["stats"]
    stats["best_baseline"][stats["schedule_from"]] = stats["best_baseline"][stats["schedule_from"]] * 1.5 + 1


def _baseline_shorter(doc: dict) -> None:  # between the lower bound and the plan's makespan
    for name in doc["solver"]["stats"]["best_baseline"]:
        doc["solver"]["stats"]["best_baseline"][name] = (doc["makespan_s"] + doc["predicted"]["lower_bound_s"]) / 2


STATS = "solver.stats"
TAMPERS = [  # (plan, what, tamper, code, words of the message)
    ("tessel", "offset outside the period", _scaled("repetend.offset_s", "F3@0", lambda v, d: v * 1.5 + 1),
     "repetend", "outside the period"),
    ("tessel", "offset onto another block of its device", _offset_onto, "repetend", "modulo the period"),
    ("tessel", "lag breaking a dependency", _scaled("repetend.lag", "F0@0", lambda v, d: v + 1), "repetend",
     "before F0@0 ends"),
    ("tessel", "lags keeping memory over the limit", _frees_late, "repetend", "in the steady state"),
    ("tessel", "period below the busy time", _period_halved, "figure", "busiest device"),
    ("tessel", "group", _scaled("repetend", "group", lambda v, d: v + 1), "repetend", "keys"),
    ("tessel", "copies", _scaled("repetend", "copies", lambda v, d: v + 1), "figure", "repetend.copies"),
    ("tessel", "window", _scaled("repetend", "window_s", lambda v, d: [v[0] * 1.5 + 1, v[1]]), "figure",
     "repetend.window_s[0]"),
    ("tessel", "busy bound", _scaled(STATS, "period_lower_bound_ticks", lambda v, d: v + 1), "figure",
     "period_lower_bound_ticks"),
    ("tessel", "memory bound above the period",
     _scaled(STATS, "period_memory_bound_ticks", lambda v, d: d["solver"]["stats"]["period_ticks"]),
     "figure", "period_memory_bound_ticks"),
    ("tessel", "period in ticks", _scaled(STATS, "period_ticks", lambda v, d: v + 1), "figure", "stats.period_ticks"),
    ("tessel", "group in stats", _scaled(STATS, "group", lambda v, d: v + 1), "figure", "stats.group"),
    ("tessel", "micro-batches in flight", _scaled(STATS, "microbatches_in_flight", lambda v, d: v + 1), "figure",
     "microbatches_in_flight"),
    ("tessel", "baseline below the lower bound", _scaled(f"{STATS}.best_baseline", "zb-v", lambda v, d: v * 0.9),
     "figure", "lower bound"),
    ("irregular", "baseline shorter than the plan", _baseline_shorter, "figure", "keeps the shortest"),
    ("tessel", "grouped makespan", _scaled(f"{STATS}.grouped", "makespan_s", lambda v, d: v * 1.5 + 1), "figure",
     "longer than its repetend unrolled"),
    ("tessel", "unrolled candidate", _scaled(f"{STATS}.completion_candidates_s", "unrolled",
                                             lambda v, d: v * 1.5 + 1), "figure", "completion_candidates_s.unrolled"),
    ("tessel", "candidate below the lower bound", _scaled(f"{STATS}.completion_candidates_s", "time/None",
                                                          lambda v, d: v * 0.5), "figure", "lower bound"),
    ("tessel", "schedule name", lambda d: d.update(schedule_name=d["schedule_name"] + "x"), "schedule_name",
     "'tessel'"),
    ("unrolled", "lag of an unrolled schedule", _scaled("repetend.lag", "B0@0", lambda v, d: v + 1), "repetend",
     "unrolled repetend"),
    ("skipped", "the baseline it returns", _baseline_returned, "figure", "stats.best_baseline."),
    ("baseline", "lower bound raised to the makespan",
     _scaled("predicted", "lower_bound_s", lambda v, d: d["makespan_s"]), "figure", "lower_bound_s"),
    ("baseline", "schedule name of another solver", lambda d: d.update(schedule_name="tessel"), "schedule_name",
     "'1f1b'"),
    ("exact", "proven bound", _scaled("predicted", "proven_bound_s", lambda v, d: v * 1.5 + 1), "figure",
     "proven_bound_s"),
    ("exact", "bound in stats", _scaled(STATS, "bound_s", lambda v, d: v * 0.9), "figure", "stats.bound_s"),
]


@pytest.mark.parametrize("name,tamper,code,words", [pytest.param(n, t, c, w, id=f"{n}: {what}")
                                                     for n, what, t, c, w in TAMPERS])
def test_check_recomputes_the_repetend_and_the_solver_figures(solved_docs: dict[str, dict], name: str, tamper: Any,
                                                               code: str, words: str) -> None:
    """Each tampered field of a plan fails check with the expected code and a message naming it."""
    import copy

    assert _violations(solved_docs[name]) == []  # untampered, it passes
    doc = copy.deepcopy(solved_docs[name])
    tamper(doc)
    found = _violations(doc)
    assert any(v.code == code and words in v.message for v in found), [(v.code, v.message) for v in found]
