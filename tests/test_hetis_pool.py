"""Hetis: decode attention pooled over ALL GPUs (other replicas' primaries included), priced honestly.

The engines of every data-parallel replica run together (gpuplan.models.hetis.policy._run_pooled): each
device's KV memory counts every replica's KV on it, a device busy with another replica's work stretches
this replica's attention on it, a head off the replica's own primaries pays the link (messages per
layer, prompt KV shipped at prefill)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import gpuplan
from gpuplan.models.hetis import HetisPlan, Replica, Stage
from gpuplan.models.hetis import policy as pol
from gpuplan.models.hetis.cost import gpus_of, head_bytes_per_token, kv_capacity, link_of
from gpuplan.solvers.hetis import hetis_layout_plan

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "examples" / "hetis" / "small.yaml"


@pytest.fixture(scope="module")
def problem() -> gpuplan.models.base.Problem:
    doc = yaml.safe_load(SMALL.read_text())
    doc["trace"] = {**doc["trace"], "lengths": str(ROOT / "examples" / "serving" / "sharegpt-sample.csv"),
                    "requests": 60}
    doc["search"] = {"low_per_s": 1, "high_per_s": 16, "rel_tol": 0.25}
    return gpuplan.load_problem(doc)


def _two_replicas(problem: object) -> HetisPlan:
    """One replica on the A100s (0, 1), one on the 3090s (2, 3), shares 0.2 / 0.8 (the 3090s
    overloaded), pooled dispatch."""
    reps = [Replica(stages=[Stage(devices=[0, 1], layers=problem.config.num_layers)], share=0.2),
            Replica(stages=[Stage(devices=[2, 3], layers=problem.config.num_layers)], share=0.8)]
    return hetis_layout_plan(problem, reps)


def _watch(monkeypatch: pytest.MonkeyPatch) -> list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """Record, after every pooled iteration, (KV bytes per device over all engines, capacity, each engine's
    heads per device)."""
    seen: list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = []
    real = pol.apply_iteration

    def spy(state: object, sub: object, policy: pol.HetisEnginePolicy, it: object) -> None:
        real(state, sub, policy, it)
        p = policy.pool
        seen.append((p.used.sum(axis=0).copy(), p.cap_bytes.copy(), [policy.n.sum(axis=0).copy()]))
    monkeypatch.setattr(pol, "apply_iteration", spy)
    return seen


def test_pooled_memory_counts_every_replicas_kv_and_heads_cross_replicas(problem: object,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _two_replicas(problem)
    seen = _watch(monkeypatch)
    res, stats = pol.simulate_plan(problem, plan, problem.requests(12.0))
    assert seen and np.all(res.served() | res.rejected)
    for used, cap, _ in seen:
        assert np.all(used <= cap * (1 + 1e-9) + 1e-6)  # every replica's KV on a device within its capacity
    # the replicas' heads are not confined to their own primaries: some land on the other replica's
    own = {0: {0, 1}, 1: {2, 3}}
    crossed = False
    for sub_pol in _policies(problem, plan, monkeypatch):
        ids = sub_pol.s.kv_ids.tolist()
        heads = sub_pol.n.sum(axis=0)
        crossed |= any(heads[k] > 0 for k, d in enumerate(ids) if d not in own[sub_pol.s.replica])
    assert crossed
    assert stats["shipped_bytes"] > 0  # the prompt KV of those heads travelled


def _policies(problem: object, plan: HetisPlan, monkeypatch: pytest.MonkeyPatch) -> list[pol.HetisEnginePolicy]:
    made: list[pol.HetisEnginePolicy] = []
    real = pol.HetisEnginePolicy.__init__

    def init(self: pol.HetisEnginePolicy, *a: object, **k: object) -> None:
        real(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(pol.HetisEnginePolicy, "__init__", init)
    pol.simulate_plan(problem, plan, problem.requests(12.0))
    return made


def test_prompt_kv_shipped_to_remote_heads_is_priced_by_the_link(problem: object) -> None:
    plan = _two_replicas(problem)
    spec = pol._virtual_engines(problem, plan, plan.replicas[0], False, 0)[0]
    p = pol.HetisEnginePolicy(problem, spec, 2, pol.KvPool(spec.cap_bytes.copy(), [0]), 0)
    H = problem.config.kv
    ids = spec.kv_ids.tolist()
    p.n[0] = 0
    p.n[0, ids.index(0)] = H - 5          # own primary: nothing to ship
    p.n[0, ids.index(3)] = 5              # the other replica's primary: 5 heads over the node link
    g = {x.id: x for x in gpus_of(problem)}
    bw, lat = link_of(problem, g[3], g[0])
    want = lat + 300 * 5 * head_bytes_per_token(problem) / bw
    assert p._ship_s(np.array([0]), np.array([300])) == pytest.approx(want, rel=1e-12)
    p.n[0] = 0
    p.n[0, ids.index(1)] = H
    assert p._ship_s(np.array([0]), np.array([300])) == 0.0


def test_another_replicas_load_stretches_attention_on_its_devices(problem: object) -> None:
    pool = pol.KvPool(np.ones(4), [0, 1])
    w = pol.LOAD_WINDOW_S
    # replica 1 keeps its 3090s busy 50 % of a step of one window: its moving average rises to 0.5 (1 - 1/e)
    pool.record(1, np.array([0.0, 0.0, 0.5 * w, 0.5 * w]), 0.0, w)
    want = 0.5 * (1 - np.exp(-1.0))
    assert pool.others_load(0, w).tolist() == pytest.approx([0.0, 0.0, want, want])
    assert pool.others_load(0, 2 * w).tolist() == pytest.approx([0.0, 0.0, want / np.e, want / np.e])  # idle decays
    assert pool.others_load(1, w).tolist() == [0.0] * 4   # an engine's own replica is not "other"
    for k in range(50):                                   # a device never gives another replica < 5 % of its time
        pool.record(1, np.array([0.0, 0.0, w, w]), (1 + k) * w, w)
    assert max(pool.others_load(0, 51 * w)) == pol.MAX_FOREIGN_LOAD


def test_dispatch_weighs_the_delay_a_head_causes_on_another_replicas_primary(problem: object) -> None:
    plan = _two_replicas(problem)
    spec = pol._virtual_engines(problem, plan, plan.replicas[0], False, 0)[0]
    assert spec.foreign.tolist() == [d in (2, 3) for d in spec.kv_ids.tolist()]
    assert spec.own.tolist() == [d in (0, 1) for d in spec.kv_ids.tolist()]


def test_pooled_capacity_is_the_whole_device_not_a_share(problem: object) -> None:
    plan = _two_replicas(problem)
    cap = kv_capacity(problem, plan.replicas, plan.attention_devices)
    for k, r in enumerate(plan.replicas):
        spec = pol._virtual_engines(problem, plan, r, False, k)[0]
        assert spec.kv_ids.tolist() == sorted(plan.attention_devices)
        assert spec.cap_bytes.tolist() == [cap[d] for d in spec.kv_ids.tolist()]
