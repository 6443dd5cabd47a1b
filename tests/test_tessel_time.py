"""Tessel under a time limit: the wall-clock guard holds the limit and returns the best plan in hand
(status time_limit), CP-SAT budgets follow the limit, the period search starts at bounds proven without
a solver call, and a search that cannot beat the best baseline is not run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuplan import api
from gpuplan.models.tessel import TesselProblem, check
from gpuplan.registry import no_progress
from gpuplan.solvers import tessel as solvers


def problem(shape: str, p: int, m: int, *, f: float = 1.0, b: float = 1.0, w: float = 1.0, chunks: int = 2,
            memory: float | None = None) -> TesselProblem:
    doc: dict[str, object] = {"kind": "tessel", "microbatches": m,
                              "shape": {"name": shape, "devices": p, "forward_s": f, "backward_s": b,
                                        "backward_weight_s": w, "tp_s": 1.0, "chunks": chunks}}
    if memory is not None:
        doc["memory_limit_bytes"] = memory
    return api.load_problem(doc)  # type: ignore[return-value]


SLACK_S = 2.0  # the machine is shared, and the suite runs a test file per core (xdist): one step that started in time may run long under load


def test_a_long_run_without_a_baseline_stops_at_the_limit_with_the_unrolled_repetend() -> None:
    # no baseline applies to the tensor+pipeline mix; its full completion of 1024 micro-batches takes ~10 s
    prob = problem("tp_pp", 4, 1024, memory=8)
    plan = api.solve(prob, solver="tessel", time_limit_s=2.0)
    assert plan.status.value == "time_limit" and "time limit" in plan.message
    assert plan.solver.wall_time_s <= 2.0 * 1.1 + SLACK_S
    stats = plan.solver.stats
    assert stats["search_s"] <= 2.0 + SLACK_S and stats["time_limit_cut"]
    assert stats["schedule_from"] == "repetend" and "unrolled" in stats["completion_candidates_s"]
    assert not check(prob, plan)


def test_a_long_run_with_baselines_returns_the_floor_at_the_limit() -> None:
    prob = problem("1f1b", 4, 2048, memory=8)
    plan = api.solve(prob, solver="tessel", time_limit_s=0.5)  # less than the baselines of 2048 micro-batches
    assert plan.solver.wall_time_s <= 0.5 * 1.1 + SLACK_S
    assert plan.status.value in ("time_limit", "optimal")  # optimal only if the cut left a plan at the bound
    stats = plan.solver.stats
    assert stats["time_limit_cut"] and stats["schedule_from"] in solvers.BASELINES
    assert plan.makespan_s == pytest.approx(api.solve(prob, solver=stats["schedule_from"]).makespan_s)
    assert not check(prob, plan)


def spy_cpsat(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Records the keyword arguments of every CP-SAT call Tessel's solver makes."""
    calls: list[dict[str, object]] = []
    real = solvers.solve_cpsat

    def spy(model: object, **kw: object) -> object:
        calls.append(kw)
        return real(model, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(solvers, "solve_cpsat", spy)
    return calls


def test_cpsat_budgets_follow_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_cpsat(monkeypatch)
    prob = problem("interleaved", 3, 12, b=2.0, w=0.0, chunks=3, memory=11)
    limit = 2.0
    plan = solvers.solve_tessel(prob, progress=no_progress, time_limit_s=limit, floor=False)
    assert calls and not check(prob, plan)
    pool = solvers.CPSAT_SHARE * limit * solvers.DET_PER_WALL_S
    for kw in calls:  # deterministic: one worker, no wall clock, at most half the units left
        assert kw.get("time_limit_s") is None and kw.get("workers") == 1
        assert 0 < float(kw["deterministic_limit"]) <= pool / 2  # type: ignore[arg-type]
    assert 0 <= plan.solver.stats["cpsat_units_left"] < pool


def test_the_clock_shares_out_the_deterministic_units() -> None:
    clock = solvers.Clock(time.perf_counter(), 10.0)
    pool = solvers.CPSAT_SHARE * 10.0 * solvers.DET_PER_WALL_S
    assert clock.det_budget(100.0) == pytest.approx(pool / 2) and clock.det_budget(0.1) == pytest.approx(0.1)
    clock.det_spent(pool / 2)
    assert clock.det_budget(100.0) == pytest.approx(pool / 4)
    clock.det_spent(10 * pool)
    assert clock.det_left == 0 and clock.det_budget(1.0) == pytest.approx(0.01)
    assert solvers.Clock(time.perf_counter(), None).det_budget(3.0) == 3.0  # no limit: the default budget


def test_a_limit_that_does_not_cut_keeps_the_plan_deterministic() -> None:
    prob = problem("vshape", 4, 12, memory=6)
    one = api.solve(prob, solver="tessel", seed=3, time_limit_s=60)
    two = api.solve(prob, solver="tessel", seed=3, time_limit_s=60)
    assert not one.solver.stats["time_limit_cut"] and one.status.value != "time_limit"
    assert one.schedule == two.schedule and one.repetend == two.repetend


def test_the_clock_guards_only_under_a_limit() -> None:
    free = solvers.Clock(time.perf_counter() - 100.0, None)
    assert free.allows("anything", 1e9) and not free.cut
    late = solvers.Clock(time.perf_counter() - 1.0, 1.0)  # past GUARD_END of a 1 s limit
    assert not late.allows("probe", 0.0) and late.cut == ["probe"]
    fresh = solvers.Clock(time.perf_counter(), 10.0)
    assert fresh.allows("probe", 1.0) and not fresh.allows("huge", 9.5)
    fresh.timed(time.sleep, 0.05)
    assert fresh.step_s >= 0.05


def test_the_memory_bound_starts_the_period_search_above_the_busy_time() -> None:
    # 2-stage 1F1B, F=1, B=2, room for one activation: device 0 holds it from F0 to B0 (F0+F1+B1 = 4 s)
    # once per period, so P >= 4 > the busy time 3; one micro-batch at a time (P = 6) is the optimum
    prob = problem("1f1b", 2, 4, b=2.0, w=0.0, memory=1)
    t = solvers.integerize(prob)
    assert solvers.memory_period_bound(prob, t) == 4
    pat, stats = solvers.find_repetend(prob, t, time_limit_s=5.0, seed=0, progress=no_progress)
    assert stats["periods_tried"][0] == 4 and stats["period_lower_bound_ticks"] == 3
    assert pat.period == 6 and pat.period >= stats["period_memory_bound_ticks"]


def test_the_memory_bound_never_exceeds_a_found_period() -> None:
    for shape, p, chunks in [("1f1b", 4, 2), ("vshape", 4, 2), ("interleaved", 3, 3), ("tp_pp", 4, 2)]:
        for memory in (None, 2 * p, 3 * p):
            prob = problem(shape, p, 8, chunks=chunks, memory=memory)
            t = solvers.integerize(prob)
            pat, _ = solvers.find_repetend(prob, t, time_limit_s=2.0, seed=0, progress=no_progress)
            assert solvers.memory_period_bound(prob, t) <= pat.period, (shape, p, memory)


def _ilv4() -> TesselProblem:
    """Megatron's interleaved placement, 4 chunks, unsplit backward, at interleaved 1F1B's memory."""
    free = problem("interleaved", 4, 16, b=2.0, w=0.0, chunks=4)
    return problem("interleaved", 4, 16, b=2.0, w=0.0, chunks=4,
                   memory=max(api.solve(free, solver="interleaved-1f1b").peak_memory_bytes))


def test_a_baseline_at_the_lower_bound_skips_the_search_and_keeps_its_repetend() -> None:
    prob = _ilv4()  # interleaved 1F1B meets the lower bound here
    started = time.perf_counter()
    plan = api.solve(prob, solver="tessel")
    assert time.perf_counter() - started < 5  # the period search alone takes 10-20 s on a loaded 2-core machine
    stats = plan.solver.stats
    assert plan.status.value == "optimal" and "search_skipped" in stats
    assert plan.makespan_s == pytest.approx(plan.predicted["lower_bound_s"])
    assert plan.repetend is not None and plan.repetend.period_s == pytest.approx(max(prob.busy_s()))
    assert not check(prob, plan)


@pytest.mark.slow
def test_the_skipped_search_would_not_have_done_better() -> None:
    prob = _ilv4()
    plan = api.solve(prob, solver="tessel")
    unfloored = solvers.solve_tessel(prob, progress=no_progress, floor=False)  # the search alone
    assert unfloored.makespan_s >= plan.makespan_s - 1e-9 and not check(prob, unfloored)


@pytest.mark.slow
def test_the_cli_holds_the_time_limit_in_a_subprocess(tmp_path: Path) -> None:
    doc = {"kind": "tessel", "name": "long", "microbatches": 4096, "memory_limit_bytes": 8,
           "shape": {"name": "tp_pp", "devices": 4, "forward_s": 1.0, "backward_s": 1.0,
                     "backward_weight_s": 1.0, "tp_s": 1.0}}
    src = tmp_path / "long.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "plan.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuplan.cli", "solve", "tessel", str(src), "--time-limit", "5",
                    "-o", str(out)], check=True, capture_output=True, timeout=120)
    elapsed = time.perf_counter() - started
    plan = json.loads(out.read_text())
    assert plan["status"] == "time_limit"
    # the suite runs a test file on every core (pytest-xdist), so another test's work may share the cores
    # with this subprocess and stretch the step that was running at the deadline; the 10 % figure on a
    # quiet machine is the benchmark's (benchmarks/tessel_bench.py), not a timed test's
    assert plan["solver"]["wall_time_s"] <= 5 * 1.1 + 2 * SLACK_S
    assert elapsed <= 5 * 1.1 + 15  # start-up, writing and showing a 4096-micro-batch plan on a shared machine


def test_exact_shares_its_limit_with_the_tessel_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    real_tessel, real_cpsat = solvers.solve_tessel, solvers.schedule_cpsat

    def slow_tessel(problem: TesselProblem, **kw: object) -> object:
        seen["tessel_limit_s"] = kw.get("time_limit_s")
        time.sleep(1.0)  # a hint that takes a second of the limit
        return real_tessel(problem, **kw)  # type: ignore[arg-type]

    def cpsat(*args: object, **kw: object) -> object:  # CP-SAT's wall limit is capped at the deadline
        seen["cpsat_limit_s"] = min(float(kw["time_limit_s"]), float(kw["deadline"]) - time.perf_counter())  # type: ignore[arg-type]
        return real_cpsat(*args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(solvers, "solve_tessel", slow_tessel)
    monkeypatch.setattr(solvers, "schedule_cpsat", cpsat)
    prob = problem("tp_pp", 4, 8, memory=8)
    plan = api.solve(prob, solver="exact", time_limit_s=3.0)
    assert not check(prob, plan)
    assert seen["tessel_limit_s"] == pytest.approx(solvers.EXACT_HINT_SHARE * 3.0)
    assert float(seen["cpsat_limit_s"]) <= 3.0 - 1.0  # type: ignore[arg-type]
    assert plan.solver.wall_time_s <= 3.0 * 1.1 + SLACK_S


@pytest.mark.parametrize("shape,p,chunks,memory", [("1f1b", 4, 2, 4), ("vshape", 4, 2, 8), ("interleaved", 4, 2, 11),
                                                   ("interleaved", 3, 3, None), ("tp_pp", 4, 2, 8)])
def test_a_constructed_pattern_is_a_valid_repetend(shape: str, p: int, chunks: int, memory: float | None) -> None:
    prob = problem(shape, p, 12, chunks=chunks, memory=memory)
    t = solvers.integerize(prob)
    busy = max(sum(t.dur[n] for n in names) for names in solvers._on_device(prob))
    for period in range(busy, sum(t.dur.values()) + 1):
        pat = solvers.modulo_pattern(prob, t, period)
        if pat is None:
            continue
        for b in prob.blocks:  # dependencies hold between absolute offsets
            for a in b.after:
                assert pat.at(b.name, 0) >= pat.at(a, 0) + t.dur[a]
        plan = solvers.make_plan(prob, solvers._unrolled(prob, pat), "tessel", "feasible")
        assert not check(prob, plan), (shape, period)  # unrolled over N: memory and overlaps hold
    pat, stats = solvers.find_repetend(prob, t, time_limit_s=2.0, seed=0, progress=no_progress)
    assert set(stats["periods_constructed"]) <= set(stats["periods_tried"])


@pytest.mark.parametrize("solver", ["tessel", "exact"])
def test_a_limit_shorter_than_or_tools_first_import_keeps_the_best_plan_without_it(
        solver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: in a fresh process both solvers imported OR-Tools (about 0.3 s) under any limit, so a 0.3 s
    limit ended at 0.4-0.7 s although a baseline's schedule was in hand."""
    from gpuplan.solvers import backends

    monkeypatch.delitem(sys.modules, backends.CP_MODEL, raising=False)  # as if never imported
    prob = api.load_problem("examples/tessel/hand-2.yaml")
    plan = api.solve(prob, solver=solver, time_limit_s=backends.COLD_IMPORT_S[backends.CP_MODEL] / 2)
    assert plan.status.value == "time_limit" and "first import" in plan.message
    assert backends.CP_MODEL not in sys.modules  # not imported on the way
    assert plan.makespan_s == pytest.approx(min(p.makespan_s for p in solvers.baseline_plans(prob)))
    assert not check(prob, plan)


def test_exact_returns_a_hint_at_the_lower_bound_as_optimal_without_cpsat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solvers, "schedule_cpsat", lambda *a, **k: pytest.fail("CP-SAT started"))
    prob = problem("1f1b", 4, 8)  # 1F1B meets the lower bound here
    plan = api.solve(prob, solver="exact")
    assert plan.status.value == "optimal" and plan.makespan_s == pytest.approx(plan.predicted["lower_bound_s"])
    assert plan.predicted["proven_bound_s"] == pytest.approx(plan.makespan_s) and not check(prob, plan)
