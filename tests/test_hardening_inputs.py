"""Bad input never hangs or crashes: one line naming file, field, value and expectation, exit code 2,
nothing written. One test (or a parametrized set) per class of bad input."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuplan import io as gio
from gpuplan.cli import main
from gpuplan.errors import InputError, OutputError

ROOT = Path(__file__).resolve().parent.parent
FOUR = ROOT / "examples/oef/four-tenants.yaml"
PROFILE = ROOT / "examples/profile/cpu-2core-quick.json"


def run(args: list[str]) -> Any:
    """Invoke the CLI in-process; assert it ended through sys.exit (no traceback)."""
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception),
                                                                                 result.output)
    assert "Traceback" not in result.output
    return result


def refused(args: list[str], *needles: str) -> str:
    """Assert exit code 2 with one error line containing every needle; return the output."""
    result = run(args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    return result.output


def four() -> dict[str, Any]:
    return yaml.safe_load(FOUR.read_text())


def write(tmp_path: Path, doc: Any, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return path


def solve_oef(path: Path | str, out: Path, *extra: str) -> list[str]:
    return ["solve", "oef", str(path), "-q", "-o", str(out), *extra]


# ---------------------------------------------------------------- hangs and memory blow-ups

def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    src = tmp_path / "bomb.yaml"
    src.write_text("kind: oef\n" + "\n".join(lines) + "\n")
    assert src.stat().st_size < 1024
    started = time.perf_counter()
    refused(solve_oef(src, tmp_path / "plan.json"), "bomb.yaml", "YAML aliases counted")
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "plan.json").exists()


def test_self_referencing_yaml_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "loop.yaml"
    src.write_text("kind: oef\nx: &a [*a]\n")
    refused(solve_oef(src, tmp_path / "plan.json"), "loop.yaml", "nested deeper than")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
def test_non_regular_inputs_are_refused_without_reading(tmp_path: Path, special: str) -> None:
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo.yaml"), "directory": str(tmp_path)}[special]
    if special == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would hang forever
    started = time.perf_counter()
    out = refused(solve_oef(path, tmp_path / "plan.json"), path)
    assert "not a regular file" in out or "is a directory" in out
    assert time.perf_counter() - started < 10
    refused(["check", path], path)
    refused(["show", path], path)


def test_oversized_input_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:  # sparse: costs no disk
        f.truncate(gio.MAX_INPUT_BYTES + 1)
    refused(solve_oef(big, tmp_path / "plan.json"), "big.yaml", f"at most {gio.MAX_INPUT_BYTES:,} bytes")


def test_read_input_bytes_refuses_a_file_that_grows(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_bytes(b"a" * 100)
    with pytest.raises(InputError, match="at most 50 bytes"):
        gio.read_input_bytes(f, limit_bytes=50)
    assert gio.read_input_bytes(f, limit_bytes=100) == b"a" * 100


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["cluster"]["gpus"].update(V100=1_000_000_000), "cluster.gpus"),
    (lambda d: d["tenants"][0]["jobs"][0].update(gpus=10**9), "tenants[0].jobs[0].gpus"),
    (lambda d: d["cluster"].update(gpus_per_node=10**7), "cluster.gpus_per_node"),
])
def test_huge_counts_are_refused_with_their_documented_limit(tmp_path: Path, mutate: Any, field: str) -> None:
    doc = four()
    mutate(doc)
    refused(solve_oef(write(tmp_path, doc), tmp_path / "plan.json"), f"field '{field}'", "at most")


def test_aurora_worker_count_1e7_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples/aurora/small-2regions.yaml").read_text())
    doc["workers"][0]["count"] = 1e7
    refused(["solve", "aurora", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")],
            "field 'workers'", "10,000,004 in all", "at most 4,096")


def test_aurora_workers_are_limited_in_all(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples/aurora/small-2regions.yaml").read_text())
    doc["workers"][0]["count"] = doc["workers"][1]["count"] = 3000  # each within the limit, not together
    refused(["solve", "aurora", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")],
            "field 'workers'", "6,003 in all", "workers.count")


def test_many_jobs_parse_with_the_c_loader() -> None:
    if yaml.__with_libyaml__:
        assert gio._YAML_LOADER is yaml.CSafeLoader


@pytest.mark.slow
def test_100k_job_oef_input_parses_in_seconds(tmp_path: Path) -> None:
    head = FOUR.read_text().split("tenants:")[0]
    tenants = "".join(f"  - name: t{t}\n    jobs:\n" + "".join(
        f"      - {{name: j{i}, type: resnet50, gpus: {1 + i % 4}}}\n" for i in range(t * 1000, (t + 1) * 1000))
        for t in range(100))
    src = tmp_path / "many.yaml"
    src.write_text(head + "tenants:\n" + tenants)
    assert src.stat().st_size > 2 * 10**6
    started = time.process_time()  # CPU time: the shared CI machine's load does not count
    data = gio.read_document(src)
    assert sum(len(t["jobs"]) for t in data["tenants"]) == 100_000
    assert time.process_time() - started < 20  # 36 s with the pure-Python loader on a 2 MB file


# ---------------------------------------------------------------- numbers

@pytest.mark.parametrize("value,expected", [
    (float("inf"), "a finite number"), (float("nan"), "a finite number"), (1e308, "at most 1e+18"),
])
def test_non_finite_and_absurd_numbers_are_refused(tmp_path: Path, value: Any, expected: str) -> None:
    doc = four()
    doc["round_s"] = value
    refused(solve_oef(write(tmp_path, doc), tmp_path / "plan.json"), "field 'round_s'", expected)


@pytest.mark.parametrize("text", ['{"kind": "oef", "round_s": NaN}', '{"kind": "oef", "round_s": Infinity}',
                                  '{"kind": "oef", "round_s": 1e999}'])
def test_json_non_finite_constants_are_refused(tmp_path: Path, text: str) -> None:
    src = tmp_path / "p.json"
    src.write_text(text)
    out = refused(solve_oef(src, tmp_path / "plan.json"), "p.json")
    assert "finite" in out


@pytest.mark.parametrize("value", ["1e308 Gbps", 1e308, -1, "inf"])
def test_quantities_with_units_are_bounded(tmp_path: Path, value: Any) -> None:
    doc = yaml.safe_load((ROOT / "examples/aurora/small-2regions.yaml").read_text())
    doc["workers"][0]["uplink_GBps"] = value
    refused(["solve", "aurora", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")],
            "workers[0].uplink_GBps")


def test_unit_strings_are_bounded() -> None:
    from gpuplan.units import to_bytes, to_GBps, to_tflops

    with pytest.raises(ValueError, match="finite"):
        to_bytes("1e308 TiB")
    with pytest.raises(ValueError, match="non-negative"):
        to_GBps("-5 Gbps")
    with pytest.raises(ValueError, match="at most 1e\\+06"):
        to_tflops(1e308)
    assert to_bytes("-1 GB") == -1e9  # a block that frees memory
    assert to_GBps("25 Gbps") == pytest.approx(3.125)


@pytest.mark.parametrize("value,expected", [(-5.0, "non-negative"), (1e308, "at most"), (1e7, "at most 1e+06")])
def test_absurd_profile_figures_are_refused_through_profile(tmp_path: Path, value: float, expected: str) -> None:
    prof = json.loads(PROFILE.read_text())
    dtype = next(iter(prof["device_types"][0]["matmul_tflops"]))
    prof["device_types"][0]["matmul_tflops"][dtype] = value
    bad = write(tmp_path, prof, "bad.json")
    refused(["solve", "poseidon", str(ROOT / "examples/poseidon/cpu-two-types.yaml"), "--profile", str(bad), "-q",
             "-o", str(tmp_path / "plan.json")], "bad.json", "matmul_tflops", expected)
    problem = yaml.safe_load((ROOT / "examples/profile/oef-on-profile.yaml").read_text())
    problem["cluster"] = {"profile": str(bad)}  # the in-file route reads the same checks
    refused(solve_oef(write(tmp_path, problem), tmp_path / "plan.json"), "bad.json", "matmul_tflops", expected)
    assert not (tmp_path / "plan.json").exists()


def test_nan_in_a_profile_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "nan.json"
    bad.write_text(PROFILE.read_text().replace('"memory_bytes": ', '"memory_bytes": NaN, "x": ', 1))
    refused(["solve", "poseidon", str(ROOT / "examples/poseidon/cpu-two-types.yaml"), "--profile", str(bad), "-q",
             "-o", str(tmp_path / "plan.json")], "nan.json", "NaN")


def test_two_names_of_one_gpu_type_are_refused(tmp_path: Path) -> None:
    doc = four()
    doc["job_types"]["resnet50"] = {"V100": 4.0, "V100-16GB": 1.0, "P100": 1.0}
    refused(solve_oef(write(tmp_path, doc), tmp_path / "plan.json"), "V100-16GB", "both name V100")


# ---------------------------------------------------------------- tracebacks instead of messages

@pytest.mark.parametrize("where", ["parent-is-file", "empty", "directory"])
def test_unwritable_output_paths_are_one_line_errors(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("x")
    out = {"parent-is-file": str(tmp_path / "afile" / "plan.json"), "empty": "", "directory": str(tmp_path)}[where]
    needle = {"parent-is-file": "is a file, not a folder", "empty": "expected an output file path",
              "directory": "is a directory"}[where]
    text = refused(["solve", "oef", str(FOUR), "-q", "-o", out], needle)
    assert text.strip().splitlines()[-1].lower().startswith("error: ")
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_is_a_one_line_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    refused(solve_oef(FOUR, ro / "plan.json"), "cannot write")


def test_output_error_is_an_oserror_and_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="is a file, not a folder") as info:
        gio.atomic_write_text(tmp_path / "f" / "x.json", "{}")
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_deeply_nested_input_is_refused(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / f"deep.{fmt}"
    depth = 100_000
    src.write_text(("kind: oef\nx: " if fmt == "yaml" else '{"kind": "oef", "x": ') + "[" * depth + "]" * depth
                   + ("\n" if fmt == "yaml" else "}"))
    refused(solve_oef(src, tmp_path / "plan.json"), f"deep.{fmt}")


def test_kind_given_as_a_list(tmp_path: Path) -> None:
    doc = four()
    doc["kind"] = ["oef"]
    refused(["solve", "oef", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")], "kind")
    plan = tmp_path / "plan.json"
    assert run(solve_oef(FOUR, plan)).exit_code == 0
    pdoc = json.loads(plan.read_text())
    pdoc["kind"] = ["oef"]
    plan.write_text(json.dumps(pdoc))
    refused(["check", str(plan)], "kind")
    refused(["show", str(plan)], "kind")


def test_lagom_calibrate_bad_ranks_and_channels_fail_before_measuring() -> None:
    refused(["lagom-calibrate", "--ranks", "0"], "--ranks")
    refused(["lagom-calibrate", "--channels", "abc"], "--channels", "'abc' is not an integer")
    refused(["lagom-calibrate", "--channels", "1,999"], "--channels")


def test_solve_poseidon_names_a_missing_file() -> None:
    refused(["solve", "poseidon", "missing.yaml"], "missing.yaml: no such file")


# ---------------------------------------------------------------- silently ignored options

def test_unknown_solver_option_is_refused(tmp_path: Path) -> None:
    refused(solve_oef(FOUR, tmp_path / "plan.json", "--option", "no_such_option=1"), "no_such_option",
            "expected one of:", "method")
    assert not (tmp_path / "plan.json").exists()


def test_mistyped_solver_option_is_refused(tmp_path: Path) -> None:
    src = ROOT / "examples/lagom/small.yaml"
    refused(["solve", "lagom", str(src), "-q", "-o", str(tmp_path / "p.json"), "--option", "passes=abc"],
            "passes", "expected a int")


@pytest.mark.parametrize("limit", ["-5", "nan", "inf", "0", "abc"])
def test_bad_time_limits_are_refused(tmp_path: Path, limit: str) -> None:
    refused(solve_oef(FOUR, tmp_path / "plan.json", "--time-limit", limit), "--time-limit")


def test_profile_option_only_where_the_kind_reads_profiles() -> None:
    from gpuplan import registry

    for kind in registry.kinds():
        helptext = run(["solve", kind, "--help"]).output
        assert ("--profile" in helptext) == (registry.model(kind).with_profile is not None), kind
    if registry.model("tessel").with_profile is None:
        refused(["solve", "tessel", str(ROOT / "examples/tessel/hand-2.yaml"), "--profile", str(PROFILE)],
                "No such option")


@pytest.mark.slow
@pytest.mark.parametrize("command,code", [(["false"], 1), (["sh", "-c", "exit 7"], 7), (["true"], 0)])
def test_run_lagom_exits_with_the_commands_exit_code(tmp_path: Path, command: list[str], code: int) -> None:
    plan = tmp_path / "plan.json"
    assert run(["solve", "lagom", str(ROOT / "examples/lagom/small.yaml"), "-q", "-o", str(plan)]).exit_code == 0
    result = run(["run", "lagom", str(plan), "--", *command])
    assert result.exit_code == code, result.output


# ---------------------------------------------------------------- temporary files

def test_stale_own_temporaries_are_removed_fresh_and_foreign_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    old = time.time() - gio.STALE_TMP_S - 60
    stale = tmp_path / ".plan.json.abcd1234.tmp"
    fresh = tmp_path / ".plan.json.wxyz9876.tmp"
    foreign = tmp_path / ".other.json.abcd1234.tmp"
    unrelated = tmp_path / ".plan.json.notmine.tmp.bak"
    for f in (stale, fresh, foreign, unrelated):
        f.write_text("partial")
    for f in (stale, foreign, unrelated):
        os.utime(f, (old, old))
    gio.atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert not stale.exists()
    assert fresh.exists() and foreign.exists() and unrelated.exists()


# ---------------------------------------------------------------- exit codes documented

def test_exit_codes_in_top_level_help_and_docs() -> None:
    helptext = run(["--help"]).output
    for line in ("0  success", "1  the plan has violations", "2  bad input", "3  the problem is infeasible"):
        assert line in helptext
    docs = (ROOT / "docs/index.md").read_text()
    assert "## Exit codes" in docs


def test_every_error_is_one_line(tmp_path: Path) -> None:
    doc = copy.deepcopy(four())
    doc["round_s"] = float("nan")
    out = refused(solve_oef(write(tmp_path, doc), tmp_path / "plan.json"))
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "p.yaml" in lines[0] and "round_s" in lines[0] and "nan" in lines[0] and "expected" in lines[0]


@pytest.mark.parametrize("value,needle", [("method=.nan", "finite"), ("method=[", "not valid YAML"),
                                          ("=1", "KEY=VALUE"), ("method=[1, 2]", "expected a str")])
def test_option_values_are_read_with_document_limits(tmp_path: Path, value: str, needle: str) -> None:
    refused(solve_oef(FOUR, tmp_path / "plan.json", "--option", value), needle)


@pytest.mark.parametrize("seed", ["-1", str(2**70)])
def test_seeds_outside_the_solvers_range_are_refused(tmp_path: Path, seed: str) -> None:
    refused(["solve", "tessel", str(ROOT / "examples/tessel/hand-2.yaml"), "-q", "--seed", seed,
             "-o", str(tmp_path / "plan.json")], "--seed")


def test_a_group_named_like_a_count_field_is_not_a_count(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples/lagom/small.yaml").read_text())
    assert isinstance(doc["groups"]["dp"], dict)  # a group named 'dp' is a mapping, not the dp degree
    out = run(["solve", "lagom", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")])
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("field,value", [("max_microbatches", 65_536), ("max_stages", 4_096)])
def test_poseidon_search_sizes_are_limited(tmp_path: Path, field: str, value: int) -> None:
    doc = yaml.safe_load((ROOT / "examples/poseidon/a100-v100-t4.yaml").read_text())
    doc[field] = value
    refused(["solve", "poseidon", str(write(tmp_path, doc)), "-q", "-o", str(tmp_path / "plan.json")],
            f"field '{field}'", "at most")


def test_poseidon_field_errors_name_the_cluster_file(tmp_path: Path) -> None:
    """`solve poseidon FILE` assembles its problem from the file and the options: a bad field is
    reported as `error: FILE: field ...` like every other kind's, not without the file."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "poseidon" / "h100-a100-small.yaml")
                         .read_text())
    doc["global_batch"] = 0
    path = tmp_path / "zero-batch.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(main, ["solve", "poseidon", str(path), "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 2
    assert f"error: {path}: field 'global_batch': got 0" in r.output
    assert not (tmp_path / "p.json").exists()
