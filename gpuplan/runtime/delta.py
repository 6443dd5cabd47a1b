"""Bit-exact sparse deltas between two sets of tensors (AuroraRL), vectorised with numpy.

Tensors are handled as flat arrays of their raw bit patterns (uint16 for bf16/fp16, uint32 for
fp32, ...), so NaN payloads, -0.0 and subnormals compare and round-trip exactly. Each tensor is
cut into fixed-size chunks of `chunk_elems` elements; a chunk with changed elements becomes one
self-contained *record*: its id (tensor, chunk), the changed positions in the smallest of several
encodings, the new bit patterns (optionally zlib-compressed after a byte shuffle) and two CRC-32s
(of the whole record, and of the base bits at the changed positions). Records can travel on any
stream in any order, be resent, and are applied idempotently (they carry new values, not
differences).

Position encodings (per chunk, smallest chosen; n elements in the chunk, k changed):
  ALL     k == n: no positions at all
  RAW32   4k bytes (little-endian uint32 positions)
  VARINT  gaps between sorted positions as LEB128 varints
  EF      Elias-Fano (bit-packed gap code): L planes of k low bits + (k + n>>L + 1) unary high bits,
          L = floor(log2(n/k)); within ~2 bits per change of the entropy bound n*H(k/n)
  BITMAP  ceil(n/8) bytes, one bit per element (wins when dense)

Container (`.delta` file, version 1):
  b"GPDELTA1", u32 header length, u32 header CRC-32, header JSON (tensors: name, dtype, shape; chunk_elems; steps;
  optional base/new digests), then records, then an END record holding the record count and a
  CRC-32 of all record ids. A truncated file, a flipped bit or a missing record is detected
  before anything is applied.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

MAGIC = b"GPDELTA1"
FORMAT_VERSION = 1
CHUNK_ELEMS = 1 << 19  # 1 MiB of bf16: cache-friendly extraction, fine-grained streaming
MAX_CHUNK_ELEMS = 1 << 28  # decode bound: no record describes more elements than this (`delta encode` caps here)
MAX_HEADER_BYTES = 64 << 20  # decode bound on the header JSON

# index encodings
ALL, RAW32, VARINT, EF, BITMAP = 0, 1, 2, 3, 4
INDEX_NAMES = {ALL: "all", RAW32: "raw32", VARINT: "varint", EF: "elias-fano", BITMAP: "bitmap"}
# value encodings
VRAW, VZLIB = 0, 1

_REC = struct.Struct("<4sIIIIBBBBIIII")  # magic, tensor, chunk, n, k, ienc, venc, width, L, ilen, vlen, crc, base_crc
_REC_MAGIC = b"DCK1"
_END = struct.Struct("<4sII")  # magic, record count, crc32 of record ids
_END_MAGIC = b"DEND"
_HDR = struct.Struct("<8sII")  # magic, JSON length, crc32 of the JSON

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # element width -> unsigned bit type
DTYPE_WIDTH = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "bool": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


class DeltaError(ValueError):
    """A delta that cannot be applied: corrupted, truncated, incomplete or for another base."""


def bits(array: np.ndarray) -> np.ndarray:
    """Return a flat unsigned-integer view of `array`'s raw bit patterns (no copy when contiguous)."""
    a = np.ascontiguousarray(array).reshape(-1)
    return a.view(UINT[a.dtype.itemsize])


# ---------------------------------------------------------------- changed positions

_scratch = threading.local()  # a reusable comparison mask per thread (no page faults per chunk)


def changed_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Return the sorted positions (int64) where the bit patterns of `old` and `new` differ."""
    return changes(old, new)[0]


def changes(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (sorted int64 positions, old bits there, new bits there) where `old` and `new` differ.

    One pass compares 8-byte words into a reused bool mask; only the changed words are then
    compared lane by lane. When few words changed, the mask is searched in two levels (groups of
    8 mask bytes read as one uint64, then the words inside the groups that hold a change), which
    costs far fewer mispredicted branches than one flatnonzero over a sparse mask.
    """
    per = 8 // old.dtype.itemsize
    nwords = old.size // per
    body = nwords * per
    if per == 1 or nwords < 64:
        pos = np.flatnonzero(old != new)
        return pos, old[pos], new[pos]
    ow, nw = old[:body].view(np.uint64), new[:body].view(np.uint64)
    ngroups = (nwords + 7) // 8
    scratch = getattr(_scratch, "mask", None)
    if scratch is None or scratch.size < 8 * ngroups:
        scratch = _scratch.mask = np.empty(8 * max(ngroups, CHUNK_ELEMS // 32), dtype=bool)
    mask = scratch[:8 * ngroups]
    if nwords < mask.size:
        mask[nwords:] = False
    np.not_equal(ow, nw, out=mask[:nwords])
    groups8 = mask.view(np.uint64)
    hit = groups8 != 0
    if np.count_nonzero(hit) <= ngroups // 3:  # sparse: two-level search
        groups = np.flatnonzero(hit)
        inner = np.flatnonzero(groups8[groups].view(bool))
        words = (groups[inner >> 3] << 3) | (inner & 7)
    else:  # dense: flatnonzero's branch-free loop is faster
        words = np.flatnonzero(mask)
    ov, nv = ow[words].view(old.dtype), nw[words].view(old.dtype)
    lanes = np.flatnonzero(ov != nv)
    shift = per.bit_length() - 1
    pos = (words[lanes >> shift] << shift) | (lanes & (per - 1))
    ov, nv = ov[lanes], nv[lanes]  # gathered from the small in-cache copies, not the chunk
    if body < old.size:
        tail = np.flatnonzero(old[body:] != new[body:]) + body
        pos, ov, nv = (np.concatenate([pos, tail]), np.concatenate([ov, old[tail]]),
                       np.concatenate([nv, new[tail]]))
    return pos, ov, nv


# ---------------------------------------------------------------- position codes

def _varint_encode(gaps: np.ndarray) -> bytes:
    g = gaps.astype(np.uint64, copy=False)
    nbytes = np.ones(g.size, dtype=np.int64)
    for t in (7, 14, 21, 28, 35):
        nbytes += g >= (1 << t)
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]) if g.size else 0, dtype=np.uint8)
    for j in range(int(nbytes.max()) if g.size else 0):
        sel = nbytes > j
        byte = (g[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (nbytes[sel] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + j] = (byte | more).astype(np.uint8)
    return out.tobytes()


def _varint_decode(buf: bytes, k: int) -> np.ndarray:
    b = np.frombuffer(buf, dtype=np.uint8)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != k or ends[-1] != b.size - 1:
        raise DeltaError(f"varint positions: expected {k} values, found {ends.size}")
    starts = np.concatenate([[0], ends[:-1] + 1])
    group = np.repeat(np.arange(k), ends - starts + 1)
    shift = (np.arange(b.size) - starts[group]).astype(np.uint64) * np.uint64(7)
    parts = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(parts, starts).astype(np.int64)


def _ef_low_bits(n: int, k: int) -> int:
    return (n // k).bit_length() - 1 if k and n > k else 0  # floor(log2(n/k)) in integers


def _pack(values: np.ndarray, width: int) -> bytes:
    """Pack the low `width` bits of each value as `width` bit planes (most significant first);
    higher bits are ignored."""
    if width == 0 or values.size == 0:
        return b""
    kind = np.uint8 if width <= 8 else np.uint32  # narrow lanes: 4x less memory traffic
    shifts = np.arange(width - 1, -1, -1, dtype=kind)[:, None]
    planes = (values.astype(kind)[None, :] >> shifts) & kind(1)
    return np.packbits(planes.astype(np.uint8, copy=False), axis=1).tobytes()


def _plane_bytes(count: int, width: int) -> int:
    return width * ((count + 7) // 8)


def _unpack(buf: np.ndarray, count: int, width: int) -> np.ndarray:
    """Inverse of _pack: return `count` int64 values of `width` bits each."""
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.int64)
    step = (count + 7) // 8
    planes = np.unpackbits(buf[:width * step].reshape(width, step), axis=1, count=count)
    kind = np.uint8 if width <= 8 else np.uint32
    out = planes[0].astype(kind)
    for plane in planes[1:]:  # most significant first: shift in one bit plane at a time
        out <<= kind(1)
        out |= plane
    return out.astype(np.int64)


def _ef_encode(pos: np.ndarray, n: int, low: int) -> bytes:
    k = pos.size
    lowpart = _pack(pos, low)  # _pack reads only the low `low` bits
    high = pos >> low
    high += np.arange(k)
    hbits = np.zeros(k + (n >> low) + 1, dtype=bool)
    hbits[high] = True
    return lowpart + np.packbits(hbits).tobytes()


def _ef_decode(buf: bytes, n: int, k: int, low: int) -> np.ndarray:
    b = np.frombuffer(buf, dtype=np.uint8)
    nlow = _plane_bytes(k, low)
    nhigh = k + (n >> low) + 1
    if b.size != nlow + (nhigh + 7) // 8:
        raise DeltaError(f"elias-fano positions: {b.size} bytes, expected {nlow + (nhigh + 7) // 8}")
    ones = np.flatnonzero(np.unpackbits(b[nlow:], count=nhigh).view(bool))  # bool: numpy's fast path
    if ones.size != k:
        raise DeltaError(f"elias-fano positions: expected {k} values, found {ones.size}")
    return ((ones - np.arange(k)) << low) | _unpack(b[:nlow], k, low)


def _gaps(pos: np.ndarray) -> np.ndarray:
    g = np.empty_like(pos)
    if pos.size:
        g[0] = pos[0]
        g[1:] = pos[1:] - pos[:-1] - 1
    return g


def index_sizes(pos: np.ndarray, n: int) -> dict[int, int]:
    """Return the byte size of each position encoding for sorted positions `pos` in a chunk of n."""
    k = pos.size
    low = _ef_low_bits(n, k)
    g = _gaps(pos)
    varint = int(k + sum(int(np.count_nonzero(g >= (1 << t))) for t in (7, 14, 21, 28)))
    sizes = {RAW32: 4 * k, VARINT: varint, EF: _plane_bytes(k, low) + (k + (n >> low) + 8) // 8,
             BITMAP: (n + 7) // 8}
    if k == n:
        sizes[ALL] = 0
    return sizes


def _smallest_encoding(pos: np.ndarray, n: int) -> int:
    """Return the encoding index_sizes would pick (smallest size, then lowest id), computing the
    varint size only when its lower bound (one byte per change, two per gap >= 128) can win."""
    k = pos.size
    low = _ef_low_bits(n, k)
    sizes = {RAW32: 4 * k, EF: _plane_bytes(k, low) + (k + (n >> low) + 8) // 8, BITMAP: (n + 7) // 8}
    if k == n:
        sizes[ALL] = 0
    best = min(sizes.values())
    if k and k + int(pos[0] >= 128) + int(np.count_nonzero(np.diff(pos) > 128)) <= best:
        sizes = index_sizes(pos, n)
    return min(sizes, key=lambda e: (sizes[e], e))


def encode_positions(pos: np.ndarray, n: int, encoding: int | None = None) -> tuple[int, int, bytes]:
    """Return (encoding, Elias-Fano low bits, bytes) for sorted positions `pos` in a chunk of n."""
    if encoding is None:
        encoding = _smallest_encoding(pos, n)
    low = _ef_low_bits(n, pos.size) if encoding == EF else 0
    if encoding == ALL:
        data = b""
    elif encoding == RAW32:
        data = pos.astype("<u4").tobytes()
    elif encoding == VARINT:
        data = _varint_encode(_gaps(pos))
    elif encoding == EF:
        data = _ef_encode(pos, n, low)
    elif encoding == BITMAP:
        mask = np.zeros(n, dtype=np.uint8)
        mask[pos] = 1
        data = np.packbits(mask).tobytes()
    else:
        raise ValueError(f"unknown position encoding {encoding}")
    return encoding, low, data


def decode_positions(encoding: int, data: bytes, n: int, k: int, low: int) -> np.ndarray:
    """Return the sorted int64 positions encoded in `data`; raise DeltaError when inconsistent."""
    if encoding == ALL:
        if k != n:
            raise DeltaError(f"'all' positions with {k} of {n} changed")
        return np.arange(n, dtype=np.int64)
    if encoding == RAW32:
        if len(data) != 4 * k:
            raise DeltaError(f"raw32 positions: {len(data)} bytes, expected {4 * k}")
        pos = np.frombuffer(data, dtype="<u4").astype(np.int64)
    elif encoding == VARINT:
        pos = np.cumsum(_varint_decode(data, k) + 1) - 1
    elif encoding == EF:
        pos = _ef_decode(data, n, k, low)
    elif encoding == BITMAP:
        if len(data) != (n + 7) // 8:
            raise DeltaError(f"bitmap positions: {len(data)} bytes, expected {(n + 7) // 8}")
        pos = np.flatnonzero(np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=n).view(bool))
        if pos.size != k:
            raise DeltaError(f"bitmap positions: expected {k} values, found {pos.size}")
    else:
        raise DeltaError(f"unknown position encoding {encoding}")
    if k and (pos[-1] >= n or pos[0] < 0 or (k > 1 and np.any(np.diff(pos) <= 0))):
        raise DeltaError("positions out of range or not increasing")
    return pos


# ---------------------------------------------------------------- values

def _top_byte_pays(top: np.ndarray) -> bool:
    """Return True when the byte entropy of `top` (estimated on a sample) promises a 10% saving."""
    sample = top[::max(1, top.size // 512)]  # ~512 bytes estimate it well enough (the caller
    counts = np.bincount(sample, minlength=256)  # still keeps the zlib plane only when it is smaller)
    collision = float(counts @ counts) / float(sample.size) ** 2
    return -np.log2(collision) < 0.9 * 8  # Renyi-2 entropy <= Shannon entropy: skip only sure losers


def _huffman(data: np.ndarray) -> bytes:
    """Return a zlib stream of `data` coded with Huffman codes only (no match search: fast, and as
    small as LZ77 on float exponent bytes, which hold no repeated strings)."""
    z = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY)
    return z.compress(data) + z.flush()


def _encode_values(values: np.ndarray, compress: bool) -> tuple[int, bytes]:
    """Return (value encoding, bytes): raw little-endian bits, or VZLIB when it pays.

    VZLIB splits the values into byte planes, zlib-compresses the most significant plane (sign and
    exponent bits, the compressible part of float weights) and keeps the other planes raw. A quick
    entropy estimate skips the compressor when it cannot save 10%.
    """
    width = values.dtype.itemsize
    le = values.astype(values.dtype.newbyteorder("<"), copy=False)
    if compress and width > 1 and values.size * width >= 512:
        if width == 2:  # bf16/fp16: the two planes by shifts, no strided copies
            top, rest = (le >> 8).astype(np.uint8), le.astype(np.uint8)
        else:
            planes = le.view(np.uint8).reshape(-1, width)
            top, rest = np.ascontiguousarray(planes[:, -1]), planes[:, :-1].T
        if _top_byte_pays(top):
            packed = _huffman(top)
            if len(packed) < 0.9 * top.size:
                return VZLIB, struct.pack("<I", len(packed)) + packed + rest.tobytes()
    return VRAW, le.tobytes()


def _decode_values(encoding: int, data: bytes, k: int, width: int) -> np.ndarray:
    if encoding == VZLIB:
        if len(data) < 4:
            raise DeltaError("values: truncated zlib plane length")
        (clen,) = struct.unpack_from("<I", data, 0)
        if 4 + clen > len(data):
            raise DeltaError(f"values: zlib plane of {clen} bytes in {len(data) - 4}")
        if width < 2 or len(data) - 4 - clen != k * (width - 1):  # before inflating: k is bounded by the bytes
            raise DeltaError(f"values: {len(data) - 4 - clen} raw plane bytes for {k} values of width {width}")
        inflater = zlib.decompressobj()
        try:  # never inflate past the k bytes the record justifies (a zlib bomb stops here)
            top = inflater.decompress(data[4:4 + clen], k)
        except zlib.error as exc:
            raise DeltaError(f"values: {exc}") from None
        if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            raise DeltaError(f"values: the zlib plane does not inflate to exactly {k} bytes")
        rest = data[4 + clen:]
        if len(top) != k or len(rest) != k * (width - 1):
            raise DeltaError(f"values: planes of {len(top)} and {len(rest)} bytes for {k} values")
        planes = np.empty((width, k), dtype=np.uint8)
        planes[:-1] = np.frombuffer(rest, dtype=np.uint8).reshape(width - 1, k)
        planes[-1] = np.frombuffer(top, dtype=np.uint8)
        data = planes.T.tobytes()
    elif encoding != VRAW:
        raise DeltaError(f"unknown value encoding {encoding}")
    if len(data) != k * width:
        raise DeltaError(f"values: {len(data)} bytes, expected {k * width}")
    return np.frombuffer(data, dtype=np.dtype(UINT[width]).newbyteorder("<"))


# ---------------------------------------------------------------- records

@dataclass(frozen=True)
class Record:
    """One decoded chunk record: where it applies and what to write there."""

    tensor: int
    chunk: int
    n: int
    positions: np.ndarray
    values: np.ndarray
    base_crc: int
    index_encoding: int


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) & 0xFFFFFFFF


def encode_chunk(tensor: int, chunk: int, old: np.ndarray, new: np.ndarray, *, compress: bool = True,
                 index_encoding: int | None = None) -> bytes | None:
    """Return the record for one chunk (flat bit views of equal length), or None when unchanged."""
    pos, old_values, new_values = changes(old, new)
    if pos.size == 0:
        return None
    n, width = old.size, old.dtype.itemsize
    ienc, low, idata = encode_positions(pos, n, index_encoding)
    venc, vdata = _encode_values(new_values, compress)
    fields = (tensor, chunk, n, pos.size, ienc, venc, width, low, len(idata), len(vdata))
    base_crc = _crc(old_values)
    crc = _record_crc(_REC.pack(_REC_MAGIC, *fields, 0, base_crc), idata, vdata)
    return _REC.pack(_REC_MAGIC, *fields, crc, base_crc) + idata + vdata


def _record_crc(head_without_crc: bytes, idata: bytes, vdata: bytes) -> int:
    """CRC-32 over a record's header (with its crc field zero) and payload: every byte is covered."""
    return zlib.crc32(vdata, zlib.crc32(idata, zlib.crc32(head_without_crc))) & 0xFFFFFFFF


def check_record(buf: bytes | memoryview) -> tuple[int, int]:
    """Verify one record's length and checksum without decoding it; return its (tensor, chunk) id.

    Cheap (one CRC pass), so relays can forward a verified record before decoding and applying it.
    Raises DeltaError on a truncated or corrupted record.
    """
    view = memoryview(buf)
    if len(view) < _REC.size:
        raise DeltaError("truncated record header")
    (magic, tensor, chunk, n, k, ienc, venc, width, low, ilen, vlen, crc, base_crc) = _REC.unpack_from(view, 0)
    if magic != _REC_MAGIC or len(view) != _REC.size + ilen + vlen:
        raise DeltaError(f"record (tensor {tensor}, chunk {chunk}) is truncated or not a record")
    head = _REC.pack(_REC_MAGIC, tensor, chunk, n, k, ienc, venc, width, low, ilen, vlen, 0, base_crc)
    if _record_crc(head, view[_REC.size:_REC.size + ilen], view[_REC.size + ilen:]) != crc:
        raise DeltaError(f"checksum mismatch in record (tensor {tensor}, chunk {chunk})")
    return tensor, chunk


def decode_record(buf: bytes | memoryview, offset: int = 0, *,
                  max_elems: Callable[[int, int], int] | None = None) -> tuple[Record, int]:
    """Parse and verify the record at `offset`; return it and the offset after it.

    `max_elems(tensor, chunk)` returns how many elements that chunk may hold (from the header and
    the tensors it applies to; it raises DeltaError for an unknown tensor or chunk); without it the
    bound is MAX_CHUNK_ELEMS. Every allocation is bounded by it or by the record's own bytes.
    Raises DeltaError on a truncated record, a checksum mismatch or inconsistent fields.
    """
    view = memoryview(buf)
    if len(view) - offset < _REC.size:
        raise DeltaError(f"truncated record header at byte {offset}")
    (magic, tensor, chunk, n, k, ienc, venc, width, low, ilen, vlen, crc, base_crc) = \
        _REC.unpack_from(view, offset)
    if magic != _REC_MAGIC:
        raise DeltaError(f"no record at byte {offset} (magic {bytes(magic)!r})")
    start = offset + _REC.size
    end = start + ilen + vlen
    if end > len(view):
        raise DeltaError(f"truncated record (tensor {tensor}, chunk {chunk}): {len(view) - start} of "
                         f"{ilen + vlen} payload bytes")
    idata, vdata = bytes(view[start:start + ilen]), bytes(view[start + ilen:end])
    head = _REC.pack(_REC_MAGIC, tensor, chunk, n, k, ienc, venc, width, low, ilen, vlen, 0, base_crc)
    if _record_crc(head, idata, vdata) != crc:
        raise DeltaError(f"checksum mismatch in record (tensor {tensor}, chunk {chunk})")
    if width not in UINT or k > n:
        raise DeltaError(f"record (tensor {tensor}, chunk {chunk}): bad width {width} or count {k}/{n}")
    bound = max_elems(tensor, chunk) if max_elems is not None else MAX_CHUNK_ELEMS
    if n > bound or low > 32:
        raise DeltaError(f"record (tensor {tensor}, chunk {chunk}): {n} elements (at most {bound} here) "
                         f"or Elias-Fano low bits {low} (at most 32)")
    values = _decode_values(venc, vdata, k, width)  # first: it proves k from the record's own bytes
    pos = decode_positions(ienc, idata, n, k, low)  # so 'all' (k == n) allocates what the bytes justify
    return Record(tensor, chunk, n, pos, values, base_crc, ienc), end


def apply_record(rec: Record, flat: np.ndarray, chunk_elems: int, *, check_base: bool = True) -> None:
    """Write a record's values into `flat` (the tensor's bit view) in place.

    With check_base, the base bits at the changed positions must match the encoder's (else
    DeltaError, nothing written) unless they already hold the new values (a re-applied record).
    """
    start = rec.chunk * chunk_elems
    if rec.values.dtype.itemsize != flat.dtype.itemsize or start + rec.n > flat.size:
        raise DeltaError(f"record (tensor {rec.tensor}, chunk {rec.chunk}) does not fit a tensor of "
                         f"{flat.size} elements of {flat.dtype.itemsize} bytes")
    target = flat[start:start + rec.n]
    if check_base and not base_matches(rec, flat, chunk_elems):
        raise DeltaError(f"record (tensor {rec.tensor}, chunk {rec.chunk}) was made for another base")
    target[rec.positions] = rec.values


def base_matches(rec: Record, flat: np.ndarray, chunk_elems: int) -> bool:
    """Return True when `flat` holds the record's base bits (or already its new bits) at its positions."""
    current = flat[rec.chunk * chunk_elems:rec.chunk * chunk_elems + rec.n][rec.positions]
    return _crc(current) == rec.base_crc or np.array_equal(current, rec.values)


def end_record(ids: Iterable[tuple[int, int]]) -> bytes:
    """Return the END record for the given (tensor, chunk) record ids."""
    ids = list(ids)
    return _END.pack(_END_MAGIC, len(ids), ids_crc(ids))


def ids_crc(ids: Iterable[tuple[int, int]]) -> int:
    """Return an order-independent CRC-32 of a set of (tensor, chunk) ids."""
    arr = np.array(sorted(ids), dtype="<u4").reshape(-1, 2)
    return zlib.crc32(arr.tobytes()) & 0xFFFFFFFF


def parse_end(buf: bytes | memoryview, offset: int = 0) -> tuple[int, int] | None:
    """Return (count, ids_crc) when an END record starts at `offset`, else None."""
    if len(buf) - offset >= 4 and bytes(memoryview(buf)[offset:offset + 4]) == _END_MAGIC:
        if len(buf) - offset < _END.size:
            raise DeltaError("truncated END record")
        _, count, crc = _END.unpack_from(buf, offset)
        return count, crc
    return None


# ---------------------------------------------------------------- whole deltas

@dataclass
class TensorInfo:
    """Name, dtype name (bf16, fp32, ...) and shape of one tensor of a delta."""

    name: str
    dtype: str
    shape: list[int]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)  # Python ints: no overflow on a crafted shape


@dataclass
class DeltaHeader:
    """The container header: tensors, chunk size, steps and optional digests of base and result."""

    tensors: list[TensorInfo]
    chunk_elems: int = CHUNK_ELEMS
    base_step: int = 0
    new_step: int = 1
    base_digest: str = ""
    new_digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Return the magic, length and JSON of this header."""
        doc = {"format": FORMAT_VERSION, "chunk_elems": self.chunk_elems, "base_step": self.base_step,
               "new_step": self.new_step, "base_digest": self.base_digest, "new_digest": self.new_digest,
               "tensors": [[t.name, t.dtype, t.shape] for t in self.tensors], "extra": self.extra}
        text = json.dumps(doc, separators=(",", ":")).encode()
        return _HDR.pack(MAGIC, len(text), zlib.crc32(text) & 0xFFFFFFFF) + text

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> tuple["DeltaHeader", int]:
        """Parse a header; return it and the offset of the first record."""
        if len(buf) < _HDR.size or bytes(memoryview(buf)[:8]) != MAGIC:
            raise DeltaError("not a gpuplan delta file (bad magic)")
        _, length, crc = _HDR.unpack_from(buf, 0)
        if length > MAX_HEADER_BYTES:
            raise DeltaError(f"delta header of {length} bytes (at most {MAX_HEADER_BYTES})")
        text = bytes(memoryview(buf)[_HDR.size:_HDR.size + length])
        if len(text) != length or zlib.crc32(text) & 0xFFFFFFFF != crc:
            raise DeltaError("truncated or corrupted delta header")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise DeltaError("truncated or corrupted delta header") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise DeltaError(f"delta format {got!r}, this gpuplan reads {FORMAT_VERSION}")
        return _header_from_doc(cls, doc), _HDR.size + length


def _header_from_doc(cls: type[DeltaHeader], doc: dict[str, Any]) -> DeltaHeader:
    """Return the header a parsed header JSON describes; raise DeltaError naming the first bad field
    (a crafted header with a valid checksum must not end in KeyError, TypeError or IndexError)."""
    def bad(field_name: str, value: Any, expected: str) -> DeltaError:
        shown = repr(value)
        return DeltaError(f"delta header field {field_name!r}: got {shown[:60]}; expected {expected}")

    def integer(name: str, low: int, high: int) -> int:
        v = doc.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise bad(name, v, f"an integer in [{low}, {high}]")
        return v

    raw = doc.get("tensors")
    if not isinstance(raw, list):
        raise bad("tensors", raw, "a list of [name, dtype, shape]")
    tensors, names = [], set()
    for i, t in enumerate(raw):
        if not (isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and t[1] in DTYPE_WIDTH
                and isinstance(t[2], list) and len(t[2]) <= 32
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in t[2])):
            raise bad(f"tensors[{i}]", t, f"[name, dtype (one of {', '.join(DTYPE_WIDTH)}), shape of "
                      "non-negative integers]")
        if t[0] in names:
            raise bad(f"tensors[{i}]", t[0], "distinct tensor names")
        names.add(t[0])
        tensors.append(TensorInfo(t[0], t[1], list(t[2])))
    digests = [doc.get("base_digest"), doc.get("new_digest")]
    if not all(isinstance(d, str) for d in digests):
        raise bad("base_digest/new_digest", digests, "strings")
    extra = doc.get("extra", {})
    if not isinstance(extra, dict):
        raise bad("extra", extra, "a mapping")
    return cls(tensors, integer("chunk_elems", 1, MAX_CHUNK_ELEMS), integer("base_step", -2**63, 2**63),
               integer("new_step", -2**63, 2**63), digests[0], digests[1], extra)


def chunk_bound(header: DeltaHeader) -> Callable[[int, int], int]:
    """Return max_elems(tensor, chunk) for decode_record: the elements chunk `chunk` of tensor
    `tensor` holds by the header's shapes (raise DeltaError for a tensor or chunk it does not have)."""
    ce = header.chunk_elems
    numels = [t.numel for t in header.tensors]

    def max_elems(tensor: int, chunk: int) -> int:
        if tensor >= len(numels):
            raise DeltaError(f"record for tensor {tensor}, header lists {len(numels)}")
        if chunk * ce >= numels[tensor]:
            raise DeltaError(f"record for chunk {chunk} of tensor {tensor}, which has "
                             f"{-(-numels[tensor] // ce)} chunks of {ce}")
        return min(ce, numels[tensor] - chunk * ce)

    return max_elems


def max_delta_bytes(header: DeltaHeader, *, header_bytes: int = MAX_HEADER_BYTES) -> int:
    """Return the most bytes a delta for `header`'s tensors can need (every element changed, raw
    32-bit positions, one record header per chunk): the bound a reader holds a delta file to."""
    total = header_bytes + _HDR.size + _END.size
    for t in header.tensors:
        chunks = -(-t.numel // header.chunk_elems)
        total += t.numel * (DTYPE_WIDTH[t.dtype] + 4) + chunks * (_REC.size + 4)
    return total


def state_digest(tensors: Mapping[str, np.ndarray]) -> str:
    """Return a blake2b hex digest of the names and raw bits of `tensors` (in name order)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(name.encode() + b"\0")
        h.update(memoryview(bits(tensors[name])).cast("B"))
    return h.hexdigest()


def iter_records(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray], header: DeltaHeader, *,
                 compress: bool = True, index_encoding: int | None = None,
                 threads: int = 1) -> Iterator[tuple[int, int, bytes]]:
    """Yield (tensor, chunk, record bytes) for every changed chunk, in tensor and chunk order.

    With threads == 1 chunks are extracted lazily (chunk k+1 only when the consumer asks), so a
    consumer sending records on other threads overlaps extraction, encoding and sending. With
    threads > 1 up to 2*threads chunks are extracted ahead in a pool (numpy and zlib release the GIL).
    """
    ce = header.chunk_elems
    tasks = []
    for t, info in enumerate(header.tensors):
        o, nw = bits(old[info.name]), bits(new[info.name])
        tasks += [(t, c, o[s:s + ce], nw[s:s + ce]) for c, s in enumerate(range(0, o.size, ce))]

    def run(task: tuple[int, int, np.ndarray, np.ndarray]) -> tuple[int, int, bytes | None]:
        t, c, o, nw = task
        return t, c, encode_chunk(t, c, o, nw, compress=compress, index_encoding=index_encoding)

    if threads <= 1:
        results: Iterable[tuple[int, int, bytes | None]] = map(run, tasks)
        for t, c, rec in results:
            if rec is not None:
                yield t, c, rec
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        ahead: deque = deque()
        for task in tasks:
            ahead.append(pool.submit(run, task))
            if len(ahead) >= 2 * threads:
                t, c, rec = ahead.popleft().result()
                if rec is not None:
                    yield t, c, rec
        while ahead:
            t, c, rec = ahead.popleft().result()
            if rec is not None:
                yield t, c, rec


def make_header(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray], dtypes: Mapping[str, str], *,
                chunk_elems: int = CHUNK_ELEMS, base_step: int = 0, new_step: int = 1,
                digests: bool = False) -> DeltaHeader:
    """Return the header for a delta from `old` to `new` (same names, shapes and dtypes required)."""
    if set(old) != set(new):
        raise DeltaError(f"tensor names differ: only in old {sorted(set(old) - set(new))}, "
                         f"only in new {sorted(set(new) - set(old))}")
    infos = []
    for name in sorted(new):
        if old[name].shape != new[name].shape or old[name].dtype != new[name].dtype:
            raise DeltaError(f"tensor {name!r}: old {old[name].dtype}{list(old[name].shape)} vs new "
                             f"{new[name].dtype}{list(new[name].shape)}")
        infos.append(TensorInfo(name, dtypes[name], list(new[name].shape)))
    return DeltaHeader(infos, chunk_elems, base_step, new_step,
                       state_digest(old) if digests else "", state_digest(new) if digests else "")


def encode(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray], dtypes: Mapping[str, str], *,
           chunk_elems: int = CHUNK_ELEMS, compress: bool = True, digests: bool = True,
           index_encoding: int | None = None, base_step: int = 0, new_step: int = 1,
           threads: int = 1) -> bytes:
    """Return a complete delta container (header, records, END) from `old` to `new`.

    Arrays are numpy arrays of any dtype (bf16 tensors as their uint16 bit views); `dtypes` names
    each tensor's logical dtype for the header.
    """
    header = make_header(old, new, dtypes, chunk_elems=chunk_elems, digests=digests,
                         base_step=base_step, new_step=new_step)
    parts, ids = [header.to_bytes()], []
    for t, c, rec in iter_records(old, new, header, compress=compress, index_encoding=index_encoding,
                                  threads=threads):
        parts.append(rec)
        ids.append((t, c))
    parts.append(end_record(ids))
    return b"".join(parts)


def read(delta: bytes | memoryview) -> tuple[DeltaHeader, list[Record]]:
    """Parse and verify a whole container; return its header and records.

    Raises DeltaError on any truncation, checksum mismatch, missing END or record-set mismatch,
    so nothing of a damaged delta is ever applied.
    """
    header, off = DeltaHeader.from_bytes(delta)
    bound = chunk_bound(header)
    records = []
    while True:
        end = parse_end(delta, off)
        if end is not None:
            break
        if off >= len(delta):
            raise DeltaError("truncated delta: no END record")
        rec, off = decode_record(delta, off, max_elems=bound)
        records.append(rec)
    count, crc = end
    ids = [(r.tensor, r.chunk) for r in records]
    if count != len(records) or crc != ids_crc(ids) or len(set(ids)) != len(ids):
        raise DeltaError(f"delta holds {len(records)} records, END says {count} (or ids differ)")
    if off + _END.size != len(delta):
        raise DeltaError(f"{len(delta) - off - _END.size} unexpected bytes after END")
    for r in records:
        if r.tensor >= len(header.tensors):
            raise DeltaError(f"record for tensor {r.tensor}, header lists {len(header.tensors)}")
    return header, records


def apply(delta: bytes | memoryview, tensors: Mapping[str, np.ndarray], *, verify: bool = True) -> DeltaHeader:
    """Apply a delta container in place to `tensors` (writable numpy arrays); return its header.

    Everything is parsed and verified first; with `verify` the base digest (when recorded) is
    checked before and the new digest after. Raises DeltaError without touching `tensors` when the
    delta is damaged or made for another base.
    """
    header, _ = DeltaHeader.from_bytes(delta)
    for info in header.tensors:  # before any record is decoded: the tensors bound every allocation
        if info.name not in tensors or tensors[info.name].size != info.numel:
            raise DeltaError(f"tensor {info.name!r} missing or not {info.numel} elements")
    header, records = read(delta)
    if verify and header.base_digest and state_digest(tensors) != header.base_digest:
        raise DeltaError("the tensors are not the base this delta was made for (digest differs)")
    views = [bits(tensors[i.name]) for i in header.tensors]
    for info, v in zip(header.tensors, views):
        if v.size and not np.shares_memory(v, tensors[info.name]):
            raise DeltaError(f"tensor {info.name!r} is not contiguous; cannot apply in place")
    if not (verify and header.base_digest):
        for r in records:
            if not base_matches(r, views[r.tensor], header.chunk_elems):
                raise DeltaError(f"record (tensor {r.tensor}, chunk {r.chunk}) was made for another base")
    for r in records:
        apply_record(r, views[r.tensor], header.chunk_elems, check_base=False)
    if verify and header.new_digest and state_digest(tensors) != header.new_digest:
        raise DeltaError("result digest differs from the delta's new digest")
    return header


def stats(delta: bytes | memoryview) -> dict[str, Any]:
    """Return sizes of a delta: total bytes, dense bytes, changed elements and encodings used."""
    header, records = read(delta)
    dense = sum(i.numel * DTYPE_WIDTH.get(i.dtype, 2) for i in header.tensors)
    changed = sum(int(r.positions.size) for r in records)
    used: dict[str, int] = {}
    for r in records:
        used[INDEX_NAMES[r.index_encoding]] = used.get(INDEX_NAMES[r.index_encoding], 0) + 1
    numel = sum(i.numel for i in header.tensors)
    return {"delta_bytes": len(delta), "dense_bytes": dense, "elements": numel, "changed": changed,
            "density": changed / numel if numel else 0.0, "ratio": dense / len(delta),
            "records": len(records), "encodings": used}


def entropy_bound_bytes(n: int, k: int, value_bytes: float) -> float:
    """Return the information-theoretic size (bytes) of k changed positions among n plus raw values."""
    if k in (0, n):
        return k * value_bytes
    p = k / n
    h = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    return n * h / 8 + k * value_bytes
