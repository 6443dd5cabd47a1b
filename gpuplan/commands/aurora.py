"""`gpuplan delta encode|decode|stats`: bit-exact sparse deltas between checkpoint files (AuroraRL).

`gpuplan solve aurora PROBLEM.yaml` and `gpuplan compare aurora PROBLEM.yaml` use the frame's
default one-file input.
"""

from __future__ import annotations

import sys
import time

import click

from gpuplan.cliout import STDOUT, OutputPath, emit_json, json_option, say, table_doc
from gpuplan.errors import GpuplanError


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group("delta")
def delta() -> None:
    """Bit-exact sparse deltas between two checkpoints (safetensors or torch state dicts)."""


@delta.command("encode", params=[json_option()])  # the shared --json [FILE]
@click.argument("old", type=click.Path(dir_okay=False))
@click.argument("new", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=OutputPath(), help="The delta file to write.")
@click.option("--no-compress", is_flag=True, help="Do not zlib-compress the values' top byte plane.")
@click.option("--chunk-elems", type=click.IntRange(64, 1 << 28), default=None,
              help="Elements per chunk record (default 524288).")
def encode_cmd(old: str, new: str, output: str, no_compress: bool, chunk_elems: int | None,
               json_out: str | None = None) -> None:
    """Write the delta that turns checkpoint OLD into checkpoint NEW; --json prints {command, output,
    delta_bytes, dense_bytes, elements, changed, density, ratio, records, encodings, encode_s, import_s}."""
    from gpuplan.io import atomic_write_bytes
    from gpuplan.runtime import delta as D
    from gpuplan.runtime.delta_io import encode_files

    started = time.perf_counter()
    import torch  # noqa: F401  (reading checkpoints needs it; timed apart so the encode time is the encode's)

    import_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        blob = encode_files(old, new, compress=not no_compress, chunk_elems=chunk_elems or D.CHUNK_ELEMS)
        atomic_write_bytes(output, blob)
        s = D.stats(blob)
    except GpuplanError as exc:
        _fail(str(exc))
    encode_s = time.perf_counter() - started
    emit_json("delta encode", {"output": output, **s, "encode_s": encode_s, "import_s": import_s}, json_out)
    say(f"{output}: {s['delta_bytes']:,} bytes, {s['changed']:,} of {s['elements']:,} elements changed "
        f"({100 * s['density']:.3f}%), {s['ratio']:.1f}x smaller than the dense checkpoint, "
        f"{encode_s:.2f} s to read, encode and write (plus {import_s:.2f} s importing torch)", json_out)


@delta.command("decode", params=[json_option()])  # the shared --json [FILE]
@click.argument("old", type=click.Path(dir_okay=False))
@click.argument("delta_file", metavar="DELTA", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=OutputPath(),
              help="The checkpoint to write (same format as OLD).")
def decode_cmd(old: str, delta_file: str, output: str, json_out: str | None = None) -> None:
    """Apply DELTA to checkpoint OLD and write the result, bit-identical to the encoder's NEW; --json prints
    {command, output, tensors, format, digests_verified}."""
    from gpuplan.runtime.delta_io import decode_file, save_checkpoint

    try:
        ckpt = decode_file(old, delta_file)
        save_checkpoint(output, ckpt)
    except GpuplanError as exc:
        _fail(str(exc))
    emit_json("delta decode", {"output": output, "tensors": len(ckpt.arrays), "format": ckpt.format,
                               "digests_verified": True}, json_out)
    say(f"{output}: {len(ckpt.arrays)} tensors written ({ckpt.format}), digests verified", json_out)


@delta.command("stats", params=[json_option()])  # the shared --json [FILE]
@click.argument("old", type=click.Path(dir_okay=False))
@click.argument("new", type=click.Path(dir_okay=False))
def stats_cmd(old: str, new: str, json_out: str | None = None) -> None:
    """Print how many elements changed per tensor and the delta size next to its entropy bound; --json
    prints {command, dense_bytes, delta_bytes, ratio, entropy_bound_bytes, of_bound, encodings, tables}."""
    import numpy as np

    from gpuplan.models.base import Table
    from gpuplan.render import print_tables
    from gpuplan.runtime import delta as D
    from gpuplan.runtime.delta_io import encode_files, load_checkpoint

    try:
        a, b = load_checkpoint(old), load_checkpoint(new)
        blob = encode_files(old, new)
    except GpuplanError as exc:
        _fail(str(exc))
    rows, bound = [], 0.0
    for name in sorted(a.arrays):
        n = a.arrays[name].size
        k = int(np.count_nonzero(D.bits(a.arrays[name]) != D.bits(b.arrays[name])))
        width = a.arrays[name].dtype.itemsize
        bound += D.entropy_bound_bytes(n, k, width)
        rows.append([name, a.dtypes[name], n, k, 100 * k / n if n else 0.0])
    s = D.stats(blob)
    summary = Table("delta size", ["dense_bytes", "delta_bytes", "ratio", "entropy_bound_bytes", "of_bound",
                                   "encodings"],
                    [[s["dense_bytes"], s["delta_bytes"], s["ratio"], bound, bound / s["delta_bytes"],
                      ", ".join(f"{k}: {v}" for k, v in sorted(s["encodings"].items()))]])
    tables = [Table("changed elements per tensor", ["tensor", "dtype", "elements", "changed", "percent"], rows),
              summary]
    emit_json("delta stats", {"dense_bytes": s["dense_bytes"], "delta_bytes": s["delta_bytes"], "ratio": s["ratio"],
                              "entropy_bound_bytes": bound, "of_bound": bound / s["delta_bytes"],
                              "encodings": s["encodings"], "tables": [table_doc(t) for t in tables]}, json_out)
    if json_out != STDOUT:
        print_tables(tables)


def register(main: click.Group) -> None:
    """Add `gpuplan delta` to the CLI."""
    main.add_command(delta)
