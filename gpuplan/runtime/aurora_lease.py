"""AuroraRL fault tolerance: leases on rollout batches and transfer duties, and rejoin catch-up.

A `LeaseTable` grants each unit of work (a rollout batch, a relay's forwarding duty) to one holder
for `ttl_s`; the holder renews it (every ttl/3 or so); an unrenewed lease expires and its work goes
back to the front of the queue for another holder. Every grant has a fresh lease id that acts as a
fencing token: a result is accepted only under the work's current, unexpired lease, and only once,
so a worker that was slow, partitioned or presumed dead can never commit twice or late.

`run_rollouts` exercises it with real processes on this machine: a coordinator and rollout
workers exchanging messages through multiprocessing queues; one worker can be killed (SIGKILL)
mid-rollout and one can stall its renewals; the run reports detection delays, reassignments and
that every batch was accepted exactly once. `DeltaLog` keeps the last deltas so a rejoining worker
catches up from the deltas it missed, or from a full checkpoint when it is too far behind.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import queue
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gpuplan.runtime import delta as D


@dataclass
class Lease:
    """A grant of one unit of work to one holder until `expires` (clock seconds)."""

    id: int
    work: str
    holder: str
    expires: float


@dataclass
class LeaseTable:
    """Leases over a queue of work ids, with expiry, renewal, reassignment and fenced results."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    pending: deque = field(default_factory=deque)
    active: dict[str, Lease] = field(default_factory=dict)  # work -> current lease
    results: dict[str, Any] = field(default_factory=dict)
    accepted_by: dict[str, str] = field(default_factory=dict)
    log: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    _next_id: int = 0

    def add(self, *work: str) -> None:
        """Queue work ids to be leased."""
        self.pending.extend(work)

    def grant(self, holder: str) -> Lease | None:
        """Return a lease on the next pending work for `holder`, or None when nothing is pending."""
        self.expire()
        if not self.pending:
            return None
        work = self.pending.popleft()
        self._next_id += 1
        lease = Lease(self._next_id, work, holder, self.clock() + self.ttl_s)
        self.active[work] = lease
        self.log.append((self.clock(), "grant", {"lease": lease.id, "work": work, "holder": holder}))
        return lease

    def renew(self, lease_id: int, holder: str) -> bool:
        """Extend a lease by ttl; return False when it is no longer the current, unexpired lease."""
        self.expire()
        for lease in self.active.values():
            if lease.id == lease_id and lease.holder == holder:
                lease.expires = self.clock() + self.ttl_s
                return True
        return False

    def expire(self) -> list[Lease]:
        """Drop every lease past its expiry, put its work back at the front; return the dropped leases."""
        now = self.clock()
        gone = [lease for lease in self.active.values() if lease.expires <= now]
        for lease in gone:
            del self.active[lease.work]
            self.pending.appendleft(lease.work)
            self.log.append((now, "expire", {"lease": lease.id, "work": lease.work, "holder": lease.holder}))
        return gone

    def submit(self, lease_id: int, holder: str, work: str, result: Any) -> bool:
        """Accept `result` for `work` only under its current unexpired lease and only once; return accepted."""
        self.expire()
        lease = self.active.get(work)
        ok = lease is not None and lease.id == lease_id and lease.holder == holder and work not in self.results
        if ok:
            self.results[work] = result
            self.accepted_by[work] = holder
            del self.active[work]
        self.log.append((self.clock(), "accept" if ok else "reject",
                         {"lease": lease_id, "work": work, "holder": holder}))
        return ok

    def done(self, total: int) -> bool:
        """True when `total` pieces of work have accepted results."""
        return len(self.results) >= total


# ---------------------------------------------------------------- real processes

def rollout_result(batch: str, version: int) -> str:
    """The deterministic 'rollout' of a batch under a weight version (stands in for generated samples)."""
    return hashlib.sha256(f"{batch}@{version}".encode()).hexdigest()[:16]


def _worker(name: str, requests: Any, replies: Any, rollout_s: float, ttl_s: float, stall: bool) -> None:
    """A rollout worker: ask for a lease, renew it every ttl/3 while rolling out, submit, repeat."""
    while True:
        requests.put(("want", name, None))
        msg = replies.get(timeout=60)
        if msg[0] == "stop":
            return
        if msg[0] == "wait":
            time.sleep(0.02)
            continue
        _, lease_id, batch, version = msg
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(ttl_s / 3):
                if not stall:
                    requests.put(("renew", name, lease_id))

        hb = threading.Thread(target=heartbeat, daemon=True)
        hb.start()
        time.sleep(rollout_s * (3 if stall else 1))  # a stalled worker is slow and stops renewing
        done.set()
        requests.put(("result", name, (lease_id, batch, rollout_result(batch, version))))
        stall = False


def run_rollouts(batches: int = 12, workers: int = 3, *, ttl_s: float = 0.6, rollout_s: float = 0.3,
                 kill: str | None = "w0", kill_after_s: float = 0.15, stall: str | None = None,
                 version: int = 7, timeout_s: float = 60.0) -> dict[str, Any]:
    """Run a coordinator and `workers` rollout processes over `batches` leased batches.

    `kill` names a worker SIGKILLed `kill_after_s` into its first lease; `stall` one that stops
    renewing its first lease and submits late. Returns accepted batches per holder, rejections,
    the detection delay of the kill (s), and whether every batch was accepted exactly once with the
    right result.
    """
    ctx = mp.get_context("spawn")
    requests = ctx.Queue()
    names = [f"w{i}" for i in range(workers)]
    replies = {n: ctx.Queue() for n in names}
    procs = {n: ctx.Process(target=_worker, args=(n, requests, replies[n], rollout_s, ttl_s, n == stall),
                            daemon=True, name=n) for n in names}
    table = LeaseTable(ttl_s)
    table.add(*[f"batch{i}" for i in range(batches)])
    killed_at: float | None = None
    detected_at: float | None = None
    accepted_count: dict[str, int] = {}
    for p in procs.values():
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        # start granting once every worker has asked (process start-up varies on a busy machine)
        first: list[tuple[str, str, Any]] = []
        while len(first) < workers and time.monotonic() < deadline:
            try:
                first.append(requests.get(timeout=0.1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs.values()):
                    raise RuntimeError("a rollout worker exited before it started") from None
        for kind, name, _ in first:
            lease = table.grant(name)
            replies[name].put(("lease", lease.id, lease.work, version) if lease else ("wait",))
        while not table.done(batches) and time.monotonic() < deadline:
            for lease in table.expire():
                if lease.holder == kill and killed_at is not None and detected_at is None:
                    detected_at = time.monotonic()
            if kill and killed_at is None:
                mine = [ls for ls in table.active.values() if ls.holder == kill]
                if mine and time.monotonic() - (mine[0].expires - ttl_s) >= kill_after_s:
                    procs[kill].kill()
                    killed_at = time.monotonic()
            try:
                kind, name, body = requests.get(timeout=0.01)
            except queue.Empty:
                continue
            if kind == "want":
                lease = table.grant(name)
                replies[name].put(("lease", lease.id, lease.work, version) if lease else ("wait",))
            elif kind == "renew":
                table.renew(body, name)
            elif kind == "result":
                lease_id, batch, result = body
                if table.submit(lease_id, name, batch, result):
                    accepted_count[batch] = accepted_count.get(batch, 0) + 1
    finally:
        for n, p in procs.items():
            if p.is_alive():
                replies[n].put(("stop",))
        for p in procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    rejected = [d for _, kind, d in table.log if kind == "reject"]
    exact = (len(table.results) == batches and all(v == 1 for v in accepted_count.values())
             and all(table.results[b] == rollout_result(b, version) for b in table.results))
    return {"accepted_by": dict(table.accepted_by), "rejected": rejected, "exactly_once": exact,
            "expired": [d for _, kind, d in table.log if kind == "expire"],
            "detection_s": (detected_at - killed_at) if killed_at and detected_at else None,
            "killed": kill if killed_at else None}


# ---------------------------------------------------------------- rejoin catch-up

@dataclass
class DeltaLog:
    """The trainer's memory for rejoining workers: the last `keep` step deltas and the latest weights."""

    keep: int
    deltas: "OrderedDict[int, bytes]" = field(default_factory=OrderedDict)  # new version -> delta
    version: int = 0
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def publish(self, version: int, delta: bytes, weights: dict[str, np.ndarray]) -> None:
        """Record the delta that produced `version` and a copy of the weights at that version."""
        self.deltas[version] = delta
        while len(self.deltas) > self.keep:
            self.deltas.popitem(last=False)
        self.version = version
        self.weights = {k: v.copy() for k, v in weights.items()}

    def catch_up(self, have: int) -> tuple[str, Any]:
        """Return ("deltas", [delta, ...]) to go from version `have` to the latest, or
        ("checkpoint", weights) when the deltas it needs are no longer kept."""
        needed = list(range(have + 1, self.version + 1))
        if all(v in self.deltas for v in needed):
            return "deltas", [self.deltas[v] for v in needed]
        return "checkpoint", {k: v.copy() for k, v in self.weights.items()}


def rejoin(log: DeltaLog, have: int, weights: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    """Bring a rejoining worker's weights (at version `have`) to the latest; return (how, weights).

    Deltas are applied in order, each verified against its base digest; a checkpoint replaces all.
    """
    how, payload = log.catch_up(have)
    if how == "checkpoint":
        return how, payload
    for delta in payload:
        D.apply(delta, weights)
    return how, weights
