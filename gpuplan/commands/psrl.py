"""`gpuplan psrl trace|stats|exactness`: psRL rollout traces and the shared-prefix exactness check.

`gpuplan solve psrl PROBLEM.yaml` and `gpuplan compare psrl PROBLEM.yaml` use the frame's default
one-file input.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuplan.cliout import STDOUT, OutputPath, emit_json, json_option, say
from gpuplan.errors import GpuplanError


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group("psrl")
def psrl() -> None:
    """psRL: rollout traces (generate, inspect) and the shared-prefix training exactness check."""


@psrl.command("trace", params=[json_option()])
@click.option("--shape", type=click.Choice(["stepwise", "tree"]), default="stepwise", show_default=True,
              help="Step-wise multi-turn rollouts (one sample per turn) or tree rollouts (one per leaf).")
@click.option("--tasks", type=click.IntRange(1, 4096), default=8, show_default=True)
@click.option("--rollouts", type=click.IntRange(1, 256), default=4, show_default=True, help="Rollouts per task.")
@click.option("--turns", default="5-20", show_default=True, help="Turns per rollout, MIN-MAX (step-wise).")
@click.option("--system-tokens", type=click.IntRange(0, 65536), default=0, show_default=True,
              help="A system prompt shared by every task.")
@click.option("--prompt-tokens", default="1000-4000", show_default=True, help="Task prompt tokens, MIN-MAX.")
@click.option("--turn-tokens", default="200-500", show_default=True, help="Tokens per turn or tree segment, MIN-MAX.")
@click.option("--branching", default="2-4", show_default=True, help="Children per tree node, MIN-MAX (tree).")
@click.option("--depth", type=click.IntRange(1, 8), default=3, show_default=True, help="Tree levels (tree).")
@click.option("--seed", type=click.IntRange(0, 2**31), default=0, show_default=True)
@click.option("--workers", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Workers of the problem written with -o.")
@click.option("--gpu", default="H100", show_default=True, help="Their catalog GPU type.")
@click.option("--model", default="qwen3-8b", show_default=True, help="The policy model (catalog name).")
@click.option("-o", "--output", type=OutputPath(), default=None,
              help="Write a psrl problem with the trace inline (.yaml or .json).")
@click.option("--jsonl", type=OutputPath(), default=None,
              help="Write the trace as parent-linked JSONL records (a problem's `trace:` reads it back).")
def trace_cmd(shape: str, tasks: int, rollouts: int, turns: str, system_tokens: int, prompt_tokens: str,
              turn_tokens: str, branching: str, depth: int, seed: int, workers: int, gpu: str, model: str,
              output: str | None, jsonl: str | None, json_out: str | None = None) -> None:
    """Generate a seeded synthetic rollout trace; print its raw and deduplicated tokens; --json prints
    {command, samples, nodes, raw_tokens, dedup_tokens, dedup_ratio, output, jsonl}."""
    from gpuplan.api import load_problem
    from gpuplan.models.psrl.forest import token_counts
    from gpuplan.models.psrl.traces import write_links

    def pair(text: str, name: str) -> tuple[int, int]:
        try:
            lo, _, hi = text.partition("-")
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise click.BadParameter(f"{text!r}; expected MIN-MAX such as 200-500", param_hint=name) from None
        return a, b

    t0, t1 = pair(turns, "--turns")
    p0, p1 = pair(prompt_tokens, "--prompt-tokens")
    s0, s1 = pair(turn_tokens, "--turn-tokens")
    b0, b1 = pair(branching, "--branching")
    gen = {"shape": shape, "tasks": tasks, "rollouts": rollouts, "turns_min": t0, "turns_max": t1,
           "system_tokens": system_tokens, "prompt_tokens_min": p0, "prompt_tokens_max": p1,
           "turn_tokens_min": s0, "turn_tokens_max": s1, "branching_min": b0, "branching_max": b1, "depth": depth,
           "seed": seed}
    doc: dict[str, Any] = {"kind": "psrl", "name": f"{shape}-{tasks}x{rollouts}-seed{seed}", "model": model,
                           "workers": [{"name": "gpu", "gpu": gpu, "count": workers}], "generate": gen}
    try:
        prob = load_problem(doc, "psrl")
        f = prob.built
        raw, dedup = token_counts(f)
        if output:
            from gpuplan.io import atomic_write_text

            inline = dict(doc)
            del inline["generate"]
            inline["forest"] = {
                "nodes": [{"id": f.ids[v], "parent": f.ids[f.parent[v]] if f.parent[v] >= 0 else -1,
                           "tokens": f.tokens[v]} for v in range(f.n_nodes)],
                "samples": [{"node": f.ids[e], "group": g, "weight": w} for e, g, w in zip(f.end, f.group, f.weight)]}
            if output.endswith(".json"):
                import json

                atomic_write_text(output, json.dumps(inline) + "\n")
            else:
                import yaml

                atomic_write_text(output, yaml.safe_dump(inline, sort_keys=False, default_flow_style=None, width=120))
        if jsonl:
            write_links(f, jsonl)
    except GpuplanError as exc:
        _fail(str(exc))
    emit_json("psrl trace", {"samples": f.n_samples, "nodes": f.n_nodes, "raw_tokens": raw, "dedup_tokens": dedup,
                             "dedup_ratio": raw / dedup, "output": output, "jsonl": jsonl}, json_out)
    say(f"{f.n_samples:,} samples, {f.n_nodes:,} nodes: {raw:,} raw tokens, {dedup:,} deduplicated "
        f"({raw / dedup:.2f}x)" + (f"; problem written to {output}" if output else "")
        + (f"; JSONL written to {jsonl}" if jsonl else ""), json_out)


@psrl.command("stats", params=[json_option()])
@click.argument("input", type=click.Path(dir_okay=False))
def stats_cmd(input: str, json_out: str | None = None) -> None:
    """Print a psrl problem's batch figures: samples, nodes, raw and deduplicated tokens, the deepest
    path; --json prints {command, samples, nodes, raw_tokens, dedup_tokens, dedup_ratio, longest_sample_tokens}."""
    from gpuplan.api import load_problem
    from gpuplan.models.psrl.forest import token_counts

    try:
        prob = load_problem(input, "psrl")
    except GpuplanError as exc:
        _fail(str(exc))
    f = prob.built
    raw, dedup = token_counts(f)
    longest = max(f.sample_tokens(s) for s in range(f.n_samples))
    emit_json("psrl stats", {"samples": f.n_samples, "nodes": f.n_nodes, "raw_tokens": raw, "dedup_tokens": dedup,
                             "dedup_ratio": raw / dedup, "longest_sample_tokens": longest}, json_out)
    say(f"{input}: {f.n_samples:,} samples, {f.n_nodes:,} nodes, {raw:,} raw tokens, {dedup:,} deduplicated "
        f"({raw / dedup:.2f}x), longest sample {longest:,} tokens", json_out)


@psrl.command("exactness", params=[json_option()])
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("--max-tokens", type=click.IntRange(16, 1 << 16), default=1024, show_default=True,
              help="Scale segment lengths so the deduplicated tokens are at most this.")
@click.option("--layers", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(16, 1024), default=64, show_default=True)
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True, help="torch threads.")
def exactness_cmd(input: str, max_tokens: int, layers: int, hidden: int, threads: int,
                  json_out: str | None = None) -> None:
    """Train one step of a small transformer on INPUT's forest, unshared and with shared prefixes; print the
    gradient difference and both times next to the cost model's speedup; --json prints {command,
    max_rel_grad_error, unshared_s, shared_s, measured_speedup, predicted_speedup, token_scale}."""
    from gpuplan.api import load_problem

    try:
        prob = load_problem(input, "psrl")
    except GpuplanError as exc:
        _fail(str(exc))
    from gpuplan.extras import MissingExtra, require

    try:
        require("torch")
    except MissingExtra as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(4)
    import torch

    from gpuplan.runtime import psrl as R

    torch.set_num_threads(threads)
    if hidden % 4:
        _fail(f"--hidden {hidden}: expected a multiple of 4 (4 heads)")
    cfg = R.tiny_config(layers, hidden)
    forest, scale = R.tiny_forest(prob, max_tokens, cfg.vocab)
    out = R.compare_step(forest, cfg)
    out["predicted_speedup"] = R.predicted_speedup(forest, cfg)
    out["token_scale"] = scale
    emit_json("psrl exactness", out, json_out)
    if json_out != STDOUT:
        click.echo(f"gradients: max |shared - unshared| / max |g| = {out['max_rel_grad_error']:.2e}")
        click.echo(f"unshared {out['unshared_s']:.3f} s, shared {out['shared_s']:.3f} s: measured speedup "
                   f"{out['measured_speedup']:.2f}x, cost model {out['predicted_speedup']:.2f}x "
                   f"(segments scaled x{scale:.3g})")


def register(main: click.Group) -> None:
    """Add `gpuplan psrl` to the CLI."""
    main.add_command(psrl)
