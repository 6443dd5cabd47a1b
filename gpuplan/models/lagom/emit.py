"""Turning Lagom settings into what NCCL and torch read: environment variables and per-group Options.

NCCL reads its environment once per process, so per-op choices are folded: per collective type the
algorithms/protocols chosen (NCCL_ALGO / NCCL_PROTO per-collective syntax, NCCL >= 2.24), and for
threads and buffer sizes the value carrying the most communication time. Channel bounds are set per
process group through `ProcessGroupNCCL.Options.config.{min_ctas,max_ctas,cga_cluster_size}`
(torch >= 2.x with NCCL >= 2.17); the env gives the global bounds. Where folding loses a per-op
choice, a note says so (exact per-op settings need an NCCL tuner plugin reading `settings`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from gpuplan.models.lagom.cost import MAX_CHANNELS, NCCL_STEPS

NCCL_COLL = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
             "broadcast": "broadcast", "reduce": "reduce"}
NCCL_ALGO_NAME = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS"}
ALGO_TOKENS = {"ring", "tree", "nvls", "nvlstree", "collnetdirect", "collnetchain", "pat"}
PROTO_TOKENS = {"ll", "ll128", "simple"}
# The NCCLConfig fields torch binds (notes 1.5) plus the Options flag.
OPTION_KEYS = {"min_ctas", "max_ctas", "cga_cluster_size", "is_high_priority_stream", "blocking",
               "split_share", "net_name"}


def buffsize_for(algo: str, proto: str, collective: str, chunk_bytes: int) -> int:
    """Return the FIFO size (bytes) whose derived chunk is `chunk_bytes`: chunk x 8 / chunkSteps."""
    steps = 4 if (algo == "ring" and proto == "Simple" and collective in
                  ("all_reduce", "all_gather", "reduce_scatter")) else 1
    return chunk_bytes * NCCL_STEPS // steps


def _heaviest(weights: dict[Any, float]) -> Any:
    return max(sorted(weights, key=str), key=lambda k: weights[k])


def emit(problem: Any, settings: list[Any]) -> tuple[dict[str, str], dict[str, dict[str, Any]], list[str]]:
    """Return (env vars, per-group Options fields, notes) for `settings` (one Theta per op)."""
    comp = problem.compiled
    weight = [float(comp.comm_us(i, t)) * comp.ops[i].count for i, t in enumerate(settings)]
    algos: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    protos: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    threads: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    buffs: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, (op, t) in enumerate(zip(comp.ops, settings)):
        groups[op.group].append(t.channels)
        if op.collective in NCCL_COLL:
            algos[NCCL_COLL[op.collective]][t.algo] += weight[i]
            protos[NCCL_COLL[op.collective]][t.proto] += weight[i]
        if t.algo != "tree":
            threads["LL128" if t.proto == "LL128" else "other"][t.threads] += weight[i]
        if t.algo not in ("nvls", "nvlstree"):   # NVLS chunks come from NCCL_NVLS_CHUNKSIZE, not the FIFO
            buffs[t.proto][buffsize_for(t.algo, t.proto, op.collective, t.chunk_bytes)] += weight[i]
    notes: list[str] = []

    def listing(table: dict[str, dict[str, float]], what: str) -> str:
        parts = []
        for coll in sorted(table):
            chosen = sorted(table[coll], key=lambda k: -table[coll][k])
            if len(chosen) > 1:
                notes.append(f"{coll}: ops chose {what} {', '.join(chosen)}; NCCL picks among them by its own "
                             f"model (exact per-op choice needs a tuner plugin)")
            parts.append(f"{coll}:{','.join(c.lower() for c in chosen)}")
        return ";".join(parts)

    env: dict[str, str] = {}
    if algos:
        env["NCCL_ALGO"] = listing(algos, "algorithms")
        env["NCCL_PROTO"] = listing(protos, "protocols")
    all_nc = [nc for ncs in groups.values() for nc in ncs]
    env["NCCL_MIN_CTAS"], env["NCCL_MAX_CTAS"] = str(min(all_nc)), str(max(all_nc))
    for key, var in (("other", "NCCL_NTHREADS"), ("LL128", "NCCL_LL128_NTHREADS")):
        if threads[key]:
            env[var] = str(_heaviest(threads[key]))
            if len(threads[key]) > 1:
                notes.append(f"{var}: ops chose {sorted(threads[key])}; set to the one carrying most time")
    for proto, var in (("Simple", "NCCL_BUFFSIZE"), ("LL", "NCCL_LL_BUFFSIZE"), ("LL128", "NCCL_LL128_BUFFSIZE")):
        if buffs[proto]:
            env[var] = str(_heaviest(buffs[proto]))
            if len(buffs[proto]) > 1:
                notes.append(f"{var}: ops chose {sorted(buffs[proto])}; set to the one carrying most time")
    hopper = problem.hardware.architecture() in ("hopper", "blackwell")
    if hopper:
        env["NCCL_CGA_CLUSTER_SIZE"] = "4"
    options = {g: {"min_ctas": min(ncs), "max_ctas": max(ncs), "cga_cluster_size": 4 if hopper else 0,
                   "is_high_priority_stream": False} for g, ncs in sorted(groups.items())}
    return env, options, notes


def _int(env: dict[str, str], key: str, lo: int, hi: int, step: int = 1) -> list[str]:
    if key not in env:
        return []
    try:
        v = int(env[key])
    except ValueError:
        return [f"{key}={env[key]!r}: expected an integer"]
    if not lo <= v <= hi or v % step:
        return [f"{key}={v}: expected {'a multiple of ' + str(step) + ' ' if step > 1 else ''}in [{lo}, {hi}]"]
    return []


def _coll_list(key: str, value: str, tokens: set[str]) -> list[str]:
    out = []
    for part in value.split(";"):
        coll, _, items = part.rpartition(":")
        if coll and coll not in NCCL_COLL.values():
            out.append(f"{key}: unknown collective {coll!r}")
        for item in items.lstrip("^").split(","):
            if item.strip().lower() not in tokens:
                out.append(f"{key}: unknown value {item!r} (expected {', '.join(sorted(tokens))})")
    return out


def env_problems(env: dict[str, str], options: dict[str, dict[str, Any]]) -> list[str]:
    """Return what in the env vars and per-group Options NCCL/torch would refuse ([] when valid)."""
    out: list[str] = []
    for k in env:
        if not re.fullmatch(r"NCCL_[A-Z0-9_]+|TORCH_NCCL_[A-Z0-9_]+|CUDA_DEVICE_MAX_CONNECTIONS", k):
            out.append(f"{k}: not an NCCL/torch variable")
    if "NCCL_ALGO" in env:
        out += _coll_list("NCCL_ALGO", env["NCCL_ALGO"], ALGO_TOKENS)
    if "NCCL_PROTO" in env:
        out += _coll_list("NCCL_PROTO", env["NCCL_PROTO"], PROTO_TOKENS)
    out += _int(env, "NCCL_NTHREADS", 64, 512, 32) + _int(env, "NCCL_LL128_NTHREADS", 160, 640, 32)
    out += _int(env, "NCCL_MIN_CTAS", 1, MAX_CHANNELS) + _int(env, "NCCL_MAX_CTAS", 1, MAX_CHANNELS)
    out += _int(env, "NCCL_CGA_CLUSTER_SIZE", 0, 8)
    for key in ("NCCL_BUFFSIZE", "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE"):
        out += _int(env, key, 1024, 2**31 - 1)
    if not out and "NCCL_MIN_CTAS" in env and int(env["NCCL_MIN_CTAS"]) > int(env.get("NCCL_MAX_CTAS", MAX_CHANNELS)):
        out.append("NCCL_MIN_CTAS above NCCL_MAX_CTAS")
    for g, opts in options.items():
        unknown = set(opts) - OPTION_KEYS
        if unknown:
            out.append(f"group {g}: Options has no field(s) {sorted(unknown)}")
        lo, hi = opts.get("min_ctas", 1), opts.get("max_ctas", MAX_CHANNELS)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= MAX_CHANNELS):
            out.append(f"group {g}: min_ctas={lo}, max_ctas={hi}: expected 1 <= min <= max <= {MAX_CHANNELS}")
        if not 0 <= opts.get("cga_cluster_size", 0) <= 8:
            out.append(f"group {g}: cga_cluster_size={opts['cga_cluster_size']}: expected 0..8")
    return out
