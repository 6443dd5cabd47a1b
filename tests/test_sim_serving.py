"""The shared simulation core and serving engine: a hand-computed trace, invariants, latency fits, traces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.sim.core import EventQueue, arrival_times, attainment, percentile, summary
from gpuplan.sim.latency import LinearLatency, StaircaseLatency, dense_latency, relative_errors
from gpuplan.sim.serving import BE, LS, Iteration, Requests, SarathiPolicy, max_rate, simulate
from gpuplan.sim.traces import SAMPLE, long_prompt_trace, poisson_trace, read_lengths_csv
from gpuplan.models.workload import model_config


def _one_second(tokens: int, kv: float, attn: float) -> float:
    return 1.0


def _no_attention(chunks: np.ndarray, positions: np.ndarray) -> float:
    return 0.0


def test_three_requests_match_a_hand_computed_trace() -> None:
    """Iterations of 1 s, a budget of 4 tokens: times worked out by hand in the comments."""
    reqs = Requests.make([0.0, 0.5, 2.5], [3, 2, 5], [2, 3, 1])
    res = simulate(reqs, SarathiPolicy(_one_second, _no_attention, 10_000, token_budget=4, watermark=0.0))
    # [0,1] A prefills 3 -> first token 1; [1,2] A decodes (done at 2), B prefills 2 -> first token 2;
    # [2,3] B decodes; [3,4] B decodes (done at 4), C prefills 3 of 5; [4,5] C prefills 2 -> token 5, done.
    assert res.iterations == 5 and res.end_s == 5.0
    assert res.ttft_s.tolist() == [1.0, 1.5, 2.5]
    assert res.finish_s.tolist() == [2.0, 4.0, 5.0]
    assert res.tpot_s.tolist() == [1.0, 1.0, 0.0]
    assert res.slo(1.5, 1.0)["attainment"] == pytest.approx(2 / 3)
    assert res.throughput()["output_tokens_per_s"] == pytest.approx(6 / 5)


def test_engine_refuses_a_decode_before_prefill() -> None:
    class Bad:
        def on_arrival(self, idx, state):  # type: ignore[no-untyped-def]
            self.idx = idx

        def on_finish(self, idx, state):  # type: ignore[no-untyped-def]
            pass

        def next_iteration(self, state):  # type: ignore[no-untyped-def]
            return Iteration(1.0, decode_idx=self.idx)

    with pytest.raises(ValueError, match="before its prefill"):
        simulate(Requests.make([0.0], [4], [2]), Bad())


def test_a_request_larger_than_the_cache_is_aborted_not_looped() -> None:
    """280 + 40 tokens in a 300-token cache: preempted once, then aborted when alone (as vLLM does)."""
    reqs = Requests.make([0.0, 0.0], [10, 280], [50, 40])
    res = simulate(reqs, SarathiPolicy(_one_second, _no_attention, 300, token_budget=8, watermark=0.0),
                   max_iterations=10_000)
    assert res.iterations < 10_000 and res.rejected.tolist() == [False, True]
    assert np.isfinite(res.finish_s[0]) and np.isnan(res.finish_s[1])


def test_preemption_recomputes_and_every_request_finishes() -> None:
    """A KV cache of 40 tokens for requests of 10 + 20 tokens: preemptions happen, nothing is lost."""
    reqs = Requests.make(np.zeros(6), np.full(6, 10), np.full(6, 20))
    res = simulate(reqs, SarathiPolicy(_one_second, _no_attention, 40, token_budget=64, watermark=0.0))
    assert res.preemptions > 0
    assert np.all(np.isfinite(res.finish_s))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 300), st.integers(1, 50), st.sampled_from([LS, BE])),
                min_size=1, max_size=25),
       st.integers(8, 600), st.integers(300, 3000))
def test_engine_invariants(rows: list[tuple[float, int, int, int]], budget: int, capacity: int) -> None:
    """Every request that fits finishes once, after its arrival; TTFT >= one iteration; tokens are conserved."""
    reqs = Requests.make(*zip(*rows))
    res = simulate(reqs, SarathiPolicy(lambda t, k, a: 0.01 + 1e-4 * t, _no_attention, capacity,
                                       token_budget=budget, watermark=0.0))
    fits = reqs.prompt_tokens + reqs.output_tokens <= capacity
    assert np.all(np.isfinite(res.finish_s[fits]))
    served = np.isfinite(res.finish_s)
    assert np.all(res.finish_s[served] >= reqs.arrival_s[served])
    assert np.all(res.ttft_s[served] >= 0.01 - 1e-12)
    assert np.all(res.tpot_s[served] >= 0)


def test_event_queue_orders_by_time_then_arrival() -> None:
    q: EventQueue[str] = EventQueue()
    for t, p in [(2.0, "c"), (1.0, "a"), (1.0, "b"), (3.0, "d")]:
        q.push(t, p)
    assert [e.payload for e in q.pop_until(2.0)] == ["a", "b", "c"] and len(q) == 1
    with pytest.raises(ValueError):
        q.push(math.nan, "x")


def test_arrivals_have_the_stated_rate_and_burstiness() -> None:
    for process, cv in [("poisson", 1.0), ("gamma", 3.0), ("uniform", 0.0)]:
        t = arrival_times(20_000, 5.0, seed=3, process=process, cv=max(cv, 0.1))  # type: ignore[arg-type]
        gaps = np.diff(t)
        assert 20_000 / t[-1] == pytest.approx(5.0, rel=0.06)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.15)
    assert np.array_equal(arrival_times(50, 2.0, seed=9), arrival_times(50, 2.0, seed=9))


def test_statistics() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5 and math.isnan(percentile([], 50))
    assert attainment([1.0, 2.0, math.nan], 1.5) == pytest.approx(1 / 3)
    assert summary([2.0])["p99"] == 2.0 and summary([])["count"] == 0


def test_staircase_fit_recovers_its_parameters_and_validates_held_out() -> None:
    truth = StaircaseLatency(0.002, 0.015, 0.0074, 64)
    n = np.arange(1, 2049, 37)
    fitted = StaircaseLatency.fit(n, truth(n))
    assert fitted.tau == 64
    assert fitted.c0_s == pytest.approx(0.002, rel=1e-6) and fitted.step_s == pytest.approx(0.0074, rel=1e-6)
    held_out = np.arange(5, 2000, 53)
    assert relative_errors(fitted, held_out, truth(held_out)).max() < 1e-6
    line = LinearLatency.fit([0, 100, 200], [1.0, 2.0, 3.0])
    assert line.a1_s == pytest.approx(0.01) and line(0) == 0.0


def test_catalog_dense_latency_is_flat_then_rises() -> None:
    d = dense_latency(model_config("llama2-13b"), "A100-80GB")
    assert d(1) == d(32) < d(1024) < d(2048)
    assert d(2048) == pytest.approx(d.c0_s + d.step_s * 32)


def test_traces_read_the_sample_and_refuse_bad_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p, o = read_lengths_csv(SAMPLE)
    assert len(p) == 2000 and p.min() >= 4 and (p + o).max() <= 2048
    reqs = poisson_trace(p, o, 500, 4.0, seed=1)
    assert len(reqs) == 500 and np.all(np.diff(reqs.arrival_s) >= 0)
    be = long_prompt_trace(2000, 1.0, seed=2)
    assert be.prompt_tokens.mean() == pytest.approx(8952, rel=0.1) and np.all(be.service == BE)
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_tokens,output_tokens\n10,x\n")
    with pytest.raises(ValueError, match="row 2"):
        read_lengths_csv(bad)
    bad.write_bytes(b"prompt_tokens,output_tokens\n\xff\xfe,3\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_lengths_csv(bad)
    # a device or a FIFO is refused before anything is read: /dev/zero would never end
    with pytest.raises(ValueError, match="not a regular file"):
        read_lengths_csv("/dev/zero")


def test_max_rate_bisects_to_the_threshold() -> None:
    assert max_rate(lambda r: r <= 7.3, 1.0, 100.0, rel_tol=0.001) == pytest.approx(7.3, rel=0.002)
    assert max_rate(lambda r: False, 1.0, 10.0) == 0.0
