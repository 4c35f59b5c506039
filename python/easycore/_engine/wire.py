"""What travels between the caller and the producers: message kinds and the codec.

Every message on the Rust queues is ``(seq, kind, parts)``:

* ``seq`` is the *batch number* within one call (0, 1, 2, …); a batch carries consecutive
  items, and its payload says the index of its first item.
* ``kind`` packs the message type (low 8 bits) and the call number (the rest), so results of
  an aborted call are recognised and dropped by the next one.
* ``parts`` is a pickle (protocol 5) followed by its out-of-band buffers (numpy arrays, CPU
  tensors in the torch flavour), which the queue writes straight into shared memory.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from collections.abc import Iterable, Sequence
from typing import Any

# Caller -> producer
WORK = 1  #: payload: (first_item_index, [items])
STOP = 2  #: run producer_end and exit
# Producer -> caller
RESULT = 3  #: payload: (first_item_index, [results], worker_index, busy_s, wait_s)
ERROR = 4  #: payload: dict(hook=, device=, item=, message=, traceback=, kind=)
READY = 5  #: no payload: producer_init returned
BYE = 6  #: payload: (the error dict of producer_end or None, its return value)
# 7: retired (an end-of-call marker); never reuse the number
WAKE = 8  #: the caller's input reader -> its own receiving thread: new input is waiting
RETIRE = 9  #: payload: (as BYE's, the producer's pid): it ran its ``max_tasks`` and leaves


def pack_kind(msg_type: int, call: int) -> int:
    """Packs a message type and a call number into the queue's 32-bit kind tag."""
    return ((call & 0xFFFFFF) << 8) | msg_type


def unpack_kind(kind: int) -> tuple[int, int]:
    """Inverse of :func:`pack_kind`: ``(msg_type, call)``."""
    return kind & 0xFF, kind >> 8


class Codec:
    """Pickles objects into queue parts and back, with protocol-5 out-of-band buffers.

    Plain numpy arrays travel as their memory, dtype and shape (:func:`reduce_array`), which
    costs half what numpy's own reduction does on each side. Pickling them so takes a pickler
    object per message, which a message without arrays need not pay: a message is pickled
    with it if the codec's last message had out-of-band buffers, else by ``pickle.dumps``
    (an array in a message after one without travels by numpy's reduction, out of band too).

    Subclasses change how particular types travel (see the torch flavour, which sends CPU
    tensors' memory out of band).
    """

    # Whether the last message this codec pickled had out-of-band buffers. Written by every
    # thread that pickles with the codec, unguarded: it only picks one of two encodings that
    # load alike.
    _arrays = False

    def dumps(self, obj: Any) -> list[Any]:
        """Returns ``[pickle_bytes, *raw_buffers]`` for ``obj``.

        Raises:
            pickle.PicklingError, TypeError, AttributeError: if ``obj`` cannot be pickled.
        """
        buffers: list[pickle.PickleBuffer] = []
        data = self._dumps(obj, buffers.append)
        if not buffers:
            if self._arrays:
                self._arrays = False
            return [data]
        if not self._arrays:
            self._arrays = True
        return [data, *(b.raw() for b in buffers)]

    def _dumps(self, obj: Any, callback: Any) -> bytes:
        if self._arrays:
            pickler = _PICKLER[0] or _array_pickler()
            if pickler is not None:
                return dumps_with(pickler, obj, callback)
        return pickle.dumps(obj, protocol=5, buffer_callback=callback)

    def loads(self, parts: Sequence[Any]) -> Any:
        """Rebuilds the object from the parts made by :meth:`dumps`."""
        if len(parts) == 1:
            return pickle.loads(parts[0])
        return pickle.loads(parts[0], buffers=parts[1:])


# The pickler of messages with arrays (None until numpy is imported: no array before).
_PICKLER: list[type[pickle.Pickler] | None] = [None]
# The dtype kinds whose arrays travel as memory, dtype string and shape: booleans and numbers
# (their dtype string says all, and numpy exports their buffers).
_PLAIN_KINDS = frozenset("biufc")


def _array_pickler() -> type[pickle.Pickler] | None:
    """The pickler class whose dispatch table sends plain arrays by :func:`reduce_array`, made
    once numpy is imported (None before)."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    table = copyreg.dispatch_table.copy()
    table[np.ndarray] = reduce_array
    pickler = type("ArrayPickler", (pickle.Pickler,), {"dispatch_table": table})
    _PICKLER[0] = pickler
    return pickler


def dumps_with(pickler: type[pickle.Pickler], obj: Any, callback: Any) -> bytes:
    """``obj`` pickled (protocol 5, out-of-band buffers to ``callback``) by a pickler class
    whose class attribute ``dispatch_table`` says how its types travel."""
    f = io.BytesIO()
    pickler(f, protocol=5, buffer_callback=callback).dump(obj)
    return f.getvalue()


def reduce_array(a: Any) -> Any:
    """A dispatch-table reduction of a numpy array: a C-contiguous array of booleans or
    numbers (no dtype metadata) as its memory (out of band with protocol 5), dtype string and
    shape, rebuilt by :func:`rebuild_array`; any other by numpy's own reduction."""
    dt = a.dtype
    if dt.kind in _PLAIN_KINDS and a.flags.c_contiguous and dt.metadata is None:
        return rebuild_array, (pickle.PickleBuffer(a), dt.str, a.shape)
    return a.__reduce_ex__(5)


def rebuild_array(buf: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """The array :func:`reduce_array` sent: a view of ``buf`` (read-only if it is), as numpy's
    own reduction rebuilds it."""
    import numpy as np

    return np.ndarray(shape, dtype, buf)


# Buffers and ``bytes`` items at least this large travel out of band where the caller
# chooses (:func:`bytes_apart`, a pool task's arguments): copied once into the message's
# segment, not first into the pickle (a fresh allocation, its pages faulted in).
OUT_OF_BAND_MIN = 64 << 10


class BytesApart:
    """A large ``bytes`` object to pickle out of band: pickle copies a ``bytes`` object into
    the pickle itself (its C fast path asks no reducer), a fresh allocation as large as the
    batch, whose pages a thread's heap may map and fault in anew for every batch (1 MiB
    items from a runner's input thread: 2 GB/s). Out of band, the queue copies it once into
    the message's segment; it unpickles to ``bytes`` again (copied out of the segment)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (pickle.PickleBuffer(self.data),))


def bytes_apart(items: Iterable[Any]) -> list[Any]:
    """``items`` with each ``bytes`` item of at least :data:`OUT_OF_BAND_MIN` bytes wrapped
    in :class:`BytesApart`."""
    return [BytesApart(x) if type(x) is bytes and len(x) >= OUT_OF_BAND_MIN else x for x in items]


def has_large_bytes(items: Iterable[Any]) -> bool:
    """Whether :func:`bytes_apart` would wrap one of ``items``."""
    for x in items:
        if type(x) is bytes and len(x) >= OUT_OF_BAND_MIN:
            return True
    return False


def nbytes(parts: Sequence[Any]) -> int:
    """Total payload bytes of a message's parts."""
    total = 0
    for p in parts:
        # (bytes: its length, without making a memoryview: twice per request/response)
        total += len(p) if type(p) is bytes else memoryview(p).nbytes
    return total


def describe_unpicklable(obj: Any) -> str:
    """Names the first element that fails to pickle, to make errors point at the culprit."""
    items = obj if isinstance(obj, list | tuple) else [obj]
    for x in items:
        try:
            pickle.dumps(x, protocol=5)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any pickling failure, and a
            # __reduce__ that calls sys.exit, is what we describe (not a reason to exit)
            why = e if isinstance(e, Exception) else f"{type(e).__name__}: {e}"
            return f"an object of type {type(x).__module__}.{type(x).__qualname__} ({why})"
    return f"an object of type {type(obj).__qualname__}"
