"""An iterator input read in *runs*: C-level chains over its items that any thread can cut.

The engine's input thread (``read_runs`` in ``reader.py``) pulls each run into its buffer
with one ``list.extend``: no Python frame per item, where a Python loop (``for x in
islice(it, n): append(x)``) cost about 100 ns an item in the caller's process, a tenth of
the whole per-item budget on tiny items. A run must still end between two items when the
engine's receiving thread starts to wait on each item (a producer may be idle, or the
input is a feedback loop whose next item waits for a result): that thread empties the run's
*gate*, and the extend ends after the item being read.

:func:`gated` makes one run (:func:`after_first` says when its first item was read);
:class:`RunSource` is what the input thread reads runs from;
:class:`IteratorRuns` is a runner's input as a ``RunSource``. The pool's feed
(``easycore.parallel.feed``) is the other ``RunSource``; it makes its runs with
:func:`gated` too, one per segment of a call's input. :class:`Flag` is how the receiving
thread asks the input thread, at C speed, to hand each item over as it comes.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

_second = operator.itemgetter(1)


class RunSource(Protocol):
    """An input read run by run (a runner's: :class:`IteratorRuns`; the pool's feed:
    ``easycore.parallel.feed.Feed``)."""

    #: Whether a run costs far more than its items (a wake-up, a lock, bookkeeping): then the
    #: input thread reads large items a quarter of the window at a time (``reader._room``).
    costly: bool

    def next_run(self, limit: int, got: int | None) -> Iterable[Any] | None:
        """The next run (at most ``limit`` items), waiting for one; None at the end.
        ``got``: how many items the previous run gave (None: there was none, or it raised
        and was given to :meth:`recover`). The run is the one :meth:`cut` cuts from before
        it is returned."""

    def cut(self) -> None:
        """Ends the run being read after the item being read (any thread)."""

    def recover(self, error: BaseException, got: int) -> Any:
        """The run raised ``error`` after giving ``got`` items: None if the whole input
        fails, else anything (reading goes on with the next run)."""


class Flag(list[Any]):
    """A flag tested with ``if flag:`` at C speed (a list's length: no attribute lookup, no
    method call); set from any thread with :meth:`set` (one slice assignment, atomic)."""

    __slots__ = ()

    def set(self, value: bool = True) -> None:
        """Sets (or, with False, clears) the flag."""
        self[:] = FLAG_ON if value else ()


FLAG_ON = (True,)  #: a set :class:`Flag`'s contents (``flag[:] = FLAG_ON``: set inline)


def gated(it: Iterator[Any], n: int) -> tuple[Iterator[Any], list[None]]:
    """At most ``n`` items of ``it`` as a C-level iterator, and its gate.

    Emptying the gate (``del gate[:]``: one atomic step, from any thread) ends the iterator
    after the item being read. ``zip`` asks the gate before it asks ``it``, so an item is
    never taken from ``it`` and dropped. A gate still holding entries after its run ended
    short means that ``it`` ended; an empty one, that the run was cut (or read to ``n``).
    """
    gate: list[None] = [None] * n
    return map(_second, zip(gate, it, strict=False)), gate


class _First:
    """The first item of ``run``, then ``then()`` (see :func:`after_first`)."""

    __slots__ = ("run", "then")

    def __init__(self, run: Iterator[Any], then: Callable[[], None]) -> None:
        self.run: Iterator[Any] | None = run
        self.then = then

    def __iter__(self) -> _First:
        return self

    def __next__(self) -> Any:
        run = self.run
        if run is None:
            raise StopIteration
        self.run = None
        x = next(run)  # ended or failed before its first item: ``then`` is not called
        self.then()
        return x


def after_first(run: Iterator[Any], then: Callable[[], None]) -> Iterator[Any]:
    """``run``, calling ``then()`` once its first item was read (not if it ends or fails
    before one): still a C-level chain, with one Python call for the first item."""
    return itertools.chain(_First(run, then), run)


class IteratorRuns:
    """A runner's iterator input, read run by run (the engine's ``RunSource``).

    Each run reads at most the room the engine has (``limit``). The input is over when a run
    gave fewer items than it could and was not cut. An error raised by the input fails the
    call (:meth:`recover` returns None); the items read before it are kept and sent.
    """

    __slots__ = ("_it", "_gate", "_n", "_over")
    costly = False  # a run is a gate and a zip: items come as cheaply one run or many

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        self._gate: list[None] | None = None  # the gate of the run being read, or last read
        self._n = 0  # most items that run could read
        self._over = False

    def next_run(self, limit: int, got: int | None) -> Iterator[Any] | None:
        """The next run of at most ``limit`` items; None once the input is over. ``got``:
        how many items the previous run gave (None if there was none)."""
        if self._over:
            return None
        if got is not None and got < self._n and self._gate:
            self._over = True  # it read less than it could and was not cut: the input ended
            return None
        self._n = max(1, limit)
        run, self._gate = gated(self._it, self._n)
        return run

    def cut(self) -> None:
        """Ends the run being read after the item being read (any thread)."""
        gate = self._gate
        if gate is not None:
            del gate[:]

    def recover(self, error: BaseException, got: int) -> None:
        """An error of the input fails the call: nothing to go on with."""
        return None
