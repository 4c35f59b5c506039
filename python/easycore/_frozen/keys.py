"""Dict keys: a process-independent hash and the arena's hash table."""

from __future__ import annotations

import struct
import zlib
from array import array
from typing import Any

_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


class NotAKey(Exception):
    pass


_C_STR = zlib.crc32(b"s")
_C_INT = zlib.crc32(b"i")


def _canon(key: Any) -> bytes:
    """A process-independent byte form of a key: equal keys (``1 == 1.0 == True``) give the
    same bytes, keys of different kinds never do."""
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, int):
        return b"i%x" % int(key)
    if isinstance(key, float):
        if key != key:
            raise NotAKey("a NaN key can never be looked up")
        if key.is_integer():
            return b"i%x" % int(key)
        return b"f" + struct.pack("<d", key)
    if isinstance(key, bytes):
        return b"b" + key
    if key is None:
        return b"n"
    if isinstance(key, tuple):
        parts = [b"t%d:" % len(key)]
        for k in key:
            c = _canon(k)
            parts.append(b"%d:" % len(c))
            parts.append(c)
        return b"".join(parts)
    raise NotAKey(f"keys of type {type(key).__name__} are not supported")


def key_crc(key: Any) -> int:
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"), _C_STR)
    if t is int:
        return zlib.crc32(b"%x" % key, _C_INT)
    return zlib.crc32(_canon(key))


def slot_of(crc: int, shift: int) -> int:
    return ((crc * _MIX) & _M64) >> shift


def table_for(keys: list[Any]) -> array[int]:
    """Open addressing, linear probing, load at most 1/2: each slot is
    ``crc32 << 32 | entry + 1`` (0: empty)."""
    if len(keys) >= 0xFFFFFFFF:
        raise ValueError("freeze: a dict of 2**32 - 1 keys or more cannot be frozen")
    bits = max(3, (2 * len(keys) - 1).bit_length())
    slots, shift, mask = 1 << bits, 64 - bits, (1 << bits) - 1
    table = array("Q", bytes(8 * slots))
    for e, key in enumerate(keys):
        try:
            crc = key_crc(key)
        except NotAKey as err:
            raise TypeError(f"freeze: dict key {key!r} cannot be frozen: {err}") from None
        j = slot_of(crc, shift)
        while table[j]:
            j = (j + 1) & mask
        table[j] = (crc << 32) | (e + 1)
    return table
