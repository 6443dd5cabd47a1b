"""Two execution assumptions of modern Megatron-core / NeMo runs in Poseidon's model: the distributed
optimizer (ZeRO stage 1: optimizer states sharded over the data-parallel replicas, the gradient
all-reduce split into a reduce-scatter and a weight all-gather) and fp8 training as Transformer Engine
runs it (the blocks' linear GEMMs in fp8, everything else in bf16). Each figure is checked against
the formula the model documents, and the exports say what the trainers get."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan import api
from gpuplan.compose import compose, write_bundle
from gpuplan.errors import InfeasibleError, InputError
from gpuplan.export import ExportRefused, megatron, torchtitan
from gpuplan.export.common import training_job
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon import cost as C
from gpuplan.models.workload import model_config, scaled, storage_dtype


def problem(gpus: int = 16, gpu: str = "H100", **extra: object) -> P.PoseidonProblem:
    cfg = scaled(model_config("llama2-7b"), num_layers=8)
    doc = {"kind": "poseidon", "cluster": {"gpus": {gpu: gpus}, "gpus_per_node": 8,
                                           "inter_node": {"bandwidth_GBps": "400 Gbps", "nics_per_node": 8}},
           "model": cfg.model_dump(), "global_batch": 64, "seq_len": 2048, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


CONFIG = "tp=2,pp=2,dp=4,mb=1,recompute=none"


# ---- the distributed optimizer ------------------------------------------------------------------------

@pytest.mark.parametrize("overlap", [False, True])
def test_distributed_optimizer_shards_states_and_splits_the_all_reduce(overlap: bool) -> None:
    plain = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap), CONFIG)
    zero = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap, distributed_optimizer=True), CONFIG)
    cm = P.CostModel(problem(overlap_dp_allreduce=overlap, distributed_optimizer=True))
    shapes = P.shapes_of(zero)
    S = len(shapes)
    states = cm.p.optimizer_state_bytes_per_param
    for s, (a, b) in enumerate(zip(plain.stages, zero.stages)):
        sh = shapes[s]
        first, last = s == 0, s == S - 1
        params = cm.stage_params(b.num_layers, first, last, S) / sh.tp
        # memory: the states shrink by dp, nothing else moves
        assert a.memory_bytes - b.memory_bytes == pytest.approx(params * states * (1 - 1 / sh.dp), rel=1e-9)
        # the step: all but zeroing the gradient buffer is done on a 1/dp shard
        per = cm.optimizer_step_bytes_per_param()
        want = params * ((per - cm.grad_bytes) / sh.dp + cm.grad_bytes)
        assert b.optimizer_s == pytest.approx(C.memory_s(cm.dev("H100"), want), rel=1e-9)
        assert b.optimizer_s < a.optimizer_s
        # the gradient exchange: reduce-scatter (fp32 gradients, Megatron's bf16 default), then the
        # weights' all-gather (16-bit)
        size, weights = params * cm.grad_bytes, params * cm.wbytes
        assert cm.grad_bytes == 4.0
        rs = cm.dp_collective_s(sh, "reduce_scatter", size, 4)
        ag = cm.dp_collective_s(sh, "all_gather", weights)
        tied = cm.tied_s(shapes) if s in (0, S - 1) else 0.0
        if overlap:
            # the buckets but the last run beside the backward (the weights' beside the next forward),
            # slowing its compute as Lagom's interference model says
            bucket = min(size, P.DDP_BUCKET_BYTES)
            rsb = cm.dp_collective_s(sh, "reduce_scatter", bucket, 4)
            agb = cm.dp_collective_s(sh, "all_gather", min(weights, P.DDP_BUCKET_BYTES))
            s_rs, s_ag = cm.dp_slowdowns(sh, "reduce_scatter", bucket)
            assert s_rs > 1.0 and s_ag > 1.0
            want_ar = (rsb + max(rs - rsb - b.backward_s, (rs - rsb) * (1 - 1 / s_rs))
                       + agb + (ag - agb) * (1 - 1 / s_ag))
        else:
            want_ar = rs + ag
        assert b.allreduce_s - tied == pytest.approx(want_ar, rel=1e-9)
        assert (a.forward_s, a.backward_s) == (b.forward_s, b.backward_s)
    assert api.check(None, zero) == []


def test_distributed_optimizer_fits_what_the_replicated_states_do_not() -> None:
    # llama2-7b on one 8-GPU node, tp 1, no pipeline: 16 B per parameter of weights, gradients and
    # states (about 100 GiB) do not fit 80 GiB; with the states over 8 replicas (2 + 2 + 12 / 8 B per
    # parameter) they do
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 8}}, "model": "llama2-7b", "global_batch": 64,
           "seq_len": 2048}
    with pytest.raises(InfeasibleError):
        gpuplan.evaluate_config(doc, "tp=1,pp=1,dp=8,mb=1,recompute=full")
    plan = gpuplan.evaluate_config(doc, "tp=1,pp=1,dp=8,mb=1,recompute=full,distopt=true")
    assert plan.stages[0].memory_bytes < 80e9 * 0.9
    assert api.plan_problem(plan).distributed_optimizer  # type: ignore[attr-defined]
    # the config's aliases name one field
    same = gpuplan.evaluate_config(doc, "tp=1,pp=1,dp=8,mb=1,recompute=full,use_distributed_optimizer=true")
    assert same.iteration_time_s == plan.iteration_time_s


def test_check_recomputes_the_sharded_memory() -> None:
    zero = gpuplan.evaluate_config(problem(distributed_optimizer=True), CONFIG)
    plain = gpuplan.evaluate_config(problem(), CONFIG)
    tampered = zero.model_copy(deep=True)
    tampered.stages[0].memory_bytes = plain.stages[0].memory_bytes
    assert any("memory_bytes" in str(v) for v in api.check(None, tampered))


def test_the_search_plans_with_the_sharded_states() -> None:
    prob = problem(gpus=8, distributed_optimizer=True, max_stages=2)
    plan = api.solve(prob, solver="poseidon", time_limit_s=20)
    assert plan.ok and api.check(prob, plan) == []
    again = gpuplan.evaluate_config(prob, {"tp": plan.stages[0].tp, "pp": len(plan.stages), "dp": plan.stages[0].dp,
                                           "mb": plan.stages[0].micro_batch_size, "interleave": plan.interleave,
                                           "recompute": [s.recompute for s in plan.stages],
                                           "layers": [s.num_layers for s in plan.stages]})
    assert again.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-9)


# ---- fp8 training ---------------------------------------------------------------------------------------

def test_fp8_runs_only_the_linear_gemms_in_fp8() -> None:
    cm8, cm16 = P.CostModel(problem(dtype="fp8")), P.CostModel(problem(dtype="bf16"))
    dev = cm8.dev("H100")

    def ops(cm: P.CostModel) -> dict[str, C.OpTime]:
        return {o.name: o for o in C.layer_ops(cm.cfg, dev, cm.p.dtype, 2, 2, 2048, cm.opts, lambda op, s: 0.0)}

    f8, f16 = ops(cm8), ops(cm16)
    assert f8.keys() == f16.keys()
    gemms = [n for n in f8 if "GEMM" in n]
    assert len(gemms) == 4
    for name in f8:
        if name in gemms:
            assert f8[name].forward_s < f16[name].forward_s and f8[name].backward_s < f16[name].backward_s
        else:  # attention, norms, activations: bf16 either way
            assert (f8[name].forward_s, f8[name].backward_s) == (f16[name].forward_s, f16[name].backward_s)
    # the forward of a linear: the fp8 GEMM (16-bit output) plus the input's cast-transpose
    T, h = 2 * 2048, cm8.cfg.hidden
    qkv = (cm8.cfg.heads + 2 * cm8.cfg.kv) * cm8.cfg.dhead // 2
    want = C.gemm_s(dev, "fp8", T, qkv, h, out_bytes=2) + C.memory_s(dev, T * h * C.FP8_CAST_BYTES)
    assert f8["QKV GEMM"].forward_s == pytest.approx(want, rel=1e-12)
    wgrad = C.gemm_s(dev, "fp8", qkv, h, T, out_bytes=C.MAIN_GRAD_BYTES)
    dgrad = C.gemm_s(dev, "fp8", T, h, qkv, out_bytes=2)
    assert f8["QKV GEMM"].backward_s == pytest.approx(
        C.FP8_SPLIT_ACCUMULATION * (dgrad + wgrad) + C.memory_s(dev, T * qkv * C.FP8_CAST_BYTES), rel=1e-12)
    # the ceiling: a large fp8 GEMM reaches the measured sustained fraction of the fp8 peak, not the bf16 one
    # (mamf-finder's MSMF on H200 SXM, H100 SXM's die and power limit: fp8 1288.7, bf16 708.5 TFLOP/s)
    assert C.gemm_ceiling(dev, "fp8") == pytest.approx(1288.7 / 1978.9)
    assert C.gemm_ceiling(dev, "bf16") == pytest.approx(708.5 / 989.4)


@pytest.mark.parametrize("gpu, split", [("H100", True), ("L40S", True), ("B200", False), ("GB200", False)])
def test_fp8_gradient_gemms_promote_their_accumulator_only_before_blackwell(gpu: str, split: bool) -> None:
    """Ada and Hopper accumulate fp8 products in about 22 bits, so Transformer Engine's gradient GEMMs
    promote to fp32 (split accumulation, 1.15x); Blackwell's fp8 MMA accumulates in fp32 and cuBLASLt has
    no fast-accumulation mode for it: its gradient GEMMs run at the forward GEMMs' rate."""
    cm8 = P.CostModel(problem(dtype="fp8", gpu=gpu))
    dev = cm8.dev(gpu)
    ops = {o.name: o for o in C.layer_ops(cm8.cfg, dev, "fp8", 2, 2, 2048, cm8.opts, lambda op, s: 0.0)}
    T, h = 2 * 2048, cm8.cfg.hidden
    qkv = (cm8.cfg.heads + 2 * cm8.cfg.kv) * cm8.cfg.dhead // 2
    wgrad = C.gemm_s(dev, "fp8", qkv, h, T, out_bytes=C.MAIN_GRAD_BYTES)
    dgrad = C.gemm_s(dev, "fp8", T, h, qkv, out_bytes=2)
    factor = C.FP8_SPLIT_ACCUMULATION if split else 1.0
    assert ops["QKV GEMM"].backward_s == pytest.approx(
        factor * (dgrad + wgrad) + C.memory_s(dev, T * qkv * C.FP8_CAST_BYTES), rel=1e-12)


def test_blackwell_ceilings_are_b200s_sustained_rates() -> None:
    """mamf-finder's MSMF on B200 SXM (994 W at 1339 MHz): bf16 1456.3 of 2250, fp8 2795.7 of 4500; B300,
    GB200 and GB300 take Blackwell's fraction of their own datasheet peak."""
    from gpuplan.models.cluster import device_type

    for gpu in ("B200", "B300", "GB200", "GB300"):
        dev = device_type(gpu)
        assert C.gemm_ceiling(dev, "bf16") == pytest.approx(1456.3 / 2250)
        assert C.gemm_ceiling(dev, "fp8") == pytest.approx(2795.7 / 4500)
    assert C.wave_efficiency(device_type("B200"), 148 * 128, 256) == pytest.approx(1.0)  # one full wave of 148 SMs


def test_a_blackwell_cluster_solves_and_passes_check() -> None:
    prob = problem(gpus=16, gpu="B200", dtype="fp8", distributed_optimizer=True, max_stages=2)
    plan = api.solve(prob, solver="poseidon", time_limit_s=20)
    assert plan.ok and api.check(prob, plan) == []
    h100 = api.solve(problem(gpus=16, gpu="H100", dtype="fp8", distributed_optimizer=True, max_stages=2),
                     solver="poseidon", time_limit_s=20)
    assert plan.iteration_time_s < h100.iteration_time_s


def test_fp8_memory_keeps_bf16_weights_fp8_copies_and_fp8_linear_inputs() -> None:
    cm8, cm16 = P.CostModel(problem(dtype="fp8")), P.CostModel(problem(dtype="bf16"))
    assert cm8.wbytes == cm16.wbytes == 2 and storage_dtype("fp8") == "bf16"
    cfg, b, tp, s = cm8.cfg, 2, 2, 2048
    saved = b * s * (2 * cfg.hidden / tp + (cfg.heads * cfg.dhead + cfg.ffn_hidden) / tp)  # sequence parallel
    assert cm16.activation_bytes(tp, b, "none") - cm8.activation_bytes(tp, b, "none") == pytest.approx(saved)
    assert cm8.activation_bytes(tp, b, "full") == cm16.activation_bytes(tp, b, "full")
    sh = P.shapes_of(gpuplan.evaluate_config(problem(), CONFIG))[1]
    m8 = P.stage_memory(cm8, sh, 4, b, 1, 2, 8, "none")
    m16 = P.stage_memory(cm16, sh, 4, b, 1, 2, 8, "none")
    flight = P.in_flight("1f1b", 1, 2, 8)
    assert m8 - m16 == pytest.approx(4 * cfg.layer_params() / tp * P.FP8_WEIGHT_BYTES - flight * 4 * saved, rel=1e-9)


def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores() -> None:
    with pytest.raises(InputError, match="fp8"):
        problem(gpu="A100-80GB", dtype="fp8")


def test_fp8_plan_checks_and_is_faster_than_bf16() -> None:
    f8 = gpuplan.evaluate_config(problem(dtype="fp8"), CONFIG)
    f16 = gpuplan.evaluate_config(problem(dtype="bf16"), CONFIG)
    assert api.check(None, f8) == []
    assert f8.iteration_time_s < f16.iteration_time_s


# ---- what the trainers get ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def h100_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]}, "model": "gpt3-1.3b",
           "global_batch": 16, "seq_len": 1024, "dtype": "fp8", "distributed_optimizer": True}
    out = tmp_path_factory.mktemp("zero-fp8") / "bundle"
    write_bundle(out, compose(gpuplan.evaluate_config(doc, "tp=1,pp=2,dp=2,mb=1"), time_limit_s=3))
    return out


def test_megatron_gets_the_distributed_optimizer_and_fp8(h100_bundle: Path) -> None:
    args = megatron.export(h100_bundle)["args"]
    assert "--use-distributed-optimizer" in args
    assert args[args.index("--fp8-format") + 1] == "hybrid" and "--bf16" in args and "--fp16" not in args
    assert "--overlap-grad-reduce" not in args and "--overlap-param-gather" not in args
    job = training_job(h100_bundle, "Megatron-LM")
    plain = megatron.job_args(dataclasses.replace(job, dtype="bf16", distributed_optimizer=False))
    assert "--use-distributed-optimizer" not in plain and "--fp8-format" not in plain
    overlapped = megatron.job_args(dataclasses.replace(job, overlap_dp_allreduce=True))
    assert "--overlap-grad-reduce" in overlapped and "--overlap-param-gather" in overlapped
    ddp = megatron.job_args(dataclasses.replace(job, overlap_dp_allreduce=True, distributed_optimizer=False))
    assert "--overlap-grad-reduce" in ddp and "--overlap-param-gather" not in ddp


def test_torchtitan_refuses_what_its_export_cannot_switch_on(h100_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportRefused, match="fp8 training"):
        torchtitan.export(h100_bundle, tmp_path / "a", config="llama3:llama3_debugmodel")
    job = training_job(h100_bundle, "torchtitan")
    with pytest.raises(ExportRefused, match="distributed optimizer"):
        torchtitan._check_config(dataclasses.replace(job, dtype="bf16"), "llama3", "llama3_debugmodel", [])


def test_lagom_sees_bf16_collectives_in_fp8_training(h100_bundle: Path) -> None:
    import json

    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    doc = json.loads((h100_bundle / "poseidon.json").read_text(encoding="utf-8"))
    assert doc["problem"]["dtype"] == "fp8"
    bf16 = {**doc, "problem": {**doc["problem"], "dtype": "bf16"}}
    assert workload_from_poseidon(doc) == workload_from_poseidon(bf16)  # the activations move in bf16


# ---- the published Hopper runs fit the model's memory ---------------------------------------------------

def test_every_published_hopper_configuration_fits_the_models_memory(fidelity_training) -> None:  # type: ignore[no-untyped-def]
    """A configuration that ran must fit in the model's memory: the NeMo fp8 rows with the distributed
    optimizer and fp8 linear inputs (without them several needed 104-169 GiB of an 80 GiB GPU)."""
    import yaml

    F = fidelity_training
    doc = yaml.safe_load(F.DATA.read_text(encoding="utf-8"))
    assert len(doc["h100_runs"]) == 11 and len(doc["blackwell_runs"]) == 4
    for row in doc["h100_runs"] + doc["blackwell_runs"]:
        r = F.evaluate_h100_row(row, doc["h100_defaults"])
        assert r["need_GiB"] <= r["cap_GiB"], row["name"]
        assert 0.5 < r["ratio"] < 2.0, row["name"]


@pytest.mark.parametrize("overlap", [False, True])
def test_lagom_tunes_the_reduce_scatter_and_all_gather_of_the_distributed_optimizer(overlap: bool) -> None:
    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    plain = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap), CONFIG)
    zero = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap, distributed_optimizer=True), CONFIG)
    ops = {o["name"]: o for o in workload_from_poseidon(zero.model_dump(mode="json"))["ops"]}
    base = {o["name"]: o for o in workload_from_poseidon(plain.model_dump(mode="json"))["ops"]}
    assert base["dp-grads"]["collective"] == "all_reduce" and "dp-params" not in base
    assert ops["dp-grads"]["collective"] == "reduce_scatter" and ops["dp-params"]["collective"] == "all_gather"
    # the gradients in fp32 (Megatron's bf16 default), the weights in bf16
    assert ops["dp-grads"]["size_bytes"] == 2 * ops["dp-params"]["size_bytes"] == base["dp-grads"]["size_bytes"]
    assert ops["dp-params"]["overlaps"] == ("fwd-mb0" if overlap else None)


@settings(max_examples=15, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), mb=st.sampled_from([1, 2]),
       overlap=st.booleans(), dtype=st.sampled_from(["bf16", "fp8"]))
def test_sharding_the_states_never_costs_memory_or_step_time(tp: int, pp: int, mb: int, overlap: bool,
                                                            dtype: str) -> None:
    """Whatever the configuration: the distributed optimizer keeps at most the memory of replicated
    states (strictly less with dp > 1) and its step takes no longer; forward and backward are the same."""
    dp = 16 // (tp * pp)
    config = {"tp": tp, "pp": pp, "dp": dp, "mb": mb, "recompute": "full"}
    plain = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap, dtype=dtype), config, check_memory=False)
    zero = gpuplan.evaluate_config(problem(overlap_dp_allreduce=overlap, dtype=dtype, distributed_optimizer=True),
                                   config, check_memory=False)
    for a, b in zip(plain.stages, zero.stages):
        assert b.memory_bytes < a.memory_bytes if dp > 1 else b.memory_bytes == a.memory_bytes
        assert b.optimizer_s <= a.optimizer_s
        assert (b.forward_s, b.backward_s) == (a.forward_s, a.backward_s)


def test_evaluate_states_its_assumptions_and_searches_under_them(tmp_path: Path) -> None:
    """`gpuplan evaluate poseidon --vs-search` compares the configuration with the search under the
    same execution assumptions: a config that shards the optimizer states is compared with a search
    that may too (without it, llama2-7b at tp 1 does not fit an 80 GB GPU at all)."""
    import json

    from click.testing import CliRunner

    from gpuplan.cli import main

    doc = tmp_path / "h100.yaml"
    doc.write_text("kind: poseidon\ncluster: {preset: dgx-h100x2}\nmodel: llama2-7b\nglobal_batch: 64\n"
                   "seq_len: 2048\ndtype: fp8\nmax_stages: 2\n", encoding="utf-8")
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(doc), "--config", "tp=1,pp=1,dp=16,mb=1,distopt=true",
                                  "--vs-search", "--time-limit", "30", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert "sharded over dp" in out["assumptions"] and "dtype fp8" in out["assumptions"]
    assert out["search"]["status"] == "optimal" and out["search"]["config_over_search"] >= 1 - 1e-9


def test_cli_options_set_the_precision_and_the_optimizer_sharding(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuplan.cli import main

    args = ["evaluate", "poseidon", "dgx-h100x2", "llama2-7b", "--batch", "64", "--seq", "2048",
            "--config", "tp=1,pp=1,dp=16,mb=1", "-o", str(tmp_path / "p.json")]
    r = CliRunner().invoke(main, args + ["--dtype", "fp8", "--distributed-optimizer"])
    assert r.exit_code == 0, r.output
    problem = gpuplan.load_plan(tmp_path / "p.json").problem
    assert problem["dtype"] == "fp8" and problem["distributed_optimizer"] is True  # type: ignore[index]
    r = CliRunner().invoke(main, args + ["--no-distributed-optimizer"])
    assert r.exit_code == 2 and "needs" in r.output and "GiB per device" in r.output
    r = CliRunner().invoke(main, ["solve", "poseidon", "dgx-a100x4", "llama2-7b", "--batch", "64", "--seq", "2048",
                                  "--dtype", "fp8", "-o", str(tmp_path / "q.json")])
    assert r.exit_code == 2 and "field 'dtype'" in r.output and "A100-80GB" in r.output
    assert not (tmp_path / "q.json").exists()


def test_the_cli_offers_every_dtype_the_problem_takes() -> None:
    import typing

    from gpuplan.commands.poseidon import TRAINING_DTYPES

    assert set(TRAINING_DTYPES) == set(typing.get_args(P.PoseidonProblem.model_fields["dtype"].annotation))
