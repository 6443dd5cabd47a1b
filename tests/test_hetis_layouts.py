"""Hetis' extended layout space (TP degree per server type, servers split into TP groups): the knapsack over
replica shapes finds what exhaustive enumeration of every grouping finds, and head-wise dispatch over a
layout never serves less than the static engine on the same layout."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

import gpuplan
from gpuplan.models.hetis import HetisPlan, max_rate_per_s
from gpuplan.models.plan import Status
from gpuplan.solvers import hetis as H

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "examples" / "hetis" / "small.yaml"
SAMPLE = ROOT / "examples" / "serving" / "sharegpt-sample.csv"


def set_partitions(items: list[int]) -> list[list[list[int]]]:
    """Return every partition of `items` into non-empty blocks (the exhaustive reference)."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for part in set_partitions(rest):
        out.append([[first]] + part)
        for k in range(len(part)):
            out.append(part[:k] + [[first] + part[k]] + part[k + 1:])
    return out


def _problem(nodes: list[dict] | None = None, requests: int = 60) -> object:
    doc = yaml.safe_load(SMALL.read_text())
    if nodes is not None:
        doc["cluster"]["nodes"] = nodes
    doc["trace"] = {**doc["trace"], "lengths": str(SAMPLE), "requests": requests}
    doc["search"] = {"low_per_s": 1, "high_per_s": 16, "rel_tol": 0.25}
    return gpuplan.load_problem(doc)


THREE = [{"name": "a100", "gpus": {"A100-80GB": 2}, "intra_link": {"bandwidth_GBps": 25, "latency_s": "5us"}},
         {"name": "g3090", "gpus": {"RTX3090": 2}, "intra_link": {"bandwidth_GBps": 25, "latency_s": "5us"}},
         {"name": "g3090b", "gpus": {"RTX3090": 2}, "intra_link": {"bandwidth_GBps": 25, "latency_s": "5us"}}]


def _exhaustive(problem: object) -> dict[int, float]:
    """Best dense proxy (tokens/s) per primary-GPU count over every symmetric TP choice per server type,
    every subset of the resulting groups and every partition of it into pipelines (brute force)."""
    types = {d.id: d.type for d in problem.cluster.devices}
    speed = {d.id: d.peak_flops for d in H.gpus_of(problem)}
    servers: dict[tuple[str, str], list[int]] = {}
    for d in problem.cluster.devices:
        servers.setdefault((d.node, d.type), []).append(d.id)
    kind_of = {}
    for ids in servers.values():
        kind_of.setdefault((types[ids[0]], len(ids)), []).append(ids)
    cfg = problem.config
    options = {k: [t for t in range(1, k[1] + 1) if k[1] % t == 0 and cfg.heads % t == 0 and cfg.kv % t == 0]
               for k in kind_of}
    best: dict[int, float] = {}
    for ts in itertools.product(*options.values()):
        groups = [ids[j:j + t] for k, t in zip(options, ts) for ids in kind_of[k] for j in range(0, len(ids), t)]
        for r in range(1, len(groups) + 1):
            for subset in itertools.combinations(groups, r):
                for part in set_partitions(list(range(r))):
                    tot, gpus = 0.0, 0
                    for block in part:
                        blk = sorted((subset[k] for k in block), key=lambda g: (-speed[g[0]] * len(g), g[0]))
                        stages = H.pipeline(problem, blk)
                        if stages is not None:
                            tot += H._replica_rate_proxy(problem, stages)
                            gpus += sum(len(g) for g in blk)
                    if gpus:
                        best[gpus] = max(best.get(gpus, 0.0), tot)
    return best


@pytest.mark.parametrize("nodes", [None, THREE], ids=["2xA100+2x3090", "2xA100+2x3090+2x3090"])
def test_search_equals_exhaustive_enumeration_of_the_extended_space(nodes: list[dict] | None) -> None:
    problem = _problem(nodes)
    brute = _exhaustive(problem)
    found: dict[int, float] = {}
    for proxy, reps in H.configurations(problem):
        n = H.primaries_of(reps)
        found[n] = max(found.get(n, 0.0), proxy)
    assert set(found) == set(brute)
    for n, v in brute.items():
        assert found[n] == pytest.approx(v, rel=1e-9), n
    assert max(p for p, _ in H.configurations(problem)) == pytest.approx(max(brute.values()), rel=1e-9)


def test_the_space_splits_servers_into_smaller_tp_groups() -> None:
    problem = _problem()
    tps = {tuple(len(s.devices) for r in reps for s in r.stages) for _, reps in H.configurations(problem)}
    assert any(all(t == 1 for t in x) for x in tps)  # every stage TP 1
    assert any(2 in x for x in tps)                   # and whole-server TP 2
    best = H.configurations(problem)[0][1]
    assert gpuplan.check(problem, gpuplan.solve(problem, solver="hexgen")) == []
    assert len(best) >= 2                             # a server of 2 A100s serves as two replicas


LAYOUTS = {"tp1 x2": [[[0]], [[1]]], "tp1 x2 + 3090 pipeline": [[[0]], [[1]], [[2], [3]]],
           "tp2": [[[0, 1]]], "tp2 + tp2": [[[0, 1]], [[2, 3]]]}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_head_dispatch_never_serves_less_than_the_static_engine_on_the_same_layout(name: str) -> None:
    problem = _problem(requests=80)
    reps = H.dp_layout(problem, LAYOUTS[name])
    assert reps is not None
    static = max_rate_per_s(problem, HetisPlan(kind="hetis", status=Status.FEASIBLE, replicas=reps))
    pooled = max_rate_per_s(problem, H.hetis_layout_plan(problem, reps))
    assert pooled >= static


def test_stage_a_never_keeps_less_than_each_candidates_static_engine() -> None:
    problem = _problem(requests=80)
    _, table = H.stage_a(problem)
    for row, (_, reps) in zip(table, H.stage_a_candidates(problem)):
        assert row["max_rate_per_s"] >= H.static_search(problem, reps)[0]
    plan = gpuplan.solve(problem, solver="hetis")
    assert gpuplan.check(problem, plan) == []
    assert plan.objective >= gpuplan.solve(problem, solver="hexgen").objective / (1 + problem.delta)
