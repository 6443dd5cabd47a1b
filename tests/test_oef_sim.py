"""OEF trace simulator and trace files: sanity bounds, determinism, the shipped trace, bad traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.oef_trace import Trace, load_trace
from gpuplan.solvers.oef.sim import simulate

TRACE = Path(__file__).resolve().parents[1] / "examples" / "oef" / "trace-100.yaml"


def small_trace(n: int = 14) -> Trace:
    doc = load_trace(TRACE).model_dump(mode="json", exclude_none=True)
    doc["jobs"] = doc["jobs"][:n]
    return validate(Trace, doc)


@pytest.mark.parametrize("policy", ["oef", "gavel-maxmin"])
def test_simulation_bounds(policy: str) -> None:
    trace = small_trace()
    res = simulate(trace, policy)
    assert set(res.jct_s) == {j.name for j in trace.jobs}
    for j in trace.jobs:
        fastest = max(trace.throughput(j).values())
        assert res.jct_s[j.name] >= j.steps / fastest - 1e-6        # no job beats running alone
    assert 0 < res.utilisation <= 1
    last = max(j.arrival_s + res.jct_s[j.name] for j in trace.jobs)
    assert res.makespan_s == pytest.approx(last - min(j.arrival_s for j in trace.jobs))
    assert simulate(trace, policy).jct_s == res.jct_s                 # deterministic


def test_shipped_trace_has_about_100_jobs_of_several_types() -> None:
    trace = load_trace(TRACE)
    assert 90 <= len(trace.jobs) <= 110
    assert len({j.type for j in trace.jobs}) >= 6 and len(trace.cluster.capacity()) >= 4


def test_oef_beats_gavel_maxmin_jct_on_shipped_trace() -> None:
    trace = load_trace(TRACE)
    oef = simulate(trace, "oef").figures()["avg_jct_h"]
    gavel = simulate(trace, "gavel-maxmin").figures()["avg_jct_h"]
    assert oef < gavel


def test_bad_trace_names_field(tmp_path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("cluster: {gpus: {V100: 2}}\njob_types: {a: {V100: 1}}\n"
                   "jobs: [{name: x, type: b, steps: 10}]\n")
    with pytest.raises(InputError) as info:
        load_trace(bad)
    assert str(bad) in str(info.value) and "jobs[0].type" in str(info.value)


def three_jobs(work_conserving: bool) -> dict[str, float]:
    """Hand-computed schedule (Gavel's rounds, equal-share policy, 3 V100s, rounds of 100 s, 1 step/s):
    A (300 steps) and B (500) arrive at t = 10 and hold one V100 each (equal share: a whole GPU each);
    the re-allocation at t = 10 is the last before t = 1010 (resolve_every_s = 1000). C (200 steps)
    arrives at 150, joins at the round boundary 210 without a share. Work-conserving: C fills the
    idle third V100 in rounds 210-310 and 310-410 (JCT 260). Not work-conserving: C waits, A ends at
    310, B at 510, empty rounds to 1010, the re-allocation gives C the cluster: 1010-1210 (JCT 1060)."""
    doc = {"cluster": {"gpus": {"V100": 3}, "gpus_per_node": 1}, "round_s": 100,
           "job_types": {"x": {"V100": 1.0}},
           "jobs": [{"name": "A", "type": "x", "steps": 300, "arrival_s": 10},
                    {"name": "B", "type": "x", "steps": 500, "arrival_s": 10},
                    {"name": "C", "type": "x", "steps": 200, "arrival_s": 150}]}
    res = simulate(validate(Trace, doc), "equal-share", mechanism="gavel", resolve_every_s=1000,
                   work_conserving=work_conserving)
    return res.jct_s


def test_work_conserving_schedule_by_hand() -> None:
    assert three_jobs(True) == pytest.approx({"A": 300.0, "B": 500.0, "C": 260.0})
    assert three_jobs(False) == pytest.approx({"A": 300.0, "B": 500.0, "C": 1060.0})


def test_gavel_rounds_leave_no_usable_gpu_idle() -> None:
    from gpuplan.models.gavel_trace import load_gavel

    gavel = Path(__file__).resolve().parents[1] / "examples" / "oef" / "gavel"
    trace = load_gavel(gavel / "physical_max_min_fairness.trace", gavel / "simulation_throughputs_isolated.json",
                       {"v100": 8, "p100": 16, "k80": 24})
    trace = trace.model_copy(update={"jobs": trace.jobs[:40]})
    assert simulate(trace, "gavel-maxmin", mechanism="gavel").idle_fit_rounds == 0
    assert simulate(trace, "gavel-maxmin", mechanism="gavel", work_conserving=False).idle_fit_rounds > 0


def test_gavel_round_ends_when_its_last_job_does() -> None:
    doc = {"cluster": {"gpus": {"V100": 1}, "gpus_per_node": 1}, "round_s": 100,
           "job_types": {"x": {"V100": 2.0}}, "jobs": [{"name": "A", "type": "x", "steps": 300}]}
    res = simulate(validate(Trace, doc), "oef", mechanism="gavel")
    assert res.jct_s == {"A": pytest.approx(150.0)} and res.rounds == 2        # 0-100, 100-150
    assert res.utilisation == pytest.approx(1.0)


@pytest.mark.parametrize("normalisation", ["slowest", "best", "reference", "jobs"])
def test_si_and_ef_hold_in_every_allocation(normalisation: str) -> None:
    from gpuplan.models.gavel_trace import load_gavel

    gavel = Path(__file__).resolve().parents[1] / "examples" / "oef" / "gavel"
    trace = load_gavel(gavel / "physical_max_min_fairness.trace", gavel / "simulation_throughputs_isolated.json",
                       {"v100": 8, "p100": 16, "k80": 24}, normalisation=normalisation, reference_type="V100")
    trace = trace.model_copy(update={"jobs": trace.jobs[:30]})
    for policy, envy_free in (("oef", True), ("oef-si", False)):
        res = simulate(trace, policy, mechanism="gavel", resolve_every_s=0)
        assert res.reallocations >= 20                      # arrivals and finishes batched per round
        assert res.min_si_ratio >= 1 - 1e-6
        if envy_free:
            assert res.envy_allocations == 0 and res.max_envy == 0.0
    maxmin = simulate(trace, "gavel-maxmin", mechanism="gavel", resolve_every_s=0)
    assert maxmin.envy_allocations > 0                       # the check can fail: Gavel's max-min envies


def test_mechanism_is_checked() -> None:
    with pytest.raises(ValueError, match="mechanism"):
        simulate(small_trace(3), "oef", mechanism="nope")


def test_space_sharing_by_hand() -> None:
    """One V100, equal-share policy, rounds of 360 s. A (70 steps) and B (60 steps) run 1 step/s
    alone and 0.8 step/s each when sharing the GPU (own/isolated sum 1.6 > 1, so they pack).
    Shared: A ends at 70/0.8 = 87.5 s, B at 60/0.8 = 75 s. Alone: A runs first (equal priority,
    trace order) and ends at 70 s, the round ends with it, then B: 70 + 60 = 130 s."""
    doc = {"cluster": {"gpus": {"V100": 1}, "gpus_per_node": 1}, "round_s": 360,
           "job_types": {"a": {"V100": 1.0}, "b": {"V100": 1.0}},
           "colocated": {"a": {"b": {1: {"V100": [0.8, 0.8]}}}, "b": {"a": {1: {"V100": [0.8, 0.8]}}}},
           "jobs": [{"name": "A", "type": "a", "steps": 70}, {"name": "B", "type": "b", "steps": 60}]}
    trace = validate(Trace, doc)
    shared = simulate(trace, "equal-share", mechanism="gavel", space_sharing=True)
    assert shared.jct_s == pytest.approx({"A": 87.5, "B": 75.0})
    assert shared.utilisation == pytest.approx(1.0)
    alone = simulate(trace, "equal-share", mechanism="gavel")
    assert alone.jct_s == pytest.approx({"A": 70.0, "B": 130.0})
    doc["colocated"] = {"a": {"b": {1: {"V100": [0.4, 0.5]}}}, "b": {"a": {1: {"V100": [0.5, 0.4]}}}}
    worse = simulate(validate(Trace, doc), "equal-share", mechanism="gavel", space_sharing=True)
    assert worse.jct_s == pytest.approx({"A": 70.0, "B": 130.0})      # 0.9 < 1: packing refused
