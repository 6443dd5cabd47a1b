"""Lagom's input: the hardware, communicators, computation segments and communication ops of one training
iteration, the search grid, and the shorthand inputs that expand into them (`from_model`, `from_poseidon`,
`profile: FILE`)."""

from __future__ import annotations

import math
import re
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, model_validator

from gpuplan.models import nccl_tuning
from gpuplan.models.base import Problem, Schema, coerced_bool, document_path, field_path
from gpuplan.models.catalog import canonical_name, catalog_chip, catalog_entry, catalog_names
from gpuplan.models.lagom import cost
from gpuplan.models.lagom.compiled import Compiled
from gpuplan.models.lagom.cost import Consts
from gpuplan.models.lagom.workload import workload_from_model
from gpuplan.models.profile import bus_factor
from gpuplan.models.workload import model_config
from gpuplan.units import GBps, Bytes, Seconds

# SM count, L2 bytes, architecture, per catalog GPU type (the catalog's figures, `catalog_chip`).
GPU_EXTRA: dict[str, tuple[int, float, str]] = {
    name: (*catalog_chip(name), str(catalog_entry(name)["arch"])) for name in catalog_names()  # type: ignore[index]
}


class Hardware(Schema):
    """The GPU every rank runs on: a catalog name, with any figure overridden."""

    gpu: str = "H100"
    sms: int | None = Field(default=None, gt=0)
    l2_bytes: Bytes | None = Field(default=None, gt=0)
    memory_bandwidth_GBps: GBps | None = Field(default=None, gt=0)
    intra_node_GBps: GBps | None = Field(default=None, gt=0)
    arch: Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"] | None = None

    @model_validator(mode="after")
    def _known(self) -> "Hardware":
        key = canonical_name(self.gpu)
        if key is None and None in (self.sms, self.l2_bytes, self.memory_bandwidth_GBps, self.intra_node_GBps):
            raise ValueError(f"at gpu: a GPU type of the catalog ({', '.join(GPU_EXTRA)}), or sms, l2_bytes, "
                             f"memory_bandwidth_GBps and intra_node_GBps given, not {self.gpu!r}")
        return self

    def _entry(self) -> dict[str, Any]:
        key = canonical_name(self.gpu)
        return (catalog_entry(key) or {}) if key else {}

    def device(self) -> cost.Device:
        """Return SMs, HBM GB/s and L2 bytes (overrides first, then the catalog)."""
        extra = GPU_EXTRA.get(canonical_name(self.gpu) or "", (100, 40 * 2**20, "ampere"))
        bw = self.memory_bandwidth_GBps or float(self._entry().get("memory_bandwidth_GBps", 1000.0))
        return cost.Device(self.sms or extra[0], bw, self.l2_bytes or extra[1])

    def intra_GBps(self) -> float:
        """Return the per-GPU intra-node bandwidth (GB/s)."""
        return self.intra_node_GBps or float(self._entry().get("intra_node_GBps", 16.0))

    def peak_tflops(self, dtype: str) -> float:
        """Return the catalog's dense peak (TFLOP/s) for `dtype` (fp16, then the best, as fallback)."""
        peaks = self._entry().get("peak_tflops") or {}
        return float(peaks.get(dtype) or peaks.get("fp16") or max(peaks.values(), default=100.0))

    def architecture(self) -> str:
        """Return the GPU architecture name (kepler ... blackwell): the override, else the catalog's, else
        ampere for a GPU outside the catalog."""
        key = canonical_name(self.gpu) or ""
        return self.arch or (GPU_EXTRA[key][2] if key in GPU_EXTRA else str(self._entry().get("arch") or "ampere"))


class Group(Schema):
    """A communicator: ranks over nodes, the link inside a node, the network between nodes.

    By default the group is what NCCL 2.30.7's topology search makes of it on `hardware`
    (nccl_tuning): the GPU's architecture, its NVLinks (through NVSwitches from 12 links up) or PCIe,
    `nics` NICs per node of `inter_GBps` each (a ring across nodes runs on every rail), NVLS where
    NCCL has it (Hopper and later on NVSwitch; `nvls: false` turns it off). `intra_GBps` alone is a
    line rate (NVLink links x 25 GB/s); with `channels` too it is the achieved bus bandwidth over
    those channels (what a calibration writes). `cap_GBps` and `latency_scale` are what a profile fits.
    """

    ranks: int = Field(ge=2)
    nodes: int = Field(default=1, ge=1)
    intra: Literal["nvlink", "pcie"] = "nvlink"
    intra_GBps: GBps | None = Field(default=None, gt=0)
    inter_GBps: GBps | None = Field(default=None, gt=0)
    nics: int = Field(default=1, ge=1, le=128, description="NICs (rails) per node, each of inter_GBps")
    inter_latency_s: Seconds = Field(default=0.0, ge=0)
    channels: int | None = Field(default=None, ge=1, le=cost.MAX_CHANNELS)
    nvls: bool | None = None
    ll128: bool | None = None
    cap_GBps: GBps | None = Field(default=None, gt=0)
    latency_scale: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _shape(self) -> "Group":
        if self.ranks % self.nodes:
            raise ValueError(f"at nodes: a divisor of ranks={self.ranks}, not {self.nodes}")
        if self.nodes > 1 and self.inter_GBps is None:
            raise ValueError(f"at inter_GBps: one NIC's network bandwidth (e.g. '200 Gbps'; `nics` per node); "
                             f"the group spans {self.nodes} nodes")
        return self

    def topology(self, hw: Hardware) -> nccl_tuning.Topology:
        """Return the group as NCCL's search sees it on `hw` (architecture, NVLinks or PCIe, NICs)."""
        arch = hw.architecture()
        cc = nccl_tuning.COMPUTE_CAPABILITY.get(arch, 80)
        catalog_links = int(hw._entry().get("nvlinks", 0) or 0)
        declared = self.intra_GBps is not None or hw.intra_node_GBps is not None
        line = self.intra_GBps or hw.intra_GBps()
        if self.intra == "nvlink":
            per_link = 50 if cc >= 100 else 25          # NVLink line rate per link (GB/s per direction)
            nvlinks = catalog_links if catalog_links and not declared else max(1, round(line / per_link))
            pcie = nccl_tuning.PCIE_GBPS_BY_ARCH.get(arch, 24.0)
        else:
            nvlinks = 0
            pcie = (nccl_tuning.PCIE_GBPS_BY_ARCH.get(arch, 24.0) if catalog_links and not declared
                    else nccl_tuning.PCIE_NCCL_PER_LINE * line)
        return nccl_tuning.Topology(
            ranks=self.ranks, nodes=self.nodes, ppn_min=self.ranks // self.nodes, cc=cc, cc_max=cc,
            nvlinks=nvlinks, nvswitch=nvlinks >= nccl_tuning.NVSWITCH_MIN_NVLINKS, pcie_GBps=pcie, nics=self.nics,
            nic_GBps=float(self.inter_GBps or 12.5), latency_inter_us=self.inter_latency_s * 1e6,
            ll128=self.ll128, nvls_enable=self.nvls is not False)

    def link(self, hw: Hardware) -> cost.Link:
        """Return the cost model's view of this communicator on `hw`: NCCL's graphs (channels and
        per-channel bandwidth of the ring, NCCL's achieved NVLink rate, every rail across nodes), or
        the explicit `channels` x `intra_GBps` a calibration gave."""
        return cost.link_from_topology(self.topology(hw), hw.architecture(), channels=self.channels,
                                       bus_GBps=self.intra_GBps, cap_GBps=self.cap_GBps, nvls=self.nvls,
                                       ll128=self.ll128, latency_scale=self.latency_scale, intra=self.intra)


class Segment(Schema):
    """A computation segment: its time alone (s) and the share of it that is memory-bound."""

    name: str
    compute_s: Seconds = Field(ge=0)
    memory_bound: float = Field(default=0.2, ge=0, le=1)


class CommOp(Schema):
    """A communication op: collective, size (bytes), group, the segment it overlaps (None: exposed), and
    how many times it runs back to back there (e.g. one per layer)."""

    name: str
    collective: Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv"]
    size_bytes: Bytes = Field(gt=0)
    group: str
    overlaps: str | None = None
    count: int = Field(default=1, ge=1, description="back-to-back repetitions with the same setting")


class Grid(Schema):
    """The search space: channels 1..max_channels, threads 64..640 step 32, chunks powers of 2."""

    max_channels: int = Field(default=32, ge=1, le=cost.MAX_CHANNELS)
    thread_step: int = Field(default=32, ge=32, multiple_of=32)
    min_chunk_bytes: Bytes = Field(default=4096, ge=4096)
    max_chunk_bytes: Bytes = Field(default=4 * 2**20, le=64 * 2**20)

    @model_validator(mode="after")
    def _order(self) -> "Grid":
        if self.min_chunk_bytes > self.max_chunk_bytes:
            raise ValueError(f"at max_chunk_bytes: at least min_chunk_bytes={self.min_chunk_bytes:g}, "
                             f"not {self.max_chunk_bytes:g}")
        return self

    def channels(self) -> list[int]:
        """Return the channel counts searched."""
        return list(range(1, self.max_channels + 1))

    def threads(self) -> list[int]:
        """Return the thread counts searched (the valid ones per (algo, proto) are a subset)."""
        return list(range(64, 641, self.thread_step))

    def chunks(self) -> list[int]:
        """Return the chunk sizes searched (bytes, powers of two)."""
        lo = 2 ** math.ceil(math.log2(self.min_chunk_bytes))
        out = []
        while lo <= self.max_chunk_bytes:
            out.append(int(lo))
            lo *= 2
        return out

    def around(self, default: Any) -> dict[str, list[int]]:
        """Return the values searched for one op, by dimension (channels, threads, chunk_bytes): the grid's
        with the op's NCCL default (a Theta) added, so that every search covers the settings next to the
        default the others start from, however coarse the grid."""
        return {"channels": sorted({*self.channels(), default.channels}),
                "threads": sorted({*self.threads(), default.threads}),
                "chunk_bytes": sorted({*self.chunks(), default.chunk_bytes})}


class FromModel(Schema):
    """Build the workload from a catalog transformer and a DP x TP layout (one bucket per layer)."""

    model: str
    dp: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=8, ge=1)
    micro_batch: int = Field(default=1, ge=1)
    seq_len: int = Field(default=2048, ge=1)
    dtype: str = "bf16"
    mfu: float = Field(default=0.45, gt=0, le=1)
    memory_bound: float = Field(default=0.2, ge=0, le=1)
    fsdp: bool = False
    intra: Literal["nvlink", "pcie"] = "nvlink"
    inter_GBps: GBps | None = Field(default=None, gt=0)
    nics: int = Field(default=1, ge=1, le=128, description="NICs (rails) per node, each of inter_GBps")
    nvls: bool | None = None

    @model_validator(mode="after")
    def _fits(self) -> "FromModel":
        model_config(self.model)
        if self.tp > self.gpus_per_node:
            raise ValueError(f"at tp: at most gpus_per_node={self.gpus_per_node} (TP stays in a node), not {self.tp}")
        if self.dp * self.tp < 2:
            raise ValueError("at dp: dp x tp of at least 2 (one GPU has nothing to communicate)")
        return self


class LagomProblem(Problem):
    """One training iteration: segments, the ops overlapping them, groups, hardware, constants, grid."""

    kind: Literal["lagom"] = "lagom"
    hardware: Hardware = Field(default_factory=Hardware)
    groups: dict[str, Group]
    segments: list[Segment] = Field(default_factory=list)
    ops: list[CommOp]
    constants: Consts = Field(default_factory=Consts)
    grid: Grid = Field(default_factory=Grid)

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and "profile" in data:
            return _apply_profile(data, info)
        if isinstance(data, dict) and "from_poseidon" in data:
            return _expand_poseidon(data, info)
        if not isinstance(data, dict) or "from_model" not in data:
            return data
        data = dict(data)
        spec = data.pop("from_model")
        if "ops" in data or "segments" in data:
            raise ValueError("at from_model: either from_model or segments/ops, not both")
        try:
            fm = FromModel.model_validate(spec)
            hw = Hardware.model_validate(data.get("hardware", {}))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = "from_model" if exc.title == "FromModel" else "hardware"
            loc, msg = field_path(tuple(err["loc"])), err["msg"].removeprefix("Value error, ")
            nested = re.match(r"^at ([^:]+): (.*)$", msg, re.S)
            if nested:
                loc = nested.group(1) if loc == "(top level)" else f"{loc}.{nested.group(1)}"
                raise ValueError(f"at {where}.{loc}: {nested.group(2)}") from None
            raise ValueError(f"at {where}.{loc}: {msg} (got {err.get('input')!r})") from None
        except ValueError as exc:
            raise ValueError(f"at from_model.model: {exc}") from None
        for where, raw, model in (("from_model", spec, fm), ("hardware", data.get("hardware", {}), hw)):
            bad = coerced_bool(raw, model)
            if bad is not None:
                raise ValueError(f"at {where}.{field_path(bad)}: a number, not true or false")
        built = workload_from_model(fm, hw)
        if "groups" in data:
            raise ValueError("at groups: from_model builds the groups; give either from_model or groups, not both")
        return {**data, **built, "name": data.get("name", built["name"])}  # the document's own name is kept

    @model_validator(mode="after")
    def _references(self) -> "LagomProblem":
        seg_names = [s.name for s in self.segments]
        names = seg_names + [o.name for o in self.ops]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"at ops: distinct segment and op names, but {dup[:5]} repeat")
        if not self.ops:
            raise ValueError("at ops: at least one communication op")
        for i, op in enumerate(self.ops):
            if op.group not in self.groups:
                raise ValueError(f"at ops[{i}].group: one of the groups ({', '.join(self.groups)}), not {op.group!r}")
            if op.overlaps is not None and op.overlaps not in seg_names:
                raise ValueError(f"at ops[{i}].overlaps: a segment name or null, not {op.overlaps!r}")
        return self

    @cached_property
    def compiled(self) -> Compiled:
        """Return the links, devices and windows the cost model works on."""
        return Compiled.build(self)

    def __hash__(self) -> int:
        return id(self)


def _apply_profile(data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """Return the document of `data` (minus `profile: FILE`) with the profile's measured collectives applied."""
    from gpuplan.errors import InputError
    from gpuplan.models.profile import load_profile

    data = dict(data)
    path = document_path(str(data.pop("profile")), info)
    try:
        profile = load_profile(path)
    except InputError as exc:
        raise ValueError(f"at profile: a profile file written by `gpuplan profile` ({exc})") from None
    problem = LagomProblem.model_validate(data, context=info.context or {})
    return with_profile(problem, profile).document()


def _expand_poseidon(data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """Return `data` with `from_poseidon: {plan: FILE or mapping, stage: k}` replaced by its workload (a plan
    file's path is resolved against the validating document's folder)."""
    from gpuplan.errors import InputError
    from gpuplan.io import read_document
    from gpuplan.compose.lagom_poseidon import workload_from_poseidon

    data = dict(data)
    spec = data.pop("from_poseidon")
    if not isinstance(spec, dict) or "plan" not in spec or set(spec) - {"plan", "stage"}:
        raise ValueError("at from_poseidon: a mapping {plan: a Poseidon plan file, stage: optional index}")
    if "ops" in data or "segments" in data or "from_model" in data:
        raise ValueError("at from_poseidon: either from_poseidon, from_model or segments/ops")
    plan = spec["plan"]
    if isinstance(plan, str):
        path = document_path(plan, info)
        try:
            plan = read_document(path.with_suffix(".json") if not path.suffix else path)
        except InputError as exc:
            raise ValueError(f"at from_poseidon.plan: a readable Poseidon plan file ({exc})") from None
    fields = workload_from_poseidon(plan, spec.get("stage"))
    hardware = data.pop("hardware", None)
    return {**fields, **data, **({"hardware": hardware} if hardware else {})}


def with_profile(problem: LagomProblem, profile: Any) -> LagomProblem:
    """Return the problem with each group's bus-bandwidth cap and latency scale fitted from the profile's
    collective timings (a group with no matching measurement keeps the model's numbers)."""
    doc = problem.document()
    fitted = []
    for name, group in problem.groups.items():
        scope = "intra_node" if group.nodes == 1 else "inter_node"
        match = [c for c in profile.collectives if c.group_size == group.ranks and c.fit is not None
                 and c.scope == scope]
        match.sort(key=lambda c: c.op != "all_reduce")
        if not match:
            continue
        col = match[0]
        coll = col.op if col.op in cost.COLLECTIVES else "all_reduce"
        link = group.link(problem.hardware)
        base = cost.nccl_latency_us(coll, "ring", "Simple", link, problem.constants) / link.latency_scale
        doc["groups"][name]["cap_GBps"] = col.fit.bandwidth_GBps * bus_factor(col.op, group.ranks)
        doc["groups"][name]["latency_scale"] = max(1e-3, col.fit.alpha_s * 1e6 / base)
        fitted.append(f"{name} <- {col.op} x{col.group_size} ({col.backend})")
    if fitted:
        doc["constants"] = {**doc.get("constants", {}), "fitted_from": "profile: " + "; ".join(fitted)}
    return LagomProblem.model_validate(doc)
