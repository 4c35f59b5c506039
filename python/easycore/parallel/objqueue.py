"""An inter-process queue of Python objects on easycore's Rust shared-memory queue.

Objects travel pickled with protocol 5; their out-of-band buffers (numpy arrays, anything
exposing ``PickleBuffer``; CPU tensors with ``torch=True``) are written straight into shared
memory, and large ones come out as zero-copy views. The semantics are ``queue.Queue``'s:
``put``/``get`` with ``block`` and ``timeout``, ``queue.Full``/``queue.Empty``, plus
``put_many``/``get_many`` that move many objects per lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from easycore._core import Queue as _CoreQueue
from easycore._core import sweep_stale_segments
from easycore._engine import plugins, wire
from easycore.errors import InvalidArgument, QueueClosed, QueueEmpty, QueueFull

_KIND = 1


def _check_int(name: str, value: object, least: int) -> None:
    """InvalidArgument unless ``value`` is an int (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgument(f"{name} must be an int of at least {least}, got {value!r}")


class Queue:
    """A bounded multi-producer, multi-consumer queue of objects between processes.

    Pass it to processes you start (``multiprocessing.Process(args=(q,))``, under fork,
    spawn or forkserver): pickling it attaches to the same shared memory. The process that
    made it owns the shared memory; it is released when that process's queue is closed and
    garbage-collected, or when that process exits (also when it is killed). Its death ends
    the queue for the others, as ``close()`` would: gets hand out what is left, then raise
    :class:`~easycore.errors.QueueClosed`, and puts raise it.

    Args:
        capacity_bytes (int): bytes of the ring that holds small messages; larger objects
            travel in side segments of shared memory (within ``side_budget``).
        max_messages (int): most objects queued at once (``put`` blocks beyond it).
        side_budget (int, optional): bytes of shared memory large objects may hold at once;
            default ``4 * capacity_bytes``.
        torch (bool): send CPU tensors' memory out of band (needs torch).

    Example::

        q = Queue()
        p = multiprocessing.get_context("spawn").Process(target=work, args=(q,))
        p.start()
        q.put({"x": numpy.zeros(1 << 20)})
        result = q.get(timeout=10)
    """

    def __init__(
        self,
        capacity_bytes: int = 16 << 20,
        max_messages: int = 65536,
        *,
        side_budget: int | None = None,
        torch: bool = False,
    ) -> None:
        _check_int("capacity_bytes", capacity_bytes, 4096)
        _check_int("max_messages", max_messages, 1)
        if side_budget is not None:
            _check_int("side_budget", side_budget, 0)
        # What dead processes left in /dev/shm goes first (a few µs when there is nothing):
        # children forked by multiprocessing end with os._exit, which leaves their liveness
        # tokens behind, and killed ones leave their segments too.
        sweep_stale_segments()
        try:
            self._q = _CoreQueue(
                capacity_bytes=capacity_bytes,
                max_messages=max_messages,
                side_budget=side_budget if side_budget is not None else 4 * capacity_bytes,
            )
        except OverflowError as e:  # beyond 64 bits: the core's own bounds are far lower
            raise InvalidArgument(f"a size beyond any queue's: {e}") from None
        self._torch = torch
        self._codec = self._make_codec()

    def _make_codec(self) -> wire.Codec:
        if self._torch:
            codec: wire.Codec = plugins.load("codec:torch")()
            return codec
        return wire.Codec()

    def __getstate__(self) -> dict[str, Any]:
        return {"q": self._q, "torch": self._torch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._q = state["q"]
        self._torch = state["torch"]
        self._codec = self._make_codec()

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Puts ``obj`` in the queue.

        Args:
            obj (Any): any picklable object.
            block (bool): wait for room (else raise at once).
            timeout (float, optional): most seconds to wait for room.

        Raises:
            queue.Full: no room in time (:class:`~easycore.errors.QueueFull`).
            QueueClosed: the queue was closed.
        """
        self._q.put(0, _KIND, self._codec.dumps(obj), block=block, timeout=timeout)

    def put_nowait(self, obj: Any) -> None:
        """``put(obj, block=False)``."""
        self.put(obj, block=False)

    def put_many(
        self, objs: Iterable[Any], block: bool = True, timeout: float | None = None
    ) -> int:
        """Puts several objects, taking the queue's lock once for as many as fit.

        Args:
            objs (Iterable): the objects.
            block (bool): wait for room.
            timeout (float, optional): most seconds to wait for room.

        Returns:
            int: how many were put (all of them).

        Raises:
            queue.Full: not all fit in time (its message says how many were put).
        """
        msgs = [(0, _KIND, self._codec.dumps(o)) for o in objs]
        return self._q.put_many(msgs, block=block, timeout=timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Removes and returns the next object.

        Args:
            block (bool): wait for an object (else raise at once).
            timeout (float, optional): most seconds to wait.

        Returns:
            Any: the object.

        Raises:
            queue.Empty: nothing came in time (:class:`~easycore.errors.QueueEmpty`).
            QueueClosed: the queue was closed and is drained.
        """
        _seq, _kind, parts = self._q.get(block=block, timeout=timeout)
        return self._codec.loads(parts)

    def get_nowait(self) -> Any:
        """``get(block=False)``."""
        return self.get(block=False)

    def get_many(
        self, max_items: int = 64, block: bool = True, timeout: float | None = None
    ) -> list[Any]:
        """Removes and returns up to ``max_items`` objects (at least one), in order.

        Args:
            max_items (int): most objects returned.
            block (bool): wait for the first object.
            timeout (float, optional): most seconds to wait for the first object.

        Returns:
            list: the objects.

        Raises:
            queue.Empty: nothing came in time.
        """
        _check_int("max_items", max_items, 1)
        # No more than the queue can hold (any int is fine, 2**70 too).
        max_items = min(max_items, self._q.max_messages)
        msgs = self._q.get_many(max_items, block=block, timeout=timeout)
        loads = self._codec.loads
        return [loads(parts) for _seq, _kind, parts in msgs]

    def qsize(self) -> int:
        """Number of objects queued now (approximate while others put and get)."""
        return self._q.qsize()

    def empty(self) -> bool:
        """Whether nothing is queued now (approximate while others put and get)."""
        return self._q.empty()

    def full(self) -> bool:
        """Whether ``max_messages`` objects are queued now (approximate)."""
        return self._q.qsize() >= self._q.max_messages

    def close(self) -> None:
        """Closes the queue for every process: ``put`` raises
        :class:`~easycore.errors.QueueClosed`; ``get`` drains what is left, then raises it.
        """
        self._q.close()

    @property
    def closed(self) -> bool:
        """bool: whether the queue was closed."""
        return self._q.closed


__all__ = ["Queue", "QueueClosed", "QueueEmpty", "QueueFull"]
