"""End-to-end profiler runs on CPU: the CLI in --quick mode, gloo collectives with 2 and 4
processes, the multi-node path (4 ranks as 2 nodes), and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from gpuplan.models.profile import load_profile
from gpuplan.profiling import collectives as coll

pytestmark = pytest.mark.slow

SMALL = [256 * coll.KiB, coll.MiB, 4 * coll.MiB]


def test_quick_profile_cli_writes_a_valid_profile_a_solver_accepts(tmp_path) -> None:
    from gpuplan.cli import main

    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "--quick", "--validate", "-q", "--cpu-ranks", "2",
                                       "--model", "llama2-7b", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "profile written to" in result.output and "self-check" in result.output
    profile = load_profile(out)
    assert profile.quick and profile.nodes[0].devices == {"cpu": 2}
    (cpu,) = profile.device_types
    assert cpu.backend == "cpu" and cpu.threads >= 1 and cpu.matmul_tflops["fp32"] > 0 and cpu.copy_GBps > 0
    assert {c.op for c in profile.collectives} == set(coll.OPS)
    sizes = [p.size_bytes for p in profile.collectives[0].points]
    assert sizes[0] == 4 * coll.KiB and sizes[-1] == 64 * coll.MiB
    assert all(c.fit is not None for c in profile.collectives)
    assert profile.links and profile.links[0].a == profile.links[0].b == profile.nodes[0].name
    (table,) = profile.layers
    assert table.scaled_from == "llama2-7b" and "scaled configuration" in table.scaling_note
    assert {c.part for c in table.costs} == {"layer", "embedding", "head"}
    assert [v.layers for v in profile.validation] == [2, 4, 8]
    # profile -> problem -> solve: the OEF model on the profiled CPU devices
    problem = tmp_path / "oef.yaml"
    problem.write_text(yaml.safe_dump({
        "kind": "oef", "cluster": {"profile": "p.json"}, "job_types": {"t": {"cpu": 1.0}},
        "tenants": [{"name": "a", "jobs": [{"name": "j", "type": "t"}]},
                    {"name": "b", "jobs": [{"name": "k", "type": "t"}]}]}))
    solved = CliRunner().invoke(main, ["solve", "oef", str(problem), "-q", "-o", str(tmp_path / "plan.json")])
    assert solved.exit_code == 0, solved.output
    checked = CliRunner().invoke(main, ["check", str(tmp_path / "plan.json")])
    assert checked.exit_code == 0, checked.output
    shown = CliRunner().invoke(main, ["profile", "show", str(out)])
    assert shown.exit_code == 0 and "collectives" in shown.output


def test_profile_cli_errors(tmp_path) -> None:
    from gpuplan.cli import main

    bad_model = CliRunner().invoke(main, ["profile", "--quick", "--model", "gpt5", "-o", str(tmp_path / "x.json")])
    assert bad_model.exit_code == 2 and "--model" in bad_model.output and "gpt5" in bad_model.output
    import torch

    if not torch.cuda.is_available():
        no_gpu = CliRunner().invoke(main, ["profile", "--device", "cuda", "-o", str(tmp_path / "x.json")])
        assert no_gpu.exit_code == 2 and "torch sees no CUDA device" in no_gpu.output
    truncated = tmp_path / "t.json"
    truncated.write_text('{"kind": "profile", "schema_version": 1, "device_')
    shown = CliRunner().invoke(main, ["profile", "merge", str(truncated), str(truncated), "-o", str(tmp_path / "m.json")])
    assert shown.exit_code == 2 and ("t.json: not a JSON profile (truncated or corrupt" in shown.output
                                     or "t.json: not valid JSON" in shown.output)


@pytest.mark.parametrize("ranks", [2, 4])
def test_gloo_collectives(ranks: int) -> None:
    found = coll.measure_local(ranks, sizes=SMALL, repeats=3, node="n0")
    assert [c.op for c in found] == coll.OPS
    for c in found:
        assert c.backend == "gloo" and c.group_size == ranks and [p.size_bytes for p in c.points] == SMALL
        for p in c.points:
            assert p.algbw_GBps == pytest.approx(p.size_bytes / p.timing.median_s / 1e9)
            assert p.busbw_GBps == pytest.approx(p.algbw_GBps * coll.bus_factor(c.op, ranks))
        assert c.fit is not None and c.fit.bandwidth_GBps > 0
    link = coll.link_from(found[-1], "n0", "n0")
    assert link is not None and link.bandwidth_GBps == found[-1].fit.bandwidth_GBps


def _two_node_worker(rank: int, world: int) -> dict | None:
    from gpuplan.profiling.multinode import Topology, profile_ranks
    from gpuplan.profiling.profile import ProfileOptions

    topo = Topology(rank, world, rank % 2, 2, rank // 2)
    profile = profile_ranks(topo, ProfileOptions(quick=True, layers=False), backend="gloo",
                            max_message_bytes=16 * coll.KiB)
    return None if profile is None else profile.model_dump(mode="json")


def test_multinode_profile_four_ranks_as_two_nodes(tmp_path) -> None:
    from gpuplan.models.cluster import Cluster
    from gpuplan.models.profile import Profile
    from gpuplan.runtime.launch import run_workers

    results = run_workers(_two_node_worker, 4, timeout_s=120)
    assert results[1:] == [None, None, None]
    profile = Profile.model_validate(results[0])
    names = [n.name for n in profile.nodes]
    assert len(names) == 2 and all(n.devices == {"cpu": 2} for n in profile.nodes)
    pairs = {frozenset((l.a, l.b)) for l in profile.links}
    assert pairs == {frozenset([names[0]]), frozenset([names[1]]), frozenset(names)}
    scopes = {(c.op, c.group_size, c.scope) for c in profile.collectives}
    assert ("send_recv", 2, "inter_node") in scopes and ("all_reduce", 4, "inter_node") in scopes
    assert ("all_reduce", 2, "intra_node") in scopes
    cluster = Cluster.model_validate({"profile": str(profile.save(tmp_path / "two.json"))})
    assert cluster.capacity() == {"cpu": 4}
    assert cluster.link(names[0], names[1]).bandwidth_GBps > 0


def test_torchrun_single_node(tmp_path) -> None:
    out = tmp_path / "tr.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                           "--nproc-per-node", "2", "-m", "gpuplan.profiling.multinode", "--quick", "--no-layers",
                           "--max-bytes", str(64 * coll.KiB), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = load_profile(out)
    assert len(profile.nodes) == 1 and profile.nodes[0].devices == {"cpu": 2}
    assert {c.op for c in profile.collectives} == set(coll.OPS)
    assert json.loads(out.read_text())["kind"] == "profile"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU (the CPU paths are tested above)")
def test_cuda_quick_profile(tmp_path) -> None:
    from gpuplan.profiling.profile import ProfileOptions, run_profile

    profile = run_profile(ProfileOptions(device="cuda", quick=True, validate=True))
    gpu = profile.device_types[0]
    assert gpu.backend == "cuda" and gpu.matmul_tflops["fp32"] > 0 and gpu.copy_GBps and gpu.h2d_GBps
    assert all(c.peak_bytes and c.activation_bytes > 0 for c in profile.layers[0].costs if c.part == "layer")
    assert [v.layers for v in profile.validation] == [2, 4, 8]
    load_profile(profile.save(tmp_path / "gpu.json"))
