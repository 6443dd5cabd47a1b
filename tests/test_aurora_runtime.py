"""AuroraRL runtime: localhost transfer with rate limits, a relay killed mid-transfer, leased rollouts
with a killed and a stalled worker, rejoin catch-up. Multi-process runs are marked slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.runtime import delta as D
from gpuplan.runtime.aurora_lease import DeltaLog, LeaseTable, rejoin, run_rollouts
from gpuplan.runtime.aurora_net import LinkSpec, TransferSpec, run_transfer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "aurora"
MBIT = 1e6 / 8


class Clock:
    """A settable clock for lease tests."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_lease_expiry_renewal_and_fencing() -> None:
    clock = Clock()
    table = LeaseTable(ttl_s=1.0, clock=clock)
    table.add("b0", "b1")
    a = table.grant("w0")
    clock.t = 0.8
    assert table.renew(a.id, "w0")
    clock.t = 1.7
    assert table.renew(a.id, "w0")  # renewed at 0.8: valid until 1.8
    clock.t = 2.9  # not renewed since 1.7: expired at 2.7
    assert [ls.id for ls in table.expire()] == [a.id]
    b = table.grant("w1")
    assert b.work == "b0" and b.id != a.id  # reassigned first
    assert not table.submit(a.id, "w0", "b0", "late")  # fenced: old lease
    assert table.submit(b.id, "w1", "b0", "ok")
    assert not table.submit(b.id, "w1", "b0", "again")  # exactly once
    assert table.results == {"b0": "ok"}


@settings(max_examples=40, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["grant", "renew", "tick", "submit"]),
                                 st.integers(0, 2), st.floats(0.05, 0.8)), min_size=1, max_size=60))
def test_leases_never_accept_twice_or_late(events: list) -> None:
    clock = Clock()
    table = LeaseTable(ttl_s=1.0, clock=clock)
    table.add(*[f"b{i}" for i in range(4)])
    held: dict[str, list] = {f"w{i}": [] for i in range(3)}
    for kind, w, dt in events:
        holder = f"w{w}"
        if kind == "grant":
            lease = table.grant(holder)
            if lease:
                held[holder].append(lease)
        elif kind == "renew" and held[holder]:
            table.renew(held[holder][-1].id, holder)
        elif kind == "tick":
            clock.t += dt
        elif kind == "submit" and held[holder]:
            lease = held[holder].pop(0)
            valid = (table.active.get(lease.work) is not None and table.active[lease.work].id == lease.id
                     and table.active[lease.work].expires > clock.t and lease.work not in table.results)
            assert table.submit(lease.id, holder, lease.work, holder) == valid
    accepted = [d["work"] for _, k, d in table.log if k == "accept"]
    assert len(accepted) == len(set(accepted))
    assert all(work in table.results for work in accepted)


def test_rejoin_from_deltas_or_checkpoint() -> None:
    rng = np.random.default_rng(0)
    versions = [{"w": rng.integers(0, 1 << 16, 4096, dtype=np.uint16)}]
    log = DeltaLog(keep=3)
    for v in range(1, 6):
        new = {"w": versions[-1]["w"].copy()}
        new["w"][rng.random(4096) < 0.02] ^= 1
        log.publish(v, D.encode(versions[-1], new, {"w": "bf16"}, chunk_elems=1024), new)
        versions.append(new)
    how, w = rejoin(log, 3, {"w": versions[3]["w"].copy()})
    assert how == "deltas" and np.array_equal(w["w"], versions[5]["w"])
    how, w = rejoin(log, 1, {"w": versions[1]["w"].copy()})
    assert how == "checkpoint" and np.array_equal(w["w"], versions[5]["w"])
    with pytest.raises(D.DeltaError):  # a worker claiming the wrong version is refused, not corrupted
        rejoin(log, 3, {"w": versions[2]["w"].copy()})


@pytest.mark.slow
def test_localhost_run_with_rate_limits_delivers_identical_weights() -> None:
    problem = api.load_problem(EXAMPLES / "localhost-3workers.yaml")
    plan = api.solve(problem)
    out = api.run(plan, elements=1 << 23)
    assert out["identical_weights"]
    # the token buckets hold: nothing arrives faster than the plan's rates allow
    slowest = min(e.rate_GBps for e in plan.edges) * 1e9
    assert out["measured_transfer_s"] >= 0.9 * out["payload_bytes"] / slowest


@pytest.mark.slow
def test_relay_killed_mid_transfer_children_resume_from_trainer() -> None:
    links = [LinkSpec("trainer", "w0", 2, 20 * MBIT, 10 * MBIT, 0.02),  # about 0.5 s for the delta
             LinkSpec("w0", "w1", 1, 400 * MBIT, 400 * MBIT, 0.01),
             LinkSpec("w0", "w2", 2, 400 * MBIT, 200 * MBIT, 0.02)]
    spec = TransferSpec(links=links, elements=1 << 23, changed_fraction=0.05, timeout_s=60, kill="w0",
                        kill_after_s=0.15, lease_s=0.5)
    out = run_transfer(spec)
    assert out["identical"] and set(out["arrival_s"]) == {"w1", "w2"}
    assert set(out["detection_s"]) == {"w1", "w2"}  # both lost their relay and resumed from the trainer
    assert all(d <= spec.lease_s + 0.5 for d in out["detection_s"].values())
    assert all(w["duplicates"] == 0 and w["records"] == out["records"] for w in out["workers"].values())


@pytest.mark.slow
def test_killed_worker_leases_reassigned_every_batch_accepted_once() -> None:
    out = run_rollouts(batches=10, workers=3, ttl_s=0.6, rollout_s=0.25, kill="w0", stall="w1")
    assert out["exactly_once"] and len(out["accepted_by"]) == 10
    assert out["killed"] == "w0" and "w0" not in out["accepted_by"].values()
    assert out["detection_s"] is not None and out["detection_s"] <= 0.6 + 0.5  # TTL + polling on a busy machine
    assert any(r["holder"] == "w1" for r in out["rejected"])  # the stalled worker's late result
