"""Join profiles taken separately (one per machine) into one, with declared links between them.

Device types of the same name are one type: their counts add up and the slowest device's figures
stand for the type (so plans never over-promise). Node names must be distinct. Links declared on
the command line (`a:b:bandwidth:latency`) are added, replacing a measured link of the same pair.
"""

from __future__ import annotations

import datetime as _dt
from itertools import combinations

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.profile import MeasuredDeviceType, Profile, ProfileLink, ProfileNode


def merge_same_types(devices: list[MeasuredDeviceType]) -> list[MeasuredDeviceType]:
    """Return one entry per device type name: counts summed, figures of the slowest device kept.

    The slowest device is the one with the lowest best matmul rate over its dtypes.
    """
    by_name: dict[str, list[MeasuredDeviceType]] = {}
    for d in devices:
        by_name.setdefault(d.name, []).append(d)
    out = []
    for group in by_name.values():
        slowest = min(group, key=lambda d: max(d.matmul_tflops.values(), default=0.0))
        out.append(slowest.model_copy(update={"count": sum(d.count for d in group)}))
    return out


def parse_link(text: str) -> ProfileLink:
    """Return the link written as "a:b:bandwidth:latency" (e.g. "n0:n1:100Gbps:5us"; bare numbers are
    GB/s and seconds). Raises InputError naming the part that is wrong."""
    parts = text.split(":")
    if len(parts) != 4 or not all(parts):
        raise InputError.at(None, "--link", text, "NODE_A:NODE_B:BANDWIDTH:LATENCY, e.g. n0:n1:100Gbps:5us")
    a, b, bw, lat = parts
    return validate(ProfileLink, {"a": a, "b": b, "bandwidth_GBps": bw, "latency_s": lat}, file="--link")


def merge_profiles(profiles: list[Profile], links: list[ProfileLink] | None = None,
                   names: list[str] | None = None) -> Profile:
    """Return one profile holding the devices, nodes, links, collectives and layer tables of all.

    `names` labels the inputs in error messages (file names). Raises InputError when two profiles
    hold a node of the same name or a declared link names an unknown node.
    """
    names = names or [f"profile {i}" for i in range(len(profiles))]
    owner: dict[str, str] = {}
    nodes: list[ProfileNode] = []
    for p, label in zip(profiles, names):
        for n in p.nodes:
            if n.name in owner:
                raise InputError(f"node {n.name!r} is in both {owner[n.name]} and {label}: merge profiles of "
                                 "different machines (each node name once)", field="nodes", value=n.name)
            owner[n.name] = label
            nodes.append(n)
    merged_links = {frozenset((l.a, l.b)): l for p in profiles for l in p.links}
    for l in links or []:
        for end in (l.a, l.b):
            if end not in owner:
                raise InputError.at("--link", "a" if end == l.a else "b", end,
                                    f"a node of the merged profiles ({', '.join(owner)})")
        merged_links[frozenset((l.a, l.b))] = l
    notes = [f"{p.host}: {n}" for p in profiles for n in p.notes]
    for label_a, label_b in combinations(dict.fromkeys(owner.values()), 2):
        a_nodes = [n for n, o in owner.items() if o == label_a]
        b_nodes = [n for n, o in owner.items() if o == label_b]
        missing = [(x, y) for x in a_nodes for y in b_nodes if frozenset((x, y)) not in merged_links]
        if missing:
            notes.append(f"no link declared between {label_a} and {label_b} "
                         f"({', '.join(f'{x}-{y}' for x, y in missing)}): solvers use the cluster's default "
                         "inter-node link; declare one with --link A:B:BANDWIDTH:LATENCY")
    return Profile(
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        host="+".join(p.host for p in profiles), torch_version=profiles[0].torch_version,
        quick=any(p.quick for p in profiles), notes=notes,
        device_types=merge_same_types([d for p in profiles for d in p.device_types]),
        nodes=nodes, links=list(merged_links.values()),
        collectives=[c for p in profiles for c in p.collectives],
        layers=[t for p in profiles for t in p.layers],
        validation=[v for p in profiles for v in p.validation])
