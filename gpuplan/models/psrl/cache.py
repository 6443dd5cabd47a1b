"""psRL's KV-cache manager [R]: adaptable block sizes per node and next-use (Belady) eviction.

Block sizes: each node's segment is covered by a multiset of blocks from BLOCK_SIZES tokens that
minimises padding tokens + `overhead_tokens` per block (a coin-change DP). Four blocks of one size
never beat one block of the next size (same tokens, more blocks), so an optimal cover holds at most
three of each smaller size (1008 tokens < 1024): it is floor(L/1024) or that + 1 large blocks and a
remainder covered optimally from a table computed once.

Eviction: the update phase knows every worker's micro-batch order in advance, so the cache evicts
the entry whose next use lies farthest ahead (Belady/MIN) and bypasses (does not admit) an entry
whose next use is farther than every entry it would displace. Optimal for equal sizes; a heuristic
for unequal ones. LRU is kept as the reference policy.
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

BLOCK_SIZES = (1024, 256, 64, 16)
"""Allowed block sizes in tokens, largest first (the plan stores counts in this order)."""


@lru_cache(maxsize=64)
def _remainder_table(overhead_tokens: float) -> tuple[tuple[int, ...], ...]:
    """Return, for r in 0..1024, the cheapest counts (n256, n64, n16) or (1, 0, 0, 0)-style cover of r
    tokens by blocks of 1024/256/64/16 (at most one 1024), as 4-tuples in BLOCK_SIZES order."""
    out = []
    for r in range(1025):
        best: tuple[float, tuple[int, ...]] | None = None
        for big in (0, 1):
            for a in range(4):
                for b in range(4):
                    for c in range(4):
                        cap = 1024 * big + 256 * a + 64 * b + 16 * c
                        if cap < r:
                            continue
                        n = big + a + b + c
                        cost = (cap - r) + overhead_tokens * n
                        key = (cost, (big, a, b, c))
                        if best is None or key < best:
                            best = key
        assert best is not None
        out.append(best[1])
    return tuple(out)


def block_counts(tokens: int, overhead_tokens: float = 4.0) -> list[int]:
    """Return the block counts [n1024, n256, n64, n16] covering `tokens` tokens at least cost
    (padding tokens + overhead_tokens per block); [0, 0, 0, 0] for an empty segment."""
    if tokens <= 0:
        return [0, 0, 0, 0]
    full, r = divmod(tokens, 1024)
    big, a, b, c = _remainder_table(float(overhead_tokens))[r]
    if r == 0:
        big, a, b, c = 0, 0, 0, 0
    return [full + big, a, b, c]


def block_cost(tokens: int, counts: list[int], overhead_tokens: float) -> float:
    """Return the cost of a cover: padding tokens + overhead_tokens per block (inf if it does not cover)."""
    cap = sum(n * b for n, b in zip(counts, BLOCK_SIZES))
    if cap < tokens:
        return math.inf
    return (cap - tokens) + overhead_tokens * sum(counts)


def allocated_tokens(counts: list[int]) -> int:
    """Return the tokens the blocks of a cover hold (the segment plus its padding)."""
    return sum(n * b for n, b in zip(counts, BLOCK_SIZES))


def simulate(accesses: list[int], sizes: dict[int, float], weights: dict[int, float], budget: float,
             policy: str = "belady", costs: dict[int, float] | None = None) -> dict[str, float]:
    """Replay `accesses` (node ids in the worker's processing order) on a cache of `budget` bytes.

    sizes: bytes each entry occupies (allocated blocks); weights: what a hit on it saves (tokens).
    The first access to an entry is compulsory (it is computed then); a later access is a reuse, a
    hit when the entry is still cached. policy: 'belady' (evict the farthest next use, bypass an
    entry used later than all it would displace) or 'lru'. Returns reuse_tokens, hit_tokens, hit_rate
    (hit / reuse tokens, 1.0 when nothing is reused), peak_bytes, evictions and miss_cost (the sum of
    `costs` (default 0) over the reuses that miss: what re-creating the evicted entries costs).
    """
    n = len(accesses)
    nxt = [math.inf] * n
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(accesses[i], math.inf)
        last[accesses[i]] = i
    cached: dict[int, float] = {}  # entry -> its next use (belady) or last use (lru)
    heap: list[tuple[float, int]] = []  # belady: (-next use, entry); lru: (last use, entry); lazy deletion
    used = 0.0
    seen: set[int] = set()
    reuse = hit = 0.0
    miss_cost = 0.0
    peak = 0.0
    evictions = 0
    for i, v in enumerate(accesses):
        w = weights.get(v, 0.0)
        if v in seen:
            reuse += w
            if v in cached:
                hit += w
            elif costs is not None:
                miss_cost += costs.get(v, 0.0)
        seen.add(v)
        key = nxt[i] if policy == "belady" else float(i)
        if v in cached:
            cached[v] = key
            heapq.heappush(heap, (-key if policy == "belady" else key, v))
            continue
        if nxt[i] == math.inf and policy == "belady":
            continue  # never used again: not admitted
        size = sizes.get(v, 0.0)
        if size > budget:
            continue
        # evict until it fits; Belady bypasses when the victim is needed sooner than v
        while used + size > budget and heap:
            k, u = heap[0]
            cur = cached.get(u)
            if cur is None or (-k if policy == "belady" else k) != cur:
                heapq.heappop(heap)
                continue
            if policy == "belady" and cur <= nxt[i]:
                break
            heapq.heappop(heap)
            del cached[u]
            used -= sizes.get(u, 0.0)
            evictions += 1
        if used + size > budget:
            continue
        cached[v] = key
        used += size
        heapq.heappush(heap, (-key if policy == "belady" else key, v))
        peak = max(peak, used)
    return {"reuse_tokens": reuse, "hit_tokens": hit, "hit_rate": hit / reuse if reuse > 0 else 1.0,
            "peak_bytes": peak, "evictions": float(evictions), "miss_cost": miss_cost}
