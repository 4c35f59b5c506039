"""The codec that pickles what travels between the caller and the producers: numpy arrays of
booleans and numbers travel as their memory (out of band), dtype and shape; every other
array as numpy's own reduction sends it; either way they come back equal."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from easycore._engine.wire import Codec

_PLAIN = {
    "uint8": np.arange(1000, dtype=np.uint8),
    "int64 2-D": np.arange(60, dtype=np.int64).reshape(5, 12),
    "big-endian float64": np.linspace(0, 1, 33).astype(">f8"),
    "float16": np.ones(7, np.float16),
    "complex128": np.array([1 + 2j, 3 - 4j]),
    "bool": np.array([True, False, True]),
    "0-d": np.array(3.5),
    "empty": np.zeros((0, 4), np.float32),
    "1 MiB": np.full(1 << 20, 7, np.uint8),
}
_OTHER = {
    "Fortran order": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "strided": np.arange(20)[::3],
    "structured": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
    "object": np.array([1, "two", None], dtype=object),
    "datetime64": np.array(["2026-01-01", "2026-11-27"], dtype="datetime64[ns]"),
    "bytes": np.array([b"ab", b"cde"]),
    "str": np.array(["x", "yz"]),
}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _arrays_mode(codec: Codec) -> None:
    """The codec pickles its next message with its array reducer (its last had arrays)."""
    codec.dumps([np.zeros(4)])


@pytest.mark.parametrize("name", list(_PLAIN) + list(_OTHER))
@pytest.mark.parametrize("after_arrays", [False, True])
def test_arrays_come_back_equal(name, after_arrays):
    x = {**_PLAIN, **_OTHER}[name]
    codec = Codec()
    if after_arrays:
        _arrays_mode(codec)
    parts = codec.dumps((1, [x], "tail"))
    first, got, tail = codec.loads([parts[0], *(memoryview(bytes(p)) for p in parts[1:])])
    assert first == 1 and tail == "tail" and len(got) == 1
    assert _same(got[0], x), (got[0], x)


@pytest.mark.parametrize("name", list(_PLAIN))
def test_plain_arrays_travel_as_memory_dtype_and_shape(name):
    x = _PLAIN[name]
    codec = Codec()
    _arrays_mode(codec)
    parts = codec.dumps([x])
    assert b"rebuild_array" in parts[0] and b"_frombuffer" not in parts[0]
    if x.nbytes:
        # Out of band (written into shared memory by the queue, not into the pickle).
        assert len(parts) == 2 and memoryview(parts[1]).nbytes == x.nbytes
        assert len(parts[0]) < 200


def test_a_message_without_arrays_is_pickled_as_before_and_the_next_array_travels_too():
    codec = Codec()
    a = np.arange(10.0)
    for msg in ([a], [1, "x"], [a], [2], [3], [a, a]):
        parts = codec.dumps(msg)
        if not any(isinstance(v, np.ndarray) for v in msg):
            assert parts == [pickle.dumps(msg, protocol=5)]
        got = codec.loads(parts)
        assert len(got) == len(msg)
        for g, m in zip(got, msg, strict=True):
            assert _same(g, m) if isinstance(m, np.ndarray) else g == m


def test_a_rebuilt_array_is_read_only_where_its_memory_is():
    codec = Codec()
    _arrays_mode(codec)
    data, raw = codec.dumps(np.arange(8, dtype=np.int32))
    assert not codec.loads([data, bytes(raw)]).flags.writeable
    mine = codec.loads([data, bytearray(raw)])
    assert mine.flags.writeable
    mine[0] = 5  # a view of the buffer it was given
    assert mine[0] == 5
