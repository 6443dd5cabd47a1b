"""Bundles whose stages have different data-parallel degrees: the redistribution of a micro-batch's rows
between replicas, the core-sharing time with several workers per device, and (slow) a run whose loss
and gradients are those of one process running the whole model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan.runtime.bundle import shared_cores_time_s
from gpuplan.runtime.bundle_mixed import offsets, replica_slices

CPU_TYPES = {
    "cpu": {"name": "cpu", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10, "peak_tflops": {"fp32": 0.05},
            "intra_node_GBps": 2},
    "cpu-slow2x": {"name": "cpu-slow2x", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                   "peak_tflops": {"fp32": 0.025}, "intra_node_GBps": 2}}


def _problem(layers: int) -> dict:
    """A tiny GPT on one fast and two slow emulated CPUs: Poseidon puts dp 1 then dp 2."""
    return {"kind": "poseidon", "name": "mixed-dp",
            "cluster": {"device_types": CPU_TYPES, "nodes": [{"name": "cpu0", "gpus": {"cpu": 1, "cpu-slow2x": 2}}]},
            "model": {"name": "gpt-mini", "num_layers": layers, "hidden": 64, "heads": 4, "ffn_hidden": 256,
                      "vocab": 2048, "gated_mlp": False},
            "global_batch": 8, "seq_len": 32, "dtype": "fp32", "optimizer_state_bytes_per_param": 0, "max_tp": 1,
            "max_stages": 2}


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_replica_slices_cover_every_row_once(dp_src: int, dp_dst: int, k: int) -> None:
    """Every row of a micro-batch goes from the source replica holding it to the destination replica
    holding it, exactly once."""
    import math

    samples = k * dp_src * dp_dst // math.gcd(dp_src, dp_dst)
    got = {}
    for q, r, a, b in replica_slices(dp_src, dp_dst, samples):
        assert a < b
        for row in range(a, b):
            assert row not in got
            got[row] = (q, r)
    bs, bd = samples // dp_src, samples // dp_dst
    assert got == {row: (row // bs, row // bd) for row in range(samples)}


def test_replica_slices_examples_and_refusal() -> None:
    """dp 2 -> 1 merges two halves; dp 1 -> 2 splits; 2 -> 3 of 6 rows by hand; uneven splits refused."""
    assert replica_slices(2, 1, 4) == [(0, 0, 0, 2), (1, 0, 2, 4)]
    assert replica_slices(1, 2, 4) == [(0, 0, 0, 2), (0, 1, 2, 4)]
    assert replica_slices(2, 3, 6) == [(0, 0, 0, 2), (0, 1, 2, 3), (1, 1, 3, 4), (1, 2, 4, 6)]
    assert offsets([1, 2, 3]) == [0, 1, 3]
    with pytest.raises(ValueError, match="do not split"):
        replica_slices(2, 3, 4)


def test_shared_cores_counts_each_devices_workers() -> None:
    """Two devices computing at once with 1 and 2 workers share the cores as 3 workers do; with one
    worker each as 2 (times by hand)."""
    pair = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}, {"name": "b", "devices": [1], "duration_s": 1.0}]})
    orders = [[("a", 0)], [("b", 0)]]
    rates = [1.0, 1.0, 0.5]
    assert shared_cores_time_s(pair, orders, rates, [0.0, 0.0]) == pytest.approx(1.0)
    assert shared_cores_time_s(pair, orders, rates, [0.0, 0.0], workers=[1, 2]) == pytest.approx(2.0)
    # alone, a device of 2 workers runs at rates[1]
    solo = gpuplan.load_problem({"kind": "tessel", "devices": 1, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 1.0}]})
    assert shared_cores_time_s(solo, [[("a", 0)]], [1.0, 0.8], [0.0], workers=[2]) == pytest.approx(1.25)


@pytest.fixture(scope="module")
def mixed_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    out = {}
    for layers in (8,):  # Poseidon interleaves 2 chunks per stage: chunks pass between stages of dp 1 and 2
        folder = tmp_path_factory.mktemp(f"mixed{layers}")
        gpuplan.plan_training(_problem(layers), output=folder / "bundle", time_limit_s=5)
        out[layers] = folder / "bundle"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layers", [8])
def test_mixed_dp_bundle_computes_the_model(mixed_bundles: dict[int, Path], layers: int) -> None:
    """A bundle with dp 1 then dp 2 runs (activations split between the replicas, gradients merged
    back); its first loss and its gradients after the per-stage all-reduce are those of one process
    running the whole model on the same global batch."""
    import torch

    from gpuplan.models.workload import TransformerConfig
    from gpuplan.runtime import gpt
    from gpuplan.runtime.bundle import run_bundle
    from gpuplan.runtime.poseidon import runnable_config

    bundle = mixed_bundles[layers]
    plan = gpuplan.load_plan(bundle / "poseidon.json")
    dps = [s.dp for s in plan.stages]  # type: ignore[attr-defined]
    assert len(set(dps)) > 1, dps
    out = run_bundle(bundle, steps=1, warmup=0, sharing=[1.0, 1.0, 0.67], return_grads=True)
    assert out["dps"] == dps and out["executor"].startswith("gpuplan")
    assert out["measured_iteration_s"] > 0
    cfg, seq, _ = runnable_config(gpuplan.plan_problem(plan))  # type: ignore[arg-type]
    cfg = TransformerConfig.model_validate(cfg.model_dump())
    m = plan.num_microbatches  # type: ignore[attr-defined]
    G = gpuplan.plan_problem(plan).global_batch  # type: ignore[attr-defined]
    tokens, targets = gpt.synthetic_batch(cfg, G, seq, seed=0)
    model = gpt.model(cfg, 0)
    loss = sum(gpt.lm_loss(model(tokens[i * G // m:(i + 1) * G // m]), targets[i * G // m:(i + 1) * G // m])
               for i in range(m)) / m
    loss.backward()
    assert out["losses"][0] == pytest.approx(float(loss.detach()), rel=1e-5)
    want = {n: p.grad for n, p in model.named_parameters()}
    assert set(out["grads"]) == set(want)
    for name, g in want.items():
        torch.testing.assert_close(out["grads"][name], g, rtol=1e-4, atol=1e-6)


def test_shared_cores_emulated_sleep_uses_no_core() -> None:
    """A device emulated 2x slower computes half its block and sleeps the rest (+ the late sleep) on no
    core: two such devices on rates [1, 0.5] overlap their sleeps (times by hand)."""
    solo = gpuplan.load_problem({"kind": "tessel", "devices": 1, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 2.0}]})
    assert shared_cores_time_s(solo, [[("a", 0)]], [1.0], [0.0], factors=[2.0], sleep_s=0.1) == pytest.approx(2.1)
    pair = gpuplan.load_problem({"kind": "tessel", "devices": 2, "microbatches": 1, "blocks": [
        {"name": "a", "devices": [0], "duration_s": 2.0}, {"name": "b", "devices": [1], "duration_s": 2.0}]})
    orders = [[("a", 0)], [("b", 0)]]
    # each: 1 s of CPU at half speed (2 s), then sleeps (2 - 1) x 2 s
    assert shared_cores_time_s(pair, orders, [1.0, 0.5], [0.0, 0.0], factors=[2.0, 2.0]) == pytest.approx(4.0)
    # b at factor 1 computes 2 s of CPU: shared with a for 2 s (1 s done), alone for 1 s more; a sleeps 2 s
    assert shared_cores_time_s(pair, orders, [1.0, 0.5], [0.0, 0.0], factors=[2.0, 1.0]) == pytest.approx(4.0)
    assert shared_cores_time_s(pair, orders, [1.0, 0.5], [0.0, 0.0], factors=[2.0, 1.0],
                               sleep_s=0.5) == pytest.approx(4.5)
