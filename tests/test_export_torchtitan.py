"""torchtitan export: the plan's own model (torchtitan 0.3.0's config of that shape, or a refusal naming the
nearest), its launch (multi-node torchrun from the plan's placement) and Lagom's NCCL env files; the config
table checked against torchtitan's own registry when torchtitan is installed."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.compose import compose, write_bundle
from gpuplan.export import ExportRefused, torchtitan
from gpuplan.export.common import training_job


def _nodes(*sizes: int) -> dict:  # type: ignore[type-arg]
    return {"nodes": [{"name": f"h{i}", "gpus": {"H100": n}} for i, n in enumerate(sizes)]}


def _bundle(tmp: Path, cluster: dict, model: str, config: str) -> Path:  # type: ignore[type-arg]
    problem = {"kind": "poseidon", "cluster": cluster, "model": model, "global_batch": 16, "seq_len": 1024}
    out = tmp / "bundle"
    write_bundle(out, compose(gpuplan.evaluate_config(problem, config), time_limit_s=3))
    return out


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("one"), _nodes(4), "llama3-8b", "tp=2,pp=1,dp=2,mb=1,recompute=full")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("two"), _nodes(4, 4), "llama3-8b", "tp=2,pp=2,dp=2,mb=1,recompute=full")


@pytest.fixture(scope="module")
def gpt3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("gpt3"), _nodes(4), "gpt3-1.3b", "tp=2,pp=2,dp=1,mb=1,recompute=none")


def _args(result: dict) -> dict:  # type: ignore[type-arg]
    a = result["args"]
    return {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}


def test_llama3_8b_plan_gets_torchtitans_8b_config(one_stage: Path, tmp_path: Path) -> None:
    result = torchtitan.export(one_stage, tmp_path / "tt")
    a = _args(result)
    assert a["--module"] == "llama3" and a["--config"] == "llama3_8b" and result["config"] == "llama3:llama3_8b"
    parts = a["--parallelism.module_fqns_per_model_part"].split(",")
    assert parts[0] == "tok_embeddings" and parts[-2:] == ["norm", "lm_head"] and len(parts) == 32 + 3
    assert not any("did not verify" in n for n in result["notes"])
    # one stage: no per-stage NCCL note; its env is one nccl.env that run.sh exports before torchrun
    assert not any("differ per stage" in n for n in result["notes"])
    assert not list((tmp_path / "tt").glob("nccl-stage*.env"))
    env = (tmp_path / "tt" / "nccl.env").read_text()
    assert env.startswith("NCCL_")
    script = (tmp_path / "tt" / "run.sh").read_text()
    assert script.index('. "$(dirname "$0")/nccl.env"') < script.index("torchrun --nproc-per-node 4 ")
    assert "--nnodes" not in script


def test_qwen3_module_names() -> None:
    job = dataclasses.replace(_fake_job(), layers=[(0, 14), (14, 28)])
    fqns = torchtitan.module_fqns(job, "qwen3")
    assert fqns[0][0] == "tok_embeddings" and fqns[1][-2:] == ["norm", "lm_head"]
    qwen = {"name": "qwen3-1.7b", "num_layers": 28, "hidden": 2048, "heads": 16, "kv_heads": 8, "head_dim": 128,
            "ffn_hidden": 6144, "vocab": 151936, "tied_embeddings": True, "gated_mlp": True}
    assert torchtitan.matching_config(qwen).name == "qwen3:qwen3_1_7b"


def _fake_job() -> torchtitan.TrainingJob:
    return torchtitan.TrainingJob(model={}, layers=[(0, 16), (16, 32)], interleave=1, tp=2, dp=2, micro_batch_size=1,
                                  num_microbatches=8, global_batch=16, seq_len=1024, dtype="bf16", recompute="full",
                                  actions={}, split_backward=False, nccl_env={}, predicted_iteration_s=1.0)


def test_no_matching_config_is_refused(gpt3: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportRefused) as err:
        torchtitan.export(gpt3, tmp_path / "tt")
    msg = str(err.value)
    assert msg.startswith("torchtitan cannot run this plan: a config function with the plan's model gpt3-1.3b")
    assert "num_layers=24, hidden=2048, heads=16" in msg and "gated_mlp=False" in msg
    assert "nearest: llama3:" in msg or "nearest: qwen3:" in msg
    assert "--config MODULE:FUNCTION" in msg and not (tmp_path / "tt").exists()
    r = CliRunner().invoke(main, ["export", "torchtitan", str(gpt3), "-o", str(tmp_path / "tt")])
    assert r.exit_code == 2 and "--config MODULE:FUNCTION" in r.output
    r = CliRunner().invoke(main, ["export", "torchtitan", str(gpt3), "-o", str(tmp_path / "tt"), "--config", "llama3"])
    assert r.exit_code == 2 and "MODULE:FUNCTION" in r.output


def test_explicit_config(gpt3: Path, tmp_path: Path) -> None:
    result = torchtitan.export(gpt3, tmp_path / "tt", config="mymodels:gpt3_1_3b")
    a = _args(result)
    assert a["--module"] == "mymodels" and a["--config"] == "gpt3_1_3b"
    assert any("gpuplan did not verify" in n and "num_layers=24" in n for n in result["notes"])
    assert "--module mymodels --config gpt3_1_3b" in (tmp_path / "tt" / "run.sh").read_text()


def test_multi_node_run_sh(two_nodes: Path, tmp_path: Path) -> None:
    result = torchtitan.export(two_nodes, tmp_path / "tt")
    script = (tmp_path / "tt" / "run.sh").read_text()
    assert ('torchrun --nnodes 2 --nproc-per-node 4 --node-rank "$NODE_RANK" --rdzv-backend static '
            '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" -m torchtitan.train --module llama3 --config llama3_8b') in script
    assert "#   NODE_RANK=0: h0 (4 ranks)" in script and "#   NODE_RANK=1: h1 (4 ranks)" in script
    assert not any("evenly" in n or "cross a node" in n for n in result["notes"])
    per_stage = sorted(p.name for p in (tmp_path / "tt").glob("nccl-stage*.env"))
    noted = any("differ per stage" in n for n in result["notes"])
    assert noted == bool(per_stage) and noted != (tmp_path / "tt" / "nccl.env").exists()


def test_launch_uneven_nodes_and_tp_across_nodes(two_nodes: Path) -> None:
    job = training_job(two_nodes, "torchtitan")  # tp=2, pp=2, dp=2: 8 ranks
    assert torchtitan.launch(job).nproc == [4, 4]
    uneven = dataclasses.replace(job, cluster=_nodes(6, 2), stage_gpus=[[0, 1, 2, 3], [4, 5, 6, 7]])
    lay = torchtitan.launch(uneven)
    assert lay.nodes == ["h0", "h1"] and lay.nproc == [6, 2]
    assert any("do not fill its nodes evenly (h0: 6, h1: 2)" in n for n in lay.notes)
    assert not any("cross a node" in n for n in lay.notes)
    script = torchtitan.run_script(uneven, ["--module", "llama3"], lay, None)
    assert "  0) NPROC=6 ;;" in script and '--nproc-per-node "$NPROC"' in script
    crossing = torchtitan.launch(dataclasses.replace(job, cluster=_nodes(3, 5), stage_gpus=uneven.stage_gpus))
    assert crossing.nproc == [3, 5] and any("cross a node boundary" in n for n in crossing.notes)
    # the plan's stage 0 on the second node: that node becomes NODE_RANK 0
    swapped = torchtitan.launch(dataclasses.replace(job, stage_gpus=[[4, 5, 6, 7], [0, 1, 2, 3]]))
    assert swapped.nodes == ["h1", "h0"] and swapped.notes == []


def _registry(module: str):  # type: ignore[no-untyped-def]
    """Return torchtitan's (model package, config_registry) of `module`; skip when torchtitan is missing. Without
    triton (CPU-only torch), torchtitan's MoE kernels module is stubbed: its kernels are never run here."""
    try:
        import torchtitan as _  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"torchtitan (pip install torchtitan==0.3.0) cannot be imported here: {exc}")
    try:
        import triton  # noqa: F401
    except ImportError:
        from unittest import mock

        sys.modules.setdefault("torchtitan.distributed.minimal_async_ep.kernels", mock.MagicMock())
    try:
        return (importlib.import_module(f"torchtitan.models.{module}"),
                importlib.import_module(f"torchtitan.models.{module}.config_registry"))
    except ImportError as exc:
        pytest.skip(f"torchtitan's {module} model cannot be imported here: {exc}")


def _titan_shape(m) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Return a torchtitan Decoder.Config's shape in gpuplan's fields."""
    first = m.layers[0]
    att, ffn = first.attention, first.feed_forward
    assert all(layer.moe is None for layer in m.layers) and ffn.w3 is not None  # dense, gated (w1, w3: SwiGLU)
    return {"num_layers": len(m.layers), "hidden": m.dim, "heads": att.n_heads, "kv_heads": att.n_kv_heads or att.n_heads,
            "head_dim": att.head_dim or m.dim // att.n_heads, "ffn_hidden": ffn.w1.out_features,
            "vocab": m.vocab_size, "tied_embeddings": m.enable_weight_tying, "gated_mlp": True}


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(torchtitan.MODULE_NAMES))
def test_config_table_matches_torchtitan(module: str) -> None:
    import torch

    pkg, registry = _registry(module)
    entries = [c for c in torchtitan.CONFIGS if c.module == module]
    assert entries
    for c in entries:
        assert callable(getattr(registry, c.function)), c.name
        assert _titan_shape(pkg.model_registry(c.flavor).model) == c.shape(), c.name
        try:  # the function builds its Trainer.Config around that flavor (llama3_405b needs torchao: float8)
            spec = getattr(registry, c.function)().model_spec
        except ImportError:
            continue
        assert (spec.name, spec.flavor) == (module, c.flavor), c.name
    # the stage module names are the model's own top-level modules, in pipeline order
    debug = next(c for c in entries if c.flavor == "debugmodel")
    with torch.device("meta"):
        model = pkg.model_registry(debug.flavor).model.build()
    names = [n for n, _ in model.named_children()]
    emb, layers, norm, head = torchtitan.MODULE_NAMES[module]
    assert [n for n in names if n in (emb, layers, norm, head)] == [emb, layers, norm, head]
    assert sorted(model.layers.keys(), key=int) == [str(i) for i in range(debug.num_layers)]


def test_nccl_env_files_are_shell_safe(tmp_path: Path) -> None:
    """Lagom joins per-collective settings with ';' (NCCL_ALGO=allreduce:ring;allgather:tree): the env file
    run.sh sources must give the shell the whole value, not run its second half as a command."""
    import subprocess

    from gpuplan.export.torchtitan import env_file_text

    value = "allreduce:ring;allgather:tree"
    env_file = tmp_path / "nccl.env"
    env_file.write_text(env_file_text({"NCCL_ALGO": value, "NCCL_PROTO": "Simple"}))
    out = subprocess.run(["sh", "-c", f'set -a; . "{env_file}"; set +a; printf %s "$NCCL_ALGO"'],
                         capture_output=True, text=True, check=True)
    assert out.stdout == value and out.stderr == ""
