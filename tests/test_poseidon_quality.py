"""Poseidon's solver quality: interleaved stages chosen by the search (with valid bounds), TP degrees
check rejects, clear errors for bad inputs, the Metis baseline."""

from __future__ import annotations

import pytest

from gpuplan import api
from gpuplan.models import poseidon as P
from gpuplan.models.workload import model_config, scaled
from gpuplan.solvers import poseidon as SP

F_S, B_S = 2e-3, 4e-3  # measured seconds of one block's forward / backward (micro-batch 1)


def uniform_problem(**extra: object) -> P.PoseidonProblem:
    """8 L4s in one node, a 32-layer model that needs many stages, 8 micro-batches: every block costs
    F_S / B_S (a measured table, embedding and head free), sends are free (an ideal intra-node link)."""
    cfg = scaled(model_config("gpt3-2.7b"), num_layers=32)
    costs = [{"device_type": "L4", "part": part, "micro_batch": 1, "seq_len": 1024, "tp": 1,
              "forward_s": f, "backward_s": b, "activation_bytes": 0}
             for part, f, b in (("layer", F_S, B_S), ("embedding", 0.0, 0.0), ("head", 0.0, 0.0))]
    doc = {"kind": "poseidon",
           "cluster": {"nodes": [{"name": "n0", "gpus": {"L4": 8},
                                  "intra_link": {"bandwidth_GBps": 1e7, "latency_s": 0}}]},
           "model": cfg.model_dump(), "global_batch": 8, "seq_len": 1024, "max_tp": 1,
           "layer_costs": {"model": cfg.name, "config": cfg.model_dump(), "dtype": "bf16", "costs": costs},
           **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


def test_search_chooses_interleaving_where_it_pays_and_its_time_is_the_closed_form() -> None:
    prob = uniform_problem()
    plan = api.solve(prob, solver="poseidon")
    assert api.check(prob, plan) == []
    S, m, v = len(plan.stages), plan.num_microbatches, plan.interleave
    assert v > 1 and S > 1 and m % S == 0
    assert all(s.num_layers % v == 0 for s in plan.stages)
    n = plan.stages[0].num_layers
    assert all(s.num_layers == n for s in plan.stages)  # uniform: an even split
    fc, bc = n * F_S / v, n * B_S / v  # one chunk's forward / backward
    assert all(s.recompute == "none" for s in plan.stages)
    assert plan.stages[1].forward_s == pytest.approx(n * F_S) and plan.stages[1].backward_s == pytest.approx(n * B_S)
    # Megatron's interleaved 1F1B: (m v + S - 1) chunk slots of forward + backward on stage 0, whose
    # last backward ends the pipeline; stage s ends s chunk-backwards earlier, then runs its tail
    pipeline_s = (m * v + S - 1) * (fc + bc)
    tails = [s.allreduce_s + s.optimizer_s for s in plan.stages]
    closed = max(pipeline_s - s * bc + tails[s] for s in range(S))
    assert plan.iteration_time_s == pytest.approx(closed, rel=1e-6)
    # and it beats the same stages without interleaving (closed form (m + S - 1) (f + b) + tail)
    plain = P.evaluate(P.CostModel(prob), P.shapes_of(plan), [s.num_layers for s in plan.stages], m)
    assert plain.iteration_time_s > plan.iteration_time_s * 1.05


def test_interleaved_bounds_are_lower_bounds_of_every_even_mapping() -> None:
    prob = uniform_problem(max_tp=2)
    cm = P.CostModel(prob)
    seen = 0
    for combo in SP.combos(prob):
        for st in SP.structures(prob, cm, combo, interleaved=True):
            if st.v == 1 or not st.feasible():
                continue
            layers = SP.classic_layers(prob.model.num_layers, st.S, st.v)
            t = st.time(layers)
            if t == float("inf"):
                continue
            seen += 1
            assert st.lower_bound() <= t * (1 + 1e-9)
            assert st.lp_bound() <= t * (1 + 1e-9)
            assert st.cut_bound(layers) <= t * (1 + 1e-9)
            assert SP.combo_bound(cm, combo) <= t * (1 + 1e-9)
            ev = P.evaluate(cm, st.shapes, layers, st.m, interleave=st.v)
            assert ev.iteration_time_s == pytest.approx(t, rel=1e-9)
    assert seen > 0


def test_no_interleave_when_the_space_forbids_it() -> None:
    prob = uniform_problem(max_interleave=1)
    plan = api.solve(prob, solver="poseidon")
    assert plan.interleave == 1 and api.check(prob, plan) == []
    assert SP.interleaves(prob, 8, 8) == []
    prob = uniform_problem()
    assert SP.interleaves(prob, 8, 4) == []  # micro-batches not a multiple of the stages
    assert SP.interleaves(prob, 8, 8) == [2, 4]  # 32 layers: 4 per stage, v divides it
