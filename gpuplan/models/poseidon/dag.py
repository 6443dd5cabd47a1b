"""The training-iteration DAG of a pipeline schedule and its longest path (seconds).

Ops are every (device stage, forward|backward, model chunk, micro-batch). With `interleave` v = 1 a
device holds one chunk (1F1B or GPipe); with v > 1 it holds v chunks and runs Megatron's interleaved
1F1B order: virtual stage k = chunk * S + stage, warm-up of 2 (S - 1 - stage) + (v - 1) S chunk
forwards, then one forward / one backward, then the drain; forward op i runs chunk (i // S) % v of
micro-batch (i // (S v)) S + i % S, backward op i chunk v - 1 - (i // S) % v of the same micro-batch
(m a multiple of S). Lists of durations are per VIRTUAL stage (S v entries, k = chunk * S + stage);
`p2p[k]` is the send between virtual stages k and k + 1; `tail[s]` runs on device stage s after its
last op (gradient all-reduce + optimizer step).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

Op = tuple[str, int, int]  # ("F"|"B", chunk, micro-batch)


def stage_order(schedule: str, stage: int, num_stages: int, m: int, interleave: int = 1) -> list[Op]:
    """Return the execution order of one device stage: [("F"|"B", chunk, micro-batch), ...].

    1F1B: min(S-1-s, m) warm-up forwards, then alternate one forward / one backward, then drain.
    GPipe: every forward, then every backward. interleave > 1: Megatron's interleaved 1F1B.
    """
    S, v = num_stages, interleave
    if v > 1:
        total = m * v
        warm = total if m == S else min(total, 2 * (S - 1 - stage) + (v - 1) * S)

        def fwd(i: int) -> Op:
            return ("F", (i // S) % v, (i // (S * v)) * S + i % S)

        def bwd(i: int) -> Op:
            return ("B", v - 1 - (i // S) % v, (i // (S * v)) * S + i % S)

        out = [fwd(i) for i in range(warm)]
        for i in range(total - warm):
            out += [fwd(warm + i), bwd(i)]
        return out + [bwd(i) for i in range(total - warm, total)]
    if schedule == "gpipe":
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
    w = min(num_stages - 1 - stage, m)
    out = [("F", 0, j) for j in range(w)]
    for i in range(m - w):
        out += [("F", 0, w + i), ("B", 0, i)]
    return out + [("B", 0, j) for j in range(m - w, m)]


def peak_chunks_in_flight(schedule: str, stage: int, num_stages: int, m: int, interleave: int = 1) -> int:
    """Return the most chunk-activations a device stage holds at once (forwards run minus backwards
    run, over its order); with interleave 1 the in-flight micro-batch count."""
    live = peak = 0
    for kind, _, _ in stage_order(schedule, stage, num_stages, m, interleave):
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def _dependency(kind: str, k: int, j: int, V: int) -> tuple[tuple[str, int, int] | None, int]:
    """Return (the op (kind, virtual stage, mb) an op waits for, index of the send on that edge or -1)."""
    if kind == "F":
        return (("F", k - 1, j), k - 1) if k else (None, -1)
    if k < V - 1:
        return ("B", k + 1, j), k
    return ("F", k, j), -1


@lru_cache(maxsize=256)
def topological_ops(schedule: str, num_stages: int, m: int, interleave: int = 1
                    ) -> tuple[tuple[int, str, int, int], ...]:
    """Return every (device stage, "F"|"B", chunk, micro-batch) in an order compatible with the DAG."""
    S, v = num_stages, interleave
    V = S * v
    orders = [stage_order(schedule, s, S, m, v) for s in range(S)]
    pos = [0] * S
    done: set[tuple[str, int, int]] = set()
    out: list[tuple[int, str, int, int]] = []
    total = 2 * V * m
    while len(out) < total:
        progressed = False
        for s in range(S):
            while pos[s] < len(orders[s]):
                kind, c, j = orders[s][pos[s]]
                k = c * S + s
                dep, _ = _dependency(kind, k, j, V)
                if dep is not None and dep not in done:
                    break
                out.append((s, kind, c, j))
                done.add((kind, k, j))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {schedule} schedule with {S} stages, {m} micro-batches and interleave {v} "
                               "deadlocks (interleaving needs micro-batches a multiple of the stages)")
    return tuple(out)


def build_dag(fwd: list[float], bwd: list[float], p2p: list[float], tail: list[float], m: int,
              schedule: str = "1f1b", interleave: int = 1) -> Any:
    """Return the training-iteration DAG as a networkx DiGraph with node attribute `d` (seconds).

    Nodes: ("F", k, j), ("B", k, j) compute of virtual stage k; ("SF", k, j) / ("SB", k, j) sends
    between virtual stages k and k+1; ("AR", s) gradient all-reduce + optimizer of device stage s;
    "end". Edges: data dependencies and each device's execution order (`stage_order`).
    """
    import networkx as nx

    S = len(tail)
    v = interleave
    V = S * v
    g = nx.DiGraph()
    for k in range(V):
        for j in range(m):
            g.add_node(("F", k, j), d=fwd[k])
            g.add_node(("B", k, j), d=bwd[k])
            if k < V - 1:
                g.add_node(("SF", k, j), d=p2p[k])
                g.add_node(("SB", k, j), d=p2p[k])
                g.add_edge(("F", k, j), ("SF", k, j))
                g.add_edge(("SF", k, j), ("F", k + 1, j))
                g.add_edge(("B", k + 1, j), ("SB", k, j))
                g.add_edge(("SB", k, j), ("B", k, j))
            else:
                g.add_edge(("F", k, j), ("B", k, j))
    for s in range(S):
        order = [(kind, c * S + s, j) for kind, c, j in stage_order(schedule, s, S, m, v)]
        for a, b in zip(order, order[1:]):
            g.add_edge(a, b)
        g.add_node(("AR", s), d=tail[s])
        g.add_edge(order[-1], ("AR", s))
        g.add_edge(("AR", s), "end")
    g.add_node("end", d=0.0)
    return g


def dag_longest_path_s(g: Any) -> float:
    """Return the longest path of a DAG built by `build_dag` (seconds: the iteration time)."""
    import networkx as nx

    finish: dict[Any, float] = {}
    for node in nx.topological_sort(g):
        start = max((finish[u] for u in g.predecessors(node)), default=0.0)
        finish[node] = start + g.nodes[node]["d"]
    return finish["end"]


@lru_cache(maxsize=256)
def _flat_ops(schedule: str, num_stages: int, m: int, interleave: int = 1
              ) -> tuple[tuple[int, bool, int, int, int], ...]:
    """Return the topological ops as (device stage, is_forward, micro-batch, dependency op index or -1,
    index of the send on that edge or -1), indices into the same tuple (`_virtual_stages` gives each
    op's virtual stage)."""
    S, v = num_stages, interleave
    V = S * v
    ops = topological_ops(schedule, S, m, v)
    where = {(kind, c * S + s, j): i for i, (s, kind, c, j) in enumerate(ops)}
    out = []
    for s, kind, c, j in ops:
        dep, send = _dependency(kind, c * S + s, j, V)
        out.append((s, kind == "F", j, where[dep] if dep is not None else -1, send))
    return tuple(out)


@lru_cache(maxsize=256)
def _virtual_stages(schedule: str, num_stages: int, m: int, interleave: int = 1) -> tuple[int, ...]:
    """Return the virtual stage (chunk * S + stage) of every op of `_flat_ops`, in the same order."""
    return tuple(c * num_stages + s for s, _, c, _ in topological_ops(schedule, num_stages, m, interleave))


def iteration_time_fast(fwd: list[float], bwd: list[float], p2p: list[float], tail: list[float], m: int,
                        schedule: str = "1f1b", record: list[tuple[int, str, int, float, float]] | None = None,
                        interleave: int = 1) -> float:
    """Return the same longest path as `dag_longest_path_s(build_dag(...))` without building a graph.

    Walks the compute ops in a cached topological order: finish = max(previous op on the device,
    dependency + send) + duration. Seconds. When `record` is a list, appends (device stage,
    "F"|"B"|"AR", micro-batch, start_s, end_s) of every op to it.
    """
    S = len(tail)
    if record is None:
        walk = _walk_for(schedule, S, m, interleave)
        if walk is not None:
            return walk(fwd, bwd, p2p, tail)  # type: ignore[no-any-return]
    free = [0.0] * S
    ops = _flat_ops(schedule, S, m, interleave)
    virtual = _virtual_stages(schedule, S, m, interleave)
    end = [0.0] * len(ops)
    sends = list(p2p) + [0.0]  # index -1: no send
    for i, ((s, is_f, j, dep, send), k) in enumerate(zip(ops, virtual)):
        ready = end[dep] + sends[send] if dep >= 0 else 0.0
        begin = free[s] if free[s] > ready else ready
        t = begin + (fwd[k] if is_f else bwd[k])
        end[i] = free[s] = t
        if record is not None:
            record.append((s, "F" if is_f else "B", j, begin, t))
    if record is not None:
        record += [(s, "AR", -1, free[s], free[s] + tail[s]) for s in range(S)]
    return max(free[s] + tail[s] for s in range(S))


COMPILED_OPS_LIMIT = 20000  # longer DAGs are walked by the loop (compiling them costs more than it saves)
COMPILE_AFTER = 48  # walks of one DAG shape by the loop before it is compiled (a compile costs ~100 loop walks)
_WALK_CALLS: dict[tuple[str, int, int, int], int] = {}
_WALKS: dict[tuple[str, int, int, int], Any] = {}


def _walk_for(schedule: str, num_stages: int, m: int, interleave: int) -> Any:
    """Return the compiled walk of this DAG shape (`_compiled_walk`) once the shape has been walked
    COMPILE_AFTER times, else None (the loop walks it); at most 512 shapes are kept (and the walk counts
    of 8192)."""
    key = (schedule, num_stages, m, interleave)
    walk = _WALKS.get(key)
    if walk is None:
        if len(_WALK_CALLS) >= 8192:
            _WALK_CALLS.clear()
        calls = _WALK_CALLS[key] = _WALK_CALLS.get(key, 0) + 1
        if calls < COMPILE_AFTER:
            return None
        if len(_WALKS) >= 512:
            _WALKS.clear()
        walk = _WALKS[key] = _compiled_walk(schedule, num_stages, m, interleave) or False
    return walk or None


def _compiled_walk(schedule: str, num_stages: int, m: int, interleave: int = 1) -> Any:
    """Return a function (fwd, bwd, p2p, tail) -> seconds computing `iteration_time_fast`'s longest
    path as straight-line code for this DAG shape (None beyond COMPILED_OPS_LIMIT ops).

    The same float operations in the same order as the loop, so the same result to the last bit;
    each op's finish time is a local variable and the op before it on its device is known when the
    code is written, which takes the loop's indexing and bookkeeping out (several times faster).
    The code is made from integers of the schedule only (no input text reaches it)."""
    ops = _flat_ops(schedule, num_stages, m, interleave)
    if len(ops) > COMPILED_OPS_LIMIT:
        return None
    virtual = _virtual_stages(schedule, num_stages, m, interleave)
    V = num_stages * interleave
    lines = ["def walk(fwd, bwd, p2p, tail):",
             f"    ({''.join(f'F{k}, ' for k in range(V))}) = fwd",
             f"    ({''.join(f'B{k}, ' for k in range(V))}) = bwd",
             f"    ({''.join(f'T{s}, ' for s in range(num_stages))}) = tail"]
    if V > 1:
        # callers may pass a send after the last virtual stage (0.0), as the loop tolerates
        lines.append(f"    ({''.join(f'P{k}, ' for k in range(V - 1))}) = p2p[:{V - 1}]")
    last: list[int] = [-1] * num_stages  # the op before, per device
    for i, ((s, is_f, _, dep, send), k) in enumerate(zip(ops, virtual)):
        dur = f"{'F' if is_f else 'B'}{k}"
        prev = last[s]
        if dep >= 0:
            ready = f"e{dep} + P{send}" if send >= 0 else f"e{dep} + 0.0"
            if prev >= 0:
                lines.append(f"    e{i} = (e{prev} if e{prev} > (r := {ready}) else r) + {dur}")
            else:
                lines.append(f"    e{i} = ({ready}) + {dur}")
        elif prev >= 0:  # ready at 0.0; a device's clock never goes below 0
            lines.append(f"    e{i} = (e{prev} if e{prev} > 0.0 else 0.0) + {dur}")
        else:
            lines.append(f"    e{i} = 0.0 + {dur}")
        last[s] = i
    ends = [f"e{last[s]} + T{s}" for s in range(num_stages)]
    lines.append(f"    return max({', '.join(ends)})" if num_stages > 1 else f"    return {ends[0]}")
    scope: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<poseidon walk {schedule} S={num_stages} m={m} v={interleave}>", "exec"),
         scope)
    return scope["walk"]
