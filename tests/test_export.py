"""Exports of a training bundle: torchtitan (parsed back with torchtitan's own config parser and torch's
schedule loader) and Megatron-LM (arguments and layout), and the refusal of plans they cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.compose import compose, write_bundle
from gpuplan.export import ExportRefused
from gpuplan.export import megatron, torchtitan
from gpuplan.export.common import refusals

ROOT = Path(__file__).resolve().parents[1]
DEBUG = "llama3:llama3_debugmodel"
ONE_NODE = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 4}}]},
            "model": "gpt3-1.3b", "global_batch": 16, "seq_len": 1024}


def _bundle(tmp: Path, config: str) -> Path:
    plan = gpuplan.evaluate_config(ONE_NODE, config)
    out = tmp / "bundle"
    write_bundle(out, compose(plan, time_limit_s=3))
    return out


@pytest.fixture(scope="module")
def tp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("tp"), "tp=2,pp=2,dp=1,mb=1,recompute=selective")


@pytest.fixture(scope="module")
def interleaved_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory.mktemp("vpp"), "tp=1,pp=2,dp=2,mb=1,recompute=none,interleave=2")


def _titan() -> tuple:  # type: ignore[type-arg]
    """Return torchtitan's config classes and tyro registry (skip when torchtitan is not installed)."""
    try:
        import tyro
        from torchtitan.config import CompileConfig, ConfigManager, ParallelismConfig, TrainingConfig
        from torchtitan.config.manager import custom_registry
        from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC
    except ImportError as exc:
        pytest.skip(f"torchtitan (pip install torchtitan==0.3.0) cannot be imported here: {exc}")
    ConfigManager()  # registers torchtitan's tyro rules (comma-separated lists)
    return tyro, ParallelismConfig, TrainingConfig, ActivationCheckpointingConfig, SelectiveAC, custom_registry, CompileConfig


def _parse_titan(args: list[str]):  # type: ignore[no-untyped-def]
    """Parse exported overrides with torchtitan's own config classes and tyro rules: the sections the
    export writes (parallelism, training, compile, activation_checkpoint) as torchtitan's Trainer.Config has
    them."""
    import dataclasses

    tyro, Par, Train, AC, SelectiveAC, registry, Compile = _titan()

    Job = dataclasses.make_dataclass("Job", [
        ("parallelism", Par, dataclasses.field(default_factory=Par)),
        ("training", Train, dataclasses.field(default_factory=Train)),
        ("compile", Compile, dataclasses.field(default_factory=Compile)),
        ("activation_checkpoint", AC, dataclasses.field(default_factory=SelectiveAC.Config))])

    rest = [a for a in args if a not in ("--module", "--config")]
    rest = [a for i, a in enumerate(rest) if i >= 2]  # drop the module and config values
    return tyro.cli(Job, args=rest, registry=registry)


def _load_csv(path: Path, ranks: int, stages: int, microbatches: int) -> dict:  # type: ignore[type-arg]
    """Load a schedule CSV with torch's own loader (PipelineScheduleMulti._load_csv validates every action
    and infers the stage-to-rank map); return that map."""
    from torch.distributed.pipelining import schedules as sch

    bare = object.__new__(sch.PipelineScheduleMulti)
    bare.pipeline_order, bare.pp_group_size, bare._num_stages = {}, ranks, stages
    bare._n_microbatches, bare._stages = microbatches, []
    sch.PipelineScheduleMulti._load_csv(bare, str(path))
    return dict(bare.stage_index_to_group_rank)


def test_torchtitan_round_trip(tp_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "tt"
    result = torchtitan.export(tp_bundle, out, config=DEBUG)  # gpt3-1.3b: no torchtitan config has its shape
    job = _parse_titan(result["args"])
    plan = gpuplan.load_plan(tp_bundle / "poseidon.json")
    st = plan.stages  # type: ignore[attr-defined]
    assert job.parallelism.pipeline_parallel_degree == len(st)
    assert job.parallelism.tensor_parallel_degree == st[0].tp == 2
    assert job.parallelism.data_parallel_replicate_degree == st[0].dp
    assert job.parallelism.pipeline_parallel_microbatch_size == st[0].micro_batch_size
    parts = job.parallelism.module_fqns_per_model_part
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == [s.num_layers for s in st]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    # the plan's selective recomputation (the attention core) is what torchtitan's SDPA kernel does anyway:
    # no checkpointing; torchtitan's own "selective" would recompute every other matmul
    assert plan.stages[0].recompute == "selective" and job.activation_checkpoint is None  # type: ignore[attr-defined]
    assert any("activation-checkpoint:none" in n for n in result["notes"])
    assert job.training.local_batch_size * st[0].dp == 16 and job.training.seq_len == 1024
    # the plan's times assume fused element-wise kernels: torch.compile gives them to torchtitan
    assert job.compile.enable is True
    # named relative to the export directory (run.sh passes "$HERE/pp_schedule.csv"): the directory can move
    assert job.parallelism.pipeline_parallel_schedule_csv == "pp_schedule.csv"
    assert str(out) not in (out / "torchtitan.args").read_text()
    csv = out / job.parallelism.pipeline_parallel_schedule_csv
    assert csv.is_file()
    assert _load_csv(csv, len(st), len(st), plan.num_microbatches) == {0: 0, 1: 1}  # type: ignore[attr-defined]
    with pytest.raises(AssertionError):  # torch's loader does check: the wrong micro-batch count fails
        _load_csv(csv, len(st), len(st), plan.num_microbatches + 1)  # type: ignore[attr-defined]
    env = out / "nccl.env" if (out / "nccl.env").exists() else out / "nccl-stage0.env"  # one file when stages agree
    assert env.read_text().startswith("NCCL_")


def test_torchtitan_interleaved(interleaved_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "tt"
    result = torchtitan.export(interleaved_bundle, out, config=DEBUG)
    job = _parse_titan(result["args"])
    parts = job.parallelism.module_fqns_per_model_part
    assert len(parts) == 4 and job.parallelism.pipeline_parallel_degree == 2
    layers = [int(n.split(".")[1]) for p in parts for n in p if n.startswith("layers.")]
    assert layers == list(range(24))
    m = gpuplan.load_plan(interleaved_bundle / "poseidon.json").num_microbatches  # type: ignore[attr-defined]
    mapping = _load_csv(out / job.parallelism.pipeline_parallel_schedule_csv, 2, 4, m)
    assert mapping == {0: 0, 1: 1, 2: 0, 3: 1}


def test_megatron_arguments(tp_bundle: Path, interleaved_bundle: Path) -> None:
    args = megatron.export(tp_bundle)["args"]
    a = dict(zip(args[::2], args[1::2]))
    plan = gpuplan.load_plan(tp_bundle / "poseidon.json")
    st = plan.stages  # type: ignore[attr-defined]
    assert a["--tensor-model-parallel-size"] == "2" and a["--pipeline-model-parallel-size"] == "2"
    lay = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert lay.startswith("E") and lay.endswith("L") and lay.count("|") == 1
    assert [int(x.strip("EL").removeprefix("t*")) for x in lay.split("|")] == [s.num_layers for s in st]
    assert "--sequence-parallel" in args and args[args.index("--recompute-granularity") + 1] == "selective"
    # the model's own position length (gpt3-1.3b: 2048), not the plan's sequence (1024)
    assert a["--seq-length"] == "1024" and a["--max-position-embeddings"] == "2048"
    vargs = megatron.export(interleaved_bundle)["args"]
    assert vargs[vargs.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert vargs[vargs.index("--pipeline-model-parallel-layout") + 1].count("|") == 3


def test_megatron_arguments_keep_the_models_shape(tp_bundle: Path) -> None:
    # Megatron derives the head size as hidden / heads and ties embeddings by default: a model whose head
    # size differs (qwen3-4b: 2560 / 32 = 80, heads of 128) or with untied embeddings must say so
    import dataclasses

    from gpuplan.export.common import training_job

    job = training_job(tp_bundle, "Megatron-LM")
    plain = {**job.model, "head_dim": job.model["hidden"] // job.model["heads"], "tied_embeddings": True}
    args = megatron.job_args(dataclasses.replace(job, model=plain))
    assert "--kv-channels" not in args and "--untie-embeddings-and-output-weights" not in args
    qwen = {**plain, "hidden": 2560, "heads": 32, "kv_heads": 8, "head_dim": 128, "tied_embeddings": False}
    args = megatron.job_args(dataclasses.replace(job, model=qwen))
    assert args[args.index("--kv-channels") + 1] == "128" and "--untie-embeddings-and-output-weights" in args


def test_refusals_name_what_the_trainer_lacks(tmp_path: Path) -> None:
    stages = [{"tp": 2, "dp": 1, "device_type": "A100-40GB", "micro_batch_size": 1},
              {"tp": 1, "dp": 2, "device_type": "H100", "micro_batch_size": 1}]
    reasons = refusals(stages)
    assert any("tensor-parallel degree" in r for r in reasons) and any("device types" in r for r in reasons)
    assert refusals(stages[:1]) == []
    mixed = tmp_path / "mixed"
    gpuplan.plan_training(str(ROOT / "examples/poseidon/cpu-two-types.yaml"), output=mixed, time_limit_s=3)
    with pytest.raises(ExportRefused, match="torchtitan cannot run this plan: .*device types"):
        torchtitan.export(mixed, tmp_path / "tt")
    r = CliRunner().invoke(main, ["export", "megatron", str(mixed)])
    assert r.exit_code == 2 and "Megatron-LM cannot run this plan" in r.output


def test_cli_export(tp_bundle: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["export", "torchtitan", str(tp_bundle), "-o", str(tmp_path / "tt"),
                                  "--config", DEBUG])
    assert r.exit_code == 0, r.output
    assert "did not verify" in r.output
    assert (tmp_path / "tt" / "run.sh").read_text().count("torchrun --nproc-per-node 4") == 1
    r = CliRunner().invoke(main, ["export", "megatron", str(tp_bundle), "-o", str(tmp_path / "m.args")])
    assert r.exit_code == 0 and "--pipeline-model-parallel-layout" in r.output


def test_megatron_refuses_a_sequence_longer_than_the_models_positions(tp_bundle: Path) -> None:
    # Megatron-LM asserts max_position_embeddings >= seq_length at start: the export refuses first
    import dataclasses

    from gpuplan.export.common import training_job

    job = training_job(tp_bundle, "Megatron-LM")
    with pytest.raises(ExportRefused) as err:
        megatron.job_args(dataclasses.replace(job, seq_len=4096))
    msg = str(err.value)
    assert msg.startswith("Megatron-LM cannot run this plan: sequences of at most 2048 tokens")
    assert "--max-position-embeddings" in msg and "max_seq_len" in msg and "seq_len is 4096" in msg


def test_megatron_names_each_nodes_gpus(tp_bundle: Path) -> None:
    result = megatron.export(tp_bundle)  # 4 ranks on h0's 4 GPUs: all of them, in order
    assert result["nodes"] == [{"node": "h0", "node_rank": 0, "ranks": 4, "cuda_visible_devices": "0,1,2,3"}]
    assert not any("CUDA_VISIBLE_DEVICES" in n for n in result["notes"])
    r = CliRunner().invoke(main, ["export", "megatron", str(tp_bundle)])
    line = "NODE_RANK=0 (h0, 4 ranks): CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3"
    assert r.exit_code == 0 and line in r.output
