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
from gpuplan.models.stragglers.speedup import Variability, sda_expectations
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


def test_ps_crossover_load() -> None:
    """The previous threshold (kept for comparison): where E[T(m, 1)] / (1 - rho) = E[T(m, 2)] / (1 - c rho),
    c = 2 / h(2), capped at stability."""
    assert T.ps_crossover_load(Variability("pareto", alpha=1.5)) == pytest.approx(1.0)  # c = 1: clone until saturation
    assert T.ps_crossover_load(Variability("pareto", alpha=2.0)) == pytest.approx(0.5)  # g = 1.5, c = 4/3
    assert T.ps_crossover_load(Variability("pareto", alpha=1.2)) == pytest.approx(Variability("pareto", 1.2).h(2) / 2)
    for var in (Variability("pareto", alpha=2.0), Variability("uniform", a=0.5), Variability("pareto", alpha=1.7)):
        for m in (1, 3, 10):
            rho = T.ps_crossover_load(var, m)
            assert 0 < rho < 1
            c = 2 / var.h(2)
            def flow(r: int, load: float) -> float:
                return var.job_time(m, r) / (1 - (c if r == 2 else 1.0) * load)
            assert flow(2, rho) == pytest.approx(flow(1, rho), rel=1e-9)
            assert flow(2, 0.9 * rho) < flow(1, 0.9 * rho) and flow(2, min(0.99 / c, 1.1 * rho)) > flow(1, min(0.99 / c, 1.1 * rho))


def test_threshold_is_where_sca_capacity_binds() -> None:
    """rho* = h(r*) / r*: the load at which the cloned cluster's offered load rho r* E[min_r*] / E[X] reaches
    the slots, r* SCA's unconstrained utility maximiser for the median job (checked by enumeration)."""
    for var in (Variability("pareto", alpha=1.2), Variability("pareto", alpha=1.5), Variability("pareto", alpha=2.0),
                Variability("uniform", a=0.5), Variability("pareto", alpha=3.0)):
        for m in (1, 2, 5, 20):
            util = {r: -var.job_time(m, r) - 0.1 * m * r * var.mean_min_factor(r) for r in range(1, 5)}
            r_star = max(util, key=lambda r: (util[r], -r))
            assert T.sca_copies(var, m, 0.1, 4) == r_star
            rho = T.threshold_load(var, m, 0.1, 4)
            if r_star == 1:
                assert rho == 0.0
                continue
            # at rho* the cloned offered load is exactly the capacity: rho r* E[min_r*] = E[X]
            assert rho * r_star * var.mean_min_factor(r_star) == pytest.approx(var.mean_factor(), rel=1e-9)
    assert T.threshold_load(Variability("pareto", alpha=1.5), 1) == pytest.approx(7 / 9)  # r* = 3, h(3) = 7/3
    assert T.threshold_load(Variability("pareto", alpha=1.2), 1) > 1  # heavy tails: always the light regime


def test_sca_resolves_at_departures_by_marginal_utility() -> None:
    """SCA re-solves its program when a job leaves (the default): the freed slots go to the running job whose
    remaining tasks gain the most utility per extra slot from one more copy each; resolve 0 leaves them idle."""
    jobs = [{"id": "a", "arrival_s": 0, "map_s": [5.0, 5.0]}, {"id": "c", "arrival_s": 0, "map_s": [0.01]}]
    var = {"model": "pareto", "alpha": 1.5}
    on = api.solve(_problem(4, jobs, variability=var), solver="sca")
    off = api.solve(_problem(4, jobs, variability=var), solver="sca", resolve=0)
    assert on.params["resolve"] == 1
    for plan in (on, off):  # a starts on 2 x 2 copies; c's arrival takes one of a's clones back
        assert _copies_at(plan, 0.0)[(1, 0)] == 1 and sum(v for (j, _), v in _copies_at(plan, 0.0).items() if j == 0) == 3
    c_end = max(r[4] for r in on.schedule if r[0] == 1)
    assert [r for r in on.schedule if r[0] == 0 and r[3] == pytest.approx(c_end)], "c's slot goes back to a's task"
    assert not [r for r in off.schedule if r[0] == 0 and r[3] > 0]
    assert api.check(None, on) == [] and api.check(None, off) == []


def test_threshold_switches_at_rho_star() -> None:
    jobs = {"jobs": 50, "seed": 2}
    var = {"model": "pareto", "alpha": 2.0}
    light, _ = simulate_problem(StragglersProblem(slots=10, variability=var, workload={**jobs, "load": 0.3}), "threshold", {}, 0)
    heavy, _ = simulate_problem(StragglersProblem(slots=10, variability=var, workload={**jobs, "load": 0.85}), "threshold", {}, 0)
    assert light.params["regime"] == "sca" and heavy.params["regime"] == "ese"
    assert 0.3 < light.params["rho_star"] < 0.85


def test_sda_expectations_match_sampling() -> None:
    """The order-statistics E[T_job] and machine time of SDA against 200,000 sampled jobs."""
    g = np.random.default_rng(7)
    for var, tau_f, d, m in ((Variability("pareto", 1.5), 2.0, 2, 5), (Variability("uniform", a=0.5), 1.5, 1, 3)):
        tau = tau_f * var.floor()
        n = 200_000
        x = 1 / var.speeds(g, n * m).reshape(n, m)
        y = (1 / var.speeds(g, n * m * d)).reshape(n, m, d).min(axis=2)
        late = x > tau
        t = np.where(late, tau + np.minimum(x - tau, y), x)
        machine = np.where(late, tau + (1 + d) * (t - tau), x)
        job_e, machine_e = sda_expectations(var, m, tau, d)
        assert job_e == pytest.approx(float(t.max(axis=1).mean()), rel=0.02)
        assert machine_e == pytest.approx(float(machine.mean()), rel=0.02)
    var = Variability("pareto", 1.5)  # d = 0 or tau = 0: plain one copy / r = d + 1 clones up front
    assert sda_expectations(var, 10, 5.0, 0)[0] == pytest.approx(var.job_time(10, 1), rel=1e-3)
    assert sda_expectations(var, 10, 0.0, 1)[0] == pytest.approx(var.job_time(10, 2), rel=1e-3)


def test_sda_choice_is_the_best_candidate() -> None:
    for var in (Variability("pareto", 1.5), Variability("pareto", 2.0), Variability("uniform", a=0.5)):
        for m in (1, 4):
            tau_f, d = T.sda_choice(var, m, 0.1)
            vals = {(t, k): sda_expectations(var, m, t * var.floor(), k) for t in T.SDA_TAUS for k in T.SDA_COPIES}
            best = min(j + 0.1 * m * mt for j, mt in vals.values())
            j, mt = vals[(tau_f, d)]
            assert j + 0.1 * m * mt == pytest.approx(best)
            tau_f, d = T.sda_choice(var, m, 0.1, target=0.8)
            base = var.job_time(m, 1)
            ok = [mt for j, mt in vals.values() if j <= 0.8 * base]
            if ok:
                assert vals[(tau_f, d)][0] <= 0.8 * base + 1e-9 and vals[(tau_f, d)][1] == pytest.approx(min(ok))


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
