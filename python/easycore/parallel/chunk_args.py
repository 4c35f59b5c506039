"""A map chunk's arguments pickled on their own, apart from the batch that carries them, so
that an argument that cannot be unpickled in its worker fails its own call only (the batch is
shared by every call and future of the pool). Chunks of builtin scalars skip this: they always
unpickle.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from easycore._engine import wire
from easycore.parallel.feed import _TASK


class ChunkArgs:
    """A chunk's arguments pickled on their own (by the pool's codec, out-of-band buffers
    kept out of band): a work item that carries them always unpickles in its worker, where
    :meth:`load` rebuilds them inside the chunk's own error handling, so an item that
    cannot be unpickled fails its own call, not the batch and the stream that every call
    and future of the pool shares."""

    __slots__ = ("parts",)

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            ChunkArgs,
            tuple(p if isinstance(p, bytes) else pickle.PickleBuffer(p) for p in self.parts),
        )

    def load(self, codec: wire.Codec) -> Any:
        """The arguments, rebuilt by ``codec`` (the pool's)."""
        return codec.loads(self.parts)


_SCALARS = frozenset({int, float, bool, type(None), complex})


def _plain_bytes(args: Any, outer: bool = True) -> int:
    """The bytes of a chunk's arguments (a list) if they are builtin scalars, strings and
    bytes, or tuples of them (``starmap``; ``outer`` False: the values of one such tuple):
    they always unpickle, so they need no pickling of their own (a few dozen ns an item,
    where a pickling of its own costs about a microsecond). -1 if they are not. (Strings and
    bytes count their length, scalars nothing: only large arguments matter to the chunk's
    size.)"""
    if outer and type(args) is not list:
        return -1  # e.g. arguments already pickled by cloudpickle (functions._Pickled)
    scalars = _SCALARS
    total = 0
    for a in args:
        t = type(a)
        if t in scalars:
            continue
        if t is bytes or t is str:
            total += len(a)
            continue
        if not outer or t is not tuple:
            return -1
        inner = _plain_bytes(a, False)
        if inner < 0:
            return -1
        total += inner
    return total


def guard_args(
    pack: Callable[[list[Any]], list[Any]],
    codec: wire.Codec,
    sized: Callable[[float], None] | None = None,
) -> Callable[[list[Any]], list[Any]]:
    """``pack`` (the feed's), with each chunk's arguments pickled on their own (:class:`ChunkArgs`)
    unless they are plain builtins (:func:`_plain_bytes`; their ``bytes`` of at least
    ``wire.OUT_OF_BAND_MIN`` travel out of band). Arguments that do not pickle so stay as
    they are (the batch's pickling then finds them:
    see :meth:`easycore.parallel.tasks.PoolExtension.keep_sendable`). ``sized(bytes)`` is
    told the bytes per argument of each chunk (pickled, or the plain ones' length)."""
    dumps = codec.dumps
    said = [0.0]  # the last figure told (a change only: tiny items pass here one by one)

    def guarded(items: list[Any]) -> list[Any]:
        out = pack(items)
        for k, item in enumerate(out):
            if item is None or item[4] == _TASK:
                continue
            args = item[3]
            nbytes = _plain_bytes(args)
            if nbytes < 0:
                try:
                    parts = dumps(args)
                except Exception:  # noqa: BLE001, S112 - sent as it is: see above
                    continue
                out[k] = (item[0], item[1], item[2], ChunkArgs(*parts), item[4])
                nbytes = wire.nbytes(parts)
            elif nbytes >= wire.OUT_OF_BAND_MIN:
                # Large bytes arguments leave the batch's pickle (which would copy them into
                # a fresh allocation of its own) and arrive as bytes (wire.BytesApart).
                apart = wire.bytes_apart(args)
                out[k] = (item[0], item[1], item[2], apart, item[4])
            if sized is not None and type(args) is list and args:
                per = nbytes / len(args)
                if per != said[0]:
                    said[0] = per
                    sized(per)
        return out

    return guarded
