"""Fidelity section (b): the collective model against published NCCL all_reduce bus bandwidth.

Each series of benchmarks/data/nccl_tests_published.yaml (hardware as a gpuplan cluster, source,
(size, busbw) points, and the NCCL_ALGO the run set, if any) is predicted three ways, nothing fitted
to the published figures:

- est: NCCL 2.30.7's own estimate (latency + size / bandwidth) of its default (algorithm, protocol)
  on the graphs its topology search would build (collectives.nccl_estimate_s);
- nccl: that estimate plus NCCL's kernel pipeline (nccl_tuning.pipeline_us: Simple's per-slice
  handshake on the ring, the NVLS stage fill, the broadcast / reduce chain fill) at the same choice
  (collectives.collective_time_s, what Poseidon calls);
- lagom: Lagom's extended model (the same pipeline, flow control, thread saturation, measured NVLink
  step latency) at that same default setting (collectives.lagom_time_s, what Lagom's plans are
  costed with).

busbw = 2(n-1)/n x size / time (nccl-tests); ratio = predicted / published; target within 25%.

Each series carries a provenance grade (table, statement, not-nccl-tests, extrapolated); the summary
counts points per grade.

Run alone: .venv/bin/python benchmarks/fidelity_lagom.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

DATA = ROOT / "data" / "nccl_tests_published.yaml"
TOLERANCE = 0.25


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            q = n / div
            return f"{q:g} {unit}" if q == int(q) else f"{q:.1f} {unit}"
    return f"{n} B"


def clusters_of(series: dict[str, Any]) -> list[tuple[str, Any, int]]:
    """Return (label, Cluster, ranks) for every hardware shape a series describes."""
    from gpuplan.models.cluster import Cluster

    if "cluster_per_nodes" in series:
        spec = series["cluster_per_nodes"]
        out = []
        for n in series["nodes"]:
            doc = {"nodes": [{"name": f"n{i}", "gpus": {spec["gpu"]: spec["gpus_per_node"]}} for i in range(n)],
                   "inter_node": {"bandwidth_GBps": spec["nic"], "nics_per_node": spec["nics_per_node"]}}
            out.append((f"{n}x{spec['gpus_per_node']} {spec['gpu']}", Cluster.model_validate(doc),
                        n * spec["gpus_per_node"]))
        return out
    cluster = Cluster.model_validate(series["cluster"])
    per_node = {n.name: sum(n.gpus.values()) for n in cluster.nodes}
    label = f"{len(per_node)}x{max(per_node.values())} {cluster.devices[0].type}"
    return [(label, cluster, int(series["ranks"]))]


def rows() -> list[dict[str, Any]]:
    """Return one dict per (series, hardware shape, size): published and predicted busbw (GB/s)."""
    from gpuplan.models.collectives import bus_bandwidth_GBps, lagom_time_s, nccl_choice, nccl_estimate_s
    from gpuplan.models.profile import bus_factor

    doc = yaml.safe_load(DATA.read_text())
    out = []
    for s in doc["series"]:
        for label, cluster, ranks in clusters_of(s):
            ids = list(range(ranks))
            algos = s.get("nccl_algo")          # NCCL_ALGO the run set (None: NCCL's default choice)
            ver = s.get("nccl_version")         # the NCCL the run used, as its source states
            for size, published in s["points"]:
                nccl = bus_bandwidth_GBps(cluster, "all_reduce", size, ids, algos=algos, nccl_version=ver)
                est_s = nccl_estimate_s(cluster, "all_reduce", size, ids, algos=algos, nccl_version=ver)
                est = bus_factor("all_reduce", ranks) * size / est_s / 1e9 if est_s else nccl
                lagom = bus_factor("all_reduce", ranks) * size / lagom_time_s(cluster, "all_reduce", size, ids,
                                                                              algos=algos, nccl_version=ver) / 1e9
                choice = nccl_choice(cluster, "all_reduce", size, ids, algos=algos, nccl_version=ver)
                out.append({"series": s["name"], "source": " ".join(s["source"].split()), "topology": label,
                            "provenance": s.get("provenance", "statement"),
                            "size": int(size), "published": float(published), "est": est, "nccl": nccl, "lagom": lagom,
                            "algo": f"{choice.algo}/{choice.proto}" if choice else "alpha-beta"})
    return out


def section_b() -> list[str]:
    """Return the printed lines of section (b): the table, the sources, and the summary lines."""
    table = rows()
    lines = [f"{'topology':<20} {'size':>9} {'published':>10} {'est':>8} {'ratio':>6} {'nccl':>8} {'ratio':>6} "
             f"{'lagom':>8} {'ratio':>6} {'in 25%':>7}  NCCL's choice",
             "-" * 120]
    sources: dict[str, str] = {}
    for r in table:
        rn, rl = r["nccl"] / r["published"], r["lagom"] / r["published"]
        ok = "yes" if abs(rl - 1) <= TOLERANCE else "no"
        ok_n = "yes" if abs(rn - 1) <= TOLERANCE else "no"
        tag = sources.setdefault(r["series"], f"[{len(sources) + 1}]")
        re_ = r["est"] / r["published"]
        lines.append(f"{r['topology']:<20} {_size(r['size']):>9} {r['published']:>10.2f} {r['est']:>8.2f} {re_:>6.2f} "
                     f"{r['nccl']:>8.2f} {rn:>6.2f} {r['lagom']:>8.2f} {rl:>6.2f} {ok + '/' + ok_n:>7}  {r['algo']} {tag}")
    lines.append("(in 25%: lagom/nccl; GB/s; ratio = predicted / published; est = NCCL's own latency + size / "
                 "bandwidth, nccl = est + the kernel pipeline)")
    for r in table:
        tag = sources.pop(r["series"], None)
        if tag:
            lines.append(f"{tag} {r['series']} ({r['provenance']}): {r['source']}")
    n = len(table)
    lag = sum(abs(r["lagom"] / r["published"] - 1) <= TOLERANCE for r in table)
    nc = sum(abs(r["nccl"] / r["published"] - 1) <= TOLERANCE for r in table)
    es = sum(abs(r["est"] / r["published"] - 1) <= TOLERANCE for r in table)
    big = [r for r in table if r["size"] >= 2**24]
    lag_big = sum(abs(r["lagom"] / r["published"] - 1) <= TOLERANCE for r in big)
    nc_big = sum(abs(r["nccl"] / r["published"] - 1) <= TOLERANCE for r in big)
    es_big = sum(abs(r["est"] / r["published"] - 1) <= TOLERANCE for r in big)
    lines.append(f"summary: lagom within 25% on {lag}/{n} points, nccl (estimate + pipeline) on {nc}/{n}, "
                 f"nccl's own estimate on {es}/{n}; at 16 MiB and above: lagom {lag_big}/{len(big)}, "
                 f"nccl {nc_big}/{len(big)}, estimate {es_big}/{len(big)}")
    for prov in ("table", "statement", "not-nccl-tests", "extrapolated"):
        sel = [r for r in table if r["provenance"] == prov]
        if sel:
            k_l = sum(abs(r["lagom"] / r["published"] - 1) <= TOLERANCE for r in sel)
            k_n = sum(abs(r["nccl"] / r["published"] - 1) <= TOLERANCE for r in sel)
            k_e = sum(abs(r["est"] / r["published"] - 1) <= TOLERANCE for r in sel)
            lines.append(f"  {prov}: lagom {k_l}/{len(sel)}, nccl {k_n}/{len(sel)}, estimate {k_e}/{len(sel)}")
    return lines


def main() -> int:
    """Print section (b); return 0."""
    for line in section_b():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
