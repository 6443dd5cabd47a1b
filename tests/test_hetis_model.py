"""Hetis: the model's check against tampered plans, Stage A's 5% rule, the baselines against their definitions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import gpuplan
from gpuplan.models.hetis import (HetisPlan, capacity, layout_violations, snapshot_instance)
from gpuplan.models.hetis.cost import kv_capacity, kv_fractions_tp
from gpuplan.models.hetis.policy import p95, route, transfer_s
from gpuplan.sim.latency import kv_bytes_per_token
from test_check_audit import edited as _tamper  # the audit's edit of one leaf

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "examples" / "hetis" / "small.yaml"


def _doc(**trace: object) -> dict:
    doc = yaml.safe_load(SMALL.read_text())
    doc["trace"] = {**doc["trace"], "lengths": str(ROOT / "examples" / "serving" / "sharegpt-sample.csv"),
                    "requests": 60, **trace}
    doc["search"] = {"low_per_s": 1, "high_per_s": 16, "rel_tol": 0.25}
    return doc


@pytest.fixture(scope="module")
def problem() -> gpuplan.models.base.Problem:
    return gpuplan.load_problem(_doc())


@pytest.fixture(scope="module")
def plan(problem: object) -> HetisPlan:
    return gpuplan.solve(problem, solver="hetis")


def test_hetis_plan_checks_clean_and_is_deterministic(problem: object, plan: HetisPlan) -> None:
    assert plan.ok and plan.dispatch == "water-filling" and plan.redispatch
    assert gpuplan.check(problem, plan) == []
    again = gpuplan.solve(problem, solver="hetis")
    assert again.predicted == plan.predicted and again.head_map == plan.head_map


def test_every_snapshot_request_has_all_its_heads(problem: object, plan: HetisPlan) -> None:
    H = problem.config.kv
    assert len(plan.head_map) == problem.head_map_requests
    assert all(sum(a.heads.values()) == H for a in plan.head_map)


def test_check_catches_heads_not_covered_exactly_once(problem: object, plan: HetisPlan) -> None:
    for delta in (-1, +1):
        bad = plan.model_copy(deep=True)
        d = next(iter(bad.head_map[0].heads))
        bad.head_map[0].heads[d] += delta
        codes = {v.code for v in gpuplan.check(problem, bad)}
        assert "heads" in codes


def test_check_catches_heads_on_a_device_that_is_not_an_attention_device(problem: object, plan: HetisPlan) -> None:
    bad = plan.model_copy(deep=True)
    bad.head_map[0].heads["99"] = bad.head_map[0].heads.pop(next(iter(bad.head_map[0].heads)))
    assert any(v.code == "head_map" for v in gpuplan.check(problem, bad))


def test_check_catches_kv_memory_overflow_in_the_head_map() -> None:
    doc = _doc()
    doc["cluster"]["device_types"]["tiny"] = {"name": "tiny", "memory_bytes": "1.2 GB", "memory_bandwidth_GBps": 900,
                                              "peak_tflops": {"fp16": 50}}
    doc["cluster"]["nodes"].append({"name": "t", "gpus": {"tiny": 1}})
    prob = gpuplan.load_problem(doc)
    plan = gpuplan.solve(prob, solver="hetis", time_limit_s=1e-3)  # Stage A's first candidate is enough here
    assert gpuplan.check(prob, plan) == []
    tiny = str(len(prob.cluster.devices) - 1)
    bad = plan.model_copy(deep=True)
    for a in bad.head_map:
        a.heads = {tiny: prob.config.kv}
    codes = [v.code for v in gpuplan.check(prob, bad)]
    assert "memory" in codes


def test_check_catches_weights_that_do_not_fit() -> None:
    doc = _doc()
    doc["model"] = "llama2-13b"  # 26 GB of fp16 weights: one 24 GB RTX 3090 cannot hold them
    prob = gpuplan.load_problem(doc)
    three090 = [d.id for d in prob.cluster.devices if d.type == "RTX3090"]
    bad = HetisPlan(kind="hetis", status="feasible",
                    replicas=[{"stages": [{"devices": [three090[0]], "layers": prob.config.num_layers}]}])
    assert "memory" in {v.code for v in layout_violations(prob, bad)}
    assert "memory" in {v.code for v in gpuplan.models.hetis.check(prob, bad)}


def test_check_catches_stated_figures_that_differ(problem: object, plan: HetisPlan) -> None:
    for key in ("ttft_p_s", "max_rate_per_s", "usable_kv_bytes", "snapshot_attention_s"):
        bad = plan.model_copy(deep=True)
        bad.predicted[key] = bad.predicted[key] * 1.5 + 1.0
        assert any(v.code == "figure" for v in gpuplan.check(problem, bad)), key
    bad = plan.model_copy(deep=True)
    bad.kv_capacity_bytes[next(iter(bad.kv_capacity_bytes))] *= 2
    assert any(v.code == "figure" for v in gpuplan.check(problem, bad))


@pytest.fixture(scope="module")
def long_prompts(tmp_path_factory: pytest.TempPathFactory) -> gpuplan.models.base.Problem:
    """The test problem with LongBench-like prompts (8,952 tokens on average, cut to the context window):
    unlike the ShareGPT sample's 60 requests, which keep the SLOs at every rate of the search, these give
    the candidates different max rates strictly inside the search range."""
    from gpuplan.sim.traces import write_long_lengths_csv

    doc = _doc()
    seq = gpuplan.load_problem(doc).config.max_seq_len
    doc["trace"]["lengths"] = str(write_long_lengths_csv(tmp_path_factory.mktemp("hetis-long") / "long.csv", 200, seq))
    doc["search"] = {"low_per_s": 0.05, "high_per_s": 16, "rel_tol": 0.25}
    return gpuplan.load_problem(doc)


def test_stage_a_takes_the_fewest_primaries_within_delta_of_the_best_max_rate(long_prompts: object) -> None:
    from gpuplan.models.hetis import max_rate_per_s
    from gpuplan.solvers.hetis import (hetis_layout_plan, primaries_of, stage_a, stage_a_candidates,
                                       stage_a_dispatch, static_search)

    problem = long_prompts
    chosen, table = stage_a(problem)
    rated = [(max(max_rate_per_s(problem, hetis_layout_plan(problem, reps)), static_search(problem, reps)[0]),
              primaries_of(reps)) for _, reps in stage_a_candidates(problem)]
    assert [r["max_rate_per_s"] for r in table] == [r for r, _ in rated]
    best = max(r for r, _ in rated)
    assert 0 < best < problem.search.high_per_s  # a rate inside the search, not its top
    assert any(0 < r * (1 + problem.delta) < best for r, _ in rated)  # a candidate the 5 % rule leaves out
    rate_chosen = max_rate_per_s(problem, hetis_layout_plan(problem, chosen, stage_a_dispatch(problem)))
    n_chosen = primaries_of(chosen)
    assert rate_chosen * (1 + problem.delta) >= best
    assert all(n >= n_chosen for r, n in rated if r * (1 + problem.delta) >= best)
    loose = problem.model_copy(update={"delta": 10.0})
    few, _ = stage_a(loose)
    assert primaries_of(few) == min(n for _, n in rated)
    strict = problem.model_copy(update={"delta": 0.0})
    top, _ = stage_a(strict)
    assert max_rate_per_s(problem, hetis_layout_plan(problem, top, stage_a_dispatch(strict))) == best


def test_stage_a_considers_every_hexgen_configuration(problem: object) -> None:
    from gpuplan.solvers.hetis import _layout_key, configurations, hexgen_configurations, stage_a_candidates

    ours = {_layout_key(reps) for _, reps in configurations(problem)}
    assert all(_layout_key(reps) in ours for _, reps in hexgen_configurations(problem))
    simulated = {_layout_key(reps) for _, reps in stage_a_candidates(problem)}
    hex_top = sorted(hexgen_configurations(problem), key=lambda c: -c[0])[:3]
    assert all(_layout_key(reps) in simulated for _, reps in hex_top)


def test_head_dispatch_on_hexgens_layout_is_never_below_hexgen(problem: object) -> None:
    from gpuplan.models.hetis import max_rate_per_s
    from gpuplan.solvers.hetis import hetis_layout_plan

    hexgen = gpuplan.solve(problem, solver="hexgen")
    on_top = max_rate_per_s(problem, hetis_layout_plan(problem, hexgen.replicas))
    assert on_top >= hexgen.objective
    hetis = gpuplan.solve(problem, solver="hetis")
    assert hetis.objective * (1 + problem.delta) >= on_top


def test_uniform_tp_is_bounded_by_the_smallest_gpu(problem: object) -> None:
    plan = gpuplan.solve(problem, solver="uniform-tp")
    assert gpuplan.check(problem, plan) == []
    (rep,) = plan.replicas
    layers = [s.layers for s in rep.stages]
    assert max(layers) - min(layers) <= 1
    cap = kv_capacity(problem, plan.replicas, [])
    fr = kv_fractions_tp(problem, rep)
    expected = min(cap[d] / f for d, f in fr.items())
    assert math.isclose(plan.usable_kv_bytes, expected, rel_tol=1e-12)
    assert plan.usable_kv_bytes <= sum(cap.values()) + 1e-6


def test_heads_by_memory_splits_heads_in_proportion_to_kv_capacity(problem: object) -> None:
    plan = gpuplan.solve(problem, solver="heads-by-memory")
    assert gpuplan.check(problem, plan) == []
    cap, _ = capacity(problem, plan)
    H = problem.config.kv
    total = sum(cap[int(d)] for d in plan.static_heads)
    assert sum(plan.static_heads.values()) == H
    for d, n in plan.static_heads.items():
        assert abs(n - H * cap[int(d)] / total) < 1
    assert all(a.heads == plan.static_heads for a in plan.head_map)


def test_splitwise_ships_prompt_kv_from_prefill_to_decode_pool(problem: object) -> None:
    plan = gpuplan.solve(problem, solver="splitwise")
    assert gpuplan.check(problem, plan) == []
    phases = {r.phase for r in plan.replicas}
    assert phases == {"prefill", "decode"}
    prompts = np.array([1, 100, 1000])
    t = transfer_s(problem, plan, prompts)
    kvb = kv_bytes_per_token(problem.config, problem.dtype)
    assert np.all(np.diff(t) > 0)
    assert math.isclose((t[2] - t[1]) / 900, kvb / (problem.cluster.inter_node.bandwidth_GBps * 1e9), rel_tol=1e-9)


def test_hexgen_stages_fastest_first_and_shares_sum_to_one(problem: object) -> None:
    plan = gpuplan.solve(problem, solver="hexgen")
    assert gpuplan.check(problem, plan) == []
    assert math.isclose(sum(r.share for r in plan.replicas), 1.0)
    assert all(r.phase == "both" for r in plan.replicas)
    uniform = gpuplan.solve(problem, solver="uniform-tp")
    assert plan.objective >= uniform.objective * (1 - problem.search.rel_tol)


def test_route_is_a_smooth_weighted_round_robin() -> None:
    where = route(100, [0.75, 0.25])
    assert np.bincount(where).tolist() == [75, 25]
    assert where[:4].tolist() == [0, 1, 0, 0] or where[:4].tolist().count(1) == 1


def test_p95_counts_unserved_as_misses() -> None:
    assert p95(np.array([1.0] * 96 + [np.nan] * 4)) == 1.0
    assert math.isinf(p95(np.array([1.0] * 90 + [np.nan] * 10)))


def test_bad_lengths_source_is_an_input_error(tmp_path: Path) -> None:
    doc = _doc(lengths="missing.csv")
    with pytest.raises(gpuplan.errors.InputError, match="lengths"):
        gpuplan.load_problem(doc)
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_tokens,output_tokens\n1,x\n")
    prob = gpuplan.load_problem(_doc(lengths=str(bad)))
    with pytest.raises(gpuplan.errors.InputError, match="trace.lengths"):
        prob.lengths()


def test_snapshot_instance_uses_the_plan_attention_devices(problem: object, plan: HetisPlan) -> None:
    inst = snapshot_instance(problem, plan)
    assert inst.devices == len(plan.attention_devices)
    assert len(inst.ctx_tokens) == problem.head_map_requests


def test_splitwise_takes_the_best_simulated_pool_split(problem: object) -> None:
    from gpuplan.models.hetis import HetisPlan as Plan
    from gpuplan.models.plan import Status
    from gpuplan.models.hetis import max_rate_per_s
    from gpuplan.solvers.hetis import SPLITWISE_SIMULATED, splitwise_configurations

    cands = splitwise_configurations(problem)
    plan = gpuplan.solve(problem, solver="splitwise")
    rates = [max_rate_per_s(problem, Plan(kind="hetis", status=Status.FEASIBLE, replicas=reps))
             for _, reps in cands[:SPLITWISE_SIMULATED]]
    assert rates and plan.objective == max(rates)
    # the pools need not be whole servers: some split puts one GPU of a server in each pool
    node = {d.id: d.node for d in problem.cluster.devices}
    assert any({node[d] for r in reps if r.phase == "prefill" for s in r.stages for d in s.devices}
               & {node[d] for r in reps if r.phase == "decode" for s in r.stages for d in s.devices}
               for _, reps in cands)


def test_layouts_that_differ_only_in_a_replicas_phase_are_distinct() -> None:
    from gpuplan.models.hetis import Replica, Stage
    from gpuplan.solvers.hetis import _layout_key

    a = [Replica(stages=[Stage(devices=[0], layers=2)], phase="prefill"),
         Replica(stages=[Stage(devices=[1], layers=2)], phase="prefill"),
         Replica(stages=[Stage(devices=[2], layers=2)], phase="decode")]
    b = [r.model_copy(deep=True) for r in a]
    b[1].phase = "decode"
    assert _layout_key(a) != _layout_key(b)
    assert _layout_key(a) == _layout_key(list(reversed(a)))


def test_splitwise_transfers_queue_on_the_link_between_the_pools(problem: object) -> None:
    from gpuplan.models.hetis.policy import transfer_arrivals_s, transfer_links

    plan = gpuplan.solve(problem, solver="splitwise")
    links = transfer_links(problem, plan)
    kvb = kv_bytes_per_token(problem.config, problem.dtype)
    bw = problem.cluster.inter_node.bandwidth_GBps * 1e9
    lat = float(transfer_s(problem, plan, np.zeros(1))[0])
    # 2 x links transfers of 1000 tokens ready at once: the first `links` go together, the rest wait
    n = 2 * links
    arrive = transfer_arrivals_s(problem, plan, np.zeros(n), np.full(n, 1000))
    one = 1000 * kvb / bw
    assert np.allclose(np.sort(arrive)[:links], one + lat)
    assert np.allclose(np.sort(arrive)[links:], 2 * one + lat)
    # spaced wider than a transfer: no queue, each arrives bytes / bandwidth + latency after it is ready
    ready = np.arange(4) * 10 * one
    assert np.allclose(transfer_arrivals_s(problem, plan, ready, np.full(4, 1000)), ready + one + lat)
    # the pool's long-run rate of transfers is bounded by the links: n transfers take n / links of one
    many = transfer_arrivals_s(problem, plan, np.zeros(40), np.full(40, 1000))
    assert math.isclose(float(many.max()), math.ceil(40 / links) * one + lat, rel_tol=1e-9)


def test_a_max_rate_at_the_top_of_the_search_is_said_to_be_a_lower_bound(problem: object) -> None:
    """60 requests keep the SLOs at every rate of a 1-16 req/s search (one burst): the plan says its max
    rate is a lower bound; where a failing rate was found inside the range it says nothing of the kind."""
    top = gpuplan.solve(problem, solver="uniform-tp")
    assert top.objective == problem.search.high_per_s and top.predicted["first_failing_rate_per_s"] == 0
    assert "lower bound" in top.message and "high_per_s = 16" in top.message
    wide = problem.model_copy(update={"search": problem.search.model_copy(update={"high_per_s": 200.0})})
    inside = gpuplan.solve(wide, solver="uniform-tp")
    assert 0 < inside.objective < 200 and inside.predicted["first_failing_rate_per_s"] > inside.objective
    assert "lower bound" not in inside.message
    from gpuplan.solvers import hetis as H

    H._STATIC_CACHE.clear()  # no searches left by earlier tests: the limit must cut this one
    cut = gpuplan.solve(problem, solver="hexgen", time_limit_s=1e-3)
    assert cut.status.value == "time_limit" and "time limit" in cut.message and "lower bound" in cut.message


def test_a_rewritten_lengths_csv_is_read_again(tmp_path: Path) -> None:
    """The lengths of a CSV trace were cached by path for the life of the process: a problem loaded
    after the file was rewritten still had the old lengths. Both serving models read the file again."""
    from gpuplan.models.omniserve.costs import build_trace

    csv = tmp_path / "lengths.csv"
    csv.write_text("prompt_tokens,output_tokens\n" + "".join(f"{2000 + i},{50 + i}\n" for i in range(20)))
    doc = yaml.safe_load(SMALL.read_text())
    doc["trace"]["lengths"] = str(csv)
    first = gpuplan.load_problem(doc).lengths()[0].mean()
    csv.write_text("prompt_tokens,output_tokens\n" + "".join(f"{30 + i},{20 + i}\n" for i in range(20)))
    again = gpuplan.load_problem(doc).lengths()[0].mean()
    assert (first, again) == (2009.5, 39.5)
    omni = gpuplan.load_problem(ROOT / "examples" / "omniserve" / "llama70b-small.yaml")
    before = build_trace(omni, lengths_source=str(csv))[0]  # as `gpuplan simulate omniserve --trace CSV`
    csv.write_text("prompt_tokens,output_tokens\n" + "".join(f"{900 + i},{20 + i}\n" for i in range(20)))
    after = build_trace(omni, lengths_source=str(csv))[0]
    assert not np.array_equal(before.prompt_tokens, after.prompt_tokens)


# ---------------------------------------------------------------- Stage A table and snapshot method


def test_check_recomputes_every_field_of_the_stage_a_table(problem: object, plan: HetisPlan) -> None:
    assert len(plan.stage_a) > 1 and sum(r["chosen"] for r in plan.stage_a) == 1
    for k, row in enumerate(plan.stage_a):
        for field, value in row.items():
            bad = plan.model_copy(deep=True)
            bad.stage_a[k][field] = _tamper(value)
            codes = {v.code for v in gpuplan.check(problem, bad)}
            assert codes and codes <= {"stage_a", "figure"}, (k, field, codes)
    c = next(k for k, r in enumerate(plan.stage_a) if r["chosen"])
    low = plan.model_copy(deep=True)
    low.stage_a[c]["dense_proxy_tokens_per_s"] *= 0.5   # the chosen row's proxy is recomputed exactly
    assert "figure" in {v.code for v in gpuplan.check(problem, low)}
    other = next(k for k in range(len(plan.stage_a)) if k != c)
    slower = plan.model_copy(deep=True)
    slower.stage_a[other]["max_rate_per_s"] = problem.search.low_per_s   # in range, but vs_best no longer follows
    assert "figure" in {v.code for v in gpuplan.check(problem, slower)}


def test_stage_a_chosen_row_follows_the_five_percent_rule(problem: object, plan: HetisPlan) -> None:
    from gpuplan.models.hetis import describe_primaries, stage_a_violations

    one = next(r for r in plan.stage_a if r["chosen"])
    assert one["primaries"] == describe_primaries(problem, plan.replicas) and one["primary_gpus"] == 1
    two = next(r for r in plan.stage_a if r["primary_gpus"] == 2)
    fake = plan.model_copy(deep=True)
    fake.predicted["max_rate_per_s"] = 10.0   # the 1-GPU set 10 req/s, the 2-GPU set 16: beyond 5 %
    fake.stage_a = [{**one, "max_rate_per_s": 10.0, "vs_best": 10.0 / 16.0},
                    {**two, "max_rate_per_s": 16.0, "vs_best": 1.0}]
    found = stage_a_violations(problem, fake)
    assert [v.code for v in found] == ["stage_a"] and "fewest primary GPUs" in found[0].message
    fake.stage_a[0]["max_rate_per_s"] = fake.predicted["max_rate_per_s"] = 15.5   # within 5 %: the fewer GPUs win
    fake.stage_a[0]["vs_best"] = 15.5 / 16.0
    assert stage_a_violations(problem, fake) == []


def _with_snapshot_figure(problem: object, plan: HetisPlan) -> HetisPlan:
    """Return `plan` with snapshot_attention_s recomputed for its head map (a consistent edit)."""
    from gpuplan.models.hetis import head_matrix
    from gpuplan.models.hetis.dispatch import objective_s

    n = head_matrix(problem, plan)[0]
    plan.predicted["snapshot_attention_s"] = objective_s(snapshot_instance(problem, plan), n)
    return plan


def test_check_verifies_the_snapshot_method(problem: object, plan: HetisPlan) -> None:
    for method in (_tamper(plan.snapshot_dispatch), "memory-proportional", "", "lp"):  # lp: not hetis' method
        bad = plan.model_copy(deep=True)
        bad.snapshot_dispatch = method
        assert "dispatch" in {v.code for v in gpuplan.check(problem, bad)}, method


def test_check_verifies_a_water_filled_head_map(problem: object, plan: HetisPlan) -> None:
    """Another valid head map, its figure recomputed, is not what water-filling the snapshot gives."""
    moved = plan.model_copy(deep=True)
    heads = moved.head_map[0].heads
    src = next(iter(heads))
    dst = next(str(d) for d in sorted(moved.attention_devices) if str(d) != src)
    heads[src] -= 1
    heads[dst] = heads.get(dst, 0) + 1
    moved.head_map[0].heads = {d: n for d, n in heads.items() if n}
    assert "head_map" in {v.code for v in gpuplan.check(problem, _with_snapshot_figure(problem, moved))}


def test_check_verifies_a_memory_proportional_head_map(problem: object) -> None:
    plan = gpuplan.solve(problem, solver="heads-by-memory")
    assert plan.snapshot_dispatch == "memory-proportional" and gpuplan.check(problem, plan) == []
    bad = plan.model_copy(deep=True)
    heads = dict(bad.head_map[0].heads)
    a, b = sorted(heads)[:2]
    heads[a], heads[b] = heads[a] + 1, heads[b] - 1
    bad.head_map[0].heads = {d: n for d, n in heads.items() if n}
    assert "head_map" in {v.code for v in gpuplan.check(problem, _with_snapshot_figure(problem, bad))}
