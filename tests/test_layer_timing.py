"""How the layer table times its calls: on CPU each call after an idle wait as long as the call before
it (a pipeline stage's ops follow a receive or an emulated sleep), in rounds over every shape."""

from __future__ import annotations

import time

import pytest

from gpuplan.models.workload import TransformerConfig
from gpuplan.profiling import layers

TINY = TransformerConfig.model_validate({"name": "t", "num_layers": 2, "hidden": 32, "heads": 2, "ffn_hidden": 64,
                                         "vocab": 64, "gated_mlp": False})


def test_after_wait_sleeps_as_long_as_the_previous_call(monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(layers.time, "sleep", lambda s: naps.append(s) or real_sleep(0))
    order: list[str] = []
    fn, setup = layers.after_wait(lambda: order.append("fn") or real_sleep(0.02), lambda: order.append("setup"),
                                  "cpu")
    for _ in range(3):
        setup()
        fn()
    assert order == ["setup", "fn"] * 3
    assert naps[0] == 0.0 and all(n >= 0.02 for n in naps[1:])      # the wait after the first call: its length
    naps.clear()
    fn, setup = layers.after_wait(lambda: real_sleep(0.01), None, "cuda:0")
    setup(), fn(), setup()
    assert naps == []                                                 # CUDA: back to back


def test_cpu_table_is_timed_after_waits_in_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple[int, str]] = []
    real = layers._time_part
    monkeypatch.setattr(layers, "_time_part",
                        lambda part, device, repeats: timed.append((part.make_input().shape[0], part.name))
                        or real(part, device, repeats))
    plan = layers.LayerPlan(TINY, None, "", [1, 2], [8], "fp32")
    table = layers.layer_table(plan, "cpu", "cpu", repeats=3, stage_calls=False)
    assert table.calls == "after-wait"
    rounds = layers.rounds_for("cpu")
    assert rounds > 1 and layers.rounds_for("cuda:0") == 1
    shapes = [(1, "layer"), (1, "embedding"), (1, "head"), (2, "layer"), (2, "embedding"), (2, "head")]
    assert timed == shapes * rounds                                   # every shape in each round, in turn
    assert [(c.micro_batch, c.part) for c in table.costs] == shapes
    assert all(c.forward_s > 0 and c.backward_s > 0 for c in table.costs)
