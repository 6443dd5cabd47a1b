"""The serving latency models reproduce held-out profiled iteration times (real torch on this CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan.models.workload import TransformerConfig
from gpuplan.sim.latency import LinearLatency, StaircaseLatency, relative_errors

torch = pytest.importorskip("torch")

CFG = TransformerConfig(name="tiny-serving", num_layers=2, hidden=512, heads=8, ffn_hidden=1536, vocab=1000)


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    """One torch thread: the profiler's clock is then the process's CPU time (robust on a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _held_out(samples: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples])
    fit = np.arange(len(x)) % 2 == 0
    return x[fit], t[fit], x[~fit], t[~fit]


TRIES = 3  # a shared machine's other jobs disturb one measurement; a model that is wrong fails every try


def _held_out_errors(measure, model_class, accept) -> None:  # type: ignore[no-untyped-def]
    """Fit on every other measured point, predict the rest; pass when one of TRIES measurements
    meets `accept`, else fail with every try's samples, model and errors."""
    tries = []
    for _ in range(TRIES):
        samples = measure()
        x, t, hx, ht = _held_out(samples)
        model = model_class.fit(x, t)
        err = relative_errors(model, hx, ht)
        if accept(err):
            return
        tries.append((samples, model, err))
    raise AssertionError(tries)


@pytest.mark.slow  # real timings: ~5 s of CPU, 20 s on a busy machine
def test_dense_staircase_predicts_held_out_token_counts_within_10_percent() -> None:
    from gpuplan.profiling.serving import profile_dense

    _held_out_errors(lambda: profile_dense(CFG, [16, 48, 64, 96, 128, 192, 256, 320, 384], layers=1, repeats=5),
                     StaircaseLatency, lambda err: err.max() < 0.10)


@pytest.mark.slow
def test_decode_attention_line_predicts_held_out_kv_tokens_within_10_percent() -> None:
    from gpuplan.profiling.serving import profile_decode_attention

    # KV caches of 128-320 MiB (2 KiB a token), where attention streams memory: the regime the linear
    # model describes (GPUs' HBM has no such cache step). Below it a CPU's cache bends the line: one
    # machine's 32 MiB last level, and a VM reporting 480 MiB whose per-byte time doubled between 64 and
    # 96 MiB and stayed flat (within 6 %) from 96 MiB to 1 GiB
    sizes = [65536, 81920, 98304, 114688, 131072, 131072 + 16384, 131072 + 32768, 163840]
    # Memory-bound timings on a shared machine move with the other jobs' memory traffic, which the
    # process CPU clock does not exclude (we saw one size measure 3.6 ms and 4.9 ms in two runs): the
    # typical held-out error must be within 10 %, a single point within 25 %.
    _held_out_errors(lambda: profile_decode_attention(CFG, sizes, heads=4, batch=4, repeats=5, rounds=5),
                     LinearLatency, lambda err: np.median(err) < 0.10 and err.max() < 0.25)


def test_profilers_refuse_bad_counts() -> None:
    from gpuplan.profiling.serving import profile_decode_attention, profile_dense

    with pytest.raises(ValueError):
        profile_dense(CFG, [0])
    with pytest.raises(ValueError):
        profile_decode_attention(CFG, [])
