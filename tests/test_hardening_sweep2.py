"""The second hardening sweep (issue 10): classes of bad input a structure-aware mutation campaign over
every command found mishandled, each pinned by a test that failed before its fix.

- an output path that is a FIFO, a device or a link to one was replaced by a regular file (the atomic
  rename swapped the node itself); output paths were checked only after the work (`plan train -o
  FILE/sub` ended in a traceback after the whole solve, `solve --json FILE/x` after the plan was written);
- click's FloatRange lets nan through every bound and plain float options took nan and inf;
- run options had types but no domains (`steps=-1` never ended, `timeout_s=0` was a traceback);
- a pydantic ValidationError raised past the loaders (`simulate oef --reference-type`) was a traceback;
- an unreadable checkpoint's error ran over several lines (torch's text) or ended in an empty reason;
- true/false were read as the numbers 1/0 in every schema (`gpus: true`, `global_batch: true`);
- an unknown field's whole value (a 100-job list) was pasted into the message;
- a key written twice in one mapping kept the last value silently (YAML and JSON);
- a bundle manifest whose predicted, scales or files had the wrong shape ended in an AttributeError;
- `jobs: []` (stragglers), an unknown dtype in peak_tflops, `kind:` left empty, `schema_version: true`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuplan import api
from gpuplan.cli import main
from gpuplan.errors import InputError, OutputError
from gpuplan.io import atomic_write_text, check_output_path

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
TESSEL = EX / "tessel" / "1f1b-4.yaml"


def cli(args: list[str]) -> Any:
    """Run the CLI in-process; assert no traceback escaped; return click's result."""
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def one_error_line(result: Any) -> str:
    """Return the single non-empty output line of a failed command (exit code 2)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines, result.output
    return lines[-1]


@pytest.fixture(scope="module")
def tessel_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "tessel-plan.json"
    assert cli(["-q", "solve", "tessel", TESSEL, "--solver", "1f1b", "-o", out]).exit_code == 0
    return out


# ---------------------------------------------------------------- output paths

def test_an_output_fifo_is_refused_and_left_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    for target in (fifo, link):
        line = one_error_line(cli(["-q", "solve", "tessel", TESSEL, "--solver", "1f1b", "-o", target]))
        assert str(target) in line and "not a regular file" in line
        with pytest.raises(OutputError, match="not a regular file"):
            atomic_write_text(target, "{}")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # the rename would have replaced it with a regular file


def test_check_output_path_names_each_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert check_output_path(tmp_path / "new" / "plan.json") == tmp_path / "new" / "plan.json"
    for path, why in [("", "empty path"), (tmp_path, "is a directory"),
                      (tmp_path / "file" / "plan.json", "is a file, not a folder")]:
        with pytest.raises(OutputError, match=why):
            check_output_path(path)
    assert not (tmp_path / "new").exists()  # checking writes nothing


def test_a_bad_json_destination_is_refused_before_the_plan_is_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    plan = tmp_path / "plan.json"
    line = one_error_line(cli(["-q", "solve", "tessel", TESSEL, "--solver", "1f1b", "-o", plan,
                               "--json", tmp_path / "file" / "out.json"]))
    assert "is a file, not a folder" in line
    assert not plan.exists()  # nothing half done: the plan was written, then the command failed


@pytest.mark.parametrize("args", [
    ["plan", "train", EX / "poseidon" / "h100-a100-small.yaml", "-o", "{blocked}/bundle"],
    ["simulate", "oef", EX / "oef" / "trace-100.yaml", "--png", "{blocked}/jct.png"],
    ["simulate", "stragglers", EX / "stragglers" / "three-jobs.yaml", "--png", "{blocked}/x.png"],
    ["evaluate", "poseidon", EX / "poseidon" / "h100-a100-small.yaml", "--config", "tp=4,pp=1,dp=1",
     "-o", "{blocked}/plan.json"],
    ["psrl", "trace", "--jsonl", "{blocked}/trace.jsonl"],
    ["simulate", "hetis", EX / "hetis" / "small.yaml", "--json", "{blocked}/out.json"],
    ["plan", "train", EX / "poseidon" / "h100-a100-small.yaml", "--json", "{blocked}/out.json"],
], ids=["plan-train", "simulate-oef", "simulate-stragglers", "evaluate-poseidon", "psrl-trace", "simulate-hetis-json",
        "plan-train-json"])
def test_an_unwritable_output_is_refused_before_the_work(tmp_path: Path, args: list[Any]) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("x")
    started = time.perf_counter()
    result = cli([str(a).replace("{blocked}", str(blocked)) for a in args])
    assert "is a file, not a folder" in one_error_line(result)
    assert time.perf_counter() - started < 5.0  # plan train took 40 s, then a traceback; simulate oef 60 s


def test_run_refuses_its_png_path_before_running(tessel_plan: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    started = time.perf_counter()
    line = one_error_line(cli(["run", tessel_plan, "--png", tmp_path / "file" / "x.png"]))
    assert "is a file, not a folder" in line and time.perf_counter() - started < 5.0


# ---------------------------------------------------------------- numeric options

@pytest.mark.parametrize("args, option", [
    (["simulate", "omniserve", EX / "omniserve" / "llama70b-small.yaml", "--rate", "nan"], "--rate"),
    (["simulate", "stragglers", EX / "stragglers" / "three-jobs.yaml", "--load", "nan"], "--load"),
    (["simulate", "hetis", EX / "hetis" / "small.yaml", "--rate", "nan"], "--rate"),
    (["simulate", "oef", EX / "oef" / "trace-100.yaml", "--resolve-every-s", "nan"], "--resolve-every-s"),
    (["simulate", "oef", EX / "oef" / "trace-100.yaml", "--resolve-every-s", "-1"], "--resolve-every-s"),
    (["evaluate", "poseidon", EX / "poseidon" / "h100-a100-small.yaml", "--config", "tp=4,pp=1,dp=1",
      "--vs-search", "--time-limit", "nan"], "--time-limit"),
    (["plan", "train", EX / "poseidon" / "h100-a100-small.yaml", "--time-limit", "inf"], "--time-limit"),
], ids=["omniserve-rate", "stragglers-load", "hetis-rate", "oef-resolve-nan", "oef-resolve-negative",
        "evaluate-time-limit", "train-time-limit"])
def test_non_finite_numeric_options_are_refused_by_name(args: list[Any], option: str) -> None:
    started = time.perf_counter()
    line = one_error_line(cli(args))
    assert option in line, line  # stragglers named 'jobs[2].arrival_s'; omniserve was a traceback
    assert time.perf_counter() - started < 5.0  # oef simulated for a minute with nan


@pytest.mark.parametrize("option, expected", [
    ("steps=-1", "steps"), ("steps=1000000000000", "steps"), ("threads=0", "threads"),
    ("threads=100000", "threads"), ("timeout_s=0", "timeout_s"), ("format=compute", "format"),
    ("hidden=10000000", "hidden"),
])
def test_run_options_outside_their_domain_are_refused_before_starting(tessel_plan: Path, option: str,
                                                                       expected: str) -> None:
    started = time.perf_counter()
    line = one_error_line(cli(["run", tessel_plan, "--option", option]))
    assert f"run option '{expected}'" in line and "expected" in line, line
    assert time.perf_counter() - started < 8.0  # steps=-1 ran until killed; timeout_s=0 was a traceback


def test_the_api_refuses_run_options_outside_their_domain_too(tessel_plan: Path) -> None:
    from gpuplan import api
    from gpuplan.errors import InputError

    plan = api.load_plan(tessel_plan)
    for options in ({"steps": -1}, {"threads": 0}, {"no_such_option": 1}):  # api.run started the workers
        with pytest.raises(InputError, match="run option"):
            api.run(plan, **options)


def test_every_run_option_has_a_domain_that_holds_its_default() -> None:
    from gpuplan import registry
    from gpuplan.run_options import RUN_OPTION_RULES, runner_options

    for kind in registry.kinds():
        if registry.model(kind).runner is None:
            continue
        for name, default in runner_options(kind).items():
            assert name in RUN_OPTION_RULES, f"{kind} run option {name!r} has no entry in RUN_OPTION_RULES"
            assert RUN_OPTION_RULES[name].accepts(default), (kind, name, default)


# ---------------------------------------------------------------- documents

def _doc(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "input.yaml") -> Path:
    out = tmp_path / name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.mark.parametrize("example, path", [
    ("poseidon/h100-a100-small.yaml", ("global_batch",)),
    ("poseidon/h100-a100-small.yaml", ("cluster", "nodes", 0, "gpus", "H100")),
    ("aurora/localhost-3workers.yaml", ("workers", 0, "tokens_per_s")),
    ("stragglers/small-trace.yaml", ("slots",)),
    ("oef/gavel-36.yaml", ("tenants", 0, "jobs", 0, "gpus")),
    ("omniserve/paper-like.yaml", ("ls", "requests")),
    ("tessel/1f1b-4.yaml", ("shape", "backward_s")),
    ("lagom/llama2-7b-dp8.yaml", ("from_model", "seq_len")),  # a shorthand expanded before validation
], ids=lambda v: v if isinstance(v, str) else ".".join(map(str, v)))
def test_true_is_not_a_number(tmp_path: Path, example: str, path: tuple[Any, ...]) -> None:
    doc = _doc(EX / example)
    if example.startswith("stragglers"):  # its CSV trace sits beside it
        (tmp_path / "small-trace.csv").write_bytes((EX / "stragglers" / "small-trace.csv").read_bytes())
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = True
    with pytest.raises(InputError, match="expected a number, not true or false") as err:
        api.load_problem(_write(tmp_path, doc))
    assert err.value.field is not None and str(path[-1]) in err.value.field


def test_an_unknown_field_shows_a_short_value_and_few_fields(tmp_path: Path) -> None:
    result = cli(["-q", "solve", "oef", EX / "oef" / "trace-100.yaml", "-o", tmp_path / "p.json"])
    line = one_error_line(result)  # a simulate trace given to solve: every trace field is unknown
    assert "field 'jobs': unknown field" in line and len(line) < 1200, len(line)  # was 9,000 characters
    doc = _doc(TESSEL)
    doc.update({f"extra{i}": [i] * 50 for i in range(12)})
    with pytest.raises(InputError, match="more bad fields") as err:
        api.load_problem(_write(tmp_path, doc))
    assert len(str(err.value)) < 1200


def test_a_bad_reference_type_in_simulate_oef_is_one_line() -> None:
    line = one_error_line(cli(["simulate", "oef", EX / "oef" / "trace-100.yaml", "--normalisation", "reference",
                               "--reference-type", "nosuch"]))
    assert "reference_type" in line and "'nosuch'" in line  # was a pydantic traceback from the simulator


def test_stragglers_jobs_must_not_be_empty(tmp_path: Path) -> None:
    doc = _doc(EX / "stragglers" / "three-jobs.yaml")
    doc["jobs"] = []
    with pytest.raises(InputError, match="field 'jobs'"):
        api.load_problem(_write(tmp_path, doc))  # a solve divided by zero


def test_peak_tflops_names_known_dtypes(tmp_path: Path) -> None:
    doc = _doc(EX / "poseidon" / "cpu-two-types.yaml")
    doc["cluster"]["device_types"]["cpu"]["peak_tflops"] = {"fp23": 1.0}
    with pytest.raises(InputError, match="peak_tflops.*'fp23'"):
        api.load_problem(_write(tmp_path, doc))  # a solve raised ValueError: 'lists no fp32 peak'


def test_an_empty_kind_is_refused(tmp_path: Path) -> None:
    doc = _doc(TESSEL)
    doc["kind"] = None
    with pytest.raises(InputError, match="field 'kind': got None"):
        api.load_problem(_write(tmp_path, doc), "tessel")  # was read as 'tessel' from the command line


def test_schema_version_true_is_not_version_1(tessel_plan: Path, tmp_path: Path) -> None:
    doc = json.loads(tessel_plan.read_text())
    doc["schema_version"] = True
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="schema_version"):
        api.load_plan(edited)


def test_the_cli_reports_a_fifo_output_in_a_subprocess(tmp_path: Path) -> None:
    """The CLI itself: exit code 2, click's usage lines then one error line naming the path, and the FIFO
    is still a FIFO (no rename over it)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "gpuplan.cli", "-q", "solve", "tessel", str(TESSEL),
                           "--solver", "1f1b", "-o", str(fifo)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and last.lower().startswith("error: ") and str(fifo) in last
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("content", [b"", b"garbage\x80\x03not a pickle"], ids=["empty", "garbage"])
def test_an_unreadable_checkpoint_is_one_line(tmp_path: Path, content: bytes) -> None:
    pytest.importorskip("torch")
    from gpuplan.runtime.delta_io import load_checkpoint

    bad = tmp_path / "old.pt"
    bad.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_checkpoint(bad)
    text = str(err.value)
    assert "\n" not in text and not text.rstrip().endswith(":"), text  # torch's reason ran over 5 lines


def test_a_validation_error_past_the_loaders_is_one_line() -> None:
    """The top-level group turns a pydantic ValidationError a command lets through into exit code 2."""
    from gpuplan.cli import _Main
    from gpuplan.models.cluster import DeviceType

    group = _Main("g")

    @group.command("boom")
    def boom() -> None:
        DeviceType.model_validate({"name": "x", "memory_bytes": -1})

    result = CliRunner().invoke(group, ["boom"], catch_exceptions=True)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.output
    line = one_error_line(result)
    assert line.startswith("error: field 'memory_bytes'") and "Traceback" not in result.output


@pytest.mark.parametrize("name, text, fmt", [
    ("input.yaml", "kind: tessel\nname: a\nname: b\n", "yaml"),
    ("input.yaml", "kind: tessel\nshape: {forward_s: 1, forward_s: 2}\n", "yaml"),
    ("plan.json", '{"kind": "tessel", "schema_version": 1, "kind": "oef"}', "json"),
    # documents the fast constructor leaves to PyYAML (a timestamp, a merge key, a set)
    ("input.yaml", "kind: tessel\nwhen: 2001-01-01\nname: a\nname: b\n", "yaml"),
    ("input.yaml", "base: &b {x: 1}\nshape: {<<: *b, y: 1, y: 2}\n", "yaml"),
    ("input.yaml", "a: !!set {x, x}\n", "yaml"),
], ids=["yaml-top", "yaml-nested", "json", "fallback-timestamp", "fallback-merge", "fallback-set"])
def test_a_key_written_twice_is_refused(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    from gpuplan.io import parse_document

    with pytest.raises(InputError, match="appears twice in one") as err:
        parse_document(text, name, fmt=fmt)  # PyYAML and json kept the last value silently
    assert name in str(err.value)


def test_a_merged_key_may_be_overridden() -> None:
    from gpuplan.io import parse_document

    # `<<` merges defaults that the mapping's own keys override: not a key written twice
    assert parse_document("base: &b {x: 1, y: 1}\nm: {<<: *b, x: 2}\n", "case.yaml") == {
        "base": {"x": 1, "y": 1}, "m": {"x": 2, "y": 1}}


def test_equal_keys_of_different_types_are_not_duplicates() -> None:
    from gpuplan.io import parse_document

    # 1 and true are one key to Python (the safe loader's result, kept), but not a key written twice
    assert parse_document("1: a\ntrue: c\nx: {y: 1, z: 2}\n", "case.yaml") == {1: "c", "x": {"y": 1, "z": 2}}


@pytest.mark.parametrize("field, value", [("predicted", [1, 2]), ("scales", {"a": 1}), ("files", ["poseidon.json"]),
                                          ("scales", [True])])
def test_a_bundle_manifest_of_the_wrong_shape_is_refused(tmp_path: Path, field: str, value: Any) -> None:
    from gpuplan.compose.bundle import read_manifest

    doc: dict[str, Any] = {"kind": "training-bundle", "schema_version": 1, "files": {}, "scales": [1.0],
                           "predicted": {"iteration_time_s": 1.0}}
    doc[field] = value
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"field '{field}'"):
        read_manifest(tmp_path)  # check, show and both exports ended in AttributeError: 'list' ... 'get'
