"""Rollout traces for psRL: a seeded generator of step-wise and tree rollouts, and a reader of real ones.

Step-wise (agentic multi-turn) rollouts: an optional system prompt shared by every task, one prompt per
task (prompt_tokens_min..max), `rollouts` rollouts per task of turns_min..turns_max turns of
turn_tokens_min..max tokens (observation + action), history carried: the sample of turn t is the path
system -> prompt -> turn 1 -> ... -> turn t (one sample per turn).
Tree rollouts: per task a prompt, then `rollouts` trees of `depth` levels whose nodes branch into
branching_min..max children; one sample per leaf.

Real rollouts, JSONL (one record per line), either
  {"tokens": [ids...], "group": g, "weight": w}         a whole sample as token ids (the trie is
                                                          built from shared token prefixes), or
  {"id": i, "parent": p, "tokens": n | [ids] | "text": "...", "sample": true, "group": g}
                                                          a segment with a parent link (-1 or absent
                                                          for a root); its length is n, the number of
                                                          ids, or the words of the text; `sample`
                                                          (default true for leaves) marks a sample end.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.psrl.forest import MAX_NODES, MAX_SAMPLES, MAX_SEGMENT_TOKENS, Forest, build_forest


def generated_size(spec: Any) -> tuple[int, int]:
    """Return upper bounds (nodes, samples) of the trace a GenerateSpec describes."""
    if spec.shape == "stepwise":
        per = spec.rollouts * spec.turns_max
        return spec.tasks * (1 + per) + 1, spec.tasks * per
    leaves = spec.branching_max ** spec.depth
    inner = sum(spec.branching_max ** d for d in range(spec.depth))
    return spec.tasks * (1 + spec.rollouts * (inner + leaves)) + 1, spec.tasks * spec.rollouts * leaves


def generate(spec: Any) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, float]]]:
    """Return (nodes as (id, parent, tokens), samples as (end node id, group, weight)) of a seeded
    synthetic trace described by a GenerateSpec (see the module docstring)."""
    r = random.Random(spec.seed)
    nodes: list[tuple[int, int, int]] = []
    samples: list[tuple[int, int, float]] = []

    def add(parent: int, tokens: int) -> int:
        nodes.append((len(nodes), parent, tokens))
        return len(nodes) - 1

    system = add(-1, spec.system_tokens) if spec.system_tokens > 0 else -1
    for task in range(spec.tasks):
        prompt = add(system, r.randint(spec.prompt_tokens_min, spec.prompt_tokens_max))
        for _ in range(spec.rollouts):
            if spec.shape == "stepwise":
                node = prompt
                for _ in range(r.randint(spec.turns_min, spec.turns_max)):
                    node = add(node, r.randint(spec.turn_tokens_min, spec.turn_tokens_max))
                    samples.append((node, task, round(r.uniform(-1, 1), 3)))
            else:
                frontier = [add(prompt, r.randint(spec.turn_tokens_min, spec.turn_tokens_max))]
                for _ in range(spec.depth):
                    nxt = []
                    for v in frontier:
                        nxt += [add(v, r.randint(spec.turn_tokens_min, spec.turn_tokens_max))
                                for _ in range(r.randint(spec.branching_min, spec.branching_max))]
                    frontier = nxt
                samples += [(v, task, round(r.uniform(-1, 1), 3)) for v in frontier]
    return nodes, samples


def generate_forest(spec: Any) -> Forest:
    """Return the Forest of a seeded synthetic trace (GenerateSpec)."""
    nodes, samples = generate(spec)
    return build_forest(nodes, samples)


def _fail(path: Path, line: int, what: str, value: Any, expected: str) -> InputError:
    return InputError.at(f"{path}:{line}", what, value, expected)


def _int(path: Path, line: int, rec: dict[str, Any], key: str, default: int | None = None,
         lo: int = -1, hi: int = 1 << 40) -> int:
    v = rec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(path, line, key, v, f"an integer in {lo}..{hi}")
    return v


def read_trace(path: str | Path) -> dict[str, Any]:
    """Return the forest document ({nodes: [{id, parent, tokens}], samples: [{node, group, weight}]}) of
    a JSONL rollout file (see the module docstring). Raises InputError naming the file, line and field."""
    from gpuplan.io import read_input_bytes

    p = Path(path)
    text = read_input_bytes(p, what="JSONL rollout file").decode("utf-8", errors="replace")
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(p, i, "(line)", line[:60], f"one JSON object per line ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise _fail(p, i, "(line)", rec, "a JSON object")
        records.append((i, rec))
        if len(records) > MAX_NODES:
            raise _fail(p, i, "(line)", len(records), f"at most {MAX_NODES:,} records")
    if not records:
        raise InputError.at(str(p), "(file)", "empty", "at least one rollout record")
    if all("id" not in rec for _, rec in records):
        return _from_token_lists(p, records)
    return _from_links(p, records)


def _from_token_lists(p: Path, records: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Build a radix trie over whole samples given as token-id lists."""
    # trie node: [tokens list, children {first token: node index}, parent]
    seg: list[list[int]] = []
    kids: list[dict[int, int]] = []
    parent: list[int] = []
    roots: dict[int, int] = {}
    samples = []

    def new(tokens: list[int], par: int) -> int:
        seg.append(tokens)
        kids.append({})
        parent.append(par)
        return len(seg) - 1

    for line, rec in records:
        toks = rec.get("tokens")
        if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in toks):
            raise _fail(p, line, "tokens", toks if not isinstance(toks, list) else f"list of {len(toks)}",
                        "a non-empty list of integer token ids")
        if len(toks) > MAX_SEGMENT_TOKENS:
            raise _fail(p, line, "tokens", len(toks), f"at most {MAX_SEGMENT_TOKENS:,} tokens")
        group = _int(p, line, rec, "group", -1)
        weight = rec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not abs(weight) <= 1e6:
            raise _fail(p, line, "weight", weight, "a finite number of at most 1e6 in magnitude")
        table, par, at = roots, -1, 0
        while True:
            first = toks[at]
            if first not in table:
                node = new(toks[at:], par)
                table[first] = node
                break
            node = table[first]
            s = seg[node]
            k = 0
            while k < len(s) and at + k < len(toks) and s[k] == toks[at + k]:
                k += 1
            if k < len(s):  # split the node at k
                tail = new(s[k:], node)
                kids[tail] = kids[node]
                for c in kids[tail].values():
                    parent[c] = tail
                kids[node] = {s[k]: tail}
                seg[node] = s[:k]
                for sm in samples:
                    if sm[0] == node:
                        sm[0] = tail
            at += k
            if at == len(toks):
                break
            table, par = kids[node], node
        if len(seg) > MAX_NODES or len(samples) >= MAX_SAMPLES:
            raise _fail(p, line, "(line)", len(samples), f"a trie of at most {MAX_NODES:,} nodes and "
                        f"{MAX_SAMPLES:,} samples")
        samples.append([node, group, float(weight)])
    return {"nodes": [{"id": i, "parent": parent[i], "tokens": len(seg[i])} for i in range(len(seg))],
            "samples": [{"node": n, "group": g, "weight": w} for n, g, w in samples]}


def _from_links(p: Path, records: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Build the forest of segments given with parent links."""
    nodes, has_child, marked = [], set(), {}
    for line, rec in records:
        nid = _int(p, line, rec, "id", None, 0)
        par = _int(p, line, rec, "parent", -1, -1)
        toks, text = rec.get("tokens"), rec.get("text")
        if isinstance(toks, int) and not isinstance(toks, bool):
            n = toks
        elif isinstance(toks, list):
            n = len(toks)
        elif isinstance(text, str):
            n = len(text.split())
        else:
            raise _fail(p, line, "tokens", toks, "a token count, a list of token ids, or a 'text' string")
        if not 1 <= n <= MAX_SEGMENT_TOKENS:
            raise _fail(p, line, "tokens", n, f"a segment of 1..{MAX_SEGMENT_TOKENS:,} tokens")
        sample = rec.get("sample")
        if sample is not None and not isinstance(sample, bool):
            raise _fail(p, line, "sample", sample, "true or false")
        weight = rec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not abs(weight) <= 1e6:
            raise _fail(p, line, "weight", weight, "a finite number of at most 1e6 in magnitude")
        nodes.append({"id": nid, "parent": par, "tokens": n})
        marked[nid] = (sample, _int(p, line, rec, "group", -1), float(weight))
        if par >= 0:
            has_child.add(par)
    samples = [{"node": n["id"], "group": marked[n["id"]][1], "weight": marked[n["id"]][2]} for n in nodes
               if marked[n["id"]][0] or (marked[n["id"]][0] is None and n["id"] not in has_child)]
    if not samples:
        raise InputError.at(str(p), "sample", "none", "at least one sample (a leaf, or a record with sample: true)")
    return {"nodes": nodes, "samples": samples}


def write_links(forest: Forest, path: str | Path) -> Path:
    """Write a forest as parent-linked JSONL records ({id, parent, tokens, sample, group, weight});
    return the path. read_trace reads it back to the same forest."""
    from gpuplan.io import atomic_write_text

    ends: dict[int, tuple[int, float]] = {}
    for s, e in enumerate(forest.end):
        ends.setdefault(e, (forest.group[s], forest.weight[s]))
    lines = []
    for v in range(forest.n_nodes):
        rec: dict[str, Any] = {"id": forest.ids[v], "parent": forest.ids[forest.parent[v]] if forest.parent[v] >= 0
                               else -1, "tokens": forest.tokens[v], "sample": v in ends}
        if v in ends:
            rec["group"], rec["weight"] = ends[v]
        lines.append(json.dumps(rec))
    return atomic_write_text(path, "\n".join(lines) + "\n")
