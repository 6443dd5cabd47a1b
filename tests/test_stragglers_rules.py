"""The policies' published rules, checked on small hand-made cases: SRPT+R's even spread, heSRPT's shares,
Dolly's clone count and budget, LATE's cap of one speculative copy per task, SDA's probe, the threshold,
and Mantri's duplicate test."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from gpuplan import api
from gpuplan.models.stragglers import StragglersProblem, simulate_problem
from gpuplan.models.stragglers.speedup import Variability
from gpuplan.sim import tasks as T


def _problem(slots: int, jobs: list[dict], **kw: object) -> StragglersProblem:
    return StragglersProblem(slots=slots, jobs=jobs, record_schedule="always", **kw)


def _copies_at(plan, time_s: float) -> Counter:
    """Return (job, task) -> copies running just after `time_s`."""
    return Counter((int(r[0]), int(r[1])) for r in plan.schedule if r[3] <= time_s + 1e-12 < r[4])


def test_srpt_r_spreads_machines_evenly_smallest_first() -> None:
    # two one-task jobs on 5 slots: floor(5/2) = 2 copies each, the leftover to the smaller job
    plan = api.solve(_problem(5, [{"id": "big", "arrival_s": 0, "map_s": [4.0]},
                                  {"id": "small", "arrival_s": 0, "map_s": [1.0]}]), solver="srpt-r")
    got = _copies_at(plan, 0.0)
    assert got[(1, 0)] == 3 and got[(0, 0)] == 2
    # no redundancy without the +R
    plan = api.solve(_problem(5, [{"id": "a", "arrival_s": 0, "map_s": [4.0]}]), solver="srpt")
    assert _copies_at(plan, 0.0)[(0, 0)] == 1


def test_hesrpt_shares_follow_the_closed_form() -> None:
    var = Variability("pareto", alpha=1.5)
    ctx = T.Context(var, 10, 0.5, 0.25, 1)
    pol = T.HeSRPT(ctx, p=0.5)
    shares = pol.shares(SimpleNamespace(N=10), [object()] * 4)  # type: ignore[arg-type]
    c = 1 / (1 - 0.5)
    want = [10 * ((i / 4) ** c - ((i - 1) / 4) ** c) for i in range(1, 5)]
    assert shares == pytest.approx(want) and sum(shares) == pytest.approx(10)
    assert shares[-1] > shares[0]  # the smallest job (last) gets the most
    assert 0.05 <= T.hesrpt_exponent(var, 16) <= 0.95


def test_dolly_clones_small_jobs_within_its_budget() -> None:
    ten = [{"id": "j", "arrival_s": 0, "map_s": [1.0] * 10}]
    # 1 - (1 - 0.05^c)^10 <= 5% first at c = 2; a 5% budget of 200 slots holds the 10 extra copies
    plan = api.solve(_problem(200, ten), solver="dolly")
    assert sorted(_copies_at(plan, 0.0).values()) == [2] * 10
    # 40 slots: a budget of 2 extra copies
    plan = api.solve(_problem(40, ten), solver="dolly")
    assert sum(_copies_at(plan, 0.0).values()) == 12
    # a job of more than 10 tasks is not small: no clones
    plan = api.solve(_problem(200, [{"id": "j", "arrival_s": 0, "map_s": [1.0] * 11}]), solver="dolly")
    assert max(_copies_at(plan, 0.0).values()) == 1


def test_late_speculates_once_per_task_and_within_its_cap() -> None:
    jobs = [{"id": f"j{i}", "arrival_s": 0.1 * i, "map_s": [1.0] * 3} for i in range(6)]
    for seed in range(5):
        plan = api.solve(_problem(20, jobs, variability={"model": "pareto", "alpha": 1.3}), solver="late", seed=seed)
        per_task = Counter((int(r[0]), int(r[1])) for r in plan.schedule)
        assert max(per_task.values()) <= 2  # the first copy and at most one speculative copy
        times = sorted({r[3] for r in plan.schedule})
        for t in times:
            running = _copies_at(plan, t)
            assert sum(n - 1 for n in running.values()) <= max(1, int(0.1 * 20))


def test_sda_duplicates_only_after_tau() -> None:
    problem = _problem(10, [{"id": "j", "arrival_s": 0, "map_s": [1.0, 1.0]}], variability={"model": "pareto", "alpha": 1.5})
    plan = api.solve(problem, solver="sda", tau=2.0, d=1)
    tau_s = 2.0 * Variability("pareto", 1.5).floor() * 1.0
    later = [r for r in plan.schedule if r[3] > 0]
    assert all(r[3] == pytest.approx(tau_s) for r in later)


def test_threshold_switches_at_rho_star() -> None:
    var = Variability("pareto", alpha=1.5)
    assert T.threshold_load(var) == pytest.approx(0.8 * var.h(2) / 2)
    jobs = {"jobs": 50, "seed": 2}
    light, _ = simulate_problem(StragglersProblem(slots=10, workload={**jobs, "load": 0.5}), "threshold", {}, 0)
    heavy, _ = simulate_problem(StragglersProblem(slots=10, workload={**jobs, "load": 0.85}), "threshold", {}, 0)
    assert light.params["regime"] == "sca" and heavy.params["regime"] == "ese"


def test_mantri_duplicate_test_is_its_resource_rule() -> None:
    """P(t_rem > t_new (c+1)/c) > delta, for a copy whose remaining time is known exactly."""
    var = Variability("uniform", a=0.5)
    wl = T.Workload(np.zeros(1), np.ones(1), [np.array([2.0])], [np.zeros(0)])
    sim = T.Sim(wl, 4, var, T.FIFO(T.Context(var, 4, 0.5, 0.25, 1)), 0, False, 0.25, "progress")
    job = T._Job(0, 0.0, 1.0, wl.map_s[0], wl.reduce_s[0])
    task = job.maps[0]
    c = sim.start_copy(task)
    c.speed = 0.5  # remaining time 4 s at t = 0
    ok, t_rem = T.mantri_duplicate_ok(sim, var, task, 0.25)
    assert t_rem == pytest.approx(4.0)
    # one copy: a fresh copy beats it when t_new * 2 < 4, i.e. X < 1 on a 2 s task: P = var.cdf(1.0) = 0.5
    assert ok == (var.cdf(4.0 * 1 / (2 * 2.0)) > 0.25) and var.cdf(1.0) == pytest.approx(0.5)
