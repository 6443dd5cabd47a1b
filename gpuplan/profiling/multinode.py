"""Profile several nodes at once under torchrun: one process per device, rank 0 writes one profile.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m gpuplan.profiling.multinode -o cluster-profile.json [--quick] [--model NAME]

Every rank measures its own device; each node's ranks time the collectives among themselves;
the node leaders (local rank 0) time point-to-point send/recv pairwise, one pair at a time; all
ranks time the cross-node collectives; each leader times the layer table of its device type;
rank 0 gathers everything and writes the merged profile.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import socket
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from gpuplan.models.profile import LayerTable, Profile, ProfileNode
from gpuplan.profiling import collectives as coll
from gpuplan.profiling import layers
from gpuplan.profiling.merge import merge_same_types
from gpuplan.profiling.profile import ProfileOptions, cpu_threads, measure_device, torch_threads, unreliable_notes
from gpuplan.profiling.compute import catalog_match


@dataclass(frozen=True)
class Topology:
    """Where this rank sits: global rank and size, rank within its node, node count and index."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node_index: int


def topology_from_env() -> Topology:
    """Return the Topology torchrun describes in RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK."""
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    return Topology(rank, world, int(env.get("LOCAL_RANK", rank % local_world)), local_world,
                    int(env.get("GROUP_RANK", rank // local_world)))


def _node_names(topo: Topology) -> list[str]:
    """Return the name of every node (by node index): its host name, suffixed when hosts repeat."""
    import torch.distributed as dist

    mine = (topo.node_index, socket.gethostname() or "node")
    everyone: list[Any] = [None] * topo.world
    dist.all_gather_object(everyone, mine)
    hosts = dict(sorted(set(everyone)))
    repeated = len(set(hosts.values())) < len(hosts)
    return [f"{hosts[i]}-{i}" if repeated else hosts[i] for i in sorted(hosts)]


def profile_ranks(topo: Topology, options: ProfileOptions, *, backend: str,
                  max_message_bytes: int | None = None) -> Profile | None:
    """Measure this rank's part of a multi-node profile; return the merged Profile on rank 0, else None.

    Every rank of the initialised process group must call this with the same options.
    """
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    names = _node_names(topo)
    node = names[topo.node_index]
    threads = None if cuda else cpu_threads(topo.local_world)
    with torch_threads(threads or torch.get_num_threads()):
        if cuda:
            torch_name = torch.cuda.get_device_name(device)
            match = catalog_match(torch_name)
            mine = measure_device(device, quick=options.quick, name=match or torch_name, catalog_name=match)
        else:
            from gpuplan.profiling.memory import capacity_bytes

            mine = measure_device("cpu", quick=options.quick, name="cpu", catalog_name=None, threads=threads,
                                  memory_bytes=capacity_bytes("cpu") // topo.local_world)
    top = max_message_bytes or ((64 if options.quick else 256) if cuda else 64) * coll.MiB
    sizes = coll.sizes_between(4 * coll.KiB, top, 8 if options.quick else 4)
    repeats = 3 if options.quick else 5
    everyone: list[Any] = [None] * topo.world
    dist.all_gather_object(everyone, (topo.rank, topo.node_index, topo.local_rank))
    ranks_of = {i: [r for r, n, _ in everyone if n == i] for i in range(len(names))}
    leaders = [min(ranks_of[i]) for i in range(len(names))]
    # Every rank creates every group, in the same order (torch.distributed requires it).
    node_groups = {i: dist.new_group(ranks_of[i]) for i in range(len(names))}
    pair_groups = {(i, j): dist.new_group([leaders[i], leaders[j]]) for i, j in combinations(range(len(names)), 2)}
    collected: dict[str, Any] = {"device": mine.model_dump(mode="json"), "node": node, "intra": None,
                                 "pairs": {}, "layers": None}
    if options.collectives and topo.local_world >= 2:
        collected["intra"] = coll.sweep(coll.OPS, sizes, group=node_groups[topo.node_index], device=device,
                                        repeats=repeats)
    for (i, j), group in pair_groups.items():
        if topo.rank in (leaders[i], leaders[j]):
            collected["pairs"][f"{i}-{j}"] = coll.sweep(["send_recv"], sizes, group=group, device=device,
                                                        repeats=repeats)
        dist.barrier()  # one pair at a time, so pairs do not share the network
    cross = None
    if options.collectives and len(names) > 1:
        cross = coll.sweep(coll.OPS, sizes, device=device, repeats=repeats)
    if options.layers and topo.rank in leaders:
        plan = layers.layer_plan(options.model, device, quick=options.quick)
        with torch_threads(threads or torch.get_num_threads()):
            collected["layers"] = layers.layer_table(plan, device, mine.name, repeats=repeats).model_dump(mode="json")
    gathered: list[Any] = [None] * topo.world
    dist.gather_object(collected, gathered if topo.rank == 0 else None, dst=0)
    if topo.rank != 0:
        return None
    return _assemble(gathered, names, cross, backend=backend, quick=options.quick)


def _assemble(gathered: list[dict[str, Any]], names: list[str], cross: Any, *, backend: str,
              quick: bool) -> Profile:
    """Return the Profile built on rank 0 from every rank's measurements."""
    import torch

    from gpuplan.models.profile import MeasuredDeviceType

    devices = [MeasuredDeviceType.model_validate(g["device"]) for g in gathered]
    nodes = []
    collectives, links = [], []
    for i, name in enumerate(names):
        mine = [d for d, g in zip(devices, gathered) if g["node"] == name]
        counts: dict[str, int] = {}
        for d in mine:
            counts[d.name] = counts.get(d.name, 0) + 1
        nodes.append(ProfileNode(name=name, devices=counts))
        intra = next((g["intra"] for g in gathered if g["node"] == name and g["intra"]), None)
        if intra:
            found = coll.to_profiles(intra, backend=backend, group_size=len(mine), nodes=[name])
            collectives += found
            links += [l for c in found if (l := coll.link_from(c, name, name)) is not None]
    seen: set[str] = set()
    for g in gathered:
        for key, raw in g["pairs"].items():
            if key in seen:
                continue  # both leaders of a pair hold the same (max-reduced) timings: keep one
            seen.add(key)
            i, j = (int(x) for x in key.split("-"))
            found = coll.to_profiles(raw, backend=backend, group_size=2, scope="inter_node", nodes=[names[i], names[j]])
            collectives += found
            links += [l for c in found if (l := coll.link_from(c, names[i], names[j])) is not None]
    if cross:
        collectives += coll.to_profiles(cross, backend=backend, group_size=len(gathered), scope="inter_node",
                                        nodes=list(names))
    tables: dict[str, LayerTable] = {}
    for g in gathered:
        if g["layers"]:
            t = LayerTable.model_validate(g["layers"])
            tables.setdefault(t.costs[0].device_type if t.costs else t.model, t)
    profile = Profile(created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                      host="+".join(names), torch_version=torch.__version__, quick=quick,
                      device_types=merge_same_types(devices), nodes=nodes, links=links,
                      collectives=collectives, layers=list(tables.values()))
    return profile.model_copy(update={"notes": unreliable_notes(profile)})


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: measure, and on rank 0 write the profile. Returns the exit code."""
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m gpuplan.profiling.multinode")
    parser.add_argument("-o", "--output", default="profile.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default=ProfileOptions.model)
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--no-layers", action="store_true")
    parser.add_argument("--max-bytes", type=int, default=None, help="largest collective message (bytes)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        parser.error("run under torchrun (RANK and WORLD_SIZE are not set); on one machine use `gpuplan profile`")
    topo = topology_from_env()
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda, but torch sees no CUDA device here")
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(topo.local_rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method="env://")
    try:
        options = ProfileOptions(quick=args.quick, model=args.model, layers=not args.no_layers)
        profile = profile_ranks(topo, options, backend=backend, max_message_bytes=args.max_bytes)
        if profile is not None:
            profile.save(args.output)
            print(f"profile of {len(profile.nodes)} node(s), {topo.world} rank(s) written to {args.output}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
