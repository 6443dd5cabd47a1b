"""Hetis on valid inputs unlike the shipped examples (the outside-style sweep's findings).

1. Clusters of catalog GPU types (the shipped examples declare most types inline): every cost-model
   call re-validated each device's catalog entry into a DeviceType, 380k pydantic validations for one
   Splitwise-style enumeration on a 14-GPU cluster (23 s of a 5 s limit); a catalog type is now
   validated once per name for every cluster (gpuplan.models.cluster).
2. The HexGen-style and Splitwise-style searches started their time limit after enumerating their
   candidates, so a long enumeration overran the limit with status `feasible`.
"""

from __future__ import annotations

import time

import pytest

import gpuplan
import gpuplan.solvers.hetis as hs
from gpuplan.models.cluster import DeviceType, _catalog_device_type
from gpuplan.models.hetis.cost import gpus_of


def _catalog_problem() -> object:
    """Four catalog types on four nodes (T4 x 8, H100, H100-PCIe x 1 and x 4), Llama-2-7B."""
    return gpuplan.load_problem({
        "kind": "hetis", "name": "catalog-mix", "model": "llama2-7b", "dtype": "fp16",
        "cluster": {"nodes": [{"name": "t4", "gpus": {"T4": 8}}, {"name": "h", "gpus": {"H100": 1}},
                              {"name": "p1", "gpus": {"H100-PCIe": 1}}, {"name": "p4", "gpus": {"H100-PCIe": 4}}],
                    "inter_node": {"bandwidth_GBps": "100 Gbps", "latency_s": "20us"}},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "trace": {"rate_per_s": 1.0, "requests": 20, "lengths": "sample"},
        "search": {"low_per_s": 0.5, "high_per_s": 20, "rel_tol": 0.2}})


def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Count DeviceType validations from here on, with the catalog's cache emptied."""
    calls: list[object] = []
    real = DeviceType.model_validate.__func__
    monkeypatch.setattr(DeviceType, "model_validate",
                        classmethod(lambda cls, obj, **kw: calls.append(obj) or real(cls, obj, **kw)))
    _catalog_device_type.cache_clear()
    return calls


def test_catalog_types_are_validated_once_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    prob = _catalog_problem()
    calls = _count_validations(monkeypatch)
    first = gpus_of(prob)
    for _ in range(100):
        assert gpus_of(prob) == first
    assert len(calls) == 3                      # T4, H100, H100-PCIe
    assert [g.id for g in first] == [d.id for d in prob.cluster.devices]
    other = gpuplan.load_problem({**prob.document(), "dtype": "fp32"})   # another problem: its own figures
    assert gpus_of(other)[0].peak_flops < first[0].peak_flops
    assert prob.cluster.type_of("T4") is other.cluster.type_of("t4")     # one frozen record shared


def test_splitwise_enumeration_validates_each_catalog_type_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count, not a timing (the machines are shared): the enumeration validated a catalog entry
    382,518 times on this cluster (7.5 s of CPU); each of its three catalog types is now validated once."""
    prob = _catalog_problem()
    calls = _count_validations(monkeypatch)
    cands = hs.splitwise_configurations(prob)
    assert cands and len(calls) == 3


@pytest.mark.parametrize("solver,enumerate_fn", [("splitwise", "splitwise_configurations"),
                                                 ("hexgen", "hexgen_configurations")])
def test_enumeration_counts_against_the_time_limit(monkeypatch: pytest.MonkeyPatch, solver: str,
                                                   enumerate_fn: str) -> None:
    prob = gpuplan.load_problem({**gpuplan.load_problem("examples/hetis/small.yaml").document(),
                                 "trace": {"rate_per_s": 4, "requests": 20, "lengths": "sample", "seed": 0}})
    real = getattr(hs, enumerate_fn)

    def slow(problem: object) -> object:
        out = real(problem)
        time.sleep(1.5)                     # an enumeration longer than the whole limit
        return out

    n = len(real(prob)) if solver == "splitwise" else len(hs._proxy_picks(real(prob)))
    assert n >= 2
    monkeypatch.setattr(hs, enumerate_fn, slow)
    # candidates rated instantly (the figures are not the point here): only the enumeration takes time
    monkeypatch.setattr(hs, "static_search", lambda problem, replicas: (1.0, 1.1))
    monkeypatch.setattr(hs, "rate_search", lambda problem, plan: (1.0, 1.1))
    monkeypatch.setattr(hs, "finish_plan", lambda problem, plan, searched=None: plan)
    plan = gpuplan.solve(prob, solver=solver, time_limit_s=1.0)
    assert plan.status.value == "time_limit"
    assert "time limit" in plan.message
