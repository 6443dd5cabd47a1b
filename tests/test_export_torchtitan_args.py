"""torchtitan's overrides read back (`evaluate poseidon --torchtitan-args`): the export's torchtitan.args give
the plan's own time, torchtitan's defaults are followed, what the model lacks is refused by name, and any
argument list reads or is refused cleanly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan.cli import main
from gpuplan.errors import InputError
from gpuplan.export.torchtitan_args import read_args

DOC = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 8}}]}, "model": "llama3-8b",
       "global_batch": 32, "seq_len": 2048, "fsdp": True, "attention_library": "sdpa", "blocking_p2p": False}


def _export(tmp: Path, doc: dict, config: str) -> tuple[gpuplan.PoseidonPlan, Path, Path]:  # type: ignore[name-defined]
    """Return (plan, its torchtitan.args, the problem file without batch and sequence)."""
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import torchtitan

    plan = gpuplan.evaluate_config(doc, config)
    write_bundle(tmp / "bundle", compose(plan, time_limit_s=3))
    torchtitan.export(tmp / "bundle", tmp / "tt")
    problem = tmp / "problem.yaml"
    problem.write_text(json.dumps({k: v for k, v in doc.items() if k not in ("global_batch", "seq_len")}))
    return plan, tmp / "tt" / "torchtitan.args", problem


@pytest.mark.parametrize("config", ["tp=2,pp=2,dp=2,mb=1,recompute=full", "tp=1,pp=1,dp=8,mb=4,recompute=none",
                                    "tp=2,pp=1,dp=4,mb=2,recompute=full",  # no pipeline: 4 accumulation steps
                                    "tp=2,pp=2,dp=2,mb=1,interleave=2,recompute=full"])
def test_the_exports_overrides_read_back_give_the_plans_time(tmp_path: Path, config: str) -> None:
    plan, args, problem = _export(tmp_path, DOC, config)
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(problem), "--torchtitan-args", str(args), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["iteration_time_s"] == plan.iteration_time_s
    assert out["configuration"]["interleave"] == plan.interleave
    assert "FSDP" in out["assumptions"] and "FlashAttention-2" in out["assumptions"]


def test_torchtitans_defaults() -> None:
    run = read_args(["--module", "llama3", "--config", "llama3_8b", "--parallelism.tensor_parallel_degree", "2",
                     "--training.local_batch_size", "2", "--training.seq_len", "4096"], num_layers=32, gpus=16)
    # no data-parallel flags: FSDP over every rank tp leaves; the global batch is the local one on each replica
    assert run.config["dp"] == 8 and run.problem["fsdp"] is True and run.problem["global_batch"] == 16
    assert run.config["micro_batch"] == 2 and run.config["recompute"] == "none"
    assert run.problem["eager_kernels"] is True and run.problem["sequence_parallel"] is True  # no compile; SP by default
    ddp = read_args(["--parallelism.data_parallel_replicate_degree", "8", "--parallelism.data_parallel_shard_degree",
                     "1", "--compile.enable", "activation-checkpoint:full"], num_layers=32, gpus=8)
    assert ddp.problem["fsdp"] is False and ddp.config["dp"] == 8 and ddp.problem["overlap_dp_allreduce"] is True
    assert ddp.problem["eager_kernels"] is False and ddp.config["recompute"] == "full"
    no_sp = read_args(["--parallelism.tensor_parallel_degree", "2", "--parallelism.no-enable-sequence-parallel"],
                      num_layers=32, gpus=8)
    assert no_sp.problem["sequence_parallel"] is False


@pytest.mark.parametrize("tokens, flag", [
    (["--parallelism.context_parallel_degree", "2"], "context_parallel_degree"),
    (["--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "4"],
     "replicate"),
    (["activation-checkpoint:selective"], "activation-checkpoint"),
    (["--model.converters", "float8"], "converters"),
    (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble",
      "--parallelism.pipeline_parallel_layers_per_stage", "8"], "pipeline_parallel_schedule"),
    (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"],
     "module_fqns_per_model_part"),  # torchtitan's own split of 32 layers in 4 parts: 8, 9, 8, 7 (uneven chunks)
    (["--parallelism.pipeline_parallel_degree", "40"], "pipeline_parallel_degree"),  # 32 + 2 over 40: empty parts
    (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.module_fqns_per_model_part",
      "tok_embeddings,layers.0", "layers.2,norm,output"], "module_fqns_per_model_part"),
    (["--parallelism.tensor_parallel_degree", "zero"], "tensor_parallel_degree")])
def test_what_the_model_cannot_represent_is_refused_by_name(tokens: list[str], flag: str) -> None:
    with pytest.raises(InputError, match=flag):
        read_args(tokens, num_layers=32, gpus=16)


def test_torchtitans_own_split() -> None:
    """Without module_fqns_per_model_part the layers are split as torchtitan 0.3.0 splits them by itself: the
    embedding and the head counted as a layer each (by default), the remainder to the first parts."""
    from gpuplan.export.torchtitan_args import auto_split

    assert auto_split(1, 32, 1, 1, "x") == [32]
    assert auto_split(4, 32, 1, 1, "x") == [8, 9, 8, 7]  # 34 = 9 + 9 + 8 + 8, less the embedding and the head
    assert auto_split(16, 126, 1, 1, "x") == [7] + [8] * 14 + [7]  # Llama 3 405B on 16 stages, as Meta split it
    assert auto_split(2, 32, 0, 0, "x") == [16, 16]
    run = read_args(["--parallelism.pipeline_parallel_degree", "4"], num_layers=32, gpus=32)
    assert run.config["layers"] == [8, 9, 8, 7] and run.config["interleave"] == 1
    even = read_args(["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_first_stage_less_layers",
                      "0", "--parallelism.pipeline_parallel_last_stage_less_layers", "0"], num_layers=32, gpus=16)
    assert even.config["layers"] == [16, 16]
    by_size = read_args(["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule",
                         "Interleaved1F1B", "--parallelism.pipeline_parallel_layers_per_stage", "8",
                         "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
                         "--parallelism.pipeline_parallel_last_stage_less_layers", "0"], num_layers=32, gpus=16)
    assert by_size.config["interleave"] == 2 and "layers" not in by_size.config


def test_a_config_function_of_another_model_is_refused(tmp_path: Path) -> None:
    args = tmp_path / "torchtitan.args"
    args.write_text("--module llama3\n--config llama3_70b\n--training.global_batch_size 16\n--training.seq_len 2048\n")
    r = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args", str(args)])
    assert r.exit_code == 2 and "llama3_70b" in r.output and "num_layers 80" in r.output
    both = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args", str(args),
                                     "--config", "tp=1,pp=1,dp=16,mb=1"])
    assert both.exit_code == 2 and "one of --config" in both.output


NAMES = ["--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
         "--parallelism.data_parallel_shard_degree", "--parallelism.data_parallel_replicate_degree",
         "--parallelism.pipeline_parallel_schedule", "--parallelism.module_fqns_per_model_part",
         "--parallelism.pipeline_parallel_layers_per_stage", "--training.local_batch_size", "--compile.enable",
         "--parallelism.no-enable-sequence-parallel", "activation-checkpoint:full", "activation-checkpoint:none"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(NAMES), st.sampled_from(["1", "2", "4", "-1", "0", "8", "Interleaved1F1B",
                                                                   "GPipe", "layers.0,layers.1", "x", ""])),
                max_size=12))
def test_any_argument_list_reads_or_is_refused_with_a_clear_error(tokens: list[str]) -> None:
    try:
        run = read_args(tokens, num_layers=8, gpus=8)
    except InputError as exc:
        assert str(exc)
        return
    assert run.config["tp"] >= 1 and run.config["pp"] >= 1 and run.config["dp"] >= 1
    assert sum(run.config.get("layers", [8])) == 8


def test_a_torchtitan_job_file_reads_as_its_overrides(tmp_path: Path) -> None:
    """A torchtitan 0.2-style TOML job file (old names: training.batch_size, training.compile) gives the same
    configuration as the overrides of the same run; float8 linears and another model's flavor are refused."""
    job = tmp_path / "llama3_8b.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 2\nseq_len = 2048\n'
                   'compile = true\n[parallelism]\ndata_parallel_replicate_degree = 1\ndata_parallel_shard_degree = -1\n'
                   'tensor_parallel_degree = 2\npipeline_parallel_degree = 1\n[activation_checkpoint]\nmode = "full"\n')
    r = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args", str(job),
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    args = tmp_path / "same.args"
    args.write_text("--module llama3 --config llama3_8b --training.local_batch_size 2 --training.seq_len 2048 "
                    "--compile.enable --parallelism.tensor_parallel_degree 2 activation-checkpoint:full\n")
    same = json.loads(CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args",
                                                str(args), "--json"]).output)
    assert out["iteration_time_s"] == same["iteration_time_s"]
    assert out["configuration"] == {"tp": 2, "pp": 1, "dp": 8, "micro_batch": 2, "recompute": "full", "interleave": 1}
    (tmp_path / "f8.toml").write_text(job.read_text() + "[float8]\nenable_float8_linear = true\n")
    f8 = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args",
                                   str(tmp_path / "f8.toml")])
    assert f8.exit_code == 2 and "converters" in f8.output
    (tmp_path / "70b.toml").write_text(job.read_text().replace('"8B"', '"70B"'))
    other = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args",
                                      str(tmp_path / "70b.toml")])
    assert other.exit_code == 2 and "llama3_70b" in other.output
    (tmp_path / "bad.toml").write_text("[model\n")
    bad = CliRunner().invoke(main, ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--torchtitan-args",
                                    str(tmp_path / "bad.toml")])
    assert bad.exit_code == 2 and "TOML" in bad.output


def test_the_reduce_dtype_is_read() -> None:
    fp32 = read_args([], num_layers=8, gpus=8)
    bf16 = read_args(["--training.mixed_precision_reduce", "bfloat16"], num_layers=8, gpus=8)
    assert fp32.problem["grad_reduce_in_fp32"] is True and bf16.problem["grad_reduce_in_fp32"] is False
    with pytest.raises(InputError, match="mixed_precision_reduce"):
        read_args(["--training.mixed_precision_reduce", "float16"], num_layers=8, gpus=8)
