"""The probe `gpuplan run` takes just before the launch (gpuplan.profiling.stage_speed): the sharing rates
of the plan's own stages, and each stage timed alone, compared with the layer table's figure for the very
same modules (the "timed stages" diagnostic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon.cost import stage_call_s
from gpuplan.profiling.stage_speed import measure_stage_speeds, rates_from
from gpuplan.runtime.poseidon import compute_ratios, contended_iteration_s, table_chunk_s
from tests.test_run_path import SLOW2X, TINY, _with_stage_calls, cpu_profile, two_types


def _solved(num_stages: int = 2) -> tuple[P.PoseidonProblem, P.PoseidonPlan]:
    deep = TINY.model_copy(update={"num_layers": 6})
    prob = P.with_profile(two_types(deep), _with_stage_calls(cpu_profile(deep, emulate=SLOW2X), 0.0007, 0.0011))
    plan = api.solve(prob, num_stages=num_stages)
    assert plan.ok
    return prob, plan


def test_the_table_figure_is_the_plans_stage_compute_without_slowdown_and_call_overhead() -> None:
    prob, plan = _solved()
    for st in plan.stages:
        ref = table_chunk_s(prob, st.device_type, st.first_layer, st.last_layer, st.micro_batch_size)
        assert ref is not None
        factor = prob.layer_costs.slowdowns.get(st.device_type, 1.0)
        of, ob = stage_call_s(prob.layer_costs, st.device_type)
        assert st.forward_s == pytest.approx(ref[0] * factor + of, rel=1e-9)
        assert st.backward_s == pytest.approx(ref[1] * factor + ob, rel=1e-9)


def test_ratios_are_the_measured_over_the_table_and_one_where_they_cannot_apply() -> None:
    prob, plan = _solved()
    refs = [table_chunk_s(prob, s.device_type, s.first_layer, s.last_layer, s.micro_batch_size) for s in plan.stages]
    now_f = [1.2 * r[0] for r in refs]
    now_b = [0.9 * r[1] for r in refs]
    for f, b in compute_ratios(prob, plan, now_f, now_b, scaled=False):
        assert (f, b) == (pytest.approx(1.2), pytest.approx(0.9))
    assert compute_ratios(prob, plan, now_f, now_b, scaled=True) == [(1.0, 1.0)] * len(plan.stages)
    assert compute_ratios(prob, plan, [0.0] * 2, now_b, scaled=False) == [(1.0, 1.0)] * len(plan.stages)
    no_table = prob.model_copy(update={"layer_costs": None})
    assert table_chunk_s(no_table, "cpu", 0, 2, 1) is None
    assert compute_ratios(no_table, plan, now_f, now_b, scaled=False) == [(1.0, 1.0)] * len(plan.stages)


@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.lists(st.floats(0.001, 1.0), min_size=3, max_size=3)),
                min_size=4, max_size=4))
def test_rates_are_each_ranks_own_speed_alone_over_together(per: list[tuple[float, list[float]]]) -> None:
    ranks = [{"solo_s": solo, "together_s": together} for solo, together in per]
    rates = rates_from(ranks)
    assert len(rates) == 4 and rates[0] == 1.0
    for k in range(2, 5):
        got = sorted(ranks[r]["solo_s"] / ranks[r]["together_s"][k - 2] for r in range(k))
        assert got[0] <= rates[k - 1] <= got[-1]


def test_a_faster_stage_measured_before_the_run_shortens_the_prediction_by_its_share() -> None:
    prob, plan = _solved()
    S, m = len(plan.stages), plan.num_microbatches
    fwd, bwd = [s.forward_s for s in plan.stages], [s.backward_s for s in plan.stages]
    factors = [prob.layer_costs.slowdowns.get(s.device_type, 1.0) for s in plan.stages]
    p2p, tails = [s.p2p_s for s in plan.stages], [s.allreduce_s + s.optimizer_s for s in plan.stages]
    base = contended_iteration_s(fwd, bwd, p2p, tails, m, plan.schedule, factors, [1.0] * S)
    slower = contended_iteration_s([f * 1.25 for f in fwd], [b * 1.25 for b in bwd], p2p, tails, m, plan.schedule,
                                   factors, [1.0] * S)
    # every op 25 % longer: the iteration grows by less than 25 % (sends and tails stay) and by more than 0
    assert base < slower <= base * 1.25 + 1e-12


def test_the_probe_refuses_layer_ranges_outside_the_model_and_too_many_ranks() -> None:
    with pytest.raises(ValueError, match="layer range"):
        measure_stage_speeds(TINY, [[(0, 9)]], micro_batch=1, seq_len=16)
    with pytest.raises(ValueError, match="ranks"):
        measure_stage_speeds(TINY, [], micro_batch=1, seq_len=16)
    with pytest.raises(ValueError, match="micro-batch"):
        measure_stage_speeds(TINY, [[(0, 2)], [(2, 4)]], micro_batch=[1], seq_len=16)


@pytest.mark.slow
def test_the_probe_times_each_ranks_own_chunks() -> None:
    deep = TINY.model_copy(update={"num_layers": 6})
    got = measure_stage_speeds(deep, [[(0, 1)], [(1, 5)], [(5, 6)]], micro_batch=2, seq_len=16, window_s=0.1)
    assert len(got.forward_s) == 3 and [len(c) for c in got.forward_s] == [1, 1, 1]
    assert got.rates[0] == 1.0 and len(got.rates) == 3 and all(0 < r <= 3 for r in got.rates)
    # four blocks take longer than the embedding and one block on the same micro-batch
    assert got.forward_s[1][0] > 1.5 * got.forward_s[0][0] > 0
    assert got.backward_s[1][0] > 1.5 * got.backward_s[0][0] > 0
