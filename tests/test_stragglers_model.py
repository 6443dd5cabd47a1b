"""The stragglers kind: speedup functions and order statistics against the worked numbers of the research
note, hand-computed flowtimes on a three-job example, the CSV trace reader, determinism, and check."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.models.plan import plan_from_document
from gpuplan.models.stragglers import StragglersPlan, StragglersProblem, schedule_violations
from gpuplan.models.stragglers.speedup import (Variability, dolly_copies, job_straggler_probability,
                                              pareto_job_time, pareto_machine_time)
from gpuplan.models.stragglers.trace import read_trace

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "stragglers"


# ---------------------------------------------------------------- speedup functions (beyond.md 4.1, 4.3, 4.4)

def test_pareto_speedup_worked_numbers() -> None:
    v = Variability("pareto", alpha=1.5)
    assert [round(v.h(r), 2) for r in (1, 2, 3, 4, 8)] == [1.0, 2.0, 2.33, 2.5, 2.75]
    assert v.h_limit() == pytest.approx(3.0)
    assert Variability("pareto", alpha=4.0).h(3) == pytest.approx((12 - 1) / (3 * 3))


def test_uniform_speedup_formula_and_monte_carlo() -> None:
    v = Variability("uniform", a=0.5)
    assert [v.h(r) for r in (1, 2, 3)] == pytest.approx([1.0, 0.5 + 1.0 * 2 / 3, 0.5 + 1.0 * 3 / 4])
    g = np.random.default_rng(3)
    speeds = v.speeds(g, 3 * 200_000).reshape(-1, 3)
    assert speeds.max(axis=1).mean() == pytest.approx(v.h(3), rel=5e-3)  # E[max of 3 speeds] / E[S]
    assert (1 / speeds[:, :2].max(axis=1)).mean() == pytest.approx(v.mean_min_factor(2), rel=5e-3)


def test_pareto_sampling_matches_h() -> None:
    v = Variability("pareto", alpha=2.0)
    x = 1 / v.speeds(np.random.default_rng(1), 2 * 400_000).reshape(-1, 2)
    assert x[:, 0].mean() == pytest.approx(1.0, rel=0.02)  # nominal size is the mean duration
    assert x[:, 0].mean() / x.min(axis=1).mean() == pytest.approx(v.h(2), rel=0.02)


def test_job_time_worked_numbers() -> None:
    assert [round(pareto_job_time(10, r, 1.5), 2) for r in (1, 2, 3)] == pytest.approx([12.57, 2.95, 2.00], abs=0.01)
    assert [round(pareto_job_time(100, r, 1.5), 1) for r in (1, 2, 3)] == [57.8, 6.3, 3.3]
    assert [round(pareto_machine_time(r, 1.5), 2) for r in (1, 2, 3)] == [3.0, 3.0, 3.86]
    v = Variability("pareto", alpha=1.5)
    assert v.job_time(10, 2) == pytest.approx(pareto_job_time(10, 2, 1.5, v.x_m))


def test_uniform_job_time_by_sampling() -> None:
    v = Variability("uniform", a=0.6)
    g = np.random.default_rng(5)
    s = v.speeds(g, 100_000 * 4 * 2).reshape(100_000, 4, 2)
    assert (1 / s.max(axis=2)).max(axis=1).mean() == pytest.approx(v.job_time(4, 2), rel=3e-3)


def test_dolly_straggler_probabilities() -> None:
    assert [round(100 * job_straggler_probability(0.05, c, 10), 2) for c in (1, 2, 3)] == [40.13, 2.47, 0.12]
    assert dolly_copies(0.05, 10, 0.05, 3) == 2
    assert dolly_copies(0.05, 10, 0.002, 3) == 3


# ---------------------------------------------------------------- hand-computed flowtimes

def _hand_problem() -> StragglersProblem:
    """Three jobs on two slots; every copy runs at speed 1 (uniform spread 0), so times are the sizes."""
    return StragglersProblem(slots=2, variability={"model": "uniform", "a": 0.0}, jobs=[
        {"id": "a", "arrival_s": 0.0, "weight": 1, "map_s": [2.0, 2.0], "reduce_s": [1.0]},
        {"id": "b", "arrival_s": 0.5, "weight": 2, "map_s": [1.0]},
        {"id": "c", "arrival_s": 1.0, "weight": 1, "map_s": [3.0], "reduce_s": [1.0]}])


@pytest.mark.parametrize("policy, completion, weighted", [
    # FIFO: a's maps 0-2; at 2 a's reduce and b run 2-3; c's map 3-6, its reduce 6-7
    ("fifo", [3.0, 3.0, 7.0], 3 + 2 * 2.5 + 6),
    # SRPT+R's order without copies: b preempts a's second map at 0.5 (kept 25%), c preempts the first at 1
    # (kept 50%); b ends 1.5; a's first map resumes 1.5-2.5, its second 2.5-4 beside c's map 1-4; reduces 4-5
    ("srpt", [5.0, 1.5, 5.0], 5 + 2 * 1.0 + 4),
    # weighted SRPT, no preemption: like FIFO here (at 2, b (1/2) and a's reduce (1/1) both fit); h = 1, no clones
    ("srptms-c", [3.0, 3.0, 7.0], 3 + 2 * 2.5 + 6),
    # max-min fair time sharing: b ends 1.75, a's maps 3.75, c's map 4.25, a's reduce 4.75, c's 5.25
    ("fair", [4.75, 1.75, 5.25], 4.75 + 2 * 1.25 + 4.25),
])
def test_flowtimes_equal_hand_computed(policy: str, completion: list[float], weighted: float) -> None:
    problem = _hand_problem()
    plan = api.solve(problem, solver=policy)
    assert plan.completion_s == pytest.approx(completion, abs=1e-9)
    assert plan.objective == pytest.approx(weighted, abs=1e-9)
    assert plan.schedule is not None and api.check(problem, plan) == []


# ---------------------------------------------------------------- trace reader

def test_trace_example_reads_and_embeds_jobs() -> None:
    jobs = read_trace(EXAMPLES / "small-trace.csv")
    assert len(jobs) == 24 and all(len(j["map_s"]) >= 1 for j in jobs)
    problem = api.load_problem(EXAMPLES / "small-trace.yaml")
    assert problem.jobs is not None and len(problem.jobs) == 24
    assert "trace" not in problem.document()  # the plan embeds the jobs, so it checks anywhere


@pytest.mark.parametrize("text, fragment", [
    ("job_id,arrival_s,map_tasks\nj,0,2\n", "map_task_s"),
    ("job_id,arrival_s,map_tasks,map_task_s\nj,-1,2,1\n", "row 2 column arrival_s"),
    ("job_id,arrival_s,map_tasks,map_task_s\nj,0,2,1;2;3\n", "one per task"),
    ("job_id,arrival_s,map_tasks,map_task_s\nj,0,2,nan\n", "column map_task_s"),
    ("job_id,arrival_s,map_tasks,map_task_s,colour\nj,0,2,1,red\n", "unknown column"),
    ("job_id,arrival_s,map_tasks,map_task_s\nj,0,99999,1\n", "map_tasks"),
])
def test_bad_trace_names_row_and_column(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_trace(path)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_problem_needs_exactly_one_job_source() -> None:
    with pytest.raises(InputError, match="exactly one"):
        api.load_problem({"kind": "stragglers", "slots": 2})


# ---------------------------------------------------------------- determinism and check

def _doc(plan: StragglersPlan) -> dict:
    d = json.loads(plan.to_json())
    d["solver"]["wall_time_s"] = 0.0
    return d


@pytest.mark.parametrize("policy", ["srptms-c", "mantri", "sda", "fair-r"])
def test_same_seed_same_plan(policy: str) -> None:
    problem = api.load_problem(EXAMPLES / "small-trace.yaml")
    a, b = api.solve(problem, solver=policy, seed=4), api.solve(problem, solver=policy, seed=4)
    assert _doc(a) == _doc(b)
    c = api.solve(problem, solver=policy, seed=5)
    assert c.completion_s != a.completion_s


def _codes(problem: StragglersProblem, doc: dict) -> set[str]:
    plan = plan_from_document(StragglersPlan, doc)
    return {v.code for v in api.check(None, plan)}


def test_check_catches_tampering() -> None:
    problem = api.load_problem(EXAMPLES / "three-jobs.yaml")
    doc = json.loads(api.solve(problem, solver="srptms-c").to_json())
    assert _codes(problem, doc) == set()
    d = copy.deepcopy(doc)
    d["completion_s"][0] *= 0.5
    assert "figure" in _codes(problem, d)
    d = copy.deepcopy(doc)
    d["predicted"]["machine_time_s"] *= 0.5
    assert "figure" in _codes(problem, d)
    d = copy.deepcopy(doc)
    d["params"]["colour"] = 1.0
    assert "params" in _codes(problem, d)  # a parameter the policy does not have
    d = copy.deepcopy(doc)
    d["params"]["eps"] = "a lot"
    assert "params" in _codes(problem, d)
    d = copy.deepcopy(doc)
    d["policy"] = "magic"
    assert _codes(problem, d) == {"policy"}
    d = copy.deepcopy(doc)
    d["sim_seed"] = doc["sim_seed"] + 1
    assert "figure" in _codes(problem, d)


def test_check_simulates_with_the_solvers_options() -> None:
    """solver.options are what the policy ran with: eps changes SRPTMS+C's result on this trace, so check
    re-simulates with the stated options and the plan's params must be what they give."""
    problem = api.load_problem(EXAMPLES / "small-trace.yaml")
    doc = json.loads(api.solve(problem, solver="srptms-c").to_json())
    other = json.loads(api.solve(problem, solver="srptms-c", eps=1.15).to_json())
    assert other["objective"] != doc["objective"] and _codes(problem, other) == set()
    d = copy.deepcopy(doc)
    d["solver"]["options"]["eps"] = 1.15
    assert "params" in _codes(problem, d)
    d = copy.deepcopy(doc)
    d["solver"]["options"]["colour"] = 1.0
    assert "params" in _codes(problem, d)
    # SDA derives tau and d from options left at 0: the plan states the derived values
    sda = json.loads(api.solve(problem, solver="sda").to_json())
    assert sda["solver"]["options"]["tau"] == 0.0 and sda["params"]["tau"] > 0 and _codes(problem, sda) == set()
    d = copy.deepcopy(sda)
    d["solver"]["options"]["tau"] = sda["params"]["tau"] * 1.5 + 1
    assert "params" in _codes(problem, d)


def test_check_catches_a_solver_other_than_the_policy_or_seed() -> None:
    problem = api.load_problem(EXAMPLES / "three-jobs.yaml")
    doc = json.loads(api.solve(problem, solver="srptms-c", seed=3).to_json())
    d = copy.deepcopy(doc)
    d["solver"]["name"] = "sca"
    assert "policy" in _codes(problem, d)
    d = copy.deepcopy(doc)
    d["solver"]["seed"] += 1
    assert "params" in _codes(problem, d)


def test_check_catches_false_lp_figures() -> None:
    """lp_bound_s bounds every policy's weighted flowtime from below and over_lp_bound is flowtime / bound;
    both LP values hold the critical-path floor sum_j w_j (longest map + longest reduce) / h(inf) (3 s here).
    lp_fluid_s is no bound on one run (seeded runs of SRPTMS+C, heSRPT and LAPS+R fall below it), so a
    value above the flowtime is not reported."""
    problem = api.load_problem(EXAMPLES / "three-jobs.yaml")
    doc = json.loads(api.solve(problem).to_json())
    stats, flow = doc["solver"]["stats"], doc["objective"]
    assert stats["lp_bound_s"] <= stats["lp_fluid_s"] < flow and _codes(problem, doc) == set()

    def tampered(**change: object) -> set[str]:
        d = copy.deepcopy(doc)
        d["solver"]["stats"].update(change)
        return _codes(problem, d)

    assert tampered(lp_bound_s=flow * 1.01, over_lp_bound=1 / 1.01) == {"figure"}  # a bound above the plan
    assert tampered(lp_bound_s=stats["lp_bound_s"] * 1.5 + 1) == {"figure"}  # over_lp_bound no longer agrees
    assert tampered(over_lp_bound=stats["over_lp_bound"] * 1.5 + 1) == {"figure"}
    assert tampered(lp_fluid_s=2.0) == {"figure"}  # below the floor
    assert tampered(lp_bound_s="x") == {"figure"}
    assert tampered(lp_fluid_s=flow * 1.5) == set()


def test_schedule_violations_from_the_problem_alone() -> None:
    problem = api.load_problem(EXAMPLES / "three-jobs.yaml")
    plan = api.solve(problem, solver="fifo")
    rows, done = plan.schedule, plan.completion_s
    assert rows is not None and schedule_violations(problem, rows, done) == []
    # a reduce copy moved before its map phase ends
    red = next(i for i, r in enumerate(rows) if r[2] == 1)
    early = [list(r) for r in rows]
    early[red][3] = problem.arrays[0][int(early[red][0])]
    assert "map_before_reduce" in {v.code for v in schedule_violations(problem, early, done)}
    # a third copy running beside two others on a 2-slot cluster
    extra = [list(r) for r in rows] + [[0.0, 0.0, 0.0, 0.0, max(done), 1.0, 0.0]]
    assert "capacity" in {v.code for v in schedule_violations(problem, extra, done)}
    # a task finishing twice, and a task never finishing
    twice = [list(r) for r in rows] + [list(rows[0])]
    assert "two_winners" in {v.code for v in schedule_violations(problem, twice, done)}
    assert "unfinished_task" in {v.code for v in schedule_violations(problem, rows[1:], done)}
