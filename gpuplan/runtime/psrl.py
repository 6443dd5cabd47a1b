"""Execute psRL plans with torch on CPU: shared-prefix training is exact, and a plan runs on gloo ranks.

One training step of a small causal transformer (gpuplan.runtime.gpt's blocks, a scaled catalog shape)
over a prefix forest, two ways:
  unshared   every sample alone: its whole path forward and backward (what a prefix-oblivious trainer does)
  shared     every node once in topological order, reading its ancestors' K/V (prefix forward once, K/V
             reused by every suffix); one backward accumulates each suffix's dK/dV into the prefix
The loss of a sample is the weighted next-token cross-entropy over the segment its path ends at (summed),
so both give the same gradients up to floating point. `run_plan` then runs a plan's assignment on 2-4
gloo processes: each rank computes its nodes, receives the K/V of the nodes the plan exchanges (and sends
their dK/dV back), and the ranks' gradients are summed; they equal the single-process unshared ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

MAX_RANKS = 4


@dataclass
class TinyForest:
    """A forest with token ids, for execution: parents (topological order), token id lists, samples'
    end nodes and weights."""

    parent: list[int]
    ids: list[list[int]]
    end: list[int]
    weight: list[float]

    def path(self, v: int) -> list[int]:
        """Return the node indices from the root down to v."""
        out = []
        while v >= 0:
            out.append(v)
            v = self.parent[v]
        return out[::-1]


def tiny_config(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 256) -> Any:
    """Return the small transformer shape the executors train (a qwen3-like gated, GQA layout)."""
    from gpuplan.models.workload import TransformerConfig

    return TransformerConfig(name=f"psrl-tiny(layers={layers}, hidden={hidden})", num_layers=layers, hidden=hidden,
                             heads=heads, kv_heads=max(1, heads // 2), ffn_hidden=3 * hidden, vocab=vocab,
                             max_seq_len=1 << 20)


def tiny_forest(problem: Any, max_tokens: int = 2048, vocab: int = 256, seed: int = 0) -> tuple[TinyForest, float]:
    """Return the problem's forest with segment lengths scaled so the deduplicated tokens are at most
    `max_tokens` (each segment at least one token) and seeded random token ids; and the scale used."""
    import random

    f = problem.built
    used = f.used()
    dedup = sum(t for t, u in zip(f.tokens, used) if u)
    scale = min(1.0, max_tokens / max(1, dedup))
    r = random.Random(seed)
    ids = [[r.randrange(vocab) for _ in range(max(1, round(t * scale)))] for t in f.tokens]
    return TinyForest(list(f.parent), ids, list(f.end), list(f.weight)), scale


class Model:
    """The embedding, blocks and head of gpuplan.runtime.gpt, with a forward that reads past K/V."""

    def __init__(self, cfg: Any, seed: int = 0, dtype: Any = None) -> None:
        import torch

        from gpuplan.runtime import gpt

        self.cfg = cfg
        self.emb = gpt.embedding(cfg, seed)
        self.blocks = [gpt.block(cfg, i, seed) for i in range(cfg.num_layers)]
        self.head = gpt.head(cfg, seed)
        self.dtype = dtype or torch.float32
        for m in self.modules():
            m.to(self.dtype)

    def modules(self) -> list[Any]:
        """Return the torch modules in order."""
        return [self.emb, *self.blocks, self.head]

    def named_parameters(self) -> list[tuple[str, Any]]:
        """Return (name, parameter) of every weight."""
        out = []
        for i, m in enumerate(self.modules()):
            out += [(f"{i}.{n}", p) for n, p in m.named_parameters()]
        return out

    def zero_grad(self) -> None:
        """Clear every parameter's gradient."""
        for _, p in self.named_parameters():
            p.grad = None

    def segment(self, tokens: Any, past: list[tuple[Any, Any]] | None) -> tuple[Any, list[tuple[Any, Any]]]:
        """Return (hidden states (1, L, hidden), this segment's K/V per layer) of a segment whose
        ancestors' K/V per layer are `past` (None for a root); causal attention by absolute position."""
        import torch
        import torch.nn.functional as F

        x = self.emb(tokens.view(1, -1))
        L = x.shape[1]
        kvs = []
        for li, blk in enumerate(self.blocks):
            a = blk.attn
            h = blk.norm1(x)
            q = a.q(h).view(1, L, a.heads, a.dhead).transpose(1, 2)
            k = a.k(h).view(1, L, a.kv, a.dhead).transpose(1, 2)
            v = a.v(h).view(1, L, a.kv, a.dhead).transpose(1, 2)
            kvs.append((k, v))
            if past is not None:
                k = torch.cat([past[li][0], k], dim=2)
                v = torch.cat([past[li][1], v], dim=2)
            P = k.shape[2] - L
            if a.kv != a.heads:
                rep = a.heads // a.kv
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            mask = torch.ones(L, P + L, dtype=torch.bool).tril(diagonal=P)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.o(y.transpose(1, 2).reshape(1, L, a.heads * a.dhead))
            x = x + blk.mlp(blk.norm2(x))
        return x, kvs

    def loss(self, hidden_prev_last: Any, hidden: Any, targets: Any) -> Any:
        """Return the summed next-token cross-entropy of a segment: the parent's last hidden state (or
        None for a root) predicts the first target, the segment's own states the rest."""
        import torch
        import torch.nn.functional as F

        rows = hidden[:, :-1] if hidden_prev_last is None else torch.cat([hidden_prev_last, hidden[:, :-1]], dim=1)
        tg = targets[1:] if hidden_prev_last is None else targets
        if tg.numel() == 0:
            return hidden.sum() * 0.0
        logits = self.head(rows)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tg.reshape(-1), reduction="sum")


def _cat_past(kv: dict[int, list[tuple[Any, Any]]], ancestors: list[int]) -> list[tuple[Any, Any]] | None:
    import torch

    if not ancestors:
        return None
    layers = len(kv[ancestors[0]])
    return [(torch.cat([kv[a][li][0] for a in ancestors], dim=2), torch.cat([kv[a][li][1] for a in ancestors], dim=2))
            for li in range(layers)]


def grads_of(model: Model) -> dict[str, Any]:
    """Return a copy of every parameter's gradient (zeros where none)."""
    import torch

    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def train_unshared(model: Model, forest: TinyForest, samples: list[int] | None = None) -> float:
    """Run one step's forward and backward over `samples` (default all), each alone over its whole path;
    gradients accumulate in the model. Return the summed weighted loss."""
    import torch

    total = 0.0
    for s in (range(len(forest.end)) if samples is None else samples):
        path = forest.path(forest.end[s])
        toks = torch.tensor([t for v in path for t in forest.ids[v]])
        hidden, _ = model.segment(toks, None)
        e = forest.end[s]
        n = len(forest.ids[e])
        start = hidden.shape[1] - n
        prev = hidden[:, start - 1:start] if start > 0 else None
        loss = model.loss(prev, hidden[:, start:], torch.tensor(forest.ids[e])) * forest.weight[s]
        loss.backward()
        total += float(loss.detach())
    return total


def train_shared(model: Model, forest: TinyForest, samples: list[int] | None = None) -> float:
    """Run one step over `samples` (default all) with shared prefixes: each node on their paths once in
    topological order, reading its ancestors' K/V; one backward. Return the summed weighted loss."""
    import torch

    chosen = range(len(forest.end)) if samples is None else samples
    weight: dict[int, float] = {}
    need: set[int] = set()
    for s in chosen:
        weight[forest.end[s]] = weight.get(forest.end[s], 0.0) + forest.weight[s]
        need.update(forest.path(forest.end[s]))
    kv: dict[int, list[tuple[Any, Any]]] = {}
    hid: dict[int, Any] = {}
    losses = []
    for v in sorted(need):  # indices are topological (parents first)
        anc = forest.path(v)[:-1]
        hid[v], kv[v] = model.segment(torch.tensor(forest.ids[v]), _cat_past(kv, anc))
        if v in weight:
            p = forest.parent[v]
            prev = hid[p][:, -1:] if p >= 0 else None
            losses.append(model.loss(prev, hid[v], torch.tensor(forest.ids[v])) * weight[v])
    loss = torch.stack(losses).sum()
    loss.backward()
    return float(loss.detach())


def compare_step(forest: TinyForest, cfg: Any, *, seed: int = 0, dtype: str = "float32",
                 repeats: int = 1) -> dict[str, Any]:
    """Train one step unshared and shared from the same weights; return the max gradient difference
    relative to the largest gradient, the losses, and the best-of-`repeats` wall time (s) of each."""
    import torch

    model = Model(cfg, seed, getattr(torch, dtype))
    best = {"unshared": float("inf"), "shared": float("inf")}
    grads: dict[str, dict[str, Any]] = {}
    losses = {}
    for _ in range(repeats):
        for mode, fn in (("unshared", train_unshared), ("shared", train_shared)):
            model.zero_grad()
            t0 = time.perf_counter()
            losses[mode] = fn(model, forest)
            best[mode] = min(best[mode], time.perf_counter() - t0)
            grads[mode] = grads_of(model)
    scale = max(float(g.abs().max()) for g in grads["unshared"].values())
    diff = max(float((grads["shared"][n] - grads["unshared"][n]).abs().max()) for n in grads["unshared"])
    return {"max_rel_grad_error": diff / scale if scale > 0 else diff, "loss_unshared": losses["unshared"],
            "loss_shared": losses["shared"], "unshared_s": best["unshared"], "shared_s": best["shared"],
            "measured_speedup": best["unshared"] / best["shared"]}


def predicted_speedup(forest: TinyForest, cfg: Any) -> float:
    """Return the cost model's unshared / shared FLOPs ratio for a token forest and model shape."""
    from gpuplan.models.psrl.forest import train_flops

    pos = [0] * len(forest.parent)
    for v, p in enumerate(forest.parent):
        pos[v] = pos[p] + len(forest.ids[p]) if p >= 0 else 0
    flops = [train_flops(cfg, pos[v], len(forest.ids[v])) for v in range(len(pos))]
    need: set[int] = set()
    unshared = 0.0
    for e in forest.end:
        path = forest.path(e)
        need.update(path)
        unshared += sum(flops[v] for v in path)
    return unshared / sum(flops[v] for v in need)


# ---------------------------------------------------------------- distributed execution of a plan

def _pack(kvs: list[tuple[Any, Any]], last: Any) -> Any:
    import torch

    return torch.cat([t.reshape(-1) for k, v in kvs for t in (k, v)] + [last.reshape(-1)])


def _unpack(flat: Any, cfg: Any, L: int) -> tuple[list[tuple[Any, Any]], Any]:
    n = cfg.kv * L * cfg.dhead
    out, at = [], 0
    for _ in range(cfg.num_layers):
        k = flat[at:at + n].view(1, cfg.kv, L, cfg.dhead)
        v = flat[at + n:at + 2 * n].view(1, cfg.kv, L, cfg.dhead)
        out.append((k, v))
        at += 2 * n
    return out, flat[at:].view(1, 1, cfg.hidden)


def _rank_main(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One gloo rank: forward its computed nodes depth by depth, exchanging the K/V (and last hidden state)
    of the nodes others receive; backward depth by depth in reverse, returning dK/dV to their sources;
    then sum parameter gradients over the ranks. Returns timings, bytes moved and (rank 0) the gradients."""
    import torch
    import torch.distributed as dist

    from gpuplan.models.workload import TransformerConfig

    cfg = TransformerConfig.model_validate(spec["cfg"])
    forest = TinyForest(spec["parent"], spec["ids"], spec["end"], spec["weight"])
    model = Model(cfg, spec["seed"])
    comp, recv = set(spec["computed"][rank]), set(spec["received"][rank])
    pairs = spec["pairs"]  # [(node, source rank, receiver rank)] in one global order
    depth = [0] * len(forest.parent)
    for v, p in enumerate(forest.parent):
        depth[v] = depth[p] + 1 if p >= 0 else 0
    maxd = max(depth) if depth else 0
    weight = {int(v): w for v, w in spec["loss"][rank].items()}
    kv: dict[int, list[tuple[Any, Any]]] = {}
    last: dict[int, Any] = {}
    hid: dict[int, Any] = {}
    sent: dict[int, Any] = {}      # node -> packed tensor sent (graph output)
    leaves: dict[int, Any] = {}    # node -> packed tensor received (leaf)
    moved = 0
    t0 = time.perf_counter()
    for d in range(maxd + 1):
        for v in sorted(x for x in comp if depth[x] == d):
            anc = forest.path(v)[:-1]
            hid[v], kv[v] = model.segment(torch.tensor(forest.ids[v]), _cat_past(kv, anc))
            last[v] = hid[v][:, -1:]
        for v, src, dst in pairs:
            if depth[v] != d:
                continue
            if rank == src:
                if v not in sent:
                    sent[v] = _pack(kv[v], last[v])
                dist.send(sent[v].detach().contiguous(), dst)
                moved += sent[v].numel() * sent[v].element_size()
            elif rank == dst:
                L = len(forest.ids[v])
                buf = torch.empty(2 * cfg.num_layers * cfg.kv * L * cfg.dhead + cfg.hidden)
                dist.recv(buf, src)
                leaves[v] = buf.requires_grad_(True)
                kv[v], last[v] = _unpack(leaves[v], cfg, L)
    losses = []
    for v in sorted(weight):
        p = forest.parent[v]
        prev = last[p] if p >= 0 else None
        losses.append(model.loss(prev, hid[v], torch.tensor(forest.ids[v])) * weight[v])
    local = torch.stack(losses).sum() if losses else torch.zeros((), requires_grad=False)
    forward_s = time.perf_counter() - t0
    incoming: dict[int, Any] = {}
    for d in range(maxd, -1, -1):
        outs = [local] if local.requires_grad else []
        grads = [torch.ones(())] if local.requires_grad else []
        for v, t in sent.items():
            if depth[v] > d and v in incoming:
                outs.append(t)
                grads.append(incoming[v])
        want = sorted(v for v in leaves if depth[v] == d)
        got: dict[int, Any] = {}
        if want and outs:
            gs = torch.autograd.grad(outs, [leaves[v] for v in want], grads, retain_graph=True, allow_unused=True)
            got = {v: (g if g is not None else torch.zeros_like(leaves[v])) for v, g in zip(want, gs)}
        for v, src, dst in pairs:
            if depth[v] != d:
                continue
            if rank == dst:
                g = got.get(v, torch.zeros_like(leaves[v])).contiguous()
                dist.send(g, src)
                moved += g.numel() * g.element_size()
            elif rank == src:
                buf = torch.empty_like(sent[v])
                dist.recv(buf, dst)
                incoming[v] = incoming[v] + buf if v in incoming else buf
    outs = [local] if local.requires_grad else []
    grads = [torch.ones(())] if local.requires_grad else []
    for v, t in sent.items():
        if v in incoming:
            outs.append(t)
            grads.append(incoming[v])
    if outs:
        torch.autograd.backward(outs, grads)
    compute_s = time.perf_counter() - t0
    flat = []
    for _, p in model.named_parameters():
        flat.append(p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()))
    allg = torch.cat(flat)
    dist.all_reduce(allg)
    out: dict[str, Any] = {"rank": rank, "forward_s": forward_s, "compute_s": compute_s, "moved_bytes": moved,
                           "loss": float(local.detach()) if losses else 0.0}
    if rank == 0:
        out["grads"] = allg.numpy().copy()
    return out


def run_plan(problem: Any, plan: Any, *, layers: int = 2, hidden: int = 64, max_tokens: int = 1536, seed: int = 0,
             timeout_s: float = 300.0, **_: Any) -> dict[str, Any]:
    """`gpuplan run` for psrl plans: run the plan's assignment with a small transformer (`layers`, `hidden`)
    on one gloo process per worker (2-4), segment lengths scaled to at most `max_tokens` deduplicated
    tokens; compare the summed gradients with single-process unshared training and each rank's measured
    compute time with the plan's predicted load share. Returns the figures and a report table."""
    import numpy as np
    import torch

    from gpuplan.errors import InputError
    from gpuplan.models.base import Table
    from gpuplan.runtime.launch import run_workers

    names = problem.worker_names()
    if not 2 <= len(names) <= MAX_RANKS:
        raise InputError(f"gpuplan run executes psrl plans of 2-{MAX_RANKS} workers on local gloo processes; this "
                         f"plan has {len(names)}", field="workers", value=len(names), expected=f"2..{MAX_RANKS}")
    if plan.sharing != "prefix":
        raise InputError("gpuplan run executes prefix-sharing plans; this plan trains every sample alone",
                         field="sharing", value=plan.sharing, expected="prefix")
    cfg = tiny_config(layers, hidden)
    forest, scale = tiny_forest(problem, max_tokens, cfg.vocab, seed)
    f = problem.built
    widx = {n: i for i, n in enumerate(names)}
    nidx = {nid: i for i, nid in enumerate(f.ids)}
    computed = [sorted(nidx[n] for n in plan.computed.get(w, [])) for w in names]
    received = [sorted(nidx[n] for n in plan.received.get(w, [])) for w in names]
    pairs = []
    for r, nodes in enumerate(received):
        for v in nodes:
            src = min(w for w in range(len(names)) if v in computed[w] and w != r)
            pairs.append((v, src, r))
    pairs.sort(key=lambda t: (t[0], t[2]))
    # a node's loss (the weights of every sample ending there, summed) is taken once, by the lowest rank
    # computing it: its logits exist there once, whichever worker the samples were assigned to
    loss: list[dict[int, float]] = [{} for _ in names]
    for s, e in enumerate(forest.end):
        r = min(w for w in range(len(names)) if e in computed[w]) if any(e in c for c in computed) else -1
        if r < 0:
            raise InputError(f"sample {s}'s last node is computed by no worker", field="computed")
        loss[r][e] = loss[r].get(e, 0.0) + forest.weight[s]
    spec = {"cfg": cfg.model_dump(), "parent": forest.parent, "ids": forest.ids, "end": forest.end,
            "weight": forest.weight, "seed": seed, "computed": computed, "received": received, "pairs": pairs, "loss": loss,
            "assign": [widx[w] for w in plan.sample_worker]}
    started = time.perf_counter()
    results = run_workers(_rank_main, len(names), args=(spec,), timeout_s=timeout_s)
    wall = time.perf_counter() - started
    ref = Model(cfg, seed)
    t0 = time.perf_counter()
    train_unshared(ref, forest)
    unshared_s = time.perf_counter() - t0
    want = torch.cat([p.grad.reshape(-1) for _, p in ref.named_parameters()]).numpy()
    got = results[0]["grads"]
    err = float(np.abs(got - want).max() / max(1e-30, float(np.abs(want).max())))
    loads = [plan.load_s.get(w, 0.0) for w in names]
    total_load = sum(loads) or 1.0
    measured = [r["compute_s"] for r in results]
    total_measured = sum(measured) or 1.0
    rows = [[w, loads[i] / total_load, measured[i] / total_measured, measured[i], results[i]["moved_bytes"]]
            for i, w in enumerate(names)]
    report = [Table(f"per rank: share of the step's work, predicted by the plan vs measured (tokens scaled x{scale:.3g})",
                    ["worker", "predicted_share", "measured_share", "compute_s", "moved_bytes"], rows)]
    report.append(Table("gradients of the plan's ranks (K/V and dK/dV exchanged) vs single-process unshared training",
                        ["gradients_match", "max_rel_grad_error", "ranks", "exchanged_bytes", "wall_s"],
                        [[err < 1e-4, err, len(names), sum(r["moved_bytes"] for r in results), wall]]))
    return {"gradients_match": err < 1e-4, "max_rel_grad_error": err, "ranks": len(names),
            "token_scale": scale, "dedup_tokens": sum(len(forest.ids[v]) for v in set().union(
                *[set(forest.path(e)) for e in forest.end])),
            "exchanged_bytes": sum(r["moved_bytes"] for r in results), "wall_s": wall,
            "unshared_single_process_s": unshared_s, "max_rank_compute_s": max(measured),
            "predicted_imbalance": max(loads) / (total_load / len(loads)),
            "measured_imbalance": max(measured) / (total_measured / len(measured)), "report": report}
