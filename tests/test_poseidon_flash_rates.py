"""Fused attention on Hopper runs at cuDNN's measured rates (FlashAttention-3 paper, H100 SXM5, head dim
128) times the sustained over the burst matmul rate of the same die (H200 SXM, mamf-finder: MSMF 708.5,
MAMF 841.9 TFLOP/s); on the A100 at FlashAttention-2's measured forward + backward rate (its paper's A100
80GB SXM4 figure, head dim 64 and 128) times the A100's sustained over burst rate (Azure 256.5, mamf-finder
267.9); elsewhere at the GEMM rate of its score shape. The op's time is checked against those formulas."""

from __future__ import annotations

import pytest

from gpuplan.models.cluster import device_type
from gpuplan.models.poseidon import cost as C


def flash_op(dev_name: str, seq: int, causal: bool = True) -> C.OpTime:
    cfg_ops = C.layer_ops(_cfg(), device_type(dev_name), "bf16", 1, 2, seq,
                          C.LayerOptions(flash=True, causal=causal), lambda op, s: 0.0)
    return next(o for o in cfg_ops if o.name == "flash attention")


def _cfg():  # type: ignore[no-untyped-def]
    from gpuplan.models.workload import model_config, scaled

    return scaled(model_config("llama2-7b"), num_layers=2)


@pytest.mark.parametrize("seq, causal", [(2048, True), (4096, True), (2048, False), (8192, True)])
def test_hopper_flash_runs_at_the_measured_rates(seq: int, causal: bool) -> None:
    k = C.FLASH_SEQ.index(seq)
    fwd_tf = C.FLASH_HOPPER_TFLOPS["forward_causal" if causal else "forward"][k]
    bwd_tf = C.FLASH_HOPPER_TFLOPS["backward"][k]
    cfg, b = _cfg(), 2
    flops = 4.0 * b * seq * seq * cfg.heads * cfg.dhead * (0.5 if causal else 1.0)
    peak = device_type("H100").peak("bf16")
    op = flash_op("H100", seq, causal)
    sustained = 708.5 / 841.9  # a training step runs at the power limit, the benchmark at the boost clock
    assert op.forward_s == pytest.approx(flops / (peak * 1e12 * fwd_tf * sustained / 989.4), rel=1e-9)
    assert op.backward_s == pytest.approx(2.5 * flops / (peak * 1e12 * bwd_tf * sustained / 989.4), rel=1e-9)


def test_between_and_beyond_the_measured_lengths() -> None:
    lo, mid, hi = (flash_op("H100", s).forward_s for s in (2048, 2896, 4096))
    per = [t / s**2 for t, s in ((lo, 2048), (mid, 2896), (hi, 4096))]
    assert per[0] > per[1] > per[2]  # the rate rises with the length between the points
    # clamped: below 512 tokens the 512-token rate, above 16k the 16k rate
    h100 = device_type("H100")
    assert C.flash_fractions(h100, 256, True) == C.flash_fractions(h100, 512, True)
    assert C.flash_fractions(h100, 32768, False) == C.flash_fractions(h100, 16384, False)
    assert C.flash_fractions(h100, 512, True) == pytest.approx((315 / 989.4 * 708.5 / 841.9,
                                                                305 / 989.4 * 708.5 / 841.9))


@pytest.mark.parametrize("seq, causal", [(4096, True), (8192, True), (2048, False)])
def test_a100_flash_runs_at_flashattention2s_measured_rate(seq: int, causal: bool) -> None:
    # the figure's forward + backward rate at head dim 128 (llama2-7b: 4096 / 32)
    measured = {(4096, True): 173.0, (8192, True): 182.0, (2048, False): 187.0}[seq, causal]
    cfg, b = _cfg(), 2
    assert cfg.dhead == 128
    flops = 4.0 * b * seq * seq * cfg.heads * cfg.dhead * (0.5 if causal else 1.0)
    rate = measured * 1e12 * 256.5 / 267.9  # the run's clock: sustained over burst
    op = flash_op("A100-80GB", seq, causal)
    # the pair takes the figure's time: 3.5x the forward's FLOPs at its rate
    assert op.forward_s + op.backward_s == pytest.approx(3.5 * flops / rate, rel=1e-9)
    assert op.backward_s == pytest.approx(2.5 * op.forward_s, rel=1e-9)


def test_a100_head_dims_between_the_measured_ones_are_interpolated() -> None:
    dev = device_type("A100-40GB")
    s = 256.5 / 267.9 / 312.0
    assert C.flash_fractions(dev, 4096, True, 64) == pytest.approx((156.0 * s,) * 2)
    assert C.flash_fractions(dev, 4096, True, 96) == pytest.approx(((156.0 + 173.0) / 2 * s,) * 2)
    assert C.flash_fractions(dev, 4096, True, 32) == C.flash_fractions(dev, 4096, True, 64)
    assert C.flash_fractions(dev, 4096, True, 256) == C.flash_fractions(dev, 4096, True, 128)


@pytest.mark.parametrize("name", ["A10", "L40S", "V100"])
def test_other_types_keep_the_gemm_rate(name: str) -> None:
    dev = device_type(name)
    assert C.flash_fractions(dev, 2048, True) is None
    cfg, b, seq = _cfg(), 2, 2048
    flops = 4.0 * b * seq * seq * cfg.heads * cfg.dhead * 0.5
    rate = dev.peak("bf16") * 1e12 * C.gemm_efficiency(dev, "bf16", seq, seq, cfg.dhead, b * cfg.heads)
    assert flash_op(name, seq).forward_s == pytest.approx(flops / rate, rel=1e-9)
