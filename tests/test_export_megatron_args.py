"""Megatron-LM's arguments read back (`evaluate poseidon --megatron-args`): the export's arguments give the
plan's own configuration and time again; recomputation, layouts and precision map as Megatron reads them;
what the model cannot represent, and arguments of another model, are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.export import megatron
from gpuplan.export.megatron_args import check_model, read_args

DOC = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {"H100": 8}}]}, "model": "llama3-8b",
       "global_batch": 32, "seq_len": 2048, "dtype": "fp8", "distributed_optimizer": True, "fp8_params": True,
       "fused_cross_entropy": True, "fp8_recipe": "current", "tp_comm_overlap": True, "overlap_dp_allreduce": True}


def _export(tmp: Path, doc: dict, config: str) -> tuple[gpuplan.PoseidonPlan, Path, Path]:  # type: ignore[name-defined]
    """Return (plan, its Megatron arguments file, the problem file without batch and sequence)."""
    from gpuplan.compose import compose, write_bundle

    plan = gpuplan.evaluate_config(doc, config)
    write_bundle(tmp / "bundle", compose(plan, time_limit_s=3))
    args = tmp / "megatron.args"
    args.write_text("\n".join(megatron.export(tmp / "bundle")["args"]) + "\n")
    problem = tmp / "problem.yaml"
    problem.write_text(yaml.safe_dump({k: v for k, v in doc.items() if k not in ("global_batch", "seq_len")}))
    return plan, args, problem


@pytest.mark.parametrize("config", ["tp=2,pp=2,dp=2,mb=1,interleave=2,recompute=full:4",
                                    "tp=4,pp=2,dp=1,mb=2,recompute=selective",
                                    "tp=1,pp=1,dp=8,mb=1,recompute=full"])
def test_the_exports_arguments_read_back_give_the_plans_time(tmp_path: Path, config: str) -> None:
    plan, args, problem = _export(tmp_path, DOC, config)
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(problem), "--megatron-args", str(args), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["iteration_time_s"] == plan.iteration_time_s
    assert "weights held and gathered in fp8" in out["assumptions"]


def test_a_preset_cluster_takes_the_runs_settings_with_the_command_lines_first(tmp_path: Path) -> None:
    """The problem comes from CLUSTER and MODEL alone: fp8 weights need the run's distributed optimizer,
    which the file states; an option on the command line wins over the file."""
    args = tmp_path / "run.args"
    args.write_text("--tensor-model-parallel-size 2 --sequence-parallel --global-batch-size 64 --seq-length 4096 "
                    "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather "
                    "--use-distributed-optimizer --overlap-grad-reduce --cross-entropy-loss-fusion\n")
    base = ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--megatron-args", str(args), "--json"]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert "weights held and gathered in fp8" in out["assumptions"] and "distributed optimizer" in out["assumptions"]
    r = CliRunner().invoke(main, base + ["--fp8-recipe", "delayed", "--batch", "32"])
    assert r.exit_code == 0, r.output
    assert "delayed scaling" in json.loads(r.output)["assumptions"]
    r = CliRunner().invoke(main, base + ["--no-distributed-optimizer"])  # fp8 weights then need FSDP
    assert r.exit_code == 2 and "fp8_params" in r.output


def test_an_uneven_split_reads_back(tmp_path: Path) -> None:
    plan, args, problem = _export(tmp_path, {**DOC, "tp_comm_overlap": False},
                                  {"tp": 1, "pp": 2, "dp": 4, "mb": 1, "layers": [10, 22]})
    run = read_args(args.read_text().split(), 32)
    assert run.config["layers"] == [10, 22] and run.config["tp"] == 1
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(problem), "--megatron-args", str(args), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["iteration_time_s"] == plan.iteration_time_s


@pytest.mark.parametrize("flags, recompute", [
    ("", "none"), ("--recompute-activations", "selective"), ("--recompute-granularity selective", "selective"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", "full"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 4", "full"),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 3", "full:6")])
def test_recomputation_as_megatron_runs_it(flags: str, recompute: str) -> None:
    """Uniform checkpoints every block (in groups); block the first K of each of the 2 model chunks."""
    run = read_args(f"--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 {flags}".split(), 32)
    assert run.config["recompute"] == recompute and run.config["interleave"] == 2


def test_layers_precision_and_switches() -> None:
    run = read_args("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5 "
                    "--decoder-last-pipeline-num-layers 7 --bf16 --num-layers-per-virtual-pipeline-stage=8".split(), 32)
    assert run.config["interleave"] == 1 and run.config["layers"] == [5, 10, 10, 7]
    assert run.problem["dtype"] == "bf16" and not run.problem["sequence_parallel"]
    assert read_args([], 32).problem["dtype"] == "fp32"  # Megatron-LM's default precision
    run = read_args("--fp8-format hybrid --bf16 --fp8-recipe delayed --attention-backend unfused".split(), 32)
    assert (run.problem["dtype"], run.problem["fp8_recipe"], run.problem["flash_attention"]) == ("fp8", "delayed", False)
    run = read_args("--num-layers-per-virtual-pipeline-stage 4 --pipeline-model-parallel-size 4".split(), 32)
    assert run.config["interleave"] == 2


@pytest.mark.parametrize("flags, field", [
    ("--context-parallel-size 2", "--context-parallel-size"), ("--num-experts 8", "--num-experts"),
    ("--expert-model-parallel-size 4", "--expert-model-parallel-size"), ("--use-megatron-fsdp", "--use-megatron-fsdp"),
    ("--use-torch-fsdp2", "--use-torch-fsdp2"), ("--cpu-offloading-num-layers 4", "--cpu-offloading"),
    ("--fp8-format e4m3 --fp8-recipe mxfp8", "--fp8-recipe"), ("--micro-batch-size 0", "--micro-batch-size"),
    ("--tensor-model-parallel-size", "--tensor-model-parallel-size"),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|(tt|)*2", "--pipeline-model-parallel-layout"),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*3L", "--pipeline-model-parallel-layout"),
    ("--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout E|t*16|t*16|L",
     "--pipeline-model-parallel-layout"),
    ("--recompute-granularity partial", "--recompute-granularity")])
def test_what_the_model_cannot_represent_is_refused_by_name(flags: str, field: str) -> None:
    with pytest.raises(gpuplan.InputError) as exc:
        read_args(flags.split(), 32, "run.args")
    assert exc.value.field == field and "run.args" in str(exc.value)


def test_arguments_of_another_model_are_refused(tmp_path: Path) -> None:
    model = gpuplan.load_problem({**DOC}).model  # type: ignore[attr-defined]
    check_model(read_args("--num-layers 32 --hidden-size 4096 --swiglu --untie-embeddings-and-output-weights "
                          "--group-query-attention --num-query-groups 8".split(), 32), model, "x")
    check_model(read_args("--tensor-model-parallel-size 2".split(), 32), model, "x")  # no shape stated
    for flags, field in (("--num-layers 40 --swiglu --untie-embeddings-and-output-weights", "--num-layers"),
                         ("--num-layers 32 --untie-embeddings-and-output-weights", "--swiglu"),
                         ("--num-layers 32 --swiglu", "--untie-embeddings-and-output-weights")):
        with pytest.raises(gpuplan.InputError) as exc:
            check_model(read_args(flags.split(), 32), model, "x")
        assert exc.value.field == field
    args = tmp_path / "a.args"
    args.write_text("--num-layers 40 --global-batch-size 32 --seq-length 2048\n")
    problem = tmp_path / "p.yaml"
    problem.write_text(yaml.safe_dump({k: v for k, v in DOC.items() if k not in ("global_batch", "seq_len")}))
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(problem), "--megatron-args", str(args)])
    assert r.exit_code == 2 and "--num-layers" in r.output and "llama3-8b" in r.output
    r = CliRunner().invoke(main, ["evaluate", "poseidon", str(problem), "--megatron-args", str(args),
                                  "--config", "tp=1"])
    assert r.exit_code == 2 and "--megatron-args" in r.output


def test_a_composed_interleaved_plan_overlaps_the_weight_gather_with_its_first_chunk() -> None:
    """The distributed optimizer's weight gather runs beside the next iteration's first forward: with
    interleaved chunks, that micro-batch's first chunk (Lagom's segments are per chunk)."""
    from gpuplan.compose import compose

    comp = compose(gpuplan.evaluate_config(DOC, "tp=2,pp=2,dp=2,mb=1,interleave=2"), time_limit_s=3)
    assert sorted(comp.lagom) == [0, 1]
    for plan in comp.lagom.values():
        ops = {o["name"]: o for o in plan.model_dump(mode="json")["problem"]["ops"]}
        assert ops["dp-params"]["overlaps"] == "fwd-c0-mb0"


def test_any_argument_list_reads_or_is_refused_with_a_clear_error() -> None:
    """Random argument lists (the flags the reader knows, others, values of every kind, `--flag=value`)
    either read or raise InputError; never another exception."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gpuplan.export.megatron_args import SWITCHES, VALUE_FLAGS

    flag = st.sampled_from(sorted(VALUE_FLAGS | SWITCHES) + ["lr", "data-path", "tokenizer-type"])
    value = st.one_of(st.integers(-3, 80).map(str), st.sampled_from(
        ["full", "block", "uniform", "selective", "tensorwise", "mxfp8", "hybrid", "Et*16|t*16L", "t*8|t*8", "",
         "1e3", "nan", "(tt|)*2", "auto", "unfused", "E|t*16|t*16|L", "Et*40|t*40L", "t|t"]))
    token = st.one_of(flag.map(lambda f: f"--{f}"), value, st.tuples(flag, value).map(lambda p: f"--{p[0]}={p[1]}"))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(token, max_size=14), st.sampled_from([1, 2, 32, 80]))
    def check(tokens: list[str], layers: int) -> None:
        try:
            run = read_args(tokens, layers, "x.args")
        except gpuplan.InputError as exc:
            assert str(exc).startswith("x.args: field '--")
            return
        assert run.config["tp"] >= 1 and run.config["pp"] >= 1 and run.config["interleave"] >= 1
        if "layers" in run.config:
            assert sum(run.config["layers"]) == layers and min(run.config["layers"]) >= 1

    check()
