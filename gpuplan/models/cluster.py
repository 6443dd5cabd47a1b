"""Clusters: device types (catalog or measured), nodes holding devices, and the links between them.

A cluster is written in one of four ways in a problem file:

    cluster: {gpus: {V100: 36, P100: 36}, gpus_per_node: 4}        # capacities, nodes filled in
    cluster: {nodes: [{name: a, gpus: {A100-80GB: 8}}, ...],      # explicit nodes
              inter_node: {bandwidth_GBps: "200 Gbps", latency_s: 5us}}
    cluster: {preset: dgx-a100x4}                                  # a named cluster
    cluster: {profile: measured.json}                              # from `gpuplan profile`
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gpuplan.models.base import Schema, document_path
from gpuplan.models.catalog import canonical_name, catalog_entry, catalog_names
from gpuplan.models.workload import DTYPE_BYTES
from gpuplan.units import GBps, Bytes, Seconds, TFLOPS


class DeviceType(Schema):
    """One GPU (or CPU) type: memory (bytes), memory bandwidth (GB/s), dense peak per dtype (TFLOP/s)."""

    name: str
    memory_bytes: Bytes = Field(gt=0)
    memory_bandwidth_GBps: GBps = Field(gt=0)
    peak_tflops: dict[str, TFLOPS]
    intra_node_GBps: GBps = Field(default=16.0, gt=0)
    price_per_hour: float | None = Field(default=None, ge=0)
    measured: bool = False
    arch: str = "unknown"
    nvlinks: int = Field(default=0, ge=0)

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("at least one dtype with its dense peak, e.g. {bf16: 312}")
        for dtype, tf in v.items():
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"dtypes among {', '.join(DTYPE_BYTES)} (a peak under another name is never "
                                 f"read), not {dtype!r}")
            if tf <= 0:
                raise ValueError(f"a positive TFLOP/s for dtype {dtype!r}, not {tf}")
        return v

    def peak(self, dtype: str = "bf16") -> float:
        """Return the dense peak in TFLOP/s for `dtype`.

        A dtype the type does not list runs at its fp32 rate (no tensor cores for it); a type that
        lists neither raises ValueError naming both.
        """
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype]
        if "fp32" in self.peak_tflops:
            return self.peak_tflops["fp32"]
        wanted = "fp32" if dtype == "fp32" else f"{dtype} or fp32"
        raise ValueError(f"device type {self.name!r} lists no {wanted} peak "
                         f"(has {sorted(self.peak_tflops)}): add one under peak_tflops")


def device_type(name: str, overrides: dict[str, DeviceType] | None = None) -> DeviceType:
    """Return the DeviceType called `name`: from `overrides` first, then the catalog.

    Raises ValueError listing the known names when there is no such type.
    """
    if overrides and name in overrides:
        return overrides[name]
    key = canonical_name(name)
    if key is None:
        known = ", ".join(catalog_names() + sorted(overrides or {}))
        raise ValueError(f"a GPU type from the catalog ({known}) or one declared under device_types, "
                         f"not {name!r}")
    return _catalog_device_type(key)


@lru_cache(maxsize=None)
def _catalog_device_type(key: str) -> DeviceType:
    """Return the catalog's DeviceType for a canonical catalog name, validated once per name (the
    catalog is fixed and DeviceType is frozen, so every cluster can share it; the layout searches ask
    for a device's type tens of thousands of times)."""
    return DeviceType.model_validate(catalog_entry(key))


class Link(Schema):
    """A link: bandwidth per direction (GB/s) and latency (s).

    For the cluster's `inter_node` network, `bandwidth_GBps` is one NIC's and `nics_per_node` the
    number of NICs (rails) each node has on it; a node may override its count (`Node.nics`).
    """

    bandwidth_GBps: GBps = Field(gt=0)
    latency_s: Seconds = Field(default=5e-6, ge=0)
    nics_per_node: int = Field(default=1, ge=1, le=128)

    def transfer_s(self, size_bytes: float) -> float:
        """Return the time in seconds to move `size_bytes` over this link (alpha + size/beta)."""
        return self.latency_s + size_bytes / (self.bandwidth_GBps * 1e9)


class Node(Schema):
    """A machine: how many GPUs of each type it holds, and its intra-node link (default: the type's)."""

    name: str
    gpus: dict[str, int]
    intra_link: Link | None = None
    nics: int | None = Field(default=None, ge=1, le=128)

    @field_validator("gpus")
    @classmethod
    def _counts(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("at least one GPU type with a count, e.g. {A100-80GB: 8}")
        for t, c in v.items():
            if c < 0:
                raise ValueError(f"a non-negative GPU count for {t!r}, not {c}")
        return v


class NodePairLink(Schema):
    """An explicit link between two nodes (overrides `inter_node` for that pair)."""

    a: str
    b: str
    bandwidth_GBps: GBps = Field(gt=0)
    latency_s: Seconds = Field(default=5e-6, ge=0)


@dataclass(frozen=True)
class Device:
    """One physical device of a cluster: global id, node, index within the node, type name."""

    id: int
    node: str
    local_index: int
    type: str


PRESETS: dict[str, dict[str, Any]] = {
    # DGX A100: eight ConnectX-6 200 Gb/s compute NICs per node (DGX A100 user guide).
    "dgx-a100x4": {"nodes": [{"name": f"dgx{i}", "gpus": {"A100-80GB": 8}} for i in range(4)],
                   "inter_node": {"bandwidth_GBps": "200 Gbps", "latency_s": "5 us", "nics_per_node": 8}},
    # DGX H100: eight ConnectX-7 400 Gb/s compute NICs per node (DGX H100 user guide).
    "dgx-h100x2": {"nodes": [{"name": f"h{i}", "gpus": {"H100": 8}} for i in range(2)],
                   "inter_node": {"bandwidth_GBps": "400 Gbps", "latency_s": "5 us", "nics_per_node": 8}},
    # DGX B200: eight ConnectX-7 400 Gb/s compute NICs per node (DGX B200 datasheet).
    "dgx-b200x2": {"nodes": [{"name": f"b{i}", "gpus": {"B200": 8}} for i in range(2)],
                   "inter_node": {"bandwidth_GBps": "400 Gbps", "latency_s": "5 us", "nics_per_node": 8}},
    # GB200 NVL72 racks: each one NVLink domain of 72 GPUs (18 compute trays of 4, NVLink 5 switches between all of
    # them, as NCCL's multi-node NVLink sees it: one node), one ConnectX-7 400 Gb/s NIC per GPU (four per
    # tray; GB200 NVL72 specifications).
    "gb200-nvl72x2": {"nodes": [{"name": f"nvl72-{i}", "gpus": {"GB200": 72}} for i in range(2)],
                    "inter_node": {"bandwidth_GBps": "400 Gbps", "latency_s": "5 us", "nics_per_node": 72}},
    "gavel-36": {"gpus": {"V100": 36, "P100": 36, "K80": 36}, "gpus_per_node": 4},
    "mixed-a100-v100-t4": {"nodes": [{"name": "a0", "gpus": {"A100-80GB": 8}},
                                     {"name": "v0", "gpus": {"V100": 8}},
                                     {"name": "t0", "gpus": {"T4": 8}}],
                           "inter_node": {"bandwidth_GBps": "100 Gbps", "latency_s": "10 us"}},
}


class Cluster(Schema):
    """Nodes of devices and the links between them; device types from the catalog or declared."""

    name: str | None = None
    device_types: dict[str, DeviceType] = Field(default_factory=dict)
    nodes: list[Node]
    inter_node: Link = Field(default_factory=lambda: Link(bandwidth_GBps=12.5, latency_s=1e-5))
    links: list[NodePairLink] = Field(default_factory=list)
    source: str = "catalog"

    @model_validator(mode="before")
    @classmethod
    def _expand_short_forms(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, str):
            data = {"preset": data}
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "preset" in data:
            preset = data.pop("preset")
            if preset not in PRESETS:
                raise ValueError(f"a cluster preset ({', '.join(PRESETS)}), not {preset!r}")
            data = {**PRESETS[preset], "name": preset, **data}
        if "profile" in data:
            from gpuplan.models.profile import cluster_document_from_profile_file

            data = {**cluster_document_from_profile_file(document_path(data.pop("profile"), info)), **data}
        if "gpus" in data:
            gpus = data.pop("gpus")
            per_node = data.pop("gpus_per_node", 8)
            if not isinstance(gpus, dict):
                raise ValueError("'gpus' as a mapping of GPU type to count, e.g. {V100: 16}")
            if not isinstance(per_node, int) or per_node <= 0:
                raise ValueError(f"'gpus_per_node' as a positive integer, not {per_node!r}")
            nodes = []
            for t, count in gpus.items():
                if not isinstance(count, int) or count < 0:
                    raise ValueError(f"a non-negative integer count of {t!r} GPUs, not {count!r}")
                full, rest = divmod(count, per_node)
                sizes = [per_node] * full + ([rest] if rest else [])
                nodes += [{"name": f"{t}-{i}", "gpus": {t: s}} for i, s in enumerate(sizes)]
            data["nodes"] = nodes
        return data

    @model_validator(mode="after")
    def _known_types_and_names(self) -> "Cluster":
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"distinct node names, but {dup} repeat")
        for i, node in enumerate(self.nodes):
            for t in node.gpus:
                if t not in self.device_types and canonical_name(t) is None:
                    try:
                        device_type(t, self.device_types)
                    except ValueError as exc:
                        raise ValueError(f"at nodes[{i}].gpus.{t}: {exc}") from None
        for link in self.links:
            for end in (link.a, link.b):
                if end not in names:
                    raise ValueError(f"at links: links between declared nodes ({', '.join(names)}), not {end!r}")
        return self

    def type_of(self, name: str) -> DeviceType:
        """Return the DeviceType for a type name used in this cluster."""
        return device_type(name, self.device_types)

    def type_key(self, name: str) -> str:
        """Return the canonical spelling of a type name (catalog spelling, or as declared)."""
        if name in self.device_types:
            return name
        return canonical_name(name) or name

    @cached_property
    def devices(self) -> list[Device]:
        """Return every device, numbered 0..N-1 node by node."""
        out: list[Device] = []
        for node in self.nodes:
            local = 0
            for t, count in node.gpus.items():
                for _ in range(count):
                    out.append(Device(len(out), node.name, local, self.type_key(t)))
                    local += 1
        return out

    def capacity(self) -> dict[str, int]:
        """Return the number of devices of each type (canonical type names)."""
        cap: dict[str, int] = {}
        for d in self.devices:
            cap[d.type] = cap.get(d.type, 0) + 1
        return cap

    @cached_property
    def _nodes_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        """Return the node called `name` (KeyError when there is none)."""
        return self._nodes_by_name[name]

    def intra_link(self, node: str) -> Link:
        """Return the link between two devices of `node` (declared, or the slowest type's default)."""
        n = self.node(node)
        if n.intra_link is not None:
            return n.intra_link
        bw = min(self.type_of(t).intra_node_GBps for t in n.gpus)
        return Link(bandwidth_GBps=bw, latency_s=2e-6)

    def nics(self, node: str) -> int:
        """Return the number of NICs (rails) node `node` has on the inter-node network."""
        n = self.node(node)
        return n.nics if n.nics is not None else self.inter_node.nics_per_node

    def link(self, node_a: str, node_b: str) -> Link:
        """Return the link between nodes a and b (intra-node link when a == b)."""
        if node_a == node_b:
            return self.intra_link(node_a)
        for l in self.links:
            if {l.a, l.b} == {node_a, node_b}:
                return Link(bandwidth_GBps=l.bandwidth_GBps, latency_s=l.latency_s)
        return self.inter_node

    def __hash__(self) -> int:
        return id(self)
