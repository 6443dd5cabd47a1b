"""Stage B of Hetis: where each request's KV heads go (head-wise decode attention dispatch).

A dispatch instance is a batch of requests r (each with H KV heads, a weighing context ctx_r in
tokens and a memory footprint m_r in tokens) to place on devices g that already carry a load. With
n_rg heads of r on g (the same split in every layer):

    T_g = base_s_g + s_g * sum_r n_rg * ctx_r + [N_g > 0] * (c0_g + c1_g * N_g),
    N_g = base_heads_g + sum_r n_rg                         (heads on g in the iteration)
    sum_g n_rg = H (every head once);  sum_r n_rg * m_r <= free_g (head-tokens of memory)

and the decode step's attention is max_g T_g, which dispatch minimises. When several data-parallel
replicas pool their decode attention over all GPUs, the costs are per replica and device (a device is
one replica's primary and another's remote attention worker) and T_g counts every replica's heads on g
(DispatchInstance.group). Pure numpy here: the
production water-filling heuristic (O(H * |G|) per request, plus a bounded local improvement for
batches) and the static splits of the baselines; the LP relaxation and the exact CP-SAT model live
in gpuplan/solvers/hetis_dispatch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DispatchInstance:
    """A batch to place. Arrays over devices (G): base_s, free_head_tokens. Per replica k and device g
    (K x G, or G when K = 1): s_per_head_token (s per head per context token), c0_s (message latency of
    replica k's heads on g, paid once when any is there), c1_s_per_head, base_heads (heads of replica k's
    active requests on g). Arrays over requests (R): ctx_tokens, mem_tokens, and `group` (the replica
    each request belongs to; all 0 by default). heads: KV heads per request (H).

    With several replicas pooling their decode attention over all GPUs, device g serves every replica's
    heads: T_g = base_s_g + sum_k [N_kg > 0] (c0_kg + c1_kg N_kg) + sum_r n_rg s_{k_r g} ctx_r, with
    N_kg = base_heads_kg + sum_{r in k} n_rg; memory counts every request on g."""

    s_per_head_token: np.ndarray
    c0_s: np.ndarray
    c1_s_per_head: np.ndarray
    base_s: np.ndarray
    base_heads: np.ndarray
    free_head_tokens: np.ndarray
    ctx_tokens: np.ndarray
    mem_tokens: np.ndarray
    heads: int
    group: np.ndarray | None = None

    @property
    def devices(self) -> int:
        """Return the number of devices G."""
        return len(self.free_head_tokens)

    @property
    def groups(self) -> np.ndarray:
        """Return the replica index of each request (R ints)."""
        if self.group is None:
            return np.zeros(len(self.ctx_tokens), dtype=np.int64)
        return np.asarray(self.group, dtype=np.int64)

    def per_group(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return (s, c0, c1, base_heads) as K x G arrays (s per head-token, s, s per head, heads)."""
        S = np.atleast_2d(np.asarray(self.s_per_head_token, dtype=float))
        K = max(S.shape[0], int(self.groups.max()) + 1 if len(self.ctx_tokens) else 1)

        def two(a: np.ndarray) -> np.ndarray:
            a = np.atleast_2d(np.asarray(a, dtype=float))
            return np.broadcast_to(a, (K, self.devices)) if a.shape[0] == 1 else a
        return two(S), two(self.c0_s), two(self.c1_s_per_head), two(self.base_heads)


def group_heads(inst: DispatchInstance, n: np.ndarray,
                pg: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """Return N (K x G): heads of each replica on each device, its active requests' and the placement's.
    `pg`: inst.per_group() when the caller has it."""
    _, _, _, bh = pg or inst.per_group()
    out = bh.copy()
    np.add.at(out, inst.groups, n)
    return out


def device_times(inst: DispatchInstance, n: np.ndarray, pg: tuple[np.ndarray, ...] | None = None,
                 N: np.ndarray | None = None) -> np.ndarray:
    """Return T_g (s) per device for the placement n (R x G head counts); `pg` (inst.per_group()) and `N`
    (group_heads) when the caller has them."""
    pg = pg or inst.per_group()
    S, c0, c1, _ = pg
    N = group_heads(inst, n, pg) if N is None else N
    t = inst.base_s + ((S[inst.groups] * inst.ctx_tokens[:, None]) * n).sum(axis=0)
    return t + np.where(N > 0, c0 + c1 * N, 0.0).sum(axis=0)


def objective_s(inst: DispatchInstance, n: np.ndarray) -> float:
    """Return max_g T_g (s): the decode step's attention time under placement n."""
    return float(device_times(inst, n).max()) if inst.devices else 0.0


def violations(inst: DispatchInstance, n: np.ndarray) -> list[str]:
    """Return what placement n breaks: a request without exactly H heads, a negative count, memory."""
    out = []
    sums = n.sum(axis=1)
    for r in np.flatnonzero(sums != inst.heads):
        out.append(f"request {r} has {int(sums[r])} heads placed; it has {inst.heads}")
    if np.any(n < 0):
        out.append("a negative head count")
    used = inst.mem_tokens @ n
    for g in np.flatnonzero(used > inst.free_head_tokens * (1 + 1e-9) + 1e-9):
        out.append(f"device {g} holds {used[g]:.6g} head-tokens; it has room for {inst.free_head_tokens[g]:.6g}")
    return out


def water_filling(inst: DispatchInstance, *, improve: bool = True) -> np.ndarray | None:
    """Return the R x G head counts of the water-filling heuristic, or None when some head fits nowhere.

    Requests go in decreasing context order (largest first); each of their heads goes to the device
    whose time after taking it is smallest among the devices with memory left for it (a device's time
    counts every replica's heads on it; a replica pays a device's message latency once). With `improve`,
    single-head moves off the slowest device follow while they lower the maximum (at most 256; they
    fix the greedy's myopia about a device's fixed message latency). O(H * G) per request before them."""
    R, G, H = len(inst.ctx_tokens), inst.devices, inst.heads
    pg = inst.per_group()
    S, c0, c1, _ = pg
    grp = inst.groups
    n = np.zeros((R, G), dtype=np.int64)
    N = group_heads(inst, n, pg)
    t = device_times(inst, n, pg)
    free = inst.free_head_tokens.astype(float).copy()
    order = np.argsort(-inst.ctx_tokens, kind="stable")
    for r in order:
        k = grp[r]
        add = S[k] * inst.ctx_tokens[r] + c1[k]
        m = inst.mem_tokens[r]
        for _ in range(H):
            cand = t + add + np.where(N[k] > 0, 0.0, c0[k])
            cand = np.where(free >= m - 1e-9, cand, np.inf)
            g = int(np.argmin(cand))
            if not np.isfinite(cand[g]):
                return None
            n[r, g] += 1
            N[k, g] += 1
            t[g] = cand[g]
            free[g] -= m
    if improve:
        local_improve(inst, n)
    return n


def local_improve(inst: DispatchInstance, n: np.ndarray, max_moves: int | None = None) -> np.ndarray:
    """Move single heads off the slowest device (or swap two requests' heads when memory binds) while that
    lowers max_g T_g; return n (changed in place)."""
    limit = max_moves if max_moves is not None else min(256, 4 * inst.heads * max(1, len(inst.ctx_tokens)))
    pg = inst.per_group()
    S, c0, c1, _ = pg
    grp = inst.groups
    used = inst.mem_tokens @ n
    for _ in range(limit):
        N = group_heads(inst, n, pg)
        t = device_times(inst, n, pg, N)
        g = int(np.argmax(t))
        rest = np.delete(t, g)
        best = (t[g] * (1 - 1e-12), -1, -1)
        for r in np.flatnonzero(n[:, g] > 0):
            k = grp[r]
            # g after giving one head of r away; every h after taking it (vectorised over h)
            tg = t[g] - S[k, g] * inst.ctx_tokens[r] - c1[k, g] - (c0[k, g] if N[k, g] == 1 else 0.0)
            th = t + S[k] * inst.ctx_tokens[r] + c1[k] + np.where(N[k] > 0, 0.0, c0[k])
            th = np.where(used + inst.mem_tokens[r] <= inst.free_head_tokens + 1e-9, th, np.inf)
            th[g] = np.inf
            for h in np.argsort(th, kind="stable")[:3]:  # the three cheapest receivers suffice
                if not np.isfinite(th[h]):
                    break
                others = np.delete(rest, h if h < g else h - 1) if len(rest) > 1 else rest[:0]
                val = max(tg, th[h], float(others.max()) if len(others) else -np.inf)
                if val < best[0]:
                    best = (val, int(r), int(h))
        if best[1] < 0:
            if not _swap(inst, n, used, g, t[g]):
                break
            continue
        _, r, h = best
        n[r, g] -= 1
        n[r, h] += 1
        used[g] -= inst.mem_tokens[r]
        used[h] += inst.mem_tokens[r]
    return n


def _swap(inst: DispatchInstance, n: np.ndarray, used: np.ndarray, g: int, t_g: float) -> bool:
    """Exchange one head of a request on the slowest device g with one head of another request on a
    device h when that lowers max_g T_g within memory (what a single move cannot do when memory binds);
    return True when a swap was made (n and used changed in place)."""
    best = (t_g * (1 - 1e-12), None)
    m = inst.mem_tokens
    pg = inst.per_group()
    for r in np.flatnonzero(n[:, g] > 0):
        for h in range(inst.devices):
            if h == g:
                continue
            for q in np.flatnonzero(n[:, h] > 0):
                if q == r:
                    continue
                if used[h] - m[q] + m[r] > inst.free_head_tokens[h] + 1e-9 or \
                        used[g] - m[r] + m[q] > inst.free_head_tokens[g] + 1e-9:
                    continue
                n[r, g] -= 1; n[r, h] += 1; n[q, h] -= 1; n[q, g] += 1  # noqa: E702
                val = float(device_times(inst, n, pg).max())
                n[r, g] += 1; n[r, h] -= 1; n[q, h] += 1; n[q, g] -= 1  # noqa: E702
                if val < best[0]:
                    best = (val, (int(r), h, int(q)))
    if best[1] is None:
        return False
    r, h, q = best[1]
    n[r, g] -= 1; n[r, h] += 1; n[q, h] -= 1; n[q, g] += 1  # noqa: E702
    used[g] += m[q] - m[r]
    used[h] += m[r] - m[q]
    return True


def proportional_split(weights: np.ndarray, heads: int) -> np.ndarray:
    """Return integer head counts proportional to `weights` summing to `heads` (largest remainder;
    ties to the lower index). Raises ValueError when every weight is zero."""
    w = np.asarray(weights, dtype=float)
    if not np.any(w > 0):
        raise ValueError("no device has a positive weight")
    share = w / w.sum() * heads
    base = np.floor(share).astype(np.int64)
    rest = heads - int(base.sum())
    order = np.lexsort((np.arange(len(w)), -(share - base)))
    base[order[:rest]] += 1
    return base


def largest_remainder_rounding(x: np.ndarray, inst: DispatchInstance) -> np.ndarray:
    """Return integer head counts from a fractional placement x (R x G): each request keeps floor(x) and
    its remaining heads go to the largest fractional parts, skipping devices whose memory is full."""
    n = np.floor(x + 1e-9).astype(np.int64)
    used = inst.mem_tokens @ n
    for r in range(len(x)):
        rest = inst.heads - int(n[r].sum())
        frac = x[r] - n[r]
        for g in np.lexsort((np.arange(inst.devices), -frac)):
            if rest <= 0:
                break
            if used[g] + inst.mem_tokens[r] <= inst.free_head_tokens[g] + 1e-9:
                n[r, g] += 1
                used[g] += inst.mem_tokens[r]
                rest -= 1
        while rest > 0:  # memory-blind fallback: the least loaded devices (check reports any overflow)
            g = int(np.argmin(device_times(inst, n)))
            n[r, g] += 1
            rest -= 1
    return n
