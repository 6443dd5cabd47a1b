"""torchtitan's command line read back: the parallel configuration and execution settings of a torchtitan
0.3.0 run (`gpuplan evaluate poseidon CLUSTER MODEL --torchtitan-args FILE`), so a user who trains with
torchtitan starts from the overrides they launch with. The inverse of `gpuplan.export.torchtitan.job_args`:
its `torchtitan.args` read back give the plan's configuration (tested).

What is read: `--module`/`--config` (a known config function's model must be MODEL's), the degrees
(`--parallelism.tensor_parallel_degree`, `pipeline_parallel_degree`, `data_parallel_shard_degree`: FSDP,
-1 for every rank left, torchtitan's default; `data_parallel_replicate_degree`: DDP), the schedule
(1F1B, GPipe, Interleaved1F1B with its chunks), the layer split (`module_fqns_per_model_part`; without it
torchtitan's own, `auto_split`), the micro-batch (the pipeline's, or without a pipeline the local batch),
local and global batch, sequence length, activation checkpointing (the `activation-checkpoint:MODE`
subcommand or `--activation_checkpoint.mode`), sequence parallelism, async TP (as `tp_comm_overlap`, the
nearest the model has), torch.compile (fused kernels; without it eager ones), the parameter dtype and
FSDP's reduce dtype (`mixed_precision_reduce`: float32, 0.3.0's only choice, or bfloat16 in older job
files: `grad_reduce_in_fp32`). Pipeline sends overlap compute (`blocking_p2p` false); attention is taken at FlashAttention-2's rates (`attention_library: sdpa`):
0.3.0's FlexAttention kernels are not in the model, and that is the nearest measured kernel. Refused by
name: context parallelism, HSDP (both data-parallel degrees above 1), torchtitan's selective (op-level)
checkpointing, quantised linears (`--model.converters`), other pipeline schedules, uneven interleaved
chunks. Every other flag (optimizer, data, logging) is not read. A file named *.toml is read as a
torchtitan 0.1-0.2 job file (`toml_flags`: the same settings under their sections, the old names
`training.batch_size`, `training.compile` and the degrees under `training` too, the model by name and
flavor, float8 linears refused).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuplan.errors import InputError
from gpuplan.export.megatron_args import TrainerRun, int_flag, read_tokens

INT_FLAGS = {"parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
             "parallelism.data_parallel_shard_degree", "parallelism.data_parallel_replicate_degree",
             "parallelism.context_parallel_degree", "parallelism.pipeline_parallel_microbatch_size",
             "parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_first_stage_less_layers",
             "parallelism.pipeline_parallel_last_stage_less_layers", "training.local_batch_size",
             "training.global_batch_size", "training.seq_len"}
TEXT_FLAGS = {"module", "config", "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_schedule_csv",
              "activation_checkpoint.mode", "training.mixed_precision_param", "training.mixed_precision_reduce",
              "model.converters"}
LIST_FLAGS = {"parallelism.module_fqns_per_model_part"}
BOOL_FLAGS = {"parallelism.enable_sequence_parallel", "compile.enable", "parallelism.enable_async_tensor_parallel"}
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "1f1b"}  # torchtitan's name (lower) -> ours
CHECKPOINTING = {"none": "none", "full": "full"}


def _name(token: str) -> str:
    """Return a flag's name without dashes, tyro's hyphens read as underscores ('parallelism.enable-sequence-
    parallel' -> 'parallelism.enable_sequence_parallel')."""
    return token.lstrip("-").replace("-", "_")


def _flags(tokens: list[str], where: str) -> dict[str, Any]:
    """Return {flag name: str, list of str, or bool} of the tokens gpuplan reads (tyro's forms: `--a.b v`,
    `--a.b=v`, `--a.b` / `--a.no_b` for booleans, several values after a list flag, the
    `activation-checkpoint:MODE` subcommand); the last value of a repeated flag wins. Raises InputError for
    a value flag without a value."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        sub = re.fullmatch(r"activation[-_]checkpoint:(\S+)", tok)
        if sub:
            out["activation_checkpoint.mode"] = sub.group(1)
            continue
        if not tok.startswith("--"):
            continue
        raw, eq, value = tok.partition("=")
        name = _name(raw)
        head, _, last = name.rpartition(".")
        negated = last.startswith("no_") and f"{head}.{last[3:]}".lstrip(".") in BOOL_FLAGS
        if name in BOOL_FLAGS or negated:
            out[f"{head}.{last[3:]}".lstrip(".") if negated else name] = not negated
        elif name in LIST_FLAGS:
            values = [value] if eq else []
            while not eq and i < len(tokens) and not tokens[i].startswith("--") and ":" not in tokens[i]:
                values.append(tokens[i])
                i += 1
            out[name] = values
        elif name in INT_FLAGS or name in TEXT_FLAGS:
            if not eq:
                if i >= len(tokens) or tokens[i].startswith("--"):
                    raise InputError.at(where, raw, None, "a value after the flag")
                value = tokens[i]
                i += 1
            out[name] = value
    return out


def _refuse_unmodelled(flags: dict[str, Any], where: str) -> None:
    """Raise InputError naming the first setting the model cannot represent; return None when there is none."""
    if (int_flag(flags, "parallelism.context_parallel_degree", where) or 1) > 1:
        raise InputError.at(where, "--parallelism.context_parallel_degree", flags["parallelism.context_parallel_degree"],
                            "1: context parallelism is not in the model")
    if flags.get("model.converters"):
        raise InputError.at(where, "--model.converters", flags["model.converters"],
                            "none: quantised linears (float8, MXFP8, NVFP4) are not read from torchtitan's arguments")
    mode = str(flags.get("activation_checkpoint.mode", "")).lower()
    if mode and mode not in CHECKPOINTING:
        raise InputError.at(where, "activation-checkpoint", mode,
                            "none or full: torchtitan's selective (op-level) checkpointing is not in the model")
    schedule = str(flags.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule.lower() not in SCHEDULES:
        raise InputError.at(where, "--parallelism.pipeline_parallel_schedule", schedule,
                            "1F1B, GPipe or Interleaved1F1B: the model has no other schedule")


def _parts_layers(parts: list[str], num_layers: int, where: str) -> list[int]:
    """Return the transformer layers of each model part of `module_fqns_per_model_part` ('layers.N' names),
    checking that they are the model's layers 0..L-1 in order."""
    counts, seen = [], []
    for part in parts:
        ids = [int(x) for x in re.findall(r"(?:^|,)layers\.(\d+)(?=,|$)", part)]
        counts.append(len(ids))
        seen += ids
    if seen != list(range(num_layers)):
        raise InputError.at(where, "--parallelism.module_fqns_per_model_part", " ".join(parts),
                            f"the model's {num_layers} layers (layers.0 to layers.{num_layers - 1}) in order over the parts")
    return counts


def auto_split(stages: int, num_layers: int, first_less: int, last_less: int, where: str) -> list[int]:
    """Return the transformer layers of each of `stages` model parts as torchtitan 0.3.0 splits a model by
    itself (`_generate_llm_fqn_per_model_part`): the embedding counted as `first_less` layers and the norm and
    head as `last_less`, the L + both spread evenly, the first parts taking one more of the remainder.
    Raises InputError where torchtitan refuses (a part without a layer's worth, a weight above it)."""
    if stages == 1:
        return [num_layers]
    effective = num_layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        raise InputError.at(where, "--parallelism.pipeline_parallel_degree", stages,
                            f"a split torchtitan accepts: {num_layers} layers + {first_less} + {last_less} for the "
                            f"embedding and the head over {stages} parts leave {per} a part")
    counts, taken = [], 0
    for k in range(stages):
        size = per + (k < extra) - (first_less if k == 0 else last_less if k == stages - 1 else 0)
        counts.append(max(0, min(size, num_layers - taken)))
        taken += counts[-1]
    return counts


def read_args(tokens: list[str], num_layers: int, gpus: int, where: str = "torchtitan args",
              sizes_only: bool = False) -> TrainerRun:
    """Return the TrainerRun of torchtitan overrides `tokens` for a model of `num_layers` blocks on `gpus`
    GPUs (with `sizes_only`, before the cluster is known, only its problem's sizes as stated: global_batch,
    local_batch and seq_len, and its config function as model {"config": "MODULE:FUNCTION"}). Raises
    InputError (naming `where`, the flag, its value and what was expected) for what the model cannot
    represent or torchtitan would refuse."""
    return read_flags(_flags(tokens, where), num_layers, gpus, where, sizes_only)


# torchtitan 0.1-0.2 job files (TOML) named some settings differently: (old name, 0.3.0's)
TOML_RENAMES = (("training.batch_size", "training.local_batch_size"), ("training.compile", "compile.enable"),
                ("training.tensor_parallel_degree", "parallelism.tensor_parallel_degree"),
                ("training.data_parallel_degree", "parallelism.data_parallel_shard_degree"),
                ("training.data_parallel_shard_degree", "parallelism.data_parallel_shard_degree"),
                ("training.data_parallel_replicate_degree", "parallelism.data_parallel_replicate_degree"))


def toml_flags(doc: dict[str, Any]) -> dict[str, Any]:
    """Return the flags of a torchtitan job file (TOML, torchtitan 0.1-0.2's `--job.config_file`): its
    sections' keys as `section.key`, the old names renamed (`TOML_RENAMES`), the model's name and flavor
    as the config function they match (`export.torchtitan.CONFIGS`), float8 linears as a converter (refused)."""
    from gpuplan.export.torchtitan import CONFIGS

    flags: dict[str, Any] = {}
    for section, table in doc.items():
        if isinstance(table, dict):
            flags.update({f"{section}.{key}": value for key, value in table.items()})
    for old, new in TOML_RENAMES:
        if old in flags:
            flags.setdefault(new, flags.pop(old))
    name, flavor = flags.get("model.name"), flags.get("model.flavor")
    known = next((c for c in CONFIGS if c.module == name and c.flavor == flavor), None)
    if known is not None:
        flags["module"], flags["config"] = known.module, known.function
    if flags.get("float8.enable_float8_linear") or flags.get("float8.enable_fsdp_float8_all_gather"):
        flags["model.converters"] = "float8"
    parts = flags.get("parallelism.module_fqns_per_model_part")
    if isinstance(parts, list):  # TOML: a list of lists of module names
        flags["parallelism.module_fqns_per_model_part"] = [",".join(map(str, p)) if isinstance(p, list) else str(p)
                                                           for p in parts]
    if isinstance(flags.get("model.converters"), list):
        flags["model.converters"] = ",".join(map(str, flags["model.converters"]))
    for key, value in list(flags.items()):
        if isinstance(value, bool) and key not in BOOL_FLAGS:
            flags[key] = str(value).lower()
    return flags


def read_flags(flags: dict[str, Any], num_layers: int, gpus: int, where: str = "torchtitan args",
               sizes_only: bool = False) -> TrainerRun:
    """Return the TrainerRun of torchtitan's settings as {flag name: value} (`read_args`)."""
    function = f"{flags['module']}:{flags['config']}" if "module" in flags and "config" in flags else None
    tp = int_flag(flags, "parallelism.tensor_parallel_degree", where) or 1
    pp = int_flag(flags, "parallelism.pipeline_parallel_degree", where) or 1
    replicate = int_flag(flags, "parallelism.data_parallel_replicate_degree", where) or 1
    shard = int_flag(flags, "parallelism.data_parallel_shard_degree", where, least=-1)
    if shard in (None, -1):  # torchtitan's default: FSDP over every rank the other degrees leave
        shard = max(1, gpus // (tp * pp * replicate))
    if shard == 0:
        raise InputError.at(where, "--parallelism.data_parallel_shard_degree", 0, "-1 or a positive integer")
    dp = shard * replicate
    local = int_flag(flags, "training.local_batch_size", where)
    global_batch = int_flag(flags, "training.global_batch_size", where, least=-1)
    if sizes_only:  # before the cluster is known: what is stated, the local batch besides
        stated = {"global_batch": None if global_batch == -1 else global_batch, "local_batch": local,
                  "seq_len": int_flag(flags, "training.seq_len", where)}
        return TrainerRun(problem={k: v for k, v in stated.items() if v is not None},
                          model={"config": function} if function else {})
    if global_batch in (None, -1) and local is not None:  # torchtitan's default: the local batch on every replica
        global_batch = local * dp
    sizes = {k: v for k, v in (("global_batch", global_batch), ("seq_len", int_flag(flags, "training.seq_len", where)))
             if v is not None}
    _refuse_unmodelled(flags, where)
    if replicate > 1 and shard > 1:
        raise InputError.at(where, "--parallelism.data_parallel_replicate_degree", replicate,
                            f"1 with data_parallel_shard_degree {shard}: HSDP (replicated FSDP groups) is not in the model")
    schedule = str(flags.get("parallelism.pipeline_parallel_schedule", "1F1B")).lower()
    parts = flags.get("parallelism.module_fqns_per_model_part")
    per_stage = int_flag(flags, "parallelism.pipeline_parallel_layers_per_stage", where)
    if parts:
        counts = _parts_layers(parts, num_layers, where)
    elif pp == 1:
        counts = [num_layers]
    else:  # torchtitan's own split: 1 part a rank for 1F1B and GPipe, 2 for Interleaved1F1B, or by layers per stage
        first_less = int_flag(flags, "parallelism.pipeline_parallel_first_stage_less_layers", where, least=0)
        last_less = int_flag(flags, "parallelism.pipeline_parallel_last_stage_less_layers", where, least=0)
        first_less, last_less = 1 if first_less is None else first_less, 1 if last_less is None else last_less
        n_parts = pp * (2 if schedule == "interleaved1f1b" else 1)
        if per_stage:
            n_parts = -(-(num_layers + first_less + last_less) // per_stage)
        counts = auto_split(n_parts, num_layers, first_less, last_less, where)
    if len(counts) % pp:
        raise InputError.at(where, "--parallelism.module_fqns_per_model_part", len(counts),
                            f"a multiple of pipeline_parallel_degree {pp} model parts")
    v = len(counts) // pp
    if (v > 1) != (schedule == "interleaved1f1b"):
        raise InputError.at(where, "--parallelism.pipeline_parallel_schedule", flags.get(
            "parallelism.pipeline_parallel_schedule", "1F1B"), f"Interleaved1F1B with {len(counts)} model parts on "
            f"{pp} ranks, else one part per rank" if v > 1 else "1F1B or GPipe with one model part per rank")
    if v > 1 and len(set(counts)) > 1:
        raise InputError.at(where, "--parallelism.module_fqns_per_model_part", counts,
                            "equal parts with interleaving: uneven interleaved chunks are not in the model")
    mb = (int_flag(flags, "parallelism.pipeline_parallel_microbatch_size", where) or 1) if pp > 1 else (local or 1)
    config: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "interleave": v, "micro_batch": mb,
                              "recompute": CHECKPOINTING.get(str(flags.get("activation_checkpoint.mode", "none")).lower(),
                                                             "none")}
    if v == 1 and pp > 1:
        config["layers"] = counts
    param = str(flags.get("training.mixed_precision_param", "bfloat16"))
    if param not in ("bfloat16", "float32"):
        raise InputError.at(where, "--training.mixed_precision_param", param, "bfloat16 or float32")
    reduce = str(flags.get("training.mixed_precision_reduce", "float32"))
    if reduce not in ("float32", "bfloat16"):
        raise InputError.at(where, "--training.mixed_precision_reduce", reduce, "float32 or bfloat16")
    problem = {**sizes, "dtype": "bf16" if param == "bfloat16" else "fp32", "fsdp": shard > 1,
               "grad_reduce_in_fp32": param == "float32" or reduce == "float32",
               "distributed_optimizer": False, "overlap_dp_allreduce": True, "blocking_p2p": False,
               "schedule": SCHEDULES[schedule], "flash_attention": True, "attention_library": "sdpa",
               "sequence_parallel": tp > 1 and flags.get("parallelism.enable_sequence_parallel", True),
               "tp_comm_overlap": tp > 1 and bool(flags.get("parallelism.enable_async_tensor_parallel")),
               "eager_kernels": not flags.get("compile.enable", False)}
    return TrainerRun(config=config, problem=problem, model={"config": function} if function else {})


def read_args_file(path: str | Path, num_layers: int, gpus: int, sizes_only: bool = False) -> TrainerRun:
    """Return the TrainerRun of a torchtitan arguments file (`gpuplan export torchtitan`'s torchtitan.args:
    one argument per line; shell-style quoting and spacing are read too) or, named *.toml, of a torchtitan
    0.1-0.2 job file (`toml_flags`)."""
    if Path(path).suffix.lower() == ".toml":
        import tomllib

        try:
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise InputError.at(str(path), "file", str(path), f"a readable torchtitan job file (TOML: {exc})") from None
        return read_flags(toml_flags(doc), num_layers, gpus, str(path), sizes_only)
    return read_args(read_tokens(path, "torchtitan"), num_layers, gpus, str(path), sizes_only)


def check_model(run: TrainerRun, model: Any, where: str) -> None:
    """Raise InputError when the run's config function is one of torchtitan 0.3.0's known ones
    (`export.torchtitan.CONFIGS`) and its model is not `model` (a TransformerConfig); return None otherwise
    (an unknown function's shape cannot be read without torchtitan)."""
    from gpuplan.export.torchtitan import CONFIGS, model_shape

    function = run.model.get("config")
    known = next((c for c in CONFIGS if c.name == function), None)
    if known is None:
        return
    shape = model_shape(model.model_dump(mode="json"))
    differ = [f"{k} {known.shape()[k]} (the model's {shape[k]})" for k in known.shape() if known.shape()[k] != shape[k]]
    if differ:
        raise InputError.at(where, "--config", function, f"a config function of the model {model.name}: {function}'s "
                            f"model differs in " + ", ".join(differ))
