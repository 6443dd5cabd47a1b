"""AuroraRL transfer runtime on one machine: a trainer and worker processes exchanging a sparse delta
over TCP on 127.0.0.1, down the relay tree of a plan.

Every edge of the tree is `streams` TCP connections; each edge is paced by a token bucket at the
plan's rate and each stream by one at the per-stream rate, and every frame is held for the link's
latency after it arrives, so WAN links (100 Mb/s - 1 Gb/s, tens of ms) are emulated on loopback.
The trainer extracts and encodes chunk records in one thread while sender threads ship earlier
records (pipelined); relays verify each record's checksum, forward it at once, and decode and apply
it in place on another thread.
Every worker reports the digest of its weights, which must equal the trainer's new weights.
Everything is bounded in time: sockets and joins time out and the processes stop by themselves.
"""

from __future__ import annotations

import heapq
import multiprocessing as mp
import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuplan.runtime import delta as D

HOST = "127.0.0.1"
_FRAME = struct.Struct("<IB")  # payload length, type
RECORD, END = 1, 2
PIECE = 16 * 1024  # bytes paced per token-bucket grant


@dataclass
class LinkSpec:
    """One edge of the tree as the runtime emulates it: rates in bytes/s, latency in seconds."""

    parent: str
    child: str
    streams: int
    rate_Bps: float
    stream_Bps: float
    latency_s: float


@dataclass
class TransferSpec:
    """What to transfer and how: synthetic bf16 weights, the changed fraction, the tree."""

    links: list[LinkSpec]
    elements: int = 1 << 24
    tensors: int = 4
    changed_fraction: float = 0.01
    seed: int = 0
    chunk_elems: int = D.CHUNK_ELEMS
    timeout_s: float = 120.0
    workers: list[str] = field(default_factory=list)
    lease_s: float = 1.0  # a parent silent this long has lost its forwarding lease
    resume_Bps: float = 25e6  # rate at which the trainer re-serves missing records
    kill: str | None = None  # a relay to SIGKILL mid-transfer
    kill_after_s: float = 0.1

    def children(self, node: str) -> list[LinkSpec]:
        """Return the links leaving `node`."""
        return [ln for ln in self.links if ln.parent == node]


def synthetic_weights(spec: TransferSpec) -> dict[str, np.ndarray]:
    """Return the base weights every process builds identically: bf16-like bit patterns of N(0, 0.02)."""
    rng = np.random.default_rng(spec.seed)
    per = spec.elements // spec.tensors
    out = {}
    for i in range(spec.tensors):
        x = (rng.standard_normal(per, dtype=np.float32) * 0.02).view(np.uint32)
        out[f"layer{i}.weight"] = (x >> 16).astype(np.uint16)
    return out


def next_weights(spec: TransferSpec, old: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return the trainer's next weights: about `changed_fraction` of elements move by one bf16 ulp or two."""
    rng = np.random.default_rng(spec.seed + 1)
    new = {}
    for name, a in old.items():
        b = a.copy()
        idx = np.flatnonzero(rng.random(a.size) < spec.changed_fraction)
        b[idx] = (b[idx].astype(np.int32) + rng.choice([-2, -1, 1, 2], idx.size)).astype(np.uint16)
        new[name] = b
    return new


class Pacer:
    """A token bucket of `rate` bytes/s holding at most `depth` bytes (thread-safe).

    The depth lets a sender that overslept catch up, so scheduler delays on a busy machine do
    not lower the emulated rate; the long-run rate never exceeds `rate`.
    """

    def __init__(self, rate: float, depth: int = 4 * PIECE) -> None:
        self.rate = rate
        self.depth_s = depth / rate
        self.next = time.perf_counter()
        self.lock = threading.Lock()

    def reserve(self, n: int) -> float:
        """Reserve n bytes; return the perf_counter time at which they may be sent (GCRA)."""
        with self.lock:
            now = time.perf_counter()
            tat = max(self.next, now)  # theoretical arrival time of the bucket
            self.next = tat + n / self.rate
            return max(now, tat - self.depth_s)


def _pace(pacers: list[Pacer], n: int) -> None:
    """Sleep until n bytes fit under every bucket (edge and stream) at once."""
    wake = max((p.reserve(n) for p in pacers), default=0.0)
    delay = wake - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def _send_frame(sock: socket.socket, kind: int, payload: bytes, pacers: list[Pacer]) -> None:
    data = _FRAME.pack(len(payload), kind) + payload
    for i in range(0, len(data), PIECE):
        piece = data[i:i + PIECE]
        _pace(pacers, len(piece))
        sock.sendall(piece)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(1 << 20, n - len(buf)))
        if not part:
            raise ConnectionError("peer closed the connection")
        buf += part
    return bytes(buf)


class EdgeSender:
    """Sends frames to one child over `streams` paced connections, fed by one queue."""

    def __init__(self, link: LinkSpec, port: int, timeout_s: float) -> None:
        self.link = link
        self.queue: queue.Queue = queue.Queue()
        self.edge_pacer = Pacer(link.rate_Bps)
        self.socks = [socket.create_connection((HOST, port), timeout=timeout_s) for _ in range(link.streams)]
        for s in self.socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in self.socks]
        for t in self.threads:
            t.start()

    def _run(self, sock: socket.socket) -> None:
        pacers = [self.edge_pacer, Pacer(self.link.stream_Bps)]
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    _send_frame(sock, END, b"", [])
                    return
                _send_frame(sock, RECORD, item, pacers)
        except OSError:
            return  # the child died; its own children resume from the trainer

    def put(self, record: bytes) -> None:
        """Queue a record for whichever stream is free first."""
        self.queue.put(record)

    def close(self, timeout_s: float) -> None:
        """Send END on every stream once the queue drains; wait for the senders and close."""
        for _ in self.socks:
            self.queue.put(None)
        for t in self.threads:
            t.join(timeout_s)
        for s in self.socks:
            s.close()


def _listen(streams: int) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((HOST, 0))
    srv.listen(max(1, streams))
    return srv


def _serve_resumes(srv: socket.socket, records: dict[tuple[int, int], bytes], end: bytes,
                   spec: TransferSpec, stop: threading.Event) -> None:
    """Serve workers whose relay died: read the ids they hold, send every other record and END."""
    srv.settimeout(0.05)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(spec.timeout_s)
        (count,) = struct.unpack("<I", _recv_exact(conn, 4))
        have = {tuple(x) for x in np.frombuffer(_recv_exact(conn, 8 * count), "<u4").reshape(-1, 2).tolist()}
        pacers = [Pacer(spec.resume_Bps)]
        for key, rec in records.items():
            if key not in have:
                _send_frame(conn, RECORD, rec, pacers)
        _send_frame(conn, RECORD, end, pacers)
        _send_frame(conn, END, b"", [])
        conn.close()


def trainer_main(spec: TransferSpec, ports: dict[str, int], resume: Any, results: Any, go: Any,
                 finished: Any) -> None:
    """Trainer process: build old/new weights, then extract, encode and send records down the tree;
    keep the records to re-serve workers whose relay dies, until every worker is done."""
    try:
        old = synthetic_weights(spec)
        new = next_weights(spec, old)
        header = D.make_header(old, new, {n: "bf16" for n in old}, chunk_elems=spec.chunk_elems)
        srv = _listen(len(spec.workers) or 4)
        resume.put(srv.getsockname()[1])
        senders = [EdgeSender(ln, ports[ln.child], spec.timeout_s) for ln in spec.children("trainer")]
        go.wait(spec.timeout_s)
        t0 = time.time()
        records: dict[tuple[int, int], bytes] = {}
        for t, c, rec in D.iter_records(old, new, header, compress=False):  # extraction overlaps sending
            for s in senders:
                s.put(rec)
            records[(t, c)] = rec
        t_encoded = time.time()
        end = D.end_record(records)
        for s in senders:
            s.put(end)
        stop = threading.Event()
        server = threading.Thread(target=_serve_resumes, args=(srv, records, end, spec, stop), daemon=True)
        server.start()
        for s in senders:
            s.close(spec.timeout_s)
        results.put(("trainer", {"t_start": t0, "t_encoded": t_encoded, "records": len(records),
                                 "payload_bytes": sum(map(len, records.values())) + len(end),
                                 "digest": D.state_digest(new), "base_digest": D.state_digest(old)}))
        finished.wait(spec.timeout_s)
        stop.set()
        server.join(spec.timeout_s)
    except Exception as exc:  # reported, never hangs the parent
        results.put(("trainer", {"error": repr(exc)}))


def worker_main(name: str, spec: TransferSpec, port_q: Any, ports_in: Any, results: Any) -> None:
    """Worker process: receive records on every stream, verify, apply in place, forward to children.

    When no frame has arrived for `lease_s` and the delta is incomplete, the parent's forwarding
    lease has expired: the worker asks the trainer for the records it lacks (resume by chunk id).
    """
    try:
        mine = [ln for ln in spec.links if ln.child == name][0]
        srv = _listen(mine.streams)
        srv.settimeout(spec.timeout_s)
        port_q.put((name, srv.getsockname()[1]))
        weights = synthetic_weights(spec)
        names = sorted(weights)
        views = [D.bits(weights[n]) for n in names]
        ports, resume_port = ports_in.get(timeout=spec.timeout_s)
        senders = [EdgeSender(ln, ports[ln.child], spec.timeout_s) for ln in spec.children(name)]
        conns = [srv.accept()[0] for _ in range(mine.streams)]
        ready: list[tuple[float, int, int, bytes]] = []
        cv = threading.Condition()
        seq = [0]

        def reader(conn: socket.socket, latency_s: float) -> None:
            conn.settimeout(spec.timeout_s)
            try:
                while True:
                    length, kind = _FRAME.unpack(_recv_exact(conn, _FRAME.size))
                    payload = _recv_exact(conn, length) if length else b""
                    with cv:
                        seq[0] += 1
                        heapq.heappush(ready, (time.perf_counter() + latency_s, seq[0], kind, payload))
                        cv.notify()
                    if kind == END:
                        return
            except (OSError, ConnectionError):
                return  # the parent died: the lease check below takes over

        for c in conns:
            threading.Thread(target=reader, args=(c, mine.latency_s), daemon=True).start()
        applies: queue.Queue = queue.Queue()

        def applier() -> None:
            while (payload := applies.get()) is not None:
                rec, _ = D.decode_record(payload)
                D.apply_record(rec, views[rec.tensor], spec.chunk_elems)

        apply_thread = threading.Thread(target=applier, daemon=True)
        apply_thread.start()
        got: set[tuple[int, int]] = set()
        rejected = duplicates = nbytes = 0
        expected: tuple[int, int] | None = None
        resumed_at: float | None = None
        last = time.perf_counter()
        deadline = last + spec.timeout_s
        while (expected is None or len(got) < expected[0]) and time.perf_counter() < deadline:
            if resumed_at is None and time.perf_counter() - last > spec.lease_s:
                resumed_at = time.time()  # the relay's lease expired: fetch what is missing from the trainer
                conn = socket.create_connection((HOST, resume_port), timeout=spec.timeout_s)
                ids = np.array(sorted(got), dtype="<u4").reshape(-1, 2)
                conn.sendall(struct.pack("<I", len(ids)) + ids.tobytes())
                threading.Thread(target=reader, args=(conn, 0.0), daemon=True).start()
            with cv:
                if not ready or ready[0][0] > time.perf_counter():
                    cv.wait(timeout=max(0.0005, ready[0][0] - time.perf_counter()) if ready else 0.02)
                    continue
                _, _, kind, payload = heapq.heappop(ready)
            last = time.perf_counter()
            if kind == END:
                continue
            end = D.parse_end(payload)
            if end is not None:
                expected = end
                continue
            try:
                key = D.check_record(payload)  # verified: forward first, decode and apply after
            except D.DeltaError:
                rejected += 1
                continue
            nbytes += len(payload)
            if key in got:
                duplicates += 1
                continue
            for s in senders:
                s.put(payload)
            applies.put(payload)  # decoded and applied off the forwarding path
            got.add(key)
        applies.put(None)
        apply_thread.join(spec.timeout_s)
        t_done = time.time()
        complete = expected is not None and len(got) == expected[0] and D.ids_crc(got) == expected[1]
        if complete:  # an incomplete relay sends no END: its children resume from the trainer
            for s in senders:
                s.put(D.end_record(got))
        for s in senders:
            s.close(spec.timeout_s)
        results.put((name, {"t_done": t_done, "records": len(got), "bytes": nbytes, "rejected": rejected,
                            "duplicates": duplicates, "complete": complete, "resumed_at": resumed_at,
                            "digest": D.state_digest(weights)}))
    except Exception as exc:
        results.put((name, {"error": repr(exc)}))


def _get(q: Any, procs: list[Any], deadline: float) -> Any:
    """Return the next item of q; raise RuntimeError when a process died or the deadline passed."""
    while time.time() < deadline:
        try:
            return q.get(timeout=0.2)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"processes {dead} exited before reporting") from None
    raise RuntimeError("the transfer did not finish within its time limit")


def run_transfer(spec: TransferSpec) -> dict[str, Any]:
    """Run the trainer and one process per worker; return per-worker arrival times (s after the trainer
    starts extracting), digests, and whether every (surviving) worker ended bit-identical to the trainer.

    With spec.kill, that relay is SIGKILLed kill_after_s into the transfer; its children must detect
    the silence within lease_s and resume from the trainer. Raises RuntimeError when another process
    fails or the run exceeds spec.timeout_s.
    """
    ctx = mp.get_context("spawn")
    workers = spec.workers or [ln.child for ln in spec.links]
    port_q, resume_q, results, go, finished = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    ports_in = {w: ctx.Queue() for w in workers}
    procs = {w: ctx.Process(target=worker_main, args=(w, spec, port_q, ports_in[w], results), daemon=True, name=w)
             for w in workers}
    for p in procs.values():
        p.start()
    deadline = time.time() + spec.timeout_s
    killed_at = None
    try:
        ports = dict(_get(port_q, list(procs.values()), deadline) for _ in workers)
        trainer = ctx.Process(target=trainer_main, args=(spec, ports, resume_q, results, go, finished),
                              daemon=True, name="trainer")
        trainer.start()
        resume_port = _get(resume_q, [trainer], deadline)
        for w in workers:
            ports_in[w].put((ports, resume_port))
        watched = [p for w, p in procs.items() if w != spec.kill] + [trainer]
        go.set()
        out: dict[str, Any] = {}
        expected = len(workers) + 1 - (1 if spec.kill else 0)
        while len(out) < expected:
            if spec.kill and killed_at is None:
                time.sleep(spec.kill_after_s)
                procs[spec.kill].kill()
                killed_at = time.time()
            name, report = _get(results, watched, deadline)
            if name != spec.kill:
                out[name] = report
        finished.set()
        procs["trainer"] = trainer
    finally:
        finished.set()
        for p in procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = {k: v["error"] for k, v in out.items() if "error" in v}
    if errors:
        raise RuntimeError(f"transfer processes failed: {errors}")
    t0 = out["trainer"]["t_start"]
    alive = [w for w in workers if w != spec.kill]
    return {"arrival_s": {w: out[w]["t_done"] - t0 for w in alive},
            "identical": all(out[w]["digest"] == out["trainer"]["digest"] and out[w]["complete"] for w in alive),
            "payload_bytes": out["trainer"]["payload_bytes"], "records": out["trainer"]["records"],
            "encode_s": out["trainer"]["t_encoded"] - t0, "killed": spec.kill,
            "detection_s": {w: out[w]["resumed_at"] - killed_at for w in alive
                            if out[w]["resumed_at"] and killed_at},
            "workers": {w: out[w] for w in alive}}


def spec_from_plan(problem: Any, plan: Any, **overrides: Any) -> TransferSpec:
    """Return the TransferSpec that emulates a plan's tree: its rates, streams, per-stream caps, latencies."""
    links = []
    for e in plan.edges:
        ln = problem.link(problem.region_of(e.parent), problem.region_of(e.child))
        per = (ln.stream_GBps or problem.default_stream_GBps) * 1e9
        links.append(LinkSpec(e.parent, e.child, e.streams, e.rate_GBps * 1e9, per, ln.latency_s))
    return TransferSpec(links=links, workers=[e.child for e in plan.edges], **overrides)


def run_plan(problem: Any, plan: Any, *, elements: int | None = None, changed_fraction: float | None = None,
             timeout_s: float = 120.0, **_: Any) -> dict[str, Any]:
    """`gpuplan run` for aurora plans: emulate the plan's tree on localhost with a synthetic bf16 model
    (the problem's parameter count, at most 2**26); return measured vs predicted arrival times (s)
    and whether every worker ended bit-identical to the trainer."""
    from gpuplan.models.aurora import arrival_times

    rho = problem.delta.changed_fraction if changed_fraction is None else changed_fraction
    elements = elements or min(int(problem.n_params()), 1 << 26)
    spec = spec_from_plan(problem, plan, elements=int(elements), changed_fraction=rho, timeout_s=timeout_s)
    measured = run_transfer(spec)
    predicted = arrival_times(problem, plan.edges, measured["payload_bytes"])
    # the same prediction with the extraction rate this machine showed in the run (dense bytes/s)
    rate = 2 * spec.elements / max(measured["encode_s"], 1e-9) / 1e9
    local = problem.model_copy(update={"trainer": problem.trainer.model_copy(update={"extract_GBps": rate})})
    return {"identical_weights": measured["identical"], "payload_bytes": measured["payload_bytes"],
            "measured_transfer_s": max(measured["arrival_s"].values()),
            "predicted_transfer_s": max(predicted.values()),
            "predicted_with_measured_extraction_s": max(arrival_times(local, plan.edges,
                                                                      measured["payload_bytes"]).values()),
            "measured_extraction_GBps": rate,
            **{f"measured_{w}_s": t for w, t in measured["arrival_s"].items()},
            **{f"predicted_{w}_s": predicted[w] for w in measured["arrival_s"]}}


__all__ = ["LinkSpec", "TransferSpec", "run_transfer", "run_plan", "spec_from_plan"]
