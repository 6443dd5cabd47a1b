"""Loading large inputs: the fast YAML path builds exactly what PyYAML's safe loader builds in well under
half its time (side by side), a 10,000-job OEF input with distinct speedup vectors loads exactly, and a
bad value deep in it is still named by file, field, value and expectation.

Run as a script to print load times: .venv/bin/python tests/test_load_speed.py [JOBS ...]
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpuplan import api
from gpuplan import io as gio
from gpuplan.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from oef_bench import distinct_problem  # noqa: E402  (the benchmark's distinct-job generator)

MAX_GPUS = 65_536   # the most GPUs an input may declare


def distinct_jobs_document(n: int, m: int = 8, seed: int = 0) -> dict[str, Any]:
    """Return oef_bench.py's distinct-job OEF document (n single-job tenants, each with its own speedup
    vector on m GPU types), its cluster cut to the MAX_GPUS an input may declare."""
    doc = distinct_problem(np.random.default_rng(seed), n, m)
    gpus = doc["cluster"]["gpus"]
    per = min(next(iter(gpus.values())), MAX_GPUS // len(gpus) // 8 * 8)
    doc["cluster"]["gpus"] = {t: per for t in gpus}
    return doc


def write_yaml(doc: dict[str, Any], path: Path) -> Path:
    """Write `doc` as block-style YAML to `path`; return the path."""
    path.write_text(yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
    return path


def _same(a: Any, b: Any) -> bool:
    """Return True when a and b are equal values of the same types (NaN equal to NaN, -0.0 not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _outcome(text: str, parse: Any) -> tuple[str, Any]:
    try:
        return "ok", parse(text)
    except Exception as exc:  # the error's type is what is compared
        return "error", type(exc).__name__


YAML_CASES = [
    "a: 1_000", "a: 010", "a: 0x1F", "a: 0b101", "a: 0o17", "a: 1:30", "a: 190:20:30.15", "a: -0", "a: +5",
    "a: -0.0", "a: .inf", "a: -.Inf", "a: .nan", "a: 1.5e+3", "a: 1.e-2", "a: 1e5", "a: +.5", "a: 1__0.",
    "a: 99999999999999999999999", "a: !!float 5", "a: !!int '7'", "a: !!str 5", "a: '1.5'", 'a: "010"',
    "a: [yes, no, on, off, ~, null, true, False]", "1: a\n2.5: b\ntrue: c\n~: d", "- 1\n- 2", "", "~", "3",
    "a: &x {b: 1}\nc: *x", "<<: {a: 1}\nb: 2", "a: {<<: [{x: 1}], y: 2}", "= : x", "a: 2001-12-14",
    "a: !!binary aGVsbG8=", "a: !!set {x, y}", "a: !!omap [{a: 1}]", "a:\n  - - - x",
    # refused alike: unhashable key, mismatched or bad explicit tags, a tag that would run code
    "? [1, 2]\n: 3", "a: !!float [1]", "a: !!map [1]", "a: !!float abc", "a: !!python/object:os.system x",
]


@pytest.mark.parametrize("text", YAML_CASES)
def test_fast_yaml_builds_what_the_safe_loader_builds(text: str) -> None:
    expected = _outcome(text, lambda t: yaml.load(t, Loader=gio._YAML_LOADER))
    got = _outcome(text, lambda t: gio._parse_yaml(t, "case.yaml"))
    assert got[0] == expected[0], (text, got, expected)
    assert _same(got[1], expected[1]) if got[0] == "ok" else got[1] == expected[1], (text, got, expected)


def test_fast_yaml_keeps_aliases_one_object_and_recursion() -> None:
    doc = gio._parse_yaml("a: &x {b: [1, 2]}\nc: *x\nd: &y [0, *y]", "case.yaml")
    assert doc["a"] is doc["c"]
    assert doc["d"][1] is doc["d"]
    with pytest.raises(InputError, match="more than 100 values"):
        gio.check_document(doc, "case.yaml", max_nodes=100)  # a self-reference is still bounded


def test_fast_yaml_parses_in_well_under_half_the_time_of_the_safe_loader(tmp_path: Path) -> None:
    """Side by side on the same 2,000 distinct jobs, by CPU time, the least of three each (a fixed bound
    failed in CI: the shared VM's speed swings by 60 % within a minute, and a 10,000-job parse took
    0.55 s quiet and 1.5-2.1 s on busy runs): libyaml's safe loader alone takes 2.5-2.9x as long as
    read_document here (1.67-1.85 s against 4.43-5.21 s at 10,000 jobs, 4 Dec 2026)."""
    src = write_yaml(distinct_jobs_document(2_000, seed=3), tmp_path / "jobs.yaml")
    text = src.read_text()
    ours, theirs = [], []
    for _ in range(3):
        started = time.process_time()
        gio.read_document(src)
        ours.append(time.process_time() - started)
        started = time.process_time()
        yaml.load(text, Loader=gio._YAML_LOADER)
        theirs.append(time.process_time() - started)
    assert min(ours) < 0.6 * min(theirs), f"read_document {ours} s against the safe loader's {theirs} s (CPU)"


def test_fast_yaml_matches_the_safe_loader_on_a_large_input(tmp_path: Path) -> None:
    text = write_yaml(distinct_jobs_document(500, seed=1), tmp_path / "jobs.yaml").read_text()
    assert _same(gio._parse_yaml(text, "jobs.yaml"), yaml.load(text, Loader=gio._YAML_LOADER))


@pytest.fixture(scope="module")
def jobs_10k(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Return a 10,000-distinct-job document and the YAML file holding it."""
    doc = distinct_jobs_document(10_000, seed=2)
    return doc, write_yaml(doc, tmp_path_factory.mktemp("load") / "jobs.yaml")


def test_10k_distinct_jobs_load_exactly(jobs_10k: tuple[dict[str, Any], Path]) -> None:
    doc, src = jobs_10k
    assert _same(gio.read_document(src), doc)
    problem = api.load_problem(src)
    assert sum(len(t.jobs) for t in problem.tenants) == 10_000
    assert problem.document() == api.load_problem(doc).document()


def test_a_bad_value_deep_in_a_large_input_is_named(tmp_path: Path) -> None:
    doc = distinct_jobs_document(2_000, seed=3)
    doc["tenants"][1_876]["jobs"][0]["throughput"]["V100"] = -2.5
    src = write_yaml(doc, tmp_path / "jobs.yaml")
    with pytest.raises(InputError) as err:
        api.load_problem(src)
    message = str(err.value)
    assert str(src) in message and "tenants[1876].jobs[0]" in message and "-2.5" in message
    assert "non-negative" in message
    doc["tenants"][1_876]["jobs"][0]["throughput"]["V100"] = float("nan")
    with pytest.raises(InputError, match=r"tenants\[1876\]\.jobs\[0\]\.throughput\.V100.*finite"):
        api.load_problem(write_yaml(doc, tmp_path / "nan.yaml"))


@pytest.mark.slow
def test_100k_distinct_jobs_load_in_seconds(tmp_path: Path) -> None:
    src = write_yaml(distinct_jobs_document(100_000, seed=4), tmp_path / "jobs.yaml")
    started = time.process_time()
    problem = api.load_problem(src)
    assert sum(len(t.jobs) for t in problem.tenants) == 100_000
    assert time.process_time() - started < 60


def _time_loads(n: int) -> list[str]:
    """Return lines with the wall and CPU seconds of api.load_problem on n distinct jobs, from a YAML file
    and from a dict, and the file's size."""
    doc = distinct_jobs_document(n, seed=n)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        src = write_yaml(doc, Path(tmp) / "jobs.yaml")
        for label, source in (("yaml file", src), ("dict", doc)):
            wall, cpu = time.perf_counter(), time.process_time()
            api.load_problem(source)
            lines.append(f"{n:>7,} jobs from a {label:<9} ({src.stat().st_size / 1e6:.1f} MB YAML): "
                         f"{time.perf_counter() - wall:6.2f} s wall, {time.process_time() - cpu:6.2f} s CPU")
    return lines


if __name__ == "__main__":
    api.load_problem(distinct_jobs_document(10, m=3))  # imports and registry discovery, not timed
    for size in [int(a) for a in sys.argv[1:]] or [10_000, 100_000]:
        for line in _time_loads(size):
            print(line, flush=True)
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
