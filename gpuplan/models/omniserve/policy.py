"""The serving policies OmniServe is compared in, on the shared engine (gpuplan.sim.serving):

omniserve  LS on the GPU with priority; BE prefill on the GPU, then BE KV on a CPU pool (cluster-level
           first-fit-decreasing packing on memory and attention rate); BE decode attention runs on the
           pool one layer at a time and is merged (piggybacked) at that layer by a later GPU iteration;
           the piggyback batch is binary-searched against the TPOT target; LS admission control by
           forward simulation; optionally a share of GPU KV memory for GPU-resident BE.
headroom   Llumnix-style memory headroom: LS and BE on the GPU, BE KV at most a fraction X of the cache,
           LS first (BE preempted by recompute when LS needs memory).
neo        NEO-style: GPU first; when GPU KV memory is full, BE KV moves to the host CPU and all of its
           decode attention runs there each iteration, overlapped with the GPU (the CPU batch is kept
           within the GPU's iteration time, NEO's load-aware rule).
sarathi    Sarathi-Serve on the GPU only (gpuplan.sim.serving.SarathiPolicy, both classes FCFS).

`Recorder` wraps any of them: it counts BE tokens inside the measurement window, stops the run once
the LS load is served, and records the explicit per-iteration schedule of small instances.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuplan.models.omniserve.control import decide, pack_ffd
from gpuplan.models.omniserve.costs import Latency
from gpuplan.models.omniserve.problem import OmniServeProblem
from gpuplan.sim.serving import BE, LS, EngineState, Iteration

_EMPTY = np.zeros(0, dtype=np.int64)
NONE, ON_GPU, ON_CPU = 0, 1, 2
PACK_WAVE = 32   # waiting BE requests packed onto pools at once


@dataclass(frozen=True)
class PolicyParams:
    """What a plan states about its policy: the mode, the token budget (tokens per iteration), the TPOT
    target per iteration (s), the share of GPU KV memory BE may hold (0..1), LS admission control on or
    off, the binary search's upper bound on piggyback rows per iteration, the pace factor of the pool
    packing (a pool takes BE requests while their KV tokens per layer stay within pace_factor x its
    attention rate x the TPOT target), the KV watermark (fraction of the cache kept free) and the most
    layers a piggybacked BE request may advance in one iteration (1: the notes' model; more: a result
    back before its layer's out-projection joins the same pass), and the most BE requests decoding from CPU
    pools at once, prefills bound for a pool included (0: as many as the pools' memory and pace hold).

    Why a bound on BE in flight [R]: with one layer per pass every piggybacked BE request advances one
    layer per GPU iteration, so a BE prefill chunk that stretches the iteration to the TPOT target slows
    every in-flight decode (measured: 0.026 s iterations with the pools full, 0.2 s while BE prefills);
    past some in-flight count, starting one more BE prefill costs more BE tokens than it adds. For the same
    reason the BE prefill tokens per iteration may be bounded (`be_prefill_max`; 0: what the token budget
    leaves): above the dense staircase's floor the GPU prefills at about the same tokens per second with
    small chunks as with large ones, while short iterations give every piggybacked request more passes."""

    mode: str
    token_budget: int
    tpot_target_s: float
    be_gpu_fraction: float = 0.0
    admission: bool = False
    be_batch_max: int = 4096
    pace_factor: float = 1.0
    watermark: float = 0.01
    layers_per_iteration: int = 1
    be_inflight_max: int = 0
    be_prefill_max: int = 0


class Pools:
    """The CPU pools' state: attention rate (token-layers/s), memory (bytes) reserved, FIFO busy time."""

    def __init__(self, problem: OmniServeProblem, names: list[str] | None = None) -> None:
        pools = [(n, p) for n, p in problem.pools() if names is None or n in names]
        self.names = [n for n, _ in pools]
        self.theta = np.array([p.attention_tokens_per_s for _, p in pools], dtype=float)
        self.memory = np.array([p.memory_bytes for _, p in pools], dtype=float)
        self.bw_Bps = np.array([p.network_gbps * 1e9 / 8 for _, p in pools], dtype=float)
        self.latency = np.array([p.latency_s for _, p in pools], dtype=float)
        self.reserved = np.zeros(len(pools))
        self.load = np.zeros(len(pools))          # KV tokens per layer of the requests each pool holds
        self.busy = np.zeros(len(pools))

    def __len__(self) -> int:
        return len(self.names)


class MixedPolicy:
    """One GPU engine serving LS and BE with LS priority; `params.mode` selects omniserve, headroom or neo
    (see the module docstring). All times in seconds, memory in tokens (GPU) or bytes (pools)."""

    def __init__(self, problem: OmniServeProblem, lat: Latency, params: PolicyParams) -> None:
        if params.mode not in ("omniserve", "headroom", "neo"):
            raise ValueError(f"mode {params.mode!r}; expected omniserve, headroom or neo")
        self.p = params
        self.problem = problem
        self.lat = lat
        self.L = lat.layers
        self.cap = problem.kv_capacity_tokens()
        self.watermark = int(params.watermark * self.cap)
        self.kvb = problem.kv_bytes_per_token()
        self.io_in, self.io_out = problem.attention_io_bytes()
        local = [n for n, p in problem.pools() if p.local]
        self.pools = Pools(problem, local if params.mode == "neo" else None) if params.mode != "headroom" \
            else Pools(problem, [])
        self.ls_wait: deque[int] = deque()
        self.ls_run: list[int] = []
        self.be_wait: deque[int] = deque()
        self.be_pre: list[int] = []           # BE in GPU prefill (admitted, destination decided)
        self.be_gpu: list[int] = []           # GPU-resident BE decoding
        self.cpu = _EMPTY                     # BE decoding from a CPU pool (request indices, in order)
        self.dest: dict[int, int] = {}        # BE -> pool index (-1: GPU-resident)
        n = 0   # per-request arrays, sized at the first arrival
        self.layer = np.zeros(n, dtype=np.int64)    # piggyback: next layer whose attention is pending
        self.ready = np.zeros(n)                    # when that attention result is back (s)
        self.pool_of = np.zeros(n, dtype=np.int64)  # pool index of a CPU-resident BE request
        self.served = np.zeros(n, dtype=np.int64)   # neo: iteration of the last CPU decode (round robin)
        self.record_merges = True
        self.admissions: list[list[float]] = []   # [request, time, tokens, per iteration, T_est, waited, forecast, ok]
        self.decision_s: list[float] = []     # controller time per iteration (s), measured, wall clock
        self.decision_cpu_s: list[float] = []  # the same, this thread's CPU time (s): without other jobs' slices
        self.decision_inflight: list[int] = []  # BE requests in flight (CPU pools) at each decision
        self.last_merges: list[list[int]] = []
        self.last_cpu_decodes = 0
        self.last_be_gpu = 0

    # ---------------------------------------------------------------- engine hooks

    def on_arrival(self, idx: np.ndarray, state: EngineState) -> None:
        """Queue arrivals; with admission control, reject an LS request the forward simulation says
        would miss its TTFT SLO (it would only delay the others)."""
        if len(self.layer) != len(state.requests):
            n = len(state.requests)
            self.layer, self.ready = np.zeros(n, dtype=np.int64), np.zeros(n)
            self.pool_of, self.served = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        svc = state.requests.service[idx]
        for i, s in zip(idx.tolist(), svc.tolist()):
            if s == BE:
                self.be_wait.append(i)
            elif self.p.admission and not self._admit_ls(i, state):
                state.reject(i)
            else:
                self.ls_wait.append(i)

    def _admit_ls(self, i: int, state: EngineState) -> bool:
        """Forward-simulate the LS prefill queue with the latency model; return True when request i's
        forecast TTFT is within the SLO. Records the forecast for check."""
        run = [j for j in self.ls_run if state.prefilled[j] < state.prefill_target[j]]
        ahead = sum(int(state.prefill_target[j] - state.prefilled[j]) for j in run)
        ahead += sum(int(state.prefill_target[j] - state.prefilled[j]) for j in self.ls_wait)
        decoding = [j for j in self.ls_run if state.prefilled[j] >= state.prefill_target[j]]
        decodes = len(decoding)
        be_work = bool(self.be_wait or self.be_pre or self.be_gpu or len(self.cpu))
        kv_read = float(state.kv_tokens(np.asarray(decoding, dtype=np.int64)).sum()) if decoding else 0.0
        need = ahead + int(state.prefill_target[i])
        per_iter, t_est = admission_rate(self.lat, self.p.token_budget, decodes, self.p.tpot_target_s,
                                         kv_read=kv_read, be_work=be_work, tokens_ahead=need)
        wait = state.now_s - float(state.requests.arrival_s[i])
        forecast = admission_forecast(need, per_iter, t_est, wait)
        ok = forecast <= self.problem.ls.ttft_slo_s
        self.admissions.append([float(i), state.now_s, float(need), float(per_iter), t_est, wait, forecast, float(ok)])
        return ok

    def on_finish(self, idx: np.ndarray, state: EngineState) -> None:
        """Release finished requests' GPU memory and pool reservations."""
        done = set(idx.tolist())
        self.ls_run = [i for i in self.ls_run if i not in done]
        self.be_gpu = [i for i in self.be_gpu if i not in done]
        if any(i in done for i in self.be_pre):
            self.be_pre = [i for i in self.be_pre if i not in done]
        if len(self.cpu):
            self.cpu = self.cpu[~np.isin(self.cpu, idx)]
        for i in done:
            if i in self.dest:
                self._release(i, state)

    # ---------------------------------------------------------------- memory helpers

    def _need_bytes(self, i: int, state: EngineState) -> float:
        r = state.requests
        return float(r.prompt_tokens[i] + r.output_tokens[i]) * self.kvb

    def _release(self, i: int, state: EngineState) -> None:
        c = self.dest.pop(i)
        if c >= 0:
            self.pools.reserved[c] -= self._need_bytes(i, state)
            self.pools.load[c] -= float(state.requests.prompt_tokens[i] + state.requests.output_tokens[i])

    def _gpu_used(self, state: EngineState) -> int:
        held = self.ls_run + self.be_pre + self.be_gpu
        if not held:
            return 0
        a = np.asarray(held, dtype=np.int64)
        return int(state.kv_tokens(a).sum()) + int(np.count_nonzero(state.prefilled[a] >= state.prefill_target[a]))

    def _be_gpu_tokens(self, state: EngineState) -> int:
        held = self.be_gpu + [i for i in self.be_pre if self.dest.get(i, -1) < 0]
        if not held:
            return 0
        a = np.asarray(held, dtype=np.int64)
        return int(state.kv_tokens(a).sum()) + len(self.be_gpu)

    def _preempt_be(self, i: int, state: EngineState) -> None:
        state.preempt(i)
        if i in self.dest:
            self._release(i, state)
        self.be_wait.appendleft(i)

    # ---------------------------------------------------------------- one iteration

    def next_iteration(self, state: EngineState) -> Iteration | None:
        """Return the next iteration (see the module docstring); None when nothing can run now."""
        started, started_cpu = time.perf_counter(), time.thread_time()
        now = state.now_s
        self._finish_prefills(state)
        self._fit_memory(state)
        self._admit_ls_memory(state)
        self._admit_be(state)
        run = np.asarray(self.ls_run, dtype=np.int64)
        if len(run):
            done = state.prefilled[run] >= state.prefill_target[run]
            ls_dec, ls_pre = run[done], run[~done]
        else:
            ls_dec = ls_pre = _EMPTY
        be_pre = np.asarray(self.be_pre, dtype=np.int64)
        be_gpu = np.asarray(self.be_gpu, dtype=np.int64)
        ready_idx, ready_layers = self._ready(now)
        be_max = self.p.be_batch_max if self.p.mode == "omniserve" else len(be_gpu)
        d = decide(self.lat, budget=self.p.token_budget, target_s=self.p.tpot_target_s,
                   ls_decode_kv=state.kv_tokens(ls_dec) if len(ls_dec) else _EMPTY,
                   ls_prefill_left=state.prefill_target[ls_pre] - state.prefilled[ls_pre],
                   ls_prefill_pos=state.prefilled[ls_pre],
                   be_prefill_left=state.prefill_target[be_pre] - state.prefilled[be_pre] if len(be_pre) else _EMPTY,
                   be_prefill_pos=state.prefilled[be_pre] if len(be_pre) else _EMPTY,
                   be_gpu_decode_kv=state.kv_tokens(be_gpu) if len(be_gpu) else _EMPTY,
                   ready_layers=ready_layers, be_max=be_max, be_decode_first=self.p.mode != "omniserve",
                   be_prefill_max=self.p.be_prefill_max)
        duration = d.duration_s
        decodes = [ls_dec, be_gpu[:d.be_gpu_decodes]]
        self.last_be_gpu = d.be_gpu_decodes
        self.last_cpu_decodes = 0
        if self.p.mode == "neo" and len(self.cpu):
            chosen, cpu_s = self._neo_batch(state, duration)
            if len(chosen):
                decodes.append(chosen)
                duration = max(duration, cpu_s) if duration > 0 else cpu_s
                self.last_cpu_decodes = len(chosen)
        merged = ready_idx[:d.merged]
        self.last_merges = []
        if len(merged):
            emitted, duration = self._merge(merged, state, now, d)
            decodes.append(emitted)
        pre_idx = np.concatenate([ls_pre[d.ls_chunks > 0], be_pre[d.be_chunks > 0]]) if len(be_pre) else \
            ls_pre[d.ls_chunks > 0]
        pre_tok = np.concatenate([d.ls_chunks[d.ls_chunks > 0], d.be_chunks[d.be_chunks > 0]]) if len(be_pre) else \
            d.ls_chunks[d.ls_chunks > 0]
        dec = np.concatenate(decodes) if decodes else _EMPTY
        self.decision_s.append(time.perf_counter() - started)
        self.decision_cpu_s.append(time.thread_time() - started_cpu)
        self.decision_inflight.append(len(self.cpu))
        if not len(pre_idx) and not len(dec) and not len(merged):
            # (an iteration of merges alone runs on the GPU for its modelled time: the merged requests
            # took a layer's dense step each, and their next layers were dispatched from that time)
            if len(self.cpu):   # waiting on CPU attention or a KV transfer: idle until one is back
                nxt = float(self.ready[self.cpu].min())
                return Iteration(max(nxt - now, 1e-6), info={"idle": 1.0})
            return None
        return Iteration(duration, pre_idx.astype(np.int64), pre_tok.astype(np.int64), dec.astype(np.int64),
                         {"ls_decodes": float(len(ls_dec)), "ls_prefill_tokens": float(d.ls_chunks.sum()),
                          "be_prefill_tokens": float(d.be_chunks.sum()), "be_gpu_decodes": float(d.be_gpu_decodes),
                          "be_merged": float(d.merged), "cpu_decodes": float(self.last_cpu_decodes)})

    def _finish_prefills(self, state: EngineState) -> None:
        """Move BE requests whose prefill completed to their decode place (GPU, or ship KV to the pool)."""
        if not self.be_pre:
            return
        keep = []
        for i in self.be_pre:
            if state.prefilled[i] < state.prefill_target[i]:
                keep.append(i)
                continue
            c = self.dest.get(i, -1)
            if c < 0:
                self.be_gpu.append(i)
                continue
            self.cpu = np.append(self.cpu, i)
            self.layer[i] = 0
            self.pool_of[i] = c
            ctx = float(state.kv_tokens(np.array([i]))[0])
            ship = state.now_s + self.pools.latency[c] + ctx * self.kvb / self.pools.bw_Bps[c]
            if self.p.mode == "omniserve":
                self.ready[i] = self._dispatch(c, ship, np.array([ctx]))[0]
            else:
                self.ready[i] = ship
        self.be_pre = keep

    def _dispatch(self, c: int, at_s: np.ndarray | float, ctx: np.ndarray) -> np.ndarray:
        """Queue one layer of attention per request on pool c, request j sent at at_s[j] (s; FIFO in send
        order, one server at the pool's rate); return the times (s) the results are back on the GPU."""
        pools = self.pools
        at = np.broadcast_to(np.asarray(at_s, dtype=float), ctx.shape)
        order = np.argsort(at, kind="stable")
        arrive = at[order] + pools.latency[c] + self.io_in / pools.bw_Bps[c]
        work = np.cumsum(ctx[order] / pools.theta[c])
        before = np.concatenate([[0.0], work[:-1]])
        # FIFO: done_j = W_j + max(busy, max_{i<=j}(arrive_i - W_{i-1}))
        done = work + np.maximum(pools.busy[c], np.maximum.accumulate(arrive - before))
        pools.busy[c] = float(done[-1])
        out = np.empty_like(done)
        out[order] = done + pools.latency[c] + self.io_out / pools.bw_Bps[c]
        return out

    def _fit_memory(self, state: EngineState) -> None:
        """Preempt until the GPU's KV fits: GPU-resident BE first (latest first), then BE prefills, then LS."""
        while self.ls_run or self.be_pre or self.be_gpu:
            if self._gpu_used(state) <= self.cap:
                return
            if self.be_gpu:
                self._preempt_be(self.be_gpu.pop(), state)
            elif self.be_pre:
                self._preempt_be(self.be_pre.pop(), state)
            else:
                victim = self.ls_run.pop()
                state.preempt(victim)
                self.ls_wait.appendleft(victim)

    def _admit_ls_memory(self, state: EngineState) -> None:
        """Admit waiting LS requests FCFS while the GPU KV holds their prompts (BE on the GPU yields)."""
        used = self._gpu_used(state)
        while self.ls_wait:
            i = self.ls_wait[0]
            need = int(state.prefill_target[i])
            if used + need + self.watermark > self.cap:
                if self.be_gpu or self.be_pre:   # LS first: take memory back from BE
                    self._preempt_be(self.be_gpu.pop() if self.be_gpu else self.be_pre.pop(), state)
                    used = self._gpu_used(state)
                    continue
                if not self.ls_run and need + self.watermark > self.cap:
                    self.ls_wait.popleft()
                    state.reject(i)
                    continue
                return
            self.ls_wait.popleft()
            self.ls_run.append(i)
            used += need

    def _admit_be(self, state: EngineState) -> None:
        """Start BE prefills FCFS while the GPU holds their prompts beside LS, choosing each one's decode
        place: GPU-resident within the BE share of the cache, else a CPU pool (FFD packing of the waiting
        wave on memory and attention rate); a BE request with no place waits."""
        if not self.be_wait or len(self.be_pre) >= 4:
            return
        used = self._gpu_used(state)
        ls_pending = sum(1 for i in self.ls_wait)
        if ls_pending:
            return
        be_gpu = self._be_gpu_tokens(state)
        inflight = len(self.cpu) + sum(1 for i in self.be_pre if self.dest.get(i, -1) >= 0)
        wave = [self.be_wait[k] for k in range(min(PACK_WAVE, len(self.be_wait)))]
        r = state.requests
        total = np.array([int(r.prompt_tokens[i] + r.output_tokens[i]) for i in wave], dtype=float)
        if len(self.pools):
            free_b = self.pools.memory - self.pools.reserved
            rate = self.pools.theta * self.p.tpot_target_s * self.p.pace_factor
            place = pack_ffd(total * self.kvb, total, free_b, rate - self.pools.load)
        else:
            place = np.full(len(wave), -1)
        for k, i in enumerate(wave):
            if len(self.be_pre) >= 4:
                return
            need = int(state.prefill_target[i])
            if used + need + self.watermark > self.cap:
                return
            if be_gpu + int(total[k]) <= self.p.be_gpu_fraction * self.cap and self.p.mode != "neo" or \
                    (self.p.mode == "neo" and used + int(total[k]) + self.watermark <= self.cap):
                self.dest[i] = -1
                be_gpu += int(total[k])
            elif place[k] >= 0 and self.pools.reserved[place[k]] + total[k] * self.kvb <= self.pools.memory[place[k]] \
                    and not (self.p.be_inflight_max and inflight >= self.p.be_inflight_max):
                c = int(place[k])
                inflight += 1
                self.dest[i] = c
                self.pools.reserved[c] += total[k] * self.kvb
                self.pools.load[c] += total[k]
            else:
                return   # FCFS: the head waits for a place
            self.be_wait.popleft()
            self.be_pre.append(i)
            used += need

    def _ready(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Return (BE requests whose pending layer's CPU attention is back before an iteration starting now,
        their layers), the oldest results first (conservative: layer l is reached later in the iteration)."""
        if self.p.mode != "omniserve" or not len(self.cpu):
            return _EMPTY, _EMPTY
        rd = self.ready[self.cpu]
        ok = np.flatnonzero(rd <= now)
        sel = self.cpu[ok[np.argsort(rd[ok], kind="stable")]]
        return sel, self.layer[sel]

    def _merge(self, merged: np.ndarray, state: EngineState, now: float, d: Any) -> tuple[np.ndarray, float]:
        """Advance each merged BE request one layer and dispatch its next layer to its pool at the point of
        the iteration where that layer's QKV is computed (the next token's layer 0 at the iteration's end).
        With layers_per_iteration > 1, a request whose next result is back before that layer's
        out-projection in this pass merges again there, while the iteration stays within the TPOT target.
        Return (the requests that completed their last layer: they emit a token, the iteration's time in s)."""
        duration = d.duration_s
        per_layer = d.per_layer.copy()
        r = state.requests
        emitted = []
        records = []
        cur, steps = merged, 1
        while True:
            lay = self.layer[cur]
            if self.record_merges:
                records.append(np.stack([cur, lay], axis=1))
            nxt = lay + 1
            emits = nxt == self.L
            nxt[emits] = 0
            self.layer[cur] = nxt
            emitted.append(cur[emits])
            live = ~(emits & (state.generated[cur] + 1 >= r.output_tokens[cur]))
            ids, nl, em = cur[live], nxt[live], emits[live]
            if len(ids):
                ctx = state.kv_tokens(ids).astype(float) + em
                at = now + duration * np.where(nl == 0, 1.0, nl / self.L)
                pools = self.pool_of[ids]
                for c in np.unique(pools).tolist():
                    m = pools == c
                    self.ready[ids[m]] = self._dispatch(c, at[m], ctx[m])
            if steps >= self.p.layers_per_iteration or not len(ids):
                break
            back = (nl != 0) & (self.ready[ids] <= now + (nl + 0.5) / self.L * duration)
            cand = ids[back]
            if not len(cand):
                break
            add = np.bincount(self.layer[cand], minlength=self.L)
            t_new = self.lat.iteration_s(d.tokens, d.kv_read, d.prefill_s, per_layer + add)
            if t_new > self.p.tpot_target_s:
                break
            per_layer += add
            duration = t_new
            cur, steps = cand, steps + 1
        if records:
            self.last_merges = np.concatenate(records).tolist()
        return np.concatenate(emitted) if len(emitted) > 1 else emitted[0], duration

    def _neo_batch(self, state: EngineState, gpu_s: float) -> tuple[np.ndarray, float]:
        """Return (host-resident BE requests decoded on the CPU this iteration, their CPU time in s): round
        robin from the least recently served, while the CPU time stays within the GPU's iteration time
        (all of them when the GPU has nothing to run)."""
        cands = self.cpu[self.ready[self.cpu] <= state.now_s]
        if not len(cands) or not len(self.pools):
            return _EMPTY, 0.0
        cands = cands[np.lexsort((cands, self.served[cands]))]
        ctx = state.kv_tokens(cands).astype(float)
        theta = float(self.pools.theta.sum())
        cum = np.cumsum(ctx * self.L / theta)
        n = int(np.searchsorted(cum, gpu_s, side="right")) if gpu_s > 0 else len(cands)
        self.served[cands[:n]] = state.iterations
        return cands[:n], float(cum[n - 1]) if n else 0.0


def admission_rate(lat: Latency, budget: int, ls_decodes: int, target_s: float, *, kv_read: float = 0.0,
                   be_work: bool = True, tokens_ahead: float | None = None) -> tuple[int, float]:
    """Return (LS prefill tokens per iteration, the forecast iteration time in s) the admission control's
    forward simulation assumes: the budget left by the LS decodes; while BE work is in the engine
    (`be_work`: BE waiting, in prefill or decoding) at the TPOT target `target_s`, since the BE batch is
    binary-searched up to it; else the latency model's iteration of that LS work (a prefill chunk of
    min(tokens per iteration, `tokens_ahead`) tokens at position 0, the decodes, their decode attention
    over `kv_read` KV tokens), at most the target."""
    per_iter = max(1, budget - ls_decodes)
    if be_work:
        return per_iter, float(target_s)
    chunk = per_iter if tokens_ahead is None else max(1, min(per_iter, int(math.ceil(tokens_ahead))))
    alone = lat.iteration_s(chunk + ls_decodes, kv_read, lat.prefill_attention(np.array([chunk]), np.array([0.0])))
    return per_iter, min(float(target_s), float(alone))


def admission_floor_s(lat: Latency, per_iteration: float, tokens_ahead: float, target_s: float) -> float:
    """Return the least forecast iteration time (s) an admission decision may state: the dense modules
    for its prefill chunk alone (min(`per_iteration`, `tokens_ahead`) tokens), at most the target."""
    chunk = max(1, min(int(per_iteration), int(math.ceil(tokens_ahead))))
    return min(float(target_s), float(lat.dense(chunk)))


def admission_forecast(tokens_ahead: float, per_iteration: float, iteration_s: float, waited_s: float) -> float:
    """Return the forecast TTFT (s) of an LS request with `tokens_ahead` prefill tokens to go (its own
    included) at `per_iteration` tokens per iteration of `iteration_s` seconds, having waited `waited_s`."""
    return waited_s + math.ceil(tokens_ahead / per_iteration) * iteration_s


@dataclass
class Recorder:
    """Wraps a policy: counts BE tokens emitted by `window_s`, stops once the LS load is served after the
    window, and records the first `limit` iterations (the explicit schedule); with `be_log` a list, also
    (end time in s, BE tokens so far, BE requests on CPU pools) per iteration within the window."""

    inner: Any
    window_s: float
    limit: int
    cap_tokens: int
    pool_names: list[str]
    be_tokens: int = 0
    schedule: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False
    be_log: list[tuple[float, int, int]] | None = None   # (iteration end s, BE tokens so far, BE on pools)

    def on_arrival(self, idx: np.ndarray, state: EngineState) -> None:
        """Pass arrivals on; after the window (LS served) they are refused."""
        if self.stopped:
            state.reject(idx)
            return
        self.inner.on_arrival(idx, state)

    def on_finish(self, idx: np.ndarray, state: EngineState) -> None:
        """Pass completions on."""
        self.inner.on_finish(idx, state)

    def next_iteration(self, state: EngineState) -> Iteration | None:
        """Ask the policy; count BE tokens the iteration emits within the window; record it."""
        if state.now_s >= self.window_s and self._ls_done(state):
            self.stopped = True
            return None
        it = self.inner.next_iteration(state)
        if it is None:
            return None
        end = state.now_s + it.duration_s
        r = state.requests
        if end <= self.window_s:
            p = it.prefill_idx
            first = p[(r.service[p] == BE) & (state.prefilled[p] + it.prefill_tokens == state.prefill_target[p])
                      & (state.generated[p] == 0)] if len(p) else p
            self.be_tokens += len(first) + int(np.count_nonzero(r.service[it.decode_idx] == BE))
            if self.be_log is not None:
                self.be_log.append((end, self.be_tokens, len(getattr(self.inner, "cpu", ()))))
        if len(self.schedule) < self.limit:
            self.schedule.append(self._row(state, it))
        return it

    def _ls_done(self, state: EngineState) -> bool:
        ls = state.requests.service == LS
        return bool(np.all(np.isfinite(state.finish_s[ls]) | state.rejected[ls]))

    def _row(self, state: EngineState, it: Iteration) -> dict[str, Any]:
        inner = self.inner
        r = state.requests
        p = it.prefill_idx
        ls_p = r.service[p] == LS if len(p) else np.zeros(0, dtype=bool)
        row: dict[str, Any] = {
            "start_s": state.now_s, "duration_s": it.duration_s,
            "ls_decodes": int(np.count_nonzero(r.service[it.decode_idx] == LS)),
            "ls_prefill_tokens": int(it.prefill_tokens[ls_p].sum()) if len(p) else 0,
            "be_prefill_tokens": int(it.prefill_tokens[~ls_p].sum()) if len(p) else 0,
            "be_decodes": int(np.count_nonzero(r.service[it.decode_idx] == BE)),
            "merges": list(getattr(inner, "last_merges", [])),
            "gpu_kv_tokens": self._gpu_tokens(state),
            "pool_kv_bytes": [float(x) for x in inner.pools.reserved] if hasattr(inner, "pools") else [],
        }
        return row

    def _gpu_tokens(self, state: EngineState) -> int:
        inner = self.inner
        if hasattr(inner, "_gpu_used"):
            return int(inner._gpu_used(state))
        run = np.asarray(inner.running, dtype=np.int64)
        if not len(run):
            return 0
        return int(state.kv_tokens(run).sum()) + int(np.count_nonzero(state.prefilled[run] >= state.prefill_target[run]))
