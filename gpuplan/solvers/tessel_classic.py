"""The classic pipeline schedules as per-device orders, for Tessel's baselines.

GPipe, 1F1B, interleaved 1F1B (Megatron's order) are built explicitly; the zero-bubble family
(ZB-H1, ZB-H2, ZB-V) and the Chimera-style bidirectional schedule come from one greedy list
scheduler with the priorities and memory caps of their papers. Every order is timed by the
model's event simulator (`gpuplan.models.tessel.simulate`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from gpuplan.errors import InfeasibleError
from gpuplan.models.tessel import Entry, Order, TesselProblem, simulate

Stages = dict[int, dict[str, list[str]]]  # stage -> {"F": [names], "B": [names in run order]}


def stages(problem: TesselProblem) -> Stages | None:
    """Return the pipeline stages of a single-device placement (stage -> its F and B/W block names),
    or None when some block has no stage, spans devices, or a stage lacks a forward block."""
    out: Stages = defaultdict(lambda: {"F": [], "B": []})
    for b in problem.blocks:
        if b.stage is None or len(b.devices) != 1 or b.kind == "other":
            return None
        out[b.stage]["F" if b.kind == "forward" else "B"].append(b.name)
    for s in out.values():
        if len(s["F"]) != 1 or not s["B"] and problem.mode == "training":
            return None
        s["B"].sort(key=lambda n: ("backward_weight" == problem.block(n).kind))
    keys = sorted(out)
    return dict(out) if keys == list(range(len(keys))) else None


def stage_device(problem: TesselProblem, st: Stages) -> dict[int, int]:
    """Return the device of each stage."""
    return {s: problem.block(v["F"][0]).devices[0] for s, v in st.items()}


def pipeline_reason(problem: TesselProblem, chunks: int | None = None, v_shape: bool = False) -> str | None:
    """Return None when the placement is a pipeline the classic schedules apply to, else why not.

    chunks=1: one stage per device (stage i on device i); chunks=v: stage i on device i mod p;
    v_shape: 2 stages per device in a V (stage i and 2p-1-i on device i).
    """
    st = stages(problem)
    if st is None:
        return "not a pipeline (each block: one device, a stage, a forward/backward kind)"
    p, n = problem.devices, len(st)
    dev = stage_device(problem, st)
    if not chained(problem, st):
        return "the stages are not one chain"
    if v_shape:
        want = {s: (s if s < p else 2 * p - 1 - s) for s in range(2 * p)}
        if n != 2 * p or dev != want:
            return "not a V placement (stages i and 2p-1-i on device i)"
        return None
    v = chunks or max(1, n // p)
    if n != p * v or any(dev[s] != s % p for s in range(n)):
        return f"needs stage i on device i mod {p} ({p * v} stages)"
    if chunks is None and v != 1:
        return "needs one stage per device"
    return None


def _expand(problem: TesselProblem, st: Stages, seq: list[tuple[int, str, int]]) -> list[tuple[str, int]]:
    """Turn (stage, 'F'|'B'|'W'|'BW', micro-batch) steps into block instances."""
    out = []
    for s, what, i in seq:
        names = st[s]["F"] if what == "F" else st[s]["B"] if what == "BW" else \
            st[s]["B"][:1] if what == "B" else st[s]["B"][1:]
        out += [(n, i) for n in names]
    return out


def chained(problem: TesselProblem, st: Stages, skip: int | None = None) -> bool:
    """Return True when stage s's forward depends on stage s-1's forward for every s > 0 (but `skip`)."""
    return all(st[s - 1]["F"][0] in problem.block(st[s]["F"][0]).after for s in range(1, len(st)) if s != skip)


def chimera_reason(problem: TesselProblem) -> str | None:
    """Return None for two opposite independent pipelines (stages 0..p-1 down, p..2p-1 up), else why not."""
    st = stages(problem)
    p = problem.devices
    want = "two opposite pipelines"
    if st is None or len(st) != 2 * p:
        return f"needs {want}"
    dev = stage_device(problem, st)
    if [dev[s] for s in range(2 * p)] != list(range(p)) + list(reversed(range(p))) \
            or not chained(problem, st, skip=p) or problem.block(st[p]["F"][0]).after:
        return f"needs {want}, independent of each other"
    return None


def gpipe_orders(problem: TesselProblem) -> Order:
    """Return GPipe's orders: every forward of a device's stages, then every backward (B with its W)."""
    st = stages(problem)
    assert st is not None
    dev = stage_device(problem, st)
    m = problem.microbatches
    orders: Order = [[] for _ in range(problem.devices)]
    for d in range(problem.devices):
        mine = sorted(s for s in st if dev[s] == d)
        seq = [(s, "F", i) for s in mine for i in range(m)]
        seq += [(s, "BW", i) for s in reversed(mine) for i in range(m)]
        orders[d] = _expand(problem, st, seq)
    return orders


def interleaved_orders(problem: TesselProblem, chunks: int) -> Order:
    """Return Megatron's interleaved 1F1B orders (chunks=1 gives plain 1F1B / PipeDream-flush).

    Device r runs forwards of virtual micro-batch k (chunk (k // p) % v, micro-batch
    (k // pv) * p + k % p) with a warm-up of (p - r - 1) * 2 + (v - 1) * p forwards (p - r - 1 for
    v = 1), then one forward and one backward in turn, then the remaining backwards.
    """
    st = stages(problem)
    assert st is not None
    p, v, m = problem.devices, chunks, problem.microbatches
    total = m * v
    orders: Order = []
    for r in range(p):
        def fwd(k: int) -> tuple[int, str, int]:
            c = (k // p) % v if v > 1 else 0
            i = (k // (p * v)) * p + k % p if v > 1 else k
            return (c * p + r, "F", i)

        def bwd(k: int) -> tuple[int, str, int]:
            c = v - 1 - (k // p) % v if v > 1 else 0
            i = (k // (p * v)) * p + k % p if v > 1 else k
            return (c * p + r, "BW", i)

        warm = min(total, (p - r - 1) * 2 + (v - 1) * p if v > 1 else p - r - 1)
        seq = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            seq += [fwd(warm + k), bwd(k)]
        seq += [bwd(k) for k in range(total - warm, total)]
        orders.append(_expand(problem, st, seq))
    return orders


def zero_bubble_orders(problem: TesselProblem, warmup: Callable[[int], int], delay: Callable[[int], int]) -> Order:
    """Return the zero-bubble paper's handcrafted orders on a one-stage-per-device split placement.

    Device r runs `warmup(r)` forwards, then one forward and one backward-input (B) in turn, then the
    remaining B's; the weight gradient W of micro-batch j runs right after the B of micro-batch
    j + delay(r) (the rest at the end). ZB-H1: warmup p-1-r, delay r (1F1B's memory, makespan
    m(F+B+W) + (p-1)(F+B-W) when W <= F and m >= p); ZB-H2: warmup 2(p-1-r), delay 2r (2p-1
    micro-batches in flight, m(F+B+W) + (p-1)(F+B-2W) when B >= 2W and m >= 2p-1); delay 0 with
    1F1B's warm-up is 1F1B with a split backward.
    """
    st = stages(problem)
    assert st is not None
    p, m = problem.devices, problem.microbatches
    orders: Order = []
    for r in range(p):
        f_name = st[r]["F"][0]
        b_name, w_names = st[r]["B"][0], st[r]["B"][1:]
        warm = max(0, min(m, warmup(r)))
        seq = [("F", k) for k in range(warm)]
        for k in range(m - warm):
            seq += [("F", warm + k), ("B", k)]
        seq += [("B", k) for k in range(m - warm, m)]
        order: list[tuple[str, int]] = []
        next_w = 0
        for what, k in seq:
            order.append((f_name if what == "F" else b_name, k))
            if what == "B" and k - delay(r) >= 0:
                order += [(w, k - delay(r)) for w in w_names]
                next_w = k - delay(r) + 1
        order += [(w, j) for j in range(next_w, m) for w in w_names]
        orders.append(order)
    return orders


def fused_problem(problem: TesselProblem) -> TesselProblem:
    """Return the placement with each stage's backward-input and backward-weight blocks merged into one
    backward block (duration B + W, memory delta the sum, after B's dependencies): the textbook
    backward, whose input gradient leaves the stage only when the weight gradient is done too."""
    st = stages(problem)
    assert st is not None
    merged: dict[str, str] = {}  # W name -> its stage's B name
    for s in st.values():
        for w in s["B"][1:]:
            merged[w] = s["B"][0]
    blocks = []
    for b in problem.blocks:
        if b.name in merged:
            continue
        if b.kind == "backward_input":
            ws = [problem.block(w) for w, owner in merged.items() if owner == b.name]
            b = b.model_copy(update={"kind": "backward", "duration_s": b.duration_s + sum(w.duration_s for w in ws),
                                     "memory_bytes": b.memory_bytes + sum(w.memory_bytes for w in ws)})
        blocks.append(b.model_copy(update={"after": [merged.get(a, a) for a in b.after]}))
    return problem.model_copy(update={"blocks": blocks})


def unfuse(problem: TesselProblem, fused: list[list[Entry]]) -> list[list[Entry]]:
    """Return a fused-backward schedule (see fused_problem) as a schedule of the split placement: each
    fused backward becomes its B followed at once by its W (s)."""
    st = stages(problem)
    assert st is not None
    parts = {s["B"][0]: [problem.block(n) for n in s["B"]] for s in st.values()}
    out: list[list[Entry]] = []
    for dev in fused:
        entries: list[Entry] = []
        for e in dev:
            if e.block not in parts:
                entries.append(e)
                continue
            at = e.start_s
            for b in parts[e.block]:
                entries.append(Entry(block=b.name, microbatch=e.microbatch, start_s=at, end_s=at + b.duration_s))
                at += b.duration_s
        out.append(entries)
    return out


def list_schedule(problem: TesselProblem, priority: Callable[[str, int], tuple], *,
                  cap: list[float] | None = None, window: int | None = None) -> list[list[Entry]]:
    """Return a greedy non-delay schedule (s): whenever devices are free, start the ready instance
    of best `priority` whose memory fits `cap` (bytes per device; default the problem's limits).

    window: micro-batch i may start only once micro-batch i - window has finished (admission
    control, bounding the micro-batches in flight). The same block runs in micro-batch order.
    Raises InfeasibleError when nothing can start and work remains (memory too small).
    """
    import heapq

    blocks = {b.name: b for b in problem.blocks}
    succ: dict[str, list[str]] = defaultdict(list)
    for b in problem.blocks:
        for a in b.after:
            succ[a].append(b.name)
    limit = cap or [problem.limit(d) for d in range(problem.devices)]
    m, nb = problem.microbatches, len(problem.blocks)
    unmet = {(b.name, i): len(b.after) + (1 if i > 0 else 0) for b in problem.blocks for i in range(m)}
    done_blocks = [0] * m
    finished_upto = 0  # micro-batches 0..finished_upto-1 are complete
    ready = [k for k, v in unmet.items() if v == 0]
    events: list[tuple[float, str, int]] = []
    free = [0.0] * problem.devices
    level = [0.0] * problem.devices
    out: list[list[Entry]] = [[] for _ in range(problem.devices)]
    placed, t = 0, 0.0
    while placed < nb * m:
        ready.sort(key=lambda k: priority(*k))
        started = None
        for key in ready:
            b = blocks[key[0]]
            if window is not None and key[1] >= finished_upto + window:
                continue
            if any(free[d] > t + 1e-12 for d in b.devices):
                continue
            if b.memory_bytes > 0 and any(level[d] + b.memory_bytes > limit[d] + 1e-9 for d in b.devices):
                continue
            started = key
            break
        if started is not None:
            b = blocks[started[0]]
            ready.remove(started)
            end = t + b.duration_s
            for d in b.devices:
                free[d] = end
                level[d] += b.memory_bytes
                # built from checked numbers: skip pydantic's validation (most of the time on long runs)
                out[d].append(Entry.model_construct(block=b.name, microbatch=started[1], start_s=t, end_s=end))
            heapq.heappush(events, (end, started[0], started[1]))
            placed += 1
            continue
        if not events:
            raise InfeasibleError("the greedy schedule is stuck: no block instance fits the memory limits "
                                  f"(limits {limit} bytes)")
        t = events[0][0]
        while events and events[0][0] <= t + 1e-12:
            _, n, i = heapq.heappop(events)
            done_blocks[i] += 1
            while finished_upto < m and done_blocks[finished_upto] == nb:
                finished_upto += 1
            for k in [(s, i) for s in succ[n]] + ([(n, i + 1)] if i + 1 < m else []):
                unmet[k] -= 1
                if unmet[k] == 0:
                    ready.append(k)
    return out


def zb_priority(problem: TesselProblem) -> Callable[[str, int], tuple]:
    """Return the zero-bubble priority: backward-input first, then forward, weight gradients last;
    deeper stages first among equals, then older micro-batches."""
    rank = {"backward_input": 0, "backward": 0, "forward": 1, "backward_weight": 2, "other": 1}
    blocks = {b.name: b for b in problem.blocks}

    def prio(name: str, i: int) -> tuple:
        b = blocks[name]
        return (rank[b.kind], -(b.stage or 0), i)

    return prio


def one_f_one_b_cap(problem: TesselProblem, in_flight: Callable[[int], float]) -> list[float]:
    """Return per-device memory caps (bytes) allowing `in_flight(device)` micro-batches' activations."""
    per_mb = [0.0] * problem.devices
    for b in problem.blocks:
        if b.memory_bytes > 0:
            for d in b.devices:
                per_mb[d] += b.memory_bytes
    return [min(problem.limit(d), in_flight(d) * per_mb[d]) for d in range(problem.devices)]


def timed(problem: TesselProblem, orders: Order) -> list[list[Entry]]:
    """Return the simulated schedule of `orders` (see gpuplan.models.tessel.simulate)."""
    return simulate(problem, orders)
