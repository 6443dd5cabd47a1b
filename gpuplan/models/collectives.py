"""Collective time of NCCL's default choice over a group of a gpuplan Cluster: the one entry point
other models (Poseidon's data- and tensor-parallel all-reduces, Lagom's groups) call.

Contract:

    collective_time_s(cluster, op, size_bytes, device_ids, dtype_bytes=2) -> float seconds
    bus_bandwidth_GBps(cluster, op, size_bytes, device_ids, dtype_bytes=2) -> float GB/s

- `op`: all_reduce, all_gather, reduce_scatter, broadcast, reduce (NCCL's tuned collectives), or
  send_recv / all_to_all (point-to-point: latency + bytes over the slowest path).
- `size_bytes`: the buffer as nccl-tests counts it (all_reduce: the whole vector; all_gather: the
  gathered output; reduce_scatter: the input), in bytes; `dtype_bytes` the element width, used to
  round the size to whole elements (NCCL's model depends on bytes only).
- `device_ids`: global ids of `cluster.devices`; one device (or none) costs 0 s.
- GPUs of a known architecture get NCCL 2.30.7's own model (gpuplan.models.nccl_tuning): the
  graphs NCCL's search would build for the group (ranks, nodes spanned, ranks per node, NVLink or
  PCIe, NVSwitch, NICs per node and their bandwidth: a ring across nodes runs on every rail) and the
  (algorithm, protocol) NCCL picks at that size, with its latency and bandwidth, plus what NCCL's
  kernel pipeline adds to that estimate (nccl_tuning.pipeline_us: Simple's per-slice handshake on the
  ring, the NVLS stage fill, the broadcast / reduce chain fill); `nccl_estimate_s` is NCCL's estimate
  alone.
- Devices of an "unknown" architecture (measured or declared types, CPUs) fall back to an
  alpha-beta ring over the cluster's own links (slowest link crossed, its latency per step).
- `calibration`: a Profile's fitted collectives (`calibration_from_profile`), keyed by (op, group
  size, intra/inter node); when one matches it replaces the model (alpha + size / bandwidth).
- Results are cached per group shape (topology), so thousands of calls cost microseconds each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable

from gpuplan.models.lagom import cost
from gpuplan.models import nccl_tuning as nt
from gpuplan.models.profile import bus_factor

TUNED_OPS = nt.COLLECTIVES
P2P_OPS = ("send_recv", "all_to_all")
OPS = TUNED_OPS + P2P_OPS
_CACHE_LIMIT = 8192


@dataclass(frozen=True)
class Fit:
    """A measured alpha-beta fit of one collective: seconds = alpha_s + bytes / (GBps * 1e9)."""

    alpha_s: float
    bandwidth_GBps: float

    def time_s(self, size_bytes: float) -> float:
        """Return the fitted time in seconds for `size_bytes`."""
        return self.alpha_s + size_bytes / (self.bandwidth_GBps * 1e9)


Calibration = dict[tuple[str, int, str], Fit]


def calibration_from_profile(profile: Any) -> Calibration:
    """Return the profile's fitted collectives as {(op, group_size, 'intra_node' | 'inter_node'): Fit}.

    `profile` is a gpuplan Profile (its `collectives`, each with an alpha-beta `fit`); collectives
    without a fit are skipped.
    """
    out: Calibration = {}
    for c in getattr(profile, "collectives", []) or []:
        if c.fit is None:
            continue
        out[(c.op, int(c.group_size), c.scope)] = Fit(float(c.fit.alpha_s), float(c.fit.bandwidth_GBps))
    return out


@dataclass(frozen=True)
class Shape:
    """A group as the collective model sees it: NCCL's topology, or (for unknown devices) the slowest
    link's (GB/s, latency s) with the rank and node counts."""

    ranks: int
    nodes: int
    topology: nt.Topology | None
    link_GBps: float
    link_latency_s: float
    arch: str = "unknown"


_shapes: dict[tuple[int, tuple[int, ...]], tuple[Any, Shape]] = {}


def _nvswitch(nvlinks: int) -> bool:
    return nvlinks >= nt.NVSWITCH_MIN_NVLINKS


def group_shape(cluster: Any, device_ids: Iterable[int]) -> Shape:
    """Return the Shape of the group `device_ids` of `cluster` (cached per cluster object and ids).

    Raises ValueError naming the id when a device id is not in the cluster or repeats.
    """
    given = device_ids if isinstance(device_ids, tuple) else tuple(device_ids)
    hit = _shapes.get((id(cluster), given))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    ids = tuple(sorted(int(i) for i in given))
    hit = _shapes.get((id(cluster), ids))
    shape = hit[1] if hit is not None and hit[0] is cluster else _build_shape(cluster, ids)
    if len(_shapes) >= _CACHE_LIMIT:
        _shapes.clear()
    _shapes[(id(cluster), ids)] = _shapes[(id(cluster), given)] = (cluster, shape)
    return shape


def _build_shape(cluster: Any, ids: tuple[int, ...]) -> Shape:
    devices = cluster.devices
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"device_ids: distinct device ids, but {dup} repeat")
    for i in ids:
        if not 0 <= i < len(devices):
            raise ValueError(f"device_ids: ids of the cluster's devices (0..{len(devices) - 1}), not {i}")
    per_node: dict[str, int] = {}
    types: set[str] = set()
    for i in ids:
        d = devices[i]
        per_node[d.node] = per_node.get(d.node, 0) + 1
        types.add(d.type)
    n, N = len(ids), len(per_node)
    names = sorted(per_node)
    # the slowest link the group crosses (the fallback's ring, and the NIC bandwidth across nodes)
    net = _slowest_between(cluster, names) if N > 1 else None
    if net is not None:
        slow = net
    else:
        slow = cluster.intra_link(names[0]) if names else None
    if n <= 1 or slow is None:
        return Shape(n, N, None, math.inf, 0.0)
    if N > 1 and any(per_node[x] > 1 for x in names):
        intra_slow = min((cluster.intra_link(x) for x in names if per_node[x] > 1), key=lambda l: l.bandwidth_GBps)
        if intra_slow.bandwidth_GBps < slow.bandwidth_GBps:
            slow = type(slow)(bandwidth_GBps=intra_slow.bandwidth_GBps,
                              latency_s=max(slow.latency_s, intra_slow.latency_s))
    dts = [cluster.type_of(t) for t in types]
    archs = {getattr(dt, "arch", "unknown") for dt in dts}
    topo = None
    arch = "unknown"
    if "unknown" not in archs and all(a in nt.COMPUTE_CAPABILITY for a in archs) and not any(
            getattr(dt, "measured", False) for dt in dts):
        ccs = [nt.COMPUTE_CAPABILITY[a] for a in archs]
        arch = min(archs, key=lambda a: nt.COMPUTE_CAPABILITY[a])
        nvlinks = min(int(getattr(dt, "nvlinks", 0)) for dt in dts)
        # a node that declares its own intra link is taken as NCCL's PCIe class unless NVLink-fast
        pcie = min(_pcie_GBps(dt) for dt in dts)
        nics = min(usable_nics(cluster, x, per_node[x]) for x in names) if N > 1 else 1
        nic_GBps = net.bandwidth_GBps if net is not None else 12.5
        topo = nt.Topology(ranks=n, nodes=N, ppn_min=min(per_node.values()), cc=min(ccs), cc_max=max(ccs),
                           nvlinks=nvlinks, nvswitch=_nvswitch(nvlinks), pcie_GBps=pcie, nics=nics,
                           nic_GBps=float(nic_GBps))
    return Shape(n, N, topo, float(slow.bandwidth_GBps), float(slow.latency_s), arch)


def _slowest_between(cluster: Any, names: list[str]) -> Any:
    """Return the slowest link between two of the nodes `names` (the inter-node network when no pair
    has a link of its own: no quadratic scan on large clusters)."""
    explicit = getattr(cluster, "links", None) or []
    inside = set(names)
    pairs = [l for l in explicit if l.a in inside and l.b in inside and l.a != l.b]
    if not pairs:
        return cluster.inter_node
    links = [cluster.link(l.a, l.b) for l in pairs]
    covered = len({frozenset((l.a, l.b)) for l in pairs})
    if covered < len(names) * (len(names) - 1) // 2:
        links.append(cluster.inter_node)
    return min(links, key=lambda l: l.bandwidth_GBps)


def _pcie_GBps(dt: Any) -> float:
    """NCCL's PCIe bandwidth (GB/s) of one GPU of type `dt`: 0.75 x the PCIe line rate the catalog
    lists for a PCIe-only GPU (topo.cc kvDictPciGen), by architecture for NVLink GPUs."""
    if getattr(dt, "nvlinks", 0):
        return nt.PCIE_GBPS_BY_ARCH.get(getattr(dt, "arch", ""), 12.0)
    return nt.PCIE_NCCL_PER_LINE * float(dt.intra_node_GBps)


def usable_nics(cluster: Any, node: str, ranks_here: int) -> int:
    """Return the NICs of `node` a group with `ranks_here` GPUs there can drive: each GPU reaches the
    NICs on its own PCIe switch (node NICs / node GPUs of them, at least one), as NCCL's search prefers."""
    fn = getattr(cluster, "nics", None)
    nics = int(fn(node)) if fn else 1
    gpus = max(1, sum(cluster.node(node).gpus.values()))
    return max(1, min(nics, ranks_here * max(1, -(-nics // gpus))))


def _elements(size_bytes: float, dtype_bytes: int) -> float:
    if size_bytes < 0 or not math.isfinite(size_bytes):
        raise ValueError(f"size_bytes: a finite size >= 0, not {size_bytes!r}")
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes: a positive element width, not {dtype_bytes!r}")
    return math.ceil(size_bytes / dtype_bytes) * dtype_bytes


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op: one of {', '.join(OPS)}, not {op!r}")


def fallback_time_s(op: str, size_bytes: float, ranks: int, bandwidth_GBps: float, latency_s: float) -> float:
    """Return the alpha-beta ring time (s) of `op` over `ranks` ranks on a link of `bandwidth_GBps`
    (per direction) and `latency_s` per step: bus factor x bytes / bandwidth + steps x latency."""
    if ranks <= 1:
        return 0.0
    steps = {"all_reduce": 2 * (ranks - 1), "all_gather": ranks - 1, "reduce_scatter": ranks - 1,
             "all_to_all": ranks - 1, "send_recv": 1}.get(op, ranks - 1)
    factor = 1.0 if op == "send_recv" else bus_factor(op, ranks)
    return factor * size_bytes / (bandwidth_GBps * 1e9) + steps * latency_s


def _algos(algos: Iterable[str] | None) -> tuple[str, ...]:
    """NCCL_ALGO's restriction as nccl_tuning's algorithm names (None: all of them)."""
    if algos is None:
        return nt.ALGOS
    out = tuple(str(a).lower() for a in algos)
    bad = [a for a in out if a not in nt.ALGOS]
    if bad or not out:
        raise ValueError(f"algos: some of {', '.join(nt.ALGOS)} (as NCCL_ALGO), not {list(algos)!r}")
    return out


def _topology(shape: Shape, nccl_version: str | None) -> nt.Topology | None:
    """The group's NCCL topology, running `nccl_version` when one is given (nccl_tuning.Topology:
    it selects the one-node NVLS kernel's work split; None: NCCL 2.30.7's)."""
    t = shape.topology
    if t is None or nccl_version is None:
        return t
    return replace(t, nccl_version=nt.parse_version(nccl_version))


def nccl_choice(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int],
                dtype_bytes: int = 2, algos: Iterable[str] | None = None,
                nccl_version: str | None = None) -> nt.Choice | None:
    """Return NCCL's default (algorithm, protocol, time us, channels, threads) for `op` over the group,
    or None when the group falls back to alpha-beta (unknown devices, point-to-point ops, one rank).
    `algos` restricts the algorithms as NCCL_ALGO does."""
    _check_op(op)
    shape = group_shape(cluster, device_ids)
    if shape.topology is None or op not in TUNED_OPS or shape.ranks <= 1:
        return None
    return nt.choose(_topology(shape, nccl_version), op, float(_elements(size_bytes, dtype_bytes)),
                     algos=_algos(algos))


def collective_time_s(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int], dtype_bytes: int = 2,
                      calibration: Calibration | None = None, algos: Iterable[str] | None = None,
                      nccl_version: str | None = None) -> float:
    """Return the seconds of `op` on `size_bytes` over `device_ids` of `cluster` with NCCL's default
    choice (see the module docstring for the contract); 0 for one device. `algos` restricts the
    algorithms as NCCL_ALGO does (ValueError when none of them runs on the group); `nccl_version`
    (e.g. '2.18.5') the NCCL whose one-node NVLS kernel runs (default 2.30.7's)."""
    _check_op(op)
    shape = group_shape(cluster, device_ids)
    if shape.ranks <= 1:
        return 0.0
    size = _elements(size_bytes, dtype_bytes)
    if calibration:
        fit = calibration.get((op, shape.ranks, "inter_node" if shape.nodes > 1 else "intra_node"))
        if fit is not None:
            return fit.time_s(size)
    if shape.topology is None or op not in TUNED_OPS:
        return fallback_time_s(op, size, shape.ranks, shape.link_GBps, shape.link_latency_s)
    topo = _topology(shape, nccl_version)
    ch = nt.choose(topo, op, float(size), algos=_algos(algos))
    return (ch.time_us + nt.pipeline_us(topo, op, ch.algo, ch.proto, float(size), ch.channels,
                                        threads=ch.threads)) * 1e-6


def nccl_estimate_s(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int], dtype_bytes: int = 2,
                    algos: Iterable[str] | None = None, nccl_version: str | None = None) -> float | None:
    """Return NCCL's own estimate (s) of its default choice (latency + size / bandwidth, without the
    kernel pipeline collective_time_s adds), or None where there is no NCCL model for the group."""
    ch = nccl_choice(cluster, op, size_bytes, device_ids, dtype_bytes, algos, nccl_version)
    return None if ch is None else ch.time_us * 1e-6


def bus_bandwidth_GBps(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int], dtype_bytes: int = 2,
                       calibration: Calibration | None = None, algos: Iterable[str] | None = None,
                       nccl_version: str | None = None) -> float:
    """Return nccl-tests' bus bandwidth (GB/s) of `op` over the group: bus factor x size / time
    (all_reduce 2(n-1)/n, all_gather / reduce_scatter (n-1)/n, others 1); 0 for one device."""
    ids = tuple(device_ids)
    t = collective_time_s(cluster, op, size_bytes, ids, dtype_bytes, calibration, algos, nccl_version)
    n = len(ids)
    if n <= 1 or t <= 0:
        return 0.0
    return bus_factor(op, n) * _elements(size_bytes, dtype_bytes) / t / 1e9


def lagom_link(cluster: Any, device_ids: Iterable[int], nccl_version: str | None = None) -> cost.Link | None:
    """Return Lagom's cost-model Link for the group (NCCL's graphs on the cluster's hardware), or None
    when the group falls back to alpha-beta (unknown devices or one rank)."""
    shape = group_shape(cluster, device_ids)
    if shape.topology is None or shape.ranks <= 1:
        return None
    return cost.link_from_topology(_topology(shape, nccl_version), shape.arch)


def overlap_slowdown(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int], memory_bound: float,
                     dtype_bytes: int = 2, consts: cost.Consts | None = None) -> float:
    """Return the factor (>= 1) by which computation on the group's GPUs slows while `op` runs beside
    it at NCCL's default setting: Lagom's interference model (gpuplan.models.lagom.cost.slowdown: SMs
    held by NCCL's CTAs, HBM bandwidth and L2 its transfer takes), `memory_bound` being the share of
    the overlapped computation that is memory-bound. 1.0 where the group has no NCCL model (CPUs,
    declared types, one rank) or its type no SM and L2 figures (gpuplan.models.lagom.GPU_EXTRA)."""
    from gpuplan.models.lagom.problem import GPU_EXTRA

    _check_op(op)
    ids = tuple(device_ids)
    link = lagom_link(cluster, ids)
    if link is None or op not in cost.COLLECTIVES or size_bytes <= 0:
        return 1.0
    dt = cluster.type_of(cluster.devices[ids[0]].type)
    extra = GPU_EXTRA.get(dt.name)
    if extra is None:
        return 1.0
    c = consts or cost.Consts()
    size = _elements(size_bytes, dtype_bytes)
    a, p, nc, nthreads, chunk = cost.nccl_default(op, size, link, c)
    dev = cost.Device(extra[0], dt.memory_bandwidth_GBps, extra[1])
    return float(cost.slowdown(op, size, a, p, link, c, dev, memory_bound, nc, nthreads, chunk))


def lagom_time_s(cluster: Any, op: str, size_bytes: float, device_ids: Iterable[int], dtype_bytes: int = 2,
                 consts: cost.Consts | None = None, algos: Iterable[str] | None = None,
                 nccl_version: str | None = None) -> float:
    """Return Lagom's extended-model seconds (chain fill, flow control, step latency, thread
    saturation) of `op` at NCCL's default setting over the group (`algos`: restricted as NCCL_ALGO
    does; `nccl_version` as collective_time_s); the alpha-beta fallback where there is no NCCL model."""
    _check_op(op)
    ids = tuple(device_ids)
    link = lagom_link(cluster, ids, nccl_version)
    size = _elements(size_bytes, dtype_bytes)
    if link is None or op not in cost.COLLECTIVES:
        return collective_time_s(cluster, op, size, ids, dtype_bytes, nccl_version=nccl_version)
    c = consts or cost.Consts()
    a, p, nc, nthreads, chunk = cost.nccl_default(op, size, link, c, None if algos is None else _algos(algos))
    return float(cost.comm_time_us(op, size, a, p, link, c, nc, nthreads, chunk)) * 1e-6
