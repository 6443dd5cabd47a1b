"""FSDP (ZeRO-3) in Poseidon's model: memory of the shards and the working blocks, per-block gathers and
reduce-scatters beside the compute, no gradient all-reduce, the step on the shard; the search and a
fixed configuration agree; torchtitan gets the shard degree and Megatron-LM's export refuses."""

from __future__ import annotations

import math

import pytest

import gpuplan
from gpuplan import api
from gpuplan.models import collectives
from gpuplan.models.poseidon import FSDP_REDUCE_BYTES, CostModel, StageShape

SLOW = {"gpus": {"A100-80GB": 16}, "gpus_per_node": 8, "inter_node": {"bandwidth_GBps": "10 Gbps", "latency_s": "5 us"}}


def _doc(fsdp: bool, cluster: dict = SLOW, model: str = "llama3-8b") -> dict:  # type: ignore[type-arg]
    return {"kind": "poseidon", "cluster": cluster, "model": model, "global_batch": 32, "seq_len": 4096,
            "fsdp": fsdp}


def _config(plan) -> dict:  # type: ignore[no-untyped-def, type-arg]
    st = plan.stages
    return {"tp": st[0].tp, "pp": len(st), "dp": st[0].dp, "mb": st[0].micro_batch_size,
            "recompute": [s.recompute for s in st], "interleave": plan.interleave, "layers": [s.num_layers for s in st]}


def test_fsdp_shards_weights_gradients_and_states_and_holds_two_blocks_unsharded() -> None:
    cfg = "tp=1,pp=1,dp=16,mb=1,recompute=full"
    sharded = gpuplan.evaluate_config(_doc(True), cfg, check_memory=False)
    replicated = gpuplan.evaluate_config(_doc(False), cfg, check_memory=False)
    problem = api.plan_problem(sharded)
    cfg_model = problem.model
    params = cfg_model.total_params() if hasattr(cfg_model, "total_params") else None
    # the difference is the shards: replicated, 2 B weight + 4 B gradient (fp32: Megatron's bf16 default) +
    # 12 B states per parameter, against FSDP2's 16 B over 16 (a 4 B fp32 shard with its fp32 gradient and
    # two moments), less the working set: two blocks' 16-bit weights and one block's fp32 gradient
    cm = CostModel(problem)
    stage_params = cm.stage_params(32, True, True, 1)
    working = cfg_model.layer_params() * (2 * 2 + FSDP_REDUCE_BYTES)
    saved = replicated.stages[0].memory_bytes - sharded.stages[0].memory_bytes
    assert saved == pytest.approx(stage_params * (18 - 16 / 16) - working, rel=1e-9)
    assert params is None or stage_params == pytest.approx(params, rel=0.01)


def test_fsdp_blocks_are_as_slow_as_their_gathers_on_a_slow_network() -> None:
    # 10 Gb/s between two nodes: each block's gather (bf16 weights over 16 replicas) outlasts its compute,
    # so the forward is one gather per block plus the first block's, exposed
    plan = gpuplan.evaluate_config(_doc(True), "tp=1,pp=1,dp=16,mb=1,recompute=none")
    problem = api.plan_problem(plan)
    cm = CostModel(problem)
    elems = problem.model.layer_params()
    ag = collectives.collective_time_s(problem.cluster, "all_gather", elems * 2, list(range(16)), 2)
    rs = collectives.collective_time_s(problem.cluster, "reduce_scatter", elems * 4, list(range(16)), 2)
    f, g = cm.layer("A100-80GB", 1, 1)
    assert ag > f and ag + rs > g  # communication-bound at this bandwidth
    ef, eg = cm.extras("A100-80GB", 1, 1, True, True)
    st = plan.stages[0]
    assert st.forward_s == pytest.approx(32 * ag + ef + ag, rel=1e-9)
    assert st.backward_s == pytest.approx(32 * (ag + rs) + eg + rs, rel=1e-9)
    assert st.allreduce_s == 0.0  # no gradient all-reduce: the reduce-scatters ran per block
    # the optimizer steps on the 1/16 shard of every byte it moves
    replicated = gpuplan.evaluate_config(_doc(False), "tp=1,pp=1,dp=16,mb=1,recompute=none", check_memory=False)
    per = cm.optimizer_step_bytes_per_param()
    assert st.optimizer_s == pytest.approx(replicated.stages[0].optimizer_s / 16, rel=1e-9) and per > 0


def test_fsdp_costs_no_communication_without_data_parallelism() -> None:
    # no gathers, reduce-scatters or copies at dp 1; the one difference left is FSDP2's gradient path: the
    # weight-gradient GEMMs write 16-bit gradients instead of accumulating into fp32 main gradients
    one = {"gpus": {"A100-80GB": 8}, "gpus_per_node": 8}
    a = gpuplan.evaluate_config(_doc(True, one), "tp=8,pp=1,dp=1,mb=1,recompute=none")
    b = gpuplan.evaluate_config(_doc(False, one), "tp=8,pp=1,dp=1,mb=1,recompute=none")
    assert a.stages[0].allreduce_s == b.stages[0].allreduce_s == 0.0
    assert 0.97 * b.iteration_time_s < a.iteration_time_s < b.iteration_time_s
    cm = CostModel(api.plan_problem(a))
    shape = next(iter(cm.p.cluster.devices)).type
    assert cm.fsdp_layer_s(StageShape(shape, 8, 1, tuple(range(8)), ("n0",))) == (0.0, 0.0)


@pytest.mark.parametrize("bandwidth", ["10 Gbps", "400 Gbps"])
def test_the_search_and_a_fixed_configuration_agree_under_fsdp(bandwidth: str) -> None:
    cluster = dict(SLOW, inter_node={"bandwidth_GBps": bandwidth, "latency_s": "5 us"})
    doc = _doc(True, cluster)
    plan = api.solve(api.load_problem(doc), solver="poseidon", time_limit_s=60)
    assert api.check(api.plan_problem(plan), plan) == []
    fixed = gpuplan.evaluate_config(doc, _config(plan))
    assert fixed.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-9)
    # the search is exact: no fixed configuration in its space beats it (exhaustive reference)
    exhaustive = api.solve(api.load_problem(doc), solver="exhaustive", time_limit_s=120)
    assert plan.iteration_time_s <= exhaustive.iteration_time_s * (1 + 1e-9)


def test_fsdp_in_the_config_text_and_its_assumption_line() -> None:
    from gpuplan.commands.poseidon import assumptions

    plan = gpuplan.evaluate_config(_doc(False), "tp=1,pp=1,dp=16,mb=1,zero3=true")
    problem = api.plan_problem(plan)
    assert problem.fsdp and "FSDP" in assumptions(problem)
    assert not math.isinf(plan.iteration_time_s)


def test_exports_of_an_fsdp_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import ExportRefused, megatron, torchtitan

    one_node = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]},
                "model": "gpt3-1.3b", "global_batch": 16, "seq_len": 1024, "fsdp": True}
    bundle = tmp_path / "bundle"
    write_bundle(bundle, compose(gpuplan.evaluate_config(one_node, "tp=1,pp=2,dp=2,mb=1,recompute=none"),
                                 time_limit_s=3))
    args = torchtitan.export(bundle, tmp_path / "tt", config="llama3:llama3_debugmodel")["args"]
    assert args[args.index("--parallelism.data_parallel_shard_degree") + 1] == "2"
    assert args[args.index("--parallelism.data_parallel_replicate_degree") + 1] == "1"
    with pytest.raises(ExportRefused, match="FSDP, ZeRO-3"):
        megatron.export(bundle)


def test_torchtitans_published_fsdp_runs_fit_the_models_memory(fidelity_training) -> None:  # type: ignore[no-untyped-def]
    """The FSDP runs torchtitan published (fidelity (a)) ran, so they must fit in the model's memory, and
    their predictions stay within a factor of two of the published throughput."""
    import yaml

    F = fidelity_training
    doc = yaml.safe_load(F.DATA.read_text(encoding="utf-8"))
    lines, ratios = F.titan_lines(doc)
    assert len(ratios) == len(doc["titan_runs"]) == 5
    assert all(0.5 < r < 2.0 for r in ratios) and not any(line.endswith("OVER") for line in lines)


def test_the_mpt_crosscheck_evaluates_every_row(fidelity_training) -> None:  # type: ignore[no-untyped-def]
    """fidelity_training --crosscheck: each llm-foundry row is a valid FSDP problem whose prediction stays
    within a factor of two of the published throughput (the rows are printed, not judged)."""
    import yaml

    F = fidelity_training
    doc = yaml.safe_load(F.DATA.read_text(encoding="utf-8"))
    lines = F.crosscheck_lines(doc)
    rows = lines[2:]
    assert len(rows) == len(doc["mpt_crosscheck"]["runs"])
    assert all(0.5 < float(line.split()[-1]) < 2.0 for line in rows)


def test_lagom_gets_fsdps_gathers_and_reduce_scatters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The composed plan hands Lagom FSDP's own collectives: per micro-batch, every block's weight gather
    beside the forward and the backward and its fp32 gradient reduce-scatter beside the backward; no
    all-reduce. `gpuplan plan` composes and checks such a bundle."""
    from gpuplan.compose import check_bundle, compose, write_bundle
    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    plan = gpuplan.evaluate_config(_doc(True), "tp=2,pp=2,dp=4,mb=1,recompute=full")
    ops = {o["name"]: o for o in workload_from_poseidon(plan.model_dump(mode="json"))["ops"]}
    m = plan.num_microbatches
    elems = api.plan_problem(plan).model.layer_params() / 2
    assert not any(o["collective"] == "all_reduce" and o["group"] == "dp" for o in ops.values())
    for j in range(m):
        assert ops[f"fsdp-gather-fwd-mb{j}"]["overlaps"] == f"fwd-mb{j}"
        assert ops[f"fsdp-gather-bwd-mb{j}"]["size_bytes"] == elems * 2
        assert ops[f"fsdp-grads-mb{j}"]["size_bytes"] == elems * FSDP_REDUCE_BYTES
        assert ops[f"fsdp-grads-mb{j}"]["collective"] == "reduce_scatter"
    bundle = tmp_path / "bundle"
    write_bundle(bundle, compose(plan, time_limit_s=5))
    assert check_bundle(bundle) == []


def test_plan_train_takes_the_data_parallel_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`gpuplan plan train --fsdp` (and --dtype, --distributed-optimizer) plans under those settings, so
    the one-command path reaches what `solve poseidon` does."""
    import json

    from click.testing import CliRunner

    from gpuplan.cli import main

    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["plan", "train", "dgx-h100x2", "llama3-8b", "--batch", "32", "--seq", "2048",
                                  "--fsdp", "--time-limit", "10", "-o", str(out)])
    assert r.exit_code == 0, r.output
    problem = json.loads((out / "poseidon.json").read_text())["problem"]
    assert problem["fsdp"] is True and problem.get("distributed_optimizer", False) is False
    r = CliRunner().invoke(main, ["plan", "train", "dgx-h100x2", "llama3-8b", "--batch", "32", "--seq", "2048",
                                  "--dtype", "fp8", "--distributed-optimizer", "--time-limit", "10",
                                  "-o", str(tmp_path / "b2")])
    assert r.exit_code == 0, r.output
    problem = json.loads((tmp_path / "b2" / "poseidon.json").read_text())["problem"]
    assert problem["dtype"] == "fp8" and problem["distributed_optimizer"] is True and not problem.get("fsdp")
