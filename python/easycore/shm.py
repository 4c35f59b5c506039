"""numpy arrays born in shared memory: results that reach the consumer with no copy at all.

In a producer (``producer_init``, ``producer_work``, ``producer_end``), :func:`empty`,
:func:`zeros`, :func:`empty_like` and :func:`zeros_like` hand out arrays whose memory is a
segment leased from the runner's output queue. Return such an array (or put it anywhere in
the result: a tuple, a dict, a list of several) and it travels by reference: the consumer's
array is a view of the same pages, and the segment goes back to the pool when the
consumer's last view of it is gone. Example::

    from easycore import shm

    @staticmethod
    def producer_work(device, cfg, data):
        out = shm.empty((1024, 1024, 4), dtype=np.float32)
        out[...] = compute(data)  # write in place (np.add(a, b, out=out), ...)
        return out

In the caller, ``runner=`` leases from a runner's (or Pool's) *input* queue instead: an input
item built there travels to the producers by reference::

    with MyRunner(devices=2) as r:
        frames = [shm.empty((1080, 1920, 3), dtype=np.uint8, runner=r) for _ in range(8)]
        for i, f in enumerate(frames):
            f[...] = i
        out = r(frames)  # each frame is sent by reference, then read-only here

The rules (see ``docs/shm.md``):

* Sent by reference is the array's whole C-contiguous buffer, or a contiguous part of it
  (``out[:n]``); anything else (a non-contiguous view, a second part of the same array, an
  array already sent) is copied as any other array is.
* Once returned, the array belongs to the consumer: the producer must not write into it (the
  array object returned is marked read-only after it is sent; views made before the send
  are not, and writing through them changes what the consumer reads, or a later message).
* The same holds for the caller's input arrays (``runner=``): once sent, the array is
  read-only, and its pages are reused by later items when the producers are done with it.
* Outside a producer (without ``runner=``), below the pool's threshold (``pool_min``,
  256 KiB by default), or when the pool is full, these return ordinary private arrays, which
  take today's one-copy path; they never wait for room.

Big read-only Python data (a data set's index of millions of dicts) shared by every
producer with no copy-on-write growth: :func:`freeze`, which returns a :class:`SharedList`
or a :class:`SharedDict` (see :mod:`easycore._frozen` and ``docs/memory.md``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from easycore._engine import leases
from easycore._frozen import SharedDict, SharedList, freeze

__all__ = [
    "SharedDict",
    "SharedList",
    "empty",
    "empty_like",
    "freeze",
    "is_shared",
    "zeros",
    "zeros_like",
]


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def empty(shape: Any, dtype: Any = float, *, runner: Any = None) -> np.ndarray:
    """An uninitialised C-contiguous array, in shared memory when it can be (see the module
    docstring), else an ordinary ``np.empty``. ``runner``: in the caller, a runner or Pool
    whose input items the array is for (leased from its input queue's pool; an ordinary
    array while it is closed)."""
    dt = np.dtype(dtype)
    shp = _shape(shape)
    if any(s < 0 for s in shp):
        raise ValueError(f"negative dimensions are not allowed: {shp}")
    count = math.prod(shp)
    held = None
    if count and dt.itemsize:
        held = leases.lease(count * dt.itemsize, runner)
    if held is None:
        return np.empty(shp, dtype=dt)
    arr: np.ndarray = np.frombuffer(memoryview(held), dtype=dt, count=count).reshape(shp)
    leases.track(arr, held)
    return arr


def zeros(shape: Any, dtype: Any = float, *, runner: Any = None) -> np.ndarray:
    """As :func:`empty`, filled with zeros."""
    arr = empty(shape, dtype, runner=runner)
    arr[...] = 0
    return arr


def empty_like(a: Any, dtype: Any = None, *, runner: Any = None) -> np.ndarray:
    """As :func:`empty`, with the shape (and dtype, unless given) of ``a``."""
    a = np.asarray(a)
    return empty(a.shape, a.dtype if dtype is None else dtype, runner=runner)


def zeros_like(a: Any, dtype: Any = None, *, runner: Any = None) -> np.ndarray:
    """As :func:`zeros`, with the shape (and dtype, unless given) of ``a``."""
    a = np.asarray(a)
    return zeros(a.shape, a.dtype if dtype is None else dtype, runner=runner)


def is_shared(a: Any) -> bool:
    """Whether ``a`` (an array or a view of one) lies in a leased shared segment."""
    base = a
    while base is not None:
        if type(base).__name__ == "ShmLease":
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False
