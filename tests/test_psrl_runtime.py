"""psRL execution: shared-prefix training gives the unshared gradients; a plan runs on gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuplan import api  # noqa: E402
from gpuplan.runtime import psrl as R  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "psrl"


def _problem(shape: str, seed: int):
    return api.load_problem({"kind": "psrl", "model": "qwen3-0.6b", "workers": [{"name": "g", "count": 2}],
                             "generate": {"shape": shape, "tasks": 2, "rollouts": 2, "turns_min": 2, "turns_max": 4,
                                          "depth": 2, "system_tokens": 40, "prompt_tokens_min": 10,
                                          "prompt_tokens_max": 60, "turn_tokens_min": 1, "turn_tokens_max": 30,
                                          "seed": seed}}, "psrl")


@pytest.mark.parametrize("shape, seed", [("stepwise", 0), ("tree", 1), ("stepwise", 5)])
def test_shared_prefix_gradients_equal_unshared(shape: str, seed: int) -> None:
    torch.set_num_threads(1)
    forest, scale = R.tiny_forest(_problem(shape, seed), max_tokens=4096)
    assert scale == 1.0  # the forest is used as generated (segments of a single token included)
    out = R.compare_step(forest, R.tiny_config(layers=2, hidden=32), dtype="float64", seed=seed)
    assert out["max_rel_grad_error"] < 1e-10
    assert out["loss_shared"] == pytest.approx(out["loss_unshared"], rel=1e-10)


def test_shared_prefix_in_float32_within_tolerance() -> None:
    torch.set_num_threads(1)
    forest, _ = R.tiny_forest(api.load_problem(EXAMPLES / "small-agent.yaml"), max_tokens=600)
    out = R.compare_step(forest, R.tiny_config())
    assert out["max_rel_grad_error"] < 1e-4
    assert R.predicted_speedup(forest, R.tiny_config()) > 2  # the example shares most of its tokens


def test_a_wrong_prefix_breaks_equality() -> None:
    """The comparison can fail: training the shared run on other token ids changes the gradients."""
    torch.set_num_threads(1)
    forest, _ = R.tiny_forest(_problem("stepwise", 2), max_tokens=4096)
    cfg = R.tiny_config(layers=1, hidden=32)
    model = R.Model(cfg, 0, torch.float64)
    R.train_unshared(model, forest)
    want = R.grads_of(model)
    model.zero_grad()
    forest.ids[0] = [(t + 1) % cfg.vocab for t in forest.ids[0]]
    R.train_shared(model, forest)
    got = R.grads_of(model)
    assert max(float((got[n] - want[n]).abs().max()) for n in want) > 1e-6


@pytest.mark.slow
def test_plan_runs_on_gloo_ranks_with_exact_gradients() -> None:
    p = api.load_problem(EXAMPLES / "small-agent.yaml")
    plan = api.solve(p)
    assert plan.received  # the plan exchanges K/V between workers
    out = api.run(plan, max_tokens=400, hidden=32)
    assert out["gradients_match"] and out["max_rel_grad_error"] < 1e-4
    assert out["ranks"] == 3 and out["exchanged_bytes"] > 0
    assert out["report"][0].rows
