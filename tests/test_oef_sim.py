"""OEF trace simulator and trace files: sanity bounds, determinism, the shipped trace, bad traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.oef_trace import Trace, load_trace
from gpuplan.solvers.oef_sim import simulate

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
