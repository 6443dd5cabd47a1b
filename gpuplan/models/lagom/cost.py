"""Lagom's cost model: NCCL's analytic tuning model, its extension to explicit parameters, interference.

Three layers, all pure functions (numpy-friendly: channels, threads and chunk may be arrays):

1. `nccl_latency_us` / `nccl_busbw_GBps` / `nccl_time_us`: NCCL 2.30.7's own model, per GPU
   architecture (gpuplan.models.nccl_tuning: tuning.cc latency tables, llMaxBws and per-channel caps
   per architecture, tree correction, NVLS and NVLS tree, the graphs NCCL's search builds),
   T = lat + S / (1000 * algBw) in microseconds. `nccl_default` is NCCL's choice: the (algorithm,
   protocol) with the smallest T, then its channel/thread reduction for small messages, and the
   buffer-derived chunk.
2. `comm_time_us(theta)`: the same shape with explicit channels NC, threads NT and chunk C
   (our reconstruction, notes 2.4): per-channel bandwidth scaled by thread saturation, only as many
   channels busy as there are chunks, capped by the link and by NCCL's flow control (8 FIFO slots a
   connection, `window_GBps`); NCCL's kernel pipeline (nccl_tuning.pipeline_us: Simple's per-slice
   handshake on the ring pattern, the NVLS and NVLS-tree stage fill) and the pipeline fill of the
   other Simple chains (`fill_depth`: tree, broadcast / reduce), per-step sync hidden under the
   transfer, and the measured NVLink step latency where NCCL's table is below it (`hop_excess_us`).
3. `slowdown(theta)`: how much an overlapped computation slows while the op runs (SMs held by the
   NC CTAs, HBM bandwidth used by the transfer, L2 taken by the in-flight chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import Field

from gpuplan.models import nccl_tuning as nt
from gpuplan.models.base import Schema

# nvlstree is NCCL's NVLS tree (NVLink SHARP inside each node, a tree across nodes); NCCL_ALGO spells
# it "nvlstree".
ALGOS = ("ring", "tree", "nvls", "nvlstree")
PROTOS = ("LL", "LL128", "Simple")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
MAX_CHANNELS = 64          # NCCL MAXCHANNELS
NCCL_STEPS = 8             # FIFO slots per connection
# Default FIFO sizes (bytes) per protocol, notes 1.1: Simple 4 MiB, LL 512 KiB, LL128 4,915,200 B.
DEFAULT_BUFFSIZE = {"Simple": 4 * 2**20, "LL": 512 * 2**10, "LL128": 4_915_200}
# Bytes per thread below which NCCL drops channels/threads (NCCL_THREAD_THRESHOLDS defaults).
THREAD_THRESHOLD = nt.THREAD_THRESHOLD
# Payload per wire byte: LL sends 8 B of data per 16 B line, LL128 120 B per 128 B line.
PAYLOAD = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
# Collectives NCCL runs as a ring pattern on the ring algorithm (enqueue.cc calcCollChunking:
# ncclPatternRing / RingTwice, nchunksPerLoop = nRanks); broadcast and reduce run a pipeline from / to
# the root (ncclPatternPipelineFrom / To, one chunk per loop).
RING_PATTERN = ("all_reduce", "all_gather", "reduce_scatter")
# transport/nvls.cc NCCL_PARAM(NvlsChunkSize, "NVLS_CHUNKSIZE", 128 * 1024).
NVLS_CHUNK_BYTES = 128 * 1024
# Measured latency (us) of one NCCL ring step between two GPUs over NVLink, per architecture, where it
# is above NCCL's hwLat table (0.6 us for LL). Ampere: NVIDIA/nccl-tests issue 123, DGX-A100,
# NCCL_ALGO=Ring NCCL_MAX_NCHANNELS=1 all_reduce of 8-128 B: 10.0 us on 2 GPUs (2 steps) rising
# linearly to 33.7 us on 8 GPUs (14 steps), (33.7 - 10.0) / 12 = 1.98 us a step (intercept 6.0 us,
# NCCL's baseLat 6.6); the same order as the 1.8-2.3 us P2P write latency cuda-samples'
# p2pBandwidthLatencyTest reports over NVLink (NVIDIA/cuda-samples issue 230). No such measurement
# was found for other architectures: they keep NCCL's table.
MEASURED_NVLINK_HOP_US = {"ampere": 1.98}


@dataclass(frozen=True)
class Link:
    """The communicator an op runs on, as the cost model sees it.

    ranks n, nodes N, intra-node link type, per-channel bandwidth (GB/s, per one of NCCL's
    comm.nChannels `channels`), the link's total bus bandwidth cap (GB/s, a calibration), the extra
    inter-node latency (us), and which of NVLS / LL128 this communicator may use. `topo` is the group
    as NCCL's search sees it (architecture, NVLink/PCIe, NICs: gpuplan.models.nccl_tuning); without
    one the link stands alone on `arch`'s tables. `graph_channels` is the search's channel count
    (comm.nChannels is twice it; None: the same as `channels`).
    """

    ranks: int
    nodes: int
    intra: str
    channel_GBps: float
    cap_GBps: float
    channels: int
    inter_latency_us: float = 0.0
    nvls: bool = False
    ll128: bool = True
    latency_scale: float = 1.0
    arch: str = "hopper"
    graph_channels: int | None = None
    topo: nt.Topology | None = None

    @property
    def ppn(self) -> int:
        """Ranks per node."""
        return self.ranks // self.nodes


class Consts(Schema):
    """Every constant of the model: NCCL's (None: NCCL 2.30.7's table for the link's architecture and
    node count, nccl_tuning) and our reconstruction's (fittable).

    Bandwidths GB/s, latencies us, chunk bytes. `thread_sat[p]` is the thread count at which one
    channel reaches its bandwidth; `step_us` the sync cost of one pipeline step (plus
    net_overhead_us per step across nodes); `kappa` the SM share one
    CTA takes from computation; `occ_floor` the share taken even by the smallest CTA; `l2_penalty`
    the extra slowdown of memory-bound work when in-flight chunks fill L2; `psi` how much overlapped
    computation slows communication; `beta` HBM bytes per bus byte.
    """

    ll_max_GBps: float | None = Field(default=None, gt=0)
    per_ch_max_ring_ll128_GBps: float | None = Field(default=None, gt=0)
    per_ch_max_tree_GBps: float | None = Field(default=None, gt=0)
    nvls_eff: float | None = Field(default=None, gt=0, le=1)
    net_overhead_us: float = Field(default=1.0, ge=0)
    thread_sat_LL: float = Field(default=256.0, ge=32)
    thread_sat_LL128: float = Field(default=320.0, ge=32)
    thread_sat_Simple: float = Field(default=256.0, ge=32)
    step_us: float = Field(default=0.1, ge=0)
    kappa: float = Field(default=1.0, ge=0)
    occ_floor: float = Field(default=0.5, ge=0, le=1)
    l2_penalty: float = Field(default=0.3, ge=0, le=0.9)
    psi: float = Field(default=0.1, ge=0)
    nvlink_hop_us: float | None = Field(default=None, gt=0)
    beta: float = Field(default=2.0, ge=0)
    fitted_from: str = "notes"

    def hop_us(self, arch: str) -> float | None:
        """Return the measured NVLink step latency (us) for `arch` (None: NCCL's own table)."""
        return self.nvlink_hop_us if self.nvlink_hop_us is not None else MEASURED_NVLINK_HOP_US.get(arch)

    def thread_sat(self, proto: str) -> float:
        """Return the thread count (per CTA) at which one channel of `proto` saturates."""
        return {"LL": self.thread_sat_LL, "LL128": self.thread_sat_LL128, "Simple": self.thread_sat_Simple}[proto]


@dataclass(frozen=True)
class Device:
    """What interference depends on: SM count, HBM bandwidth (GB/s), L2 size (bytes)."""

    sms: int
    memory_GBps: float
    l2_bytes: float


# ---- validity (NCCL's rules, notes 1.1) ----------------------------------------------------------

def algo_allowed(algo: str, collective: str, link: Link) -> str | None:
    """Return None when NCCL can run `collective` with `algo` on `link`, else the reason."""
    if algo not in ALGOS:
        return f"unknown algorithm {algo!r} (expected one of {', '.join(ALGOS)})"
    if algo in ("tree", "nvlstree") and collective != "all_reduce":
        return f"{'Tree' if algo == 'tree' else 'NVLS tree'} runs only all_reduce, not {collective}"
    if algo in ("nvls", "nvlstree"):
        if collective not in ("all_reduce", "all_gather", "reduce_scatter"):
            return f"NVLS runs all_reduce/all_gather/reduce_scatter, not {collective}"
        if not link.nvls:
            return "NVLS needs NVLink SHARP (group.nvls: true)"
        if algo == "nvls" and link.nodes > 1:
            return f"multi-node NVLS needs CollNet ({link.nodes} nodes); NCCL uses nvlstree across nodes"
        if algo == "nvlstree" and link.nodes == 1:
            return "NVLS tree runs only across nodes (one node: nvls)"
    return None


def proto_allowed(algo: str, proto: str, link: Link) -> str | None:
    """Return None when `proto` is allowed with `algo` on `link`, else the reason."""
    if proto not in PROTOS:
        return f"unknown protocol {proto!r} (expected one of {', '.join(PROTOS)})"
    if algo in ("nvls", "nvlstree") and proto != "Simple":
        return "NVLS runs only the Simple protocol"
    if proto == "LL128" and not link.ll128:
        return "LL128 is not safe on this path (group.ll128: false); forcing it can corrupt data"
    return None


def thread_range(algo: str, proto: str) -> tuple[int, int]:
    """Return the (min, max) threads per CTA NCCL accepts for (algo, proto); Tree always runs 640."""
    if algo == "tree":
        return 640, 640
    if proto == "LL128":
        return 160, 640
    return 64, 512


def setting_problems(collective: str, link: Link, algo: str, proto: str, channels: int,
                     threads: int, chunk_bytes: int) -> list[str]:
    """Return every NCCL rule a setting breaks ([] when it is valid)."""
    out = [r for r in (algo_allowed(algo, collective, link), proto_allowed(algo, proto, link)) if r]
    if out:
        return out
    if not 1 <= channels <= MAX_CHANNELS:
        out.append(f"channels {channels} outside 1..{MAX_CHANNELS}")
    if algo in ("nvls", "nvlstree") and channels < 2:
        out.append("NVLS needs at least 2 channels")
    lo, hi = thread_range(algo, proto)
    if threads % 32 or not lo <= threads <= hi:
        out.append(f"threads {threads} for {algo}/{proto}: expected a multiple of 32 in [{lo}, {hi}]")
    if chunk_bytes < 4096 or chunk_bytes % 128:
        out.append(f"chunk {chunk_bytes} B: expected a multiple of 128 B, at least 4 KiB")
    if chunk_bytes > 64 * 2**20:
        out.append(f"chunk {chunk_bytes} B above 64 MiB")
    return out


# ---- NCCL's analytic model (nccl_tuning: NCCL 2.30.7's tuning.cc per architecture) --------------

nsteps = nt.nsteps  # NCCL's ring step count


def _tuned(collective: str) -> str:
    """The NCCL collective whose tables model `collective` (send_recv: a one-step ring, as broadcast)."""
    return collective if collective in nt.COLLECTIVES else "broadcast"


def link_from_topology(topo: nt.Topology, arch: str, channels: int | None = None, bus_GBps: float | None = None,
                       cap_GBps: float | None = None, nvls: bool | None = None, ll128: bool | None = None,
                       latency_scale: float = 1.0, intra: str | None = None) -> Link:
    """Return the Link of a group NCCL's search sees as `topo`: comm.nChannels channels sharing the
    ring's bus bandwidth (GB/s; `channels` x `bus_GBps` replace them when a calibration gave them),
    NVLS and LL128 by NCCL's rules unless forced, no cap below twice a GPU's link budget unless given."""
    g = nt.graphs(topo)
    ring_bus = g.ring.channels * (g.ring.bw_intra_GBps if topo.nodes <= 2 else g.ring.bw_inter_GBps)
    nc = channels or g.comm_channels
    explicit = channels is not None and bus_GBps is not None
    return Link(ranks=topo.ranks, nodes=topo.nodes, intra=intra or topo.intra,
                channel_GBps=(bus_GBps if explicit else ring_bus) / nc,
                cap_GBps=cap_GBps or 2 * topo.gpu_total_GBps(), channels=nc,
                inter_latency_us=topo.latency_inter_us, nvls=nvls is not False and g.nvls is not None,
                ll128=ll128 if ll128 is not None else nt.ll128_enabled(topo), latency_scale=latency_scale,
                arch=arch, graph_channels=g.ring.channels if channels is None else None, topo=topo)


@lru_cache(maxsize=4096)
def link_topology(link: Link) -> nt.Topology:
    """Return the NCCL topology of `link`: its own `topo` (with the link's extra latency and LL128
    choice), or one built from the link's fields (`arch`, intra-node class, NVLS) when it has none.
    Cached per link (both are frozen): every cost-model evaluation asks for it several times."""
    if link.topo is not None:
        t = link.topo
        if t.latency_inter_us != link.inter_latency_us or t.ll128 != link.ll128:
            t = replace(t, latency_inter_us=link.inter_latency_us, ll128=link.ll128)
        return t
    nvlink = link.intra == "nvlink"
    return nt.Topology(ranks=link.ranks, nodes=link.nodes, ppn_min=link.ppn,
                       cc=nt.COMPUTE_CAPABILITY.get(link.arch, 90), nvlinks=18 if nvlink else 0,
                       nvswitch=link.nvls, pcie_GBps=nt.PCIE_GBPS_BY_ARCH.get(link.arch, 24.0),
                       latency_inter_us=link.inter_latency_us, ll128=link.ll128)


def link_graphs(link: Link) -> nt.Graphs:
    """Return the ring / tree / NVLS graphs the NCCL model runs on for `link`: the ring at the link's
    own per-channel bandwidth (a calibration may have replaced NCCL's), the tree and NVLS graphs as
    NCCL's search finds them relative to the ring (the same channels, the tree's speed ratio)."""
    return _link_graphs(link.channels, link.graph_channels, link.channel_GBps, link.nvls, link.ppn, link.nodes,
                        link_topology(link) if link.topo is not None else None)


@lru_cache(maxsize=4096)
def _link_graphs(channels: int, graph_channels: int | None, channel_GBps: float, nvls: bool, ppn: int, nodes: int,
                 topo: nt.Topology | None) -> nt.Graphs:
    gch = graph_channels or channels
    per = channel_GBps * channels / gch
    searched = nt.graphs(topo) if topo is not None else None
    ring = nt.Graph(gch, per, per)
    if searched is not None and searched.ring.bw_intra_GBps > 0:
        r = searched.ring
        tree = nt.Graph(gch, per * searched.tree.bw_intra_GBps / r.bw_intra_GBps,
                        per * searched.tree.bw_inter_GBps / r.bw_inter_GBps, searched.tree.tree_pattern)
    else:
        tree = nt.Graph(gch, per, per, nodes > 1 and ppn == 1)
    nv: nt.Graph | None = None
    if nvls:
        nv = searched.nvls if searched is not None and searched.nvls is not None else nt.Graph(
            max(2, channels), channel_GBps, math.inf)
    return nt.Graphs(ring, tree, nv, channels)


def link_caps(link: Link, c: Consts, cap: bool = False) -> nt.Caps:
    """Return the overrides of NCCL's tables `c` sets, the link's latency scale, and (with `cap`) its
    measured bus-bandwidth cap."""
    return nt.Caps(ll_max_GBps=c.ll_max_GBps, per_ch_max_ring_ll128_GBps=c.per_ch_max_ring_ll128_GBps,
                   per_ch_max_tree_GBps=c.per_ch_max_tree_GBps, nvls_eff=c.nvls_eff,
                   cap_GBps=link.cap_GBps if cap else None, latency_scale=link.latency_scale)


def nccl_latency_us(collective: str, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return NCCL's modelled latency (us) of one op of `collective` with (algo, proto) on `link`."""
    return nt.latency_us(link_topology(link), _tuned(collective), algo, proto, link_caps(link, c))


def _graph_nc(link: Link, algo: str, nc: Any) -> Any:
    """Convert comm.nChannels-counted channels to the graph's (NVLS counts its own CTAs)."""
    if algo in ("nvls", "nvlstree"):
        return nc
    return nc * (link.graph_channels or link.channels) / link.channels


def ratio(collective: str, algo: str, n: int) -> float:
    """Return algBw / busBw: n/nsteps for rings and NVLS, 0.5 for Tree (1 for non-ring AG/RS)."""
    return nt.bus_to_alg(_tuned(collective), algo, n)


def nccl_busbw_GBps(collective: str, algo: str, proto: str, link: Link, c: Consts, nc: Any = None) -> Any:
    """Return NCCL's modelled bus bandwidth (GB/s) with `nc` channels (default: all of the graph's)."""
    g = link_graphs(link)
    return nt.bus_bandwidth(link_topology(link), g, _tuned(collective), algo, proto, link_caps(link, c),
                            None if nc is None else _graph_nc(link, algo, nc))


def nccl_time_us(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return NCCL's own time estimate (us): lat + S / (1000 * algBw) with the tree correction and the
    multi-node ring plateau (nccl_tuning.algo_time_us); a setting NCCL would never pick is costed with
    the same formula without them."""
    t, g, caps = link_topology(link), link_graphs(link), link_caps(link, c)
    coll = _tuned(collective)
    tm = nt.algo_time_us(t, coll, algo, proto, float(size_bytes), g, caps)
    if tm >= 0:
        return tm
    bus = float(nt.bus_bandwidth(t, g, coll, algo, proto, caps))
    lat = nt.latency_us(t, coll, algo, proto, caps)
    return lat + size_bytes / (1000.0 * max(bus, 1e-9) * ratio(collective, algo, link.ranks))


def default_chunk(algo: str, proto: str, collective: str) -> int:
    """Return NCCL's default chunk (wire bytes per step): buffsize/8 x chunkSteps (4 for ring Simple),
    NCCL_NVLS_CHUNKSIZE (128 KiB, transport/nvls.cc) for NVLS and the NVLS tree."""
    if algo in ("nvls", "nvlstree"):
        return NVLS_CHUNK_BYTES
    steps = 4 if (algo == "ring" and proto == "Simple" and collective in RING_PATTERN) else 1
    return DEFAULT_BUFFSIZE[proto] // NCCL_STEPS * steps


def nccl_default(collective: str, size_bytes: float, link: Link, c: Consts,
                 algos: tuple[str, ...] | None = None) -> tuple[str, str, int, int, int]:
    """Return NCCL's default (algo, proto, channels, threads, chunk_bytes) for one op.

    NCCL's own choice (nccl_tuning.choose: smallest estimated time among the algorithms this link
    allows, then NCCL's reduction of channels and threads for small messages) and the default chunk;
    send_recv takes the protocol with the smallest time over a one-step ring. `algos` restricts the
    choice as NCCL_ALGO does (ValueError when none of them runs here).
    """
    allowed = tuple(a for a in ALGOS if algo_allowed(a, collective, link) is None and (algos is None or a in algos))
    if not allowed:
        raise ValueError(f"algos: none of {list(algos or ())} runs {collective} on this group "
                         f"({link.ranks} ranks, {link.nodes} nodes, NVLS {'yes' if link.nvls else 'no'})")
    t, g, caps = link_topology(link), link_graphs(link), link_caps(link, c)
    if collective in nt.COLLECTIVES:
        ch = nt.choose(t, collective, float(size_bytes), g, caps, allowed)
        a, p, nc, nthreads = ch.algo, ch.proto, ch.channels, ch.threads
    else:
        p = min((q for q in PROTOS if proto_allowed("ring", q, link) is None),
                key=lambda q: nccl_time_us(collective, size_bytes, "ring", q, link, c))
        a, nc, nthreads = "ring", link.channels, 640 if p == "LL128" else 512
    lo, hi = thread_range(a, p)
    nc = max(1, min(nc, MAX_CHANNELS))
    chunk = max(4096, nccl_chunk(collective, a, p, size_bytes, link, nc))
    return a, p, nc, min(max(nthreads, lo), hi), chunk


# ---- the extended model with explicit (channels, threads, chunk) ---------------------------------

def nvls_heads(link: Link) -> int:
    """Return NVLS's heads (nvls.nHeads): one per NVLS graph channel (a GPU of the node, or a NIC's
    GPU across nodes); the node's GPUs when the link has no NVLS graph."""
    g = link_graphs(link).nvls
    return int(g.channels) if g is not None and math.isfinite(g.channels) else max(1, link.ppn)


def _per_loop(collective: str, algo: str, link: Link) -> int:
    """Chunks one channel moves per loop (enqueue.cc nchunksPerLoop): one per rank for the ring pattern
    (all_reduce, all_gather, reduce_scatter on the ring), one per head for NVLS and the NVLS tree,
    one otherwise (tree, the broadcast / reduce pipeline)."""
    if algo in ("nvls", "nvlstree"):
        return nvls_heads(link)
    return link.ranks if algo == "ring" and collective in RING_PATTERN else 1


def nccl_chunk(collective: str, algo: str, proto: str, size_bytes: float, link: Link, channels: int) -> int:
    """Return the chunk (bytes) NCCL's enqueue.cc calcCollChunking gives an op of `size_bytes` on
    `channels` channels: the buffer's (`default_chunk`); for NVLS and the NVLS tree the per-channel
    rule of NCCL 2.30.7 (scheduleCollTasksToPlan calls calcCollChunking once per channel, nChannels = 1,
    on that channel's bytes over comm->nvlsChannels CTAs: nccl_tuning.nvls_chunk_bytes, 128 KiB shrunk
    to 64 / 32 / 16 KiB below 64 / 8 / 2 x heads x chunk, the NVLS tree's 256 / 128 / 64 / 32 KiB below
    32 / 16 / 4 / 1 x heads x chunk); the LL128 tree's halving (while fewer than
    (1 + log2 N + 0.1 ppn) x 64 / ppn chunks per channel, down to 128 KiB, then x 16 / ppn down to
    32 KiB)."""
    chunk = default_chunk(algo, proto, collective)
    if algo in ("nvls", "nvlstree"):
        t = link_topology(link)
        per = size_bytes / nt.cbd_channels(t, _tuned(collective), float(size_bytes), nt.nvls_ctas(t))
        chunk = nt.nvls_chunk_bytes(t, algo, per, nvls_heads(link))
    elif algo == "tree" and proto == "LL128":
        ppn = link.ranks / link.nodes
        steps = 1 + math.log2(link.nodes) + 0.1 * ppn
        while size_bytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while size_bytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return int(chunk // 128 * 128)


def busy_channels(collective: str, size_bytes: float, algo: str, link: Link, channels: Any,
                  chunk_bytes: Any = None) -> Any:
    """Return how many of `channels` get work: NCCL spreads the last loop of a ring or tree over every
    channel, down to one 4 KiB slice per rank and channel, so only tiny messages leave channels idle;
    NVLS counts CTAs (nccl_tuning.nvls_busy_ctas): from NCCL 2.20 the scheduler's 32 KiB traffic
    cells (a 64 KiB all_reduce keeps 4 of 16 busy), in NCCL 2.18 / 2.19 on one node one CTA per
    nHeads x chunk block (a 128 KiB all_reduce on 8 GPUs runs on one CTA)."""
    if algo in ("nvls", "nvlstree"):
        chunk = None if chunk_bytes is None or np.ndim(chunk_bytes) else float(chunk_bytes)
        busy = nt.nvls_busy_ctas(link_topology(link), _tuned(collective), algo, float(size_bytes),
                                 nvls_heads(link), chunk)
        return np.minimum(np.maximum(1, channels), busy)
    slices = np.maximum(1.0, np.floor(size_bytes / (_per_loop(collective, algo, link) * 4096.0)))
    return np.minimum(channels, slices)


def pipeline_steps(collective: str, algo: str, link: Link) -> float:
    """Return the pipeline depth a chunk crosses: ring steps, tree depth (up and down), 2 for NVLS
    (plus the tree's depth across nodes for the NVLS tree)."""
    if algo == "tree":
        return 2.0 * (link.ppn - 1 + math.log2(link.nodes)) or 1.0
    if algo == "nvls":
        return 2.0
    if algo == "nvlstree":
        return 2.0 * (1 + math.log2(link.nodes))
    return float(nsteps(collective, link.ranks))


def steps_per_rank(collective: str, algo: str, link: Link) -> float:
    """Return the steps one rank posts per loop (what its handshakes serialize on): every step of a
    ring pattern (the node-boundary ranks post each of them to the network), one per chunk for the
    broadcast / reduce pipeline, two for the tree and NVLS (up and down, reduce and multicast), four
    for the NVLS tree (NVLS reduce, tree up, tree down, multicast)."""
    if algo == "ring":
        return float(nsteps(collective, link.ranks)) if collective in RING_PATTERN else 1.0
    return 4.0 if algo == "nvlstree" else 2.0


def fill_depth(collective: str, algo: str, proto: str, link: Link) -> float:
    """Return the hops a chunk waits on before the pipeline is full (0: no fill).

    Store-and-forward happens per Simple step: a receiver sees a step's data only when the sender posts
    the step's tail after the whole slice (prims_simple.h), while LL / LL128 carry a flag in every 8 B /
    120 B line, so the next hop forwards line by line (no fill beyond the per-hop latency NCCL's
    latency already counts). A ring pattern (all_reduce, all_gather, reduce_scatter on the ring) has
    no fill either: every rank sends its own chunk from the first step, so every link is busy from
    the start and NCCL's 2(n-1) x (chunk / bandwidth + per-step latency) is the whole time. Chains
    fill: the tree up and down, the NVLS tree, NVLS (reduce, then multicast) and the ring broadcast /
    reduce pipeline wait (depth - 1) chunks before the last hop starts.
    """
    if proto != "Simple" or collective == "send_recv":
        return 0.0
    if algo == "ring" and collective in RING_PATTERN:
        return 0.0
    return max(0.0, pipeline_steps(collective, algo, link) - 1.0)


def hop_excess_us(collective: str, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return the latency (us) the measured NVLink step latency adds to NCCL's: every intra-node step
    of a ring (NCCL's nsteps less its network steps) or of a tree (2 (ppn - 1)) costs
    max(0, hop + (NCCL's step - NCCL's LL step) - NCCL's step) more: the measurement replaces the LL
    step (wire and flag) every protocol pays, the protocol's own extra stays NCCL's; 0 off NVLink, for
    NVLS and without a measurement."""
    hop = c.hop_us(link.arch)
    if hop is None or link.intra != "nvlink" or algo not in ("ring", "tree"):
        return 0.0
    t = link_topology(link)
    pi = PROTOS.index(proto)
    table = nt.HW_LAT_US["nvlink"][algo]
    nccl_hop = table[pi]
    # the measurement replaces the LL step (the wire and the flag every protocol pays); the protocol's
    # own extra over LL (LL128's line assembly, Simple's fence) stays NCCL's
    measured = hop + (table[pi] - table[0])
    if algo == "ring":
        if collective not in RING_PATTERN:
            return 0.0
        if link.nodes > 1:
            overhead = nt.NET_OVERHEAD_US.get(t.cpu_vendor, 1.0) * (3 if proto == "Simple" else 1)
            nccl_hop, measured = max(nccl_hop, overhead), max(measured, overhead)
        intra_steps = nsteps(collective, link.ranks) - nt.net_steps(collective, link.nodes)
    else:
        intra_steps = 2 * (link.ppn - 1)
    return intra_steps * max(0.0, measured - nccl_hop) * link.latency_scale


def step_latency_us(collective: str, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return the latency (us) of one pipeline step on the group's slowest hop: NCCL's per-step
    hardware latency (tuning.cc hwLat: network across nodes, plus the graphs' latencyInter; else NVLink
    or PCIe), with the measured NVLink step in place of NCCL's LL step where there is one (the
    protocol's extra over LL stays NCCL's, as in hop_excess_us)."""
    pi = PROTOS.index(proto)
    a = algo if algo in ("ring", "tree") else "ring"
    if link.nodes > 1:
        return (nt.HW_LAT_US["net"]["tree" if link.ppn == 1 else a][pi] + link.inter_latency_us) * link.latency_scale
    table = nt.HW_LAT_US["nvlink" if link.intra == "nvlink" else "pcie"][a]
    hop = c.hop_us(link.arch) if link.intra == "nvlink" else None
    lat = table[pi] if hop is None else max(table[pi], hop + table[pi] - table[0])
    return lat * link.latency_scale


def window_GBps(collective: str, algo: str, proto: str, link: Link, c: Consts, piece_bytes: Any,
                channel_GBps: Any) -> Any:
    """Return a channel's bandwidth (GB/s) under NCCL's flow control: a connection has NCCL_STEPS (8)
    FIFO slots (device.h), a ring Simple pattern uses 2 per slice and 4 per chunk (collectives.h
    SLICESTEPS = NCCL_STEPS/4, CHUNKSTEPS = NCCL_STEPS/2), every other pattern 1; a slot is free again
    after its slice crossed (slice / channel_GBps) and the tail / head flags made a round trip (2 step
    latencies). By Little's law the channel moves slots x slice per cycle:
    min(channel_GBps, slots x slice / (slice / channel_GBps + 2 step latency)). Small chunks are
    latency-bound, NCCL's default chunks are not (ring Simple: 4 x 1 MiB slices in flight).
    NVLS (multimem, no FIFO handshake per step) is not bounded here."""
    if algo in ("nvls", "nvlstree"):
        return channel_GBps
    ring_simple = algo == "ring" and proto == "Simple" and collective in RING_PATTERN
    slice_bytes = piece_bytes * (2 / 4 if ring_simple else 1.0)
    slots = NCCL_STEPS // (2 if ring_simple else 1)
    cycle_us = slice_bytes / (1000.0 * channel_GBps) + 2.0 * step_latency_us(collective, algo, proto, link, c)
    return np.minimum(channel_GBps, slots * slice_bytes / (1000.0 * cycle_us))


def comm_bw_GBps(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts,
                 channels: Any, threads: Any, chunk_bytes: Any = None) -> Any:
    """Return the bus bandwidth (GB/s) the op reaches with explicit channels and threads per CTA: NCCL's
    bus bandwidth of the busy channels (no more than the searched graph has: more CTAs share the same
    links), each scaled by its thread saturation, capped by the link's measured cap (then NCCL's
    protocol caps)."""
    nc = busy_channels(collective, size_bytes, algo, link, channels, chunk_bytes)
    g = link_graphs(link)
    thr = np.minimum(1.0, threads / c.thread_sat(proto))
    if algo in ("nvls", "nvlstree"):
        # every CTA works with all nHeads (the NVLS graph); NCCL's bandwidth is that of its
        # nvlsChannels CTAs, and the busy ones move nc / nvlsChannels of it
        t = link_topology(link)
        full = nt.bus_bandwidth(t, g, _tuned(collective), algo, proto, link_caps(link, c, cap=True), None, thr)
        return full * nc / nt.nvls_ctas(t)
    if link.topo is not None:
        # channels beyond the searched graph's duplicate it over the same links: no more bandwidth
        nc = np.minimum(nc, link.channels)
    return nt.bus_bandwidth(link_topology(link), g, _tuned(collective), algo, proto,
                            link_caps(link, c, cap=True), _graph_nc(link, algo, nc), thr)


def comm_time_us(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts,
                 channels: Any, threads: Any, chunk_bytes: Any) -> Any:
    """Return the op's communication time (us) alone.

    NCCL's latency + S / algBw, plus the pipeline fill of chains (`fill_depth` hops, each one chunk
    at the per-channel rate: a chunk is min(C, S / (nc x chunks per loop)) as enqueue.cc shrinks the
    last loop's chunk) and the per-step sync cost (step_us, plus net_overhead_us across nodes: NCCL's
    proxy posts one network send per step, tuning.cc getNetOverhead) of every step a rank posts
    (`steps_per_rank`) in every loop of nc x chunks-per-loop x chunk bytes. The sync overlaps the
    transfer: a connection keeps NCCL_STEPS (8) steps in flight (device.h), so a step's handshake
    runs while earlier steps' data moves and the op takes the larger of its transfer time and its
    steps' sync time, not their sum. Small chunks pay when their steps outnumber what the transfer
    hides; large chunks pay a chain's fill.
    """
    nc = busy_channels(collective, size_bytes, algo, link, channels, chunk_bytes)
    bus = comm_bw_GBps(collective, size_bytes, algo, proto, link, c, channels, threads, chunk_bytes)
    per_loop = _per_loop(collective, algo, link)
    payload = chunk_bytes * PAYLOAD[proto]
    loops = np.ceil(size_bytes / (nc * per_loop * payload))
    piece = np.minimum(payload, size_bytes / (nc * per_loop))
    bus = nc * window_GBps(collective, algo, proto, link, c, piece, bus / nc)
    per_step_us = c.step_us + (c.net_overhead_us if link.nodes > 1 else 0.0)
    sync = loops * steps_per_rank(collective, algo, link) * per_step_us
    lat = nccl_latency_us(collective, algo, proto, link, c) + hop_excess_us(collective, algo, proto, link, c)
    transfer = size_bytes / (1000.0 * bus * ratio(collective, algo, link.ranks))
    # a ring LL128 all_reduce's steps move whole warp passes (and rounded chunks before NCCL 2.20)
    transfer = transfer * nt.ring_layout_factor(link_topology(link), _tuned(collective), algo, proto,
                                                float(size_bytes), channels, threads)
    if pipelined(collective, algo, proto):
        # NCCL's kernel pipeline (nccl_tuning.pipeline_us): the NVLS stage fill, the ring's per-slice sync
        fill = nt.pipeline_us(link_topology(link), _tuned(collective), algo, proto, float(size_bytes), channels,
                              link_graphs(link), link_caps(link, c), chunk_bytes, transfer,
                              c.hop_us(link.arch) if link.intra == "nvlink" else None)
    else:
        fill = fill_depth(collective, algo, proto, link) * piece / (1000.0 * bus / nc)
    return lat + np.maximum(transfer, sync) + fill


def pipelined(collective: str, algo: str, proto: str) -> bool:
    """Return whether comm_time_us takes its pipeline term from nccl_tuning.pipeline_us (Simple on the
    ring pattern, NVLS, the NVLS tree) rather than from fill_depth's chain (tree, broadcast / reduce)."""
    return proto == "Simple" and collective in RING_PATTERN and algo in ("ring", "nvls", "nvlstree")


def slowdown(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts, dev: Device,
             memory_bound: float, channels: Any, threads: Any, chunk_bytes: Any) -> Any:
    """Return the factor (>= 1) by which overlapped computation slows while this op runs.

    (1 - phi) x SM/(SM - kappa*NC*occ(NT)) for the compute-bound part, phi x 1/(1 - u_mem) for the
    memory-bound part, u_mem = beta x (HBM bytes per bus byte of the protocol) x busBw / Bmem plus
    the L2 share of the in-flight chunks (2 per channel) times l2_penalty.
    """
    nc = busy_channels(collective, size_bytes, algo, link, channels, chunk_bytes)
    occ = c.occ_floor + (1 - c.occ_floor) * threads / 640.0
    sm_taken = np.minimum(c.kappa * nc * occ, 0.9 * dev.sms)
    sm_term = dev.sms / (dev.sms - sm_taken)
    bus = comm_bw_GBps(collective, size_bytes, algo, proto, link, c, channels, threads, chunk_bytes)
    reduce = 1.5 if collective in ("all_reduce", "reduce_scatter", "reduce") else 1.0
    wire = 1.0 / PAYLOAD[proto]
    l2 = np.minimum(1.0, 2 * nc * chunk_bytes / dev.l2_bytes)
    u_mem = np.minimum(0.9, c.beta * reduce * wire * bus / dev.memory_GBps + c.l2_penalty * l2)
    return (1 - memory_bound) * sm_term + memory_bound / (1 - u_mem)


def window_time_us(compute_us: float, comm_us: Any, progress_us: Any) -> Any:
    """Return the time (us) of an overlapped window: one compute segment and the ops under it.

    Ops run back to back on the communication stream (`comm_us` = sum of their stretched times d_i);
    computation progresses at 1/s_i while op i runs and at full speed after (`progress_us` =
    sum d_i / s_i): T = D + max(0, Tc0 - sum d_i/s_i). Arrays broadcast.
    """
    return comm_us + np.maximum(0.0, compute_us - progress_us)
