"""collectives.collective_time_s / bus_bandwidth_GBps: the contract other models rely on."""

from __future__ import annotations

import time

import pytest

from gpuplan.models.cluster import Cluster
from gpuplan.models.collectives import (Fit, bus_bandwidth_GBps, collective_time_s, fallback_time_s,
                                        group_shape, nccl_choice)

GiB = 2**30


def _cluster(nics: int = 8) -> Cluster:
    return Cluster.model_validate({"nodes": [{"name": f"n{i}", "gpus": {"A100-80GB": 8}} for i in range(4)],
                                   "inter_node": {"bandwidth_GBps": "200 Gbps", "latency_s": "5 us",
                                                  "nics_per_node": nics}})


def test_one_device_costs_nothing_and_bad_input_is_named() -> None:
    c = _cluster()
    assert collective_time_s(c, "all_reduce", GiB, [3]) == 0.0
    assert bus_bandwidth_GBps(c, "all_reduce", GiB, []) == 0.0
    with pytest.raises(ValueError, match="op: one of"):
        collective_time_s(c, "allreduce", 1024, [0, 1])
    with pytest.raises(ValueError, match=r"device_ids: ids of the cluster's devices \(0..31\), not 99"):
        collective_time_s(c, "all_reduce", 1024, [0, 99])
    with pytest.raises(ValueError, match="repeat"):
        collective_time_s(c, "all_reduce", 1024, [1, 1])


def test_time_grows_with_size_and_busbw_is_nccl_tests_definition() -> None:
    c = _cluster()
    ids = list(range(8))
    sizes = [2**k for k in range(10, 31, 2)]
    times = [collective_time_s(c, "all_reduce", s, ids) for s in sizes]
    assert all(b > a for a, b in zip(times, times[1:]))
    t = collective_time_s(c, "all_reduce", GiB, ids)
    assert bus_bandwidth_GBps(c, "all_reduce", GiB, ids) == pytest.approx(2 * 7 / 8 * GiB / t / 1e9)


def test_ring_across_nodes_uses_every_rail() -> None:
    """8 x 200 Gb/s rails carry ~8x what one NIC does; NVLink inside the node is not the bottleneck."""
    eight = bus_bandwidth_GBps(_cluster(8), "all_reduce", GiB, range(16))
    one = bus_bandwidth_GBps(_cluster(1), "all_reduce", GiB, range(16))
    assert one < 25.0                  # one 25 GB/s NIC
    assert eight > 6 * one
    assert eight < 8 * 25.0            # never above the NICs' line rate


def test_single_node_nvlink_is_below_line_rate() -> None:
    """NCCL's achieved NVLink per link (20 GB/s on SM80), not the 25 GB/s line rate: busbw < 240."""
    bw = bus_bandwidth_GBps(_cluster(), "all_reduce", GiB, range(8))
    assert 200.0 < bw <= 240.0


def test_unknown_devices_fall_back_to_alpha_beta_ring() -> None:
    c = Cluster.model_validate({
        "device_types": {"cpu": {"name": "cpu", "memory_bytes": 2**34, "memory_bandwidth_GBps": 20,
                                 "peak_tflops": {"fp32": 0.5}, "intra_node_GBps": 5.0}},
        "nodes": [{"name": "h", "gpus": {"cpu": 4}}]})
    assert group_shape(c, range(4)).topology is None
    assert nccl_choice(c, "all_reduce", 1e6, range(4)) is None
    want = 2 * 3 / 4 * 1e6 / 5e9 + 2 * 3 * 2e-6   # the intra link: 5 GB/s, 2 us per step
    assert collective_time_s(c, "all_reduce", 1e6, range(4)) == pytest.approx(want)
    assert fallback_time_s("all_reduce", 1e6, 4, 5.0, 2e-6) == pytest.approx(want)


def test_calibration_replaces_the_model_for_its_group() -> None:
    c = _cluster()
    cal = {("all_reduce", 8, "intra_node"): Fit(alpha_s=1e-4, bandwidth_GBps=10.0)}
    assert collective_time_s(c, "all_reduce", 1e9, range(8), calibration=cal) == pytest.approx(1e-4 + 0.1)
    # another group size keeps the model
    assert collective_time_s(c, "all_reduce", 1e9, range(4), calibration=cal) == collective_time_s(
        c, "all_reduce", 1e9, range(4))


def test_repeated_calls_are_cached_and_fast() -> None:
    c = _cluster()
    ids = list(range(32))
    start = time.perf_counter()
    for i in range(5000):
        collective_time_s(c, "all_reduce", 1e6 * (i % 100 + 1), ids)
    assert time.perf_counter() - start < 2.0
