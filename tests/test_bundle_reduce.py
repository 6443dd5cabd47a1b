"""The data-parallel gradient reduction in the bundle's prediction for this machine: its end under the
other devices' compute (schedule arithmetic by hand) and (slow) the probe that measures it."""

from __future__ import annotations

import pytest

import gpuplan
from gpuplan.runtime.bundle import reduce_end_s, shared_cores_time_s


def test_reduce_end_interpolates_by_the_workers_computing() -> None:
    """1 s alone, 3 s with both other workers computing: 1 s with both computing does a third of it, the
    rest runs alone (2/3 s); one of two computing (2 s per reduction) for 1 s does half, then alone."""
    log = [(0.0, 2, {1: 2}), (1.0, 0, {})]
    assert reduce_end_s(0.0, (1.0, 3.0), log, 0, 2) == pytest.approx(1.0 + 2.0 / 3.0)
    assert reduce_end_s(0.0, (1.0, 3.0), [(0.0, 1, {1: 1}), (1.0, 0, {})], 0, 2) == pytest.approx(1.5)
    # the device's own workers do not slow its reduction; starting after the log: alone
    assert reduce_end_s(0.0, (1.0, 3.0), [(0.0, 2, {0: 2}), (1.0, 0, {})], 0, 2) == pytest.approx(1.0)
    assert reduce_end_s(5.0, (1.0, 3.0), log, 0, 2) == pytest.approx(6.0)
    assert reduce_end_s(2.0, (0.0, 0.0), log, 0, 2) == pytest.approx(2.0)


def test_shared_cores_reduction_overlaps_the_other_devices_blocks() -> None:
    """Device 0 ends its 1 s block at 1 s and reduces (1 s alone, 3 s next to device 1's block) while
    device 1 computes until 3 s: two thirds done then, the last third alone: 3 1/3 s; with the busy
    figure equal to the alone one, 2 s (the end is device 1's 3 s); the optimizer tail follows."""
    pair = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}, {"name": "b", "devices": [1], "duration_s": 3.0}]})
    orders = [[("a", 0)], [("b", 0)]]
    rates = [1.0, 1.0]
    assert shared_cores_time_s(pair, orders, rates, [0.0, 0.0], reduce_s=[(1.0, 3.0), (0.0, 0.0)]) == \
        pytest.approx(3.0 + 1.0 / 3.0)
    assert shared_cores_time_s(pair, orders, rates, [0.0, 0.0], reduce_s=[(1.0, 1.0), (0.0, 0.0)]) == \
        pytest.approx(3.0)
    assert shared_cores_time_s(pair, orders, rates, [0.5, 0.0], reduce_s=[(1.0, 3.0), (0.0, 0.0)]) == \
        pytest.approx(3.0 + 1.0 / 3.0 + 0.5)
    # without reduce_s the tail is the plan's, after the last block at rates[0]
    assert shared_cores_time_s(pair, orders, rates, [1.0, 0.0]) == pytest.approx(3.0)


@pytest.mark.slow
def test_measure_reduce_s_times_each_group() -> None:
    """Three processes: ranks 0 and 2 (one stage's replicas) reduce their stage's gradients, rank 1 the
    other stage's; one (alone, busy) pair of positive seconds for the one group."""
    from gpuplan.models.workload import TransformerConfig
    from gpuplan.profiling.stage_speed import measure_reduce_s

    cfg = TransformerConfig.model_validate({"name": "gpt-mini", "num_layers": 2, "hidden": 64, "heads": 4,
                                            "ffn_hidden": 256, "vocab": 512, "gated_mlp": False})
    got = measure_reduce_s(cfg, [[(0, 1)], [(1, 2)], [(0, 1)]], [[0, 2]], micro_batch=2, seq_len=16, window_s=0.2)
    assert len(got) == 1
    alone, busy = got[0]
    assert alone > 0.0 and busy > 0.0
