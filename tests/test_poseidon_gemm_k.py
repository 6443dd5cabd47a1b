"""Hopper's GEMMs pay a fixed cost per output tile (its prologue and epilogue), worth K0 more steps of the main
loop, so their rate falls at short K (`cost.k_efficiency`). Checked against the two sweeps it comes from: tile-lang's
fp8 benchmark on an H800 SXM (M = N = 8192, K from 1024 up) and Azure's soaked cuBLASLt sweep on H100 (fp8, cubes),
each as rates relative to its largest shape, so the ceiling's level (mamf-finder's) does not enter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.models.cluster import device_type
from gpuplan.models.poseidon import cost as C

H100 = device_type("H100")


def rate(M: int, N: int, K: int, dtype: str = "fp8", dev=H100) -> float:  # type: ignore[no-untyped-def]
    return 2.0 * M * N * K / C.gemm_s(dev, dtype, M, N, K)


@pytest.mark.parametrize("K, measured", [(1024, 927.0), (2048, 1174.0), (4096, 1378.0), (8192, 1461.0)])
def test_tile_langs_h800_fp8_sweep_over_k(K: int, measured: float) -> None:
    # tile-ai/tilelang benchmark/matmul_fp8/README.md: TFLOP/s at M = N = 8192, relative to K = 16384's 1523
    assert rate(8192, 8192, K) / rate(8192, 8192, 16384) == pytest.approx(measured / 1523.0, rel=0.03)


@pytest.mark.parametrize("n, measured", [(2048, 1011.3), (4096, 1216.9), (8192, 1290.1)])
def test_azures_soaked_h100_fp8_cubes(n: int, measured: float) -> None:
    # Azure/AI-benchmarking-guide, ND H100 v5, cuBLASLt fp8 after 10,000 warm-up iterations, relative to 16384^3
    assert rate(n, n, n) / rate(16384, 16384, 16384) == pytest.approx(measured / 1377.3, rel=0.03)


def test_the_16_bit_tile_costs_the_same_time_at_half_the_rate() -> None:
    assert C.HOPPER_TILE_K0["bf16"] == C.HOPPER_TILE_K0["fp8"] / 2 == C.HOPPER_TILE_K0["fp16"]
    # at the ceiling's own K the factor is 1; it falls as K shortens and passes 1 beyond
    for dtype in ("bf16", "fp8"):
        k_star = int(C.HOPPER_CEILING_K[dtype])
        assert C.k_efficiency(H100, dtype, k_star) == pytest.approx(1.0)
        assert C.k_efficiency(H100, dtype, 1024) < C.k_efficiency(H100, dtype, 4096) < 1.0
        assert 1.0 < C.k_efficiency(H100, dtype, 4 * k_star) < 1.0 + C.HOPPER_TILE_K0[dtype] / k_star


@pytest.mark.parametrize("name", ["A100-80GB", "B200", "L40S"])
def test_no_sweep_no_tile_cost(name: str) -> None:
    assert C.k_efficiency(device_type(name), "bf16", 512) == 1.0


def test_a_memory_bound_gemm_keeps_its_memory_time() -> None:
    # a skinny GEMM (N = 64) streams its M x K operand: the roofline's memory term binds, the tile cost not
    M, N, K = 65536, 64, 8192
    traffic = (M * K + K * N + M * N) * 2 / (H100.memory_bandwidth_GBps * 1e9 * C.HBM_FRACTION)
    assert C.gemm_s(H100, "bf16", M, N, K) == pytest.approx(traffic / C.wave_efficiency(H100, M, N), rel=1e-9)


@given(M=st.integers(1, 65536), N=st.integers(1, 65536), K=st.integers(1, 32768),
       dtype=st.sampled_from(["bf16", "fp8"]), name=st.sampled_from(["H100", "H200", "A100-80GB"]))
@settings(max_examples=200, deadline=None)
def test_a_longer_k_never_lowers_the_rate(M: int, N: int, K: int, dtype: str, name: str) -> None:
    # the tile cost, the roofline and the ceiling are each non-decreasing in K, so the rate is too
    dev = device_type(name)
    if dtype == "fp8" and "fp8" not in dev.peak_tflops:
        dtype = "bf16"
    t1, t2 = C.gemm_s(dev, dtype, M, N, K), C.gemm_s(dev, dtype, M, N, K + 1)
    assert 0 < t1 < float("inf")
    assert (K + 1) / t2 >= K / t1 * (1 - 1e-12)
