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


# ------------------------------------------------------------------------------------------------
# check rejects TP degrees that split neither the heads nor the node; bad inputs get clear errors
# ------------------------------------------------------------------------------------------------

def _h100_problem(**extra: object) -> P.PoseidonProblem:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 8}, "gpus_per_node": 8}, "model": "llama2-7b",
           "global_batch": 12, "seq_len": 2048, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


@pytest.mark.parametrize("tp", [3, 6])
def test_check_rejects_a_tp_that_divides_neither_the_node_nor_the_heads(tp: int) -> None:
    prob = _h100_problem()
    ids = tuple(range(tp))
    shapes = [P.StageShape("H100", tp, 1, ids, ("H100-0",))]
    plan = P.make_plan(prob, shapes, [prob.model.num_layers], 12)  # times recomputed consistently
    kinds = {v.code for v in P.check(prob, plan)}
    assert "tp_divides" in kinds
    why = next(v.message for v in P.check(prob, plan) if v.code == "tp_divides")
    assert f"tp {tp}" in why and "32 attention heads" in why


def test_check_rejects_a_tp_that_divides_the_heads_but_not_the_node() -> None:
    prob = api.load_problem({"kind": "poseidon", "model": "llama2-7b", "global_batch": 12, "seq_len": 2048,
                             "cluster": {"nodes": [{"name": "a", "gpus": {"H100": 6}}]}}, "poseidon")
    shapes = [P.StageShape("H100", 4, 1, (0, 1, 2, 3), ("a",))]
    plan = P.make_plan(prob, shapes, [prob.model.num_layers], 12)
    why = [v.message for v in P.check(prob, plan) if v.code == "tp_divides"]
    assert why and "node's GPU count (6" in why[0]


def test_search_never_produces_a_tp_the_heads_do_not_allow() -> None:
    cfg = scaled(model_config("gpt3-1.3b"), num_layers=8).model_copy(
        update={"heads": 12, "kv_heads": None, "head_dim": 128})  # 12 heads of 128: no tp 8
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 8}, "gpus_per_node": 8}, "model": cfg.model_dump(),
           "global_batch": 16, "seq_len": 1024}
    prob = api.load_problem(doc, "poseidon")
    assert all(12 % o.tp == 0 for os in SP.type_options(prob).values() for o in os)  # no tp 8
    plan = api.solve(prob, solver="poseidon")
    assert api.check(prob, plan) == [] and all(12 % s.tp == 0 for s in plan.stages)


@pytest.mark.parametrize("cluster", [{"gpus": {"H100": 0}}, {"nodes": []},
                                     {"nodes": [{"name": "empty", "gpus": {"H100": 0}}]}])
def test_a_cluster_without_gpus_is_a_clear_error(cluster: dict) -> None:
    from gpuplan.errors import InputError

    with pytest.raises(InputError, match="at least one GPU") as exc:
        api.load_problem({"kind": "poseidon", "cluster": cluster, "model": "llama2-7b", "global_batch": 8,
                          "seq_len": 1024}, "poseidon")
    assert "cluster" in str(exc.value)


def test_a_sequence_above_the_models_maximum_is_refused() -> None:
    from gpuplan.errors import InputError

    with pytest.raises(InputError, match="seq_len.*4096 tokens for llama2-7b, not 8192"):
        _h100_problem(seq_len=8192)


def test_a_prime_batch_above_max_microbatches_names_the_microbatch_space() -> None:
    from gpuplan.errors import InfeasibleError

    prob = _h100_problem(global_batch=1031)
    with pytest.raises(InfeasibleError, match="micro-batch space.*global_batch 1031.*max_microbatches 1024"):
        SP.solve_poseidon(prob, progress=lambda *a: None)
    assert "micro-batch" not in SP._why_infeasible(_h100_problem(global_batch=1024))  # a real memory reason


# ------------------------------------------------------------------------------------------------
# The Metis baseline follows Metis' balancer: embedding and head costed as layers
# ------------------------------------------------------------------------------------------------

def test_metis_partition_counts_the_embedding_and_head_as_layers() -> None:
    """Two equal stages: Metis' balancer splits its L + 2 layers evenly, so the stage that also holds
    the (costly, large-vocabulary) head gets fewer blocks than a split of the blocks alone."""
    cfg = scaled(model_config("qwen3-1.7b"), num_layers=10)
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 2}, "gpus_per_node": 2}, "model": cfg.model_dump(),
           "global_batch": 8, "seq_len": 2048, "max_tp": 1}
    prob = api.load_problem(doc, "poseidon")
    cm = P.CostModel(prob)
    opt = next(o for o in SP.type_options(prob)["H100"] if o.stages == 2)
    st = SP.Structure(cm, list(opt.shapes), 8)
    w = SP._metis_unit_costs(st)
    assert w[1][-1] > w[1][1] > 0  # the head costs more than one block
    n = SP.metis_partition(st)
    assert sum(n) == cfg.num_layers and n[0] > n[1]
    units = [n[0] + 1, n[1] + 1]
    times = [sum(w[0][:units[0]]), sum(w[1][units[0]:])]
    # no single move of a block across the boundary that leaves each stage a block lowers the slower
    # stage (the local moves' fixpoint)
    moves = [units[0] + d for d in (-1, 1) if 2 <= units[0] + d <= len(w[0]) - 2]
    for cut in moves:
        assert max(times) <= max(sum(w[0][:cut]), sum(w[1][cut:])) + 1e-15


# ------------------------------------------------------------------------------------------------
# The process pool keeps the optimum
# ------------------------------------------------------------------------------------------------

def test_process_pool_search_finds_the_serial_optimum_and_accounts_for_every_structure() -> None:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"A100-80GB": 4, "V100": 4, "T4": 4}, "gpus_per_node": 4,
                                           "inter_node": {"bandwidth_GBps": "50 Gbps"}},
           "model": scaled(model_config("gpt3-1.3b"), num_layers=8).model_dump(), "global_batch": 16,
           "seq_len": 1024, "max_stages": 6, "max_microbatches": 8}
    prob = api.load_problem(doc, "poseidon")
    serial = api.solve(prob, solver="poseidon", workers=1)
    pooled = api.solve(prob, solver="poseidon", workers=2)
    assert pooled.iteration_time_s == pytest.approx(serial.iteration_time_s, rel=1e-12)
    assert pooled.status == serial.status and api.check(prob, pooled) == []
    st = pooled.solver.stats
    assert st["evaluated"] + st["pruned"] + st["infeasible"] + st["unvisited"] == st["structures"]
    assert st["structures"] == serial.solver.stats["structures"] == SP.count_structures(prob)
    assert "2 processes" in str(st["best_from"])
