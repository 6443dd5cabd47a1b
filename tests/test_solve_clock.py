"""The solve's clock: a search's simulations stop at the time limit and keep room for the chosen plan's own
simulation, which always runs to its end; a solve that ran past its limit says so in the plan."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from gpuplan import api
from gpuplan.sim.core import SimulationCut, solve_clock, searching
from gpuplan.sim.serving import Requests, SarathiPolicy, simulate
from gpuplan.solvers.backends import Deadline


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _long_trace(n: int = 16000) -> Requests:
    """Requests that take the engine about 32,000 iterations (2 s of CPU here)."""
    return Requests.make(np.arange(n) * 0.01, np.full(n, 64), np.full(n, 64))


def _policy() -> SarathiPolicy:
    return SarathiPolicy(lambda t, k, a: 0.01, lambda c, p: 0.0, 1_000_000, token_budget=64, watermark=0.0)


def test_a_search_simulation_stops_at_the_limit() -> None:
    started = time.perf_counter()
    with solve_clock(0.05), searching(), pytest.raises(SimulationCut, match="stopped a simulation"):
        simulate(_long_trace(), _policy())
    assert time.perf_counter() - started < 1.0  # the clock is read every 32 iterations: the run is far longer


def test_the_plans_own_simulation_runs_to_its_end() -> None:
    """Outside a search nothing is cut: the same requests all finish under a limit they far exceed."""
    reqs = Requests.make(np.arange(50) * 0.01, np.full(50, 8), np.full(50, 8))
    with solve_clock(1e-6):
        time.sleep(1e-3)
        res = simulate(reqs, _policy())
    assert np.isfinite(res.finish_s).all()


def test_a_search_keeps_room_for_one_more_simulation() -> None:
    """Once a simulation took L seconds, a search's next one starts only while 2 L still fit (its own and
    the chosen plan's), and is refused at once otherwise, without running."""
    with solve_clock(10.0) as clock:
        clock.longest_s = 6.0  # as if a finished simulation had taken 6 s
        with searching(), pytest.raises(SimulationCut, match="would not end"):
            simulate(_long_trace(), _policy())
        clock.longest_s = 0.0
    assert clock.reserves == [] and clock.open_stop is None


def test_attempt_records_the_cut_and_returns_none() -> None:
    deadline = Deadline()
    with solve_clock(0.02):
        out = deadline.attempt(simulate, _long_trace(), _policy())
    assert out is None and deadline.cut and "stopped a simulation" in deadline.why


def test_no_limit_no_cut() -> None:
    reqs = Requests.make(np.arange(20) * 0.01, np.full(20, 8), np.full(20, 8))
    with solve_clock(None), searching():
        res = simulate(reqs, _policy())
    assert np.isfinite(res.finish_s).all()


def test_a_plan_made_past_its_limit_says_so() -> None:
    """The least work that makes one Hetis plan (Stage A's first candidate rated, the plan's own figures)
    takes seconds here: a tiny limit gives that plan, time_limit, its message saying how long it took."""
    from gpuplan.solvers import hetis

    hetis._STAGE_A_RATED.clear()
    hetis._STATIC_CACHE.clear()
    doc = api.load_problem(EXAMPLES / "hetis" / "small.yaml").document()
    doc["trace"]["requests"] = 40
    plan = api.solve(api.load_problem(doc), solver="hexgen", time_limit_s=1e-3)
    assert plan.status.value == "time_limit"
    assert "past its time limit of 0.001 s" in plan.message
    assert api.check(None, plan) == []


def test_an_engine_run_inside_a_plans_simulation_shares_its_stop() -> None:
    """A Hetis plan simulates engine by engine: the engines' runs are parts of the plan's simulation, so
    they stop where it stops and only the whole is recorded as a simulation's length."""
    from gpuplan.sim.core import SimulationWatch

    with solve_clock(10.0) as clock, searching():
        whole = SimulationWatch("a plan")
        time.sleep(0.01)
        part = SimulationWatch("one engine")
        assert part.stop == whole.stop < clock.at
        part.done()
        assert clock.longest_s == 0.0 and clock.open_stop == whole.stop
        whole.done()
        assert clock.longest_s >= 0.01 and clock.open_stop is None
