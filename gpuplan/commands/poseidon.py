"""`gpuplan solve poseidon CLUSTER MODEL --batch N --seq S` and the same inputs for `compare poseidon`.

CLUSTER is a cluster file (YAML/JSON, a `cluster:` mapping or the cluster itself) or a preset
name; MODEL is a catalog name (gpt3-1.3b, llama2-7b, ...) or a file with the model's shape.
A full poseidon problem file is accepted as CLUSTER alone (MODEL omitted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuplan.cliout import OutputPath, Seconds, json_option
from gpuplan.commands import ProblemInputs, subgroup
from gpuplan.errors import InputError
from gpuplan.models.base import Problem


def _document(arg: str) -> tuple[dict[str, Any] | str, Path | None]:
    """Return the mapping in file `arg` (and its folder), or `arg` itself when it is a name (a preset
    or catalog model): an argument that looks like a path (a .yaml/.yml/.json suffix or a '/') must
    be a readable document, else InputError names the file."""
    from gpuplan.io import read_document

    p = Path(arg)
    if p.suffix.lower() in (".yaml", ".yml", ".json") or "/" in arg or p.exists():
        return read_document(p), p.parent  # a path: a missing or unreadable file is named as such
    return arg, None


def build(cluster: str, model: str | None, batch: int | None, seq: int | None, schedule: str | None,
          max_stages: int | None, max_tp: int | None, max_interleave: int | None = None,
          **settings: Any) -> Problem:
    """Return the PoseidonProblem the command-line arguments describe (`settings`: the values of
    `execution_options`, by field name; None leaves the problem's own)."""
    from gpuplan.api import load_problem

    doc, base = _document(cluster)
    if isinstance(doc, dict) and doc.get("kind") == "poseidon":
        problem: dict[str, Any] = dict(doc)
    else:
        if model is None:
            raise InputError(f"{cluster}: a MODEL argument is needed (a catalog name or a model file)",
                             field="model")
        problem = {"cluster": doc.get("cluster", doc) if isinstance(doc, dict) else {"preset": doc}}
        mdoc, _ = _document(model)
        problem["model"] = mdoc.get("model", mdoc) if isinstance(mdoc, dict) else mdoc
    for key, value in (("global_batch", batch), ("seq_len", seq), ("schedule", schedule),
                       ("max_stages", max_stages), ("max_tp", max_tp), ("max_interleave", max_interleave),
                       *((field, settings.get(field)) for field in EXECUTION_FIELDS)):
        if value is not None:
            problem[key] = value
    problem["kind"] = "poseidon"
    _require_sizes(problem, cluster, whole=isinstance(doc, dict) and doc.get("kind") == "poseidon")
    if isinstance(problem.get("cluster"), dict) and "profile" in problem["cluster"] and base is not None:
        prof = Path(problem["cluster"]["profile"])
        problem["cluster"] = {**problem["cluster"], "profile": str(prof if prof.is_absolute() else base / prof)}
    try:
        return load_problem(problem, "poseidon")
    except InputError as e:  # the fields came from the CLUSTER file (or MODEL's, or an option): name it
        if e.file is not None or base is None:
            raise
        raise InputError(f"{cluster}: {e}", file=cluster, field=e.field, value=e.value, expected=e.expected) from None


def _require_sizes(problem: dict[str, Any], cluster: str, whole: bool) -> None:
    """Raise InputError naming the missing --batch / --seq (or, for a whole problem file, its field and the
    option that can give it) when `problem` lacks global_batch or seq_len; return None otherwise."""
    from gpuplan.models.poseidon import SIZE_FIELDS

    missing = [(key, f"--{arg}", what) for key, arg, what in SIZE_FIELDS if problem.get(key) is None]
    if not missing:
        return
    key, flag, what = missing[0]
    if whole:  # a poseidon problem file: its field is missing, and the option could give it
        raise InputError("; ".join(f"{cluster}: field '{k}': missing; expected {w}, in the file or as {f} N"
                                   for k, f, w in missing), file=cluster, field=key, expected=what)
    raise InputError("; ".join(f"option {f}: missing; expected {w} ({f} N): {cluster} is a cluster, which holds "
                               f"no {k}" for k, f, w in missing), field=flag, expected=what)


TRAINING_DTYPES = ("bf16", "fp16", "fp32", "fp8")  # PoseidonProblem.dtype's values (a test holds them equal)

# The problem fields `execution_options` sets (the execution assumptions a plan's times rest on).
EXECUTION_FIELDS = ("dtype", "distributed_optimizer", "fsdp", "eager_kernels", "tp_comm_overlap", "fp8_recipe",
                    "fp8_params", "fused_cross_entropy", "attention_library", "grad_reduce_in_fp32",
                    "gradient_accumulation_fusion")


def execution_options() -> list[click.Parameter]:
    """Return new click options for the problem's execution settings (`EXECUTION_FIELDS`, default None:
    the problem's own), as `solve`/`evaluate poseidon` and `plan train` take them."""
    return [
        click.Option(["--dtype"], type=click.Choice(TRAINING_DTYPES), default=None,
                     help="Training precision (fp8: Transformer Engine's, the linear layers in fp8)."),
        click.Option(["--distributed-optimizer/--no-distributed-optimizer", "distributed_optimizer"], default=None,
                     help="Optimizer states sharded over the data-parallel replicas (ZeRO-1), or replicated."),
        click.Option(["--fsdp/--no-fsdp", "fsdp"], default=None,
                     help="Weights, gradients and optimizer states sharded over the data-parallel replicas "
                          "(FSDP2 fully_shard per block, ZeRO-3: torchtitan's data_parallel_shard_degree)."),
        click.Option(["--eager-kernels/--fused-kernels", "eager_kernels"], default=None,
                     help="Element-wise ops as PyTorch's eager kernels (torchtitan without compile: rotary "
                          "embedding in fp32, SwiGLU as silu then mul), or fused (Megatron-LM, torch.compile)."),
        click.Option(["--tp-comm-overlap/--no-tp-comm-overlap", "tp_comm_overlap"], default=None,
                     help="TP all-gathers and reduce-scatters beside their GEMMs (Megatron's --tp-comm-overlap, "
                          "Transformer Engine's userbuffers; needs sequence parallelism), or exposed."),
        click.Option(["--fp8-recipe", "fp8_recipe"], type=click.Choice(["delayed", "current"]), default=None,
                     help="fp8 scaling with --dtype fp8: delayed (by earlier iterations' amax; Megatron-LM's default) "
                          "or current (an amax pass before each cast: Megatron's tensorwise, torchao's float8)."),
        click.Option(["--fp8-params/--no-fp8-params", "fp8_params"], default=None,
                     help="With --dtype fp8 and the distributed optimizer or FSDP: the blocks' weights held and "
                          "gathered in fp8 only (Megatron's --fp8-param-gather), or in 16 bits beside fp8 copies."),
        click.Option(["--fused-cross-entropy/--unfused-cross-entropy", "fused_cross_entropy"], default=None,
                     help="The loss as one fused kernel over the 16-bit logits (Megatron's --cross-entropy-loss-"
                          "fusion, Transformer Engine's), or Megatron-LM's fp32 kernel sequence."),
        click.Option(["--attention-library", "attention_library"], type=click.Choice(["te", "sdpa"]), default=None,
                     help="Whose fused attention kernel runs: te (Transformer Engine: Megatron-LM, NeMo; cuDNN's on "
                          "Hopper) or sdpa (PyTorch's scaled_dot_product_attention: FSDP scripts, earlier torchtitan "
                          "releases; FlashAttention-2). Both FlashAttention-2 on the A100."),
        click.Option(["--grad-reduce-in-fp32/--grad-reduce-in-16bit", "grad_reduce_in_fp32"], default=None,
                     help="Gradients accumulated, held and reduced in fp32, or in the 16-bit dtype (Megatron's "
                          "--grad-reduce-in-bf16). Default: as the trainer does, fp32 for bf16 and fp8 (Megatron-LM, "
                          "torchtitan's FSDP), 16 bits for fp16 (Megatron-LM)."),
        click.Option(["--gradient-accumulation-fusion/--no-gradient-accumulation-fusion",
                      "gradient_accumulation_fusion"], default=None,
                     help="Weight gradients accumulated into the main gradients in their GEMMs' epilogue (Megatron-LM's "
                          "default), or written in 16 bits and added by a separate kernel (Megatron-LM before 2022)."),
    ]


INPUTS = ProblemInputs("poseidon", [
    click.Argument(["cluster"]),
    click.Argument(["model"], required=False),
    click.Option(["--batch", "batch"], type=int, default=None, help="Global batch size (sequences)."),
    click.Option(["--seq", "seq"], type=int, default=None, help="Sequence length (tokens)."),
    click.Option(["--schedule"], type=click.Choice(["1f1b", "gpipe"]), default=None, help="Pipeline schedule."),
    click.Option(["--max-stages", "max_stages"], type=int, default=None, help="Most pipeline stages."),
    click.Option(["--max-tp", "max_tp"], type=int, default=None, help="Largest tensor-parallel degree."),
    click.Option(["--max-interleave", "max_interleave"], type=int, default=None,
                 help="Most model chunks per stage (Megatron's interleaved 1F1B; 1: none)."),
    *execution_options(),
], build, help="CLUSTER is a cluster file or preset name, MODEL a catalog name or model file "
               "(or CLUSTER is a whole poseidon problem file).")


def assumptions(problem: Any) -> str:
    """Return the execution assumptions a Poseidon prediction rests on, in one line: dtype (and fp8's
    scaling and weights), optimizer states, data-parallel overlap, attention kernel, sequence
    parallelism, element-wise kernels, pipeline exchanges, the loss kernel."""
    from gpuplan.models.poseidon import grad_dtype

    return "; ".join([
        f"dtype {problem.dtype}" + (f" (fp8 linear GEMMs, {problem.fp8_recipe} scaling, "
                                    + ("weights held and gathered in fp8, " if problem.fp8_params else "")
                                    + "the rest bf16)" if problem.dtype == "fp8" else ""),
        "weights, gradients and optimizer states sharded over dp (FSDP: per-block gathers and "
        "reduce-scatters beside the compute)" if problem.fsdp
        else "optimizer states sharded over dp (distributed optimizer)" if problem.distributed_optimizer
        else "optimizer states replicated",
        "gradient reduce-scatters per block" if problem.fsdp
        else "gradient reduction overlapped with the backward" if problem.overlap_dp_allreduce
        else "gradient reduction after the backward",
        (("flash attention (PyTorch SDPA: FlashAttention-2)" if problem.attention_library == "sdpa"
          else "flash attention (Transformer Engine: cuDNN on Hopper)") if problem.flash_attention
         else "explicit attention (scores in memory)"),
        ("sequence parallelism" + (", TP collectives beside their GEMMs" if problem.tp_comm_overlap else ""))
        if problem.sequence_parallel else "no sequence parallelism",
        ("eager element-wise kernels" if problem.eager_kernels else "fused element-wise kernels")
        + ("; RMSNorm as separate fp32 kernels" if problem.composite_norm else ""),
        "blocking pipeline exchanges" if problem.blocking_p2p else "overlapped pipeline exchanges",
        f"gradients held and reduced in {grad_dtype(problem)}"
        + ("" if problem.gradient_accumulation_fusion or problem.fsdp else ", accumulated by a separate kernel"),
        "fused cross-entropy on 16-bit logits" if problem.fused_cross_entropy else "cross-entropy in fp32"])


def with_run_settings(problem: Problem, settings: dict[str, Any], values: dict[str, Any]) -> Problem:
    """Return `problem` with a trainer run's execution `settings` (problem fields) where the command line's
    `values` set none of them (the command line's options win; the sizes stay the problem's)."""
    from gpuplan.api import load_problem

    given = {field for field in EXECUTION_FIELDS if values.get(field) is not None}
    kept = {k: v for k, v in settings.items() if k not in given and k not in ("global_batch", "seq_len")}
    return load_problem({**problem.model_dump(mode="json"), **kept}, "poseidon")


def megatron_problem(path: str, values: dict[str, Any]) -> tuple[Problem, dict[str, Any]]:
    """Return (problem, fixed configuration) of a Megatron-LM arguments file on the command line's
    CLUSTER and MODEL: the file's batch, sequence and execution settings where the command line gives
    none, its degrees, micro-batch, layers and recomputation as the configuration. Raises InputError
    when the file describes another model than MODEL or what the model cannot represent."""
    from gpuplan.export.megatron_args import check_model, read_args_file, stated_sizes

    sizes = stated_sizes(path)
    values = {**values, "batch": values.get("batch") or sizes.get("global_batch"),
              "seq": values.get("seq") or sizes.get("seq_len")}
    problem = build(**values)
    run = read_args_file(path, problem.model.num_layers)  # type: ignore[attr-defined]
    check_model(run, problem.model, path)  # type: ignore[attr-defined]
    return with_run_settings(problem, run.problem, values), run.config


def torchtitan_problem(path: str, values: dict[str, Any]) -> tuple[Problem, dict[str, Any]]:
    """Return (problem, fixed configuration) of a torchtitan arguments file on the command line's CLUSTER and
    MODEL, as `megatron_problem` does for Megatron-LM's (`gpuplan.export.torchtitan_args`). Raises InputError
    when the file names a config function of another model or what the model cannot represent."""
    from gpuplan.export.torchtitan_args import check_model, read_args_file

    stated = read_args_file(path, num_layers=0, gpus=0, sizes_only=True).problem
    batch = values.get("batch") or stated.get("global_batch")
    values = {**values, "seq": values.get("seq") or stated.get("seq_len")}
    # without a global batch the local one times dp is: the cluster's size tells dp, so build once to read it
    problem = build(**{**values, "batch": batch or stated.get("local_batch")})
    run = read_args_file(path, problem.model.num_layers, len(problem.cluster.devices))  # type: ignore[attr-defined]
    if not batch and run.problem.get("global_batch"):
        problem = build(**{**values, "batch": run.problem["global_batch"]})
    check_model(run, problem.model, path)  # type: ignore[attr-defined]
    return with_run_settings(problem, run.problem, values), run.config


def _evaluate_callback(config: str | None, megatron_args: str | None, torchtitan_args: str | None, vs_search: bool,
                       output: str | None, time_limit: float | None, allow_over_memory: bool, json_out: str | None = None,
                       **values: Any) -> None:
    """Evaluate one fixed configuration; print its figures (and the search's plan with --vs-search), or
    with `json_out` the document of docs/index.md (Scripting); return None."""
    from gpuplan import api
    from gpuplan.cliout import STDOUT, emit_json, say, table_doc
    from gpuplan.errors import GpuplanError
    from gpuplan.models.base import Table
    from gpuplan.models.poseidon import describe
    from gpuplan.render import print_tables

    try:
        if sum(x is not None for x in (config, megatron_args, torchtitan_args)) != 1:
            from gpuplan.errors import InputError

            raise InputError.at(None, "--config", config, "one of --config, --megatron-args or --torchtitan-args")
        if megatron_args is not None:
            problem, fixed_config = megatron_problem(megatron_args, values)
        elif torchtitan_args is not None:
            problem, fixed_config = torchtitan_problem(torchtitan_args, values)
        else:
            problem, fixed_config = build(**values), config
        plan = api.evaluate_config(problem, fixed_config, check_memory=not allow_over_memory)
        fixed = api.plan_problem(plan)
        figures = {"configuration": plan.solver.options if plan.solver else {},
                   "assumptions": assumptions(fixed),  # type: ignore[arg-type]
                   "iteration_time_s": plan.iteration_time_s,
                   **{k: plan.predicted[k] for k in ("throughput_samples_per_s", "tokens_per_s",
                                                     "model_tflops_per_gpu", "mfu", "bubble_fraction")}}
        search: dict[str, Any] | None = None
        rows: list[list[Any]] = [[k, v] for k, v in figures.items() if k != "assumptions"]
        if vs_search:  # under the configuration's execution assumptions, with the problem's recomputation
            searched = fixed.model_copy(update={"recompute": api.load_problem(problem).recompute})  # type: ignore[union-attr]
            best = api.solve(searched, time_limit_s=time_limit)
            if best.ok:
                shape = (" | ".join(f"{s.device_type}:{s.tp}x{s.dp}:{s.num_layers}L:{s.recompute}"
                                    for s in best.stages) + f" m={best.num_microbatches}")
                search = {"status": best.status.value, "iteration_time_s": best.iteration_time_s, "shape": shape,
                          "config_over_search": plan.iteration_time_s / best.iteration_time_s}
                rows += [["search iteration_time_s", best.iteration_time_s],
                         ["search shape", shape],
                         ["config time / search time", plan.iteration_time_s / best.iteration_time_s]]
            else:
                search = {"status": best.status.value, "message": best.message}
                rows.append(["search", f"{best.status.value}: {best.message}"])
        if output:
            plan.save(output)
    except GpuplanError as exc:
        from gpuplan.cli import _fail

        _fail(exc)  # exit code 5 when --vs-search's solver stops without a plan, else 2
    tables = [Table("poseidon: fixed configuration", ["figure", "value"], rows),
              Table("the execution assumptions the prediction rests on", ["assumption"],
                    [[a] for a in figures["assumptions"].split("; ")])] + describe(fixed, plan)  # type: ignore[arg-type]
    if json_out != STDOUT:
        print_tables(tables)
    emit_json("evaluate poseidon", {**figures, "search": search, "plan_file": output,
                                    "tables": [table_doc(t) for t in tables]}, json_out)
    if output:
        say(f"plan written to {output}", json_out)


def register(main: click.Group) -> None:
    """Add `gpuplan evaluate poseidon CLUSTER MODEL --batch B --seq S --config tp=..,pp=..,...`."""
    group = subgroup(main, "evaluate", "Evaluate a fixed configuration with a model's cost model.")
    params = list(INPUTS.params) + [
        click.Option(["--config"], default=None,
                     help="tp=8,pp=8,dp=12,mb=1,recompute=selective,interleave=2[,sp=true,flash=false,distopt=true,fsdp=true,"
                          "eager=true] or a "
                          "YAML/JSON file with those keys."),
        click.Option(["--megatron-args", "megatron_args"], default=None, type=click.Path(dir_okay=False),
                     help="Or the configuration of a Megatron-LM run: a file of its arguments (as `gpuplan export "
                          "megatron` writes megatron.args): degrees, layers, micro and global batch, sequence, "
                          "recomputation and execution settings; the command line's options win."),
        click.Option(["--torchtitan-args", "torchtitan_args"], default=None, type=click.Path(dir_okay=False),
                     help="Or the configuration of a torchtitan run: a file of its overrides (as `gpuplan export "
                          "torchtitan` writes torchtitan.args): degrees (FSDP or DDP), layer split, schedule, "
                          "micro, local and global batch, sequence, activation checkpointing, compile; the command "
                          "line's options win."),
        click.Option(["--vs-search"], is_flag=True, help="Also solve with Poseidon's search and compare."),
        click.Option(["--time-limit", "time_limit"], type=Seconds(), default=None, help="Search time limit (s)."),
        click.Option(["--allow-over-memory"], is_flag=True,
                     help="Evaluate even when a stage needs more memory than the device has."),
        click.Option(["-o", "--output"], default=None, type=OutputPath(),
                     help="Also write the plan (JSON)."),
        json_option(),
    ]
    group.add_command(click.Command("poseidon", params=params, callback=_evaluate_callback,
                                    help="Predict a fixed Megatron-style configuration (iteration time, "
                                         "throughput, TFLOP/s per GPU, MFU). " + INPUTS.help))
