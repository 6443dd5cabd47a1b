"""Partial full recomputation ("full:K": K of a stage's blocks re-run their forward in the backward, the
others keep their activations; Megatron's --recompute-method block): its memory and time against the
formulas, the fewest blocks that fit chosen under "auto", the search equal to the exhaustive reference
on a memory-bound instance, check's limits, the config path and both exports."""

from __future__ import annotations

import math

import pytest

import gpuplan
from gpuplan.models.poseidon import (CostModel, StageShape, auto_recompute, partial_blocks, recompute_label,
                                     recomputed_blocks, stage_cost, stage_memory)

# llama2-13b on 40 GB A100s: 20 blocks per stage do not fit without recomputation at the first stage
TIGHT = {"kind": "poseidon", "cluster": {"gpus": {"A100-40GB": 16}, "gpus_per_node": 8}, "model": "llama2-13b",
         "global_batch": 64, "seq_len": 4096, "distributed_optimizer": True}


def _stage(problem):  # type: ignore[no-untyped-def]
    cm = CostModel(problem)
    return cm, StageShape("A100-40GB", 2, 4, tuple(range(8)), ("node0",))


@pytest.mark.parametrize("text, label", [("full:5", "full:5"), (" FULL:05 ", "full:5"), ("full", "full"),
                                         (True, "full"), (False, "none"), ("selective", "selective")])
def test_labels(text: object, label: str) -> None:
    assert recompute_label(text) == label
    assert partial_blocks(text) == (5 if label == "full:5" else 0)


@pytest.mark.parametrize("bad", ["full:0", "full:-1", "full:x", "partial", "none:3", 3])
def test_bad_labels_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="full:K"):
        recompute_label(bad)


def test_memory_and_time_follow_the_block_counts() -> None:
    problem = gpuplan.load_problem(TIGHT)
    cm, sh = _stage(problem)
    n, b, S, m = 20, 2, 2, 8
    none = stage_memory(cm, sh, n, b, 0, S, m, "none")
    full = stage_memory(cm, sh, n, b, 0, S, m, "full")
    act_none, act_full = cm.activation_bytes(sh.tp, b, "none"), cm.activation_bytes(sh.tp, b, "full")
    flight = 2  # 1F1B: stage 0 of 2 holds two micro-batches
    assert full == pytest.approx(none - flight * n * (act_none - act_full) + act_none, rel=1e-12)
    for k in (1, 7, 19):
        mem = stage_memory(cm, sh, n, b, 0, S, m, f"full:{k}")
        assert mem == pytest.approx(none + act_none - flight * k * (act_none - act_full), rel=1e-12)
        c = stage_cost(cm, sh, n, b, 0, S, m, f"full:{k}")
        plain = stage_cost(cm, sh, n, b, 0, S, m, "none")
        assert c.backward_s - plain.backward_s == pytest.approx(k * cm.recompute_s(sh.device_type, sh.tp, b, "full"),
                                                                rel=1e-9)
        assert c.forward_s == plain.forward_s
    assert stage_memory(cm, sh, n, b, 0, S, m, "full:20") == stage_memory(cm, sh, n, b, 0, S, m, "full")
    assert recomputed_blocks("full:30", n) == n


@pytest.mark.parametrize("v", [1, 2])
def test_auto_recomputes_the_fewest_blocks_that_fit(v: int) -> None:
    problem = gpuplan.load_problem(TIGHT)
    cm, sh = _stage(problem)
    cap = cm.dev(sh.device_type).memory_bytes * problem.memory_fraction
    n, b, S, m = 20, 2, 2, 8
    assert stage_memory(cm, sh, n, b, 0, S, m, "none", v) > cap  # something must be recomputed
    label, mem = auto_recompute(cm, sh, n, b, 0, S, m, v)
    assert label.startswith("full:") and mem <= cap
    k = recomputed_blocks(label, n)
    assert k % v == 0 and stage_memory(cm, sh, n, b, 0, S, m, f"full:{k - v}" if k > v else "none", v) > cap
    assert stage_cost(cm, sh, n, b, 0, S, m, None, v).recompute == label  # the problem's "auto"


def test_search_equals_exhaustive_and_recomputes_part_of_a_stage() -> None:
    problem = gpuplan.load_problem(TIGHT)
    plan = gpuplan.solve(problem, time_limit_s=60)
    full = gpuplan.solve(problem, solver="exhaustive", time_limit_s=120)
    assert plan.status.value == "optimal" and full.status.value == "optimal"
    assert math.isclose(plan.iteration_time_s, full.iteration_time_s, rel_tol=1e-12)
    assert any(s.recompute.startswith("full:") for s in plan.stages)
    assert gpuplan.check(problem, plan) == []
    # the same structure with every block recomputed is slower
    cfg = {"tp": 2, "pp": len(plan.stages), "dp": plan.stages[0].dp, "mb": plan.stages[0].micro_batch_size,
           "recompute": "full", "interleave": plan.interleave, "layers": [s.num_layers for s in plan.stages]}
    assert gpuplan.evaluate_config(problem, cfg).iteration_time_s > plan.iteration_time_s


def test_check_holds_k_to_the_stage_and_the_interleave() -> None:
    problem = gpuplan.load_problem(TIGHT)
    plan = gpuplan.solve(problem, time_limit_s=60)
    s = next(s for s in plan.stages if s.recompute.startswith("full:"))
    odd = plan.model_copy(deep=True)
    odd.stages[s.index].recompute = f"full:{s.num_layers + 2}"
    assert any(v.code == "recompute" for v in gpuplan.check(problem, odd))
    if plan.interleave > 1:
        odd.stages[s.index].recompute = f"full:{plan.interleave + 1}"
        assert any(v.code == "recompute" for v in gpuplan.check(problem, odd))


def test_a_fixed_configuration_names_its_blocks() -> None:
    plan = gpuplan.evaluate_config(TIGHT, "tp=2,pp=2,dp=4,mb=1,recompute=full:8")
    assert [s.recompute for s in plan.stages] == ["full:8", "full:8"]
    with pytest.raises(gpuplan.InfeasibleError, match="needs"):  # 6 blocks leave too much (fp32 gradients)
        gpuplan.evaluate_config(TIGHT, "tp=2,pp=2,dp=4,mb=1,recompute=full:6")
    assert gpuplan.check(None, plan) == []
    with pytest.raises(gpuplan.InputError, match="full:K"):
        gpuplan.evaluate_config(TIGHT, "tp=2,pp=2,dp=4,mb=1,recompute=full:0")


def test_exports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import megatron, torchtitan
    from gpuplan.export.common import recompute_strength, training_job

    assert sorted(["full", "full:3", "none", "full:12", "selective"], key=recompute_strength) == [
        "none", "selective", "full:3", "full:12", "full"]
    write_bundle(tmp_path / "b", compose(gpuplan.evaluate_config(TIGHT, "tp=2,pp=2,dp=4,mb=1,recompute=full:8"),
                                         time_limit_s=3))
    args = megatron.export(tmp_path / "b")["args"]
    at = args.index("--recompute-method")
    assert args[at + 1:at + 4] == ["block", "--recompute-num-layers", "8"]
    job = training_job(tmp_path / "b", "Megatron-LM")
    chunked = megatron.job_args(dataclasses.replace(job, interleave=2))
    assert chunked[chunked.index("--recompute-num-layers") + 1] == "4"  # Megatron counts per model chunk
    assert torchtitan.titan_checkpointing("full:6") == "full"
