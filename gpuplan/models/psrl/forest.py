"""The prefix forest of a psRL batch: a trie over token segments, and its per-node costs.

Node v holds a segment of `tokens_v` tokens starting at absolute position `pos_v` (the sum of
its ancestors' lengths); sample s is the root-to-node path P(s) ending at its node. Pure Python
(no torch, no solver).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig

MAX_NODES = 100_000
"""Most forest nodes a problem may hold (node lists and per-node tables are allocated from it)."""
MAX_SAMPLES = 50_000
"""Most samples a problem may hold."""
MAX_SEGMENT_TOKENS = 1 << 20
"""Most tokens one segment may hold."""
MAX_PATH_TOKENS = 1 << 22
"""Most tokens of one sample (root-to-node path)."""


@dataclass
class Forest:
    """A validated prefix forest: parallel per-node lists indexed 0..n-1 in topological order
    (parents first), and per-sample end nodes, groups and weights.

    ids: the input's node ids; parent: parent index or -1; tokens, pos: segment length and start
    position (tokens); depth: 0 for roots; children: child indices; end: the node each sample ends
    at; group: each sample's group (task) id; weight: each sample's loss weight."""

    ids: list[int]
    parent: list[int]
    tokens: list[int]
    pos: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)

    @property
    def n_nodes(self) -> int:
        """Return the number of nodes."""
        return len(self.parent)

    @property
    def n_samples(self) -> int:
        """Return the number of samples."""
        return len(self.end)

    def path(self, node: int) -> list[int]:
        """Return the node indices from the root down to `node` (inclusive)."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parent[node]
        return out[::-1]

    def sample_path(self, s: int) -> list[int]:
        """Return P(s): the node indices of sample s from its root down to its end node."""
        return self.path(self.end[s])

    def sample_tokens(self, s: int) -> int:
        """Return the length in tokens of sample s (its whole path)."""
        v = self.end[s]
        return self.pos[v] + self.tokens[v]

    def root_of(self, node: int) -> int:
        """Return the root index of the tree holding `node`."""
        while self.parent[node] >= 0:
            node = self.parent[node]
        return node

    def used(self) -> list[bool]:
        """Return, per node, whether some sample's path passes through it."""
        out = [False] * self.n_nodes
        for e in self.end:
            v = e
            while v >= 0 and not out[v]:
                out[v] = True
                v = self.parent[v]
        return out

    def samples_below(self) -> list[list[int]]:
        """Return, per node, the samples whose path passes through it (ordered by sample index)."""
        out: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for s, e in enumerate(self.end):
            v = e
            while v >= 0:
                out[v].append(s)
                v = self.parent[v]
        return out

    def dfs_samples(self, samples: list[int] | None = None) -> list[int]:
        """Return the samples (all, or those given) in depth-first order of the trie: a sample ending
        at a node comes before the samples below it, siblings in index order. The micro-batch order that
        keeps a prefix's K/V cached while its descendants run."""
        want = set(range(self.n_samples)) if samples is None else set(samples)
        at: dict[int, list[int]] = {}
        for s in sorted(want):
            at.setdefault(self.end[s], []).append(s)
        out: list[int] = []
        stack = [r for r in range(self.n_nodes - 1, -1, -1) if self.parent[r] < 0]
        while stack:
            v = stack.pop()
            out += at.get(v, [])
            stack.extend(reversed(self.children[v]))
        return out


def build_forest(nodes: list[tuple[int, int, int]], samples: list[tuple[int, int, float]]) -> Forest:
    """Return the Forest of (id, parent id or -1, tokens) nodes and (end node id, group, weight) samples.

    Raises ValueError (worded 'at FIELD: expected') on a duplicate id, an unknown parent, a cycle, a
    sample ending at an unknown node, or a path longer than MAX_PATH_TOKENS.
    """
    if len(nodes) > MAX_NODES:
        raise ValueError(f"at nodes: at most {MAX_NODES:,} nodes, not {len(nodes):,}")
    if len(samples) > MAX_SAMPLES:
        raise ValueError(f"at samples: at most {MAX_SAMPLES:,} samples, not {len(samples):,}")
    index: dict[int, int] = {}
    for i, (nid, _, _) in enumerate(nodes):
        if nid in index:
            raise ValueError(f"at nodes[{i}].id: distinct node ids, but {nid} repeats")
        index[nid] = i
    kids: list[list[int]] = [[] for _ in nodes]
    roots = []
    for i, (nid, par, _) in enumerate(nodes):
        if par < 0:
            roots.append(i)
        elif par not in index:
            raise ValueError(f"at nodes[{i}].parent: the id of another node or -1 for a root, not {par}")
        else:
            kids[index[par]].append(i)
    order: list[int] = []
    stack = roots[::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids[i]))
    if len(order) != len(nodes):
        bad = sorted(set(range(len(nodes))) - set(order))[0]
        raise ValueError(f"at nodes[{bad}].parent: a forest, but node {nodes[bad][0]} lies on a cycle of parents")
    new = {old: k for k, old in enumerate(order)}
    f = Forest(ids=[nodes[i][0] for i in order], parent=[-1] * len(order), tokens=[nodes[i][2] for i in order])
    f.pos, f.depth = [0] * len(order), [0] * len(order)
    f.children = [[] for _ in order]
    for k, i in enumerate(order):
        par = nodes[i][1]
        if par >= 0:
            p = new[index[par]]
            f.parent[k] = p
            f.pos[k] = f.pos[p] + f.tokens[p]
            f.depth[k] = f.depth[p] + 1
            f.children[p].append(k)
            if f.pos[k] + f.tokens[k] > MAX_PATH_TOKENS:
                raise ValueError(f"at nodes[{i}].tokens: paths of at most {MAX_PATH_TOKENS:,} tokens, but node "
                                 f"{nodes[i][0]} ends at position {f.pos[k] + f.tokens[k]:,}")
    for j, (nid, grp, w) in enumerate(samples):
        if nid not in index:
            raise ValueError(f"at samples[{j}].node: the id of a node, not {nid}")
        f.end.append(new[index[nid]])
        f.group.append(grp)
        f.weight.append(w)
    return f


# ---------------------------------------------------------------- per-node costs

def attention_pairs(pos: int, tokens: int) -> float:
    """Return the (query, key) pairs of a causal segment of `tokens` tokens starting at `pos`:
    token i (0-based absolute) attends to i + 1 keys, so the sum is tokens*pos + tokens*(tokens+1)/2."""
    return tokens * pos + tokens * (tokens + 1) / 2.0


def token_flops(cfg: TransformerConfig) -> float:
    """Return the forward FLOPs per token that do not depend on position: every layer's dense
    matmuls (2 FLOPs per weight) and the output head."""
    return 2.0 * cfg.num_layers * (cfg.layer_params() - 2 * cfg.hidden) + 2.0 * cfg.hidden * cfg.vocab


def pair_flops(cfg: TransformerConfig) -> float:
    """Return the forward FLOPs per causal (query, key) pair over all layers (QK^T and AV)."""
    return 4.0 * cfg.num_layers * cfg.heads * cfg.dhead


def train_flops(cfg: TransformerConfig, pos: int, tokens: int) -> float:
    """Return the forward + backward FLOPs (3x forward) of a segment of `tokens` tokens at `pos`:
    c(v) = 3 * (tokens * token_flops + pairs * pair_flops), causal attention by position."""
    return 3.0 * (tokens * token_flops(cfg) + attention_pairs(pos, tokens) * pair_flops(cfg))


def kv_bytes_per_token(cfg: TransformerConfig, dtype: str) -> float:
    """Return the K/V cache bytes of one token over all layers (K and V, grouped-query heads)."""
    return 2.0 * cfg.num_layers * cfg.kv * cfg.dhead * DTYPE_BYTES[dtype]


def activation_bytes_per_token(cfg: TransformerConfig) -> float:
    """Return the activation bytes one token keeps for backward over all layers (16-bit training,
    fused attention: Korthikanti et al.'s count, linear in tokens)."""
    return cfg.num_layers * cfg.layer_activation_bytes(1, 1)


def node_flops(forest: Forest, cfg: TransformerConfig) -> list[float]:
    """Return c(v) per node: forward + backward FLOPs of its segment at its position."""
    return [train_flops(cfg, p, t) for p, t in zip(forest.pos, forest.tokens)]


def path_flops(forest: Forest, cfg: TransformerConfig) -> list[float]:
    """Return, per sample, the FLOPs of training it alone (its whole path, no sharing)."""
    flops = node_flops(forest, cfg)
    acc = [0.0] * forest.n_nodes
    for v in range(forest.n_nodes):  # topological order: parents first
        acc[v] = flops[v] + (acc[forest.parent[v]] if forest.parent[v] >= 0 else 0.0)
    return [acc[e] for e in forest.end]


def token_counts(forest: Forest) -> tuple[int, int]:
    """Return (raw tokens: every sample's whole path summed, deduplicated tokens: each used node once)."""
    raw = sum(forest.sample_tokens(s) for s in range(forest.n_samples))
    used = forest.used()
    dedup = sum(t for t, u in zip(forest.tokens, used) if u)
    return raw, dedup
