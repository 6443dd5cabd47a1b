"""Checkpoint files for the delta codec: safetensors or torch state dicts, read and written as raw bits.

Tensors are loaded as numpy arrays of their bit patterns (uint16 for bf16/fp16, uint32 for fp32...)
so the codec compares and writes bits, never float values. torch files are read with
`weights_only=True`; writing uses the format that was read, atomically.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan.errors import InputError
from gpuplan.io import atomic_write_bytes, input_file_size, read_input_bytes
from gpuplan.runtime import delta as D

_TORCH_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "int8",
                "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool",
                "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


@dataclass
class Checkpoint:
    """Tensors as writable bit arrays (with their shapes), their dtype names, and the file format."""

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    format: str  # "safetensors" or "torch"


def _one_line(exc: BaseException) -> str:
    """Return a loader's error as one line of at most 300 characters (torch's run over several lines;
    an empty file's EOFError has no text: its type names it)."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _torch_dtype(name: str) -> Any:
    import torch

    for t, n in _TORCH_NAMES.items():
        if n == name:
            return getattr(torch, t)
    raise InputError(f"unsupported tensor dtype {name!r}")


def _to_bits(tensor: Any) -> np.ndarray:
    """Return a writable numpy array holding the tensor's raw bits with the tensor's shape."""
    import torch

    t = tensor.detach().to("cpu").contiguous()
    width = t.element_size()
    flat = t.reshape(-1).view(torch.uint8).numpy().copy()
    return flat.view(D.UINT[width]).reshape(tuple(t.shape))


def _from_bits(array: np.ndarray, dtype: str) -> Any:
    import torch

    raw = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy())
    return raw.view(_torch_dtype(dtype)).reshape(array.shape)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Return the tensors of a safetensors file or a torch state-dict file (loaded with weights_only=True).

    Raises InputError naming the file when it is missing, not a checkpoint, or holds a non-tensor.
    """
    import torch

    p = Path(path)
    input_file_size(p, what="checkpoint file")  # a regular file (not a FIFO or device), or InputError
    with p.open("rb") as fh:
        head = fh.read(8)
    tensors: dict[str, Any]
    if p.suffix == ".safetensors" or (len(head) == 8 and int.from_bytes(head, "little") < 100_000_000
                                      and not head.startswith(b"PK")):
        from safetensors.torch import load_file

        try:
            tensors, fmt = load_file(str(p)), "safetensors"
        except Exception as exc:  # safetensors raises its own error types
            raise InputError(f"{p}: not a readable safetensors file: {_one_line(exc)}", file=str(p)) from None
    else:
        try:
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise InputError(f"{p}: not a torch state dict readable with weights_only=True: {_one_line(exc)}",
                             file=str(p)) from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise InputError(f"{p}: expected a flat mapping of names to tensors (a state dict)", file=str(p))
        tensors, fmt = obj, "torch"
    arrays, dtypes = {}, {}
    for name, t in tensors.items():
        dname = _TORCH_NAMES.get(str(t.dtype).removeprefix("torch."))
        if dname is None:
            raise InputError(f"{p}: tensor {name!r} has unsupported dtype {t.dtype}", file=str(p))
        arrays[name], dtypes[name] = _to_bits(t), dname
    return Checkpoint(arrays, dtypes, fmt)


def save_checkpoint(path: str | Path, ckpt: Checkpoint) -> Path:
    """Write a checkpoint atomically in its format (safetensors or torch); return the path."""
    import torch

    tensors = {n: _from_bits(a, ckpt.dtypes[n]) for n, a in ckpt.arrays.items()}
    if ckpt.format == "safetensors":
        from safetensors.torch import save

        data = save(tensors)
    else:
        buf = io.BytesIO()
        torch.save(tensors, buf)
        data = buf.getvalue()
    return atomic_write_bytes(path, data)


def encode_files(old: str | Path, new: str | Path, *, compress: bool = True,
                 chunk_elems: int = D.CHUNK_ELEMS) -> bytes:
    """Return the delta container from checkpoint `old` to checkpoint `new` (with base/new digests)."""
    a, b = load_checkpoint(old), load_checkpoint(new)
    if a.dtypes != b.dtypes:
        diff = sorted(n for n in set(a.dtypes) | set(b.dtypes) if a.dtypes.get(n) != b.dtypes.get(n))
        raise InputError(f"{new}: tensors {diff[:5]} differ in name or dtype from {old}", file=str(new))
    try:
        return D.encode(a.arrays, b.arrays, a.dtypes, chunk_elems=chunk_elems, compress=compress,
                        digests=True)
    except D.DeltaError as exc:
        raise InputError(f"{new}: {exc}", file=str(new)) from None


def _read_delta(delta_path: str | Path, ckpt: Checkpoint, old: str | Path) -> bytes:
    """Return the bytes of a delta file for checkpoint `ckpt`, read only after its header matches
    the checkpoint (names, dtypes, element counts) and its size is within what those tensors can
    need (D.max_delta_bytes); raise DeltaError or InputError otherwise, before reading the rest."""
    import struct

    size = input_file_size(delta_path, what="delta file")
    with open(delta_path, "rb") as fh:
        prefix = fh.read(16)
        if len(prefix) < 16 or prefix[:8] != D.MAGIC:
            raise D.DeltaError("not a gpuplan delta file (bad magic)")
        (length,) = struct.unpack_from("<I", prefix, 8)
        if length > min(D.MAX_HEADER_BYTES, size - 16):
            raise D.DeltaError(f"delta header of {length} bytes in a file of {size}")
        header, _ = D.DeltaHeader.from_bytes(prefix + fh.read(length))
    for info in header.tensors:
        if ckpt.dtypes.get(info.name) != info.dtype:
            raise D.DeltaError(f"tensor {info.name!r} is {ckpt.dtypes.get(info.name)} in {old}, "
                               f"{info.dtype} in the delta")
        if ckpt.arrays[info.name].size != info.numel:
            raise D.DeltaError(f"tensor {info.name!r} has {ckpt.arrays[info.name].size} elements in {old}, "
                               f"{info.numel} in the delta")
    limit = D.max_delta_bytes(header, header_bytes=length)
    if size > limit:
        raise D.DeltaError(f"{size:,} bytes; a delta for these tensors needs at most {limit:,}")
    return read_input_bytes(delta_path, limit_bytes=limit, what="delta file")


def decode_file(old: str | Path, delta_path: str | Path) -> Checkpoint:
    """Return checkpoint `old` with the delta file applied (bit-exact, verified by digests)."""
    ckpt = load_checkpoint(old)
    try:
        blob = _read_delta(delta_path, ckpt, old)
        D.apply(blob, ckpt.arrays)
    except D.DeltaError as exc:
        raise InputError(f"{delta_path}: {exc}", file=str(delta_path)) from None
    return ckpt
