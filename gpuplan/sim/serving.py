"""The serving engine every serving kind shares: iteration-level (continuous) batching of LLM requests.

The engine owns time and the requests' progress; a policy owns every decision. Per iteration the
policy returns which requests advance their prefill by how many prompt tokens (chunked prefill),
which emit one decode token, and how long the iteration takes (from its latency model). The engine
applies that, emits a request's first token when its prefill completes, finishes it at its last
token, and records per request: TTFT (first token - arrival), TPOT ((finish - first token) /
(output tokens - 1)), finish time, and whether it was rejected. Arrivals come from a trace (sorted
times); the loop jumps to the next arrival when the policy has nothing to run.

Policies are objects with three methods (see `Policy`): `on_arrival(indices, state)`,
`on_finish(indices, state)` and `next_iteration(state) -> Iteration | None`. `SarathiPolicy` here
is the GPU-only reference (Sarathi-Serve's stall-free batching: every running decode, then prefill
chunks under a per-iteration token budget, vLLM-style KV admission and recompute preemption).

Vectorised with numpy: the per-iteration work is a few array operations over the running batch, so
10^5 ShareGPT-length requests simulate in well under a minute.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from gpuplan.sim.core import SimulationWatch, summary

LS, BE = 0, 1  # service classes: latency-sensitive, best-effort

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Requests:
    """A trace of requests as arrays (one entry per request, sorted by arrival).

    arrival_s: arrival times (s). prompt_tokens, output_tokens: lengths (tokens; output >= 1).
    service: LS (0) or BE (1) per request.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    service: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "service"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"requests: {name} has {len(getattr(self, name))} entries, arrival_s {n}")
        if n and (np.any(np.diff(self.arrival_s) < 0) or not np.all(np.isfinite(self.arrival_s))):
            raise ValueError("requests: arrival_s must be finite and sorted")
        if n and (np.min(self.prompt_tokens) < 1 or np.min(self.output_tokens) < 1):
            raise ValueError("requests: prompt_tokens and output_tokens must be >= 1")

    @staticmethod
    def make(arrival_s: Any, prompt_tokens: Any, output_tokens: Any, service: Any = None) -> "Requests":
        """Return Requests from sequences (service defaults to LS for every request), sorted by arrival."""
        a = np.asarray(arrival_s, dtype=float)
        order = np.argsort(a, kind="stable")
        svc = np.zeros(len(a), dtype=np.int8) if service is None else np.asarray(service, dtype=np.int8)
        return Requests(a[order], np.asarray(prompt_tokens, dtype=np.int64)[order],
                        np.asarray(output_tokens, dtype=np.int64)[order], svc[order])

    def __len__(self) -> int:
        return len(self.arrival_s)

    @staticmethod
    def merge(*parts: "Requests") -> "Requests":
        """Return one trace holding every request of `parts`, sorted by arrival (stable)."""
        return Requests.make(np.concatenate([p.arrival_s for p in parts]),
                             np.concatenate([p.prompt_tokens for p in parts]),
                             np.concatenate([p.output_tokens for p in parts]),
                             np.concatenate([p.service for p in parts]))


@dataclass
class Iteration:
    """One engine iteration chosen by a policy.

    duration_s: how long it takes (s). prefill_idx / prefill_tokens: requests whose prefill advances
    and by how many tokens. decode_idx: requests that emit one token at the iteration's end (they
    must have their first token already). info: anything the policy wants recorded (e.g. batch sizes).
    """

    duration_s: float
    prefill_idx: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_tokens: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_idx: np.ndarray = field(default_factory=lambda: _EMPTY)
    info: dict[str, float] | None = None


class EngineState:
    """What a policy reads: the clock and every request's progress (arrays indexed by request).

    prefilled: KV tokens computed in the current residency (prompt, plus regenerated tokens after a
    preemption). prefill_target: tokens to prefill before decoding (the prompt; prompt + generated
    after a preemption). generated: output tokens emitted. first_token_s, finish_s: nan until then.
    """

    def __init__(self, requests: Requests) -> None:
        n = len(requests)
        self.requests = requests
        self.now_s = 0.0
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.prefill_target = requests.prompt_tokens.astype(np.int64).copy()
        self.generated = np.zeros(n, dtype=np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.preemptions = 0
        self.iterations = 0
        self.busy_s = 0.0

    def kv_tokens(self, idx: np.ndarray) -> np.ndarray:
        """Return the KV tokens each request in `idx` holds now (prefilled plus decoded in residency)."""
        done, target = self.prefilled[idx], self.prefill_target[idx]
        return done + np.where(done >= target, self.generated[idx] - (target - self.requests.prompt_tokens[idx]), 0)

    def reject(self, idx: np.ndarray | int) -> None:
        """Mark requests as rejected by admission control (they count as SLO misses)."""
        self.rejected[idx] = True

    def preempt(self, idx: np.ndarray | int) -> None:
        """Drop the KV of requests (recompute preemption): they must prefill prompt + generated again."""
        i = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        self.prefilled[i] = 0
        self.prefill_target[i] = self.requests.prompt_tokens[i] + self.generated[i]
        self.preemptions += int(i.size)


class Policy(Protocol):
    """A serving policy: told of arrivals and completions, asked for the next iteration."""

    def on_arrival(self, idx: np.ndarray, state: EngineState) -> None: ...

    def on_finish(self, idx: np.ndarray, state: EngineState) -> None: ...

    def next_iteration(self, state: EngineState) -> Iteration | None: ...


@dataclass
class SimResult:
    """What a simulation produced: per-request times (s; nan when not reached) and engine totals."""

    requests: Requests
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    finish_s: np.ndarray
    rejected: np.ndarray
    end_s: float
    iterations: int
    busy_s: float
    preemptions: int
    iteration_info: list[dict[str, float]]

    def served(self, service: int | None = None) -> np.ndarray:
        """Return a mask of requests that finished (of one service class when given)."""
        mask = np.isfinite(self.finish_s)
        return mask if service is None else mask & (self.requests.service == service)

    def slo(self, ttft_slo_s: float, tpot_slo_s: float, *, service: int | None = None,
            q: float = 95.0) -> dict[str, float]:
        """Return the SLO report of one class (all when None): P`q` TTFT and TPOT (s) over served
        requests, attainment (fraction of ALL its requests served with TTFT and TPOT within the SLOs;
        rejected and unfinished count as misses), goodput (such requests per second of trace)."""
        mask = np.ones(len(self.requests), dtype=bool) if service is None else self.requests.service == service
        n = int(mask.sum())
        ttft = np.where(np.isfinite(self.ttft_s), self.ttft_s, np.inf)[mask]
        tpot = np.where(np.isfinite(self.tpot_s), self.tpot_s, np.inf)[mask]
        served = self.served()[mask]
        ok = served & (ttft <= ttft_slo_s) & (tpot <= tpot_slo_s)
        span = max(self.end_s - (float(self.requests.arrival_s[0]) if len(self.requests) else 0.0), 1e-12)
        return {"requests": n, "served": int(served.sum()),
                "ttft_p_s": float(np.percentile(ttft[served], q)) if served.any() else math.inf,
                "tpot_p_s": float(np.percentile(tpot[served], q)) if served.any() else math.inf,
                "attainment": float(ok.sum() / n) if n else 1.0, "goodput_per_s": float(ok.sum() / span)}

    def throughput(self, service: int | None = None) -> dict[str, float]:
        """Return tokens per second of trace: output tokens of finished requests and all tokens."""
        mask = self.served(service)
        span = max(self.end_s - (float(self.requests.arrival_s[0]) if len(self.requests) else 0.0), 1e-12)
        out = float(self.requests.output_tokens[mask].sum())
        return {"output_tokens_per_s": out / span,
                "tokens_per_s": (out + float(self.requests.prompt_tokens[mask].sum())) / span,
                "requests_per_s": float(mask.sum()) / span}

    def latency_summary(self, service: int | None = None) -> dict[str, dict[str, Any]]:
        """Return {ttft_s: summary, tpot_s: summary} over served requests (core.summary's fields)."""
        mask = self.served(service)
        return {"ttft_s": summary(self.ttft_s[mask]), "tpot_s": summary(self.tpot_s[mask][
            np.isfinite(self.tpot_s[mask])])}


def simulate(requests: Requests, policy: Policy, *, max_iterations: int = 50_000_000,
             horizon_s: float = math.inf, record_info: bool = False) -> SimResult:
    """Run `policy` over `requests`; return the SimResult. Deterministic: no randomness of its own.

    Stops when every request finished or was rejected and the policy has nothing to run, when the
    clock passes `horizon_s`, or after `max_iterations` (a policy bug guard). Raises SimulationCut when
    the solve's time limit passes first (gpuplan.sim.core.solve_clock).
    """
    watch = SimulationWatch(f"{len(requests)} requests")
    state = EngineState(requests)
    n = len(requests)
    arrivals = requests.arrival_s
    next_arrival = 0
    infos: list[dict[str, float]] = []
    while state.iterations < max_iterations:
        upto = int(np.searchsorted(arrivals, state.now_s, side="right"))
        if upto > next_arrival:
            policy.on_arrival(np.arange(next_arrival, upto, dtype=np.int64), state)
            next_arrival = upto
        it = policy.next_iteration(state)
        if it is None:
            if next_arrival >= n:
                break
            state.now_s = max(state.now_s, float(arrivals[next_arrival]))
            continue
        apply_iteration(state, requests, policy, it)
        watch.tick()
        if record_info and it.info is not None:
            infos.append({"start_s": state.now_s - it.duration_s, "duration_s": it.duration_s, **it.info})
        if state.now_s > horizon_s:
            break
    watch.done()
    out = requests.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (state.finish_s - state.first_token_s) / np.maximum(out - 1, 1), 0.0)
    tpot = np.where(np.isfinite(state.finish_s), tpot, np.nan)
    return SimResult(requests, state.first_token_s - arrivals, tpot, state.finish_s, state.rejected,
                     state.now_s, state.iterations, state.busy_s, state.preemptions, infos)


def apply_iteration(state: EngineState, requests: Requests, policy: Policy, it: Iteration) -> None:
    """Advance `state` by one iteration `it` of `policy` (prefill chunks, one token per decode, the clock
    by `it.duration_s` seconds) and tell the policy which requests finished. Raises ValueError when the
    iteration is impossible (a non-finite or non-positive duration, a prefill past a prompt, a decode
    before its prefill completed)."""
    if not (math.isfinite(it.duration_s) and it.duration_s > 0):
        raise ValueError(f"policy returned an iteration of {it.duration_s!r} s; expected a finite time > 0")
    end = state.now_s + it.duration_s
    touched = []
    if len(it.prefill_idx):
        p = it.prefill_idx
        state.prefilled[p] += it.prefill_tokens
        if (state.prefilled[p] > state.prefill_target[p]).any():
            raise ValueError("policy prefilled past a request's prompt")
        done = p[(state.prefilled[p] == state.prefill_target[p]) & (state.generated[p] == 0)]
        state.generated[done] = 1
        state.first_token_s[done] = end
        touched.append(done)
    if len(it.decode_idx):
        d = it.decode_idx
        if (state.generated[d] == 0).any() or (state.prefilled[d] < state.prefill_target[d]).any():
            raise ValueError("policy decoded a request before its prefill completed")
        state.generated[d] += 1
        touched.append(d)
    state.iterations += 1
    state.busy_s += it.duration_s
    state.now_s = end
    if touched:
        t = np.concatenate(touched) if len(touched) > 1 else touched[0]
        fin = t[state.generated[t] >= requests.output_tokens[t]]
        if len(fin):
            fin = np.unique(fin)
            state.finish_s[fin] = end
            policy.on_finish(fin, state)


IterationTime = Callable[[int, float, float], float]
"""(batched tokens, decode KV tokens read, prefill attention seconds) -> iteration seconds."""


class SarathiPolicy:
    """Sarathi-Serve on GPUs only: stall-free batching under a token budget, FCFS, one service class.

    Every running decode is in every iteration; the rest of `token_budget` goes to prefill chunks of
    waiting requests in arrival order. A request is admitted when the KV memory holds its prompt (plus
    a watermark); when the running batch would outgrow memory, the latest admitted request is
    preempted (recompute, as vLLM does), and a request that outgrows the whole cache alone is aborted. `iteration_s(tokens, decode_kv_tokens, prefill_attention_s)`
    is the latency model (seconds); `prefill_attention(chunks, positions)` returns prefill attention
    seconds. `kv_capacity_tokens` is the KV cache size in tokens.
    """

    def __init__(self, iteration_s: IterationTime, prefill_attention: Callable[[np.ndarray, np.ndarray], float],
                 kv_capacity_tokens: int, *, token_budget: int = 512, max_batch: int = 256,
                 watermark: float = 0.01, services: tuple[int, ...] = (LS, BE)) -> None:
        if token_budget < 1 or kv_capacity_tokens < 1 or max_batch < 1:
            raise ValueError("token_budget, kv_capacity_tokens and max_batch must be >= 1")
        self.iteration_s = iteration_s
        self.prefill_attention = prefill_attention
        self.capacity = int(kv_capacity_tokens)
        self.budget = int(token_budget)
        self.max_batch = int(max_batch)
        self.watermark = int(watermark * kv_capacity_tokens)
        self.services = services
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admitted, in admission order

    def on_arrival(self, idx: np.ndarray, state: EngineState) -> None:
        """Queue arriving requests of the served classes in arrival order (others are rejected)."""
        svc = state.requests.service[idx]
        for i, s in zip(idx.tolist(), svc.tolist()):
            if s in self.services:
                self.waiting.append(i)
            else:
                state.reject(i)

    def on_finish(self, idx: np.ndarray, state: EngineState) -> None:
        """Drop finished requests from the running batch."""
        done = set(idx.tolist())
        self.running = [i for i in self.running if i not in done]

    def next_iteration(self, state: EngineState) -> Iteration | None:
        """Return the next iteration: running decodes, then prefill chunks up to the token budget."""
        run = np.asarray(self.running, dtype=np.int64)
        # grow: every decoding request adds one KV token; preempt the latest admitted until it fits
        while len(run):
            ready = state.prefilled[run] >= state.prefill_target[run]
            kv = state.kv_tokens(run)
            used = int(kv.sum()) + int(np.count_nonzero(ready))
            if used <= self.capacity:
                break
            victim = int(run[-1])
            self.running.pop()
            run = run[:-1]
            if not len(run):  # alone and still too large: it can never finish here (vLLM aborts it)
                state.reject(victim)
                break
            state.preempt(victim)
            self.waiting.appendleft(victim)
        if len(run):
            decoding = run[ready]
            prefilling = run[~ready].tolist()
            kv_read = float(kv[ready].sum())
        else:
            decoding, prefilling, used, kv_read = _EMPTY, [], 0, 0.0
        budget = self.budget - len(decoding)
        chunks: list[tuple[int, int]] = []
        for i in prefilling:  # admitted requests with prefill left keep going first
            if budget <= 0:
                break
            c = min(budget, int(state.prefill_target[i] - state.prefilled[i]))
            chunks.append((i, c))
            budget -= c
        while budget > 0 and self.waiting and len(self.running) < self.max_batch:
            i = self.waiting[0]
            need = int(state.prefill_target[i])
            if used + need + self.watermark > self.capacity:
                if not self.running and need > self.capacity:
                    self.waiting.popleft()  # can never fit: refuse rather than stall
                    state.reject(i)
                    continue
                break
            self.waiting.popleft()
            self.running.append(i)
            used += need
            c = min(budget, need)
            chunks.append((i, c))
            budget -= c
        if not len(decoding) and not chunks:
            return None
        p_idx = np.array([c[0] for c in chunks], dtype=np.int64)
        p_tok = np.array([c[1] for c in chunks], dtype=np.int64)
        attn = self.prefill_attention(p_tok, state.prefilled[p_idx]) if len(chunks) else 0.0
        tokens = int(len(decoding) + p_tok.sum())
        return Iteration(self.iteration_s(tokens, kv_read, attn), p_idx, p_tok, decoding,
                         {"decodes": float(len(decoding)), "prefill_tokens": float(p_tok.sum())})


def max_rate(meets_slo: Callable[[float], bool], low: float, high: float, *, rel_tol: float = 0.02,
             max_steps: int = 30) -> float:
    """Return the largest request rate (requests/s) in [low, high] for which `meets_slo(rate)` holds,
    by bisection to `rel_tol` (assumes the SLO holds below some rate and fails above it); 0.0 when it
    fails already at `low`, `high` when it holds there."""
    if not meets_slo(low):
        return 0.0
    if meets_slo(high):
        return high
    for _ in range(max_steps):
        if high - low <= rel_tol * low:
            break
        mid = math.sqrt(low * high)
        if meets_slo(mid):
            low = mid
        else:
            high = mid
    return low

