"""Hetis Stage B: the water-filling dispatch against the exact CP-SAT optimum and the LP relaxation."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuplan.models.hetis.dispatch import (DispatchInstance, device_times, objective_s, proportional_split, violations,
                                           water_filling)
from gpuplan.models.plan import Status
from gpuplan.solvers.hetis_dispatch import cpsat_dispatch, lp_dispatch


@st.composite
def instances(draw: st.DrawFn) -> DispatchInstance:
    """Random batches arriving among 50 active requests: |G| 2..12 heterogeneous devices, H in {8, 40, 64},
    1..5 new requests of 1..3 data-parallel replicas pooling decode attention over all GPUs (each device a
    replica's primary or an attention worker; a replica pays messages on every device but its own primaries),
    the active requests' uneven load,
    message costs for some devices (attention workers), 1.5-4x a fair share of memory per device.
    (With far tighter memory the placement becomes a knapsack and the greedy can be several percent
    off: docs/hetis.md.)"""
    G = draw(st.integers(2, 12))
    H = draw(st.sampled_from([8, 40, 64]))
    R = draw(st.integers(1, 5))
    K = draw(st.integers(1, 3))                   # data-parallel replicas pooling their attention over all GPUs
    seed = draw(st.integers(0, 2**31 - 1))
    g = np.random.default_rng(seed)
    ctx = g.integers(16, 2048, R).astype(float)
    mem = ctx + g.integers(0, 512, R)
    s = g.uniform(2e-9, 4e-8, G)                  # s per head per context token: 25x spread, like A100 vs P100
    owner = np.where(g.random(G) < 0.6, -1, g.integers(0, K, G))  # -1: an attention worker, else k's primary
    remote = owner[None, :] != np.arange(K)[:, None]              # K x G: g is reached over a link by k
    c0 = np.where(remote, g.uniform(0, 2e-3, (K, G)), 0.0)
    c1 = np.where(remote, g.uniform(0, 4e-6, (K, G)), 0.0)
    sk = np.where(remote, s * 1.13, s)            # the storage overhead on remote heads
    # the load of 50 active requests already placed (the measurable goal's setting), unevenly, per replica
    base_heads = np.round(50 * H / G / K * g.uniform(0.5, 1.5, (K, G)))
    base = (sk * base_heads).sum(axis=0) * g.uniform(300, 1000, G)
    need = float(mem.sum() * H)
    free = g.uniform(1.5, 4.0, G) * need / G     # room for 1.5-4x a fair share: memory binds on some devices
    group = g.integers(0, K, R)
    if K == 1:
        return DispatchInstance(s, c0[0], c1[0], base, base_heads[0], free, ctx, mem.astype(float), H)
    return DispatchInstance(sk, c0, c1, base, base_heads, free, ctx, mem.astype(float), H, group)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances())
def test_water_filling_is_within_two_percent_of_cpsat(inst: DispatchInstance) -> None:
    wf = water_filling(inst)
    assume(wf is not None)
    assert violations(inst, wf) == []
    exact, status, _ = cpsat_dispatch(inst, time_limit_s=20.0, hint=wf)
    assert violations(inst, exact) == []
    opt = objective_s(inst, exact)
    got = objective_s(inst, wf)
    assert got <= opt * 1.02 + 1e-12, (got, opt, status)


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances())
def test_lp_bound_is_below_every_placement_and_rounding_covers_every_head(inst: DispatchInstance) -> None:
    wf = water_filling(inst)
    assume(wf is not None)
    n, bound = lp_dispatch(inst)
    assert (n.sum(axis=1) == inst.heads).all() and (n >= 0).all()
    assert bound <= objective_s(inst, wf) * (1 + 1e-6) + 1e-12
    assert bound <= objective_s(inst, n) * (1 + 1e-6) + 1e-12


def test_single_request_greedy_matches_exhaustive_search() -> None:
    """Two devices, one request: every split enumerated."""
    inst = DispatchInstance(np.array([1e-8, 3e-8]), np.array([0.0, 5e-5]), np.array([0.0, 1e-6]),
                            np.array([1e-4, 0.0]), np.array([10.0, 0.0]), np.array([1e9, 1e9]),
                            np.array([1000.0]), np.array([1200.0]), 40)
    best = min(objective_s(inst, np.array([[k, 40 - k]])) for k in range(41))
    assert abs(objective_s(inst, water_filling(inst)) - best) <= 1e-12


def test_water_filling_respects_memory_and_reports_when_nothing_fits() -> None:
    inst = DispatchInstance(np.array([1e-8, 1e-9]), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2),
                            np.array([40 * 100.0, 5 * 100.0]), np.array([100.0]), np.array([100.0]), 40)
    n = water_filling(inst)
    assert n[0, 1] <= 5 and n.sum() == 40          # the fast device fills its memory, the rest spills
    full = DispatchInstance(inst.s_per_head_token, inst.c0_s, inst.c1_s_per_head, inst.base_s, inst.base_heads,
                            np.array([10.0, 10.0]), inst.ctx_tokens, inst.mem_tokens, 40)
    assert water_filling(full) is None


def test_proportional_split_is_largest_remainder() -> None:
    assert proportional_split(np.array([3.0, 1.0]), 8).tolist() == [6, 2]
    assert proportional_split(np.array([1.0, 1.0, 1.0]), 40).tolist() == [14, 13, 13]
    assert proportional_split(np.array([0.0, 5.0]), 7).tolist() == [0, 7]


def test_cpsat_is_optimal_on_a_tiny_instance() -> None:
    inst = DispatchInstance(np.array([1e-8, 2e-8, 4e-8]), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3),
                            np.full(3, 1e9), np.array([500.0, 300.0]), np.array([500.0, 300.0]), 8)
    n, status, bound = cpsat_dispatch(inst, time_limit_s=10)
    assert status is Status.OPTIMAL
    brute = min(objective_s(inst, np.array([[a, b, 8 - a - b], [c, d, 8 - c - d]]))
                for a in range(9) for b in range(9 - a) for c in range(9) for d in range(9 - c))
    assert objective_s(inst, n) <= brute * (1 + 1e-6)


def test_cpsat_is_optimal_on_a_tiny_pooled_instance() -> None:
    # two replicas: device 0 is replica 0's primary, device 1 replica 1's, device 2 a worker; a replica
    # pays a message latency once on any device that is not its own primary
    S = np.array([[1e-8, 1.13e-8, 4.5e-8], [1.13e-8, 1e-8, 4.5e-8]])
    c0 = np.array([[0.0, 2e-5, 2e-5], [2e-5, 0.0, 2e-5]])
    c1 = np.array([[0.0, 1e-7, 1e-7], [1e-7, 0.0, 1e-7]])
    inst = DispatchInstance(S, c0, c1, np.array([4e-5, 0.0, 0.0]), np.array([[8, 0, 0], [0, 0, 0]]),
                            np.full(3, 1e9), np.array([500.0, 300.0]), np.array([500.0, 300.0]), 8,
                            np.array([0, 1]))
    n, status, _ = cpsat_dispatch(inst, time_limit_s=10)
    assert status is Status.OPTIMAL
    brute = min(objective_s(inst, np.array([[a, b, 8 - a - b], [c, d, 8 - c - d]]))
                for a in range(9) for b in range(9 - a) for c in range(9) for d in range(9 - c))
    assert objective_s(inst, n) <= brute * (1 + 1e-6)
    assert objective_s(inst, water_filling(inst)) <= brute * 1.02
    assert n[0, 1] + n[0, 2] > 0  # replica 0's primary is loaded: some of its request's heads go elsewhere


def test_pooled_device_time_counts_every_replicas_heads_and_each_replicas_message_once() -> None:
    S = np.array([[1e-8, 2e-8], [3e-8, 1e-8]])
    c0 = np.array([[0.0, 1e-3], [2e-3, 0.0]])
    c1 = np.array([[0.0, 1e-6], [2e-6, 0.0]])
    inst = DispatchInstance(S, c0, c1, np.zeros(2), np.array([[0, 0], [0, 0]]), np.full(2, 1e9),
                            np.array([100.0, 200.0]), np.array([100.0, 200.0]), 4, np.array([0, 1]))
    n = np.array([[1, 3], [2, 2]])
    # device 0: replica 0's 1 head (own) + replica 1's 2 heads (remote: one latency, 2 message heads)
    t0 = 1 * 1e-8 * 100 + 2 * 3e-8 * 200 + 2e-3 + 2 * 2e-6
    t1 = 3 * 2e-8 * 100 + 1e-3 + 3 * 1e-6 + 2 * 1e-8 * 200
    assert np.allclose(device_times(inst, n), [t0, t1], rtol=1e-12)
