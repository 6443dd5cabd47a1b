"""Megatron's --tp-comm-overlap (Transformer Engine's userbuffers): each TP all-gather / reduce-scatter of
sequence parallelism runs beside the GEMM that needs or makes its tensor. The exposed seconds are checked
against the pairing's formulas (ring exchange: max(G, C + G / tp); bulk: max(G, C)), and the problem-level
flag against its limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan.models.cluster import device_type
from gpuplan.models.poseidon import cost as C


def _cfg():  # type: ignore[no-untyped-def]
    from gpuplan.models.workload import model_config, scaled

    return scaled(model_config("llama2-13b"), num_layers=2)


def _ops(tp: int, overlap: bool, ag: float, rs: float, dtype: str = "bf16") -> list[C.OpTime]:
    def coll(op: str, size: float) -> float:
        return {"all_gather": ag, "reduce_scatter": rs}[op]

    return C.layer_ops(_cfg(), device_type("H100"), dtype, tp, 1, 4096,
                       C.LayerOptions(flash=True, sequence_parallel=True, tp_overlap=overlap), coll)


def _gemms(ops: list[C.OpTime]) -> dict[str, C.OpTime]:
    names = {"QKV GEMM": "qkv", "attention output GEMM": "proj", "MLP in GEMM": "fc1", "MLP out GEMM": "fc2"}
    return {names[o.name]: o for o in ops if o.name in names}


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_exposed_seconds_follow_the_pairing(dtype: str) -> None:
    tp, ag, rs = 4, 2e-4, 3e-4
    ops = _ops(tp, True, ag, rs, dtype)
    comm = next(o for o in ops if o.comm)
    parts: dict[str, tuple[float, float, float]] = {}
    g = _gemms(ops)
    assert g == _gemms(_ops(tp, False, ag, rs, dtype))  # the GEMMs themselves do not depend on the flag
    # the input- and weight-gradient GEMMs of each linear, rebuilt from the cost functions
    dev, cfg, T = device_type("H100"), _cfg(), 4096
    d = cfg.dhead
    dims = {"qkv": (cfg.hidden, (cfg.heads + 2 * cfg.kv) * d // tp), "proj": (cfg.heads * d // tp, cfg.hidden),
            "fc1": (cfg.hidden, 2 * cfg.ffn_hidden // tp), "fc2": (cfg.ffn_hidden // tp, cfg.hidden)}
    for name, (n_in, n_out) in dims.items():
        wgrad = C.gemm_s(dev, dtype, n_out, n_in, T, out_bytes=C.MAIN_GRAD_BYTES)
        if dtype == "fp8":
            dgrad = (C.FP8_SPLIT_ACCUMULATION * C.gemm_s(dev, dtype, T, n_in, n_out, out_bytes=2)
                     + C.memory_s(dev, T * n_out * C.FP8_CAST_BYTES))
            wgrad *= C.FP8_SPLIT_ACCUMULATION
        else:
            dgrad = C.gemm_s(dev, dtype, T, n_in, n_out)
        assert g[name].backward_s == pytest.approx(dgrad + wgrad, rel=1e-12)
        parts[name] = (g[name].forward_s, dgrad, wgrad)

    def ring(G: float, c: float) -> float:
        return max(G, c + G / tp) - G

    fwd = ring(parts["qkv"][0], ag) + ring(parts["proj"][0], rs) + ring(parts["fc1"][0], ag) + ring(parts["fc2"][0], rs)
    bwd = (ring(parts["fc2"][1], ag) + max(0.0, rs - parts["fc1"][2]) + ring(parts["proj"][1], ag)
           + max(0.0, rs - parts["qkv"][2]))
    assert comm.forward_s == pytest.approx(fwd, rel=1e-12)
    assert comm.backward_s == pytest.approx(bwd, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), ag=st.floats(0.0, 1e-2), rs=st.floats(0.0, 1e-2))
def test_overlap_never_costs_more_than_exposed_collectives_and_never_less_than_nothing(tp: int, ag: float,
                                                                                      rs: float) -> None:
    hidden = next(o for o in _ops(tp, True, ag, rs) if o.comm)
    exposed = next(o for o in _ops(tp, False, ag, rs) if o.comm)
    assert 0.0 <= hidden.forward_s <= exposed.forward_s + 1e-15
    assert 0.0 <= hidden.backward_s <= exposed.backward_s + 1e-15
    if ag == 0.0 and rs == 0.0:
        assert hidden.forward_s == hidden.backward_s == 0.0


def _problem(**extra: object):  # type: ignore[no-untyped-def]
    return gpuplan.load_problem({"kind": "poseidon", "cluster": {"gpus": {"H100": 16}, "gpus_per_node": 8},
                                 "model": "llama2-13b", "global_batch": 64, "seq_len": 4096, **extra})


def test_the_flag_speeds_a_tp_plan_and_leaves_tp1_alone() -> None:
    tp4 = {"tp": 4, "pp": 2, "dp": 2, "mb": 1, "recompute": "none"}
    tp1 = {"tp": 1, "pp": 2, "dp": 8, "mb": 1, "recompute": "full"}
    off, on = _problem(), _problem(tp_comm_overlap=True)
    assert (gpuplan.evaluate_config(on, tp4, check_memory=False).iteration_time_s
            < gpuplan.evaluate_config(off, tp4, check_memory=False).iteration_time_s)
    assert (gpuplan.evaluate_config(on, tp1, check_memory=False).iteration_time_s
            == gpuplan.evaluate_config(off, tp1, check_memory=False).iteration_time_s)
    plan = gpuplan.solve(on, time_limit_s=30)
    assert gpuplan.check(on, plan) == []  # check recomputes the times with the flag


def test_the_flag_needs_sequence_parallelism() -> None:
    with pytest.raises(gpuplan.InputError, match="tp_comm_overlap"):
        _problem(tp_comm_overlap=True, sequence_parallel=False)


def test_megatron_export_switches_the_overlap_on_where_the_plan_assumes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import megatron
    from gpuplan.export.common import training_job

    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "gpt3-1.3b",
           "global_batch": 16, "seq_len": 1024, "tp_comm_overlap": True}
    write_bundle(tmp_path / "b", compose(gpuplan.evaluate_config(doc, "tp=2,pp=1,dp=2,mb=1"), time_limit_s=3))
    args = megatron.export(tmp_path / "b")["args"]
    assert "--sequence-parallel" in args and "--tp-comm-overlap" in args
    job = training_job(tmp_path / "b", "Megatron-LM")
    assert "--tp-comm-overlap" not in megatron.job_args(dataclasses.replace(job, tp_comm_overlap=False))
