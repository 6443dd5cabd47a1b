"""The CPU execution's prediction (gpuplan.runtime.hetis._predict) against a hand computation, and the
runner's option checks; the execution itself is tested (slow) in test_hetis_cli.py."""

from __future__ import annotations

import math

import pytest

from gpuplan.errors import InputError
from gpuplan.runtime import hetis as rt


def _spec(heads: list[list[int]], ctx: list[int], factors: list[float], layers: int = 2) -> dict:
    return {"heads": heads, "ctx": ctx, "factors": factors, "layers": layers}


def _cal(a0: float, a1: float, **extra: float) -> dict:
    return {"a0_s": a0, "a1_s": a1, **extra}


def test_prediction_is_dense_plus_bookkeeping_plus_the_slowest_path_per_layer() -> None:
    # 2 requests; rank 0 holds 3 + 1 heads, the worker 1 + 0 (its second request makes no call)
    spec = _spec([[3, 1], [1, 0]], ctx=[100, 50], factors=[1.0, 2.0])
    prim = _cal(1e-5, 1e-8, dense_layer_s=0.010, book_layer_s=0.001, rtt_s=[0.002])
    worker = _cal(2e-5, 2e-8, sleep_late_s=0.0005)
    a_0 = (1e-5 + 1e-8 * 3 * 100) + (1e-5 + 1e-8 * 1 * 50)
    a_1 = 2e-5 + 2e-8 * 1 * 100
    path_1 = 0.002 + 2.0 * a_1 + 0.0005
    out = rt._predict(spec, [prim, worker])
    assert math.isclose(out["terms_s"]["local"], a_0)
    assert math.isclose(out["path_s"][1], path_1)
    assert path_1 > a_0  # the worker's path is the slower one: the primary waits for it
    assert math.isclose(out["terms_s"]["exchange"], path_1 - a_0)
    assert math.isclose(out["step_s"], 2 * (0.010 + 0.001 + path_1))
    assert math.isclose(out["per_rank_s"][1], 2.0 * a_1)


def test_a_fast_worker_adds_nothing_beyond_the_primary_attention() -> None:
    spec = _spec([[40, 1]], ctx=[400], factors=[1.0, 1.0], layers=3)
    prim = _cal(1e-5, 1e-8, dense_layer_s=0.02, book_layer_s=0.0, rtt_s=[1e-4])
    out = rt._predict(spec, [prim, _cal(1e-5, 1e-8)])
    local = 1e-5 + 1e-8 * 40 * 400
    assert out["terms_s"]["exchange"] == 0.0
    assert math.isclose(out["step_s"], 3 * (0.02 + local))


def test_the_stream_probe_is_beyond_a_last_level_cache() -> None:
    # the attention line's a1 must be timed on caches read from memory, as the run's are
    assert rt.STREAM_BYTES >= 64 << 20


@pytest.mark.parametrize("option, value", [("quiet_wait_s", -1.0), ("quiet_wait_s", float("nan")), ("steps", 0)])
def test_run_options_out_of_range_are_refused(option: str, value: float) -> None:
    with pytest.raises(InputError, match=option):
        rt.run_plan(None, None, **{option: value})
