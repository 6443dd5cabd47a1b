"""Lagom: NCCL's model, the overlapped cost model, the searches, check, emission, bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.io import read_document
from gpuplan.models.lagom import cost
from gpuplan.models.base import validate
from gpuplan.models.lagom import LagomPlan, LagomProblem, Theta, check, make_plan
from gpuplan.models.lagom.emit import OPTION_KEYS, emit, env_problems
from gpuplan.models.lagom.view import describe, draw, summarize
from gpuplan.solvers import lagom as solvers

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lagom"
C = cost.Consts()


def nvlink8(**kw) -> cost.Link:
    base = dict(ranks=8, nodes=1, intra="nvlink", channel_GBps=450 / 16, cap_GBps=450, channels=16)
    return cost.Link(**{**base, **kw})


def problem(ops, segments=(), groups=None, **kw) -> LagomProblem:
    doc = {"kind": "lagom", "hardware": {"gpu": "H100"},
           "groups": groups or {"g": {"ranks": 8}}, "segments": list(segments), "ops": list(ops), **kw}
    return validate(LagomProblem, doc)


def load(name: str) -> LagomProblem:
    path = EXAMPLES / name
    return validate(LagomProblem, read_document(path), file=path)


# ---- NCCL's analytic model reproduces the notes' documented figures -----------------------------

@pytest.mark.parametrize("algo, proto, expected_us", [
    ("ring", "LL", 15.0), ("ring", "LL128", 40.6), ("ring", "Simple", 56.0),
    ("tree", "LL", 15.2), ("tree", "Simple", 64.4)])
def test_nccl_latency_one_nvlink_node_of_8(algo: str, proto: str, expected_us: float) -> None:
    assert cost.nccl_latency_us("all_reduce", algo, proto, nvlink8(), C) == pytest.approx(expected_us)


def test_nccl_selection_by_size_on_one_nvlink_node() -> None:
    link = nvlink8()
    small = cost.nccl_default("all_reduce", 4096, link, C)
    mid = cost.nccl_default("all_reduce", 4 * 2**20, link, C)
    large = cost.nccl_default("all_reduce", 2**30, link, C)
    assert small[:2] == ("ring", "LL")          # 15.0 us beats Tree LL's 15.2 us
    assert mid[1] == "LL128"                     # LL caps at 141 GB/s; LL128 at 0.92 x busBw
    assert large[:2] == ("ring", "Simple")      # Simple's full bandwidth wins for large messages
    assert small[2] < link.channels and small[3] <= 512   # few bytes: channels and threads reduced
    assert large[2:] == (16, 512, 2 * 2**20)      # all channels, 512 threads, 2 MiB chunk
    with_nvls = cost.nccl_default("all_reduce", 2**30, nvlink8(nvls=True), C)
    assert with_nvls[:2] == ("nvls", "Simple")
    assert cost.nccl_default("all_gather", 2**30, link, C)[0] == "ring"   # Tree runs all_reduce only


def test_nccl_time_is_latency_plus_size_over_algbw() -> None:
    link = nvlink8()
    t = cost.nccl_time_us("all_reduce", 1e8, "ring", "Simple", link, C)
    assert t == pytest.approx(56.0 + 1e8 / (1000 * 450 * 8 / 14))


def test_multinode_latency_uses_network_steps() -> None:
    link = cost.Link(ranks=16, nodes=2, intra="nvlink", channel_GBps=12.5, cap_GBps=50, channels=4)
    lat = cost.nccl_latency_us("all_reduce", "ring", "LL", link, C)
    # 2(n-1) = 30 steps, 2(N-1) = 2 of them cross the network (2.7 us); the rest max(0.6, 1.0 overhead)
    assert lat == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)


@pytest.mark.parametrize("coll, algo, proto, nc, nt, chunk, words", [
    ("all_gather", "tree", "Simple", 8, 640, 65536, "Tree runs only all_reduce"),
    ("all_reduce", "nvls", "LL", 8, 512, 65536, "NVLS"),
    ("all_reduce", "ring", "Simple", 8, 48, 65536, "threads 48"),
    ("all_reduce", "ring", "Simple", 8, 544, 65536, "threads 544"),
    ("all_reduce", "ring", "LL128", 8, 128, 65536, "threads 128"),
    ("all_reduce", "tree", "LL", 8, 512, 65536, "threads 512"),
    ("all_reduce", "ring", "Simple", 65, 512, 65536, "channels 65"),
    ("all_reduce", "ring", "Simple", 8, 512, 1000, "chunk 1000"),
])
def test_nccl_rules(coll, algo, proto, nc, nt, chunk, words) -> None:
    problems = cost.setting_problems(coll, nvlink8(nvls=True), algo, proto, nc, nt, chunk)
    assert any(words in p for p in problems), problems


def test_ll128_and_multinode_nvls_refused() -> None:
    assert cost.setting_problems("all_reduce", nvlink8(ll128=False), "ring", "LL128", 8, 640, 65536)
    multi = cost.Link(ranks=16, nodes=2, intra="nvlink", channel_GBps=12.5, cap_GBps=50, channels=4, nvls=True)
    assert any("CollNet" in p for p in cost.setting_problems("all_reduce", multi, "nvls", "Simple", 8, 512, 65536))


# ---- the extended model -------------------------------------------------------------------------

def test_more_resources_speed_communication_and_slow_computation() -> None:
    link, dev = nvlink8(), cost.Device(132, 3350, 50 * 2**20)
    few = cost.comm_time_us("all_reduce", 4e8, "ring", "Simple", link, C, 2, 512, 2**20)
    many = cost.comm_time_us("all_reduce", 4e8, "ring", "Simple", link, C, 16, 512, 2**20)
    assert many < few
    s_few = cost.slowdown("all_reduce", 4e8, "ring", "Simple", link, C, dev, 0.2, 2, 512, 2**20)
    s_many = cost.slowdown("all_reduce", 4e8, "ring", "Simple", link, C, dev, 0.2, 16, 512, 2**20)
    assert 1 < s_few < s_many
    # scalar and vectorized evaluations agree
    arr = cost.comm_time_us("all_reduce", 4e8, "ring", "Simple", link, C, np.array([2.0, 16.0]), 512, 2**20)
    assert arr == pytest.approx([few, many])


def test_window_is_max_of_lanes_with_interference() -> None:
    # compute-bound: Tc0 + d (1 - 1/s); communication-bound: d
    assert cost.window_time_us(100.0, 10.0, 10.0 / 2) == pytest.approx(105.0)
    assert cost.window_time_us(10.0, 100.0, 100.0 / 2) == pytest.approx(100.0)


def test_iteration_composes_windows_and_exposed_ops() -> None:
    p = problem([{"name": "a", "collective": "all_reduce", "size_bytes": "100 MiB", "group": "g", "overlaps": "s"},
                 {"name": "b", "collective": "all_reduce", "size_bytes": "1 MiB", "group": "g"}],
                [{"name": "s", "compute_s": "5 ms"}])
    comp = p.compiled
    t = [comp.nccl_default(i) for i in range(2)]
    exposed = float(comp.comm_us(1, t[1]))
    assert comp.iteration_us(t) == pytest.approx(float(comp.window_us(0, t)) + exposed)
    assert comp.window_us(0, t) > 5000.0   # interference makes the window longer than compute alone
    plan = make_plan(p, t)
    assert [w.bound for w in plan.windows] == ["compute", "exposed"]
    assert plan.iteration_s == pytest.approx(comp.iteration_us(t) * 1e-6)


# ---- searches -----------------------------------------------------------------------------------

SIZES = st.floats(min_value=2**18, max_value=2**30)


def random_problem(size: float, compute_ms: float, phi: float, ranks: int, nodes: int, gbps: float,
                   coll: str = "all_reduce") -> LagomProblem:
    group = {"ranks": ranks, "nodes": nodes, "nvls": nodes == 1}
    if nodes > 1:
        group["inter_GBps"] = f"{gbps} Gbps"
    return problem([{"name": "op", "collective": coll, "size_bytes": size, "group": "g", "overlaps": "s"}],
                   [{"name": "s", "compute_s": compute_ms * 1e-3, "memory_bound": phi}], groups={"g": group})


@settings(max_examples=25, deadline=None)
@given(size=SIZES, compute_ms=st.floats(0.05, 50), phi=st.floats(0, 0.8),
       shape=st.sampled_from([(8, 1), (4, 1), (16, 2), (8, 8)]), gbps=st.sampled_from([25, 100, 400]),
       coll=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
def test_priority_search_bounds(size, compute_ms, phi, shape, gbps, coll) -> None:
    p = random_problem(size, compute_ms, phi, shape[0], shape[1], gbps, coll)
    comp = p.compiled
    found, stats = solvers.priority_search(p)
    bound = solvers.space(p, 0).pass_bound()
    assert stats["pass_bound"] == bound
    assert all(e <= bound for e in stats["evaluations_per_pass"])
    default = [comp.nccl_default(0)]
    assert comp.iteration_us(found) <= comp.iteration_us(default) * (1 + 1e-12)
    assert not comp.valid(0, found[0])
    exact, exact_stats = solvers.exhaustive(p)
    assert comp.iteration_us(exact) <= comp.iteration_us(found) * (1 + 1e-9)
    assert exact_stats["evaluations"] > 25 * stats["evaluations"] / stats["passes"]


def test_priority_search_agrees_with_exhaustive_on_small_instances() -> None:
    rng = np.random.default_rng(7)
    gaps = []
    for _ in range(30):
        shape = [(8, 1), (4, 1), (16, 2), (8, 8)][rng.integers(4)]
        p = random_problem(float(2 ** rng.uniform(18, 30)), float(10 ** rng.uniform(-1, 1.5)),
                           float(rng.uniform(0, 0.8)), shape[0], shape[1], [25, 100, 400][rng.integers(3)])
        comp = p.compiled
        found, _ = solvers.priority_search(p)
        exact, _ = solvers.exhaustive(p)
        gaps.append(comp.iteration_us(found) / comp.iteration_us(exact) - 1)
    assert np.median(gaps) <= 0.01
    assert np.percentile(gaps, 95) <= 0.03
    assert max(gaps) <= 0.03          # re-tuning resources per implementation: no 12% plateau traps


def test_joint_polish_never_hurts_and_counts_its_grid() -> None:
    """The closing joint (channels, chunk) step then threads: never worse than the passes alone, and
    it evaluates channels x chunks + the other thread values once per op."""
    rng = np.random.default_rng(3)
    for _ in range(6):
        shape = [(8, 1), (4, 1), (16, 2), (8, 8)][rng.integers(4)]
        p = random_problem(float(2 ** rng.uniform(18, 30)), float(10 ** rng.uniform(-1, 1.5)),
                           float(rng.uniform(0, 0.8)), shape[0], shape[1], [25, 100, 400][rng.integers(3)])
        comp = p.compiled
        plain, _ = solvers.priority_search(p, polish=False)
        polished, stats = solvers.priority_search(p)
        assert comp.iteration_us(polished) <= comp.iteration_us(plain) * (1 + 1e-12)
        sp = solvers.space(p, 0)
        t = polished[0]
        lo, hi = cost.thread_range(t.algo, t.proto)
        n_ch = len([c for c in sp.channels if c >= (2 if t.algo == "nvls" else 1)])
        n_thr = len([x for x in sp.threads if lo <= x <= hi]) - 1
        assert stats["polish_evaluations"] == n_ch * len(sp.chunks) + n_thr


def test_autoccl_minimizes_communication_only() -> None:
    p = random_problem(4e8, 20.0, 0.3, 8, 1, 400)
    comp = p.compiled
    auto, _ = solvers.autoccl(p)
    default = comp.nccl_default(0)
    assert comp.comm_us(0, auto[0]) <= comp.comm_us(0, default)
    found, _ = solvers.priority_search(p)
    # compute-bound: Lagom gives up communication speed for less interference
    assert comp.iteration_us(found) < comp.iteration_us(auto)
    assert comp.slowdown(0, found[0]) < comp.slowdown(0, auto[0])


def test_exhaustive_refuses_crowded_windows() -> None:
    p = load("small.yaml")
    assert solvers.exhaustive_applicable(p) is None
    crowded = problem([{"name": n, "collective": "all_reduce", "size_bytes": 1e7, "group": "g", "overlaps": "s"}
                       for n in ("a", "b")], [{"name": "s", "compute_s": 1e-3}])
    assert "several ops" in solvers.exhaustive_applicable(crowded)


def test_solver_plans_pass_check_and_round_trip(tmp_path) -> None:
    p = load("small.yaml")
    plan = solvers.solve_lagom(p)
    assert check(p, plan) == []
    assert set(plan.baselines) == {"nccl-default", "autoccl"}
    assert plan.predicted["iteration_s"] <= plan.predicted["iteration_s_nccl_default"]
    path = plan.save(tmp_path / "plan.json")
    again = LagomPlan.model_validate(json.loads(path.read_text()))
    assert check(p, again) == []
    for solve in (solvers.solve_exhaustive, solvers.solve_default, solvers.solve_autoccl):
        assert check(p, solve(p)) == []


def test_check_catches_broken_plans() -> None:
    p = load("small.yaml")
    plan = solvers.solve_default(p)
    wrong_time = plan.model_copy(update={"iteration_s": plan.iteration_s * 0.9})
    assert [v.code for v in check(p, wrong_time)] == ["iteration_time"]
    bad = plan.model_copy(deep=True)
    bad.settings[0].threads = 1000
    assert "nccl_rule" in [v.code for v in check(p, bad)]
    missing = plan.model_copy(update={"settings": plan.settings[1:]})
    assert [v.code for v in check(p, missing)] == ["missing_op"]
    env = plan.model_copy(update={"env": {**plan.env, "NCCL_NTHREADS": "700"}})
    assert [v.code for v in check(p, env)] == ["env"]



def test_check_recomputes_nccl_default_baseline_settings() -> None:
    p = load("small.yaml")
    plan = solvers.solve_lagom(p, time_limit_s=5)
    # bucket0's NCCL default is 2 channels, 256 threads: 3 channels or 288 threads are valid NCCL settings
    # but not NCCL's own choice
    for field, value in (("channels", 3), ("threads", 288), ("proto", "LL"), ("chunk_bytes", 1 << 20)):
        bad = plan.model_copy(deep=True)
        setattr(bad.baselines["nccl-default"][1], field, value)
        found = [v for v in check(p, bad) if v.code == "baseline"]
        assert found and f"baselines.nccl-default[1].{field} = " in found[0].message, (field, check(p, bad))


def test_check_keeps_autoccl_baseline_on_its_grid() -> None:
    p = load("small.yaml")
    plan = solvers.solve_lagom(p, time_limit_s=5)
    auto = plan.baselines["autoccl"][0]
    assert (auto.algo, auto.channels) == ("nvls", 16)
    # 33 channels is a valid NCCL setting (<= 64) giving the same time (NVLS keeps 16 CTAs busy), but
    # outside the problem's grid (max_channels 32), where AutoCCL's search never goes
    bad = plan.model_copy(deep=True)
    bad.baselines["autoccl"][0].channels = 33
    assert [v.code for v in check(p, bad)] == ["baseline"]
    assert "channels 33 outside the search grid" in check(p, bad)[0].message
    # 17 channels: on the grid, the same time: a legitimate alternative setting of the same baseline
    alt = plan.model_copy(deep=True)
    alt.baselines["autoccl"][0].channels = 17
    assert check(p, alt) == []
    unknown = plan.model_copy(deep=True)
    unknown.baselines["mine"] = unknown.baselines.pop("autoccl")
    assert "unknown baseline 'mine'" in " ".join(v.message for v in check(p, unknown))


def test_check_recomputes_emitted_notes() -> None:
    p = load("small.yaml")
    plan = solvers.solve_lagom(p, time_limit_s=5)
    assert plan.notes == ["NCCL_NTHREADS: ops chose [256, 512]; set to the one carrying most time"]
    bad = plan.model_copy(update={"notes": ["NCCL_NTHREADS: ops chose [256, 384]; set to the one carrying most time"]})
    assert [v.code for v in check(p, bad)] == ["env"]
    assert "notes" in check(p, bad)[0].message
    assert [v.code for v in check(p, plan.model_copy(update={"notes": []}))] == ["env"]
    # free text after the emitted notes is a diagnostic
    assert check(p, plan.model_copy(update={"notes": plan.notes + ["tuned on Tuesday"]})) == []

# ---- emission -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama2-7b-dp8.yaml", "llama2-13b-tp8-dp4.yaml", "gpt3-1.3b-25gbps.yaml", "small.yaml"])
def test_emitted_env_and_options_are_valid(name: str) -> None:
    p = load(name)
    found, _ = solvers.priority_search(p)
    env, options, notes = emit(p, found)
    assert env_problems(env, options) == []
    assert set(options) == set(p.groups)
    for fields in options.values():
        assert set(fields) <= OPTION_KEYS
        assert 1 <= fields["min_ctas"] <= fields["max_ctas"] <= 64
    # per-collective NCCL_ALGO syntax: "coll:algo[,algo];coll:..."
    for part in env["NCCL_ALGO"].split(";"):
        coll, algos = part.split(":")
        assert coll in ("allreduce", "allgather", "reducescatter") and algos
    assert int(env["NCCL_MIN_CTAS"]) == min(t.channels for t in found)


def test_env_problems_refuse_bad_values() -> None:
    assert env_problems({"NCCL_ALGO": "allreduce:warp"}, {})
    assert env_problems({"NCCL_PROTO": "allreduce:LL256"}, {})
    assert env_problems({"NCCL_MIN_CTAS": "8", "NCCL_MAX_CTAS": "4"}, {})
    assert env_problems({}, {"g": {"min_ctas": 1, "max_ctas": 8, "num_channels": 2}})
    assert env_problems({"PATH": "/x"}, {})


# ---- presentation -------------------------------------------------------------------------------

def test_summarize_describe_draw(tmp_path) -> None:
    p = load("llama2-7b-dp8.yaml")
    plan = solvers.solve_lagom(p)
    s = summarize(p, plan)
    assert s["speedup_vs_nccl"] >= 1.0 and s["evaluations"] > 0
    tables = describe(p, plan)
    assert [r[0] for r in tables[0].rows] == ["nccl-default", "autoccl", "plan"]
    assert "autoccl (ms)" in tables[1].columns and len(tables[1].rows) == len(p.ops)
    draw(p, plan, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


# ---- workloads and bad inputs -------------------------------------------------------------------

def test_from_model_builds_dp_and_tp_ops() -> None:
    p = load("llama2-13b-tp8-dp4.yaml")
    assert p.groups["tp"].ranks == 8 and p.groups["dp"].nodes == 4
    tp_ops = [o for o in p.ops if o.group == "tp"]
    assert len(tp_ops) == 4 * 40 and all(o.overlaps is None for o in tp_ops)
    dp_ops = [o for o in p.ops if o.group == "dp"]
    assert len(dp_ops) == 40 and sum(o.overlaps is None for o in dp_ops) == 1
    assert dp_ops[0].size_bytes == pytest.approx(13e9 / 40 / 8 * 2, rel=0.1)
    fsdp = validate(LagomProblem, {"kind": "lagom", "from_model": {"model": "gpt3-125m", "dp": 4, "fsdp": True}})
    assert {o.collective for o in fsdp.ops} == {"all_gather", "reduce_scatter"}


@pytest.mark.parametrize("doc, field, words", [
    ({"groups": {"g": {"ranks": 8}}, "ops": [{"name": "a", "collective": "all_reduce", "size_bytes": 1, "group": "h"}]},
     "ops[0].group", "one of the groups"),
    ({"groups": {"g": {"ranks": 8}}, "ops": [{"name": "a", "collective": "all_reduce", "size_bytes": 1, "group": "g",
                                               "overlaps": "nope"}]}, "ops[0].overlaps", "segment"),
    ({"groups": {"g": {"ranks": 8}}, "ops": [{"name": "a", "collective": "all_reduce", "size_bytes": "3 GHz",
                                               "group": "g"}]}, "ops.0.size_bytes", "GHz"),
    ({"groups": {"g": {"ranks": 8}}, "ops": [{"name": "a", "collective": "allreduce", "size_bytes": 1, "group": "g"}]},
     "ops.0.collective", "all_reduce"),
    ({"groups": {"g": {"ranks": 8, "nodes": 3}}, "ops": []}, "groups.g.nodes", "divisor"),
    ({"groups": {"g": {"ranks": 8, "nodes": 2}}, "ops": []}, "groups.g.inter_GBps", "network bandwidth"),
    ({"from_model": {"model": "gpt5", "dp": 8}}, "from_model", "catalog"),
    ({"from_model": {"model": "llama2-7b", "dp": 8, "tp": 16}}, "from_model.tp", "gpus_per_node"),
    ({"hardware": {"gpu": "X1"}, "groups": {"g": {"ranks": 2}}, "ops": []}, "hardware.gpu", "catalog"),
])
def test_bad_workload_files_get_clear_errors(tmp_path, doc, field, words) -> None:
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"kind": "lagom", **doc}))
    with pytest.raises(InputError) as info:
        validate(LagomProblem, read_document(path), file=path)
    text = str(info.value)
    assert text.startswith(str(path)) and words in text
    assert field.replace(".", "").replace("[", "").replace("]", "") in \
        text.replace(".", "").replace("[", "").replace("]", "")


def test_with_profile_fits_group_figures(tmp_path) -> None:
    from gpuplan.models.lagom import with_profile
    from gpuplan.models.profile import Profile

    points = [{"size_bytes": s, "timing": {"median_s": 1e-4 + s / 2e10, "min_s": 1e-4, "max_s": 1e-3, "repeats": 3,
                                            "rel_spread": 0.01},
               "algbw_GBps": 1.0, "busbw_GBps": 1.0} for s in (2**20, 2**24)]
    prof = Profile.model_validate({
        "device_types": [{"name": "H100", "memory_bytes": 8e10}], "nodes": [{"name": "n", "devices": {"H100": 8}}],
        "collectives": [{"op": "all_reduce", "backend": "nccl", "group_size": 8, "points": points,
                         "fit": {"alpha_s": 1e-4, "bandwidth_GBps": 20.0, "max_rel_error": 0.0, "mean_rel_error": 0.0}}]})
    p = load("llama2-7b-dp8.yaml")
    q = with_profile(p, prof)
    prof.save(tmp_path / "prof.json")
    inline = validate(LagomProblem, {**read_document(EXAMPLES / "llama2-7b-dp8.yaml"), "profile": "prof.json"},
                      file=tmp_path / "w.yaml")
    assert inline.groups["dp"].cap_GBps == q.groups["dp"].cap_GBps
    with pytest.raises(InputError, match="profile"):
        validate(LagomProblem, {"kind": "lagom", "profile": "none.json", "groups": {}, "ops": []}, file=tmp_path / "w.yaml")
    assert q.groups["dp"].cap_GBps == pytest.approx(20.0 * 2 * 7 / 8)
    link = q.groups["dp"].link(q.hardware)
    assert cost.nccl_latency_us("all_reduce", "ring", "Simple", link, q.constants) == pytest.approx(100.0)
    assert q.constants.fitted_from.startswith("profile")
    assert math.isclose(q.compiled.links[0].cap_GBps, 35.0)


def _poseidon_plan_doc() -> dict:
    stage = {"device_type": "H100", "tp": 2, "dp": 2, "first_layer": 0, "last_layer": 12, "micro_batch_size": 1,
             "forward_s": 0.004, "backward_s": 0.008}
    return {"kind": "poseidon", "schema_version": 1, "status": "feasible", "num_microbatches": 4,
            "stages": [{**stage, "index": 0, "nodes": ["dgx0"]},
                       {**stage, "index": 1, "nodes": ["dgx1"], "first_layer": 12, "last_layer": 24,
                        "forward_s": 0.005, "backward_s": 0.01}],
            "problem": {"kind": "poseidon", "model": "gpt3-1.3b", "seq_len": 2048, "global_batch": 16,
                        "cluster": {"preset": "dgx-a100x4"}}}


def test_from_poseidon_plan_file(tmp_path) -> None:
    (tmp_path / "pp.json").write_text(json.dumps(_poseidon_plan_doc()))
    doc = {"kind": "lagom", "from_poseidon": {"plan": "pp.json"}}
    (tmp_path / "w.yaml").write_text(json.dumps(doc))
    p = validate(LagomProblem, read_document(tmp_path / "w.yaml"), file=tmp_path / "w.yaml")
    assert p.name.startswith("poseidon stage 1")            # the slower stage is the bottleneck
    assert set(p.groups) == {"tp", "dp", "pp-prev"} and p.groups["pp-prev"].nodes == 2
    tp = [o for o in p.ops if o.group == "tp"]
    assert len(tp) == 8 and tp[0].count == 24 and tp[0].overlaps is None
    assert [o for o in p.ops if o.group == "dp"][0].count == 12
    plan = solvers.solve_lagom(p)
    assert check(p, plan) == [] and plan.iteration_s <= plan.predicted["iteration_s_nccl_default"]
    with pytest.raises(InputError, match="from_poseidon.plan"):
        validate(LagomProblem, {"kind": "lagom", "from_poseidon": {"plan": "missing.json"}}, file=tmp_path / "w.yaml")
    with pytest.raises(InputError, match="from_poseidon.stage"):
        validate(LagomProblem, {"kind": "lagom", "from_poseidon": {"plan": _poseidon_plan_doc(), "stage": 5}})


def test_from_a_real_poseidon_plan(tmp_path) -> None:
    pytest.importorskip("gpuplan.solvers.poseidon")
    from gpuplan import api

    pp = api.load_problem({"kind": "poseidon", "cluster": {"preset": "dgx-a100x4"}, "model": "gpt3-350m",
                           "global_batch": 16, "seq_len": 1024})
    api.solve(pp, time_limit_s=10).save(tmp_path / "pp.json")
    p = api.load_problem({"kind": "lagom", "from_poseidon": {"plan": str(tmp_path / "pp.json")}})
    plan = api.solve(p)
    assert api.check(p, plan) == []
    assert plan.iteration_s <= plan.predicted["iteration_s_nccl_default"]


def test_cli_solve_check_compare_show_run(tmp_path) -> None:
    import sys

    from click.testing import CliRunner

    from gpuplan.cli import main

    runner = CliRunner()
    plan = tmp_path / "plan.json"
    res = runner.invoke(main, ["solve", "lagom", str(EXAMPLES / "small.yaml"), "-q", "-o", str(plan)])
    assert res.exit_code == 0, res.output
    assert runner.invoke(main, ["check", str(plan)]).exit_code == 0
    res = runner.invoke(main, ["compare", "lagom", str(EXAMPLES / "small.yaml"), "-q"])
    assert res.exit_code == 0 and "autoccl" in res.output and "exhaus" in res.output
    res = runner.invoke(main, ["show", str(plan), "--png", str(tmp_path / "t.png")])
    assert res.exit_code == 0 and (tmp_path / "t.png").exists()
    res = runner.invoke(main, ["run", "lagom", str(plan), "--", sys.executable, "-c", "print(1)"])
    assert res.exit_code == 0 and "returncode" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: lagom\ngroups: {g: {ranks: 1}}\nops: []\n")
    res = runner.invoke(main, ["solve", "lagom", str(bad), "-q"])
    assert res.exit_code == 2 and "groups.g.ranks" in res.output


@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(SIZES, min_size=2, max_size=3), compute_ms=st.floats(0.1, 20), exposed=SIZES)
def test_priority_search_with_shared_windows_never_worse_than_default(sizes, compute_ms, exposed) -> None:
    ops = [{"name": f"o{k}", "collective": "all_reduce", "size_bytes": s, "group": "g", "overlaps": "s"}
           for k, s in enumerate(sizes)]
    ops.append({"name": "x", "collective": "all_gather", "size_bytes": exposed, "group": "g", "count": 3})
    p = problem(ops, [{"name": "s", "compute_s": compute_ms * 1e-3}])
    comp = p.compiled
    found, stats = solvers.priority_search(p)
    assert all(e <= stats["pass_bound"] for e in stats["evaluations_per_pass"])
    default = [comp.nccl_default(i) for i in range(len(ops))]
    assert comp.iteration_us(found) <= comp.iteration_us(default) * (1 + 1e-12)
    assert all(not comp.valid(i, t) for i, t in enumerate(found))


# ---- groups as NCCL 2.30.7 sees them: architecture, NVLink rate, rails, NVLS ---------------------

def _link(gpu: str, **group) -> cost.Link:
    from gpuplan.models.lagom import Group, Hardware

    return Group.model_validate(group).link(Hardware(gpu=gpu))


def test_group_link_uses_the_architectures_tables_and_achieved_nvlink() -> None:
    a100, h100 = _link("A100-80GB", ranks=8), _link("H100", ranks=8)
    # achieved NVLink (NCCL: 12 x 20 GB/s on SM80, 18 x 20.6 on SM90), not 300 / 450 line rate
    assert a100.channels * a100.channel_GBps == pytest.approx(240.0)
    assert h100.channels * h100.channel_GBps == pytest.approx(360.0)
    # ring LL capped by llMaxBws: Ampere 87.7, Hopper 141 (one node)
    assert cost.nccl_busbw_GBps("all_reduce", "ring", "LL", a100, C) == pytest.approx(87.7)
    assert cost.nccl_busbw_GBps("all_reduce", "ring", "LL", h100, C) == pytest.approx(141.0)
    # NVLS by NCCL's rule: Hopper on NVSwitch has it, Ampere does not; NCCL picks it for 1 GiB
    assert h100.nvls and not a100.nvls
    assert cost.nccl_default("all_reduce", 2**30, h100, C)[0] == "nvls"
    assert cost.nccl_default("all_reduce", 2**30, _link("H100", ranks=8, nvls=False), C)[0] == "ring"


def test_rings_across_nodes_use_every_rail_and_nvls_tree() -> None:
    one = _link("A100-80GB", ranks=16, nodes=2, inter_GBps="200 Gbps")
    eight = _link("A100-80GB", ranks=16, nodes=2, inter_GBps="200 Gbps", nics=8)
    bw1 = cost.nccl_busbw_GBps("all_reduce", "ring", "Simple", one, C)
    bw8 = cost.nccl_busbw_GBps("all_reduce", "ring", "Simple", eight, C)
    assert bw1 == pytest.approx(24.0) and bw8 == pytest.approx(8 * 24.0)   # PCIe Gen4 path: 24 GB/s a NIC
    h = _link("H100", ranks=16, nodes=2, inter_GBps="400 Gbps", nics=8)
    assert cost.nccl_default("all_reduce", 2**30, h, C)[0] == "nvlstree"
    assert cost.algo_allowed("nvls", "all_reduce", h) is not None


def test_tree_correction_changes_the_estimate() -> None:
    """tuning.cc's treeCorrectionFactor: tree Simple at 1 MiB runs at 0.5 of its bandwidth."""
    link = _link("A100-80GB", ranks=16, nodes=2, inter_GBps="200 Gbps", nics=8)
    bus = cost.nccl_busbw_GBps("all_reduce", "tree", "Simple", link, C)
    lat = cost.nccl_latency_us("all_reduce", "tree", "Simple", link, C)
    t = cost.nccl_time_us("all_reduce", 2**20, "tree", "Simple", link, C)
    assert t == pytest.approx(lat + 2**20 / (1000 * bus * 0.5 * 0.5))


def test_from_poseidon_groups_use_the_clusters_nics() -> None:
    """A data-parallel group with 2 GPUs on each of 2 DGX A100 nodes (8 NICs for 8 GPUs) drives 2 rails;
    a pipeline pair (one GPU a side) drives 1; a one-NIC cluster gives 1 to both."""
    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    doc = _poseidon_plan_doc()
    doc["stages"][1].update(nodes=["dgx1", "dgx2"], dp=4)
    fields = workload_from_poseidon(doc, stage=1)
    assert fields["groups"]["dp"]["nodes"] == 2 and fields["groups"]["dp"]["nics"] == 2
    assert fields["groups"]["pp-prev"]["nics"] == 1
    one_nic = {"nodes": [{"name": f"dgx{i}", "gpus": {"A100-80GB": 8}} for i in range(4)],
               "inter_node": {"bandwidth_GBps": "200 Gbps", "nics_per_node": 1}}
    doc["problem"]["cluster"] = one_nic
    assert workload_from_poseidon(doc, stage=1)["groups"]["dp"]["nics"] == 1
    p = validate(LagomProblem, {"kind": "lagom", **workload_from_poseidon(_poseidon_plan_doc() | {
        "stages": doc["stages"], "problem": _poseidon_plan_doc()["problem"]}, stage=1)})
    assert p.groups["dp"].nics == 2


def test_a_coarse_thread_grid_without_trees_thread_count_still_solves() -> None:
    # thread_step 128 searches 64, 192, ..., 576 threads: none is Tree's 640, so the AutoCCL-style
    # descent has no grid value for that subspace and must skip it (it raised ValueError)
    doc = {"kind": "lagom", "hardware": {"gpu": "L4"},
           "groups": {"g": {"ranks": 2, "nodes": 2, "inter_GBps": "100 Gbps", "intra": "pcie"}},
           "segments": [{"name": "s0", "compute_s": 0.001}],
           "ops": [{"name": "ar", "collective": "all_reduce", "size_bytes": "200 MiB", "group": "g", "overlaps": "s0"}],
           "grid": {"thread_step": 128}}
    problem = api.load_problem(doc)
    for solver in ("lagom", "autoccl"):
        plan = api.solve(problem, solver=solver, time_limit_s=2)
        assert api.check(problem, plan) == [], solver


@pytest.mark.parametrize("grid", [{"max_channels": 1}, {"thread_step": 256}, {"max_channels": 8, "thread_step": 128}])
def test_grids_with_no_valid_value_for_an_algorithm_still_solve(grid: dict) -> None:
    # max_channels 1 leaves NVLS (>= 2 channels) nothing on the grid, coarse thread steps leave out the
    # counts some protocols need: every search skips such a subspace (the priority search and the
    # exhaustive one took the argmin of an empty grid)
    doc = {"kind": "lagom", "hardware": {"gpu": "H100"}, "groups": {"dp": {"ranks": 8, "nodes": 1, "intra": "nvlink"}},
           "segments": [{"name": "bwd", "compute_s": 0.004}],
           "ops": [{"name": "b", "collective": "all_reduce", "size_bytes": "64 MiB", "group": "dp", "overlaps": "bwd"}],
           "grid": grid}
    problem = api.load_problem(doc)
    times = {}
    for solver in ("lagom", "exhaustive", "autoccl", "nccl-default"):
        plan = api.solve(problem, solver=solver, time_limit_s=2)
        assert api.check(problem, plan) == [], solver
        times[solver] = plan.iteration_s
    assert times["exhaustive"] <= min(times.values()) * (1 + 1e-9)   # exact: one op in its window


def test_from_model_keeps_the_documents_name_and_refuses_its_own_groups() -> None:
    """`from_model` builds groups, segments and ops; the document's `name` is the user's and is kept
    (it was replaced by the generated one), and groups given beside from_model are refused (they
    were replaced silently)."""
    doc = {"kind": "lagom", "name": "my 7B run", "hardware": {"gpu": "H100"},
           "from_model": {"model": "llama2-7b", "dp": 8, "micro_batch": 1, "seq_len": 4096}}
    assert api.load_problem(doc).name == "my 7B run"
    unnamed = {k: v for k, v in doc.items() if k != "name"}
    assert api.load_problem(unnamed).name == "llama2-7b dp=8 tp=1"
    with pytest.raises(InputError, match="groups"):
        api.load_problem({**doc, "groups": {"dp": {"size": 8}}})
