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


_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})


def _plain(args: Any) -> bool:
    """Whether a chunk's arguments are builtin scalars, or tuples of them (``starmap``):
    they always unpickle, so they need no pickling of their own (a few dozen ns an item,
    where a pickling of its own costs about a microsecond)."""
    if type(args) is not list:
        return False  # e.g. arguments already pickled by cloudpickle (functions._Pickled)
    plain = _PLAIN
    for a in args:
        t = type(a)
        if t in plain:
            continue
        if t is not tuple or not all(type(x) in plain for x in a):
            return False
    return True


def guard_args(
    pack: Callable[[list[Any]], list[Any]], codec: wire.Codec
) -> Callable[[list[Any]], list[Any]]:
    """``pack`` (the feed's), with each chunk's arguments pickled on their own (:class:`ChunkArgs`)
    unless they are plain builtins (:func:`_plain`). Arguments that do not pickle so stay as
    they are (the batch's pickling then finds them:
    see :meth:`easycore.parallel.tasks.PoolExtension.keep_sendable`)."""
    dumps = codec.dumps

    def guarded(items: list[Any]) -> list[Any]:
        out = pack(items)
        for k, item in enumerate(out):
            if item is not None and item[4] != _TASK and not _plain(item[3]):
                try:
                    out[k] = (item[0], item[1], item[2], ChunkArgs(*dumps(item[3])), item[4])
                except Exception:  # noqa: BLE001, S112 - sent as it is: see above
                    continue
        return out

    return guarded
