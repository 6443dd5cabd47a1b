"""Gavel's formats read into gpuplan's OEF trace, the Gavel-style job generator, and the
`gpuplan simulate oef --gavel-trace` command."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuplan.errors import InputError
from gpuplan.models.gavel_trace import (GAVEL_JOB_TABLE, generate_jobs, load_gavel, read_gavel_throughputs,
                                        read_gavel_trace, to_trace)
from gpuplan.models.oef_trace import load_trace
from gpuplan.solvers.oef.sim import simulate

GAVEL = Path(__file__).resolve().parents[1] / "examples" / "oef" / "gavel"
TRACE = GAVEL / "physical_max_min_fairness.trace"
STATIC = GAVEL / "physical_minimize_makespan.trace"
TPUT = GAVEL / "simulation_throughputs_isolated.json"
PHYSICAL = {"v100": 8, "p100": 16, "k80": 24}


def test_gavel_trace_equals_the_same_trace_written_in_gpuplan_format(tmp_path: Path) -> None:
    trace = load_gavel(TRACE, TPUT, PHYSICAL)
    assert len(trace.jobs) == 96 and trace.cluster.capacity() == {"V100": 8, "P100": 16, "K80": 24}
    written = tmp_path / "t.yaml"
    written.write_text(yaml.safe_dump(trace.model_dump(mode="json", exclude_none=True), sort_keys=False))
    again = load_trace(written)
    assert again.model_dump() == trace.model_dump()
    # the first line of Gavel's file: ResNet-18 (batch size 128), 925982 steps on 4 GPUs at t = 0
    first = trace.jobs[0]
    assert (first.type, first.steps, first.gpus, first.arrival_s) == ("ResNet-18 (batch size 128)", 925982, 4, 0)
    # measured multi-GPU throughput, not a scaling factor (Gavel's table: 69.95 steps/s on 4 V100s)
    assert trace.throughput(first)["V100"] == pytest.approx(69.9505, rel=1e-4)
    small = trace.model_copy(update={"jobs": trace.jobs[:12]})
    small_again = again.model_copy(update={"jobs": again.jobs[:12]})
    assert simulate(small, "oef", mechanism="gavel").jct_s == simulate(small_again, "oef", mechanism="gavel").jct_s


def test_static_trace_all_at_zero() -> None:
    trace = load_gavel(STATIC, TPUT, PHYSICAL)
    assert len(trace.jobs) == 100 and {j.arrival_s for j in trace.jobs} == {0.0}


def test_bad_gavel_files_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_text("ResNet-18 (batch size 128)\tcmd\tdir\t--num_steps\t1\t100\t1\n")
    with pytest.raises(InputError) as info:
        read_gavel_trace(bad)
    assert str(bad) in str(info.value) and "line 1" in str(info.value) and "10 tab-separated" in str(info.value)
    unknown = tmp_path / "unknown.trace"
    unknown.write_text("NoSuchModel\tcmd\tdir\t--n\t1\t100\t1\t1\t-1\t0\n")
    with pytest.raises(InputError) as info:
        load_gavel(unknown, TPUT, PHYSICAL)
    assert "NoSuchModel" in str(info.value) and str(unknown) in str(info.value)
    tput = tmp_path / "t.json"
    tput.write_text('{"v100": {"(\'A\', 1)": {"null": -2}}}')
    with pytest.raises(InputError) as info:
        read_gavel_throughputs(tput)
    assert "null" in str(info.value) and "-2" in str(info.value)
    # a device (or a FIFO) is refused before it is read, and bytes that are not text are named
    for read in (read_gavel_trace, read_gavel_throughputs):
        with pytest.raises(InputError, match="not a regular file"):
            read("/dev/zero")
    bad.write_bytes(b"\xff\xfe\t1\n")
    with pytest.raises(InputError, match=str(bad)):
        read_gavel_trace(bad)


def test_generator_follows_gavels_distributions() -> None:
    table = read_gavel_throughputs(TPUT)
    jobs = generate_jobs(table, 2000, jobs_per_hour=4.0, seed=1)
    share = Counter(j.scale_factor for j in jobs)
    for g, p in {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}.items():
        assert share[g] / len(jobs) == pytest.approx(p, abs=0.03)
    distributed = {m for m, d in GAVEL_JOB_TABLE if d}
    assert all(j.job_type in distributed for j in jobs if j.scale_factor > 1)
    durations = [j.steps / table["v100"][(j.job_type, j.scale_factor)] for j in jobs]
    assert 60 * 10 ** 1.5 - 1 <= min(durations) and max(durations) <= 60 * 10 ** 4
    long = sum(d > 60 * 10 ** 3 for d in durations) / len(jobs)
    assert long == pytest.approx(0.2, abs=0.03)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(jobs, jobs[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(900.0, rel=0.1)           # 4 jobs per hour
    trace = to_trace(jobs[:30], table, PHYSICAL)
    assert len(trace.jobs) == 30
    assert generate_jobs(table, 30, 4.0, seed=1) == jobs[:30]                 # deterministic per seed


def test_cli_replays_a_gavel_trace(tmp_path: Path) -> None:
    from gpuplan.cli import main

    small = tmp_path / "small.trace"
    small.write_text("".join(TRACE.read_text().splitlines(keepends=True)[:10]))
    out = tmp_path / "out.json"
    r = CliRunner().invoke(main, ["simulate", "oef", "-q", "--gavel-trace", str(small), "--gavel-throughputs",
                                  str(TPUT), "--policy", "oef", "--policy", "gavel-maxmin", "--normalisation",
                                  "jobs", "--reference-type", "V100", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "gavel rounds" in r.output and "gavel-maxmin" in r.output
    import json

    figures = json.loads(out.read_text())
    assert [f["policy"] for f in figures] == ["oef", "gavel-maxmin"]
    assert all(len(f["jct_s"]) == 10 for f in figures)
    r = CliRunner().invoke(main, ["simulate", "oef", "--gavel-trace", str(small)])
    assert r.exit_code != 0 and "--gavel-throughputs" in r.output


@pytest.mark.slow
def test_gavel_maxmin_within_5_percent_of_gavels_simulator() -> None:
    """Gavel's own simulator (snapshot c4fa400, run for our research notes): 4.06 h average JCT for
    max_min_fairness_perf on this trace and cluster."""
    trace = load_gavel(TRACE, TPUT, PHYSICAL)
    avg_h = simulate(trace, "gavel-maxmin", mechanism="gavel").figures()["avg_jct_h"]
    assert avg_h == pytest.approx(4.06, rel=0.05)


@pytest.mark.parametrize("policy", ["gavel-maxmin", "maxmin-agnostic"])
def test_tie_break_keeps_the_maxmin_optimum_and_raises_efficiency(policy: str) -> None:
    import numpy as np

    from gpuplan import api
    from gpuplan.models.oef import arrays, efficiency, utilities

    trace = load_gavel(TRACE, TPUT, PHYSICAL)
    jobs = trace.jobs[:12]
    tenants = [{"name": j.name, "jobs": [{"name": "j", "gpus": j.gpus,
                                         "throughput": {t: x for t, x in trace.throughput(j).items() if x > 0}}]}
               for j in jobs]
    problem = api.load_problem({"kind": "oef", "cluster": {"gpus": {"V100": 8, "P100": 16, "K80": 24},
                                                          "gpus_per_node": 8}, "tenants": tenants, "rounds": 0})
    a = arrays(problem)

    def floor(X: np.ndarray) -> float:
        if policy == "gavel-maxmin":
            p = (a.V * a.usable) @ a.capacity / a.capacity.sum()
            return float((a.gpus * utilities(a, X) / (a.weight * p)).min())
        return float((a.gpus * X.sum(axis=1) / a.weight).min())

    plain = api.solve(problem, solver=policy).matrix()
    tied = api.solve(problem, solver=policy, tie_break="efficiency").matrix()
    assert floor(tied) == pytest.approx(floor(plain), rel=1e-5)
    assert efficiency(a, tied) >= efficiency(a, plain) - 1e-6
    with pytest.raises(InputError, match="tie_break"):
        api.solve(problem, solver=policy, tie_break="nope")


def test_colocation_pairs_read_from_gavels_table() -> None:
    import json

    from gpuplan.models.oef_trace import pair_throughput

    path = GAVEL / "simulation_throughputs_colocated.json"
    trace = load_gavel(STATIC, path, PHYSICAL, space_sharing=True)
    single = [j for j in trace.jobs if j.gpus == 1]
    a, b = single[0], next(j for j in single if j.type != single[0].type)
    raw = json.loads(path.read_text())["k80"][f"('{a.type}', 1)"][f"('{b.type}', 1)"]
    assert pair_throughput(trace, a, b, "K80") == pytest.approx(tuple(raw))
    multi = [j for j in trace.jobs if j.gpus > 1]
    assert pair_throughput(trace, multi[0], multi[0], "V100") is None          # only 1-GPU pairs shipped
    assert load_gavel(STATIC, path, PHYSICAL).colocated == {}                   # off unless asked
