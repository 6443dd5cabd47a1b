"""Lagom's cost model: NCCL's analytic tuning model, its extension to explicit parameters, interference.

Three layers, all pure functions (numpy-friendly: channels, threads and chunk may be arrays):

1. `nccl_latency_us` / `nccl_busbw_GBps` / `nccl_time_us`: NCCL 2.30's own model (`tuning.cc`) as
   restated in the research notes: per-(algorithm, protocol) latency tables, bus bandwidth with the
   protocol caps, bus -> algorithm bandwidth, T = lat + S / (1000 * algBw) in microseconds.
   `nccl_default` is NCCL's choice: the (algorithm, protocol) with the smallest T, then its
   channel/thread reduction for small messages, and the buffer-derived chunk.
2. `comm_time_us(theta)`: the same shape with explicit channels NC, threads NT and chunk C
   (our reconstruction, notes 2.4): per-channel bandwidth scaled by thread saturation, only as many
   channels busy as there are chunks, capped by the link, plus a per-loop overhead.
3. `slowdown(theta)`: how much an overlapped computation slows while the op runs (SMs held by the
   NC CTAs, HBM bandwidth used by the transfer, L2 taken by the in-flight chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from gpuplan.models.base import Schema

ALGOS = ("ring", "tree", "nvls")
PROTOS = ("LL", "LL128", "Simple")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
MAX_CHANNELS = 64          # NCCL MAXCHANNELS
NCCL_STEPS = 8             # FIFO slots per connection
# Default FIFO sizes (bytes) per protocol, notes 1.1: Simple 4 MiB, LL 512 KiB, LL128 4,915,200 B.
DEFAULT_BUFFSIZE = {"Simple": 4 * 2**20, "LL": 512 * 2**10, "LL128": 4_915_200}
# Latency tables (us), notes 1.2. BASE[algo][proto]; HW[link][algo][proto].
BASE_LAT = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
            "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
            "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0}}
HW_LAT = {"nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                     "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                     "nvls": {"Simple": 25.0}},
          "pcie": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
                   "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
                   "nvls": {"Simple": 25.0}},
          "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                  "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
                  "nvls": {"Simple": 18.0}}}
# Bytes per thread below which NCCL drops channels/threads (NCCL_THREAD_THRESHOLDS defaults).
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# Payload per wire byte: LL sends 8 B of data per 16 B line, LL128 120 B per 128 B line.
PAYLOAD = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}


@dataclass(frozen=True)
class Link:
    """The communicator an op runs on, as the cost model sees it.

    ranks n, nodes N, intra-node link type, per-channel bandwidth (GB/s) NCCL's graph search would
    report, the link's total bus bandwidth cap (GB/s), NCCL's comm.nChannels, the extra inter-node
    latency (us), and which of NVLS / LL128 this communicator may use.
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

    @property
    def ppn(self) -> int:
        """Ranks per node."""
        return self.ranks // self.nodes


class Consts(Schema):
    """Every constant of the model: NCCL's (from the notes) and our reconstruction's (fittable).

    Bandwidths GB/s, latencies us, chunk bytes. `thread_sat[p]` is the thread count at which one
    channel reaches its bandwidth; `step_us` the sync cost of one pipeline step (plus
    net_overhead_us per step across nodes); `kappa` the SM share one
    CTA takes from computation; `occ_floor` the share taken even by the smallest CTA; `l2_penalty`
    the extra slowdown of memory-bound work when in-flight chunks fill L2; `psi` how much overlapped
    computation slows communication; `beta` HBM bytes per bus byte.
    """

    ll_max_GBps: float = Field(default=141.0, gt=0)
    per_ch_max_ring_ll128_GBps: float = Field(default=36.7, gt=0)
    per_ch_max_tree_GBps: float = Field(default=36.7, gt=0)
    nvls_eff: float = Field(default=0.85, gt=0, le=1)
    net_overhead_us: float = Field(default=1.0, ge=0)
    thread_sat_LL: float = Field(default=256.0, ge=32)
    thread_sat_LL128: float = Field(default=320.0, ge=32)
    thread_sat_Simple: float = Field(default=256.0, ge=32)
    step_us: float = Field(default=0.1, ge=0)
    kappa: float = Field(default=1.0, ge=0)
    occ_floor: float = Field(default=0.5, ge=0, le=1)
    l2_penalty: float = Field(default=0.3, ge=0, le=0.9)
    psi: float = Field(default=0.1, ge=0)
    beta: float = Field(default=2.0, ge=0)
    fitted_from: str = "notes"

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
    if algo == "tree" and collective != "all_reduce":
        return f"Tree runs only all_reduce, not {collective}"
    if algo == "nvls":
        if collective not in ("all_reduce", "all_gather", "reduce_scatter"):
            return f"NVLS runs all_reduce/all_gather/reduce_scatter, not {collective}"
        if not link.nvls:
            return "NVLS needs NVLink SHARP (group.nvls: true)"
        if link.nodes > 1:
            return f"multi-node NVLS needs CollNet ({link.nodes} nodes)"
    return None


def proto_allowed(algo: str, proto: str, link: Link) -> str | None:
    """Return None when `proto` is allowed with `algo` on `link`, else the reason."""
    if proto not in PROTOS:
        return f"unknown protocol {proto!r} (expected one of {', '.join(PROTOS)})"
    if algo == "nvls" and proto != "Simple":
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
    if algo == "nvls" and channels < 2:
        out.append("NVLS needs at least 2 channels")
    lo, hi = thread_range(algo, proto)
    if threads % 32 or not lo <= threads <= hi:
        out.append(f"threads {threads} for {algo}/{proto}: expected a multiple of 32 in [{lo}, {hi}]")
    if chunk_bytes < 4096 or chunk_bytes % 128:
        out.append(f"chunk {chunk_bytes} B: expected a multiple of 128 B, at least 4 KiB")
    if chunk_bytes > 64 * 2**20:
        out.append(f"chunk {chunk_bytes} B above 64 MiB")
    return out


# ---- NCCL's analytic model (notes 1.2) -----------------------------------------------------------

def nsteps(collective: str, n: int) -> int:
    """Return NCCL's ring step count: 2(n-1) all_reduce, n-1 all_gather/reduce_scatter, n otherwise."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def nccl_latency_us(collective: str, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return NCCL's modelled latency (us) of one op of `collective` with (algo, proto) on `link`."""
    n, N, ppn = link.ranks, link.nodes, link.ppn
    intra = HW_LAT[link.intra][algo][proto]
    net_algo = "tree" if (ppn == 1 and algo == "ring") else algo
    inter = HW_LAT["net"][net_algo][proto] + link.inter_latency_us
    if proto == "Simple":
        inter += link.inter_latency_us
    base = BASE_LAT[algo][proto]
    if algo == "nvls":
        lat = intra + (inter if N > 1 else 0.0)
    elif algo == "tree":
        lat = base + 2 * ((ppn - 1) * intra + math.log2(N) * inter)
    elif collective in ("all_reduce", "all_gather", "reduce_scatter"):
        steps = nsteps(collective, n)
        s_inter = 0 if N == 1 else (2 * (N - 1) if collective == "all_reduce" else N - 1)
        overhead = c.net_overhead_us * (3 if proto == "Simple" else 1) if N > 1 else 0.0
        lat = base + (steps - s_inter) * max(intra, overhead) + s_inter * inter
    else:
        lat = base + (intra if N == 1 else inter)
    return lat * link.latency_scale


def _proto_cap(collective: str, algo: str, proto: str, link: Link, c: Consts, nc: Any, bus: Any) -> Any:
    """Apply NCCL's per-(algo, proto) caps to the raw bus bandwidth `bus` of `nc` channels."""
    if algo == "nvls":
        return bus
    if algo == "tree" and collective == "all_reduce":
        bus = np.minimum(0.92 * bus, nc * c.per_ch_max_tree_GBps)
    if proto == "LL":
        return np.minimum(bus / 3.8, c.ll_max_GBps) if algo == "tree" else np.minimum(c.ll_max_GBps, 0.5 * bus)
    if proto == "LL128":
        if algo == "tree":
            return np.minimum(bus * (7 / 9 if link.nodes == 1 else 120 / 128), nc * c.per_ch_max_ring_ll128_GBps)
        return np.minimum(0.92 * bus, nc * c.per_ch_max_ring_ll128_GBps)
    return bus


def _nvls_channel_bw(collective: str, link: Link, c: Consts, nc: Any) -> Any:
    """Per-channel NVLS bandwidth (GB/s), notes 1.2."""
    factor = 2.0 if collective == "all_reduce" else (link.ppn - 1) / link.ppn
    return link.channel_GBps * c.nvls_eff * (nc - 1) / nc * factor


def ratio(collective: str, algo: str, n: int) -> float:
    """Return algBw / busBw: n/nsteps for rings and NVLS, 0.5 for Tree (1 for non-ring AG/RS)."""
    if algo == "tree":
        return 0.5
    if algo == "nvls" and collective in ("all_gather", "reduce_scatter"):
        return 1.0
    return n / nsteps(collective, n)


def nccl_busbw_GBps(collective: str, algo: str, proto: str, link: Link, c: Consts, nc: Any = None) -> Any:
    """Return NCCL's modelled bus bandwidth (GB/s) with `nc` channels (default: comm.nChannels)."""
    nc = link.channels if nc is None else nc
    per = _nvls_channel_bw(collective, link, c, nc) if algo == "nvls" else link.channel_GBps
    return _proto_cap(collective, algo, proto, link, c, nc, nc * per)


def nccl_time_us(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts) -> float:
    """Return NCCL's own time estimate (us): lat + S / (1000 * algBw), with comm.nChannels channels."""
    bus = float(nccl_busbw_GBps(collective, algo, proto, link, c))
    lat = nccl_latency_us(collective, algo, proto, link, c)
    if (algo == "ring" and proto == "Simple" and collective == "all_reduce" and link.nodes > 1
            and size_bytes / (link.channels * link.ranks) >= 64):
        lat *= 1.4  # the multi-node ring Simple "plateau"
    return lat + size_bytes / (1000.0 * bus * ratio(collective, algo, link.ranks))


def default_chunk(algo: str, proto: str, collective: str) -> int:
    """Return NCCL's default chunk (wire bytes per step): buffsize/8 x chunkSteps (4 for ring Simple)."""
    steps = 4 if (algo == "ring" and proto == "Simple" and collective in
                  ("all_reduce", "all_gather", "reduce_scatter")) else 1
    return DEFAULT_BUFFSIZE[proto] // NCCL_STEPS * steps


def nccl_default(collective: str, size_bytes: float, link: Link, c: Consts) -> tuple[str, str, int, int, int]:
    """Return NCCL's default (algo, proto, channels, threads, chunk_bytes) for one op.

    The (algo, proto) with the smallest `nccl_time_us` among the allowed ones, then NCCL's
    reduction of channels and threads for small messages (notes 1.2), and the default chunk.
    """
    best: tuple[float, str, str] | None = None
    for a in ALGOS:
        for p in PROTOS:
            if algo_allowed(a, collective, link) or proto_allowed(a, p, link):
                continue
            t = nccl_time_us(collective, size_bytes, a, p, link, c)
            if best is None or t < best[0]:
                best = (t, a, p)
    assert best is not None  # ring/Simple is always allowed
    _, a, p = best
    nc = link.channels
    nt = 640 if a == "tree" or p == "LL128" else 512
    t = THREAD_THRESHOLD[p] * (link.ranks if (a == "ring" and p == "LL") else 1)
    if a in ("ring", "tree"):
        while size_bytes < nc * nt * t and nc >= 2:
            nc -= 1
    if a != "nvls" and a != "tree":
        while size_bytes < nc * nt * t and nt % 128 == 0 and nt > thread_range(a, p)[0]:
            nt //= 2
    return a, p, nc, max(nt, thread_range(a, p)[0]), default_chunk(a, p, collective)


# ---- the extended model with explicit (channels, threads, chunk) ---------------------------------

def _per_loop(collective: str, algo: str, link: Link) -> int:
    """Chunks one channel moves per loop: one per rank for rings, one otherwise."""
    return link.ranks if algo == "ring" and collective != "send_recv" else 1


def busy_channels(collective: str, size_bytes: float, algo: str, link: Link, channels: Any) -> Any:
    """Return how many of `channels` get work: NCCL spreads the last loop over every channel, down to
    one 4 KiB slice per rank and channel, so only tiny messages leave channels idle."""
    slices = np.maximum(1.0, np.floor(size_bytes / (_per_loop(collective, algo, link) * 4096.0)))
    return np.minimum(channels, slices)


def pipeline_steps(collective: str, algo: str, link: Link) -> float:
    """Return the pipeline depth a chunk crosses: ring steps, tree depth (up and down), 2 for NVLS."""
    if algo == "tree":
        return 2.0 * (link.ppn - 1 + math.log2(link.nodes)) or 1.0
    if algo == "nvls":
        return 2.0
    return float(nsteps(collective, link.ranks))


def comm_bw_GBps(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts,
                 channels: Any, threads: Any) -> Any:
    """Return the bus bandwidth (GB/s) the op reaches with explicit channels and threads per CTA."""
    nc = busy_channels(collective, size_bytes, algo, link, channels)
    thr = np.minimum(1.0, threads / c.thread_sat(proto))
    per = _nvls_channel_bw(collective, link, c, np.maximum(nc, 2)) if algo == "nvls" else link.channel_GBps
    raw = np.minimum(nc * per * thr, link.cap_GBps)
    return _proto_cap(collective, algo, proto, link, c, nc, raw)


def comm_time_us(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts,
                 channels: Any, threads: Any, chunk_bytes: Any) -> Any:
    """Return the op's communication time (us) alone.

    NCCL's latency + S / algBw, plus the pipeline fill (a slice of the chunk, a quarter, crossing
    every step before the pipe is full, at the per-channel rate) and a sync cost per step of every loop
    of nc x chunks-per-loop x chunk bytes: small chunks pay loops, large chunks pay the fill.
    """
    nc = busy_channels(collective, size_bytes, algo, link, channels)
    bus = comm_bw_GBps(collective, size_bytes, algo, proto, link, c, channels, threads)
    per_loop = _per_loop(collective, algo, link)
    payload = chunk_bytes * PAYLOAD[proto]
    loops = np.ceil(size_bytes / (nc * per_loop * payload))
    piece = np.minimum(payload, size_bytes / (nc * per_loop)) * 0.25
    steps = pipeline_steps(collective, algo, link)
    fill = (steps - 1) * piece / (1000.0 * bus / nc)
    sync = loops * steps * (c.step_us + (c.net_overhead_us if link.nodes > 1 else 0.0))
    lat = nccl_latency_us(collective, algo, proto, link, c)
    return lat + size_bytes / (1000.0 * bus * ratio(collective, algo, link.ranks)) + fill + sync


def slowdown(collective: str, size_bytes: float, algo: str, proto: str, link: Link, c: Consts, dev: Device,
             memory_bound: float, channels: Any, threads: Any, chunk_bytes: Any) -> Any:
    """Return the factor (>= 1) by which overlapped computation slows while this op runs.

    (1 - phi) x SM/(SM - kappa*NC*occ(NT)) for the compute-bound part, phi x 1/(1 - u_mem) for the
    memory-bound part, u_mem = beta x (HBM bytes per bus byte of the protocol) x busBw / Bmem plus
    the L2 share of the in-flight chunks (2 per channel) times l2_penalty.
    """
    nc = busy_channels(collective, size_bytes, algo, link, channels)
    occ = c.occ_floor + (1 - c.occ_floor) * threads / 640.0
    sm_taken = np.minimum(c.kappa * nc * occ, 0.9 * dev.sms)
    sm_term = dev.sms / (dev.sms - sm_taken)
    bus = comm_bw_GBps(collective, size_bytes, algo, proto, link, c, channels, threads)
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
