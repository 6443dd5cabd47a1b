"""Every field of a plan is a claim `check` holds: an audit over every leaf of each kind's example plan.

Each kind's example is solved once (test_check_tamper's fixture); then every leaf of the plan document
outside the embedded problem is changed alone, as a person editing the file would (a number to
1.5 x + 1, an integer + 1, a boolean flipped, a string with a letter added), and check must report
something. The only leaves allowed to change unnoticed are listed below with the reason: solver
diagnostics (times, counts, seeds), labels, and decisions whose change is a legitimate alternative
plan (every figure still holds). A new plan field that check does not hold fails this test.
Lists are sampled (their first three items at every level) to keep the audit fast.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Iterator

import pytest

from gpuplan import api, registry
from gpuplan.errors import InputError

from test_check_tamper import CASES, EXAMPLES, Doc, _codes, solved  # noqa: F401  (solved is a fixture)

# (kind or "*", path pattern) -> why a change of that leaf may pass check
ALLOWED: dict[tuple[str, str], str] = {
    ("*", r"solver\.(seed|time_limit_s|wall_time_s)"): "how the solver was run, not a claim about the plan",
    ("*", r"message|objective_name"): "free text for the reader",
    ("*", r"solver\.stats\.(jobs|classes|types|ef_rows_\w+|lp_rounds|structures|pruned|evaluated|"
          r"dag_evaluations|cuts_pruned|infeasible|unvisited|seeds|best_from|candidates|improvements|starts|"
          r"start_objectives\.\d+|evaluations(_per_pass\.\d+)?|passes|\w+_evaluations|sum_of_dimension_sizes|"
          r"pass_bound|splits|tolerance|local_search_moves|improving_kicks|stopped_by_time_limit|events|"
          r"dispatch_s|decision_mean_s|decision_p99_s|stage_a_simulated|search_s|repetend_search_s|"
          r"probe_budget|cpsat_units_left|tick_s|polish_skipped_at_bound|schedule_from|periods_tried\.\d+|"
          r"periods_constructed\.\d+|grouped\.(seeded_by|found))"): "search diagnostics (counts, times, provenance)",
    ("oef", r"solver\.stats\.upper_bound"):
        "a looser upper bound is still a bound; one below the plan's efficiency is caught (test_oef)",
    ("psrl", r"solver\.stats\.greedy_makespan_s"):
        "a greedy figure above the plan's is what the search improves on; one below it is caught",
    ("stragglers", r"solver\.stats\.lp_fluid_s"):
        "the fluid LP is no bound on one run; it is held to its critical-path floor from below",
    ("stragglers", r"solver\.stats\.lp_bound_note"):
        "free text for the reader: why a time limit left an LP bound out (the figures it names are absent)",
    ("aurora", r"edges\.\d+\.streams"):
        "streams only cap an edge's rate; one more stream on an edge another limit sets changes no figure",
    ("lagom", r"baselines\.autoccl\.\d+\.channels"):
        "channels past what an op can use (NVLS's 16 CTAs, a group's channels) leave the baseline's time as it is",
    ("tessel", r"predicted\.search_s"): "how long the search ran",
    ("omniserve", r"solver\.stats\.(ls_only_attainment|be_tokens_per_s_by_\w+\.[\w.]+)"):
        "the knob sweep's diagnostics",
    ("omniserve", r"be_batch_max|pace_factor|layers_per_iteration|be_inflight_max|be_gpu_fraction"):
        "knobs that do not bind on the example (re-simulated with the edit, the plan is the same); binding "
        "ones are caught (test_omniserve)",
    ("oef", r"rounds\.\d+\.\d+\.2\.\d+"): "another free GPU of the same type is an equally valid placement",
    ("oef", r"solver\.stats\.(min|mean)_discount"): "the mechanism's discount factors (re-deriving them is the mechanism)",
    ("*", r"solver\.stats\.(conflicts|branches|cpsat_\w+|time_units_per_s|heuristic_step_s|heuristic_over_exact|"
          r"greedy_over_exact|distinct_windows|lp_bound_s|dispatch)"):
        "CP-SAT's and the LP's record of their search, in their own units; the plan's figures are recomputed",
    ("tessel", r"solver\.stats\.(completion_candidates_s\.[\w/]+|best_baseline\.[\w-]+|period_memory_bound_ticks|"
               r"period_proven_minimal|grouped\.(group|period_ticks)|tessel_hint|hint_from)"):
        "schedules the search built and dropped, and a bound below its period: raised, they still claim nothing "
        "false (one below the plan's makespan, or a bound above its period, is caught: test_tessel)",
    ("tessel", r"solver\.stats\.(search_skipped|period_ticks)"):
        "a search skipped because a baseline met the bound leaves no repetend and no tick to hold period_ticks to; "
        "with a repetend it is checked (test_tessel)",
    ("stragglers", r"solver\.options\.tau"): "SDA derives tau when the option is 0: the derived value runs the same policy",
}


def leaves(node: Any, path: tuple[Any, ...] = (), width: int = 3) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Yield (path, value) for every scalar leaf of a JSON document, lists sampled to `width` items."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, path + (key,), width)
    elif isinstance(node, list):
        for i, value in enumerate(node[:width]):
            yield from leaves(value, path + (i,), width)
    else:
        yield path, node


def edited(value: Any) -> Any:
    """Return the value as a person editing the file might change it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 1
    if isinstance(value, str):
        return value + "x"
    return 1


def allowed(kind: str, dotted: str) -> bool:
    """Return True when a change of the leaf at `dotted` may pass check (see ALLOWED)."""
    return any(k in ("*", kind) and re.fullmatch(pattern, dotted) for k, pattern in ALLOWED)


def unnoticed_edits(kind: str, doc: Doc, width: int = 3) -> list[str]:
    """Return the leaves of a plan document (outside ALLOWED) whose edit check does not report."""
    base = _codes(kind, doc)
    missed = []
    for path, value in leaves(doc, width=width):
        if path[0] in ("problem", "input_digest"):
            continue  # held by the digest (test_check_tamper)
        dotted = ".".join(map(str, path))
        if allowed(kind, dotted):
            continue
        changed = copy.deepcopy(doc)
        node = changed
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = edited(value)
        try:
            caught = _codes(kind, changed) != base
        except InputError:  # the plan file is refused as it is read (its kind, its status...)
            caught = True
        if not caught:
            missed.append(f"{dotted} = {value!r}")
    return missed


SLOW_CHECKS = {"hetis", "omniserve"}  # their check re-simulates the serving trace once per edit


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[pytest.mark.slow] if k in SLOW_CHECKS else [])
                                  for k in CASES])
def test_every_field_of_a_plan_is_checked(solved: dict[str, Doc], kind: str) -> None:
    missed = unnoticed_edits(kind, solved[kind])
    assert not missed, f"check lets these {kind} fields change unnoticed: {missed}"


# variants whose plans differ from their kind's default solver's only in solver.stats (the head dispatch of
# one snapshot), where a check costs a serving simulation
SAME_PLAN_AS_DEFAULT = {("hetis", "hetis-lp"), ("hetis", "exact")}


# a second example where the kind's first leaves most baselines inapplicable (classic pipeline schedules
# need a plain pipeline placement)
MORE_EXAMPLES = {"tessel": "tessel/1f1b-4.yaml"}


def _solver_params() -> list[Any]:
    """Return (kind, example, solver) for every solver but the default on the kind's example (the test
    above audits that plan), and every solver on the kind's second example if it has one."""
    out = [pytest.param(kind, CASES[kind].example, spec.name, id=f"{kind}/{spec.name}") for kind in CASES
           for spec in registry.solvers(kind) if not spec.default and (kind, spec.name) not in SAME_PLAN_AS_DEFAULT]
    out += [pytest.param(kind, example, spec.name, id=f"{example}/{spec.name}")
            for kind, example in MORE_EXAMPLES.items() for spec in registry.solvers(kind)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind,example,solver", _solver_params())
def test_every_field_of_every_solvers_plan_is_checked(kind: str, example: str, solver: str) -> None:
    """The same audit on each solver's plan of the kind's examples (lists sampled to their first item)."""
    problem = api.load_problem(EXAMPLES / example)
    try:
        plan = api.solve(problem, solver=solver, time_limit_s=2)
    except InputError as exc:  # a solver that does not apply to this example (a homogeneous-only baseline...)
        pytest.skip(str(exc))
    missed = unnoticed_edits(kind, json.loads(plan.to_json()), width=1)
    assert not missed, f"check lets these {kind}/{solver} fields change unnoticed: {missed}"
