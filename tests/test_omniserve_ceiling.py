"""OmniServe: the GPU-prefill ceiling bounds the BE throughput of every policy that prefills BE on the GPU
under LS priority (headroom at any X, NEO, OmniServe), whatever its BE decode does."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuplan
from gpuplan.models.omniserve.costs import build_latency, token_budget
from gpuplan.models.omniserve.evaluate import be_prefill_ceiling, run_policy
from gpuplan.models.omniserve.policy import PolicyParams

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "examples" / "omniserve" / "llama70b-small.yaml"


def _variant(seed: int, ls_rate: float, be_requests: int, prompt: float, output: float):  # type: ignore[no-untyped-def]
    doc = gpuplan.load_problem(SMALL).document()
    doc["seed"] = seed
    doc["ls"] = {**doc["ls"], "rate_per_s": ls_rate}
    doc["be"] = {**doc["be"], "requests": be_requests, "rate_per_s": 4.0, "mean_prompt_tokens": prompt,
                 "mean_output_tokens": output}
    return gpuplan.load_problem(doc)


def _params(problem, mode: str, x: float = 0.0) -> PolicyParams:  # type: ignore[no-untyped-def]
    lat = build_latency(problem)
    return PolicyParams(mode, token_budget(problem, lat), problem.tpot_target_s(), x, mode == "omniserve")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), ls_rate=st.sampled_from([1.0, 4.0, 12.0]), be_requests=st.integers(4, 24),
       prompt=st.sampled_from([500.0, 2000.0, 6000.0]), output=st.sampled_from([8.0, 40.0]))
def test_ceiling_bounds_every_gpu_prefill_policy(seed: int, ls_rate: float, be_requests: int, prompt: float,
                                                 output: float) -> None:
    problem = _variant(seed, ls_rate, be_requests, prompt, output)
    ceiling = be_prefill_ceiling(problem, _params(problem, "omniserve"))
    assert ceiling["be_output_tokens_per_s"] >= 0 and ceiling["be_prefilled"] <= be_requests
    for mode, x in (("headroom", 0.1), ("headroom", 0.9), ("neo", 0.0), ("omniserve", 0.0), ("omniserve", 0.5)):
        got = run_policy(problem, _params(problem, mode, x), record=False).figures["be_output_tokens_per_s"]
        assert got <= ceiling["be_output_tokens_per_s"] * (1 + 1e-9) + 1e-9, (mode, x, got, ceiling)


def test_ceiling_is_deterministic_and_counts_whole_outputs() -> None:
    problem = _variant(0, 4.0, 8, 2000.0, 8.0)
    a = be_prefill_ceiling(problem, _params(problem, "omniserve"))
    b = be_prefill_ceiling(problem, _params(problem, "omniserve"))
    assert a == b
    assert a["be_prefilled"] >= 1
    # every prefilled request is credited with its whole output: at least one token each
    assert a["be_output_tokens_per_s"] * a["window_s"] >= a["be_prefilled"] - 1e-9
    assert a["be_prefill_tokens_per_s"] > a["be_output_tokens_per_s"]


def test_ceiling_falls_as_ls_takes_the_gpu() -> None:
    light = _variant(3, 1.0, 24, 6000.0, 40.0)
    heavy = _variant(3, 40.0, 24, 6000.0, 40.0)
    cl = be_prefill_ceiling(light, _params(light, "omniserve"))
    ch = be_prefill_ceiling(heavy, _params(heavy, "omniserve"))
    assert ch["be_prefill_tokens_per_s"] < cl["be_prefill_tokens_per_s"]
