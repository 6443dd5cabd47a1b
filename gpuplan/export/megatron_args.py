"""Megatron-LM's command line read back: the parallel configuration and the execution settings of a run
(`gpuplan evaluate poseidon CLUSTER MODEL --megatron-args FILE`), so a user starts from the arguments they
train with today. The inverse of `gpuplan.export.megatron.job_args`: its arguments read back give the
plan's own configuration (tested).

What is read: the degrees (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, interleaving
by `--num-virtual-stages-per-pipeline-rank`, `--virtual-pipeline-model-parallel-size` or
`--num-layers-per-virtual-pipeline-stage`), the layer split (`--pipeline-model-parallel-layout`,
`--decoder-first/last-pipeline-num-layers`), micro and global batch, sequence length, recomputation,
sequence parallelism, the distributed optimizer, the gradient-reduction overlap, TP overlap, the
precision (`--bf16`, `--fp16`, fp8 with its recipe and `--fp8-param-gather`), the fused cross-entropy
and the attention backend. The data-parallel degree is the cluster's GPUs over tp x pp, as Megatron-LM
takes it from the world size. The model's shape flags, where given, must agree with MODEL (with any of
them, `--swiglu` and `--untie-embeddings-and-output-weights` are read too, absent or not). What the
model cannot represent (context or expert parallelism, MoE, CPU offloading, Megatron's FSDP, MXFP8 or
blockwise fp8) is refused by name; every other flag (learning rate, data, logging) is not read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplan.errors import InputError

# flags that take a value, and flags that are switches (present: true); the rest is not read
VALUE_FLAGS = {"tensor-model-parallel-size", "pipeline-model-parallel-size", "num-virtual-stages-per-pipeline-rank",
               "virtual-pipeline-model-parallel-size", "num-layers-per-virtual-pipeline-stage",
               "pipeline-model-parallel-layout", "decoder-first-pipeline-num-layers",
               "decoder-last-pipeline-num-layers", "micro-batch-size", "global-batch-size", "seq-length",
               "recompute-granularity", "recompute-method", "recompute-num-layers", "fp8-format", "fp8-recipe",
               "attention-backend", "context-parallel-size",
               "expert-model-parallel-size", "num-experts", "num-layers", "hidden-size", "ffn-hidden-size",
               "num-attention-heads", "num-query-groups", "kv-channels", "cpu-offloading-num-layers"}
SWITCHES = {"sequence-parallel", "use-distributed-optimizer", "overlap-grad-reduce", "tp-comm-overlap", "bf16",
            "fp16", "fp8-param-gather", "cross-entropy-loss-fusion", "swiglu", "untie-embeddings-and-output-weights",
            "group-query-attention", "recompute-activations", "use-torch-fsdp2", "use-megatron-fsdp",
            "use-custom-fsdp", "cpu-offloading", "grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32",
            "no-gradient-accumulation-fusion"}
# (flag, what gpuplan's model lacks) for switches the model cannot represent
UNMODELLED = {"use-torch-fsdp2": "Megatron's FSDP2 wrapper (16-bit gradient reduction); the model's fsdp is "
                                 "torchtitan's, with fp32 reduction",
              "use-megatron-fsdp": "Megatron-FSDP (persistent gather buffers); the model's fsdp is FSDP2",
              "use-custom-fsdp": "Megatron-FSDP (persistent gather buffers); the model's fsdp is FSDP2",
              "cpu-offloading": "activations offloaded to the CPU"}
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}  # Megatron's --fp8-recipe -> fp8_recipe
MODEL_FLAGS = (("num-layers", "num_layers"), ("hidden-size", "hidden"), ("ffn-hidden-size", "ffn_hidden"),
               ("num-attention-heads", "heads"))


@dataclass
class TrainerRun:
    """A trainer's run (Megatron-LM's arguments, torchtitan's overrides) in gpuplan's terms: `config` (ParallelConfig fields: degrees,
    micro-batch, recomputation, layers), `problem` (PoseidonProblem fields the run fixes: global_batch,
    seq_len and the execution assumptions, which are validated together) and
    `model` (the model shape the arguments state, PoseidonProblem.model field names)."""

    config: dict[str, Any] = field(default_factory=dict)
    problem: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)


def _flags(tokens: list[str], where: str) -> dict[str, Any]:
    """Return {flag without dashes: value (str) or True} of the tokens Megatron-LM reads; the last value
    of a repeated flag wins, as argparse keeps it. Raises InputError for a value flag without a value."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            continue
        name, eq, value = tok[2:].partition("=")
        if name in VALUE_FLAGS:
            if not eq:
                if i >= len(tokens) or tokens[i].startswith("--"):
                    raise InputError.at(where, f"--{name}", None, "a value after the flag")
                value = tokens[i]
                i += 1
            out[name] = value
        elif name in SWITCHES:
            out[name] = True
    return out


def int_flag(flags: dict[str, Any], name: str, where: str, least: int = 1) -> int | None:
    """Return flag `name` as an int >= `least` (None when absent); InputError naming the flag when it is not one."""
    if name not in flags:
        return None
    try:
        value = int(flags[name])
    except ValueError:
        value = least - 1
    if value < least:
        raise InputError.at(where, f"--{name}", flags[name], "a positive integer" if least == 1 else f"an integer >= {least}")
    return value


def _layout_counts(text: str, where: str) -> list[int]:
    """Return the transformer layers of each virtual stage of a `--pipeline-model-parallel-layout` as
    `job_args` writes it ('Et*7|t*8|t*9L': 7, 8, 9; E and L, the embedding and the loss, hold none).
    Raises InputError for any other symbol (Mamba layers, groups in parentheses)."""
    counts = []
    for part in text.split("|"):
        if not re.fullmatch(r"(?:E|L|t(?:\*\d+)?)*", part.strip()):
            raise InputError.at(where, "--pipeline-model-parallel-layout", text,
                                "stages of E, t, t*N and L separated by | (transformer layers only)")
        counts.append(sum(int(n) if n else 1 for n in re.findall(r"t(?:\*(\d+))?", part)))
    return counts


def _recompute(flags: dict[str, Any], interleave: int, where: str) -> str:
    """Return the recomputation label of the flags: Megatron's uniform method recomputes every block,
    block recomputes the first K of each model chunk (K x interleave of a stage's blocks)."""
    if flags.get("recompute-activations"):
        return "selective"
    granularity = flags.get("recompute-granularity")
    if granularity is None:
        return "none"
    if granularity == "selective":
        return "selective"
    if granularity != "full":
        raise InputError.at(where, "--recompute-granularity", granularity, "full or selective")
    method = flags.get("recompute-method", "uniform")
    if method == "uniform":
        return "full"
    if method != "block":
        raise InputError.at(where, "--recompute-method", method, "uniform or block")
    return f"full:{(int_flag(flags, 'recompute-num-layers', where) or 1) * interleave}"


def _refuse_unmodelled(flags: dict[str, Any], where: str) -> None:
    """Raise InputError naming the first flag the model cannot represent (context or expert parallelism,
    MoE, CPU offloading, Megatron's FSDP wrappers); return None when there is none."""
    for name, expected in (("context-parallel-size", "context parallelism is not in the model"),
                           ("expert-model-parallel-size", "expert parallelism (MoE) is not in the model")):
        if (int_flag(flags, name, where) or 1) > 1:
            raise InputError.at(where, f"--{name}", flags[name], f"1: {expected}")
    if "num-experts" in flags:
        raise InputError.at(where, "--num-experts", flags["num-experts"], "no experts: MoE is not in the model")
    if "cpu-offloading-num-layers" in flags:
        flags["cpu-offloading"] = True
    for name, lack in UNMODELLED.items():
        if flags.get(name):
            raise InputError.at(where, f"--{name}", True, f"not set: gpuplan's model has no {lack}")


def _interleave(flags: dict[str, Any], num_layers: int, pp: int, where: str) -> int:
    """Return the model chunks per pipeline rank the flags set (1: no interleaving)."""
    per_chunk = int_flag(flags, "num-layers-per-virtual-pipeline-stage", where)
    if per_chunk:
        if num_layers % (pp * per_chunk):
            raise InputError.at(where, "--num-layers-per-virtual-pipeline-stage", per_chunk,
                                f"a divisor of the model's {num_layers} layers over pp {pp}")
        return num_layers // (pp * per_chunk)
    return (int_flag(flags, "num-virtual-stages-per-pipeline-rank", where)
            or int_flag(flags, "virtual-pipeline-model-parallel-size", where) or 1)


def _stage_layers(flags: dict[str, Any], num_layers: int, pp: int, v: int, where: str) -> list[int] | None:
    """Return the layers of each pipeline stage the flags set (None: Megatron's equal split), from the
    layout or the first and last stages' layer counts; uneven chunks with interleaving are refused."""
    if "pipeline-model-parallel-layout" in flags:
        text = str(flags["pipeline-model-parallel-layout"])
        counts = _layout_counts(text, where)
        if len(counts) != pp * v or sum(counts) != num_layers:
            raise InputError.at(where, "--pipeline-model-parallel-layout", text,
                                f"{pp * v} stages (pp {pp} x {v} chunks) of the model's {num_layers} layers")
        if min(counts) < 1:
            raise InputError.at(where, "--pipeline-model-parallel-layout", text,
                                "at least one transformer layer on every stage: a stage of only the embedding "
                                "or the loss is not in the model")
        if v > 1 and len(set(counts)) > 1:
            raise InputError.at(where, "--pipeline-model-parallel-layout", text,
                                "equal chunks with interleaving: uneven interleaved chunks are not in the model")
        return counts if v == 1 else None
    first = int_flag(flags, "decoder-first-pipeline-num-layers", where)
    last = int_flag(flags, "decoder-last-pipeline-num-layers", where)
    if not (first or last) or pp == 1:
        return None
    if v > 1:
        raise InputError.at(where, "--decoder-first-pipeline-num-layers", f"{first} / {last}",
                            "no uneven first or last stage with interleaving: uneven chunks are not in the model")
    ends = ([first] if first else [], [last] if last else [])
    middle = pp - len(ends[0]) - len(ends[1])
    rest = num_layers - sum(ends[0]) - sum(ends[1])
    if rest < middle or (middle and rest % middle) or (not middle and rest):
        raise InputError.at(where, "--decoder-first-pipeline-num-layers", f"{first} / {last}",
                            f"first and last stage layers leaving an equal split of the model's {num_layers} "
                            f"layers over the other {middle} stages")
    return ends[0] + ([rest // middle] * middle if middle else []) + ends[1]


def _precision(flags: dict[str, Any], where: str) -> dict[str, Any]:
    """Return the problem's dtype (and fp8_recipe) the flags set: fp8 with --fp8-format, else --bf16,
    --fp16 or Megatron-LM's default fp32."""
    if "fp8-format" not in flags:
        return {"dtype": "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else "fp32"}
    recipe = str(flags.get("fp8-recipe", "delayed"))
    if recipe not in FP8_RECIPES:
        raise InputError.at(where, "--fp8-recipe", recipe,
                            f"one of {', '.join(FP8_RECIPES)}: the model has no {recipe} scaling")
    return {"dtype": "fp8", "fp8_recipe": FP8_RECIPES[recipe]}


def read_args(tokens: list[str], num_layers: int, where: str = "megatron args",
              sizes_only: bool = False) -> TrainerRun:
    """Return the TrainerRun of Megatron-LM arguments `tokens` for a model of `num_layers` blocks (with
    `sizes_only`, only its problem's global_batch and seq_len). Raises InputError (naming `where`, the
    flag, its value and what was expected) for what the model cannot represent or a value Megatron-LM
    would refuse."""
    flags = _flags(tokens, where)
    sizes = {key: int_flag(flags, name, where) for name, key in
             (("global-batch-size", "global_batch"), ("seq-length", "seq_len")) if name in flags}
    if sizes_only:
        return TrainerRun(problem=sizes)
    _refuse_unmodelled(flags, where)
    tp = int_flag(flags, "tensor-model-parallel-size", where) or 1
    pp = int_flag(flags, "pipeline-model-parallel-size", where) or 1
    v = _interleave(flags, num_layers, pp, where)
    config: dict[str, Any] = {"tp": tp, "pp": pp, "interleave": v,
                              "micro_batch": int_flag(flags, "micro-batch-size", where) or 1,
                              "recompute": _recompute(flags, v, where)}
    layers = _stage_layers(flags, num_layers, pp, v, where)
    if layers is not None:
        config["layers"] = layers
    problem = {**sizes, **_precision(flags, where), "sequence_parallel": bool(flags.get("sequence-parallel")),
               "distributed_optimizer": bool(flags.get("use-distributed-optimizer")),
               "overlap_dp_allreduce": bool(flags.get("overlap-grad-reduce")),
               "flash_attention": flags.get("attention-backend", "auto") in ("auto", "flash", "fused"),
               "tp_comm_overlap": bool(flags.get("tp-comm-overlap")),
               "fp8_params": bool(flags.get("fp8-param-gather")),
               "fused_cross_entropy": bool(flags.get("cross-entropy-loss-fusion")),
               "gradient_accumulation_fusion": not flags.get("no-gradient-accumulation-fusion")}
    if problem["dtype"] != "fp32" and (flags.get("grad-reduce-in-bf16") or flags.get("accumulate-allreduce-grads-in-fp32")):
        # else Megatron-LM's own rule, which the problem's default follows (fp32 with --bf16, fp16 with --fp16);
        # --grad-reduce-in-bf16 wins over --accumulate-allreduce-grads-in-fp32, as in Megatron-LM's arguments
        problem["grad_reduce_in_fp32"] = (bool(flags.get("accumulate-allreduce-grads-in-fp32")) if problem["dtype"] == "fp16"
                                          else not flags.get("grad-reduce-in-bf16"))
    model: dict[str, Any] = {key: int_flag(flags, name, where) for name, key in MODEL_FLAGS if name in flags}
    if flags.get("group-query-attention") and "num-query-groups" in flags:
        model["kv_heads"] = int_flag(flags, "num-query-groups", where)
    if "kv-channels" in flags:
        model["head_dim"] = int_flag(flags, "kv-channels", where)
    if model:  # the arguments describe the model: Megatron's switches mean something when absent too
        model["gated_mlp"] = bool(flags.get("swiglu"))
        model["tied_embeddings"] = not flags.get("untie-embeddings-and-output-weights")
    return TrainerRun(config=config, problem=problem, model=model)


def read_tokens(path: str | Path, trainer: str) -> list[str]:
    """Return the arguments of a file of `trainer`'s command-line arguments (one per line, as the exports
    write them; any shell-style quoting, spacing and # comments are read too). Raises InputError naming
    the file when it cannot be read or split."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.at(str(p), "file", str(p), f"a readable text file of {trainer} arguments ({exc})") from None
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise InputError.at(str(p), "file", str(p), f"shell-style arguments ({exc})") from None


def read_args_file(path: str | Path, num_layers: int, sizes_only: bool = False) -> TrainerRun:
    """Return the TrainerRun of an arguments file (`gpuplan export megatron`'s megatron.args: one
    argument per line; any shell-style quoting and spacing is read too)."""
    return read_args(read_tokens(path, "Megatron-LM"), num_layers, str(path), sizes_only)


def check_model(run: TrainerRun, model: Any, where: str) -> None:
    """Raise InputError when a model-shape flag of the run disagrees with `model` (a TransformerConfig),
    naming the flag, its value and the model's; return None when all that is stated agrees."""
    names = {"num_layers": "--num-layers", "hidden": "--hidden-size", "ffn_hidden": "--ffn-hidden-size",
             "heads": "--num-attention-heads", "kv_heads": "--num-query-groups", "head_dim": "--kv-channels",
             "gated_mlp": "--swiglu", "tied_embeddings": "--untie-embeddings-and-output-weights"}
    for key, stated in run.model.items():
        have = getattr(model, key, None)
        if key == "kv_heads" and have is None:
            have = model.heads
        if key == "head_dim" and have is None:
            have = model.hidden // model.heads
        if stated != have:
            shown = stated if key not in ("gated_mlp", "tied_embeddings") else (
                "given" if stated != (key == "tied_embeddings") else "absent")
            raise InputError.at(where, names[key], shown, f"the model {model.name}'s {key} {have}: the arguments "
                                f"describe another model")


def stated_sizes(path: str | Path) -> dict[str, int]:
    """Return the problem sizes an arguments file states ({global_batch, seq_len}, those present), read
    before the model is known (`read_args_file` needs its layer count)."""
    run = read_args_file(path, num_layers=0, sizes_only=True)
    return {k: v for k, v in run.problem.items() if k in ("global_batch", "seq_len")}
