"""NCCL's own tuning model, restated from NCCL 2.30.7 (NVIDIA/nccl, master 5067397c).

Three steps, all as NCCL does them when a communicator is created and an op is enqueued:

1. `graphs(topo)`: what NCCL's topology search (`src/graph/search.cc` ncclTopoCompute,
   ncclTopoDupChannels; `src/init.cc` sets the tree to the ring's channel count) finds for a
   group: channels and per-channel bandwidth (GB/s) of the ring, tree and NVLS graphs. The search
   is replayed on a closed-form view of the hardware: each channel of a ring or tree takes its
   speed from every GPU's NVLink (or PCIe) budget and, across nodes, from one NIC; each NVLS
   channel takes it (ppn + 1) times from every GPU's NVLink budget (search.cc
   ncclTopoSearchTryNvls: the head pulls twice). Speeds come from NCCL's speed arrays.
2. `tuning(topo)`: `src/graph/tuning.cc` ncclTopoTuneModel: per (collective, algorithm, protocol)
   the latency (us) and algorithm bandwidth (GB/s), with NCCL's per-architecture tables (base and
   hardware latencies, llMaxBws, per-channel caps for ring LL128 / tree / tree LL128 / NVLS tree,
   NVLS efficiency), the protocol refinements and the enable rules (LL128, NVLS, NVLS tree, PAT).
3. `algo_time_us` / `choose`: tuning.cc ncclTopoGetAlgoTime (tree correction factors, the
   multi-node ring Simple plateau) and enqueue.cc topoGetAlgoInfo (smallest time wins, then the
   channel and thread reduction for small messages).

Units: bandwidths GB/s (NCCL's own unit, 1e9 B/s), latencies and times microseconds, sizes bytes.
Nothing here is fitted: every constant is NCCL's, cited by file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

NCCL_VERSION = "2.30.7"
ALGOS = ("tree", "ring", "nvls", "nvlstree", "pat")
PROTOS = ("LL", "LL128", "Simple")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
MAX_CHANNELS = 64            # device.h MAXCHANNELS
RING_MAX_CHANNELS = MAX_CHANNELS // 2   # init.cc ringGraph->maxChannels
NVLS_MAX_ARITY = 32          # device.h NCCL_MAX_NVLS_ARITY
# Meaning of "NVSwitch": GPUs with 12 NVLinks or more (A100/H100/H200 SXM) sit on an HGX board
# whose NVLinks all go to NVSwitches; fewer (P100/V100 SXM2, DGX-1) form a direct hybrid cube-mesh.
NVSWITCH_MIN_NVLINKS = 12

# CUDA compute capability per architecture name (the catalog's `arch`); ada is sm89, an sm80-class
# part for NCCL's tables (tuning.cc compCapIndex: >= 90 Hopper, >= 80 Ampere, else Volta).
COMPUTE_CAPABILITY = {"kepler": 37, "maxwell": 52, "pascal": 60, "volta": 70, "turing": 75, "ampere": 80,
                      "ada": 89, "hopper": 90, "blackwell": 100}

# ---- tuning.cc: ncclTunerConstantsDefaults --------------------------------------------------------
# baseLatencies (us) per algorithm, (LL, LL128, Simple). CollNet is not modelled (needs SHARP).
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
               "nvlstree": (0.0, 0.0, 0.0), "pat": (8.0, 8.0, 8.0)}
# hwLatencies (us) per hardware (NVLINK, PCI, NET) and algorithm, (LL, LL128, Simple).
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
               "nvlstree": (0.0, 0.0, 25.0), "pat": (0.0, 0.0, 4.0)},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0),
             "nvlstree": (0.0, 0.0, 0.0), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvlstree": (0.0, 0.0, 20.9), "pat": (0.0, 0.0, 14.0)},
}
# Rows: compCapIndex 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell; columns: nodes 1, 2, >= 4 (index2).
# llMaxBws rows are GPU architectures on one node and CPU vendors across nodes (0 Intel, 1 AMD).
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)     # tuning.cc nvlsEfficiency, per compCapIndex
# tuning.cc treeCorrectionFactor[proto][log2(bytes/64)], applied to Tree all_reduce for 64 B..256 MiB.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
# comm.h NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD; ring LL is multiplied by nRanks (tuning.cc).
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# tuning.cc getNetOverhead: per-step network post overhead (us), x3 for Simple.
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}

# ---- topo.h: link bandwidths NCCL assigns (GB/s) --------------------------------------------------
# ncclTopoNVLinkBw: per NVLink link, by compute capability (SM60 18, SM70/SM80 20, SM86 12, SM90 20.6,
# SM100 40.1): NCCL's achievable figure, not the 25 GB/s (50 on SM100) line rate.
def nvlink_GBps(cc: int) -> float:
    """Return NCCL's bandwidth (GB/s) of one NVLink link on a GPU of compute capability `cc`."""
    if cc >= 100:
        return 40.1
    if cc >= 90:
        return 20.6
    if cc == 86:
        return 12.0
    if cc >= 70:
        return 20.0
    return 18.0


# topo.cc kvDictPciGen: x100 Mb/s per lane (Gen3 60, Gen4 120, Gen5 240); x16 -> 12 / 24 / 48 GB/s,
# i.e. 0.75 of the 16 / 32 / 64 GB/s line rate. NVLink GPUs' host link by architecture:
PCIE_GBPS_BY_ARCH = {"kepler": 12.0, "maxwell": 12.0, "pascal": 12.0, "volta": 12.0, "turing": 12.0,
                     "ampere": 24.0, "ada": 24.0, "hopper": 48.0, "blackwell": 48.0}
PCIE_NCCL_PER_LINE = 0.75

# ---- search.cc: speed arrays (GB/s per channel) tried by the search -------------------------------
SPEEDS_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEEDS_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                0.24, 0.12)
SM90_SPEEDS_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEEDS_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
                     0.24, 0.12)
SM100_SPEEDS_INTRA = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
SM100_SPEEDS_INTER = (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                      3.0, 2.4, 1.2, 0.24, 0.12)
_EPS = 1e-6


def compcap_index(cc: int) -> int:
    """Return NCCL's architecture row (0 Volta and older, 1 Ampere, 2 Hopper, 3 Blackwell)."""
    return 3 if cc >= 100 else 2 if cc >= 90 else 1 if cc >= 80 else 0


@dataclass(frozen=True)
class Topology:
    """A communicator as NCCL's search sees it (hashable: the cache key of everything below).

    ranks over `nodes` nodes, at least `ppn_min` of them per node; `cc` the lowest compute capability
    (and `cc_max` the highest); per GPU `nvlinks` NVLink links (0: peers over PCIe) through an NVSwitch
    (`nvswitch`) or a direct mesh; `pcie_GBps` NCCL's bandwidth of one GPU's PCIe link; per node
    `nics` NICs of `nic_GBps` each; the CPU vendor (NCCL's net overhead and LL cap across nodes);
    `latency_inter_us` the network's extra latency (graphs' latencyInter: 0 for InfiniBand); `ll128`
    forces LL128 on or off (None: NCCL's own rule); `nccl_version` (major, minor) of the NCCL that
    runs: it selects only the kernels' work layout (`nvls_block_split`, the ring LL128 chunk
    rounding in `ring_layout_factor`); the tables are NCCL 2.30.7's whatever it says.
    """

    ranks: int
    nodes: int
    ppn_min: int
    cc: int
    nvlinks: int
    nvswitch: bool
    pcie_GBps: float
    nics: int = 1
    nic_GBps: float = 12.5
    cpu_vendor: str = "intel"
    cc_max: int = 0
    nvls_enable: bool = True
    latency_inter_us: float = 0.0
    ll128: bool | None = None
    nccl_version: tuple[int, int] = (2, 30)

    @property
    def ppn(self) -> float:
        """Return ranks per node as NCCL's tuning uses it (nRanks / nNodes, a float)."""
        return self.ranks / self.nodes

    @property
    def intra(self) -> str:
        """Return NCCL's intra-node hardware class: 'nvlink' or 'pcie'."""
        return "nvlink" if self.nvlinks > 0 and self.ppn_min > 1 else "pcie"

    def gpu_total_GBps(self) -> float:
        """Return search.cc getTotalBw: the larger of a GPU's NVLink total and its PCIe bandwidth."""
        nvl = self.nvlinks * nvlink_GBps(self.cc)
        return max(nvl, self.pcie_GBps)

    def intra_max_GBps(self) -> float:
        """Return the best GPU-to-GPU path bandwidth in a node (search.cc getMaxBw without a network)."""
        if self.nvlinks and self.ppn_min > 1:
            if self.nvswitch:
                return self.nvlinks * nvlink_GBps(self.cc)
            # a direct mesh (DGX-1 hybrid cube mesh): at most two links to one peer
            return min(self.nvlinks, 2) * nvlink_GBps(self.cc)
        return self.pcie_GBps

    def nic_path_GBps(self) -> float:
        """Return the bandwidth of a GPU-to-NIC path: the NIC, or the GPU's PCIe link if slower."""
        return min(self.nic_GBps, self.pcie_GBps)


@dataclass(frozen=True)
class Graph:
    """One searched graph: channels, per-channel intra- and inter-node bandwidth (GB/s)."""

    channels: int
    bw_intra_GBps: float
    bw_inter_GBps: float
    tree_pattern: bool = False   # NCCL_TOPO_PATTERN_TREE (one GPU per node): tree busBw x 0.85


@dataclass(frozen=True)
class Graphs:
    """The ring, tree and NVLS graphs of a communicator, and comm->nChannels after connect.cc."""

    ring: Graph
    tree: Graph
    nvls: Graph | None
    comm_channels: int


def _speeds(cc: int, inter: bool) -> tuple[float, ...]:
    if cc >= 100:
        return SM100_SPEEDS_INTER if inter else SM100_SPEEDS_INTRA
    if cc >= 90:
        return SM90_SPEEDS_INTER if inter else SM90_SPEEDS_INTRA
    return SPEEDS_INTER if inter else SPEEDS_INTRA


def _ring_channels(t: Topology, s: float) -> int:
    """Channels a ring search fits at speed `s`: each takes s from every GPU's link budget (in and
    out) and, across nodes, s from one NIC in each direction."""
    inter = t.nodes > 1
    cap = RING_MAX_CHANNELS
    if t.ppn_min > 1 or not inter:
        cap = min(cap, int(t.gpu_total_GBps() / s + _EPS) if t.intra == "nvlink" else int(t.pcie_GBps / s + _EPS))
    if inter:
        cap = min(cap, t.nics * int(t.nic_path_GBps() / s + _EPS))
        if t.ppn_min == 1:   # every channel enters and leaves the only GPU through its PCIe link
            cap = min(cap, int(t.pcie_GBps / s + _EPS))
    return max(cap, 0)


def ring_graph(t: Topology) -> Graph:
    """Return the ring graph NCCL's search finds (search.cc ncclTopoCompute, two passes, then
    ncclTopoDupChannels between them)."""
    inter = t.nodes > 1
    speeds = _speeds(t.cc, inter)
    max_bw = t.nic_path_GBps() if inter else t.intra_max_GBps()
    total = t.gpu_total_GBps()
    i = 0
    while (speeds[i] > max_bw + _EPS or speeds[i] > total + _EPS) and i < len(speeds) - 1:
        i += 1
    best_c, best_s = 0, 0.0
    # pass 1: the first speed that fits, then lower speeds while they stay above 0.49x the best
    for s in speeds[i:]:
        if best_c and s / best_s <= 0.49:
            break
        c = _ring_channels(t, s)
        if c >= 1 and c * s > best_c * best_s + _EPS:
            best_c, best_s = c, s
        if best_c and (best_c == RING_MAX_CHANNELS or best_c * best_s >= total - _EPS):
            break
    if not best_c:
        return Graph(1, 0.1, 0.1)   # search.cc: "falling back to simple order", bwIntra 0.1
    # ncclTopoDupChannels
    if best_s >= 25.0 and not (t.cc > 80 and best_s < 50.0 and best_c > 4):
        dup = min(2 * best_c, RING_MAX_CHANNELS)
        best_s /= -(-dup // best_c)
        best_c = dup
    # pass 2: raise the speed while at least as many channels still fit
    for s in sorted(x for x in speeds if x > best_s + _EPS):
        c = _ring_channels(t, s)
        if c >= best_c and c * s > best_c * best_s + _EPS:
            best_c, best_s = c, s
    return Graph(best_c, best_s, best_s)


def tree_graph(t: Topology, ring: Graph) -> Graph:
    """Return the tree graph: as many channels as the ring (init.cc), at the highest speed that fits
    the GPUs' budget (raised by n/(n-1): a tree need not close the loop) and, across nodes, the NICs
    (a balanced tree splits a channel's network traffic over two GPUs' NICs); with two nodes or fewer
    pass 2 raises the intra-node speed up to about twice the inter-node one."""
    inter = t.nodes > 1
    c = ring.channels
    speeds = _speeds(t.cc, inter)
    n = t.ppn_min
    total = t.gpu_total_GBps() if t.intra == "nvlink" else t.pcie_GBps
    total_t = total * n / (n - 1) if n > 1 else total
    max_bw = t.nic_path_GBps() if inter else t.intra_max_GBps()
    pattern_tree = inter and t.ppn_min == 1

    def fits_intra(s: float) -> bool:
        return t.ppn_min == 1 or c * s <= total_t + _EPS

    def fits_net(s: float) -> bool:
        return not inter or c * s <= t.nics * t.nic_path_GBps() + _EPS

    start = [s for s in speeds if s <= max_bw + _EPS and fits_intra(s) and fits_net(s)]
    if not start:
        return Graph(c, ring.bw_intra_GBps, ring.bw_inter_GBps, pattern_tree)
    s_inter = s_intra = start[0]
    if inter:
        for s in sorted(x for x in speeds if x > s_intra + _EPS):
            if s_intra >= 2 * s_inter - _EPS or not fits_intra(s):
                break
            s_intra = s
    return Graph(c, s_intra, s_inter, pattern_tree)


def nvls_graph(t: Topology) -> Graph | None:
    """Return the NVLS graph (Hopper and later, NVSwitch, two GPUs or more per node; else None): one
    channel per GPU of the node (one per NIC across nodes), each taking its speed (ppn + 1) times from
    every GPU's NVLink budget; pass 2 raises bwInter while it stays below twice bwIntra (across
    nodes as far as the NIC allows; on one node nothing bounds it but the speed array) (search.cc)."""
    if not (t.nvls_enable and t.cc >= 90 and t.nvswitch and t.nvlinks and t.ppn_min > 1):
        return None
    inter = t.nodes > 1
    c = min(NVLS_MAX_ARITY, t.ppn_min, t.nics if inter else NVLS_MAX_ARITY)
    if c < 2:
        return None
    speeds = _speeds(t.cc, inter)
    total = t.gpu_total_GBps()
    max_bw = t.nic_path_GBps() if inter else t.intra_max_GBps()
    fit = [s for s in speeds if s <= max_bw + _EPS and (c + 1) * s <= total + _EPS]
    if not fit:
        return None
    s_intra = s_inter = fit[0]
    for s in sorted(x for x in speeds if x > s_inter + _EPS):
        if (inter and s > t.nic_path_GBps() + _EPS) or s_inter >= 2 * s_intra - _EPS:
            break
        s_inter = s
    return Graph(c, s_intra, s_inter)


@lru_cache(maxsize=4096)
def graphs(t: Topology) -> Graphs:
    """Return the ring, tree and NVLS graphs of `t` and comm->nChannels (cached per topology).

    comm->nChannels = 2 x min(ring, tree) channels (connect.cc ncclTopoPostset duplicates them), doubled
    again on Hopper across nodes when the ring's speed is above 45 GB/s and channels are below 16.
    """
    ring = ring_graph(t)
    tree = tree_graph(t, ring)
    nvls = nvls_graph(t)
    comm = min(MAX_CHANNELS, 2 * min(ring.channels, tree.channels))
    if t.cc >= 90 and t.nodes > 1 and ring.bw_intra_GBps > 45.0 and comm < 16:
        comm = min(MAX_CHANNELS, 2 * comm)
    return Graphs(ring, tree, nvls, comm)


def nsteps(coll: str, n: int) -> int:
    """Return NCCL's ring step count: 2(n-1) all_reduce, n-1 all_gather/reduce_scatter, n otherwise."""
    if coll == "all_reduce":
        return 2 * (n - 1)
    if coll in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def net_steps(coll: str, nodes: int) -> int:
    """Return how many of a ring's steps cross the network: 2(N-1) all_reduce, N-1 otherwise, 0 on one node."""
    return 0 if nodes == 1 else (2 * (nodes - 1) if coll == "all_reduce" else nodes - 1)


def _log2i(x: int) -> int:
    return max(0, int(x).bit_length() - 1)


@dataclass(frozen=True)
class Caps:
    """Overrides of NCCL's tables (None: NCCL's value for the architecture and node count) and a
    calibration: `cap_GBps` bounds the raw bus bandwidth (a measured ceiling), `latency_scale`
    multiplies every latency (a measured alpha over NCCL's)."""

    ll_max_GBps: float | None = None
    per_ch_max_ring_ll128_GBps: float | None = None
    per_ch_max_tree_GBps: float | None = None
    nvls_eff: float | None = None
    cap_GBps: float | None = None
    latency_scale: float = 1.0


NO_CAPS = Caps()


@dataclass(frozen=True)
class Entry:
    """One (collective, algorithm, protocol) of NCCL's tables: latency (us) and algorithm
    bandwidth (GB/s; 0 when NCCL does not use it)."""

    latency_us: float
    algbw_GBps: float


def _graph_of(g: Graphs, algo: str) -> Graph | None:
    return {"ring": g.ring, "tree": g.tree, "pat": g.tree, "nvls": g.nvls, "nvlstree": g.nvls}[algo]


def ll128_enabled(t: Topology) -> bool:
    """Return whether NCCL enables LL128 by default (tuning.cc): NVLink inside the node (or one GPU
    per node), NIC next to the GPU, SM70 or newer, same compute capability (or all SM90+)."""
    if t.ll128 is not None:
        return t.ll128
    same = t.cc == (t.cc_max or t.cc) or t.cc >= 90
    intra_ok = t.intra == "nvlink" or t.ppn_min == 1
    return t.cc >= 70 and same and intra_ok


def considered(coll: str, algo: str, proto: str) -> bool:
    """Return whether NCCL's tuning loop considers (coll, algo, proto) at all (tuning.cc)."""
    if coll in ("broadcast", "reduce") and algo != "ring":
        return False
    if coll in ("all_gather", "reduce_scatter") and algo not in ("pat", "ring", "nvls"):
        return False
    if coll == "all_reduce" and algo == "pat":
        return False
    if algo in ("nvls", "nvlstree", "pat") and proto != "Simple":
        return False
    return True


def disabled(t: Topology, g: Graphs, coll: str, algo: str, proto: str) -> str | None:
    """Return why NCCL gives (coll, algo, proto) no bandwidth on `t`, or None when it may use it."""
    if not considered(coll, algo, proto):
        return f"NCCL does not run {coll} with {algo}/{proto}"
    graph = _graph_of(g, algo)
    if graph is None or graph.channels < (2 if algo in ("nvls", "nvlstree") else 1):
        return f"no {algo} graph (NVLS needs Hopper or later GPUs on an NVSwitch)"
    if proto == "LL128" and not ll128_enabled(t):
        return "LL128 is off: NCCL enables it only over NVLink on SM70+ with the NIC near the GPU"
    if algo == "nvls" and t.nodes > 1:
        return f"multi-node NVLS needs CollNet ({t.nodes} nodes)"
    if algo == "nvlstree" and t.nodes == 1:
        return "NVLS tree runs only across nodes"
    if algo == "nvls" and coll in ("all_gather", "reduce_scatter") and t.nodes > 1:
        return "multi-node NVLS all_gather/reduce_scatter needs CollNet"
    if algo == "pat" and not (t.ppn_min == 1 and t.nodes == t.ranks and t.cc >= 60):
        return "PAT runs only with one GPU per node"
    return None


def bus_bandwidth(t: Topology, g: Graphs, coll: str, algo: str, proto: str, caps: Caps = NO_CAPS,
                  nc: Any = None, scale: Any = 1.0) -> Any:
    """Return NCCL's modelled bus bandwidth (GB/s, before the bus -> algorithm conversion) of
    (coll, algo, proto) with `nc` channels of the algorithm's graph (default: all of them), each at
    `scale` x its searched speed (tuning.cc: graph bandwidth, NVLS conversion, protocol caps, tree
    x0.92, tree pattern x0.85, PAT x0.75). numpy arrays broadcast through `nc` and `scale`.
    """
    graph = _graph_of(g, algo)
    if graph is None:
        return 0.0 * np.asarray(scale)
    n_ch = graph.channels if nc is None else nc
    N = t.nodes
    cci = compcap_index(t.cc)
    index2 = min(N, 3) - 1
    index1 = cci if N == 1 else (1 if t.cpu_vendor == "amd" else 0)
    ll_max = caps.ll_max_GBps or LL_MAX_BWS[index1][index2]
    per_ring_ll128 = caps.per_ch_max_ring_ll128_GBps or PER_CH_MAX_RING_LL128_BWS[cci][index2]
    per_tree = caps.per_ch_max_tree_GBps or PER_CH_MAX_TREE_BWS[cci][index2]
    per_tree_ll128 = PER_CH_MAX_TREE_LL128_BWS[cci][index2]
    bw: Any = graph.bw_intra_GBps if N <= 2 else graph.bw_inter_GBps
    if algo in ("nvls", "nvlstree"):
        eff = caps.nvls_eff if caps.nvls_eff is not None else NVLS_EFFICIENCY[cci]
        nc_safe = np.maximum(n_ch, 2)
        intra_bw = graph.bw_intra_GBps * eff * (nc_safe - 1) / nc_safe
        intra_bw = intra_bw * (2.0 if coll == "all_reduce" else (t.ppn - 1) / t.ppn)
        inter_bw = graph.bw_inter_GBps * (2 if (N <= 2 and algo == "nvlstree") else 1)
        bw = np.minimum(intra_bw, inter_bw)
        if algo == "nvlstree":
            bw = np.minimum(bw, PER_CH_MAX_NVLS_TREE_BWS[cci][index2])
    bus = n_ch * bw * scale
    if caps.cap_GBps is not None:
        bus = np.minimum(bus, caps.cap_GBps)
    if algo == "ring" and proto == "LL":
        bus = np.minimum(ll_max, bus * 0.5)
    if algo == "ring" and proto == "LL128":
        bus = np.minimum(bus * 0.92, n_ch * per_ring_ll128)
    if algo == "tree" and coll == "all_reduce":
        bus = np.minimum(bus * 0.92, n_ch * per_tree)
    if algo == "tree" and proto == "LL":
        bus = np.minimum(bus / 3.8, ll_max)
    if algo == "tree" and proto == "LL128":
        bus = np.minimum(bus * (7.0 / 9.0 if N == 1 else 120.0 / 128.0), n_ch * per_tree_ll128)
    if algo == "tree" and graph.tree_pattern:
        bus = bus * 0.85
    if algo == "pat":
        bus = bus * 0.75
    return bus


def bus_to_alg(coll: str, algo: str, n: int) -> float:
    """Return NCCL's algBw / busBw: n / nsteps for ring and NVLS, 0.5 for tree, 1 for non-ring
    all_gather / reduce_scatter."""
    if algo != "ring" and coll in ("all_gather", "reduce_scatter"):
        return 1.0
    if algo in ("ring", "nvls", "nvlstree"):
        return n / nsteps(coll, n)
    return 0.5


@lru_cache(maxsize=4096)
def tuning(t: Topology, g: Graphs | None = None, caps: Caps = NO_CAPS) -> dict[tuple[str, str, str], Entry]:
    """Return NCCL's latency / bandwidth table for `t` (tuning.cc ncclTopoTuneModel), cached.

    `g` replaces the searched graphs (default: `graphs(t)`), `caps` NCCL's per-architecture caps.
    Keys (collective, algorithm, protocol) for every pair NCCL considers; disabled pairs have
    algbw_GBps = 0.
    """
    g = g or graphs(t)
    out: dict[tuple[str, str, str], Entry] = {}
    for coll in COLLECTIVES:
        steps = nsteps(coll, t.ranks)
        for a in ALGOS:
            for pi, p in enumerate(PROTOS):
                if not considered(coll, a, p):
                    continue
                if disabled(t, g, coll, a, p):
                    out[(coll, a, p)] = Entry(0.0, 0.0)
                    continue
                bus = float(bus_bandwidth(t, g, coll, a, p, caps)) * bus_to_alg(coll, a, t.ranks)
                lat = _latency_us(t, coll, a, pi, steps) * caps.latency_scale
                out[(coll, a, p)] = Entry(lat, bus)
    return out


def latency_us(t: Topology, coll: str, algo: str, proto: str, caps: Caps = NO_CAPS) -> float:
    """Return NCCL's modelled latency (us) of (coll, algo, proto) on `t`."""
    return _latency_us(t, coll, algo, PROTOS.index(proto), nsteps(coll, t.ranks)) * caps.latency_scale


def _latency_us(t: Topology, coll: str, a: str, pi: int, steps: int) -> float:
    """tuning.cc latency of (coll, algo, proto index) on `t` (us), with the graphs' latencyInter."""
    n, N = t.ranks, t.nodes
    base = BASE_LAT_US[a][pi]
    intra_hw = t.intra
    intra_lat = HW_LAT_US[intra_hw][a][pi]
    inter_lat = HW_LAT_US["net"]["tree" if t.ppn == 1 else a][pi] + t.latency_inter_us
    if PROTOS[pi] == "Simple":
        inter_lat += t.latency_inter_us       # the flush
    if a == "ring":
        hw = "net" if N > 1 else intra_hw
        if coll in ("broadcast", "reduce"):
            return base + HW_LAT_US[hw]["ring"][pi]      # sameChannels
        overhead = 0.0
        if N > 1:
            overhead = NET_OVERHEAD_US.get(t.cpu_vendor, 1.0) * (3 if PROTOS[pi] == "Simple" else 1)
        intra_lat = max(intra_lat, overhead)
        n_inter = net_steps(coll, N)
        return base + (steps - n_inter) * intra_lat + n_inter * inter_lat
    if a == "tree":
        return base + 2 * ((n // N - 1) * intra_lat + _log2i(N) * inter_lat) if coll == "all_reduce" else base
    if a == "nvls":
        return intra_lat + (inter_lat if N > 1 else 0.0)
    if a == "nvlstree":
        return base + intra_lat + 2 * _log2i(N) * inter_lat
    # pat
    return base + _log2i(N) * (inter_lat / 3.5) + n * 2.8


def algo_time_us(t: Topology, coll: str, algo: str, proto: str, size_bytes: float, g: Graphs | None = None,
                 caps: Caps = NO_CAPS) -> float:
    """Return NCCL's estimated time (us) of one op, or -1 when NCCL would not use (algo, proto)
    (tuning.cc ncclTopoGetAlgoTime: tree correction, ring Simple plateau across nodes)."""
    e = tuning(t, g, caps).get((coll, algo, proto))
    if e is None or e.algbw_GBps <= 0:
        return -1.0
    bw, lat = e.algbw_GBps, e.latency_us
    log_size = _log2i(int(size_bytes) >> 6) if int(size_bytes) >> 6 else -1
    if algo == "tree" and coll == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    comm_channels = (g or graphs(t)).comm_channels
    if (algo == "ring" and proto == "Simple" and t.nodes > 1 and coll == "all_reduce"
            and size_bytes / (comm_channels * t.ranks) >= 64):
        lat *= 1.9 if t.cc < 80 else 1.4
    return lat + size_bytes / (1000.0 * bw)


@dataclass(frozen=True)
class Choice:
    """NCCL's default for one op: algorithm, protocol, estimated time (us), channels (CTAs) and
    threads per CTA as NCCL_NTHREADS counts them (the kernel adds one sync warp for ring Simple and
    four for tree Simple; tree always runs 640)."""

    algo: str
    proto: str
    time_us: float
    channels: int
    threads: int


@lru_cache(maxsize=65536)
def choose(t: Topology, coll: str, size_bytes: float, g: Graphs | None = None, caps: Caps = NO_CAPS,
           algos: tuple[str, ...] = ALGOS) -> Choice:
    """Return NCCL's default (algorithm, protocol) for `coll` of `size_bytes` on `t` and its time (us):
    the smallest algo_time_us among `algos` (enqueue.cc topoGetAlgoInfo: first minimum in NCCL's order
    tree, ring, ..., nvls, nvlstree, pat and LL, LL128, Simple), then the channel / thread reduction
    for small messages."""
    if coll not in COLLECTIVES:
        raise ValueError(f"collective: one of {', '.join(COLLECTIVES)}, not {coll!r}")
    best: tuple[float, str, str] | None = None
    for a in ALGOS:
        if a not in algos:
            continue
        for p in PROTOS:
            tm = algo_time_us(t, coll, a, p, size_bytes, g, caps)
            if tm >= 0 and (best is None or tm < best[0]):
                best = (tm, a, p)
    if best is None:
        raise ValueError(f"algos: NCCL runs none of {list(algos)} for {coll} on this group ({t.ranks} ranks, "
                         f"{t.nodes} nodes, compute capability {t.cc}; NVLS needs SM90+ on an NVSwitch)")
    tm, a, p = best
    g = g or graphs(t)
    if a in ("nvls", "nvlstree"):
        return Choice(a, p, tm, nvls_ctas(t), 640)
    nc = g.comm_channels
    nt = max_threads(t, a, p, g)
    thr = THREAD_THRESHOLD[p] * (t.ranks if (a == "ring" and p == "LL") else 1)
    while size_bytes < nc * nt * thr and nc >= 2:
        nc -= 1
    while size_bytes < nc * nt * thr and nt % 128 == 0:
        nt //= 2
    nt = max(nt, 96)
    if a in ("tree", "pat"):
        nt = 640
    return Choice(a, p, tm, nc, nt)


def max_threads(t: Topology, algo: str, proto: str, g: Graphs | None = None) -> int:
    """Return comm->maxThreads[algo][proto] (tuning.cc): 640 for LL128 and NVLS, 512 for LL and
    Simple, 256 for ring Simple when the ring's total bandwidth is PCIe-class (<= 12 GB/s)."""
    if proto == "LL128" or algo in ("nvls", "nvlstree"):
        return 640
    if algo == "ring" and proto == "Simple":
        ring = (g or graphs(t)).ring
        return 256 if ring.bw_intra_GBps * ring.channels <= 12.0 else 512
    return 512


# ---- the pipeline NCCL's kernels run (what NCCL's latency + size / bandwidth estimate leaves out) ----
# NCCL's estimate is latency + size / bandwidth: a message is one pass whose steps pipeline perfectly.
# Its kernels move each channel's share in loops of fixed-size chunks, and three structures of that
# pipeline cost time the estimate does not hold, most at mid sizes where a channel runs few loops:
#
# - Simple's per-slice handshake (src/device/prims_simple.h genericOp): a CTA handles one slice at a
#   time, waitPeer -> reduceCopy -> barrier -> postPeer (fence_acq_rel_sys, then the tail flag), so the
#   handshake does not overlap the slice's copy. A ring step on a chunk is SlicePerChunk slices
#   (all_reduce.h runRing: ProtoSimple<ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS = 2 slices>), and a
#   channel runs ceil(channel bytes / (nRanks x chunk)) loops; NCCL's latency counts one handshake per
#   step. Each further slice of a step costs the part of NCCL's Simple step latency that LL does not
#   pay (tuning.cc hwLat[hw][RING][SIMPLE] - hwLat[hw][RING][LL]: the fence and flag round; LL carries
#   its flag in every 8-byte line and its wire latency is hidden behind the copy).
# - NVLS's three-stage pipeline (all_reduce.h RunWorkColl<..., NCCL_ALGO_NVLS, SIMPLE>, one node):
#   scatter warps copy the input to the heads' buffers, reduce warps run multimem ld_reduce / st on
#   their head's chunk, gather warps copy the result out; a loop is nHeads chunks, and the second and
#   third stages start one loop late (fill: two loop-stage times). Which CTAs get data changed in 2.20
#   (nvls_block_split): 2.18 / 2.19 give CTA bid whole nHeads x chunk blocks, 2.20+ an even share.
#   The NVLS tree (NVLS_TREE) has four warp groups per node (scatter, reduce -> tree up, tree down ->
#   multicast, gather).
# - P2P read on Ampere (graph/paths.cc ncclTopoCheckP2p: NVLink between two SM80 GPUs; transport/p2p.cc
#   puts the Simple buffer on the sender): a receiving CTA loads each slice from the previous GPU's
#   memory after it has seen the tail flag, so every slice also waits a remote load's round trip
#   (two one-way NVLink steps) before its data flows. LL / LL128 buffers stay on the receiver
#   (written remotely), and no other architecture reads.
# - The broadcast / reduce ring pipeline (PipelineFrom / PipelineTo, Simple): a chain of nRanks - 1
#   hops that fills one chunk (BROADCAST_CHUNKSTEPS = 1 step) per hop.
# A ring all_reduce / all_gather / reduce_scatter has no fill: every rank sends its own chunk at the
# first step (runRing step 0), so every link is busy from the start. LL and LL128 forward line by
# line (a flag per 8 B / 128 B line): no store-and-forward per step, no per-slice fence. Tree Simple
# keeps NCCL's own mid-size correction (treeCorrectionFactor), which already stands for its chain.
NCCL_STEPS = 8                                   # device.h NCCL_STEPS: FIFO slots per connection
# init.cc DEFAULT_BUFFSIZE (Simple, 4 MiB), DEFAULT_LL_BUFFSIZE (NCCL_LL_LINES_PER_THREAD 8 x
# NCCL_LL_MAX_NTHREADS 512 x NCCL_STEPS x 16 B), DEFAULT_LL128_BUFFSIZE (120 x 640 x 8 x 8 B).
BUFFSIZE = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
CHUNKSTEPS = NCCL_STEPS // 2                     # collectives.h ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS
SLICESTEPS = NCCL_STEPS // 4                     # collectives.h ..._SLICESTEPS
SLICES_PER_CHUNK = CHUNKSTEPS // SLICESTEPS      # ProtoSimple<CHUNKSTEPS / SLICESTEPS, SLICESTEPS>
BROADCAST_CHUNKSTEPS = 1                         # collectives.h BROADCAST_CHUNKSTEPS
NVLS_CHUNK_BYTES = 128 * 1024                    # transport/nvls.cc NCCL_NVLS_CHUNKSIZE default
NVLS_LAST_CHUNK_ALIGN_BYTES = 16384              # all_reduce.h: lastChunkSize aligned to 16384 B
MIN_TRAFFIC_PER_CHANNEL = 32 * 1024              # enqueue.cc scheduleCollTasksToPlan MinTrafficPerChannel


def nvls_ctas(t: Topology) -> int:
    """Return comm->nvlsChannels, the CTAs an NVLS collective runs on (transport/nvls.cc:
    NVLS_NCHANNELS_SM90 16; SM100 32 across nodes, 24 on one node)."""
    if t.cc >= 100:
        return 32 if t.nodes > 1 else 24
    return 16


def parse_version(version: str) -> tuple[int, int]:
    """Return (major, minor) of an NCCL version string such as '2.18.5' (ValueError otherwise)."""
    parts = str(version).strip().split(".")
    if len(parts) < 2 or not all(x.isdigit() for x in parts[:2]):
        raise ValueError(f"nccl_version: an NCCL version such as 2.18.5, not {version!r}")
    return int(parts[0]), int(parts[1])


def nvls_block_split(t: Topology, algo: str = "nvls") -> bool:
    """Return whether the one-node NVLS all_reduce kernel hands out work in contiguous blocks: NCCL
    2.18 / 2.19 (device/all_reduce.h RunWorkElement<NVLS, SIMPLE>: CTA `bid` takes the block at
    bid x nHeads x chunkSize of every loop of nChannels x nHeads x chunkSize, so an op below
    nvlsChannels x nHeads x chunk runs on ceil(size / (nHeads x chunk)) CTAs); from 2.20 each channel
    gets an even share (`args->oneNode`: workOffset / workCount from the scheduler)."""
    return algo == "nvls" and t.nodes == 1 and t.nccl_version < (2, 20)


def nvls_block_chunk_bytes(t: Topology, size_bytes: float, heads: int) -> int:
    """Return the chunk NCCL 2.18 / 2.19 give a one-node NVLS op (enqueue.cc computeColl, over the whole
    op: concurrentOps = nvlsChannels x nHeads; 128 KiB, 64 / 32 / 16 KiB below 64 / 8 / 2 x
    concurrentOps x chunk)."""
    ops = nvls_ctas(t) * heads
    chunk = NVLS_CHUNK_BYTES
    for factor, size in ((64, 65536), (8, 32768), (2, 16384)):
        if size_bytes < factor * ops * chunk and chunk > size:
            chunk = size
    return chunk


def nvls_busy_ctas(t: Topology, coll: str, algo: str, size_bytes: float, heads: int,
                   chunk_bytes: float | None = None) -> int:
    """Return how many of the nvlsChannels CTAs get data: NCCL 2.18 / 2.19 (one node) one per
    nHeads x chunk block (`chunk_bytes`, default NCCL's), up to all of them; from 2.20 the
    scheduler's cells of 32 KiB of traffic (cbd_channels)."""
    ctas = nvls_ctas(t)
    if nvls_block_split(t, algo):
        chunk = nvls_block_chunk_bytes(t, size_bytes, heads) if chunk_bytes is None else float(chunk_bytes)
        block = heads * chunk
        return int(max(1, min(ctas, -(-size_bytes // block))))
    return cbd_channels(t, coll, size_bytes, ctas)


def _traffic_per_byte(coll: str, n: int) -> int:
    """enqueue.cc ncclFuncTrafficPerByte: all_reduce 2, all_gather / reduce_scatter nRanks, else 1."""
    return 2 if coll == "all_reduce" else n if coll in ("all_gather", "reduce_scatter") else 1


def cbd_channels(t: Topology, coll: str, size_bytes: float, max_channels: int) -> int:
    """Return how many channels enqueue.cc's scheduleCollTasksToPlan spreads one op over: cells of at
    least 32 KiB of traffic (MinTrafficPerChannel), at most `max_channels`."""
    traffic = max(float(MIN_TRAFFIC_PER_CHANNEL), size_bytes * _traffic_per_byte(coll, t.ranks))
    return int(max(1, min(max_channels, -(-traffic // MIN_TRAFFIC_PER_CHANNEL))))


def nvls_chunk_bytes(t: Topology, algo: str, channel_bytes: float, heads: int) -> int:
    """Return the chunk enqueue.cc calcCollChunking gives one channel of an NVLS (or NVLS tree) op of
    `channel_bytes` (the scheduler calls it per channel, nChannels = 1, so concurrentOps = nHeads)."""
    ops = heads
    if algo == "nvls":
        chunk = NVLS_CHUNK_BYTES
        for factor, size in ((64, 65536), (8, 32768), (2, 16384)):
            if channel_bytes < factor * ops * chunk and chunk > size:
                chunk = size
        return chunk
    chunk = min(NVLS_CHUNK_BYTES, 65536 if t.nodes >= 4 else NVLS_CHUNK_BYTES)   # nvlsTreeMaxChunkSize
    for factor, size in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if channel_bytes < factor * ops * chunk and chunk > size:
            chunk = size
    return chunk


LL128_SLICE_BYTES = 32 * 8 * 15 // 16 * 8     # prims_ll128.h DataEltPerSlice: a warp's 1,920 data bytes a pass


def ring_layout_factor(t: Topology, coll: str, algo: str, proto: str, size_bytes: float, channels: Any,
                       threads: Any) -> Any:
    """Return how much longer than NCCL's even, continuous spread a ring LL128 all_reduce's steps take
    (>= 1; 1 for anything else): NCCL's kernel moves a step in whole passes of its warps, and before
    NCCL 2.20 in rounded chunks.

    - Warp passes (prims_ll128.h GenericOp, every version): warp w of a CTA handles the step's
      1,920-byte slices w, w + nwarps, ... (DataEltPerSlice: 32 threads x 8 words, 15 of 16 data), one
      slice at a time, each waiting its own source load, the received lines' flags and its stores to
      the next GPU; warps share nothing, so a step takes ceil(slices / nwarps) passes whatever the
      number of warps with data (the per-CTA LL128 rate NCCL caps, perChMaxRingLL128, is that of all
      20 warps). A full step (576,000 B) is 15 passes of 640 threads; a 21,845 B step is still one.
    - Chunk layout before 2.20 (device/all_reduce.h runRing): the last loop's chunk is rounded up to
      minChunkSize = threads x 60 B / 2 (bytePerGrain 8 x 15 x 8 / 16 = 60, and the "/2" NCCL's
      comment calls smoother) and chunks are laid out chunk-major over the channels, so a channel's
      ring moves whole rounded chunks; from 2.20 every channel gets an even share (workCount).
    Every step of a ring in lockstep moves the channel's largest chunk (a chunk keeps its index
    around the ring), so the transfer takes passes x pass bytes / (size / (nChannels x nRanks)) of
    NCCL's: 8 x A100, 24 channels, 640 threads: 4 MiB 1.76x, 8 MiB 1.76x, 16 MiB 1.32x, 1 GiB 1.00x.
    numpy arrays broadcast through `channels` and `threads`."""
    if not (algo == "ring" and coll == "all_reduce" and proto == "LL128" and size_bytes > 0):
        return 1.0
    n = t.ranks
    nc = np.maximum(1, np.asarray(channels, dtype=float))
    thr = np.asarray(threads, dtype=float)
    pass_bytes = np.maximum(1.0, np.floor(thr / 32)) * LL128_SLICE_BYTES
    step = BUFFSIZE["LL128"] // NCCL_STEPS * 15 // 16        # calcBytePerStep: 15 of every 16 words
    loop = nc * n * step
    full = np.floor(size_bytes / loop)
    rest = size_bytes - full * loop
    if t.nccl_version < (2, 20):
        unit = thr * 60.0 / 2
        last = np.minimum(step, np.ceil(rest / (nc * n * unit)) * unit)
    else:
        last = np.ceil(rest / (nc * n))
    passes = full * np.ceil(step / pass_bytes) + np.ceil(last / pass_bytes)
    out = np.maximum(1.0, passes * pass_bytes / (size_bytes / (nc * n)))
    return float(out) if out.ndim == 0 else out


def ring_slices_per_step(channel_bytes: Any, ranks: int, chunk_bytes: Any = None) -> Any:
    """Return the Simple slices one ring step runs over a channel's whole share (all loops): full loops
    of nRanks x chunk (chunk = BUFFSIZE / NCCL_STEPS x CHUNKSTEPS unless given) take SlicePerChunk
    slices each; the last loop's chunk shrinks to ceil(rest / nRanks) and its slices to
    max(chunk / SlicePerChunk, slice / 32) (prims_simple.h genericOp), so a small last chunk takes one
    slice. numpy arrays broadcast through `channel_bytes` and `chunk_bytes`."""
    step = BUFFSIZE["Simple"] // NCCL_STEPS
    chunk = np.asarray(step * CHUNKSTEPS if chunk_bytes is None else chunk_bytes, dtype=float)
    per = np.maximum(np.asarray(channel_bytes, dtype=float), 1.0)
    full = np.floor(per / (ranks * chunk))
    rest = per - full * ranks * chunk
    last = np.ceil(rest / ranks)
    slice_bytes = np.maximum(np.ceil(last / SLICES_PER_CHUNK), chunk / SLICES_PER_CHUNK / 32)
    tail = np.where(rest > 0, np.minimum(SLICES_PER_CHUNK, np.ceil(last / np.maximum(slice_bytes, 1.0))), 0.0)
    out = np.maximum(full * SLICES_PER_CHUNK + tail, 1.0)
    return float(out) if out.ndim == 0 else out


def slice_sync_us(t: Topology) -> float:
    """Return the handshake (us) a Simple slice adds beyond LL's step on the group's intra-node
    hardware: tuning.cc hwLat[hw][RING][SIMPLE] - hwLat[hw][RING][LL] (NVLink 2.8, PCIe 4.7)."""
    hw = HW_LAT_US[t.intra]["ring"]
    return hw[2] - hw[0]


def p2p_read(t: Topology) -> bool:
    """Return whether every hop of the group's ring reads its Simple data from the previous GPU
    (P2P read): graph/paths.cc ncclTopoCheckP2p enables it for an NVLink path between two SM80 GPUs
    only (transport/p2p.cc then places the Simple buffer on the sender, so the receiver's copy starts
    with remote loads). True on one node of SM80 GPUs over NVLink; across nodes the network hop,
    not an NVLink one, paces the ring (NCCL's net Simple step, 14 us, against NVLink's 3.4), and the
    8 FIFO slots per connection let the faster NVLink hops run ahead, so their read latency hides."""
    return t.cc == 80 and (t.cc_max or t.cc) == 80 and t.intra == "nvlink" and t.nodes == 1


def read_latency_us(t: Topology, hop_us: float | None = None) -> float:
    """Return the latency (us) a P2P-read Simple slice exposes before its data flows: a remote load's
    round trip, two one-way NVLink steps (`hop_us`, default NCCL's own one-way step,
    tuning.cc hwLat[NVLINK][RING][LL] = 0.6 us). The receiver issues the loads only once it has
    seen the sender's tail flag (prims_simple.h waitPeer -> reduceCopy), so the round trip cannot
    overlap the handshake; a write-based slice (every other architecture) streams its stores and
    pays only the flag, which NCCL's Simple step latency already holds."""
    one_way = HW_LAT_US["nvlink"]["ring"][0] if hop_us is None else float(hop_us)
    return 2.0 * one_way


def pipeline_us(t: Topology, coll: str, algo: str, proto: str, size_bytes: float, channels: Any,
                g: Graphs | None = None, caps: Caps = NO_CAPS, chunk_bytes: Any = None,
                transfer_us: Any = None, hop_us: float | None = None, threads: Any = None) -> Any:
    """Return the time (us) NCCL's kernel pipeline adds to NCCL's latency + size / bandwidth estimate of
    (coll, algo, proto) on `channels` channels (see the comment above: Simple's serial per-slice
    handshake on the ring pattern, the NVLS and NVLS-tree stage fill, the broadcast / reduce chain
    fill); 0 where the estimate already holds the structure (LL, LL128, tree).

    On one node of SM80 GPUs over NVLink (`p2p_read`) every ring Simple slice also waits a remote
    load's round trip (`read_latency_us`: two one-way NVLink steps, `hop_us` or NCCL's own 0.6 us).
    A ring LL128 all_reduce's steps move whole warp passes (and, under NCCL 2.18 / 2.19, rounded
    chunks): `ring_layout_factor`, with `threads` per CTA (default NCCL's maximum).
    NVLS CTAs without data (`nvls_busy_ctas`: the version's work split) leave NCCL's bandwidth, that
    of all nvlsChannels CTAs, to the busy ones; under NCCL 2.18 / 2.19's block split the busiest CTA's
    whole blocks set the pace.

    `chunk_bytes` replaces NCCL's chunk (ring: CHUNKSTEPS steps of the Simple buffer; NVLS:
    calcCollChunking's), `transfer_us` NCCL's size / algBw (another model's transfer time); numpy
    arrays broadcast through `channels`, `chunk_bytes` and `transfer_us`.
    """
    if size_bytes <= 0:
        return 0.0
    n = t.ranks
    transfer_given = transfer_us
    if transfer_us is None:
        e = tuning(t, g, caps).get((coll, algo, proto))
        if e is None or e.algbw_GBps <= 0:
            return 0.0
        transfer_us = size_bytes / (1000.0 * e.algbw_GBps)       # us: NCCL's size / algBw
    if proto != "Simple":
        # LL / LL128 forward line by line; only a ring LL128 step's whole warp passes add time
        nt_ = max_threads(t, algo, proto, g) if threads is None else threads
        return transfer_us * (ring_layout_factor(t, coll, algo, proto, size_bytes, channels, nt_) - 1.0)
    if algo == "ring" and coll in ("all_reduce", "all_gather", "reduce_scatter"):
        nc = np.minimum(np.maximum(1, channels), cbd_channels(t, coll, size_bytes, MAX_CHANNELS))
        slices = ring_slices_per_step(size_bytes / nc, n, chunk_bytes)
        out = nsteps(coll, n) * (slices - 1) * slice_sync_us(t)
        if p2p_read(t):       # Ampere over NVLink: every slice first waits a remote load's round trip
            out = out + nsteps(coll, n) * slices * read_latency_us(t, hop_us)
        return out * caps.latency_scale
    if algo == "ring":        # broadcast / reduce: PipelineFrom / PipelineTo, n - 1 hops
        nc = np.minimum(np.maximum(1, channels), cbd_channels(t, coll, size_bytes, MAX_CHANNELS))
        per = size_bytes / nc
        chunk = BUFFSIZE["Simple"] // NCCL_STEPS * BROADCAST_CHUNKSTEPS if chunk_bytes is None else chunk_bytes
        return max(0, n - 2) * transfer_us * np.minimum(1.0, chunk / per)
    if algo in ("nvls", "nvlstree"):
        graph = (g or graphs(t)).nvls
        if graph is None:
            return 0.0
        heads = int(graph.channels)
        ctas = nvls_ctas(t)
        nc = nvls_busy_ctas(t, coll, algo, size_bytes, heads,
                            None if chunk_bytes is None or np.ndim(chunk_bytes) else float(chunk_bytes))
        per = size_bytes / nc
        busy = np.minimum(np.maximum(1, channels), nc)      # the op's CTAs with data
        if nvls_block_split(t, algo):
            # NCCL 2.18 / 2.19: whole nHeads x chunk blocks per CTA, no last-loop realignment
            chunk = np.asarray(nvls_block_chunk_bytes(t, size_bytes, heads) if chunk_bytes is None else chunk_bytes,
                               dtype=float)
        else:
            chunk = np.asarray(nvls_chunk_bytes(t, algo, per, heads) if chunk_bytes is None else chunk_bytes,
                               dtype=float)
            # one partial loop: heads x lastChunkSize, aligned to 16 KiB (all_reduce.h)
            last = np.ceil(np.ceil(per / heads) / NVLS_LAST_CHUNK_ALIGN_BYTES) * NVLS_LAST_CHUNK_ALIGN_BYTES
            chunk = np.where(per < heads * chunk, np.minimum(chunk, last), chunk)
        per = size_bytes / busy
        uneven = 1.0
        if nvls_block_split(t, algo):
            # the busiest CTA holds whole blocks: its share of a size that is not a multiple of them
            loops = np.ceil(size_bytes / (busy * heads * chunk))
            busiest = np.minimum(size_bytes, heads * chunk * loops)
            uneven, per = busy * busiest / size_bytes, busiest
        idle = 0.0
        if transfer_given is None:
            # NCCL's bandwidth is that of all nvlsChannels CTAs ("NVLS should not need more than 16
            # channels to get peak BW", enqueue.cc): the busy ones move the op at busy / ctas of it
            idle = transfer_us * (ctas / busy * uneven - 1.0)
            transfer_us = transfer_us * ctas / busy * uneven
        else:
            idle = transfer_us * (uneven - 1.0)
            transfer_us = transfer_us * uneven
        stage = transfer_us * np.minimum(1.0, heads * chunk / per)    # one loop through the slowest stage
        if algo == "nvls":
            out = 2.0 * stage                  # scatter -> reduce/multicast -> gather: two stages of fill
        else:
            # NVLS tree: four warp groups; scatter and gather run at the node's NVLS rate, the tree's
            # up and down groups at NCCL's (network-bound) rate
            eff = caps.nvls_eff if caps.nvls_eff is not None else NVLS_EFFICIENCY[compcap_index(t.cc)]
            intra_GBps = graph.bw_intra_GBps * eff * heads
            bus = float(bus_bandwidth(t, g or graphs(t), coll, algo, proto, caps))
            rel = min(1.0, bus / intra_GBps) if intra_GBps > 0 else 1.0
            out = stage * (1.0 + 2.0 * rel)
        out = out + idle
        return float(out) if np.ndim(out) == 0 else out
    return 0.0
