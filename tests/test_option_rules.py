"""Solver option values are checked against each option's domain (gpuplan.option_rules), in one place:
`registry.check_options`, which `api.solve` and `gpuplan solve --option` go through."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuplan import api, registry
from gpuplan.cli import main
from gpuplan.errors import InputError
from gpuplan.models.base import Problem
from gpuplan.option_rules import OptionRule, flag, integer, number, one_of, value_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "aurora": "aurora/small-2regions.yaml", "hetis": "hetis/small.yaml", "lagom": "lagom/small.yaml",
    "oef": "oef/four-tenants.yaml", "omniserve": "omniserve/llama70b-small.yaml",
    "poseidon": "poseidon/h100-a100-small.yaml", "psrl": "psrl/small-agent.yaml",
    "stragglers": "stragglers/three-jobs.yaml", "tessel": "tessel/hand-2.yaml",
}


def _options() -> list[tuple[str, str, str, Any]]:
    """Return (kind, solver, option, default) of every registered solver option."""
    return [(k, s.name, n, d) for k in registry.kinds() for s in registry.solvers(k)
            for n, d in registry.solver_options(s).items()]


_PROBLEMS: dict[str, Problem] = {}


def _problem(kind: str) -> Problem:
    if kind not in _PROBLEMS:
        _PROBLEMS[kind] = api.load_problem(ROOT / "examples" / EXAMPLES[kind])
    return _PROBLEMS[kind]


def _refused(kind: str, solver: str, name: str, value: Any) -> InputError:
    """Return the InputError api.solve raises for option `name` = `value` (failing when it raises none)."""
    with pytest.raises(InputError) as info:
        api.solve(_problem(kind), solver=solver, **{name: value})
    err = info.value
    assert err.field == f"option.{name}" and repr(name) in str(err), str(err)
    return err


def bad_values(rule: OptionRule) -> dict[str, list[Any]]:
    """Return out-of-domain values of `rule` by class: choice, bound, sentinel, nan (and None, type)."""
    out: dict[str, list[Any]] = {"choice": [], "bound": [], "sentinel": [], "nan": [], "other": []}
    if rule.none is None:
        out["other"].append(None)
    if rule.kind == "bool":
        out["other"].append("yes")
    elif rule.kind == "choice":
        out["choice"].append("bogus" if isinstance(rule.choices[0], str) else 99)
    elif rule.kind == "value":
        out["other"].append(3.5)
    else:
        sentinels = {v for v, _ in rule.special}
        step = 1 if rule.kind == "int" else 0.5
        if rule.low is not None:
            below = rule.low if rule.low_open else rule.low - step
            while below in sentinels:
                below -= step
            out["bound"].append(below)
        if rule.high is not None:
            out["bound"].append(rule.high if rule.high_open else rule.high + step)
        for v in sentinels:  # next to a sentinel, outside the range: still refused
            for near in (v - step, v + step):
                if near not in sentinels and not rule.accepts(near):
                    out["sentinel"].append(near)
        if rule.kind == "number":
            out["nan"] += [math.nan, math.inf, -math.inf]
        else:
            out["other"].append(2.5)  # a float for an integer
    return out


def test_every_registered_option_has_a_rule_its_default_satisfies() -> None:
    missing, bad_defaults = [], []
    for kind, solver, name, default in _options():
        rule = registry.option_rule(registry.solver(kind, solver), name)
        if rule is None:
            missing.append(f"{kind}/{solver}/{name}")
        elif not rule.accepts(default):
            bad_defaults.append(f"{kind}/{solver}/{name}={default!r}: {rule.describe()}")
    assert not missing, f"options without an OptionRule (register_solver(..., option_rules=...)): {missing}"
    assert not bad_defaults, bad_defaults
    # every kind with options covers the classes its rules hold; the whole registry covers all four
    assert {c for *_, c in _cases()} >= {"choice", "bound", "sentinel", "nan"}


def _cases() -> list[tuple[str, str, str, Any, str]]:
    out = []
    for kind, solver, name, _ in _options():
        rule = registry.option_rule(registry.solver(kind, solver), name)
        assert rule is not None
        for cls, values in bad_values(rule).items():
            out += [(kind, solver, name, v, cls) for v in values]
    return out


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_out_of_domain_values_are_refused_through_the_api(kind: str) -> None:
    cases = [c for c in _cases() if c[0] == kind]
    if kind == "hetis":
        assert not cases  # no hetis solver takes options
    for _, solver, name, value, cls in cases:
        err = _refused(kind, solver, name, value)
        if cls != "other":  # a wrong type is refused by the signature check, which words it itself
            rule = registry.option_rule(registry.solver(kind, solver), name)
            assert rule is not None and f"expected {rule.describe()}" in str(err), (cls, str(err))


@pytest.mark.parametrize(("kind", "solver", "name", "value", "expected"), [
    ("oef", "oef", "method", "bogus", "one of 'cuts', 'cvxpy' (default 'cuts')"),
    ("oef", "oef", "dual_groups", 1001, "an integer in [1, 1000], or 0 (no dual bound) (default 100)"),
    ("poseidon", "poseidon", "cuts", "bogus", "one of 'ridge', 'all'"),
    ("poseidon", "poseidon", "num_stages", "two", "an integer in [1, 256], or None"),
    ("poseidon", "poseidon", "workers", 0, "an integer in [1, 256], or None"),
    ("stragglers", "laps-r", "beta", 1.5, "a number in (0, 1] (default 0.5)"),
    ("stragglers", "laps-r", "beta", 0, "a number in (0, 1]"),
    ("stragglers", "dolly", "budget", -1, "a number in [0, 1] (default 0.05)"),
    ("stragglers", "hesrpt", "p", 1.0, "a number in (0, 1), or 0 (automatic"),
    ("stragglers", "threshold", "light", "ese", "one of 'sca', 'sda'"),
    ("stragglers", "sca", "resolve", 2, "one of 0, 1"),
    ("omniserve", "omniserve", "be_gpu_fraction", 1.5, "a number in [0, 1], or -1 (automatic"),
    ("omniserve", "omniserve", "be_gpu_fraction", -0.5, "a number in [0, 1], or -1 (automatic"),
    ("omniserve", "omniserve", "be_inflight_max", -2, "or 0 (no bound), or -1 (automatic"),
    ("omniserve", "sarathi", "token_budget", -5, "an integer in [1, 16384], or 0 (automatic"),
    ("tessel", "tessel", "polish_s", -1.0, "a number in (0, 1e9], or 0 (off)"),
    ("tessel", "tessel", "latency_search_s", math.nan, "a number in (0, 1e9]"),
    ("lagom", "lagom", "passes", -1, "an integer >= 1, or 0 (no priority pass"),
    ("stragglers", "srptms-c", "eps", -0.1, "a finite number >= 0 (default 0.1)"),
    ("stragglers", "dolly", "small_tasks", -1, "an integer >= 1, or 0 (no job is cloned) (default 10)"),
    ("stragglers", "srpt-r", "max_copies", 10**8, "an integer in [1, 4096] (default 8)"),
    ("stragglers", "mantri", "delta", math.inf, "a number in [0, 1] (default 0.25)"),
    ("psrl", "psrl", "perturb_rounds", -1, "an integer >= 0 (default 40)"),
    ("aurora", "aurora", "payload", "bogus", "one of 'delta', 'dense'"),
    ("aurora", "exact", "workers", 0, "an integer in [1, 256] (default 2)"),
])
def test_the_error_names_the_option_the_value_and_the_domain(kind: str, solver: str, name: str, value: Any,
                                                              expected: str) -> None:
    err = _refused(kind, solver, name, value)
    assert str(err).startswith(f"option {name!r}: got {value!r}; expected "), str(err)
    assert expected in str(err) and err.value is value
    assert "\n" not in str(err)


def test_values_inside_the_domain_and_the_sentinels_pass() -> None:
    ok = {("stragglers", "laps-r"): {"beta": 1, "max_copies": 1},
          ("stragglers", "hesrpt"): {"p": 0.0},
          ("stragglers", "sda"): {"tau": 0, "d": 0, "target": 1.0},
          ("stragglers", "srptms-c"): {"eps": 2.0},  # pareto alpha < 1.5: h(2) - h(1) > 1
          ("stragglers", "dolly"): {"small_tasks": 0, "p": 1.0},
          ("lagom", "lagom"): {"passes": 0, "polish": False},
          ("psrl", "psrl"): {"max_rounds": 0, "perturb_rounds": 0},
          ("omniserve", "omniserve"): {"be_gpu_fraction": -1, "token_budget": 0, "be_inflight_max": 0,
                                       "pace_factor": 100},
          ("omniserve", "headroom"): {"be_gpu_fraction": 0},
          ("oef", "oef"): {"method": "cvxpy", "groups": 0, "dual_groups": 1000},
          ("poseidon", "poseidon"): {"num_stages": None, "workers": None},
          ("poseidon", "config"): {"config": {"tp": 2}},
          ("tessel", "tessel"): {"polish_s": 0.0, "latency_search_s": 2}}
    for (kind, solver), options in ok.items():
        registry.check_options(registry.solver(kind, solver), options)  # raises nothing


def test_nan_is_refused_even_for_an_option_without_a_rule() -> None:
    spec = registry.SolverSpec("oef", "tmp", lambda problem, *, x=1.0, **_: None)  # type: ignore[arg-type,return-value]
    registry.check_options(spec, {"x": 2.0})
    with pytest.raises(InputError, match="option 'x': got nan; expected a finite number"):
        registry.check_options(spec, {"x": math.nan})


@pytest.mark.parametrize(("kind", "solver", "name", "value", "expected"), [
    ("oef", "gavel-maxmin", "method", "cvxpy", "expected one of: tie_break"),  # read by the SI/EF LPs only
    ("oef", "maxmin-agnostic", "groups", 4, "expected one of: tie_break"),
    ("oef", "oef", "tie_break", "efficiency", "expected one of: dual_groups, groups, method"),  # max-min only
    ("oef", "oef-si", "tie_break", "solver", "expected one of: dual_groups, groups, method"),
    ("oef", "max-throughput", "method", "cuts", "expected no options: it takes none"),
    ("tessel", "tessel-unrolled", "completion", True, "expected one of: latency_search_s, polish_s, workers"),
])
def test_an_option_the_solver_does_not_read_is_refused(kind: str, solver: str, name: str, value: Any,
                                                       expected: str) -> None:
    err = _refused(kind, solver, name, value)
    assert "has no such option" in str(err) and expected in str(err), str(err)


def test_the_options_each_solver_reads_still_apply() -> None:
    prob = _problem("oef")
    for solver, options in (("gavel-maxmin", {"tie_break": "efficiency"}), ("oef-si", {"method": "cvxpy"})):
        plan = api.solve(prob, solver=solver, **options)
        assert plan.solver is not None and plan.solver.options == options and plan.status.value in ("optimal", "feasible")
    plan = api.solve(_problem("tessel"), solver="tessel-unrolled", workers=1)
    assert plan.solver is not None and plan.solver.options == {"workers": 1}


def test_a_rule_for_an_option_the_solver_does_not_read_is_a_registration_error() -> None:
    def fn(problem: Any, *, beta: float = 0.5) -> Any:
        return None

    with pytest.raises(ValueError, match="betta"):
        registry.register_solver("oef", "test-stray-rule", fn, option_rules={"betta": number(0, 1)})
    assert all(s.name != "test-stray-rule" for s in registry.solvers("oef"))


def test_rules_describe_and_accept() -> None:
    assert number(0, 1).describe() == "a number in [0, 1]"
    assert number(0, 1, low_open=True).describe() == "a number in (0, 1]"
    assert number(0).describe() == "a finite number >= 0"
    assert integer(1).describe() == "an integer >= 1"
    assert integer(1, special={0: "off"}).describe() == "an integer >= 1, or 0 (off)"
    assert integer(1, none="automatic").describe() == "an integer >= 1, or None (automatic)"
    assert one_of("a", "b").describe() == "one of 'a', 'b'"
    assert flag().describe() == "true or false"
    assert not integer(0).accepts(True) and not one_of(0, 1).accepts(True) and not flag().accepts(1)
    assert not integer(1, special={0: "off"}).accepts(0.0)  # an integer option takes no float
    assert number(0, 1, special={-1: "auto"}).accepts(-1) and number(0, 1, special={-1: "auto"}).accepts(-1.0)
    assert not number().accepts(math.nan) and number(nonfinite=True).accepts(math.inf)
    assert value_of(dict, str, what="a mapping").accepts({}) and not value_of(dict, what="x").accepts(None)


def test_cli_exits_2_with_one_line_for_a_bad_value(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    cases = [
        (["solve", "oef", str(ROOT / "examples/oef/four-tenants.yaml"), "--option", "method=bogus"],
         "error: option 'method': got 'bogus'; expected one of 'cuts', 'cvxpy' (default 'cuts')"),
        (["solve", "stragglers", str(ROOT / "examples/stragglers/three-jobs.yaml"), "--solver", "laps-r",
          "--option", "beta=1.5"],
         "error: option 'beta': got 1.5; expected a number in (0, 1] (default 0.5)"),
    ]
    for args, line in cases:
        res = CliRunner().invoke(main, args + ["-o", str(plan), "-q"])
        assert res.exit_code == 2, res.output
        assert res.output.strip() == line
        assert not plan.exists()


def test_list_options_shows_each_domain() -> None:
    res = CliRunner().invoke(main, ["list", "--options", "stragglers", "--json"])
    assert res.exit_code == 0, res.output
    rows = {(r["scope"], r["name"]): r for r in json.loads(res.output)["options"]}
    assert rows[("solve --solver laps-r", "beta")]["allowed"] == "a number in (0, 1]"
    res = CliRunner().invoke(main, ["list", "--options", "oef"])
    assert res.exit_code == 0 and "allowed" in res.output and "'cuts', 'cvxpy'" in res.output


def test_every_workers_option_is_bounded() -> None:
    """A `workers` option (processes or CP-SAT search threads) has an upper bound, so a typo such as
    workers=100000 is refused instead of forking or spawning that many."""
    from gpuplan.option_rules import MAX_WORKERS

    found = [(k, s, n) for k, s, n, _ in _options() if n == "workers"]
    assert len(found) >= 4
    for kind, solver, name in found:
        rule = registry.option_rule(registry.solver(kind, solver), name)
        assert rule is not None and rule.high == MAX_WORKERS, (kind, solver)
        _refused(kind, solver, name, MAX_WORKERS + 1)
