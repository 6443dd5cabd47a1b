"""From fractional shares to rounds of whole GPUs, and from rounds to GPU ids.

Rounds (time slicing, as round-based schedulers do): in every round each job runs on its GPUs of
one type or waits. Job i is owed (r + 1) * X[i, j] rounds on type j after round r; the jobs most
behind (largest owed minus received, > 0) are served first while that type has free GPUs. When
capacity is not binding a job is never more than one round off its share, so over R rounds the
realised fraction is within 1/R of X; binding capacity and packing of multi-GPU jobs add a few
rounds at most. The problem's `round_tolerance` (default 0.1) is the bound `check` enforces.

Placement (argued greedy): in a round, the jobs on one type are placed largest first (so small
jobs cannot fragment nodes a large job needs); a job keeps the GPUs it held in the previous round
when they are all still free (no migration), else goes to the node
with the fewest free GPUs that still fits it whole (best fit), else spans the nodes with the most
free GPUs. With power-of-two job sizes and node sizes, best-fit-decreasing puts every job that fits
in a node on one node, the minimum.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from gpuplan.models.oef import Arrays, OefProblem


def choose(owed: np.ndarray, allowed: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> list[tuple[int, int]]:
    """Return the (job, type) pairs that run in one round: most-owed first, one type per job, while
    the type has `gpus[job]` free GPUs. `owed` is rounds owed minus received (jobs x types).

    Ties in what is owed go to the larger job (it is the harder one to fit later), then to the
    lower job and type index. O(candidates log candidates) per round.
    """
    free = capacity.astype(float).copy()
    cand = np.argwhere(allowed & (owed > 1e-9))
    if not len(cand):
        return []
    i_all, j_all = cand[:, 0], cand[:, 1]
    order = np.lexsort((j_all, i_all, -gpus[i_all], -owed[i_all, j_all]))
    busy = np.zeros(len(owed), dtype=bool)
    out = []
    for i, j in zip(i_all[order].tolist(), j_all[order].tolist()):
        if busy[i] or free[j] < gpus[i]:
            continue
        busy[i] = True
        free[j] -= gpus[i]
        out.append((i, j))
    return out


class _FreePool:
    """The free GPUs of one type in one round: ids per node and nodes bucketed by free count, so
    best fit and spanning cost O(node size) per job instead of a scan of every node."""

    def __init__(self, nodes: dict[str, list[int]]) -> None:
        self.ids = {n: list(ids) for n, ids in nodes.items()}
        self.free = {g for ids in nodes.values() for g in ids}
        self.size = max((len(ids) for ids in nodes.values()), default=0)
        self.buckets: list[list[str]] = [[] for _ in range(self.size + 1)]
        for n in sorted(nodes):
            self.buckets[len(nodes[n])].append(n)

    def best_fit(self, g: int) -> list[int]:
        """Return g free ids on the node with the fewest free GPUs that fits g (lowest name on ties),
        else on the nodes with the most free GPUs first; [] when fewer than g are free."""
        if g > len(self.free):
            return []
        for c in range(g, self.size + 1):
            if self.buckets[c]:
                return self.ids[self.buckets[c][0]][:g]
        ids: list[int] = []
        for c in range(self.size, 0, -1):
            for n in self.buckets[c]:
                ids += self.ids[n][: g - len(ids)]
                if len(ids) == g:
                    return ids
        return ids

    def take(self, ids: list[int], node_of: dict[int, str]) -> None:
        """Mark `ids` used, moving each touched node to the bucket of its new free count."""
        taken = set(ids)
        self.free.difference_update(taken)
        for n in {node_of[x] for x in ids}:
            before = len(self.ids[n])
            self.ids[n] = [x for x in self.ids[n] if x not in taken]
            bucket = self.buckets[before]
            del bucket[bisect.bisect_left(bucket, n)]
            bisect.insort(self.buckets[len(self.ids[n])], n)


class Placer:
    """Places the jobs of each round on GPU ids of a cluster, keeping jobs where they were."""

    def __init__(self, problem: OefProblem) -> None:
        self.pools: dict[str, dict[str, list[int]]] = {}
        self.node_of: dict[int, str] = {}
        for d in problem.cluster.devices:
            self.pools.setdefault(d.type, {}).setdefault(d.node, []).append(d.id)
            self.node_of[d.id] = d.node
        self.previous: dict[Any, tuple[str, list[int]]] = {}

    def place(self, jobs: list[tuple[Any, str, int]]) -> dict[Any, list[int]]:
        """Return GPU ids for each (job key, type, GPUs) of one round (largest jobs first)."""
        free = {t: _FreePool(nodes) for t, nodes in self.pools.items()}
        out: dict[Any, list[int]] = {}
        for key, t, g in sorted(jobs, key=lambda x: -x[2]):
            pool = free[t]
            prev = self.previous.get(key)
            if prev and prev[0] == t and len(prev[1]) == g and all(x in pool.free for x in prev[1]):
                ids = prev[1]
            else:
                ids = pool.best_fit(g)
            pool.take(ids, self.node_of)
            out[key] = ids
        self.previous = {k: (t, out[k]) for k, t, _ in jobs}
        return out


def schedule(problem: OefProblem, a: Arrays, X: np.ndarray, rounds: int) -> list[list[tuple[int, str, list[int]]]]:
    """Return `rounds` rounds: for each, (job index, GPU type, GPU ids) of every job that runs."""
    received = np.zeros_like(X)
    allowed = X > 1e-9
    placer = Placer(problem)
    out = []
    for r in range(rounds):
        pairs = choose((r + 1) * X - received, allowed, a.gpus, a.capacity)
        for i, j in pairs:
            received[i, j] += 1
        ids = placer.place([(i, a.types[j], int(a.gpus[i])) for i, j in pairs])
        out.append([(i, a.types[j], ids[i]) for i, j in sorted(pairs)])
    return out

