"""Profile the local machine: devices, collectives among them, per-layer costs -> a Profile.

Every CUDA GPU is a device; without one (or with `device="cpu"`) the CPU is split into
`cpu_ranks` devices of cores // cpu_ranks threads each, the way the gloo executors run on it.
"""

from __future__ import annotations

import datetime as _dt
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from gpuplan.models.profile import (CollectiveProfile, EmulatedType, MeasuredDeviceType, Profile, ProfileLink,
                                    ProfileNode)
from gpuplan.models.workload import TransformerConfig
from gpuplan.profiling import collectives as coll
from gpuplan.profiling import compute, layers, memory
from gpuplan.profiling.merge import merge_same_types
from gpuplan.profiling.timing import DEFAULT_MAX_REL_SPREAD
from gpuplan.registry import Progress, no_progress

CPU_TYPE = "cpu"


@dataclass(frozen=True)
class ProfileOptions:
    """What `gpuplan profile` measures and how long it may take.

    device: "auto" (CUDA when there is a GPU), "cuda" or "cpu". quick: small sweeps (under a
    minute on a 2-core machine). model: the catalog model whose layers are timed (on CPU a scaled
    copy), unless `config` gives the exact shape to time, at `seq_lens` and `micro_batches`.
    cpu_ranks: how many devices (processes) the CPU counts as. validate: also predict and measure
    stacks. emulate: declared types recorded as a measured type slowed down (`--emulate`).
    """

    device: str = "auto"
    quick: bool = False
    model: str = "llama3-8b"
    cpu_ranks: int = 2
    collectives: bool = True
    layers: bool = True
    validate: bool = False
    stacks: tuple[int, ...] = (2, 4, 8)
    config: TransformerConfig | None = None
    seq_lens: tuple[int, ...] = ()
    micro_batches: tuple[int, ...] = ()
    emulate: tuple[EmulatedType, ...] = ()


def resolve_device(device: str) -> str:
    """Return "cuda" or "cpu" for a requested device ("auto", "cuda", "cpu").

    Raises ValueError when CUDA is asked for and torch sees no GPU, or the name is unknown.
    """
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device 'auto', 'cuda' or 'cpu', not {device!r}")
    has_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if device == "cuda" and not has_cuda:
        raise ValueError("--device cuda, but torch sees no CUDA device here (use --device cpu)")
    return "cuda" if (device == "auto" and has_cuda) or device == "cuda" else "cpu"


def cpu_threads(ranks: int) -> int:
    """Return the torch threads each of `ranks` CPU devices gets: the usable cores shared evenly."""
    from gpuplan.runtime.contention import cores

    return max(1, cores() // max(1, ranks))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with torch's intra-op threads fixed to `n`, restoring the old count after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measure_device(device: str, *, quick: bool, name: str, catalog_name: str | None, count: int = 1,
                   threads: int | None = None, memory_bytes: int | None = None,
                   progress: Callable[[str], None] | None = None) -> MeasuredDeviceType:
    """Return the measured figures of one device: matmul sweep per dtype, memory, copy bandwidths."""
    is_cuda = device.startswith("cuda")
    dtypes = compute.supported_dtypes(device)
    if quick and not is_cuda:
        dtypes = ["fp32"]
    sizes = (compute.CUDA_SIZES[:3] if quick else compute.CUDA_SIZES) if is_cuda else \
        (compute.CPU_SIZES_QUICK if quick else compute.CPU_SIZES)
    soak_s = (compute.SOAK_S_QUICK if quick else compute.SOAK_S) if is_cuda else 0.0
    points = compute.matmul_sweep(device, dtypes, sizes, repeats=3 if quick else 5, soak_s=soak_s,
                                  progress=progress)
    best = compute.best_tflops(points)
    if progress is not None:
        progress("memory bandwidth")
    copy_gbps, _ = memory.copy_bandwidth(device, (256 if is_cuda else 64) * memory.MiB, repeats=3 if quick else 5)
    h2d = d2h = None
    if is_cuda:
        h2d, _ = memory.host_transfer_bandwidth(device, "h2d", repeats=3 if quick else 5)
        d2h, _ = memory.host_transfer_bandwidth(device, "d2h", repeats=3 if quick else 5)
    return MeasuredDeviceType(
        name=name, catalog_name=catalog_name, backend="cuda" if is_cuda else "cpu", count=count,
        memory_bytes=memory_bytes or memory.capacity_bytes(device), matmul_tflops=best,
        peak_fraction=compute.peak_fraction(best, catalog_name), matmul=points, copy_GBps=copy_gbps,
        h2d_GBps=h2d, d2h_GBps=d2h, threads=threads)


def local_devices(kind: str, options: ProfileOptions, progress: Callable[[str], None]) -> list[tuple[str, MeasuredDeviceType]]:
    """Return (torch device, measured type) for every local device: each GPU, or the CPU as devices."""
    import torch

    if kind == "cpu":
        threads = cpu_threads(options.cpu_ranks)
        with torch_threads(threads):
            d = measure_device("cpu", quick=options.quick, name=CPU_TYPE, catalog_name=None,
                               count=options.cpu_ranks, threads=threads,
                               memory_bytes=memory.capacity_bytes("cpu") // options.cpu_ranks, progress=progress)
        return [("cpu", d)]
    out = []
    for i in range(torch.cuda.device_count()):
        torch_name = torch.cuda.get_device_name(i)
        match = compute.catalog_match(torch_name)
        with torch.cuda.device(i):  # CUDA events are recorded on the current device's stream
            out.append((f"cuda:{i}", measure_device(f"cuda:{i}", quick=options.quick, name=match or torch_name,
                                                    catalog_name=match, progress=progress)))
    return out


def unreliable_notes(profile: Profile) -> list[str]:
    """Return one note per figure whose spread stayed too wide after re-measuring."""
    notes = []
    for d in profile.device_types:
        bad = [f"{p.dtype} n={p.n}" for p in d.matmul if not p.timing.reliable]
        if bad:
            notes.append(f"{d.name}: matmul spread too wide (marked unreliable, not used for the best "
                         f"figure when a reliable one exists): {', '.join(bad)}")
    points = [(c, p) for c in profile.collectives for p in c.points]
    bad = [(c, p) for c, p in points if not p.timing.reliable]
    if bad:
        ops = ", ".join(dict.fromkeys(f"{c.op}/{c.group_size}" for c, _ in bad))
        notes.append(f"collectives: {len(bad)} of {len(points)} points kept a spread wider than "
                     f"{DEFAULT_MAX_REL_SPREAD:.0%} after re-measuring (marked unreliable; a busy machine?): {ops}")
    return notes


def check_emulation(emulate: tuple[EmulatedType, ...], measured: list[str]) -> None:
    """Raise ValueError when an emulated type's base is not measured, or its name is a measured
    type's or repeats."""
    seen: set[str] = set()
    for e in emulate:
        if e.base not in measured:
            raise ValueError(f"--emulate {e.name}={e.base}*{e.slowdown:g}: the base must be a measured device "
                             f"type ({', '.join(measured)}), not {e.base!r}")
        if e.name in measured or e.name in seen:
            raise ValueError(f"--emulate {e.name}=...: {e.name!r} is already "
                             f"{'a measured type' if e.name in measured else 'emulated'}")
        seen.add(e.name)


def run_profile(options: ProfileOptions = ProfileOptions(), progress: Progress = no_progress) -> Profile:
    """Measure this machine and return its Profile (nothing is written; call `.save(path)`)."""
    import torch

    kind = resolve_device(options.device)
    host = socket.gethostname() or "localhost"
    stages = ["devices"] + (["collectives"] if options.collectives else []) + \
        (["layers"] if options.layers else []) + (["validate"] if options.validate and options.layers else [])
    done = 0

    def step(message: str) -> None:
        progress(done / len(stages), message)

    measured = local_devices(kind, options, step)
    done += 1
    types = merge_same_types([d for _, d in measured])
    check_emulation(options.emulate, [t.name for t in types])
    notes: list[str] = []
    if kind == "cpu":
        notes.append(f"no GPU profiled: the CPU counts as {options.cpu_ranks} devices of "
                     f"{types[0].threads} thread(s) each (gloo processes)"
                     + ("; matmul, copy and layers timed by process CPU time" if types[0].threads == 1 else "")
                     + "; each layer call timed after an idle wait as long as the call before it (as a "
                       "pipeline stage's ops follow a receive)")
    collectives: list[CollectiveProfile] = []
    links: list[ProfileLink] = []
    n = len(measured) if kind == "cuda" else options.cpu_ranks
    if options.collectives and n >= 2:
        step(f"collectives among {n} {'GPUs (NCCL)' if kind == 'cuda' else 'CPU processes (gloo)'}")
        top = (256 if kind == "cuda" and not options.quick else 64) * coll.MiB
        collectives = coll.measure_local(
            n, backend="nccl" if kind == "cuda" else "gloo", node=host,
            sizes=coll.sizes_between(4 * coll.KiB, top, 8 if options.quick else 4),
            repeats=3 if options.quick else 5, threads=types[0].threads or 1)
        links = [link for c in collectives if (link := coll.link_from(c, host, host)) is not None]
        done += 1
    elif options.collectives:
        notes.append("one local device: no intra-node collectives measured")
        done += 1
    tables, checks = [], []
    if options.layers:
        dev, dev_type = measured[0]
        if kind == "cuda":
            torch.cuda.set_device(dev)
        if options.config is not None:
            plan = layers.exact_layer_plan(options.config, dev, seq_lens=list(options.seq_lens) or [128],
                                           micro_batches=list(options.micro_batches) or [1, 2, 4])
        else:
            plan = layers.layer_plan(options.model, dev, quick=options.quick)
        if plan.note:
            notes.append(plan.note)
        with torch_threads(dev_type.threads or torch.get_num_threads()):
            tables.append(layers.layer_table(plan, dev, dev_type.name, repeats=3 if options.quick else 5,
                                             progress=step))
            done += 1
            if options.validate:
                checks = layers.validate_stacks(tables[0], dev, stacks=options.stacks,
                                                rounds=2 if options.quick else 3,
                                                repeats=3 if options.quick else 5, progress=step)
                done += 1
    profile = Profile(created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), host=host,
                      torch_version=torch.__version__, quick=options.quick, notes=notes, device_types=types,
                      nodes=[ProfileNode(name=host, devices={t.name: t.count for t in types})],
                      links=links, collectives=collectives, layers=tables, validation=checks,
                      emulated=list(options.emulate))
    progress(1.0, "done")
    return profile.model_copy(update={"notes": notes + unreliable_notes(profile)})
