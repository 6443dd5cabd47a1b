"""Property tests: random bytes and random mutations of every shipped example, fed to every entry
point, end cleanly: exit code 0, 1, 2, 3 or 5, no traceback, within a few seconds; the subprocess
cases also run under a memory limit (resource.setrlimit) so a blow-up fails instead of swapping."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuplan import registry
from gpuplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
FAST_SOLVER = {"oef": "equal-share", "aurora": "dense-broadcast", "lagom": "nccl-default",
               "poseidon": "megatron", "tessel": "1f1b",
               "psrl": "no-sharing", "omniserve": "sarathi", "stragglers": "fifo", "hetis": "uniform-tp"}
CLEAN_EXITS = {0, 1, 2, 3, 5}  # 5: a solver stopped without a plan in the time limit
SECONDS_PER_CALL = 20.0  # generous: the 2-core CI machine is shared; a hang takes minutes
NASTY: list[Any] = [float("inf"), float("-inf"), float("nan"), 1e308, -1e308, -1, 0, 10**12, 2**63, 1e7,
                    "", "x" * 300, None, True, [], {}, [1, [2, [3]]], {"a": {"b": 1}}, "1e308 TiB", "-5 GB",
                    "nan", "V100", ["oef"], 0.5]

pytestmark = pytest.mark.slow
# GPUPLAN_FUZZ_EXAMPLES raises the count; GPUPLAN_FUZZ_RANDOM=1 explores new cases (CI replays fixed ones)
FUZZ = settings(max_examples=int(os.environ.get("GPUPLAN_FUZZ_EXAMPLES", "60")), deadline=None,
                derandomize=not os.environ.get("GPUPLAN_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


def _kind_of(path: Path, doc: Any) -> str:
    kinds = registry.kinds()
    found = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(found, str) and found in kinds:
        return found
    return path.parent.name if path.parent.name in kinds else "oef"


def invoke(args: list[str]) -> Any:
    """Run the CLI in-process; assert a clean exit (no traceback, a known code) in bounded time."""
    started = time.perf_counter()
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    elapsed = time.perf_counter() - started
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"gpuplan {' '.join(args)} raised {result.exception!r}\n{result.output[-2000:]}")
    assert result.exit_code in CLEAN_EXITS, (args, result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output, (args, result.output[-2000:])
    assert elapsed < SECONDS_PER_CALL, (args, elapsed)
    return result


def _leaf_paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _leaf_paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _leaf_paths(v, path + (i,))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated_example(draw: st.DrawFn) -> tuple[Path, bytes]:
    """An example file and mutated bytes for it: random bytes, byte edits, or a changed field."""
    path = draw(st.sampled_from(EXAMPLES))
    original = path.read_bytes()
    how = draw(st.sampled_from(["bytes", "edit", "field", "field", "scale", "scale", "scale"]))
    if how == "bytes":
        return path, draw(st.binary(max_size=4096))
    if how == "edit":
        data = bytearray(original)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, max(0, len(data) - 1)))
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            if op == "flip" and data:
                data[at] ^= draw(st.integers(1, 255))
            elif op == "insert":
                data[at:at] = draw(st.sampled_from([b"[", b"{", b"&a ", b"*a", b"\x00", b"\xff", b": ", b"-",
                                                    b"\n  ", b"1e999", b".nan"]))
            elif op == "delete":
                del data[at:at + draw(st.integers(1, 40))]
            else:
                del data[at:]
        return path, bytes(data)
    doc = json.loads(original) if path.suffix == ".json" else yaml.safe_load(original)
    paths = _leaf_paths(doc)
    if how == "scale":  # plausible values: numbers scaled, so more inputs reach the solvers
        numeric = [p for p in paths if isinstance(_get(doc, p), (int, float)) and not isinstance(_get(doc, p), bool)]
        for target in draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=3)) if numeric else []:
            value = _get(doc, target) * draw(st.sampled_from([0, 0.001, 0.5, 2, 3, 100]))
            doc = _set(doc, target, round(value) if isinstance(_get(doc, target), int) else value, False)
        text = json.dumps(doc) if path.suffix == ".json" else yaml.safe_dump(doc, allow_unicode=True)
        return path, text.encode("utf-8")
    target = draw(st.sampled_from(paths))
    delete = bool(target) and draw(st.booleans())
    doc = _set(doc, target, draw(st.sampled_from(NASTY)), delete)
    text = (json.dumps(doc) if path.suffix == ".json" else yaml.safe_dump(doc, allow_unicode=True))
    return path, text.encode("utf-8")


@FUZZ
@given(case=mutated_example())
def test_solve_check_show_mutated_examples(tmp_path_factory: pytest.TempPathFactory,
                                           case: tuple[Path, bytes]) -> None:
    example, data = case
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / example.name
    path.write_bytes(data)
    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except Exception:
        doc = None
    if example.name.startswith("trace"):  # an OEF job trace: the simulator reads it
        invoke(["simulate", "oef", str(path), "--policy", "equal-share", "-q"])
        return
    if example.suffix == ".json" and example.parent.name == "profile":  # a profile file
        invoke(["profile", "show", str(path)])
        invoke(["solve", "poseidon", str(ROOT / "examples/poseidon/cpu-two-types.yaml"), "--profile", str(path),
                "--solver", "megatron", "-q", "-o", str(folder / "p.json")])
        return
    kind = _kind_of(example, doc)
    invoke(["compare", kind, str(path), "--solvers", FAST_SOLVER[kind], "-q", "--time-limit", "2",
            "--json", str(folder / "table.json")])
    plan = folder / "plan.json"
    solved = invoke(["solve", kind, str(path), "--solver", FAST_SOLVER[kind], "-q", "--time-limit", "2",
                     "-o", str(plan)])
    why = solved.output.strip()[-90:] if os.environ.get("GPUPLAN_FUZZ_WHY") else ""
    event(f"solve {kind}: exit {solved.exit_code} {why}")
    if solved.exit_code in (2, 5):  # refused input, or a solver that stopped without a plan
        assert solved.output.strip(), f"exit code {solved.exit_code} without a message"
        assert not plan.exists(), "a refused input must write nothing"
    if plan.exists():
        invoke(["check", str(plan)])
        invoke(["show", str(plan)])
        invoke(["check", str(plan), "--input", str(path)])


@pytest.fixture(scope="module")
def solved_plans(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One plan per kind, solved from its first example with the fast solver."""
    folder = tmp_path_factory.mktemp("plans")
    out = []
    for kind, solver in FAST_SOLVER.items():
        example = next(p for p in EXAMPLES if p.parent.name == kind and p.suffix == ".yaml"
                       and isinstance(yaml.safe_load(p.read_text()), dict)
                       and yaml.safe_load(p.read_text()).get("kind") == kind)
        plan = folder / f"{kind}.json"
        result = invoke(["solve", kind, str(example), "--solver", solver, "-q", "-o", str(plan)])
        assert result.exit_code == 0, result.output
        out.append(plan)
    return out


@FUZZ
@given(data=st.data())
def test_check_show_mutated_plans(tmp_path_factory: pytest.TempPathFactory, solved_plans: list[Path],
                                  data: st.DataObject) -> None:
    plan = data.draw(st.sampled_from(solved_plans))
    doc = json.loads(plan.read_text())
    if data.draw(st.booleans()):
        target = data.draw(st.sampled_from(_leaf_paths(doc)))
        delete = bool(target) and data.draw(st.booleans())
        doc = _set(doc, target, data.draw(st.sampled_from(NASTY)), delete)
        text = json.dumps(doc).encode()
    else:
        raw = bytearray(plan.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at:at + data.draw(st.integers(0, 20))] = data.draw(st.binary(max_size=20))
        text = bytes(raw)
    path = tmp_path_factory.mktemp("fuzzplan") / "plan.json"
    path.write_bytes(text)
    invoke(["check", str(path)])
    invoke(["show", str(path)])


@pytest.fixture(scope="module")
def delta_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A small safetensors checkpoint and a delta (bytes) against a changed copy of it."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("delta")
    rng = np.random.default_rng(0)
    old = {"w": rng.standard_normal((64, 48)).astype(np.float32), "b": rng.standard_normal(300).astype(np.float16)}
    new = {k: v.copy() for k, v in old.items()}
    new["w"][3, :20] += 1.0
    new["b"][::7] *= 2
    save_file(old, str(folder / "old.safetensors"))
    save_file(new, str(folder / "new.safetensors"))
    result = invoke(["delta", "encode", str(folder / "old.safetensors"), str(folder / "new.safetensors"),
                     "-o", str(folder / "d.delta"), "--chunk-elems", "64"])
    assert result.exit_code == 0, result.output
    return folder / "old.safetensors", (folder / "d.delta").read_bytes()


@FUZZ
@given(data=st.data())
def test_delta_decode_mutated_deltas(tmp_path_factory: pytest.TempPathFactory, delta_pair: tuple[Path, bytes],
                                     data: st.DataObject) -> None:
    old, blob = delta_pair
    raw = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at:at + data.draw(st.integers(0, 8))] = data.draw(st.binary(max_size=8))
    folder = tmp_path_factory.mktemp("fuzzdelta")
    (folder / "d.delta").write_bytes(bytes(raw))
    result = invoke(["delta", "decode", str(old), str(folder / "d.delta"), "-o", str(folder / "out.safetensors")])
    assert result.exit_code in (0, 2)


# ---------------------------------------------------------------- real subprocesses, memory-limited

MEMORY_LIMIT_BYTES = 3 * 2**30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _gpuplan(args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from gpuplan.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=_limited,
                          cwd=ROOT)


def _alias_bomb() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "kind: oef\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", ["alias-bomb", "dev-zero", "huge-count", "deep"])
def test_subprocess_bad_inputs_end_cleanly_within_memory(tmp_path: Path, case: str) -> None:
    src = tmp_path / "p.yaml"
    if case == "alias-bomb":
        src.write_text(_alias_bomb())
    elif case == "huge-count":
        doc = yaml.safe_load((ROOT / "examples/oef/four-tenants.yaml").read_text())
        doc["cluster"]["gpus"]["V100"] = 1_000_000_000
        src.write_text(yaml.safe_dump(doc))
    elif case == "deep":
        src.write_text("kind: oef\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    target = "/dev/zero" if case == "dev-zero" else str(src)
    started = time.perf_counter()
    done = _gpuplan(["solve", "oef", target, "-q", "-o", str(tmp_path / "plan.json")])
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stderr.startswith("error: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert time.perf_counter() - started < 60
    assert not (tmp_path / "plan.json").exists()


def test_subprocess_zlib_bomb_delta_is_refused_within_memory(tmp_path: Path) -> None:
    """A delta whose header matches the checkpoint and whose zlib plane inflates to 1 GiB: refused,
    under a 3 GiB address-space limit, without inflating it."""
    import zlib

    import numpy as np
    from safetensors.numpy import save_file

    from gpuplan.runtime import delta as D

    n = 1 << 20  # 4 MiB of fp32: the delta file may be a few MiB, its zlib plane inflates to 1 GiB
    old = {"w": np.zeros(n, dtype=np.float32)}
    save_file(old, str(tmp_path / "old.safetensors"))
    header = D.DeltaHeader([D.TensorInfo("w", "fp32", [n])], chunk_elems=n)
    comp = zlib.compressobj(9)
    plane = b"".join(comp.compress(bytes(1 << 24)) for _ in range(64)) + comp.flush()  # 1 GiB of zeros
    k = 16
    pos = np.arange(k, dtype="<u4").tobytes()
    vdata = len(plane).to_bytes(4, "little") + plane + bytes(k * 3)
    fields = (0, 0, n, k, D.RAW32, D.VZLIB, 4, 0, len(pos), len(vdata))
    base_crc = D._crc(np.zeros(k, dtype=np.uint32))
    crc = D._record_crc(D._REC.pack(D._REC_MAGIC, *fields, 0, base_crc), pos, vdata)
    record = D._REC.pack(D._REC_MAGIC, *fields, crc, base_crc) + pos + vdata
    (tmp_path / "bomb.delta").write_bytes(header.to_bytes() + record + D.end_record([(0, 0)]))
    done = _gpuplan(["delta", "decode", str(tmp_path / "old.safetensors"), str(tmp_path / "bomb.delta"),
                     "-o", str(tmp_path / "out.safetensors")])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "zlib plane" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.safetensors").exists()
