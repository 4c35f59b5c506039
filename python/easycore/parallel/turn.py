"""Who advances the pool's stream (receives its results): the service thread, or a caller in a
request/response loop (:class:`Turn`).

A ``map``/``imap`` call whose input is a request/response loop (item i+1 exists only once
its caller took result i) reads its own input in the caller's thread (``calls.py``). When
nothing else is on its way in the stream, the service thread *parks* (:meth:`Turn.park_if`,
:meth:`Turn.wait`): it leaves the stream's generator (``Call.iterate_chunks``) suspended
between two results, and a caller may take the turn (:meth:`Turn.try_take`), send its item
and receive until its result came (the engine's lean step, ``Call.exchange``, else the
generator itself), with no hand-off through the pool's threads (the caller's thread and the
worker: two wake-ups a round trip, as a bare pipe). ``Pool.apply`` does the same for its
task; after one, the service thread parks while nothing is on its way for a while
(``StreamService._park_ok``).

The service thread wakes (:meth:`Turn.wake`) when the feed has new work or the stream
ends, when the pool is terminated, and when a caller gives the turn back with something
left for it (:meth:`Turn.give_back`: results of other calls or tasks, which the service
thread routes so that futures' callbacks run where they always do, the generator's error,
or its end, or work still on its way). Every ``TICK`` it looks whether it should still be
parked (a worker died, say).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any

from easycore._engine.lifecycle import TICK


class Left:
    """What a caller leaves the service thread as it gives the turn back: a message's results
    for other calls (``handed``), the error the stream's generator raised in the caller's
    thread, or its end."""

    __slots__ = ("handed", "error", "ended")

    def __init__(
        self,
        handed: list[Any] | None = None,
        error: BaseException | None = None,
        ended: bool = False,
    ) -> None:
        self.handed = handed
        self.error = error
        self.ended = ended


class Turn:
    """The right to advance one stream's generator ``chunks`` of ``call`` (see the module)."""

    def __init__(self, call: Any, chunks: Generator[list[Any], None, None]) -> None:
        self.call = call
        self.chunks = chunks
        # Guards the fields below; a caller's take and give-back hold it directly (a C-level
        # ``with``), the service thread waits on ``cond``.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.parked = False  # the service thread leaves the stream to callers
        self.caller = False  # a caller holds the turn
        self.wakes = 0  # bumped to end the service thread's park
        self.parked_at = 0  # ``wakes`` when it parked
        self.left: Left | None = None
        self.closed = False

    # ----- the service thread -----

    def park_if(self, ok: Callable[[], bool]) -> bool:
        """Parks the service thread if ``ok()`` (asked after the wake count is read, so a
        wake that comes meanwhile is not lost): callers may take the turn from now on.
        Whether it parked; then :meth:`wait` follows."""
        w = self.wakes
        if not ok():
            return False
        with self.lock:
            if self.wakes != w or self.closed:
                return False
            self.parked = True
            self.parked_at = w
        return True

    def wait(self, still: Callable[[], bool]) -> Left | None:
        """The parked service thread waits until it is woken, or a caller left something,
        or (asked every ``TICK`` while no caller holds the turn) ``still()`` is false; never
        while a caller holds the turn. Returns what a caller left, if anything."""
        with self.cond:
            try:
                while True:
                    if not self.caller and (self.left is not None or self.wakes != self.parked_at):
                        break
                    if not self.cond.wait(TICK) and not self.caller and not still():
                        break
            finally:
                self.parked = False
                left, self.left = self.left, None
        return left

    def wake(self) -> None:
        """Ends the service thread's park (any thread): there is work for it."""
        with self.lock:
            self.wakes += 1
            if self.parked:
                self.cond.notify_all()

    def close(self) -> None:
        """The stream is over: no caller takes the turn from now on; waits for one that
        holds it to give it back."""
        with self.lock:
            self.closed = True
            self.parked = False
            while self.caller:
                self.cond.wait(TICK)

    # ----- a caller -----

    def try_take(self) -> bool:
        """Takes the turn if the service thread is parked and nobody holds it."""
        with self.lock:
            if not self.parked or self.caller or self.left is not None or self.closed:
                return False
            self.caller = True
        return True

    def give_back(self, left: Left | None, wake: bool) -> None:
        """Gives the turn back, leaving ``left`` to the service thread; with ``wake`` (work
        on its way) the service thread takes the stream back. A parked service thread
        with nothing to do is not woken: the next round trip finds it parked still."""
        with self.lock:
            self.caller = False
            if left is not None:
                self.left = left
            if wake:
                self.wakes += 1
            if self.closed or self.left is not None or self.wakes != self.parked_at:
                self.cond.notify_all()
