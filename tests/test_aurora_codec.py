"""AuroraRL delta codec: bit-exact round trips, every encoding, damaged deltas never applied."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.runtime import delta as D

SPECIALS = {
    np.float32: np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-40, 3.0e38], dtype=np.float32),
    np.float16: np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 6e-8, -6e-5, 65504.0], dtype=np.float16),
}


def _tensor(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """A tensor of `dtype` (bf16 as its uint16 bits) with NaN payloads, +-0, infinities and subnormals."""
    if dtype == "bf16":
        a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        special = np.array([0x7FC0, 0x7F81, 0xFFC1, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x807F], np.uint16)
        a[rng.integers(0, max(n, 1), min(n, 9))] = special[: min(n, 9)]
        return a
    np_type = np.float32 if dtype == "fp32" else np.float16
    a = rng.standard_normal(n).astype(np_type)
    if n:
        a[rng.integers(0, n, min(n, 9))] = rng.choice(SPECIALS[np_type], min(n, 9))
    return a


def _change(rng: np.random.Generator, a: np.ndarray, fraction: float) -> np.ndarray:
    """Return a copy with about `fraction` of elements given new bit patterns (NaN<->NaN, 0<->-0 included)."""
    b = a.copy()
    bits_b = D.bits(b)
    idx = np.flatnonzero(rng.random(a.size) < fraction)
    flips = rng.integers(1, 1 << min(16, 8 * a.itemsize), idx.size).astype(bits_b.dtype)
    bits_b[idx] ^= flips
    if a.size:  # sign-only changes: +0 -> -0, NaN -> NaN with another payload
        j = int(rng.integers(0, a.size))
        bits_b[j] ^= np.array(1 << (8 * a.itemsize - 1), dtype=np.uint64).astype(bits_b.dtype)
    return b


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["fp32", "bf16", "fp16"]), n=st.integers(0, 3000),
       fraction=st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3, 0.9, 1.0]), chunk=st.sampled_from([64, 500, 1024]),
       compress=st.booleans(), seed=st.integers(0, 2**16))
def test_round_trip_is_bit_exact(dtype: str, n: int, fraction: float, chunk: int, compress: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    old = {"a": _tensor(rng, dtype, n), "b": _tensor(rng, dtype, n // 3 + 1)}
    new = {k: _change(rng, v, fraction) for k, v in old.items()}
    blob = D.encode(old, new, {"a": dtype, "b": dtype}, chunk_elems=chunk, compress=compress)
    target = {k: v.copy() for k, v in old.items()}
    D.apply(blob, target)
    for k in old:
        assert D.bits(target[k]).tobytes() == D.bits(new[k]).tobytes()
    assert D.stats(blob)["changed"] == sum(int(np.count_nonzero(D.bits(old[k]) != D.bits(new[k]))) for k in old)


@pytest.mark.parametrize("encoding", [D.RAW32, D.VARINT, D.EF, D.BITMAP])
@pytest.mark.parametrize("fraction", [0.0005, 0.02, 0.5, 1.0])
def test_every_position_encoding_round_trips(encoding: int, fraction: float) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    pos = np.flatnonzero(rng.random(n) < fraction)
    if pos.size == 0:
        pos = np.array([0, n - 1])
    enc, low, data = D.encode_positions(pos, n, encoding)
    assert len(data) == D.index_sizes(pos, n)[encoding]
    assert np.array_equal(D.decode_positions(enc, data, n, pos.size, low), pos)


def test_chosen_encoding_follows_density() -> None:
    rng = np.random.default_rng(1)
    n = 1 << 16
    chosen = {}
    for fraction in (0.001, 0.01, 0.5, 1.0):
        pos = np.flatnonzero(rng.random(n) < fraction)
        chosen[fraction] = D.encode_positions(pos, n)[0]
    assert chosen[0.01] in (D.EF, D.VARINT) and chosen[0.5] == D.BITMAP and chosen[1.0] == D.ALL


def test_size_near_entropy_bound_at_one_percent() -> None:
    rng = np.random.default_rng(3)
    n = 1 << 21
    old = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    new = old.copy()
    idx = rng.choice(n, n // 100, replace=False)
    new[idx] ^= 1
    blob = D.encode({"w": old}, {"w": new}, {"w": "bf16"}, compress=False, digests=False)
    ratio = 2 * n / len(blob)
    bound = 2 * n / D.entropy_bound_bytes(n, idx.size, 2)
    assert ratio >= 55 and ratio >= 0.85 * bound


def _delta(seed: int = 0, n: int = 20000) -> tuple[dict, dict, bytes]:
    rng = np.random.default_rng(seed)
    old = {"w": _tensor(rng, "bf16", n), "v": _tensor(rng, "fp32", n // 2)}
    new = {k: _change(rng, v, 0.05) for k, v in old.items()}
    return old, new, D.encode(old, new, {"w": "bf16", "v": "fp32"}, chunk_elems=1024)


@settings(max_examples=40, deadline=None)
@given(where=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 1000))
def test_corrupted_byte_is_detected_and_nothing_applied(where: float, seed: int) -> None:
    old, _, blob = _delta()
    header_end = 0
    bad = bytearray(blob)
    i = header_end + int(where * (len(blob) - header_end))
    bad[i] ^= 1 + seed % 255
    target = {k: v.copy() for k, v in old.items()}
    with pytest.raises(D.DeltaError):
        D.apply(bytes(bad), target)
    assert all(np.array_equal(D.bits(target[k]), D.bits(old[k])) for k in old)


@settings(max_examples=30, deadline=None)
@given(cut=st.floats(0, 1, exclude_max=True))
def test_truncated_delta_is_detected_and_nothing_applied(cut: float) -> None:
    old, _, blob = _delta(1)
    target = {k: v.copy() for k, v in old.items()}
    with pytest.raises(D.DeltaError):
        D.apply(blob[: int(cut * len(blob))], target)
    assert all(np.array_equal(D.bits(target[k]), D.bits(old[k])) for k in old)


def test_wrong_base_is_refused_without_digests() -> None:
    old, new, _ = _delta(2)
    blob = D.encode(old, new, {"w": "bf16", "v": "fp32"}, chunk_elems=1024, digests=False)
    other = {k: _change(np.random.default_rng(9), v, 0.5) for k, v in old.items()}
    before = {k: v.copy() for k, v in other.items()}
    with pytest.raises(D.DeltaError, match="another base"):
        D.apply(blob, other)
    assert all(np.array_equal(D.bits(other[k]), D.bits(before[k])) for k in other)


def test_records_apply_in_any_order_and_twice() -> None:
    old, new, blob = _delta(3)
    header, records = D.read(blob)
    target = {k: v.copy() for k, v in old.items()}
    views = [D.bits(target[t.name]) for t in header.tensors]
    order = list(records) + list(records[::2])
    np.random.default_rng(0).shuffle(order)
    for r in order:
        D.apply_record(r, views[r.tensor], header.chunk_elems)
    assert all(np.array_equal(D.bits(target[k]), D.bits(new[k])) for k in new)


@settings(max_examples=40, deadline=None)
@given(width=st.sampled_from([1, 2, 4, 8]), n=st.integers(0, 6000), density=st.sampled_from([0.0, 0.002, 0.02, 0.3, 1.0]),
       seed=st.integers(0, 2**16))
def test_changed_positions_match_elementwise_compare(width: int, n: int, density: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kind = D.UINT[width]
    old = rng.integers(0, np.iinfo(kind).max, n, dtype=kind, endpoint=True)
    new = old.copy()
    idx = np.flatnonzero(rng.random(n) < density)
    new[idx] ^= kind(1) << kind(rng.integers(0, 8 * width))
    start = int(rng.integers(0, 3)) if n > 3 else 0  # unaligned views too
    assert np.array_equal(D.changed_positions(old[start:], new[start:]), np.flatnonzero(old[start:] != new[start:]))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 20000), k=st.integers(1, 3000), run=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_fast_encoding_choice_is_the_smallest(n: int, k: int, run: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n, max(1, k // run))
    pos = np.unique(np.clip(starts[:, None] + np.arange(run), 0, n - 1))  # clustered runs: varint can win
    sizes = D.index_sizes(pos, n)
    assert D.encode_positions(pos, n)[0] == min(sizes, key=lambda e: (sizes[e], e))


def test_top_byte_compression_only_where_it_pays() -> None:
    rng = np.random.default_rng(4)
    weights = ((rng.standard_normal(4096, dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
    noise = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)
    for values, expected in ((weights, D.VZLIB), (noise, D.VRAW)):
        enc, data = D._encode_values(values, True)
        assert enc == expected and np.array_equal(D._decode_values(enc, data, values.size, 2), values)
