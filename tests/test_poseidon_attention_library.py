"""Whose fused attention kernel runs (`attention_library`): Transformer Engine's (cuDNN's on Hopper) or PyTorch
SDPA's (FlashAttention-2 on Hopper and the A100). Checked against FlashAttention-2's published H100 figure
(forward + backward, H100 80GB SXM5) times Hopper's sustained over burst rate; then the refusal without flash
attention, the CLI's flag and assumptions line, and the export notes where trainer and plan differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import gpuplan
from gpuplan.cli import main
from gpuplan.errors import InputError
from gpuplan.models.cluster import device_type
from gpuplan.models.poseidon import cost as C
from gpuplan.models.workload import model_config, scaled

HOPPER_SUSTAINED = 708.5 / 841.9  # H200 SXM, mamf-finder: MSMF over MAMF


def _flash(dev: str, seq: int, library: str, causal: bool = True) -> C.OpTime:
    ops = C.layer_ops(scaled(model_config("llama2-7b"), num_layers=2), device_type(dev), "bf16", 1, 2, seq,
                      C.LayerOptions(flash=True, causal=causal, attention_library=library), lambda op, s: 0.0)
    return next(o for o in ops if o.name == "flash attention")


@pytest.mark.parametrize("seq, causal, measured", [(4096, True, 294.0), (8192, True, 308.0), (2048, False, 320.0),
                                                   (1024, False, 294.0)])
def test_sdpa_on_hopper_runs_at_flashattention2s_measured_rate(seq: int, causal: bool, measured: float) -> None:
    cfg = model_config("llama2-7b")  # head dim 128, 32 heads
    flops = 4.0 * 2 * seq * seq * cfg.heads * cfg.dhead * (0.5 if causal else 1.0)
    op = _flash("H100", seq, "sdpa", causal)
    rate = measured * 1e12 * HOPPER_SUSTAINED
    assert op.forward_s + op.backward_s == pytest.approx(3.5 * flops / rate, rel=1e-9)


def test_te_on_hopper_is_cudnns_and_faster_than_sdpa() -> None:
    te, sdpa = _flash("H100", 4096, "te"), _flash("H100", 4096, "sdpa")
    # cuDNN's pair at 4k (FlashAttention-3 paper: forward causal 518, backward 499) over FlashAttention-2's 294
    cudnn_pair = 3.5 / (1 / 518.0 + 2.5 / 499.0)
    ratio = (sdpa.forward_s + sdpa.backward_s) / (te.forward_s + te.backward_s)
    assert ratio == pytest.approx(cudnn_pair / 294.0, rel=1e-9)
    assert 1.6 < ratio < 1.8


@pytest.mark.parametrize("dev", ["A100-80GB", "A100-40GB", "B200", "L40S"])
def test_elsewhere_both_libraries_run_the_same_kernel(dev: str) -> None:
    # the A100: FlashAttention-2 under both; Blackwell and Ada: no measurement, the GEMM rate under both
    te, sdpa = _flash(dev, 4096, "te"), _flash(dev, 4096, "sdpa")
    assert (te.forward_s, te.backward_s) == (sdpa.forward_s, sdpa.backward_s)


def test_the_library_needs_flash_attention() -> None:
    doc = {"kind": "poseidon", "cluster": {"gpus": {"H100": 8}}, "model": "llama2-7b", "global_batch": 8,
           "seq_len": 4096}
    assert gpuplan.load_problem({**doc, "attention_library": "sdpa"}).attention_library == "sdpa"  # type: ignore[union-attr]
    with pytest.raises(InputError, match="attention_library"):
        gpuplan.load_problem({**doc, "attention_library": "sdpa", "flash_attention": False})
    with pytest.raises(InputError, match="attention_library"):
        gpuplan.load_problem({**doc, "attention_library": "flash3"})


def test_sdpa_makes_a_hopper_plan_slower_and_the_cli_says_which(tmp_path: Path) -> None:
    args = ["evaluate", "poseidon", "dgx-h100x2", "llama3-8b", "--batch", "32", "--seq", "8192", "--fsdp",
            "--config", "tp=1,pp=1,dp=16,mb=2,recompute=full", "--json"]
    times = {}
    for library in ("te", "sdpa"):
        r = CliRunner().invoke(main, [*args, "--attention-library", library])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        text = json.dumps(doc)
        assert ("FlashAttention-2" in text) == (library == "sdpa") and ("cuDNN" in text) == (library == "te")
        times[library] = doc["iteration_time_s"]
    assert times["sdpa"] > times["te"]
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["solve", "poseidon", "dgx-h100x2", "llama3-8b", "--batch", "32", "--seq", "8192",
                                  "--attention-library", "sdpa", "--time-limit", "5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["problem"]["attention_library"] == "sdpa"
    assert CliRunner().invoke(main, ["check", str(out)]).exit_code == 0


def test_exports_note_a_trainer_that_runs_the_other_kernel(tmp_path: Path) -> None:
    from gpuplan.compose import compose, write_bundle
    from gpuplan.export import megatron, torchtitan

    def notes(gpu: str, library: str, trainer: str) -> list[str]:
        doc = {"kind": "poseidon", "cluster": {"nodes": [{"name": "h0", "gpus": {gpu: 4}}]}, "model": "llama3-8b",
               "global_batch": 16, "seq_len": 1024, "attention_library": library}
        out = tmp_path / f"{gpu}-{library}-{trainer}"
        write_bundle(out, compose(gpuplan.evaluate_config(doc, "tp=2,pp=1,dp=2,mb=1,recompute=full"), time_limit_s=3))
        if trainer == "torchtitan":
            return torchtitan.export(out, tmp_path / f"tt-{gpu}-{library}")["notes"]
        return megatron.export(out)["notes"]

    def says(found: list[str], words: str) -> bool:
        return any("attention times" in n and words in n for n in found)

    # torchtitan 0.3.0 runs FlexAttention, measured by no source: noted on Hopper, with a warning for a plan
    # made for Transformer Engine's faster kernel
    te, sdpa = notes("H100", "te", "torchtitan"), notes("H100", "sdpa", "torchtitan")
    assert says(te, "FlexAttention") and says(te, "expect attention slower")
    assert says(sdpa, "FlexAttention") and not says(sdpa, "expect attention slower")
    assert not says(notes("A100-80GB", "te", "torchtitan"), "FlexAttention")
    assert says(notes("H100", "sdpa", "megatron"), "cuDNN")
    assert not says(notes("H100", "te", "megatron"), "cuDNN")


def test_the_field_the_cli_and_the_cost_model_name_the_same_libraries() -> None:
    from typing import get_args

    from gpuplan.models.poseidon import PoseidonProblem

    assert get_args(PoseidonProblem.model_fields["attention_library"].annotation) == C.ATTENTION_LIBRARIES
    option = next(p for p in main.commands["solve"].commands["poseidon"].params  # type: ignore[attr-defined]
                  if p.name == "attention_library")
    assert tuple(option.type.choices) == C.ATTENTION_LIBRARIES
