"""Poseidon: the DAG time model, check, the pruned search against exhaustive search, baselines, CLI."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.models import poseidon as P
from gpuplan.models.plan import Status
from gpuplan.models.workload import model_config, scaled
from gpuplan.registry import no_progress
from gpuplan.solvers import poseidon as SP


def small_problem(types: dict[str, int], layers: int = 8, batch: int = 16, per_node: int = 2,
                  **extra: object) -> P.PoseidonProblem:
    cfg = scaled(model_config("gpt3-350m"), num_layers=layers)
    doc = {"kind": "poseidon", "cluster": {"gpus": types, "gpus_per_node": per_node,
                                           "inter_node": {"bandwidth_GBps": "50 Gbps"}},
           "model": cfg.model_dump(), "global_batch": batch, "seq_len": 1024, "max_stages": 4,
           "max_microbatches": 8, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


# ---- the DAG model --------------------------------------------------------------------------

@pytest.mark.parametrize("S, m", [(1, 1), (2, 4), (4, 4), (4, 8), (3, 7)])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_dag_matches_closed_form_on_homogeneous_pipelines(S: int, m: int, schedule: str) -> None:
    F, B, tail = 1.5, 3.0, 0.25
    g = P.build_dag([F] * S, [B] * S, [0.0] * (S - 1), [tail] * S, m, schedule)
    expect = (m + S - 1) * (F + B) + tail  # (m-1)(F+B) + S(F+B): the 1F1B / GPipe closed form
    assert P.dag_longest_path_s(g) == pytest.approx(expect)
    assert P.iteration_time_fast([F] * S, [B] * S, [0.0] * (S - 1), [tail] * S, m, schedule) == pytest.approx(expect)


def test_dag_one_microbatch_pays_every_send_twice() -> None:
    S, F, B, c = 4, 1.0, 2.0, 0.5
    t = P.dag_longest_path_s(P.build_dag([F] * S, [B] * S, [c] * (S - 1), [0.0] * S, 1))
    assert t == pytest.approx(S * (F + B) + 2 * (S - 1) * c)


@settings(max_examples=25, deadline=None)
@given(S=st.integers(1, 5), m=st.integers(1, 9), schedule=st.sampled_from(["1f1b", "gpipe"]),
       data=st.data())
def test_fast_walk_equals_networkx_longest_path(S: int, m: int, schedule: str, data: st.DataObject) -> None:
    vals = st.floats(0.0, 5.0, allow_nan=False)
    f = data.draw(st.lists(vals, min_size=S, max_size=S))
    b = data.draw(st.lists(vals, min_size=S, max_size=S))
    c = data.draw(st.lists(vals, min_size=S - 1, max_size=S - 1))
    t = data.draw(st.lists(vals, min_size=S, max_size=S))
    nx_t = P.dag_longest_path_s(P.build_dag(f, b, c, t, m, schedule))
    assert P.iteration_time_fast(f, b, c, t, m, schedule) == pytest.approx(nx_t, rel=1e-12, abs=1e-12)


# ---- check ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def solved() -> tuple[P.PoseidonProblem, P.PoseidonPlan]:
    prob = small_problem({"A100-80GB": 4, "V100": 4})
    plan = api.solve(prob)
    assert plan.status is Status.OPTIMAL and len(plan.stages) >= 2
    return prob, plan  # type: ignore[return-value]


def test_solved_plan_passes_check_and_round_trips(solved, tmp_path) -> None:
    prob, plan = solved
    assert api.check(prob, plan) == []
    plan.save(tmp_path / "p.json")
    again = api.load_plan(tmp_path / "p.json")
    assert again.stages == plan.stages and api.check(None, again) == []


def _edit(plan: P.PoseidonPlan, stage: int, **fields: object) -> P.PoseidonPlan:
    stages = [s.model_copy(update=fields) if s.index == stage else s for s in plan.stages]
    return plan.model_copy(update={"stages": stages})


def test_check_rejects_overlapping_devices(solved) -> None:
    prob, plan = solved
    bad = _edit(plan, 1, gpu_ids=list(plan.stages[0].gpu_ids))
    assert "device_reused" in {v.code for v in P.check(prob, bad)}


def test_check_rejects_uncovered_layers(solved) -> None:
    prob, plan = solved
    last = plan.stages[-1]
    bad = _edit(plan, last.index, last_layer=last.last_layer - 1)
    assert "layers" in {v.code for v in P.check(prob, bad)}
    gap = _edit(plan, 1, first_layer=plan.stages[1].first_layer + 1)
    assert "layers" in {v.code for v in P.check(prob, gap)}


def test_check_rejects_memory_overflow_and_wrong_prediction(solved) -> None:
    prob, plan = solved
    tight = prob.model_copy(update={"memory_fraction": 0.02})
    assert "memory" in {v.code for v in P.check(tight, plan)}
    off = plan.model_copy(update={"iteration_time_s": plan.iteration_time_s * 0.9})
    assert {v.code for v in P.check(prob, off)} == {"predicted_time"}


def test_check_rejects_degrees_that_do_not_divide(solved) -> None:
    prob, plan = solved
    bad = _edit(plan, 0, dp=plan.stages[0].dp + 1)
    assert {"degrees", "batch"} & {v.code for v in P.check(prob, bad)}


# ---- the search -------------------------------------------------------------------------------

TYPES = ["A100-80GB", "V100", "T4", "L4", "H100"]


@settings(max_examples=15, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=2, max_size=3, unique=True),
       counts=st.lists(st.sampled_from([2, 4]), min_size=3, max_size=3),
       layers=st.integers(4, 10), batch=st.sampled_from([8, 16]), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_pruned_search_finds_the_exhaustive_optimum(types, counts, layers, batch, schedule) -> None:
    prob = small_problem(dict(zip(types, counts)), layers=layers, batch=batch, schedule=schedule)
    fast = SP.solve_poseidon(prob, progress=no_progress)
    full = SP.solve_exhaustive(prob, progress=no_progress)
    assert fast.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    stats = fast.solver.stats
    assert stats["evaluated"] <= full.solver.stats["evaluated"]
    assert stats["evaluated"] + stats["pruned"] + stats["infeasible"] == stats["structures"]


@settings(max_examples=30, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
       layers=st.integers(4, 12), data=st.data())
def test_bounds_never_exceed_the_dag_time(types, layers, data) -> None:
    prob = small_problem({t: 4 for t in types}, layers=layers)
    cm = P.CostModel(prob)
    combo = data.draw(st.sampled_from(list(SP.combos(prob))))
    structs = [s for s in SP.structures(prob, cm, combo) if s.feasible()]
    if not structs:
        return
    st_ = data.draw(st.sampled_from(structs))
    cuts = sorted(data.draw(st.lists(st.integers(1, layers - 1), min_size=st_.S - 1, max_size=st_.S - 1,
                                     unique=True)))
    n = [b - a for a, b in zip([0] + cuts, cuts + [layers])]
    t = st_.time(n)
    assert t == pytest.approx(P.evaluate(cm, st_.shapes, n, st_.m, fast=False).iteration_time_s, rel=1e-12) \
        or t == math.inf
    if t < math.inf:
        assert st_.cut_bound(n) <= t * (1 + 1e-12)
        assert st_.lower_bound() <= t * (1 + 1e-12)
        assert st_.lp_bound() <= t * (1 + 1e-12)
        assert SP.combo_bound(cm, combo) <= t * (1 + 1e-12)


def test_ridge_mapping_is_close_to_every_cut_set() -> None:
    prob = small_problem({"A100-80GB": 4, "V100": 2, "T4": 2}, layers=12)
    cm = P.CostModel(prob)
    gaps = []
    for s in list(SP.structures(prob, cm))[::7]:
        if not s.feasible() or s.S < 2:
            continue
        ridge, _ = SP.ridge_map(s, SP.Stats())
        best, _ = SP.all_cuts_map(s, SP.Stats())
        assert ridge >= best * (1 - 1e-12)
        gaps.append(ridge / best - 1)
    assert gaps and max(gaps) <= 0.02


def test_baselines_are_never_better_than_poseidon() -> None:
    prob = small_problem({"A100-80GB": 4, "T4": 4}, layers=8)
    best = api.solve(prob).iteration_time_s
    for name in ("megatron", "metis"):
        plan = api.solve(prob, solver=name)
        assert plan.ok and api.check(prob, plan) == []
        assert plan.iteration_time_s >= best * (1 - 1e-12)


def test_3d_baseline_on_a_homogeneous_cluster() -> None:
    prob = small_problem({"A100-80GB": 8}, layers=8, per_node=4)
    plan = api.solve(prob, solver="3d")
    assert api.check(prob, plan) == [] and all(s.tp == 4 for s in plan.stages)
    assert plan.iteration_time_s >= api.solve(prob).iteration_time_s * (1 - 1e-12)
    with pytest.raises(InputError, match="homogeneous"):
        api.solve(small_problem({"A100-80GB": 4, "T4": 4}), solver="3d")


def test_same_input_gives_the_same_plan() -> None:
    prob = small_problem({"A100-80GB": 4, "V100": 4, "T4": 2})
    a, b = api.solve(prob), api.solve(prob)
    assert a.stages == b.stages and a.num_microbatches == b.num_microbatches


# ---- inputs and infeasibility ---------------------------------------------------------------

def test_unknown_model_names_the_field() -> None:
    with pytest.raises(InputError) as info:
        api.load_problem({"kind": "poseidon", "cluster": "dgx-a100x4", "model": "gpt5", "global_batch": 8,
                          "seq_len": 128})
    assert "model" in str(info.value) and "gpt5" in str(info.value)


def test_infeasible_problem_says_why_with_numbers() -> None:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"T4": 2}, "gpus_per_node": 2}, "model": "llama2-70b",
           "global_batch": 8, "seq_len": 4096}
    plan = api.solve(api.load_problem(doc))
    assert plan.status is Status.INFEASIBLE and "GiB" in plan.message and "80 layers" in plan.message


# ---- CLI --------------------------------------------------------------------------------------

def test_cli_solve_check_show_compare(tmp_path) -> None:
    from gpuplan.cli import main

    out = tmp_path / "plan.json"
    cluster = tmp_path / "c.yaml"
    cluster.write_text("cluster:\n  gpus: {A100-80GB: 4, V100: 4}\n  gpus_per_node: 4\n")
    r = CliRunner().invoke(main, ["solve", "poseidon", str(cluster), "gpt3-350m", "--batch", "16", "--seq",
                                  "1024", "--max-stages", "4", "-q", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["kind"] == "poseidon"
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0
    png = tmp_path / "t.png"
    r = CliRunner().invoke(main, ["show", str(out), "--png", str(png)])
    assert r.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(main, ["compare", "poseidon", str(cluster), "gpt3-350m", "--batch", "16", "--seq",
                                  "1024", "--max-stages", "3", "-q", "--solvers", "poseidon,metis,megatron"])
    assert r.exit_code == 0 and "metis" in r.output


def test_profile_replaces_cluster_and_costs(tmp_path) -> None:
    from gpuplan.models.profile import LayerCost, LayerTable, MeasuredDeviceType, Profile, ProfileNode

    small = scaled(model_config("gpt3-350m"), hidden=256, vocab=2048)
    costs = [LayerCost(device_type="cpu", part=part, micro_batch=mb, seq_len=128, forward_s=f * mb,
                       backward_s=2 * f * mb, activation_bytes=1e6)
             for mb in (1, 2) for part, f in (("layer", 0.004), ("embedding", 1e-5), ("head", 0.002))]
    prof = Profile(device_types=[MeasuredDeviceType(name="cpu", backend="cpu", memory_bytes=8 * 2**30,
                                                    matmul_tflops={"fp32": 0.1})],
                   nodes=[ProfileNode(name="h", devices={"cpu": 2})],
                   layers=[LayerTable(model=small.name, config=small.model_dump(mode="json"), scaled_from="gpt3-350m",
                                      costs=costs)])
    path = prof.save(tmp_path / "p.json")
    doc = {"kind": "poseidon", "cluster": {"profile": str(path)}, "model": "gpt3-350m", "global_batch": 4,
           "seq_len": 128, "dtype": "fp32"}
    from gpuplan.models.profile import load_profile

    prob = P.with_profile(api.load_problem(doc), load_profile(path))
    assert prob.layer_costs is not None
    cm = P.CostModel(prob)
    ratio = prob.model.layer_forward_flops(1, 1024) / small.layer_forward_flops(1, 1024)
    assert cm.layer("cpu", 1, 2)[0] == pytest.approx(0.008 * ratio)  # measured, scaled to the full model
    plan = api.solve(prob)
    assert plan.ok and api.check(prob, plan) == []


def test_core_sharing_simulation_matches_the_dag_and_respects_the_cores() -> None:
    """With every rate 1 the processor-sharing replay is the DAG longest path; on one core
    (rate 1/k with k ops computing) it is at least the CPU work and at least the DAG time."""
    import random

    from gpuplan.runtime.poseidon import contended_iteration_s

    rng = random.Random(3)
    for _ in range(60):
        S, m, sched = rng.randint(1, 4), rng.randint(1, 5), rng.choice(["1f1b", "gpipe"])
        fwd = [rng.uniform(0.1, 1.0) for _ in range(S)]
        bwd = [rng.uniform(0.1, 2.0) for _ in range(S)]
        p2p = [rng.uniform(0.0, 0.1) for _ in range(S - 1)]
        tail = [rng.uniform(0.0, 0.3) for _ in range(S)]
        fac = [rng.choice([1.0, 1.5, 2.0]) for _ in range(S)]
        dag = P.iteration_time_fast(fwd, bwd, p2p, tail, m, sched)
        assert contended_iteration_s(fwd, bwd, p2p, tail, m, sched, fac, [1.0] * S) == pytest.approx(dag, rel=1e-9)
        one = contended_iteration_s(fwd, bwd, p2p, tail, m, sched, fac, [1.0 / k for k in range(1, S + 1)])
        work = sum(m * (f + b) / x + t for f, b, x, t in zip(fwd, bwd, fac, tail))
        assert one >= dag * (1 - 1e-9) and one >= work * (1 - 1e-9)
    # one stage, 2x slowdown: 1 s of compute then 1 s asleep per op, whatever the cores
    assert contended_iteration_s([2.0], [4.0], [], [0.0], 1, "1f1b", [2.0], [1.0, 0.5]) == pytest.approx(6.0)
    # the same op at half speed (another job on the core): 2 s of compute, then 2 s asleep, per op
    assert contended_iteration_s([2.0], [4.0], [], [0.0], 1, "1f1b", [2.0], [0.5]) == pytest.approx(12.0)
