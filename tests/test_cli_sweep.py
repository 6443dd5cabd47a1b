"""Findings of an outside sweep of the `gpuplan` command line, each pinned by a test: a solver that
stops without a plan exits 5, Poseidon's messages name the real cause (time limit, num_stages, the
micro-batch space, a missing --seq), `show` names the file of an unknown kind and exits 3 for --png of
an infeasible plan, one layer-range convention everywhere, psRL forest field paths, and a bad
stragglers CSV trace reported in one line naming the CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuplan import api
from gpuplan.cli import main
from gpuplan.errors import InputError
from gpuplan.render import layer_range

ROOT = Path(__file__).resolve().parents[1]
POSEIDON = ROOT / "examples" / "poseidon" / "h100-a100-small.yaml"


def run(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, res.output


def poseidon_doc(**changes: object) -> dict:
    doc = yaml.safe_load(POSEIDON.read_text())
    doc.update(changes)
    return doc


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


# ---- 1. a solver that stops without a plan: exit code 5, not 2 (bad input)

def test_a_solver_that_stops_without_a_plan_exits_5(tmp_path: Path) -> None:
    from gpuplan.models.workload import model_config, scaled

    # only an uneven mixed plan fits (1 layer on the T4s, 8 on the A100s): no classic configuration does,
    # so a search stopped at once has nothing (tests/test_poseidon_search.py, the same instance)
    cfg = scaled(model_config("llama2-13b"), num_layers=9)
    doc = {"kind": "poseidon", "cluster": {"gpus": {"A100-80GB": 2, "T4": 2}, "gpus_per_node": 2,
                                           "inter_node": {"bandwidth_GBps": "50 Gbps"}},
           "model": cfg.model_dump(), "global_batch": 16, "seq_len": 1024, "max_stages": 4,
           "max_microbatches": 8, "memory_fraction": 0.3}
    src = write(tmp_path / "tight.yaml", api.load_problem(doc, "poseidon").document())
    plan = tmp_path / "p.json"
    code, out = run("solve", "poseidon", src, "--time-limit", "1e-9", "-q", "-o", plan)
    assert code == 5, out
    assert out.startswith("error: ") and "not a proof of infeasibility" in out and not plan.exists()
    code, out = run("--help")
    assert code == 0 and "5  the solver stopped without a plan" in out and "--time-limit" in out
    code, out = run("solve", "poseidon", "--help")
    assert "5  the solver stopped without a plan" in out


def test_solver_error_maps_to_its_own_exit_code() -> None:
    from gpuplan.cli import EXIT_INPUT, EXIT_SOLVER, exit_code
    from gpuplan.errors import GpuplanError, InputError, SolverError

    assert EXIT_SOLVER == 5 and exit_code(SolverError("out of time")) == 5
    assert exit_code(InputError("bad")) == exit_code(GpuplanError("bad")) == EXIT_INPUT == 2
    index = (ROOT / "docs" / "index.md").read_text()
    assert "| 5 | the solver stopped without a plan" in index


# ---- 2. a Poseidon plan cut by the time limit says what was searched and what is not proven

def test_poseidon_time_limit_plan_says_what_was_searched(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.json"
    code, out = run("solve", "poseidon", POSEIDON, "--time-limit", "1e-6", "-q", "-o", plan_file)
    assert code == 0, out
    doc = json.loads(plan_file.read_text())
    assert doc["status"] == "time_limit"
    assert "time limit" in doc["message"] and "not proven optimal" in doc["message"]
    assert "classic seed configurations" in doc["message"] and "--time-limit" in doc["message"]
    assert "message" in out and "not proven optimal" in out


def test_poseidon_time_limit_message_counts_the_structures() -> None:
    from gpuplan.solvers.poseidon import Stats, _time_limit_message

    text = _time_limit_message(Stats(structures=816, pruned=203, evaluated=1, infeasible=70, unvisited=542,
                                     seeds=19), "poseidon")
    assert "816 stage structures: 1 mapped, 203 pruned by the lower bound, 70 infeasible, 542 left unvisited" in text
    assert "not proven optimal" in text
    assert "not proven the best" in _time_limit_message(Stats(structures=5, evaluated=2), "metis")


# ---- 3. Poseidon's infeasibility and input messages name the real cause

def test_num_stages_beyond_the_devices_names_the_option(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.json"
    code, out = run("solve", "poseidon", POSEIDON, "--option", "num_stages=16", "-q", "-o", plan_file)
    assert code == 3, out
    message = json.loads(plan_file.read_text())["message"]
    assert message.startswith("option 'num_stages': got 16; expected a pipeline depth this problem allows")
    assert "8 devices" in message and "GiB" not in message
    # 7 stages cannot be made of 4 + 4 GPUs split evenly per type: the allowed depths are listed
    code, _ = run("solve", "poseidon", POSEIDON, "--option", "num_stages=7", "-q", "-o", plan_file)
    message = json.loads(plan_file.read_text())["message"]
    assert code == 3 and "got 7" in message and "(1, 2, 3, 4, 5, 6, 8)" in message


def test_a_prime_batch_over_max_microbatches_blames_the_microbatch_space(tmp_path: Path) -> None:
    src = write(tmp_path / "prime.yaml", poseidon_doc(global_batch=127, max_microbatches=8))
    plan_file = tmp_path / "p.json"
    code, out = run("solve", "poseidon", src, "-q", "-o", plan_file)
    assert code == 3, out
    message = json.loads(plan_file.read_text())["message"]
    assert "micro-batch space" in message and "global_batch 127" in message and "max_microbatches 8" in message


def test_a_missing_seq_names_the_option_not_the_cluster_file(tmp_path: Path) -> None:
    cluster = ROOT / "examples" / "poseidon" / "cluster-l4-a10.yaml"
    code, out = run("solve", "poseidon", cluster, "llama2-7b", "--batch", "16", "-q", "-o", tmp_path / "p.json")
    assert code == 2, out
    line = out.strip()
    assert line.startswith("error: option --seq: missing; expected the sequence length in tokens (--seq N)")
    assert "field 'seq_len'" not in line and len(line.splitlines()) == 1
    # a whole problem file without seq_len: the file's field is missing, and --seq could give it
    whole = poseidon_doc()
    del whole["seq_len"]
    src = write(tmp_path / "noseq.yaml", whole)
    code, out = run("solve", "poseidon", src, "-q", "-o", tmp_path / "p.json")
    assert code == 2 and f"{src}: field 'seq_len': missing" in out and "--seq N" in out
    assert run("solve", "poseidon", src, "--seq", "2048", "-q", "-o", tmp_path / "p.json")[0] == 0


# ---- 4, 5. show: an unknown kind names the file; --png of an infeasible plan exits 3

def test_show_of_an_unknown_kind_names_the_file(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.json"
    assert run("solve", "poseidon", POSEIDON, "--solver", "megatron", "-q", "-o", plan_file)[0] == 0
    doc = json.loads(plan_file.read_text())
    doc["kind"] = "bogus"
    plan_file.write_text(json.dumps(doc))
    for verb in ("show", "check"):
        code, out = run(verb, plan_file)
        assert code == 2, out
        assert out.startswith(f"error: {plan_file}: field 'kind': got 'bogus'; expected one of ")
        assert "poseidon" in out


def test_show_png_of_an_infeasible_plan_says_there_is_nothing_to_draw(tmp_path: Path) -> None:
    plan_file, png = tmp_path / "p.json", tmp_path / "p.png"
    assert run("solve", "poseidon", POSEIDON, "--option", "num_stages=16", "-q", "-o", plan_file)[0] == 3
    code, out = run("show", plan_file)
    assert code == 0 and "infeasible" in out
    code, out = run("show", plan_file, "--png", png)
    assert code == 3, out
    assert "infeasible" in out and "nothing to draw" in out and "error:" not in out and not png.exists()
    res = CliRunner().invoke(main, ["show", str(plan_file), "--png", str(png), "--json"])
    assert res.exit_code == 3
    doc = json.loads(res.stdout)
    assert doc["status"] == "infeasible" and doc["png"] is None and doc["valid"] is True


# ---- 6. one layer-range convention: half-open [first, last), as docs/poseidon.md writes it

def test_layer_ranges_are_half_open_in_solve_and_show_bundle(tmp_path: Path) -> None:
    from gpuplan.commands.plan import bundle_tables

    assert layer_range(0, 16) == "[0, 16)"
    plan_file = tmp_path / "p.json"
    code, out = run("solve", "poseidon", POSEIDON, "--solver", "megatron", "-q", "-o", plan_file)
    assert code == 0, out
    stages = json.loads(plan_file.read_text())["stages"]
    for s in stages:
        assert layer_range(s["first_layer"], s["last_layer"]) in out
    code, shown = run("show", plan_file)
    assert code == 0 and all(layer_range(s["first_layer"], s["last_layer"]) in shown for s in stages)
    manifest = {"stages": [{"index": 0, "device_type": "H100", "gpu_ids": [0, 1], "tp": 1, "dp": 2,
                            "layers": [0, 16]}], "scales": [1.0], "gains": []}
    assert bundle_tables(manifest)[0].rows[0][5] == "[0, 16)"


# ---- 7. psRL forest errors name the whole field path

def test_psrl_forest_errors_carry_the_forest_prefix(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "psrl" / "small-agent.yaml").read_text()
    src = tmp_path / "p.yaml"
    for old, new, field in (("{id: 11, parent: 10, tokens: 220}", "{id: 11, parent: 99, tokens: 220}",
                             "forest.nodes[4].parent"),
                            ("{node: 11, group: 0, weight: 0.5}", "{node: 77, group: 0, weight: 0.5}",
                             "forest.samples[1].node"),
                            ("{id: 12, parent: 11", "{id: 11, parent: 11", "forest.nodes[5].id")):
        assert old in text
        src.write_text(text.replace(old, new))
        code, out = run("solve", "psrl", src, "-q", "-o", tmp_path / "plan.json")
        assert code == 2, out
        assert out.startswith(f"error: {src}: field '{field}': expected "), out


# ---- 8. a bad stragglers CSV trace: one line naming the CSV, row, column, value and expectation

def test_a_bad_stragglers_csv_is_one_line_naming_the_csv(tmp_path: Path) -> None:
    csv = (ROOT / "examples" / "stragglers" / "small-trace.csv").read_text()
    assert "\njob02,1.531," in csv
    (tmp_path / "t.csv").write_text(csv.replace("\njob02,1.531,", "\njob02,abc,"))
    src = tmp_path / "t.yaml"
    src.write_text((ROOT / "examples" / "stragglers" / "small-trace.yaml").read_text()
                   .replace("small-trace.csv", "t.csv"))
    code, out = run("solve", "stragglers", src, "-q", "-o", tmp_path / "plan.json")
    assert code == 2, out
    assert out.strip() == f"error: {tmp_path / 't.csv'}: field 'row 4 column arrival_s': got 'abc'; expected a number"


def test_plan_train_on_a_cluster_names_the_missing_sizes(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {name: h0, gpus: {H100: 8}}\n")
    out = CliRunner().invoke(main, ["plan", "train", str(cluster), "llama3-8b", "--batch", "8",
                                    "-o", str(tmp_path / "b")])
    assert out.exit_code == 2 and "--seq N" in out.output and "global_batch" not in out.output, out.output
    with pytest.raises(InputError, match="give batch=N") as info:  # it said "field 'seq_len': missing; it is required"
        api.plan_training({"nodes": [{"name": "h0", "gpus": {"H100": 8}}]}, "llama3-8b", seq=1024)
    assert info.value.field == "global_batch"
