"""One ``map``/``imap`` call of a pool in the caller: its input, how far ahead it may be read,
and the results its caller has not taken yet."""

from __future__ import annotations

import collections
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Sequence, Sized
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.pool import RemoteTraceback  # type: ignore[attr-defined]
from typing import Any, cast

from easycore._engine.probes import (
    DIRECT_AFTER,
    PROBE_FIRST,
    PROBE_INHERITED_S,
    after_probe,
    habit_after,
    trial_over,
)
from easycore._engine.reports import _loads_or_none, worker_error
from easycore._engine.wire import describe_unpicklable
from easycore.errors import SerializationError

_SEQUENCES = (range, list, tuple)  # inputs sliced into chunks without waiting
# What a caller does when it finds no result (see wait_step): wait; read its next item
# itself; ask the feed for its input; give its input back to the feed (which it wakes);
# receive the stream's results itself (calls.py: instead of a wait).
WAIT, READ, ASK, GIVE, RECEIVE = 0, 1, 2, 3, 4
_FN_WIRE_MAX = 4096  # largest pickled function a worker keeps (see _Job.fn_wire)


class _BrokenTransfer(SerializationError, BrokenProcessPool):
    """A task could not be unpickled in its worker, or results in the caller: a
    :class:`~easycore.errors.SerializationError`, and the ``BrokenProcessPool`` that
    ``concurrent.futures`` raises for it (there the pool breaks; here only what the failure
    reached fails, and the pool goes on)."""


def broken_transfer(message: str, cause: BaseException | None) -> _BrokenTransfer:
    """The pool's error for a task or results that could not be unpickled (see
    :class:`_BrokenTransfer`), chained to ``cause``."""
    err = _BrokenTransfer(message)
    err.__cause__ = cause
    err.exc = repr(cause) if cause is not None else ""
    return err


def task_error(report: dict[str, Any], cause: type = RemoteTraceback) -> BaseException:
    """The exception a pool's caller gets for a task's error report: the original exception
    (its own type and ``args``, as ``multiprocessing`` and ``concurrent.futures`` re-raise
    it), with the remote traceback as ``__cause__`` (a ``cause``: ``multiprocessing``'s
    ``RemoteTraceback``, or ``concurrent.futures``' for an executor's futures). easycore's
    context rides along as attributes (``hook``, ``device``, ``item``,
    ``remote_traceback``) and a note. Where the exception cannot travel (it does not
    pickle, or is not importable here), or the error is easycore's own (a result that
    cannot be pickled), the runners' error is used."""
    if report.get("kind") == "unpickle_task":
        return broken_transfer(
            f"the task could not be unpickled in its worker: {report.get('message')}",
            cause(report.get("traceback", "")),
        )
    if report.get("kind") == "unpickle_items":
        return broken_transfer(
            f"input items from {report.get('item')} of this call (one chunk) could not be "
            f"unpickled in their worker: {report.get('message')}",
            cause(report.get("traceback", "")),
        )
    exc = _loads_or_none(report.get("exc")) if report.get("kind") == "hook" else None
    if not isinstance(exc, BaseException):
        return worker_error(report)
    tb = report.get("traceback", "")
    where = f"raised in a task on device {report.get('device')!r}"
    if report.get("item") is not None:
        where += f" (item {report['item']})"
    for name, value in (
        ("hook", report.get("hook")),
        ("device", report.get("device")),
        ("item", report.get("item")),
        ("remote_traceback", tb),
    ):
        if not hasattr(exc, name):
            try:
                setattr(exc, name, value)
            except Exception:  # noqa: BLE001 - a class with __slots__: the note says it
                pass
    try:
        exc.add_note(where)
    except Exception:  # noqa: BLE001 - never hide the error for its note
        pass
    exc.__cause__ = cause(tb)
    return exc


def unsendable_error(error: BaseException, first: int, items: Sequence[Any]) -> BaseException:
    """The exception a ``map``/``imap`` caller gets for input items ``first``… (a chunk)
    that could not be pickled: the pickler's own exception for the culprit (its type, as the
    stdlib's pools raise it; ``error``, the chunk's, if no single item fails alone), with
    the culprit's input index as ``item`` and a note naming it."""
    k = 0
    for k, x in enumerate(items):  # noqa: B007 - k is the culprit's position after the loop
        own = _pickle_error(x)
        if own is not None:
            error = own
            break
    else:
        k = 0
    if not hasattr(error, "item"):
        try:
            error.item = first + k  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a class with __slots__: the note says it
            pass
    try:
        error.add_note(
            f"input item {first + k} of this call cannot be sent to the workers: "
            f"{describe_unpicklable(list(items[k : k + 1]))} is not picklable"
        )
    except Exception:  # noqa: BLE001 - never hide the error for its note
        pass
    return error


def _pickle_error(x: Any) -> BaseException | None:
    """None if ``x`` can travel (by plain pickle, or by value with cloudpickle), else plain
    pickle's exception for it."""
    try:
        pickle.dumps(x, protocol=5)
    except Exception as e:  # noqa: BLE001 - any failure means: try cloudpickle
        try:
            import cloudpickle

            cloudpickle.dumps(x, protocol=5)
        except Exception:  # noqa: BLE001 - any failure means it cannot travel
            return e
    return None


def _length(iterable: Iterable[Any]) -> int | None:
    """The number of items of an input that says it (``len``), else None."""
    try:
        return len(iterable) if isinstance(iterable, Sized) else None
    except Exception:  # noqa: BLE001 - a broken __len__: no total
        return None


class _Job:
    """One ``map``/``imap`` call: its input, the results its caller has not taken yet."""

    def __init__(
        self,
        jid: int,
        fn: Any,
        iterable: Iterable[Any],
        mode: int,
        ordered: bool,
        window: int,
        chunksize: int | None,
        room: list[int],
    ) -> None:
        self.jid = jid
        self.fn = fn
        self._fn_wire: Any = None  # see fn_wire
        # A range/list/tuple is sliced in place; any other iterable is read item by item
        # (in chunks only if asked: filling a chunk would hold back items while next() waits).
        self.seq = cast("Sequence[Any]", iterable) if type(iterable) in _SEQUENCES else None
        self.it = None if self.seq is not None else iter(iterable)
        self.total = len(self.seq) if self.seq is not None else _length(iterable)
        self.chunksize = chunksize
        self.mode = mode
        self.ordered = ordered
        self.window = window
        self.room = room  # [items]: the pool's bound from the bytes per result (shared)
        # Guards the job's state: held directly (a C-level ``with``), waited on through cv.
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        # Lists of results not handed out yet: by input index of their first (ordered), or
        # in arrival order.
        self.ready: dict[int, list[Any]] | collections.deque[list[Any]] = (
            {} if ordered else collections.deque()
        )
        self.next_index = 0  # ordered: the next index to hand out
        self.pulled = 0  # items read from the input (by the feed)
        self.consumed = 0  # results handed to the caller
        self.input_done = False
        self.error: BaseException | None = None
        # Ordered jobs raise a task's error in its place: results before this input index
        # are handed out first (as multiprocessing.Pool.imap does). 0: at once.
        self.error_at = 0
        self.closed = False  # finished or abandoned: its input and results are dropped
        # The pool is closing: read the rest of the input regardless of the caller (as the
        # stdlib's pools finish every task given), so close()/join() end.
        self.drain = False
        self.waiting = False  # its caller waits on cv for a result
        # Its caller may receive the stream's results in its own thread while it waits
        # (``turn.py``, ``CallerTurns.receive_for``): no ``timeout``, no ``maxtasksperchild``.
        self.receives = False
        # While it does (in receive_for), what wakes its wait on the stream: the job's own
        # news (its input's end or error, a failure) must reach it there as on cv.
        self.receiver: Callable[[], None] | None = None
        # The caller reads the input itself (calls.py): asked (want_direct), handed over by
        # the feed when it is not reading it (direct), while the caller reads an item and
        # until that item is sent or queued (caller_reads). Written under cv.
        self.want_direct = False
        self.direct = False
        self.caller_reads = False
        self.starved = 0  # the caller's waits in a row with nothing on its way
        # A request/response input (item i+1 exists only once its caller took result i) is
        # read by its caller, as the runners do, on adaptive reading's schedule
        # (``_engine/probes.py``): asked for after DIRECT_AFTER waits in a row with nothing
        # on its way in the stream, handed back to the feed after probe_at items (a probe:
        # an input that now runs ahead is read in segments again).
        self.direct_reads = 0  # items the caller read since the input was handed over
        self.direct_since = 0.0  # when it was handed over (time.monotonic)
        self.probe_pace = 0.0  # seconds per item of the last probe interval (0: none yet)
        self.probe_at = PROBE_FIRST
        self.handed_over = False  # the caller read the input itself (at least once)
        # A call that started with its input in its caller's hands on its predecessor's word
        # (start_as) is on trial until then (time.monotonic; 0: not on trial, or no longer):
        # it is handed back to the feed at the first read or wait after it (probes.py).
        self.trial_until = 0.0
        self.took_several = False  # the caller took several results at once (ran ahead)
        # The caller's last read ends a probe interval: the input goes back to the feed once
        # that item is sent or queued (read_direct, sent_direct).
        self.handing_back = False
        # Handed back to the feed (a probe), which has not begun to read it since: the caller
        # does not ask for it again until the feed did (else, on a loaded machine, it would
        # ask before the feed ever ran, and an input that turned fast would never be read
        # ahead again). Set by sent_direct, cleared once the feed read an item of it.
        self.awaiting_feed = False
        # The results of the caller's own round trip (its item, read by read_direct), handed
        # straight to it by the thread that received them, its own (see calls.py).
        self.own: list[Any] | None = None

    def fn_wire(self) -> Any:
        """The function as the caller's own reads send it (:meth:`read_direct`, one work
        item each): pickled once, as bytes that a worker unpickles once and keeps (pickling
        a function by name costs about a microsecond each way), or the function itself
        where plain pickle cannot send it or its pickle is large."""
        wire = self._fn_wire
        if wire is None:
            try:
                wire = pickle.dumps(self.fn, protocol=5)
            except Exception:  # noqa: BLE001 - sent as it is: the codec finds out
                wire = self.fn
            if isinstance(wire, bytes) and len(wire) > _FN_WIRE_MAX:
                wire = self.fn  # a large callable: not kept by the workers
            self._fn_wire = wire
        return wire

    def has_room(self) -> bool:
        """Whether the feed may start reading more of this job's input: once at least a
        quarter of its bound (``window``, or fewer by bytes per result) is free. A segment
        then reads up to the whole bound, so a busy job's input is read, sent and routed in
        runs of thousands, not a few items each time its caller takes some results (each run
        costs a wake-up of the feed, a segment and a batch); a job with little ahead (an input
        waiting on its own results) is read at once."""
        if self.closed or self.input_done or self.direct:
            return False
        if self.drain:
            return True
        limit = self.limit()
        ahead = self.pulled - self.consumed
        return ahead < limit and 4 * ahead <= 3 * limit

    def has_result(self) -> bool:
        """Whether the caller has something to take: a result, or an error it raises now (an
        ordered job's error once the results before it were taken) (a guess without the
        lock)."""
        if self.error is not None and (not self.ordered or self.next_index >= self.error_at):
            return True
        ready = self.ready
        return self.next_index in ready if self.ordered else bool(ready)

    def wait_step(self, allowed: bool, drained: Callable[[], bool]) -> int:
        """Under cv: the caller found nothing to take and is about to wait. :data:`READ`: it
        reads the next item itself now (its input was handed over and nothing of it is on
        its way); :data:`ASK`: it asks the feed for the input (it waited
        ``DIRECT_AFTER`` times in a row with nothing on its way in the stream,
        ``drained()``, once it took a result: a request/response input); :data:`GIVE`: on
        trial past its end, with an item it read on its way, it handed the input back (and
        wakes the feed); :data:`WAIT`: it waits. ``allowed``: the call and the pool allow it
        (no ``timeout``, no ``maxtasksperchild``)."""
        if self.direct:
            if (
                self.consumed >= self.pulled
                and not self.input_done
                and self.error is None
                and not self.drain
            ):
                self.caller_reads = True
                return READ
            if self.trial_until and time.monotonic() >= self.trial_until:
                # On trial, its item outlasted the trial: the feed reads ahead from now on,
                # as after a probe (an input that runs ahead, of costly items).
                self._hand_back()
                return GIVE
            return WAIT
        if (
            not allowed
            or self.want_direct
            or self.it is None
            or self.chunksize is not None
            or self.drain
            or self.closed
            or not drained()
            or self.awaiting_feed
            or not self.consumed  # (the call's start: its input may not have been read yet)
        ):
            return WAIT
        self.starved += 1
        if self.starved < DIRECT_AFTER:
            return WAIT
        self.want_direct = True
        return ASK

    def ran_ahead(self) -> None:
        """The caller took several results at once: the input runs ahead."""
        self.starved = 0
        self.took_several = True

    def start_as(self, habit: int, direct_ok: bool) -> None:
        """A new call, before the feed saw it, on the pool's habit (:meth:`habit`; 0: none):
        a call over an iterator that follows a request/response one starts in its caller's
        hands, on trial (:attr:`trial_until`), and keeps its input that many items before
        its first probe (``_engine/probes.py``), where its caller may read it
        (``direct_ok``: no ``timeout``, no ``maxtasksperchild``)."""
        if habit and direct_ok and self.it is not None and self.chunksize is None:
            now = time.monotonic()
            self.probe_at = habit
            self.want_direct = self.direct = self.handed_over = True
            self.direct_since = now
            self.trial_until = now + PROBE_INHERITED_S

    def habit(self, previous: int) -> int:
        """The pool's habit (see :meth:`start_as`) once this call ended: where its caller read
        its input, its next probe interval; where its input ran ahead, none; else (a list, a
        chunked input, a call too short to tell) ``previous``."""
        if self.it is None or self.chunksize is not None:
            return previous
        return habit_after(
            previous, self.handed_over, self.took_several, self.probe_at, self.probe_pace
        )

    def input_turn(self) -> None:
        """The feed, not reading this input (between segments, under the scheduler's lock):
        hands it over to the caller that asked for it, or takes it back unless the caller is
        inside ``next()``: while the pool is closing (``drain``: the input is read to its end
        whatever the caller does), and from a call on trial past its trial (its caller has
        not asked for a result since, or never: the feed reads ahead, as the stdlib's pools
        read every input at once)."""
        with self.lock:
            if self.direct:
                if self.caller_reads:
                    pass
                elif self.drain:
                    self.direct = self.want_direct = False
                    self.trial_until = 0.0
                elif self.trial_until and time.monotonic() >= self.trial_until:
                    self._hand_back()
            elif self.want_direct and not self.drain and not self.closed:
                self.direct = self.handed_over = True
                self.direct_reads = 0
                self.direct_since = time.monotonic()
                self.cv.notify_all()

    def read_direct(self) -> tuple[int, int, Any, list[Any], int] | None:
        """The caller reads the next item itself (after :data:`READ`): its work item
        (``feed.py``'s ``_WorkItem``: one argument, the function as :meth:`fn_wire` has it),
        or None when the input ended or raised (then the job says so, as the feed would). The
        caller stays inside ``next()`` (``caller_reads``) until the item is sent or queued:
        :meth:`sent_direct` follows, which hands the input back to the feed after a probe
        interval (or while closing)."""
        try:
            x = next(self.it)  # type: ignore[arg-type]
        except StopIteration:
            with self.lock:
                self.caller_reads = False
                self.input_done = True
                self.cv.notify_all()
            return None
        except BaseException as e:  # noqa: BLE001 - the input's error, raised in its place
            with self.lock:
                self.caller_reads = False
            self.fail_input(e)
            return None
        with self.lock:
            index = self.pulled
            self.pulled = index + 1
            reads = self.direct_reads = self.direct_reads + 1
            if (
                self.drain
                or reads >= self.probe_at
                or (self.trial_until and trial_over(reads, self.trial_until))
            ):
                self.handing_back = True
        fn = self._fn_wire  # (fn_wire's common case inline: once a round trip)
        return self.jid, index, fn if fn is not None else self.fn_wire(), [x], self.mode

    def sent_direct(self) -> bool:
        """The item of :meth:`read_direct` was sent, or queued for the feed ahead of all other
        work (called again after that, it does nothing): the caller is done reading. Whether
        it handed the input back to the feed (the scheduler then wakes it): only now, as the
        feed, which may block in an input waiting for that item's result, would never send
        an item queued after it began to read. The feed then reads ahead while the item is
        on its way: an input that now runs ahead is read in segments again; a
        request/response one is asked for again at the caller's next wait, and kept longer
        (``_engine/probes.py``)."""
        if not self.caller_reads:
            return False  # said already (both flags are the calling thread's own to write)
        if not self.handing_back:
            # One flag written (a round trip's common case): the feed, which reads it under
            # the lock, sees it before or after, as it would with the lock held here.
            self.caller_reads = False
            return False
        with self.lock:
            self.caller_reads = False
            back = self.handing_back
            if back:
                self.handing_back = False
                self._hand_back()
        return back

    def _hand_back(self) -> None:
        """Under cv: the caller hands its input back to the feed (a probe), which it does
        not ask for again until the feed read an item of it; the next interval follows from
        this one's pace (``_engine/probes.py``)."""
        self.probe_at, self.probe_pace = after_probe(
            self.direct_reads,
            time.monotonic() - self.direct_since,
            self.probe_at if self.trial_until else 0,  # (a trial cut the inherited one short)
        )
        self.trial_until = 0.0
        self.starved = DIRECT_AFTER - 1
        self.direct = self.want_direct = False
        self.awaiting_feed = True

    def take_chunk(self, size: int) -> tuple[int, int, Any, Any, int] | None:
        """A sliced input (range, list, tuple): its next ``size`` items as a work item,
        ``pulled`` advanced past them; fewer at its end, where the input is over; None if
        nothing was left. Only the feed that chose this job (``Scheduler.next_work``) or the
        scheduler under its lock while the feed is inside another input
        (``Scheduler._send_ready``) takes chunks: never both at once."""
        index = self.pulled
        items = self.seq[index : index + size]  # type: ignore[index]
        self.pulled = index + len(items)
        if len(items) < size:
            with self.lock:
                self.input_done = True
                self.cv.notify_all()
        return (self.jid, index, self.fn, items, self.mode) if items else None

    def ahead(self) -> int:
        """Items the feed may read now (the bound less what is read and not consumed)."""
        return self.limit() - (self.pulled - self.consumed)

    def feed_read(self) -> None:
        """The feed read an item of the input handed back to it: its caller may ask for it
        again."""
        self.awaiting_feed = False

    def limit(self) -> int:
        """Most items read ahead of what the caller consumed (no bound while draining)."""
        return 1 << 40 if self.drain else min(self.window, self.room[0])

    def deliver(self, index: int, ok: bool, value: Any) -> None:
        with self.lock:
            if self.closed:
                return
            if not ok:
                # Ordered: the error of the earliest item is raised (errors of chunks can
                # arrive out of order; the results before it all arrive, as results or errors).
                if self.error is None or (self.ordered and index < self.error_at):
                    self.error = task_error(value)
                    self.error_at = index if self.ordered else 0
            elif self.ordered:
                self.ready[index] = value
            else:
                self.ready.append(value)  # type: ignore[union-attr]
            if self.waiting:
                self.cv.notify()

    def fail_input(self, error: BaseException) -> None:
        """The input raised ``error`` after ``pulled`` items: an ordered job hands out the
        results ahead of it first (as ``multiprocessing.Pool.imap`` does)."""
        with self.lock:
            self.input_done = True
            if self.error is None or (self.ordered and self.pulled < self.error_at):
                self.error = error
                self.error_at = self.pulled if self.ordered else 0
            self.cv.notify_all()
        self._wake_receiver()

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self.input_done = True
            if self.error is None:
                self.error = error
            self.error_at = 0  # results still missing may never come: raise now
            self.cv.notify_all()
        self._wake_receiver()

    def wake(self) -> None:
        with self.lock:
            self.cv.notify_all()
        self._wake_receiver()

    def _wake_receiver(self) -> None:
        """The job's caller, if it receives on the stream now (``receiver``), looks at the
        job (not under the lock: the wake-up may wait for room in a queue)."""
        receiver = self.receiver
        if receiver is not None:
            receiver()
