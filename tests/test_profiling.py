"""Fast tests of the profiler: fit, timing, conventions, activation counts, the schema, merge, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.cluster import Cluster
from gpuplan.models.profile import (AlphaBeta, CollectivePoint, CollectiveProfile, LayerCost, LayerTable,
                                    MeasuredDeviceType, Profile, ProfileLink, ProfileNode, cluster_document,
                                    load_profile, summary_tables)
from gpuplan.models.workload import model_config, scaled
from gpuplan.profiling import collectives as coll
from gpuplan.profiling.compute import catalog_match, matmul_point, peak_fraction, supported_dtypes
from gpuplan.profiling.fit import fit_alpha_beta
from gpuplan.profiling.merge import merge_profiles, parse_link
from gpuplan.profiling.timing import measure, quantile, spread_of

SIZES = coll.sizes_between(4 * coll.KiB, 64 * coll.MiB)


# ---- alpha-beta fit ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(1e-6, 1e-3), bw=st.floats(0.1, 500.0),
       noise=st.lists(st.floats(-0.01, 0.01), min_size=len(SIZES), max_size=len(SIZES)))
def test_fit_recovers_known_alpha_beta(alpha: float, bw: float, noise: list[float]) -> None:
    # bandwidth is only identifiable when the largest message's transfer time is not swamped by alpha
    assume(SIZES[-1] / (bw * 1e9) >= 2 * alpha)
    times = [(alpha + s / (bw * 1e9)) * (1 + e) for s, e in zip(SIZES, noise)]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.bandwidth_GBps == pytest.approx(bw, rel=0.05)
    # alpha is only identifiable where it is not swamped by the smallest message's transfer time
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1, abs=0.05 * SIZES[0] / (bw * 1e9))
    assert fit.max_rel_error <= 0.03
    assert fit.mean_rel_error <= fit.max_rel_error


def test_fit_exact_data_and_errors() -> None:
    fit = fit_alpha_beta([1e3, 1e6, 1e8], [1e-5 + 1e3 / 2e9, 1e-5 + 1e6 / 2e9, 1e-5 + 1e8 / 2e9])
    assert fit.alpha_s == pytest.approx(1e-5, rel=1e-6)
    assert fit.bandwidth_GBps == pytest.approx(2.0, rel=1e-6)
    assert fit.max_rel_error < 1e-9
    assert fit.time_s(1e6) == pytest.approx(1e-5 + 5e-4)
    with pytest.raises(ValueError, match="at least two"):
        fit_alpha_beta([1e3], [1e-5])
    with pytest.raises(ValueError, match="positive times"):
        fit_alpha_beta([1e3, 1e4], [1e-5, 0.0])


# ---- timing -----------------------------------------------------------------------------------

def test_spread_and_quantiles() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    sp = spread_of([1.0, 1.0, 1.0, 1.0])
    assert sp.median_s == 1.0 and sp.rel_spread == 0.0 and sp.reliable
    wide = spread_of([1.0, 2.0, 3.0, 10.0])
    assert not wide.reliable and wide.rel_spread > 1


def test_measure_refuses_a_wide_spread_after_re_measuring() -> None:
    calls = {"n": 0}

    def jittery() -> None:
        calls["n"] += 1
        time.sleep(0.004 if calls["n"] % 2 else 0.0005)

    sp = measure(jittery, warmup=1, repeats=4, retries=1)
    assert not sp.reliable
    assert sp.repeats == 8  # re-measured once with twice the repeats
    steady = measure(lambda: time.sleep(0.002), warmup=1, repeats=5, max_rel_spread=10.0)
    assert steady.reliable and steady.median_s >= 0.002


def test_cpu_clock_does_not_count_waiting() -> None:
    waiting = measure(lambda: time.sleep(0.01), warmup=0, repeats=3, clock="cpu", max_rel_spread=100.0)
    assert waiting.median_s < 0.005
    busy = measure(lambda: sum(range(200_000)), warmup=1, repeats=3, clock="cpu", max_rel_spread=100.0)
    assert busy.median_s > 0


def test_measure_runs_setup_untimed() -> None:
    sp = measure(lambda: None, setup=lambda: time.sleep(0.003), warmup=0, repeats=3)
    assert sp.median_s < 0.002


# ---- nccl-tests conventions -------------------------------------------------------------------

def test_bus_factors_follow_nccl_tests() -> None:
    assert coll.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert coll.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert coll.bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert coll.bus_factor("broadcast", 8) == 1.0
    assert coll.bus_factor("send_recv", 2) == 1.0
    assert coll.sizes_between(4 * coll.KiB, 64 * coll.MiB)[0] == 4096
    assert coll.sizes_between(4 * coll.KiB, 64 * coll.MiB)[-1] == 64 * 2**20


def test_to_profiles_computes_algbw_busbw_and_fit() -> None:
    raw = {"all_reduce": [(s, spread_of([1e-4 + s / 1e9] * 3).model_dump()) for s in SIZES]}
    (p,) = coll.to_profiles(raw, backend="gloo", group_size=4, nodes=["n0"])
    big = p.points[-1]
    assert big.algbw_GBps == pytest.approx(big.size_bytes / big.timing.median_s / 1e9)
    assert big.busbw_GBps == pytest.approx(1.5 * big.algbw_GBps)
    assert p.fit is not None and p.fit.bandwidth_GBps == pytest.approx(1.0, rel=1e-3)
    assert coll.link_from(p, "n0", "n0") is None  # only send_recv describes a link


# ---- devices ----------------------------------------------------------------------------------

@pytest.mark.parametrize("torch_name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("Tesla V100-SXM2-32GB", "V100-32GB"), ("NVIDIA H200", "H200"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("Tesla T4", "T4"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("NVIDIA B300 SXM6 AC", "B300"),
    ("Some Accelerator 9000", None)])
def test_catalog_match(torch_name: str, expected: str | None) -> None:
    assert catalog_match(torch_name) == expected


def test_cpu_matmul_point_and_peak_fraction() -> None:
    assert "fp32" in supported_dtypes("cpu")
    p = matmul_point("cpu", "fp32", 64, repeats=3)
    assert p.tflops == pytest.approx(2 * 64**3 / p.timing.median_s / 1e12)
    if "bf16" in supported_dtypes("cpu"):  # the full (non --quick) CPU sweep times bf16 too
        assert matmul_point("cpu", "bf16", 64, repeats=3).tflops > 0
    assert peak_fraction({"bf16": 494.7, "int4": 1.0}, "H100") == {"bf16": pytest.approx(0.5)}
    assert peak_fraction({"fp32": 1.0}, None) == {}


# ---- activation bytes: saved-tensor hooks against the analytic count ----------------------------

@pytest.mark.parametrize("name, batch, seq", [("llama3-8b", 2, 16), ("gpt3-125m", 1, 24), ("qwen3-0.6b", 1, 8)])
def test_hooks_count_what_the_block_saves(name: str, batch: int, seq: int) -> None:
    import torch

    from gpuplan.profiling.layers import block_saved_bytes, saved_tensor_bytes
    from gpuplan.runtime import gpt

    cfg = scaled(model_config(name), num_layers=2, hidden=256, vocab=512)
    blk = gpt.block(cfg, 0)
    x = torch.randn(batch, seq, cfg.hidden, requires_grad=True)
    counted = saved_tensor_bytes(lambda: blk(x), list(blk.parameters()))
    assert counted == block_saved_bytes(cfg, batch, seq, "fp32")
    # the same order as the Korthikanti-style count the models use (which assumes 16-bit, dropout)
    ratio = counted / 2 / cfg.layer_activation_bytes(batch, seq)
    assert 0.5 < ratio < 2.0


def test_layer_table_on_cpu_small() -> None:
    from gpuplan.profiling.layers import LayerPlan, block_saved_bytes, layer_table, predicted_stack_s

    cfg = scaled(model_config("llama3-8b"), num_layers=2, hidden=128, vocab=256)
    plan = LayerPlan(cfg, "llama3-8b", "tiny", [1], [16], "fp32")
    table = layer_table(plan, "cpu", "cpu", repeats=3)
    parts = {c.part: c for c in table.costs}
    assert set(parts) == {"layer", "embedding", "head"}
    assert parts["layer"].activation_bytes == block_saved_bytes(cfg, 1, 16)
    assert all(c.forward_s > 0 and c.backward_s > 0 for c in table.costs)
    assert predicted_stack_s(table, 3, 1, 16) == pytest.approx(3 * (parts["layer"].forward_s + parts["layer"].backward_s))
    # the pipeline runtime's per-call overhead was measured too, in seconds: tenths of a millisecond
    # on an idle core, tens of ms on a loaded one; the bound catches a unit slip (us or ms counted as
    # s), not speed, which benchmarks measure
    assert 0.0 <= table.stage_call_forward_s < 0.5
    assert 0.0 <= table.stage_call_backward_s < 0.5
    with pytest.raises(KeyError):
        predicted_stack_s(table, 3, 4, 16)


# ---- the profile document, as a cluster ---------------------------------------------------------

def make_profile(host: str, *, gpus: int = 4, type_name: str = "H100", tflops: float = 700.0,
                 link_GBps: float = 300.0) -> Profile:
    """Return a small synthetic profile (no torch): one node of `gpus` devices, a fitted intra link."""
    sp = spread_of([1e-3, 1e-3, 1e-3])
    points = [CollectivePoint(size_bytes=s, timing=sp, algbw_GBps=s / 1e-3 / 1e9, busbw_GBps=s / 1e-3 / 1e9)
              for s in (4096, 1 << 20)]
    fit = AlphaBeta(alpha_s=1e-5, bandwidth_GBps=link_GBps, max_rel_error=0.01, mean_rel_error=0.005)
    return Profile(
        host=host,
        device_types=[MeasuredDeviceType(name=type_name, catalog_name=catalog_match(type_name), count=gpus,
                                         memory_bytes=80 * 2**30, matmul_tflops={"bf16": tflops}, copy_GBps=3000.0)],
        nodes=[ProfileNode(name=host, devices={type_name: gpus})],
        links=[ProfileLink(a=host, b=host, bandwidth_GBps=link_GBps, latency_s=1e-5)],
        collectives=[CollectiveProfile(op="send_recv", backend="nccl", group_size=gpus, nodes=[host],
                                       points=points, fit=fit)],
        layers=[LayerTable(model="llama3-8b", config=model_config("llama3-8b").model_dump(), dtype="bf16",
                           costs=[LayerCost(device_type=type_name, micro_batch=1, seq_len=1024, forward_s=1e-3,
                                            backward_s=2e-3, activation_bytes=1e8)])])


def test_profile_round_trip_and_loads_as_a_cluster(tmp_path) -> None:
    path = make_profile("n0").save(tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded.model_dump() == make_profile("n0").model_dump()
    assert loaded.where == str(path)  # errors name the file a profile came from
    problem_dir = tmp_path / "problems"
    problem_dir.mkdir()
    cluster = validate(Cluster, {"profile": "../p.json"}, file=problem_dir / "x.yaml")
    assert cluster.source == "profile"
    assert cluster.capacity() == {"H100": 4}
    t = cluster.type_of("H100")
    assert t.measured and t.peak("bf16") == 700.0 and t.memory_bandwidth_GBps == 3000.0
    assert cluster.intra_link("n0").bandwidth_GBps == 300.0
    assert [tb.title for tb in summary_tables(load_profile(path))][0].startswith("devices")


def test_merge_two_machines_with_a_declared_link(tmp_path) -> None:
    a, b = make_profile("n0", tflops=700.0), make_profile("n1", tflops=650.0, gpus=8)
    merged = merge_profiles([a, b], [parse_link("n0:n1:100Gbps:5us")], names=["a.json", "b.json"])
    assert [n.name for n in merged.nodes] == ["n0", "n1"]
    (h100,) = merged.device_types
    assert h100.count == 12 and h100.matmul_tflops["bf16"] == 650.0  # the slower device stands for the type
    path = merged.save(tmp_path / "m.json")
    cluster = validate(Cluster, {"profile": str(path)})
    assert cluster.capacity() == {"H100": 12}
    assert cluster.link("n0", "n1").bandwidth_GBps == pytest.approx(12.5)
    assert cluster.link("n0", "n1").latency_s == pytest.approx(5e-6)
    assert len(merged.collectives) == 2 and len(merged.layers) == 2
    undeclared = merge_profiles([a, b])
    assert any("no link declared between" in n for n in undeclared.notes)


@settings(max_examples=15, deadline=None)
@given(machines=st.lists(st.tuples(st.sampled_from(["H100", "A100-80GB"]), st.integers(1, 8),
                                   st.floats(10.0, 1000.0)), min_size=1, max_size=4))
def test_merge_keeps_every_device_and_the_slowest_figures(machines: list[tuple[str, int, float]]) -> None:
    profiles = [make_profile(f"n{i}", type_name=t, gpus=g, tflops=tf) for i, (t, g, tf) in enumerate(machines)]
    merged = merge_profiles(profiles)
    cluster = Cluster.model_validate(cluster_document(merged))
    for t in {m[0] for m in machines}:
        assert cluster.capacity()[t] == sum(g for tt, g, _ in machines if tt == t)
        assert merged.device_type(t).matmul_tflops["bf16"] == min(tf for tt, _, tf in machines if tt == t)
    assert len(merged.nodes) == len(machines) and len(merged.links) == len(machines)


def test_merge_errors() -> None:
    a = make_profile("n0")
    with pytest.raises(InputError, match="'n0' is in both a.json and b.json"):
        merge_profiles([a, a], names=["a.json", "b.json"])
    with pytest.raises(InputError, match="a node of the merged profiles"):
        merge_profiles([a, make_profile("n1")], [parse_link("n0:n9:10:1e-5")])
    with pytest.raises(InputError, match="NODE_A:NODE_B:BANDWIDTH:LATENCY"):
        parse_link("n0:n1:10")
    with pytest.raises(InputError, match="bandwidth_GBps"):
        parse_link("n0:n1:fast:5us")


# ---- bad profile files ------------------------------------------------------------------------

def test_bad_and_truncated_profile_files(tmp_path) -> None:
    good = make_profile("n0").save(tmp_path / "good.json").read_text()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good[: len(good) // 2])
    with pytest.raises(InputError, match=r"truncated.json: not (a JSON profile \(truncated or corrupt|valid JSON)"):
        load_profile(truncated)
    with pytest.raises(InputError, match="no such (profile )?file"):
        load_profile(tmp_path / "missing.json")
    doc = json.loads(good)
    wrong_kind = tmp_path / "plan.json"
    wrong_kind.write_text(json.dumps({**doc, "kind": "oef"}))
    with pytest.raises(InputError, match="field 'kind': got 'oef'"):
        load_profile(wrong_kind)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "schema_version": 99}))
    with pytest.raises(InputError, match="schema_version"):
        load_profile(old)
    doc["device_types"][0]["memory_bytes"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"bad.json: field 'device_types\[0\].memory_bytes'"):
        load_profile(bad)
    with pytest.raises(InputError, match="truncated.json"):
        validate(Cluster, {"profile": str(truncated)}, file=tmp_path / "problem.yaml")


def test_a_solver_accepts_a_merged_profile_as_its_cluster(tmp_path) -> None:
    import yaml

    from gpuplan import api

    merged = merge_profiles([make_profile("v0", type_name="V100", tflops=100.0),
                             make_profile("p0", type_name="P100", tflops=20.0)],
                            [parse_link("v0:p0:25Gbps:10us")])
    merged.save(tmp_path / "cluster.json")
    (tmp_path / "problem.yaml").write_text(yaml.safe_dump({
        "kind": "oef", "cluster": {"profile": "cluster.json"},
        "job_types": {"resnet": {"V100": 3.0, "P100": 1.5}, "lstm": {"V100": 2.0, "P100": 1.8}},
        "tenants": [{"name": "a", "jobs": [{"name": "r", "type": "resnet", "gpus": 2}]},
                    {"name": "b", "jobs": [{"name": "l", "type": "lstm", "gpus": 2}]}]}))
    problem = api.load_problem(tmp_path / "problem.yaml", "oef")
    assert problem.cluster.capacity() == {"V100": 4, "P100": 4}
    plan = api.solve(problem, time_limit_s=10)
    assert plan.ok
    assert api.check(problem, plan) == []


def test_cli_solve_reads_the_profile_flag(tmp_path) -> None:
    from click.testing import CliRunner

    from gpuplan import api
    from gpuplan.cli import main

    base = make_profile("n0", gpus=8, link_GBps=200.0)
    all_reduce = base.collectives[0].model_copy(update={"op": "all_reduce", "group_size": 8})
    path = base.model_copy(update={"collectives": [all_reduce]}).save(tmp_path / "p.json")
    example = Path(__file__).resolve().parent.parent / "examples" / "lagom" / "small.yaml"
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["solve", "lagom", str(example), "--profile", str(path), "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = api.load_plan(out)
    # the 8-rank group's bus-bandwidth cap now comes from the measured all_reduce fit (busbw = algbw * 2(n-1)/n)
    assert plan.problem["groups"]["dp"]["cap_GBps"] == pytest.approx(200.0 * 2 * 7 / 8)


def test_shipped_example_profile_and_problem() -> None:
    from gpuplan import api

    folder = Path(__file__).resolve().parent.parent / "examples" / "profile"
    profile = load_profile(folder / "cpu-2core-quick.json")
    assert profile.quick and profile.layers and profile.validation
    problem = api.load_problem(folder / "oef-on-profile.yaml", "oef")
    assert problem.cluster.capacity() == {"cpu": 2} and problem.cluster.source == "profile"
    plan = api.solve(problem, time_limit_s=10)
    assert plan.ok and api.check(problem, plan) == []


# ---- the pipeline runtime's per-call overhead ------------------------------------------------------

def test_stage_call_overhead_round_trips_and_old_profiles_load_without_it(tmp_path) -> None:
    from gpuplan.models.profile import load_profile

    shipped = Path(__file__).resolve().parent.parent / "examples" / "profile" / "cpu-2core-quick.json"
    doc = json.loads(shipped.read_text())
    assert all("stage_call_forward_s" not in t for t in doc["layers"])  # written before the field existed
    old = load_profile(shipped)
    assert old.layers and all(t.stage_call_forward_s == 0.0 == t.stage_call_backward_s for t in old.layers)
    table = old.layers[0].model_copy(update={"stage_call_forward_s": 1.5e-4, "stage_call_backward_s": 2.5e-4})
    again = load_profile(old.model_copy(update={"layers": [table]}).save(tmp_path / "p.json")).layers[0]
    assert (again.stage_call_forward_s, again.stage_call_backward_s) == (1.5e-4, 2.5e-4)
    bad = dict(doc, layers=[dict(doc["layers"][0], stage_call_backward_s=-1e-3)])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match="stage_call_backward_s"):
        load_profile(tmp_path / "bad.json")
    assert LayerTable.model_validate({"model": "m", "config": {}, "costs": []}).stage_call_backward_s == 0.0


def test_stage_call_overhead_is_the_pipeline_call_minus_the_direct_call() -> None:
    import torch

    from gpuplan.profiling.stage_calls import stage_call_overhead

    torch.set_num_threads(1)
    cfg = scaled(model_config("llama3-8b"), num_layers=2, hidden=128, vocab=256)
    out = stage_call_overhead(cfg, 1, 16, "cpu", torch.float32, clock="cpu", rounds=3, ranks=2)
    assert out.ranks == 2
    assert out.calls == 2 * 3 * 4  # 2 ranks, 4 micro-batches per round, rounds after the warm-up
    assert out.pipeline_forward_s > 0 and out.direct_forward_s > 0 and out.direct_backward_s > 0
    assert out.alone_forward_s > 0 and out.alone_backward_s > 0
    assert out.forward_s == max(0.0, out.pipeline_forward_s - out.direct_forward_s)
    assert out.backward_s == max(0.0, out.pipeline_backward_s - out.direct_backward_s)
    assert not torch.distributed.is_initialized()  # measured in processes of their own
    with pytest.raises(ValueError, match="ranks=0"):
        stage_call_overhead(cfg, 1, 16, "cpu", torch.float32, clock="cpu", ranks=0)


def test_stage_call_overhead_pools_every_rank_calls() -> None:
    from gpuplan.profiling.stage_calls import overhead_from

    first = {"pipeline_F": [5.0, 6.0], "pipeline_B": [9.0, 9.0], "direct_F": [4.0, 4.0], "direct_B": [8.0, 8.0],
             "alone_F": [3.0, 3.0], "alone_B": [7.0, 7.0]}
    middle = {"pipeline_F": [7.0, 8.0], "pipeline_B": [11.0, 11.0], "direct_F": [4.0, 6.0], "direct_B": [8.0, 12.0],
              "alone_F": [3.0, 5.0], "alone_B": [7.0, 7.0]}
    out = overhead_from([first, middle])
    assert (out.pipeline_forward_s, out.direct_forward_s, out.forward_s) == (6.5, 4.0, 2.5)  # medians over ranks
    assert (out.pipeline_backward_s, out.direct_backward_s, out.backward_s) == (10.0, 8.0, 2.0)
    assert (out.alone_forward_s, out.alone_backward_s, out.ranks, out.calls) == (3.0, 7.0, 2, 4)
    faster = dict(first, pipeline_F=[1.0, 1.0])  # a pipeline call below the direct one is no overhead
    assert overhead_from([faster]).forward_s == 0.0


def test_soak_runs_for_its_seconds_and_the_sweep_soaks_each_dtype_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA each dtype's matmul points follow a soak at the power limit (compute.SOAK_S); the soak runs
    at least its seconds, and a sweep without soak_s runs none."""
    from gpuplan.profiling import compute

    started = time.perf_counter()
    ran = compute.soak("cpu", "fp32", 64, 0.05)
    assert ran >= 8 and time.perf_counter() - started >= 0.05
    calls: list[tuple[str, int, float]] = []
    monkeypatch.setattr(compute, "soak", lambda device, dtype, n, s: calls.append((dtype, n, s)) or 0)
    compute.matmul_sweep("cpu", ["fp32", "bf16"], [16, 32], repeats=3, soak_s=0.5)
    assert calls == [("fp32", compute.SOAK_N, 0.5), ("bf16", compute.SOAK_N, 0.5)]
    calls.clear()
    compute.matmul_sweep("cpu", ["fp32"], [16], repeats=3)
    assert calls == []
