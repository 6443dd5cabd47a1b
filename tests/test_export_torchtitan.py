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


def _bundle(tmp: Path, cluster: dict, model: str | dict, config: str,  # type: ignore[type-arg]
            *, seq_len: int = 1024, global_batch: int = 16) -> Path:
    problem = {"kind": "poseidon", "cluster": cluster, "model": model, "global_batch": global_batch, "seq_len": seq_len}
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


@pytest.fixture(scope="module")
def mixed_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One node with two GPU types, the plan on the second type's four GPUs (local indices 4..7)."""
    cluster = {"nodes": [{"name": "h0", "gpus": {"A100-80GB": 4, "H100": 4}}]}
    return _bundle(tmp_path_factory.mktemp("mixed"), cluster, "llama3-8b",
                   "tp=2,pp=2,dp=1,mb=1,recompute=full,device_type=H100")


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
    assert script.index('. "$HERE/nccl.env"') < script.index("torchrun --nproc-per-node 4 ")
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
    assert "  0) NPROC=6 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 ;;" in script and '--nproc-per-node "$NPROC"' in script
    assert "  1) NPROC=2 CUDA_VISIBLE_DEVICES=0,1 ;;" in script
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
        model_cfg = pkg.model_registry(c.flavor).model
        assert _titan_shape(model_cfg) == c.shape(), c.name
        assert model_cfg.max_seq_len == c.max_seq_len, c.name  # the RoPE length update_from_config checks
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

    from gpuplan.export.launcher import env_file_text

    value = "allreduce:ring;allgather:tree"
    env_file = tmp_path / "nccl.env"
    env_file.write_text(env_file_text({"NCCL_ALGO": value, "NCCL_PROTO": "Simple"}))
    out = subprocess.run(["sh", "-c", f'set -a; . "{env_file}"; set +a; printf %s "$NCCL_ALGO"'],
                         capture_output=True, text=True, check=True)
    assert out.stdout == value and out.stderr == ""


_FAKE_TORCHRUN = """#!/bin/sh
# a stand-in for torchrun: logs the GPU pinning and its arguments; with --no-python it runs the command
# once per rank 0..WORLD-1 with RANK set, as torchrun does
{ echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"; echo "ORDER=${CUDA_DEVICE_ORDER-unset}"
  for a in "$@"; do echo "ARG=$a"; done; } >> "$LOG"
while [ $# -gt 0 ] && [ "$1" != --no-python ]; do shift; done
[ $# -gt 0 ] || exit 0
shift
r=0
while [ "$r" -lt "$WORLD" ]; do RANK=$r "$@" || exit $?; r=$((r + 1)); done
"""

_FAKE_PYTHON = """#!/bin/sh
echo "RANK=$RANK ALGO=${NCCL_ALGO-unset} PROTO=${NCCL_PROTO-unset}" >> "$LOG"
"""


def _run_sh(script: Path, tmp: Path, cwd: Path, shell: str = "sh", **env: str) -> list[str]:
    """Run an exported run.sh with fake torchrun and python on PATH (from `cwd`); return the log lines."""
    import os
    import subprocess

    bin_dir = tmp / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("torchrun", _FAKE_TORCHRUN), ("fakepython", _FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp / "log.txt"
    log.unlink(missing_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NCCL_"))}
    full.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", LOG=str(log), PYTHON="fakepython", WORLD="0")
    full.update(env)
    subprocess.run([shell, str(script)], cwd=cwd, env=full, check=True, capture_output=True, text=True)
    return log.read_text().splitlines()


def test_run_sh_pins_the_plans_gpus_of_a_mixed_node(mixed_node: Path, tmp_path: Path) -> None:
    # the plan runs on h0's H100s, local indices 4..7 after its four A100s: torchtitan's rank with LOCAL_RANK i
    # takes the i-th visible GPU, so without pinning the ranks would run on the A100s 0..3
    from gpuplan.export import megatron

    result = torchtitan.export(mixed_node, tmp_path / "tt")
    script = (tmp_path / "tt" / "run.sh").read_text()
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in script
    assert script.index("export CUDA_VISIBLE_DEVICES=4,5,6,7") < script.index("torchrun --nproc-per-node 4 ")
    assert any(n.startswith("node h0: the plan uses 4 of its GPUs (4 A100-80GB, 4 H100)") and
               "CUDA_VISIBLE_DEVICES=4,5,6,7" in n for n in result["notes"])
    log = _run_sh(tmp_path / "tt" / "run.sh", tmp_path, tmp_path)
    assert log[:2] == ["CVD=4,5,6,7", "ORDER=PCI_BUS_ID"]
    # Megatron-LM: the same node order and GPUs, in the result and the notes
    m = megatron.export(mixed_node)
    assert m["nodes"] == [{"node": "h0", "node_rank": 0, "ranks": 4, "cuda_visible_devices": "4,5,6,7"}]
    assert any("CUDA_VISIBLE_DEVICES=4,5,6,7" in n for n in m["notes"])


def test_run_sh_pins_each_nodes_gpus_of_a_partial_plan(two_nodes: Path, tmp_path: Path) -> None:
    # two 8-GPU nodes, the plan on GPUs 2..5 of each: NODE_RANK r's ranks get its node's four
    job = training_job(two_nodes, "torchtitan")
    partial = dataclasses.replace(job, cluster=_nodes(8, 8), stage_gpus=[[2, 3, 4, 5], [10, 11, 12, 13]])
    lay = torchtitan.launch(partial)
    assert lay.devices == [[2, 3, 4, 5], [2, 3, 4, 5]] and lay.nproc == [4, 4]
    assert sum("uses 4 of its GPUs (8 H100)" in n for n in lay.notes) == 2
    path = tmp_path / "run.sh"
    path.write_text(torchtitan.run_script(partial, ["--module", "llama3"], lay, None))
    script = path.read_text()
    assert "  1) CUDA_VISIBLE_DEVICES=2,3,4,5 ;;" in script and "--nproc-per-node 4 --node-rank" in script
    for rank in ("0", "1"):
        log = _run_sh(path, tmp_path, tmp_path, NODE_RANK=rank, MASTER_ADDR="h0")
        assert log[0] == "CVD=2,3,4,5"
    # a plan that names no placement pins nothing
    bare = torchtitan.launch(dataclasses.replace(job, cluster={}))
    assert bare.devices == [] and "CUDA_VISIBLE_DEVICES" not in torchtitan.run_script(job, [], bare, None)


def test_export_directory_can_move(one_stage: Path, tmp_path: Path) -> None:
    # torchtitan opens pipeline_parallel_schedule_csv relative to its working directory: torchtitan.args names
    # it relative to the export directory, run.sh by its own directory, run from anywhere
    import shutil

    torchtitan.export(one_stage, tmp_path / "tt")
    assert "pp_schedule.csv" in (tmp_path / "tt" / "torchtitan.args").read_text().splitlines()
    moved = tmp_path / "elsewhere" / "job dir"
    shutil.copytree(tmp_path / "tt", moved)
    shutil.rmtree(tmp_path / "tt")
    work = tmp_path / "work"
    work.mkdir()
    log = _run_sh(moved / "run.sh", tmp_path, work)
    args = [line.removeprefix("ARG=") for line in log if line.startswith("ARG=")]
    csv = Path(args[args.index("--parallelism.pipeline_parallel_schedule_csv") + 1])
    assert csv == moved / "pp_schedule.csv" and csv.is_file()
    assert str(tmp_path) not in (moved / "run.sh").read_text()


def test_an_export_directory_that_cannot_be_made_is_an_output_error(one_stage: Path, tmp_path: Path) -> None:
    from gpuplan.errors import OutputError

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputError, match="cannot write the torchtitan export directory"):  # was a raw OSError
        torchtitan.export(one_stage, tmp_path / "a-file" / "tt")


def _per_stage_job(two_nodes: Path) -> torchtitan.TrainingJob:
    job = training_job(two_nodes, "torchtitan")  # tp=2, pp=2, dp=2: stage k holds ranks 4k .. 4k+3
    return dataclasses.replace(job, nccl_env={0: {"NCCL_ALGO": "allreduce:ring;allgather:tree"},
                                              1: {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}})


def test_per_stage_nccl_env_wrapper(two_nodes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages with different NCCL settings: run.sh starts every rank through nccl_env.sh, which exports the
    settings of the rank's stage (RANK / (tp dp)) before running the trainer."""
    import os
    import shutil
    import subprocess

    job = _per_stage_job(two_nodes)
    monkeypatch.setattr(torchtitan, "training_job", lambda bundle, trainer: job)
    out = tmp_path / "tt"
    result = torchtitan.export(two_nodes, out)
    assert not (out / "nccl.env").exists() and (out / "nccl-stage1.env").is_file()
    assert any("nccl_env.sh" in n and "differ per stage" in n for n in result["notes"])
    wrapper = (out / "nccl_env.sh").read_text()
    assert "STAGE=$((RANK / 4))" in wrapper and '  1) set -a; . "$HERE/nccl-stage1.env"; set +a ;;' in wrapper
    script = (out / "run.sh").read_text()
    assert ('--no-python sh "$HERE/nccl_env.sh" "${PYTHON:-python}" -m torchtitan.train --module llama3 '
            in script)
    shells = ["sh"] + (["bash"] if shutil.which("bash") else [])
    for shell in shells:  # run.sh -> fake torchrun -> nccl_env.sh per RANK -> fake python: each stage's settings
        log = _run_sh(out / "run.sh", tmp_path, tmp_path, shell, NODE_RANK="0", MASTER_ADDR="h0", WORLD="8")
        ranks = [line for line in log if line.startswith("RANK=")]
        assert ranks[:4] == [f"RANK={r} ALGO=allreduce:ring;allgather:tree PROTO=unset" for r in range(4)], shell
        assert ranks[4:] == [f"RANK={r} ALGO=Tree PROTO=Simple" for r in range(4, 8)], shell
    for bad in ("8", "x", ""):  # outside the plan's stages, or not a rank: refused, the trainer not run
        r = subprocess.run(["sh", str(out / "nccl_env.sh"), "echo", "ran"], capture_output=True, text=True,
                           env={"RANK": bad, "PATH": os.environ["PATH"]})
        assert r.returncode == 2 and "ran" not in r.stdout and "nccl_env.sh: RANK" in r.stderr


def test_what_torchtitan_refuses_at_start_is_refused(tmp_path: Path) -> None:
    # the plan's model (qwen3's debug shape, 8192 positions) allows 8192 tokens; torchtitan's qwen3_debugmodel
    # caches RoPE for 4096 and raises ValueError at start for a longer training.seq_len
    tiny = {"name": "tiny-qwen", "num_layers": 8, "hidden": 256, "heads": 16, "kv_heads": 8, "head_dim": 128,
            "ffn_hidden": 3072, "vocab": 2048, "tied_embeddings": True, "max_seq_len": 8192}
    bundle = _bundle(tmp_path, _nodes(1), tiny, "tp=1,pp=1,dp=1,mb=1", seq_len=8192, global_batch=4)
    with pytest.raises(ExportRefused) as err:
        torchtitan.export(bundle, tmp_path / "tt")
    msg = str(err.value)
    assert msg.startswith("torchtitan cannot run this plan: sequences of at most 4096 tokens "
                          "(qwen3:qwen3_debugmodel's RoPE max_seq_len")
    assert "the plan's seq_len is 8192" in msg and not (tmp_path / "tt").exists()
    # a config gpuplan does not know: exported, noted unchecked
    result = torchtitan.export(bundle, tmp_path / "mine", config="mymodels:tiny")
    assert any("did not check the plan's seq_len 8192" in n for n in result["notes"])
    # the same model over two pipeline stages at 1024 tokens: torchtitan refuses weight tying with PP
    job = dataclasses.replace(training_job(bundle, "torchtitan"), seq_len=1024, layers=[(0, 4), (4, 8)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torchtitan, "training_job", lambda bundle, trainer: job)
        with pytest.raises(ExportRefused, match="tied embeddings: qwen3:qwen3_debugmodel ties .* 2 stages"):
            torchtitan.export(bundle, tmp_path / "pp")


def test_megatron_launch_dir_runs_pretrain_gpt_on_the_plans_nodes(two_nodes: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`export megatron --launch-dir`: run.sh runs $MEGATRON_LM/pretrain_gpt.py under torchrun with the plan's
    arguments and a short benchmark run, on mock data with the plan's vocabulary unless given data arguments;
    per-stage NCCL settings go through the same wrapper as torchtitan's (Megatron ranks pp, dp, tp too)."""
    import subprocess

    from gpuplan.export import megatron

    out = tmp_path / "mg"
    result = megatron.export(two_nodes, out)
    assert sorted(Path(f).name for f in result["files"]) == ["megatron.args", "nccl.env", "run.sh"]
    assert (out / "megatron.args").read_text().split() == result["args"] + megatron.BENCHMARK_ARGS
    vocab = training_job(two_nodes, "Megatron-LM").model["vocab"]
    log = _run_sh(out / "run.sh", tmp_path, tmp_path, NODE_RANK="1", MASTER_ADDR="h0", MEGATRON_LM="/opt/mlm")
    args = [line[4:] for line in log if line.startswith("ARG=")]
    assert args[:8] == ["--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1", "--rdzv-backend", "static"]
    start = args.index("/opt/mlm/pretrain_gpt.py")
    assert args[start + 1:] == (result["args"] + megatron.BENCHMARK_ARGS + [
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
        "--make-vocab-size-divisible-by", "1"])
    # data arguments given to run.sh replace the mock data and come last (Megatron keeps the last value)
    script_args = ["--data-path", "/data/x", "--train-iters", "100"]
    import os
    env = {**os.environ, "NODE_RANK": "0", "MASTER_ADDR": "h0", "MEGATRON_LM": "/opt/mlm",
           "LOG": str(tmp_path / "log2.txt"), "PATH": f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", str(out / "run.sh"), *script_args], env=env, check=True, capture_output=True, text=True)
    got = [line[4:] for line in (tmp_path / "log2.txt").read_text().splitlines() if line.startswith("ARG=")]
    assert got[-4:] == script_args and "--mock-data" not in got
    # without MEGATRON_LM: refused with a message, nothing run
    env.pop("MEGATRON_LM")
    r = subprocess.run(["sh", str(out / "run.sh")], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "set MEGATRON_LM" in r.stderr
    # per-stage NCCL settings: the wrapper, with Megatron-LM's name in its notes
    job = _per_stage_job(two_nodes)
    monkeypatch.setattr(megatron, "training_job", lambda bundle, trainer: job)
    staged = megatron.export(two_nodes, tmp_path / "mg2")
    assert (tmp_path / "mg2" / "nccl_env.sh").is_file() and any("Megatron-LM's mesh order" in n
                                                                for n in staged["notes"])
    assert ('--no-python sh "$HERE/nccl_env.sh" "${PYTHON:-python}" "$MEGATRON_LM/pretrain_gpt.py"'
            in (tmp_path / "mg2" / "run.sh").read_text())
