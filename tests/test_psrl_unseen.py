"""psRL on valid inputs unlike the shipped ones (the outside-style sweep): mixed worker memories, time limits."""

from __future__ import annotations

from typing import Any

import pytest

import gpuplan
from gpuplan.solvers import psrl as S


def _two_workers() -> dict[str, Any]:
    """A fast worker whose memory holds the short sample's path but not the long one's, and a slow big one."""
    return {"kind": "psrl", "name": "kk-memory", "model": "qwen3-0.6b", "exchange_GBps": 50,
            "workers": [{"name": "fast", "gpu": "H100", "memory_bytes": 3e9},
                        {"name": "big", "gpu": "H200", "peak_tflops": 100}],
            "forest": {"nodes": [{"id": 0, "tokens": 20000}, {"id": 1, "tokens": 10}],
                       "samples": [{"node": 0}, {"node": 1}]}}


def test_karmarkar_karp_matches_partitions_to_workers_that_hold_them() -> None:
    """Was: the heaviest partition went to the fastest worker regardless of memory, so a feasible batch came
    back 'infeasible' from the baseline (every other solver found a plan)."""
    problem = gpuplan.load_problem(_two_workers())
    plan = gpuplan.solve(problem, solver="karmarkar-karp", seed=0)
    assert plan.ok, plan.message
    assert plan.sample_worker == ["big", "fast"]
    assert gpuplan.check(problem, plan) == []


def test_karmarkar_karp_keeps_heaviest_on_fastest_without_memory_limits() -> None:
    doc = _two_workers()
    doc["workers"][0].pop("memory_bytes")
    plan = gpuplan.solve(gpuplan.load_problem(doc), solver="karmarkar-karp", seed=0)
    assert plan.sample_worker == ["fast", "big"]


@pytest.mark.parametrize("holds, expected", [([[0, 1], [0]], [1, 0]), ([[0], [0]], None),
                                             ([[0, 1, 2], [0, 1], [0]], [2, 1, 0]), ([[0, 1], [1, 0]], [0, 1])])
def test_match_parts(holds: list[list[int]], expected: list[int] | None) -> None:
    assert S.match_parts(holds) == expected


def test_exact_hint_and_cpsat_share_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: the greedy hint always had 5 s and CP-SAT the whole limit besides, so `exact` ran up to the limit
    + 5 s (3.8 s at a 2 s limit in the sweep)."""
    seen: dict[str, float] = {}
    real_greedy, backends = S.solve_psrl, __import__("gpuplan.solvers.backends", fromlist=["solve_cpsat"])
    real_cpsat = backends.solve_cpsat

    def greedy(problem: Any, **kw: Any) -> Any:
        seen["hint"] = kw["time_limit_s"]
        return real_greedy(problem, **kw)

    def cpsat(model: Any, **kw: Any) -> Any:
        seen["cpsat"] = kw["time_limit_s"]
        return real_cpsat(model, **kw)

    monkeypatch.setattr(S, "solve_psrl", greedy)
    monkeypatch.setattr(backends, "solve_cpsat", cpsat)
    problem = gpuplan.load_problem("examples/psrl/small-agent.yaml")
    plan = gpuplan.solve(problem, solver="exact", time_limit_s=1.0, seed=0)
    assert plan.ok and gpuplan.check(problem, plan) == []
    assert seen["hint"] <= 0.5 and seen["hint"] + seen["cpsat"] <= 1.0 + S.MIN_CPSAT_S


def test_exact_under_a_limit_shorter_than_or_tools_first_import_returns_the_greedy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: in a fresh process `exact` imported OR-Tools (about 0.3 s) whatever the limit: 0.68 s at 0.3 s."""
    import sys

    from gpuplan.solvers import backends

    monkeypatch.delitem(sys.modules, backends.CP_MODEL, raising=False)  # as if never imported
    problem = gpuplan.load_problem("examples/psrl/small-agent.yaml")
    plan = gpuplan.solve(problem, solver="exact", time_limit_s=backends.COLD_IMPORT_S[backends.CP_MODEL] / 2, seed=0)
    assert plan.status.value == "time_limit" and "first import" in (plan.message or "")
    assert backends.CP_MODEL not in sys.modules  # not imported on the way
    assert plan.objective == pytest.approx(gpuplan.solve(problem, seed=0).objective)  # the greedy's plan
    assert gpuplan.check(problem, plan) == []
