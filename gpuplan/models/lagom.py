"""Lagom: co-tune NCCL's communication parameters for overlapped computation and communication.

A problem is one training iteration: computation segments in order, and the communication ops that
overlap them (or none: exposed). Each op has a collective, a size, a group (ranks, nodes, link
type). A plan gives every op a setting theta = (algorithm, protocol, channels, threads, chunk).
The iteration time is the sum of overlapped windows (lagom_cost.window_time_us), each bounded by
its compute lane or its communication lane; the bounding lanes form the critical path.

Write a workload out (segments + ops), let `from_model` build one from a catalog transformer and a
DP x TP layout, or `from_poseidon` from one stage of a Poseidon plan (lagom_poseidon). With
`profile: FILE` (or `--profile`) the groups' bandwidth caps and latencies come from its measured
collectives.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, model_validator

from gpuplan.models import lagom_cost as cost
from gpuplan.models import nccl_tuning
from gpuplan.models.base import Problem, Schema, Violation, field_path
from gpuplan.models.catalog import canonical_name, catalog_entry
from gpuplan.models.lagom_cost import Consts
from gpuplan.models.plan import Plan, Status, figure_violations, stated_figures_violations
from gpuplan.models.workload import DTYPE_BYTES, model_config
from gpuplan.units import GBps, Bytes, Seconds

# SM count, L2 bytes, architecture, per GPU type (vendor datasheets); the rest comes from the catalog.
GPU_EXTRA: dict[str, tuple[int, float, str]] = {
    "V100": (80, 6 * 2**20, "volta"), "V100-32GB": (80, 6 * 2**20, "volta"), "T4": (40, 4 * 2**20, "turing"),
    "A10": (72, 6 * 2**20, "ampere"), "A100-40GB": (108, 40 * 2**20, "ampere"),
    "A100-80GB": (108, 40 * 2**20, "ampere"), "L4": (58, 48 * 2**20, "ada"), "L40S": (142, 96 * 2**20, "ada"),
    "RTX4090": (128, 72 * 2**20, "ada"), "H100": (132, 50 * 2**20, "hopper"),
    "H100-PCIe": (114, 50 * 2**20, "hopper"), "H200": (132, 50 * 2**20, "hopper"),
}


class Hardware(Schema):
    """The GPU every rank runs on: a catalog name, with any figure overridden."""

    gpu: str = "H100"
    sms: int | None = Field(default=None, gt=0)
    l2_bytes: Bytes | None = Field(default=None, gt=0)
    memory_bandwidth_GBps: GBps | None = Field(default=None, gt=0)
    intra_node_GBps: GBps | None = Field(default=None, gt=0)
    arch: Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell"] | None = None

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
        """Return the GPU architecture name (volta ... blackwell)."""
        return self.arch or GPU_EXTRA.get(canonical_name(self.gpu) or "", (0, 0, "ampere"))[2]


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
    nics: int = Field(default=1, ge=1, le=64, description="NICs (rails) per node, each of inter_GBps")
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
    nics: int = Field(default=1, ge=1, le=64, description="NICs (rails) per node, each of inter_GBps")
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
            return _apply_profile(data, info.context or {})
        if isinstance(data, dict) and "from_poseidon" in data:
            return _expand_poseidon(data, (info.context or {}).get("base_dir"))
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
        return {**data, **workload_from_model(fm, hw)}

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
    def compiled(self) -> "Compiled":
        """Return the links, devices and windows the cost model works on."""
        return Compiled.build(self)

    def __hash__(self) -> int:
        return id(self)


def _apply_profile(data: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Return the document of `data` (minus `profile: FILE`) with the profile's measured collectives applied."""
    from pathlib import Path

    from gpuplan.errors import InputError
    from gpuplan.models.lagom_view import with_profile
    from gpuplan.models.profile import load_profile

    data = dict(data)
    path = Path(str(data.pop("profile")))
    base = context.get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    try:
        profile = load_profile(path)
    except InputError as exc:
        raise ValueError(f"at profile: a profile file written by `gpuplan profile` ({exc})") from None
    problem = LagomProblem.model_validate(data, context=context)
    return with_profile(problem, profile).document()


def _expand_poseidon(data: dict[str, Any], base_dir: Any) -> dict[str, Any]:
    """Return `data` with `from_poseidon: {plan: FILE or mapping, stage: k}` replaced by its workload."""
    from pathlib import Path

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
        path = Path(plan) if Path(plan).is_absolute() or base_dir is None else Path(base_dir) / plan
        try:
            plan = read_document(path.with_suffix(".json") if not path.suffix else path)
        except InputError as exc:
            raise ValueError(f"at from_poseidon.plan: a readable Poseidon plan file ({exc})") from None
    fields = workload_from_poseidon(plan, spec.get("stage"))
    hardware = data.pop("hardware", None)
    return {**fields, **data, **({"hardware": hardware} if hardware else {})}


def workload_from_model(fm: FromModel, hw: Hardware) -> dict[str, Any]:
    """Return groups, segments and ops of one iteration of `fm` on `hw` (times in s, sizes in bytes).

    Per layer: forward and backward (2x) segments at mfu x peak / tp; with tp > 1 two exposed
    all-reduces of b*s*h activations per layer and pass; data parallelism reduces each layer's
    gradients during the next layer's backward (reduce_scatter with fsdp, which also all-gathers the
    next layer's weights during the current forward); the first layer's are exposed.
    """
    cfg = model_config(fm.model)
    width = DTYPE_BYTES.get(fm.dtype, 2)
    rate = hw.peak_tflops(fm.dtype) * 1e12 * fm.mfu
    L = cfg.num_layers
    fwd_s = cfg.layer_forward_flops(fm.micro_batch, fm.seq_len) / fm.tp / rate
    segments = [{"name": f"fwd{i}", "compute_s": fwd_s, "memory_bound": fm.memory_bound} for i in range(L)]
    segments += [{"name": f"bwd{i}", "compute_s": 2 * fwd_s, "memory_bound": fm.memory_bound}
                 for i in reversed(range(L))]
    groups: dict[str, Any] = {}
    ops: list[dict[str, Any]] = []
    if fm.tp > 1:
        groups["tp"] = {"ranks": fm.tp, "nodes": 1, "intra": fm.intra, "nvls": fm.nvls}
        act = fm.micro_batch * fm.seq_len * cfg.hidden * width
        for i in range(L):
            ops += [{"name": f"tp-fwd{i}-{part}", "collective": "all_reduce", "size_bytes": act, "group": "tp"}
                    for part in ("attn", "mlp")]
        for i in reversed(range(L)):
            ops += [{"name": f"tp-bwd{i}-{part}", "collective": "all_reduce", "size_bytes": act, "group": "tp"}
                    for part in ("mlp", "attn")]
    if fm.dp > 1:
        dp_ppn = max(1, min(fm.dp, fm.gpus_per_node // fm.tp))
        while fm.dp % dp_ppn:
            dp_ppn -= 1
        dp_nodes = fm.dp // dp_ppn
        groups["dp"] = {"ranks": fm.dp, "nodes": dp_nodes, "intra": fm.intra, "nvls": fm.nvls}
        if dp_nodes > 1:
            if fm.inter_GBps is None:
                raise ValueError(f"at from_model.inter_GBps: the network bandwidth per rank; the data-parallel "
                                 f"group spans {dp_nodes} nodes")
            groups["dp"]["inter_GBps"] = fm.inter_GBps
            groups["dp"]["nics"] = fm.nics
        grads = cfg.layer_params() / fm.tp * width
        if fm.fsdp:
            ops += [{"name": f"ag{i}", "collective": "all_gather", "size_bytes": grads, "group": "dp",
                     "overlaps": f"fwd{i - 1}" if i else None} for i in range(L)]
        coll = "reduce_scatter" if fm.fsdp else "all_reduce"
        ops += [{"name": f"grad{i}", "collective": coll, "size_bytes": grads, "group": "dp",
                 "overlaps": f"bwd{i - 1}" if i else None} for i in reversed(range(L))]
    return {"name": f"{cfg.name} dp={fm.dp} tp={fm.tp}", "groups": groups, "segments": segments, "ops": ops}


# ---- compiled instance and evaluation ------------------------------------------------------------

@dataclass(frozen=True)
class Theta:
    """One op's communication parameters: algorithm, protocol, channels, threads per CTA, chunk bytes."""

    algo: str
    proto: str
    channels: int
    threads: int
    chunk_bytes: int


@dataclass(frozen=True)
class Window:
    """A compute segment (or none, for an exposed op) and the indices of the ops under it."""

    name: str
    compute_us: float
    memory_bound: float
    ops: tuple[int, ...]


@dataclass(frozen=True)
class Compiled:
    """The problem as the cost model sees it: per-op links, windows, device, constants."""

    ops: tuple[CommOp, ...]
    links: tuple[cost.Link, ...]
    windows: tuple[Window, ...]
    window_of: tuple[int, ...]
    device: cost.Device
    consts: Consts

    @classmethod
    def build(cls, p: LagomProblem) -> "Compiled":
        """Return the compiled form of problem `p`."""
        links = {g: grp.link(p.hardware) for g, grp in p.groups.items()}
        windows: list[Window] = []
        window_of = [0] * len(p.ops)
        for seg in p.segments:
            idx = tuple(i for i, o in enumerate(p.ops) if o.overlaps == seg.name)
            for i in idx:
                window_of[i] = len(windows)
            windows.append(Window(seg.name, seg.compute_s * 1e6, seg.memory_bound, idx))
        for i, o in enumerate(p.ops):
            if o.overlaps is None:
                window_of[i] = len(windows)
                windows.append(Window(o.name, 0.0, 0.0, (i,)))
        return cls(tuple(p.ops), tuple(links[o.group] for o in p.ops), tuple(windows), tuple(window_of),
                   p.hardware.device(), p.constants)

    def comm_us(self, i: int, t: Theta, channels: Any = None, threads: Any = None, chunk: Any = None) -> Any:
        """Return op i's communication time alone (us) under t (arrays may replace NC, NT, C)."""
        o = self.ops[i]
        return cost.comm_time_us(o.collective, o.size_bytes, t.algo, t.proto, self.links[i], self.consts,
                                 t.channels if channels is None else channels,
                                 t.threads if threads is None else threads,
                                 t.chunk_bytes if chunk is None else chunk)

    def slowdown(self, i: int, t: Theta, channels: Any = None, threads: Any = None, chunk: Any = None) -> Any:
        """Return the slowdown op i inflicts on the computation of its window under t."""
        o, w = self.ops[i], self.windows[self.window_of[i]]
        return cost.slowdown(o.collective, o.size_bytes, t.algo, t.proto, self.links[i], self.consts, self.device,
                             w.memory_bound, t.channels if channels is None else channels,
                             t.threads if threads is None else threads,
                             t.chunk_bytes if chunk is None else chunk)

    def window_us(self, w: int, settings: list[Theta], override: tuple[int, Theta] | None = None,
                  arrays: tuple[Any, Any, Any] | None = None) -> Any:
        """Return window w's time (us) under `settings`; `override` replaces one op's theta, and
        `arrays` (NC, NT, C) broadcast over that op's resource parameters (for vectorized search)."""
        win = self.windows[w]
        stretch = 1 + self.consts.psi if win.compute_us > 0 else 1.0
        comm, progress = 0.0, 0.0
        for i in win.ops:
            t = override[1] if override and override[0] == i else settings[i]
            a = arrays if (override and override[0] == i and arrays) else (None, None, None)
            d = self.comm_us(i, t, *a) * stretch * self.ops[i].count
            comm = comm + d
            progress = progress + d / self.slowdown(i, t, *a)
        return cost.window_time_us(win.compute_us, comm, progress)

    def iteration_us(self, settings: list[Theta]) -> float:
        """Return the iteration time (us): the sum of every window's time."""
        return float(sum(self.window_us(w, settings) for w in range(len(self.windows))))

    def valid(self, i: int, t: Theta) -> list[str]:
        """Return the NCCL rules theta breaks for op i ([] when valid)."""
        o = self.ops[i]
        return cost.setting_problems(o.collective, self.links[i], t.algo, t.proto, t.channels, t.threads,
                                     t.chunk_bytes)

    def nccl_default(self, i: int) -> Theta:
        """Return NCCL's default setting for op i (its analytic model, communication time alone)."""
        o = self.ops[i]
        return Theta(*cost.nccl_default(o.collective, o.size_bytes, self.links[i], self.consts))


# ---- the plan ------------------------------------------------------------------------------------

class OpSetting(BaseModel):
    """theta for one op."""

    op: str
    algo: str
    proto: str
    channels: int
    threads: int
    chunk_bytes: int

    def theta(self) -> Theta:
        """Return the setting as a Theta."""
        return Theta(self.algo, self.proto, self.channels, self.threads, self.chunk_bytes)


class WindowTiming(BaseModel):
    """One window's predicted figures (seconds) and which lane bounds it."""

    name: str
    start_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    time_s: float = 0.0
    bound: Literal["compute", "comm", "exposed", "idle"] = "compute"
    ops: list[str] = Field(default_factory=list)


class LagomPlan(Plan):
    """Per-op settings, predicted windows, the emitted env vars and per-group Options."""

    kind: str = "lagom"
    settings: list[OpSetting] = Field(default_factory=list)
    baselines: dict[str, list[OpSetting]] = Field(default_factory=dict)
    iteration_s: float = 0.0
    windows: list[WindowTiming] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    group_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def thetas(self, baseline: str | None = None) -> list[Theta]:
        """Return the settings (or a baseline's) as Thetas, in op order."""
        return [s.theta() for s in (self.baselines[baseline] if baseline else self.settings)]


def timeline(problem: LagomProblem, settings: list[Theta]) -> list[WindowTiming]:
    """Return each window's start, compute time (slowed), communication time and bounding lane (s)."""
    comp = problem.compiled
    out, t0 = [], 0.0
    for w, win in enumerate(comp.windows):
        total = float(comp.window_us(w, settings))
        stretch = 1 + comp.consts.psi if win.compute_us > 0 else 1.0
        comm = sum(float(comp.comm_us(i, settings[i])) * stretch * comp.ops[i].count for i in win.ops)
        progress = sum(float(comp.comm_us(i, settings[i])) * stretch * comp.ops[i].count
                       / float(comp.slowdown(i, settings[i])) for i in win.ops)
        compute = (comm + win.compute_us - progress) if win.compute_us > progress else \
            win.compute_us * (comm / progress if progress else 1.0)
        bound = "exposed" if win.compute_us == 0 and win.ops else (
            "idle" if not win.ops else ("comm" if comm >= total - 1e-9 and comm > compute else "compute"))
        out.append(WindowTiming(name=win.name, start_s=t0 * 1e-6, compute_s=compute * 1e-6, comm_s=comm * 1e-6,
                                time_s=total * 1e-6, bound=bound, ops=[comp.ops[i].name for i in win.ops]))
        t0 += total
    return out


def make_plan(problem: LagomProblem, settings: list[Theta], **fields: Any) -> LagomPlan:
    """Return a LagomPlan for `settings`: predicted windows and iteration time, env and Options."""
    from gpuplan.models.lagom_emit import emit

    comp = problem.compiled
    it = comp.iteration_us(settings)
    env, options, notes = emit(problem, settings)
    predicted = {"iteration_s": it * 1e-6,
                 "compute_alone_s": sum(w.compute_us for w in comp.windows) * 1e-6}
    for name, base in fields.get("baselines", {}).items():
        predicted[f"iteration_s_{name.replace('-', '_')}"] = comp.iteration_us([s.theta() for s in base]) * 1e-6
    fields.setdefault("status", Status.FEASIBLE)
    return LagomPlan(objective=it * 1e-6, objective_name="iteration time (s)", predicted=predicted,
                     settings=[OpSetting(op=o.name, **vars(t)) for o, t in zip(comp.ops, settings)],
                     iteration_s=it * 1e-6, windows=timeline(problem, settings), env=env,
                     group_options=options, notes=notes + fields.pop("notes", []), **fields)


# ---- check ---------------------------------------------------------------------------------------

def check(problem: LagomProblem, plan: LagomPlan) -> list[Violation]:
    """Return the plan's violations: missing/unknown ops, NCCL's parameter rules, a wrong iteration time,
    env vars that disagree with NCCL's ranges."""
    from gpuplan.models.lagom_emit import env_problems

    comp = problem.compiled
    out: list[Violation] = []
    by_name = {s.op: s for s in plan.settings}
    names = [o.name for o in comp.ops]
    for n in names:
        if n not in by_name:
            out.append(Violation("missing_op", f"op {n!r} has no setting", {"op": n}))
    for n in by_name:
        if n not in names:
            out.append(Violation("unknown_op", f"setting for unknown op {n!r}", {"op": n}))
    if len(plan.settings) != len(by_name):
        out.append(Violation("duplicate_op", "an op has more than one setting"))
    if out:
        return out
    thetas = [by_name[n].theta() for n in names]
    for i, t in enumerate(thetas):
        for why in comp.valid(i, t):
            out.append(Violation("nccl_rule", f"op {names[i]!r}: {why}", {"op": names[i], **vars(t)}))
    if out:
        return out
    it = comp.iteration_us(thetas) * 1e-6
    if not math.isclose(it, plan.iteration_s, rel_tol=1e-6) or (
            plan.objective is not None and not math.isclose(it, plan.objective, rel_tol=1e-6)):
        out.append(Violation("iteration_time", f"the plan says {plan.iteration_s:.6g} s per iteration; "
                             f"the model gives {it:.6g} s", {"plan_s": plan.iteration_s, "model_s": it}))
    env_wrong = env_problems(plan.env, plan.group_options)
    for why in env_wrong:
        out.append(Violation("env", why))
    if not env_wrong:
        out += _check_emitted(problem, plan, thetas)
    return out + _check_figures(problem, plan, thetas, it)


def _check_emitted(problem: LagomProblem, plan: LagomPlan, thetas: list[Theta]) -> list[Violation]:
    """Return `env` violations where the plan's env vars or per-group Options differ from what its
    settings emit (the runtime launches with them, so they must say what the settings say)."""
    from gpuplan.models.lagom_emit import emit

    env, options, _ = emit(problem, thetas)
    out = []
    for key in sorted(set(env) | set(plan.env)):
        if plan.env.get(key) != env.get(key):
            out.append(Violation("env", f"env {key}={plan.env.get(key)!r}; the settings emit {env.get(key)!r}",
                                 {"var": key}))
    if plan.group_options != options:
        out.append(Violation("env", "the per-group Options differ from what the settings emit",
                             {"stated": plan.group_options, "emitted": options}))
    return out


def _check_figures(problem: LagomProblem, plan: LagomPlan, thetas: list[Theta], it: float
                   ) -> list[Violation]:
    """Return violations of the figures the plan states besides `iteration_s`: the objective and the
    predicted iteration time, compute-alone time and baseline iteration times (s), and every
    window's start, compute, communication and total time (s), bound and ops, recomputed; `it` is the
    model's iteration time (s) under `thetas`."""
    comp = problem.compiled
    predicted = {"iteration_s": it, "compute_alone_s": sum(w.compute_us for w in comp.windows) * 1e-6}
    out: list[Violation] = []
    names = [o.name for o in comp.ops]
    for name, base in plan.baselines.items():
        if [s.op for s in base] != names:
            out.append(Violation("baseline", f"baseline {name!r} does not set every op once, in op order",
                                 {"baseline": name}))
            continue
        broken = [f"op {names[i]!r}: {why}" for i, s in enumerate(base) for why in comp.valid(i, s.theta())]
        if broken:
            out.append(Violation("baseline", f"baseline {name!r} breaks NCCL's parameter rules: {broken[0]}",
                                 {"baseline": name, "rules": broken}))
            continue
        predicted[f"iteration_s_{name.replace('-', '_')}"] = comp.iteration_us([s.theta() for s in base]) * 1e-6
    for key in plan.predicted:
        if key.startswith("iteration_s_") and key not in predicted:
            out.append(Violation("figure", f"the plan states predicted.{key} but holds no such baseline",
                                 {"field": f"predicted.{key}"}))
    # the `iteration_time` violation above already covers a wrong objective
    out += stated_figures_violations(plan, None, predicted)
    if plan.objective is None and plan.solver is not None:
        out += figure_violations("objective", plan.objective, it)
    windows = timeline(problem, thetas)
    if len(plan.windows) != len(windows):
        return out + [Violation("figure", f"the plan states {len(plan.windows)} windows; the model has "
                                f"{len(windows)}", {"field": "windows"})]
    for w, (stated, model) in enumerate(zip(plan.windows, windows)):
        if (stated.name, stated.bound, stated.ops) != (model.name, model.bound, model.ops):
            out.append(Violation("figure", f"window {w} is stated as {stated.name!r} ({stated.bound}-bound, ops "
                                 f"{stated.ops}); the model has {model.name!r} ({model.bound}-bound, ops "
                                 f"{model.ops})", {"field": f"windows[{w}]"}))
        for f in ("start_s", "compute_s", "comm_s", "time_s"):
            out += figure_violations(f"windows[{w}].{f}", getattr(stated, f), getattr(model, f))
    return out


def _register() -> None:
    from gpuplan.models.lagom_view import describe, draw, summarize, with_profile
    from gpuplan.registry import ModelSpec, register_model

    register_model(ModelSpec("lagom", LagomProblem, LagomPlan, check, summarize=summarize, describe=describe,
                             draw=draw, runner="gpuplan.runtime.lagom:run", with_profile=with_profile,
                             title="Lagom: co-tuned communication parameters for overlapped training"))


_register()
