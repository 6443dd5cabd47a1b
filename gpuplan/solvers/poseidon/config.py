"""Registers the fixed-configuration evaluation of Poseidon plans as the solver name "config", so
plans from `gpuplan evaluate poseidon --config ...` / `gpuplan.evaluate_config` name a known solver.
It is not a search: `solve` and `compare` skip it and point to `gpuplan evaluate poseidon`."""

from __future__ import annotations

from typing import Any

from gpuplan.models.poseidon import PoseidonPlan, PoseidonProblem
from gpuplan.option_rules import value_of
from gpuplan.registry import register_solver

WHY_NOT_A_SEARCH = "evaluates one fixed configuration: use `gpuplan evaluate poseidon ... --config tp=..,pp=..`"


def solve_config(problem: PoseidonProblem, *, config: Any = None, **_: Any) -> PoseidonPlan:
    """Return the plan of the fixed configuration `config` (see gpuplan.models.poseidon.config)."""
    from gpuplan.models.poseidon.config import evaluate_config

    return evaluate_config(problem, config if config is not None else {})


register_solver("poseidon", "config", solve_config, role="baseline", applicable=lambda p: WHY_NOT_A_SEARCH,
                description="a fixed Megatron-style configuration (tp, pp, dp, micro-batch, recompute, "
                            "interleave) evaluated by the same DAG model",
                option_rules={"config": value_of(dict, str, what="a configuration: a mapping or text such as "
                                                 "'tp=8,pp=8,dp=12,mb=1' (checked by parse_config)",
                                                 none="every field at its default: tp=1, pp=1, mb=1")})
