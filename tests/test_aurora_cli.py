"""`gpuplan delta encode|decode|stats` on safetensors and torch files, and `gpuplan solve aurora`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gpuplan.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "aurora"


def _checkpoints() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    old = {"w": torch.randn(400, 300, generator=g).to(torch.bfloat16), "b": torch.randn(77, generator=g),
           "h": torch.randn(33, generator=g).half()}
    old["w"][0, 0], old["b"][3] = float("nan"), -0.0
    new = {k: v.clone() for k, v in old.items()}
    mask = torch.rand(400, 300, generator=g) < 0.01
    new["w"][mask] = (new["w"][mask].float() * 1.02).to(torch.bfloat16)
    new["b"][3] = 0.0  # -0.0 -> +0.0 changes the bits only
    return old, new


def _same_bits(a: dict, b: dict) -> bool:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
    return a.keys() == b.keys() and all(
        torch.equal(a[k].contiguous().view(width[a[k].element_size()]), b[k].contiguous().view(width[b[k].element_size()]))
        and a[k].dtype == b[k].dtype for k in a)


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_encode_decode_round_trip_files(tmp_path: Path, fmt: str) -> None:
    from safetensors.torch import load_file, save_file

    old, new = _checkpoints()
    save = save_file if fmt == "safetensors" else torch.save
    load = load_file if fmt == "safetensors" else (lambda p: torch.load(p, weights_only=True))
    save(old, str(tmp_path / f"old.{fmt}"))
    save(new, str(tmp_path / f"new.{fmt}"))
    r = CliRunner()
    res = r.invoke(main, ["delta", "encode", str(tmp_path / f"old.{fmt}"), str(tmp_path / f"new.{fmt}"),
                          "-o", str(tmp_path / "d.delta")])
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["delta", "decode", str(tmp_path / f"old.{fmt}"), str(tmp_path / "d.delta"),
                          "-o", str(tmp_path / f"out.{fmt}")])
    assert res.exit_code == 0, res.output
    assert _same_bits(load(str(tmp_path / f"out.{fmt}")), new)
    res = r.invoke(main, ["delta", "stats", str(tmp_path / f"old.{fmt}"), str(tmp_path / f"new.{fmt}")])
    assert res.exit_code == 0 and "entropy" in res.output
    # applying to the wrong base fails clearly and writes nothing
    res = r.invoke(main, ["delta", "decode", str(tmp_path / f"new.{fmt}"), str(tmp_path / "d.delta"),
                          "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "base" in res.output and not (tmp_path / "x").exists()


def test_solve_and_check_through_the_cli(tmp_path: Path) -> None:
    r = CliRunner()
    plan = tmp_path / "plan.json"
    res = r.invoke(main, ["solve", "aurora", str(EXAMPLES / "small-2regions.yaml"), "-o", str(plan)])
    assert res.exit_code == 0, res.output
    assert json.loads(plan.read_text())["kind"] == "aurora"
    res = r.invoke(main, ["check", str(plan)])
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["show", str(plan), "--png", str(tmp_path / "p.png")])
    assert res.exit_code == 0 and (tmp_path / "p.png").stat().st_size > 0
