"""Tessel execution: action lists, the deadlock/dependency checker, and runs under torch pipelining."""

from __future__ import annotations

import pytest

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.models.tessel import TesselProblem
from gpuplan.runtime import tessel_actions as acts


SMALL = {"hidden": 64, "seq": 32, "microbatch_size": 2}  # a small GPT keeps the runs fast


def problem(shape: str, p: int, m: int) -> TesselProblem:
    return api.load_problem({"kind": "tessel", "microbatches": m,  # type: ignore[return-value]
                             "shape": {"name": shape, "devices": p, "backward_s": 1.0, "backward_weight_s": 1.0}})


def test_export_compute_only_and_with_comms_pass_the_checker() -> None:
    prob = problem("vshape", 2, 4)
    plan = api.solve(prob, solver="tessel")
    ranks = acts.stage_ranks(prob)
    assert ranks == {0: 0, 1: 1, 2: 1, 3: 0}
    compute = acts.compute_only(prob, plan)
    assert sorted(compute) == [0, 1] and compute[0][0] == "0F0"
    assert sum(len(v) for v in compute.values()) == 4 * 3 * 4  # 4 stages x (F, I, W) x 4 micro-batches
    acts.check_actions(compute, ranks, 4)
    full = acts.with_comms(compute, ranks, 4)
    acts.check_actions(full, ranks, 4)
    assert "0REDUCE_GRAD" in full[0] and "3REDUCE_GRAD" in full[0]
    assert full[1].index("1RECV_F0") < full[1].index("1F0")
    assert acts.csv_text(compute).count("\n") == 2


def test_checker_catches_a_hand_made_deadlock() -> None:
    ranks = {0: 0, 1: 1}
    # rank 0 waits for stage 1's backward before its forward can leave: a cycle
    lists = {0: ["0F0", "0RECV_B0", "0B0", "0SEND_F0"], 1: ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]}
    with pytest.raises(acts.ActionListError, match=r"deadlock: rank 0 blocks at 0B0 waiting for 1SEND_B0; "
                                                   r"rank 1 blocks at 1F0 waiting for 0SEND_F0"):
        acts.check_actions(lists, ranks, 1)
    # the same compute order without explicit comms runs
    acts.check_actions({0: ["0F0", "0B0"], 1: ["1F0", "1B0"]}, ranks, 1)


def test_checker_catches_dependency_order_and_count_errors() -> None:
    ranks = {0: 0, 1: 1}
    with pytest.raises(acts.ActionListError, match="rank 1 blocks at 1W0 waiting for 1I0"):
        acts.check_actions({0: ["0F0", "0I0", "0W0"], 1: ["1F0", "1W0", "1I0"]}, ranks, 1)
    with pytest.raises(acts.ActionListError, match="needs one F and one B"):
        acts.check_actions({0: ["0F0", "0B0"], 1: ["1F0"]}, ranks, 1)
    with pytest.raises(acts.ActionListError, match="stage 1 lives on rank 1"):
        acts.check_actions({0: ["0F0", "0B0", "1F0", "1B0"], 1: []}, ranks, 1)
    # receives posted in another order than the peer sends: tensors would be swapped
    swapped = {0: ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
               1: ["1RECV_F1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]}
    with pytest.raises(acts.ActionListError, match="swapped"):
        acts.check_actions(swapped, ranks, 2)


def test_multi_device_blocks_are_refused_by_run() -> None:
    prob = api.load_problem({"kind": "tessel", "microbatches": 2,
                             "shape": {"name": "tp_pp", "devices": 2}})
    plan = api.solve(prob, solver="tessel")
    with pytest.raises(InputError, match="Tin, Tout, TBout, TBin span several devices"):
        api.run(plan, prob)


def test_torch_version_gate() -> None:
    from gpuplan.runtime import torch_pipelining as tp

    assert tp.check_version().startswith("2.13")


@pytest.mark.slow
@pytest.mark.parametrize("shape,p,fmt", [("vshape", 2, "compute_comms"), ("1f1b", 2, "compute_only")])
def test_exported_schedule_runs_and_gradients_match_one_process(shape: str, p: int, fmt: str) -> None:
    prob = problem(shape, p, 4)
    plan = api.solve(prob, solver="tessel")
    out = api.run(plan, prob, steps=1, format=fmt, check_grads=True, timeout_s=120, **SMALL)
    assert out["max_grad_diff"] <= 1e-6
    assert out["measured_step_s"] > 0 and out["predicted_step_s"] > 0
    assert 4.0 < out["loss"] < 7.0  # cross-entropy near ln(256) for an untrained model


@pytest.mark.slow
def test_zero_bubble_schedule_runs_on_four_processes() -> None:
    prob = problem("1f1b", 4, 4)
    plan = api.solve(prob, solver="zb-h1")
    out = api.run(plan, prob, steps=1, check_grads=True, timeout_s=120, **SMALL)
    assert out["max_grad_diff"] <= 1e-6
