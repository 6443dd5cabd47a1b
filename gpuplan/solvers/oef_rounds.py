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

from typing import Any

import numpy as np

from gpuplan.models.oef import Arrays, OefProblem


def choose(owed: np.ndarray, allowed: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> list[tuple[int, int]]:
    """Return the (job, type) pairs that run in one round: most-owed first, one type per job, while
    the type has `gpus[job]` free GPUs. `owed` is rounds owed minus received (jobs x types)."""
    free = capacity.astype(float).copy()
    cand = np.argwhere(allowed & (owed > 1e-9))
    order = np.lexsort((cand[:, 1], cand[:, 0], -owed[cand[:, 0], cand[:, 1]]))
    busy: set[int] = set()
    out = []
    for i, j in cand[order]:
        if i in busy or free[j] < gpus[i]:
            continue
        busy.add(int(i))
        free[j] -= gpus[i]
        out.append((int(i), int(j)))
    return out


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
        free = {t: {n: list(ids) for n, ids in nodes.items()} for t, nodes in self.pools.items()}
        free_set = {t: {g for ids in nodes.values() for g in ids} for t, nodes in self.pools.items()}
        out: dict[Any, list[int]] = {}
        for key, t, g in sorted(jobs, key=lambda x: -x[2]):
            prev = self.previous.get(key)
            if prev and prev[0] == t and len(prev[1]) == g and all(x in free_set[t] for x in prev[1]):
                self._take(free[t], free_set[t], prev[1])
                out[key] = prev[1]
                continue
            nodes = free[t]
            fits = [n for n, free_ids in nodes.items() if len(free_ids) >= g]
            if fits:
                n = min(fits, key=lambda n: (len(nodes[n]), n))
                ids = nodes[n][:g]
            else:
                ids = []
                for n in sorted(nodes, key=lambda n: (-len(nodes[n]), n)):
                    ids += nodes[n][: g - len(ids)]
                    if len(ids) == g:
                        break
            self._take(nodes, free_set[t], ids)
            out[key] = ids
        self.previous = {k: (t, out[k]) for k, t, _ in jobs}
        return out

    def _take(self, nodes: dict[str, list[int]], free_set: set[int], ids: list[int]) -> None:
        taken = set(ids)
        for n in {self.node_of[x] for x in ids}:
            nodes[n] = [x for x in nodes[n] if x not in taken]
        free_set.difference_update(taken)


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

