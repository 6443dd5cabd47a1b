"""Delta decoding bounds every allocation by what the header and the OLD checkpoint justify, and a
crafted header or record with valid checksums ends in DeltaError, never KeyError/TypeError/IndexError."""

from __future__ import annotations

import json
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.errors import InputError
from gpuplan.runtime import delta as D


def _header_bytes(doc: object) -> bytes:
    text = json.dumps(doc).encode()
    return D._HDR.pack(D.MAGIC, len(text), zlib.crc32(text) & 0xFFFFFFFF) + text


def _record(tensor: int, chunk: int, n: int, k: int, ienc: int, venc: int, width: int, idata: bytes,
            vdata: bytes, low: int = 0, base_crc: int = 0) -> bytes:
    """A record with a valid checksum, whatever its fields claim."""
    fields = (tensor, chunk, n, k, ienc, venc, width, low, len(idata), len(vdata))
    crc = D._record_crc(D._REC.pack(D._REC_MAGIC, *fields, 0, base_crc), idata, vdata)
    return D._REC.pack(D._REC_MAGIC, *fields, crc, base_crc) + idata + vdata


def _good_doc() -> dict:
    return {"format": 1, "chunk_elems": 64, "base_step": 0, "new_step": 1, "base_digest": "", "new_digest": "",
            "tensors": [["w", "fp32", [8, 8]]], "extra": {}}


@pytest.mark.parametrize("change", [
    {"tensors": None}, {"tensors": [["w", "fp32"]]}, {"tensors": [["w", "nope", [4]]]},
    {"tensors": [["w", "fp32", [-1]]]}, {"tensors": [["w", "fp32", ["8"]]]}, {"tensors": [[1, "fp32", [4]]]},
    {"tensors": [["w", "fp32", [4]], ["w", "fp32", [4]]]}, {"tensors": "w"}, {"chunk_elems": "64"},
    {"chunk_elems": 0}, {"chunk_elems": 2**40}, {"base_step": None}, {"new_digest": 5}, {"extra": []},
    {"format": 2}, {"tensors": [["w", "fp32", [2] * 40]]},
])
def test_crafted_headers_with_valid_checksums_are_delta_errors(change: dict) -> None:
    doc = {**_good_doc(), **change}
    with pytest.raises(D.DeltaError, match="delta header|format"):
        D.DeltaHeader.from_bytes(_header_bytes(doc))


@pytest.mark.parametrize("doc", [[1, 2], "text", 5, None, {"format": 1}])
def test_header_that_is_not_a_mapping_or_lacks_fields(doc: object) -> None:
    with pytest.raises(D.DeltaError):
        D.DeltaHeader.from_bytes(_header_bytes(doc))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                     max_size=6), max_leaves=20),
       field=st.sampled_from(list(_good_doc())))
def test_any_header_value_gives_a_header_or_a_delta_error(doc: object, field: str) -> None:
    try:
        D.DeltaHeader.from_bytes(_header_bytes({**_good_doc(), field: doc}))
    except D.DeltaError:
        pass


def test_header_claiming_2_31_elements_is_refused_before_any_record_is_decoded() -> None:
    n = 2**31
    doc = {**_good_doc(), "chunk_elems": D.MAX_CHUNK_ELEMS, "tensors": [["w", "uint8", [n]]]}
    # an ALL record for the whole chunk: decoding it would allocate 2^28 int64 positions (2 GiB)
    rec = _record(0, 0, D.MAX_CHUNK_ELEMS, D.MAX_CHUNK_ELEMS, D.ALL, D.VRAW, 1, b"", b"")
    blob = _header_bytes(doc) + rec + D.end_record([(0, 0)])
    tensors = {"w": np.zeros(16, dtype=np.uint8)}
    tracemalloc.start()
    with pytest.raises(D.DeltaError, match="missing or not 2147483648 elements"):
        D.apply(blob, tensors)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 2**20


def test_record_larger_than_its_chunk_is_refused_before_decoding() -> None:
    doc = {**_good_doc(), "tensors": [["w", "fp32", [64]]]}
    big = 1 << 27  # the record claims 2^27 elements in a tensor of 64
    rec = _record(0, 0, big, big, D.ALL, D.VRAW, 4, b"", b"")
    tracemalloc.start()
    with pytest.raises(D.DeltaError, match="elements"):
        D.read(_header_bytes(doc) + rec + D.end_record([(0, 0)]))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 2**20


@pytest.mark.parametrize("tensor,chunk,match", [(3, 0, "tensor 3"), (0, 5, "chunk 5")])
def test_record_for_a_tensor_or_chunk_the_header_lacks(tensor: int, chunk: int, match: str) -> None:
    vdata = np.ones(1, dtype="<u4").tobytes()
    rec = _record(tensor, chunk, 64, 1, D.RAW32, D.VRAW, 4, np.zeros(1, dtype="<u4").tobytes(), vdata)
    with pytest.raises(D.DeltaError, match=match):
        D.read(_header_bytes(_good_doc()) + rec + D.end_record([(tensor, chunk)]))


def test_zlib_plane_is_never_inflated_past_its_value_count() -> None:
    k = 8
    plane = zlib.compress(bytes(256 * 2**20), 9)  # 256 MiB of zeros in ~250 KiB
    vdata = len(plane).to_bytes(4, "little") + plane + bytes(k * 3)
    tracemalloc.start()
    with pytest.raises(D.DeltaError, match="zlib plane"):
        D._decode_values(D.VZLIB, vdata, k, 4)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 2**20


def test_zlib_plane_that_is_short_or_has_trailing_bytes() -> None:
    k = 8
    for plane in (zlib.compress(bytes(k - 1)), zlib.compress(bytes(k)) + b"junk"):
        vdata = len(plane).to_bytes(4, "little") + plane + bytes(k * 3)
        with pytest.raises(D.DeltaError):
            D._decode_values(D.VZLIB, vdata, k, 4)
    with pytest.raises(D.DeltaError, match="zlib plane of"):
        D._decode_values(D.VZLIB, (10**6).to_bytes(4, "little") + b"xx", k, 4)


def test_elias_fano_low_bits_beyond_32_are_refused() -> None:
    doc = {**_good_doc(), "tensors": [["w", "fp32", [64]]]}
    rec = _record(0, 0, 64, 1, D.EF, D.VRAW, 4, bytes(40), np.ones(1, dtype="<u4").tobytes(), low=200)
    with pytest.raises(D.DeltaError, match="low bits"):
        D.read(_header_bytes(doc) + rec + D.end_record([(0, 0)]))


def test_roundtrip_still_exact_with_bounds() -> None:
    rng = np.random.default_rng(1)
    old = {"a": rng.integers(0, 2**16, 5000, dtype=np.uint16), "b": rng.integers(0, 2**32, 300, dtype=np.uint32)}
    new = {k: v.copy() for k, v in old.items()}
    new["a"][::13] ^= 0x1234
    new["b"][:50] = 7
    blob = D.encode(old, new, {"a": "bf16", "b": "fp32"}, chunk_elems=256)
    assert len(blob) <= D.max_delta_bytes(D.DeltaHeader.from_bytes(blob)[0])
    target = {k: v.copy() for k, v in old.items()}
    D.apply(blob, target)
    assert all(np.array_equal(target[k], new[k]) for k in new)


def _checkpoint(path: Path, n: int) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(n, dtype=np.float32)}, str(path))


def test_decode_file_refuses_a_delta_larger_than_the_checkpoint_justifies(tmp_path: Path) -> None:
    from gpuplan.runtime.delta_io import decode_file

    _checkpoint(tmp_path / "old.safetensors", 64)
    header = D.DeltaHeader([D.TensorInfo("w", "fp32", [64])], chunk_elems=64).to_bytes()
    (tmp_path / "big.delta").write_bytes(header + bytes(10 * 2**20))
    with pytest.raises(InputError, match="needs at most"):
        decode_file(tmp_path / "old.safetensors", tmp_path / "big.delta")


def test_decode_file_refuses_a_header_that_disagrees_with_the_checkpoint(tmp_path: Path) -> None:
    from gpuplan.runtime.delta_io import decode_file

    _checkpoint(tmp_path / "old.safetensors", 64)
    header = D.DeltaHeader([D.TensorInfo("w", "fp32", [2**31])], chunk_elems=1 << 20).to_bytes()
    (tmp_path / "d.delta").write_bytes(header + D.end_record([]))
    with pytest.raises(InputError, match="2147483648 in the delta"):
        decode_file(tmp_path / "old.safetensors", tmp_path / "d.delta")


@pytest.mark.parametrize("bad", ["/dev/zero", "fifo", "missing"])
def test_decode_file_refuses_non_regular_delta_files(tmp_path: Path, bad: str) -> None:
    import os

    from gpuplan.runtime.delta_io import decode_file

    _checkpoint(tmp_path / "old.safetensors", 64)
    path = Path(bad) if bad.startswith("/") else tmp_path / bad
    if bad == "fifo":
        os.mkfifo(path)
    with pytest.raises(InputError, match="not a regular file|no such file"):
        decode_file(tmp_path / "old.safetensors", path)


def test_without_a_header_a_record_allocates_only_what_its_bytes_justify() -> None:
    """decode_record on its own (as a network receiver calls it): an 'all' record claiming 2^28
    elements with no values behind it is refused before 2^28 positions are allocated."""
    n = D.MAX_CHUNK_ELEMS
    rec = _record(0, 0, n, n, D.ALL, D.VRAW, 8, b"", b"")
    tracemalloc.start()
    with pytest.raises(D.DeltaError, match="values"):
        D.decode_record(rec)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 2**20


def test_zlib_values_of_width_one_or_with_a_short_raw_plane_are_refused_before_inflating() -> None:
    plane = zlib.compress(bytes(2**20))
    with pytest.raises(D.DeltaError, match="raw plane bytes"):
        D._decode_values(D.VZLIB, len(plane).to_bytes(4, "little") + plane, 2**20, 1)
    with pytest.raises(D.DeltaError, match="raw plane bytes"):
        D._decode_values(D.VZLIB, len(plane).to_bytes(4, "little") + plane + bytes(10), 2**20, 2)
