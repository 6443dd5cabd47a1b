"""Put a problem's declared devices and model onto a profile's measured figures, explicitly.

Two rules keep a solve with `--profile` honest:

* **Declared types are kept.** Every device type the problem declares is either measured by the
  profile under that name (or its catalog name), or emulated by it (`gpuplan profile --emulate
  NAME=BASE*FACTOR`: the base type's figures, compute FACTOR times slower). Anything else is
  refused. The problem's own nodes and device counts stay; the figures come from the profile.
* **The layer table is the solved model's.** The profile's per-layer costs must have been measured
  on the problem's model (same shape, any name). The one accepted stand-in is the profiler's
  documented CPU scaling of a catalog model (`scaled_from` names it) for that very catalog model:
  the table says how it was scaled and the cost model scales it by the FLOP ratio. Any other
  table is refused with the command that profiles the right model.

Pure functions on plain data (no torch, no solver).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.cluster import Cluster
from gpuplan.models.profile import LayerTable, Profile, cluster_document
from gpuplan.models.workload import TransformerConfig, model_config


def _shape(cfg: TransformerConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", exclude={"name", "max_seq_len"})


def _describe(cfg: TransformerConfig) -> str:
    return (f"{cfg.name} ({cfg.num_layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, FFN {cfg.ffn_hidden}, "
            f"vocabulary {cfg.vocab})")


def micro_batch_sizes(global_batch: int, top: int = 8) -> list[int]:
    """Return the powers of two up to `top` that divide `global_batch` (the micro-batch sizes a
    pipeline of that batch can use), at least [1]."""
    return [b for b in (1, 2, 4, 8, 16, 32) if b <= top and global_batch % b == 0] or [1]


def profile_command(profile: Profile, config: TransformerConfig, seq_len: int, global_batch: int,
                    output: str = "profile.json") -> str:
    """Return the `gpuplan profile` command line that measures `config` at `seq_len` on the profile's
    devices, keeping its emulated types and its number of CPU devices."""
    cpu = any(d.backend == "cpu" for d in profile.device_types)
    model = json.dumps(config.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
    parts = ["gpuplan", "profile"] + (["--quick"] if profile.quick else [])
    if cpu:
        parts += ["--device", "cpu", "--cpu-ranks", str(max(d.count for d in profile.device_types))]
    parts += ["--model", model, "--seq-len", str(seq_len),
              "--micro-batches", ",".join(str(b) for b in micro_batch_sizes(global_batch))]
    for e in profile.emulated:
        parts += ["--emulate", f"{e.name}={e.base}*{e.slowdown:g}"]
    return " ".join(shlex.quote(p) for p in parts + ["-o", output])


def _is_catalog_stand_in(table: LayerTable, config: TransformerConfig) -> bool:
    """True when `table` is the profiler's scaled copy of the catalog model that `config` is."""
    if not table.scaled_from:
        return False
    try:
        catalog = model_config(table.scaled_from)
    except ValueError:
        return False
    return _shape(catalog) == _shape(config)


def matching_layer_table(profile: Profile, config: TransformerConfig, *, seq_len: int,
                         global_batch: int) -> LayerTable | None:
    """Return the profile's layer table measured on `config` (None when the profile has no layer
    table at all). Raises InputError naming the profile's model and the command that profiles
    the right one when every table holds another model."""
    if not profile.layers:
        return None
    want = _shape(config)
    for t in profile.layers:
        try:
            measured = TransformerConfig.model_validate(t.config)
        except ValueError:
            continue
        if _shape(measured) == want or _is_catalog_stand_in(t, config):
            return t
    held = []
    for t in profile.layers:
        try:
            held.append(_describe(TransformerConfig.model_validate(t.config))
                        + (f", scaled from {t.scaled_from}" if t.scaled_from else ""))
        except ValueError:
            held.append(repr(t.model))
    raise InputError(
        f"{profile.where}: field 'layers': the layer table holds {'; '.join(held)}, but the problem solves "
        f"{_describe(config)}; its costs would be another model's. Profile the solved model with:\n  "
        f"{profile_command(profile, config, seq_len, global_batch)}", file=profile.where, field="layers")


def _backing(profile: Profile, declared: list[str]) -> dict[str, tuple[str, float]]:
    """Return declared type -> (measured type name, slowdown) or raise InputError for a type the
    profile neither measures nor emulates."""
    measured = {d.name: d.name for d in profile.device_types}
    measured.update({d.catalog_name: d.name for d in profile.device_types if d.catalog_name})
    emulated = {e.name: e for e in profile.emulated}
    out: dict[str, tuple[str, float]] = {}
    for t in declared:
        if t in measured:
            out[t] = (measured[t], 1.0)
        elif t in emulated:
            e = emulated[t]
            if e.base not in measured:
                raise InputError.at(profile.where, f"emulated.{t}.base", e.base,
                                    f"a measured device type ({', '.join(sorted(measured))})")
            out[t] = (measured[e.base], e.slowdown)
        else:
            names = ", ".join(sorted({d.name for d in profile.device_types}))
            emu = ", ".join(f"{e.name}={e.base}*{e.slowdown:g}" for e in profile.emulated) or "none"
            raise InputError(
                f"{profile.where}: the problem declares device type {t!r}, which the profile neither measured "
                f"(measured: {names}) nor emulates (emulated: {emu}). Declare only measured types, or profile "
                f"with `--emulate {t}=BASE*FACTOR` (e.g. --emulate {t}={sorted(measured)[0]}*2) to run it as a "
                f"measured type slowed down FACTOR times", file=profile.where, field="device_types")
    return out


def declared_cluster(cluster: Cluster, profile: Profile) -> tuple[dict[str, Any], dict[str, tuple[str, float]]]:
    """Return (cluster mapping, backing): the problem's own nodes and device counts with every
    declared type's figures taken from the profile, and declared type -> (measured type, slowdown).

    An emulated type gets its base's figures with peak TFLOP/s divided by the slowdown. Each
    declared node gets the profile's node of the same name's intra-node link, else the slowest
    measured one; nodes are linked as the profile measured them when it names them, else as
    declared. Raises InputError when a type is neither measured nor emulated, or a declared node
    holds more devices backed by one measured type than any profiled node has of it.
    """
    backing = _backing(profile, list(cluster.capacity()))
    measured = cluster_document(profile)
    have = {t.name: max((n.devices.get(t.name, 0) for n in profile.nodes), default=0) for t in profile.device_types}
    types: dict[str, Any] = {}
    for t, (base, slow) in backing.items():
        doc = dict(measured["device_types"][base])
        doc["name"] = t
        doc["peak_tflops"] = {k: v / slow for k, v in doc["peak_tflops"].items()}
        types[t] = doc
    profiled = {n["name"]: n for n in measured["nodes"]}
    intra = [n["intra_link"] for n in measured["nodes"] if "intra_link" in n]
    slowest = min(intra, key=lambda l: l["bandwidth_GBps"]) if intra else None
    nodes = []
    for i, node in enumerate(cluster.nodes):
        gpus = {cluster.type_key(t): c for t, c in node.gpus.items()}
        per_base: dict[str, int] = {}
        for t, c in gpus.items():
            per_base[backing[t][0]] = per_base.get(backing[t][0], 0) + c
        for base, count in per_base.items():
            if count > have.get(base, 0):
                cpu = profile.device_type(base).backend == "cpu"
                hint = f"; profile with --cpu-ranks {count}" if cpu else ""
                raise InputError(f"{profile.where}: node {node.name!r} of the problem holds {count} devices backed "
                                 f"by measured type {base!r}; the profile's nodes hold at most {have.get(base, 0)}"
                                 f"{hint}", file=profile.where, field=f"nodes[{i}]")
        doc: dict[str, Any] = {"name": node.name, "gpus": gpus}
        own = profiled.get(node.name, {}).get("intra_link") or slowest
        if own is not None:
            doc["intra_link"] = own
        elif node.intra_link is not None:
            doc["intra_link"] = node.intra_link.model_dump(mode="json")
        if node.nics is not None:
            doc["nics"] = node.nics
        nodes.append(doc)
    names = {n["name"] for n in nodes}
    links = [l for l in measured.get("links", []) if {l["a"], l["b"]} <= names]
    out: dict[str, Any] = {"name": f"{cluster.name or 'declared'} on profile:{profile.host}", "device_types": types,
                           "nodes": nodes, "source": "profile",
                           "links": links or [l.model_dump(mode="json") for l in cluster.links],
                           "inter_node": measured.get("inter_node") if links else cluster.inter_node.model_dump(mode="json")}
    return out, backing


def declared_layer_table(table: LayerTable, backing: dict[str, tuple[str, float]], threads: int | None) -> LayerTable:
    """Return `table` with one copy of its measured rows per declared type (times x the type's
    slowdown), the slowdowns a run must emulate, and the threads the costs were measured with."""
    rows = [c.model_copy(update={"device_type": t, "forward_s": c.forward_s * slow, "backward_s": c.backward_s * slow})
            for t, (base, slow) in backing.items() for c in table.costs if c.device_type == base]
    return table.model_copy(update={"costs": rows, "slowdowns": {t: slow for t, (_, slow) in backing.items()},
                                    "threads": threads})
