"""The profile document written by `gpuplan profile` and read by every model in place of catalog numbers.

A profile is versioned JSON: measured device types, the nodes that hold them, links with fitted
alpha-beta parameters, collective timings and per-layer cost tables. This module only defines the
schema and how a profile becomes a cluster; the measuring lives in gpuplan.profiling (torch).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError

from gpuplan.errors import InputError
from gpuplan.io import atomic_write_text
from gpuplan.models.base import Schema, Table, input_error_from
from gpuplan.units import GBps, Bytes, Seconds

PROFILE_SCHEMA_VERSION = 1


def bus_factor(op: str, n: int) -> float:
    """Return the nccl-tests factor F with busbw = algbw * F for `op` over `n` ranks."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


class Spread(Schema):
    """Median and spread of repeated timings of one measurement (seconds)."""

    median_s: Seconds = Field(ge=0)
    min_s: Seconds = Field(ge=0)
    max_s: Seconds = Field(ge=0)
    repeats: int = Field(ge=1)
    rel_spread: float = Field(ge=0, description="(p90 - p10) / median")
    reliable: bool = True


class MatmulPoint(Schema):
    """One timed square matmul: n x n times n x n in `dtype`; achieved TFLOP/s."""

    dtype: str
    n: int = Field(gt=0)
    tflops: float = Field(ge=0)
    timing: Spread


class MeasuredDeviceType(Schema):
    """Figures measured on one device type (the best of the sweep is what solvers use)."""

    name: str
    catalog_name: str | None = None
    backend: Literal["cuda", "cpu", "mps", "xpu", "other"] = "cuda"
    count: int = Field(default=1, ge=1)
    memory_bytes: Bytes = Field(gt=0)
    matmul_tflops: dict[str, float] = Field(default_factory=dict)
    peak_fraction: dict[str, float] = Field(default_factory=dict)
    matmul: list[MatmulPoint] = Field(default_factory=list)
    copy_GBps: GBps | None = None
    h2d_GBps: GBps | None = None
    d2h_GBps: GBps | None = None
    threads: int | None = None


class CollectivePoint(Schema):
    """One collective at one message size: time, and algbw / busbw with the nccl-tests conventions."""

    size_bytes: Bytes = Field(gt=0)
    timing: Spread
    algbw_GBps: GBps = Field(ge=0)
    busbw_GBps: GBps = Field(ge=0)


class AlphaBeta(Schema):
    """A fitted time model t(size) = alpha_s + size_bytes / (bandwidth_GBps * 1e9)."""

    alpha_s: Seconds = Field(ge=0)
    bandwidth_GBps: GBps = Field(gt=0)
    max_rel_error: float = Field(ge=0)
    mean_rel_error: float = Field(ge=0)

    def time_s(self, size_bytes: float) -> float:
        """Return the predicted time in seconds for `size_bytes`."""
        return self.alpha_s + size_bytes / (self.bandwidth_GBps * 1e9)


class CollectiveProfile(Schema):
    """Timings of one collective over one group of ranks, with its alpha-beta fit."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"]
    backend: str
    group_size: int = Field(ge=1)
    scope: Literal["intra_node", "inter_node"] = "intra_node"
    nodes: list[str] = Field(default_factory=list)
    points: list[CollectivePoint]
    fit: AlphaBeta | None = None


class ProfileLink(Schema):
    """A measured link between two nodes (or within one: a == b), fitted alpha-beta."""

    a: str
    b: str
    bandwidth_GBps: GBps = Field(gt=0)
    latency_s: Seconds = Field(ge=0)
    max_rel_error: float | None = None


class ProfileNode(Schema):
    """A node of the profiled machine(s): its host name and the number of devices of each type."""

    name: str
    devices: dict[str, int]


class LayerCost(Schema):
    """Measured cost of one transformer block (or embedding/head) at one micro-batch and sequence length."""

    device_type: str
    part: Literal["layer", "embedding", "head"] = "layer"
    micro_batch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    forward_s: Seconds = Field(ge=0)
    backward_s: Seconds = Field(ge=0)
    activation_bytes: Bytes = Field(ge=0)
    forward_spread: float = Field(default=0.0, ge=0)
    backward_spread: float = Field(default=0.0, ge=0)
    peak_bytes: Bytes | None = Field(default=None, ge=0, description="peak allocated above the input "
                                     "during forward+backward (CUDA only)")


class LayerTable(Schema):
    """Per-layer costs of one model (possibly a scaled-down configuration of a catalog model)."""

    model: str
    config: dict[str, Any]
    scaled_from: str | None = None
    scaling_note: str = ""
    dtype: str = "fp32"
    costs: list[LayerCost]
    clock: Literal["wall", "cpu"] = Field(default="wall", description="cpu: process CPU time (single-threaded "
                                          "CPU profiling, not inflated by other jobs on a shared machine)")
    threads: int | None = Field(default=None, ge=1, description="torch threads per process the costs were "
                                "measured with (CPU); runs of the plan use the same")
    calls: Literal["back-to-back", "after-wait"] = Field(
        default="back-to-back", description="how each timed call was made: back-to-back (CUDA; older CPU "
        "profiles) or after-wait: each call after an idle wait as long as the previous call took, as a "
        "pipeline stage's ops follow a receive or an emulated sleep (CPU)")
    slowdowns: dict[str, float] = Field(default_factory=dict, description="device type -> the factor by which "
                                        "a run emulates it on the measured device (1 for a measured type); "
                                        "set when a problem's declared types are mapped onto a profile")
    stage_call_forward_s: Seconds = Field(default=0.0, ge=0, description="what the pipeline runtime "
                                          "(torch.distributed.pipelining) adds to each forward call of a stage "
                                          "over calling its modules directly, measured in a multi-rank pipeline "
                                          "of one-block stages sending activations and gradients to each other, "
                                          "against the same block called directly by those ranks at once "
                                          "(0 in older profiles)")
    stage_call_backward_s: Seconds = Field(default=0.0, ge=0, description="the same per backward call")


class EmulatedType(Schema):
    """A declared device type the profile emulates on a measured one: the base type's figures with
    compute `slowdown` times slower (a run sleeps (slowdown - 1) x each op's duration after it)."""

    name: str = Field(min_length=1)
    base: str = Field(min_length=1)
    slowdown: float = Field(ge=1.0)


def parse_emulation(text: str) -> EmulatedType:
    """Return the EmulatedType written as NAME=BASE*FACTOR (e.g. cpu-slow2x=cpu*2).

    Raises InputError naming the text and the expected form when it does not parse.
    """
    name, eq, rest = text.partition("=")
    base, star, factor = rest.partition("*")
    try:
        value = float(factor)
    except ValueError:
        value = math.nan
    if not (eq and star and name.strip() and base.strip()) or not value >= 1.0:
        raise InputError.at(None, "--emulate", text, "NAME=BASE*FACTOR with FACTOR >= 1, e.g. cpu-slow2x=cpu*2")
    return EmulatedType(name=name.strip(), base=base.strip(), slowdown=value)


class StackCheck(Schema):
    """Self-check: forward+backward of k stacked layers, predicted from the table and measured."""

    layers: int = Field(ge=1)
    micro_batch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    predicted_s: Seconds = Field(ge=0)
    measured_s: Seconds = Field(gt=0)
    rel_error: float = Field(description="(predicted - measured) / measured")
    measured_spread: float = Field(default=0.0, ge=0)
    table_predicted_s: Seconds | None = Field(default=None, ge=0, description="k x the table's per-layer cost")
    predicted_min_s: Seconds | None = Field(default=None, ge=0, description="k x the fastest per-layer run")
    measured_min_s: Seconds | None = Field(default=None, ge=0, description="the fastest end-to-end run")


class Profile(Schema):
    """The whole profile document."""

    kind: Literal["profile"] = "profile"
    schema_version: int = PROFILE_SCHEMA_VERSION
    created: str = ""
    host: str = ""
    torch_version: str = ""
    quick: bool = False
    notes: list[str] = Field(default_factory=list)
    device_types: list[MeasuredDeviceType]
    nodes: list[ProfileNode]
    links: list[ProfileLink] = Field(default_factory=list)
    collectives: list[CollectiveProfile] = Field(default_factory=list)
    layers: list[LayerTable] = Field(default_factory=list)
    validation: list[StackCheck] = Field(default_factory=list)
    emulated: list[EmulatedType] = Field(default_factory=list, description="declared types emulated on a "
                                         "measured one (`gpuplan profile --emulate`)")
    _path: str = PrivateAttr(default="")

    @property
    def where(self) -> str:
        """Return the file the profile was read from (or 'the profile' when it was built in memory)."""
        return self._path or "the profile"

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON atomically; return the path."""
        return atomic_write_text(path, json.dumps(self.model_dump(mode="json"), indent=1) + "\n")

    def device_type(self, name: str) -> MeasuredDeviceType:
        """Return the measured device type called `name`."""
        for d in self.device_types:
            if d.name == name:
                return d
        raise KeyError(name)

    def layer_table(self, model: str | None = None) -> LayerTable | None:
        """Return the layer table for `model` (or the first one when None); None when absent."""
        for t in self.layers:
            if model is None or t.model == model or t.scaled_from == model:
                return t
        return None


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; raise InputError naming the file and field when it is bad."""
    p = Path(path)
    try:
        from gpuplan.io import read_json

        data = read_json(p, what="profile file", invalid_as="profile (truncated or corrupt?)")  # bounded read
    except FileNotFoundError:
        raise InputError(f"{p}: no such profile file", file=str(p)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a JSON profile (truncated or corrupt?): {exc}", file=str(p)) from None
    if not isinstance(data, dict) or data.get("kind") != "profile":
        got = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise InputError.at(str(p), "kind", got, "'profile' (a file written by `gpuplan profile`)")
    if data.get("schema_version") != PROFILE_SCHEMA_VERSION:
        raise InputError.at(str(p), "schema_version", data.get("schema_version"),
                            f"{PROFILE_SCHEMA_VERSION}")
    from gpuplan.models.base import check_input_numbers

    check_input_numbers(data, str(p))  # finite, within each unit's limit, rates non-negative
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise input_error_from(exc, str(p)) from None
    profile._path = str(p)
    return profile


def cluster_document(profile: Profile) -> dict[str, Any]:
    """Return the cluster mapping (as `Cluster` reads it) that a profile describes.

    Measured device types override the catalog: memory as measured, peak TFLOP/s per dtype as
    the best measured matmul rate, memory bandwidth as the measured copy bandwidth.
    """
    from gpuplan.models.catalog import catalog_entry

    types: dict[str, Any] = {}
    for d in profile.device_types:
        base = catalog_entry(d.catalog_name or d.name) or {}
        peaks = {k: v for k, v in d.matmul_tflops.items() if v > 0} or base.get("peak_tflops") or {"fp32": 1.0}
        intra = [l.bandwidth_GBps for l in profile.links if l.a == l.b]
        types[d.name] = {
            "name": d.name, "memory_bytes": d.memory_bytes,
            "memory_bandwidth_GBps": d.copy_GBps or base.get("memory_bandwidth_GBps") or 10.0,
            "peak_tflops": peaks,
            "intra_node_GBps": (min(intra) if intra else base.get("intra_node_GBps", 16.0)),
            "price_per_hour": base.get("price_per_hour"), "measured": True}
    nodes = [{"name": n.name, "gpus": dict(n.devices)} for n in profile.nodes]
    doc: dict[str, Any] = {"name": f"profile:{profile.host}", "device_types": types, "nodes": nodes,
                           "source": "profile"}
    inter = [l for l in profile.links if l.a != l.b]
    if inter:
        slowest = min(inter, key=lambda l: l.bandwidth_GBps)
        doc["inter_node"] = {"bandwidth_GBps": slowest.bandwidth_GBps, "latency_s": slowest.latency_s}
        doc["links"] = [{"a": l.a, "b": l.b, "bandwidth_GBps": l.bandwidth_GBps, "latency_s": l.latency_s}
                        for l in inter]
    for n in nodes:
        own = [l for l in profile.links if l.a == l.b == n["name"]]
        if own:
            n["intra_link"] = {"bandwidth_GBps": own[0].bandwidth_GBps, "latency_s": own[0].latency_s}
    return doc


def cluster_document_from_profile_file(path: str | Path) -> dict[str, Any]:
    """Return the cluster mapping of the profile file at `path` (see cluster_document)."""
    return cluster_document(load_profile(path))


def summary_tables(profile: Profile) -> list[Table]:
    """Return readable tables of a profile: devices, collectives (fits), layer costs, self-check."""

    dev_rows = []
    for d in profile.device_types:
        best = ", ".join(f"{k} {v:.3g}" for k, v in d.matmul_tflops.items())
        frac = ", ".join(f"{k} {v:.0%}" for k, v in d.peak_fraction.items()) or "-"
        dev_rows.append([d.name, d.count, d.memory_bytes / 2**30, best, frac, d.copy_GBps, d.h2d_GBps, d.d2h_GBps])
    tables = [Table(f"devices ({profile.host})", ["type", "count", "memory GiB", "matmul TFLOP/s",
                                                   "of catalog peak", "copy GB/s", "H2D GB/s", "D2H GB/s"], dev_rows)]
    if profile.collectives:
        rows = []
        for c in profile.collectives:
            top = max(c.points, key=lambda p: p.size_bytes)
            rows.append([c.op, c.backend, c.group_size, c.scope, "-".join(dict.fromkeys(c.nodes)),
                         c.fit.alpha_s * 1e6 if c.fit else None, c.fit.bandwidth_GBps if c.fit else None,
                         c.fit.max_rel_error if c.fit else None, top.size_bytes / 2**20, top.algbw_GBps, top.busbw_GBps])
        tables.append(Table("collectives (fit t = alpha + S / bandwidth, S as nccl-tests counts it)",
                            ["op", "backend", "ranks", "scope", "nodes", "alpha us", "fit GB/s", "fit max err",
                             "largest MiB", "algbw GB/s", "busbw GB/s"], rows))
    for t in profile.layers:
        rows = [[c.part, c.micro_batch, c.seq_len, c.forward_s * 1e3, c.backward_s * 1e3,
                 c.activation_bytes / 2**20, c.forward_spread, c.backward_spread] for c in t.costs]
        calls = (f"; pipeline runtime per stage call: forward {t.stage_call_forward_s * 1e3:.3g} ms, backward "
                 f"{t.stage_call_backward_s * 1e3:.3g} ms")
        tables.append(Table(f"layers of {t.model} ({t.dtype}, {t.clock} clock{calls})", ["part", "micro-batch", "seq", "forward ms",
                                                                 "backward ms", "activations MiB", "fwd spread",
                                                                 "bwd spread"], rows))
    if profile.emulated:
        tables.append(Table("emulated device types (a measured type slowed down; runs sleep (factor - 1) x each op)",
                            ["type", "emulated on", "slowdown"],
                            [[e.name, e.base, e.slowdown] for e in profile.emulated]))
    if profile.validation:
        rows = [[v.layers, v.micro_batch, v.seq_len, v.predicted_s * 1e3, v.measured_s * 1e3,
                 f"{v.rel_error:+.1%}", v.table_predicted_s * 1e3 if v.table_predicted_s is not None else None]
                for v in profile.validation]
        tables.append(Table("self-check: stacks of layers, forward+backward (per-layer cost x k vs end to end)",
                            ["layers", "micro-batch", "seq", "predicted ms", "measured ms", "error",
                             "from table ms"], rows))
    return tables
