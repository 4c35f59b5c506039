"""One call of a runner (or the pool's one stream): reading, sending, receiving, ordering,
accounting and clean-up (:class:`Call`).

Data path of one call (``runner(data)``)::

    input ─▶ [reader] ─▶ batches ─▶ pickle ─▶ [input Queue] ─▶ producers: producer_work
    consumer thread: consumer_work ◀─ [ReorderBuffer] ◀─ unpickle ◀─ [output Queue] ◀─┘

* One thread receives results (the consumer thread, or the caller's thread for ``imap``) and
  also sends the input, whenever it runs: nothing waits to fill a batch. A ``range``, list
  or tuple is sliced in place. Any other iterable is read by a helper thread
  ("easycore-input") into a buffer bounded by the window, a run of items per
  ``list.extend`` (``runs.py``): the sender takes whatever is
  there, so fast inputs travel in large batches and a slow or feedback input (item i+1
  exists only once result i arrived) is sent item by item, at once. When nothing is in
  flight and the receiver sleeps, the reader sends a new item itself; otherwise it wakes
  the receiver with a ``WAKE`` message on the output queue.
* At most ``window`` items are in flight (read and not yet handed to ``consumer_work``), so
  memory stays bounded whatever the input's length and however slow one producer is.
* Batch sizes adapt to the producers' measured time per item (about 4 ms of work per batch).
* Every message carries the call number: results, errors and wake-ups of an aborted call are
  dropped by later ones, so a runner stays usable after an error in a hook, an input that
  raises, or an abandoned ``imap``. One call runs at a time (see :meth:`BaseRunner.__call__`).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from easycore._core import ReorderBuffer
from easycore._engine import leases, wire
from easycore._engine import producer as _producer
from easycore._engine.lifecycle import TICK
from easycore._engine.reports import call_hook, hook_error, worker_error
from easycore._engine.runs import IteratorRuns
from easycore._engine.stats import RunnerStats
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    RunnerClosedError,
    RunnerTimeoutError,
    WorkerDiedError,
)

if TYPE_CHECKING:
    from easycore._core import ReorderBuffer as _ReorderBuffer
    from easycore._engine.transport import Transport


@dataclass(frozen=True)
class StreamSettings:
    """How a runner's streams run, fixed when the runner is made.

    Attributes:
        ordered: results are delivered in input order (through a reorder buffer).
        window: the most items in flight (read and not yet delivered).
        window_floor: the window while the producers' cost per item is not known to be
            small (equal to ``window`` when the user set it).
        devices: one device per producer.
        codec: makes the codec that pickles items and results (the flavour's).
    """

    ordered: bool
    window: int
    window_floor: int
    devices: tuple[str, ...]
    codec: Callable[[], wire.Codec]


class RunnerLike(Protocol):
    """What a call uses of its runner (:class:`~easycore.common.parallel.BaseRunner`): its
    settings, its cfg, the figures it learns across calls, and the one-call-at-a-time
    protocol."""

    _settings: StreamSettings
    _cfg: Any
    _cost_per_item: float  # learned across calls: producer seconds per item
    _out_bytes_per_item: float  # learned across calls: result bytes per item
    stats: RunnerStats

    @property
    def _calls(self) -> Iterator[int]:
        """Call numbers."""

    # the consumer hooks (looked up on the class)
    @staticmethod
    def consumer_init(cfg: Any) -> None: ...
    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None: ...
    @staticmethod
    def consumer_end(cfg: Any) -> Any: ...

    def _active_workers(self) -> Transport: ...
    def _begin(self, call: Call, timeout: float | None) -> None: ...
    def _end(self, call: Call) -> None: ...
    def _shutdown(self, interrupt: bool) -> None: ...
    def _reorder_buffer(self, window: int) -> _ReorderBuffer: ...
    def _drop_unsendable(self, items: list[Any], first: int, error: Exception) -> list[Any]: ...


_TARGET_BATCH_S = 0.004  # producer work per message the batching aims at
_MAX_BATCH_BYTES = 1 << 20  # do not grow batches of large items past this
_SEQUENCES = (range, list, tuple)  # inputs sliced in place: reading them never blocks


class RunSource(Protocol):
    """An input read run by run (the pool's feed: ``easycore.parallel.feed.Feed``)."""

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


class _Flag(list[Any]):
    """A flag tested with ``if flag:`` at C speed (a list's length: no attribute lookup, no
    method call); set from any thread with :meth:`set` (one slice assignment, atomic)."""

    __slots__ = ()

    def set(self, value: bool = True) -> None:
        """Sets (or, with False, clears) the flag."""
        self[:] = _SET if value else ()


_SET = (True,)


def _ema(prev: float, x: float, weight: float = 0.3) -> float:
    """Running average of a figure the runner learns across calls (0: none learned yet)."""
    return x if prev <= 0 else (1.0 - weight) * prev + weight * x


class Call:
    """The state of one call: reading, sending, receiving, ordering, accounting, clean-up."""

    def __init__(
        self,
        runner: RunnerLike,
        data_iter: Iterable[Any],
        progress: bool,
        timeout: float | None,
        is_imap: bool,
        read_ahead: bool = True,
        pack: Callable[[list[Any]], list[Any]] | None = None,
        cost: Callable[[], float] | None = None,
        runs: RunSource | None = None,
    ) -> None:
        """``pack`` (optional) turns each batch's items into what is sent: fewer work items,
        each standing for a run of input items (one result each; the call counts input
        items, so it keeps each such batch's count in ``packed_counts``);
        ``cost`` (optional) gives the producers' seconds per item that batches are sized by,
        instead of the runner's figure learned per item sent (the pool sends single items
        and whole chunks in one stream: a chunk's cost would shrink the batches of single
        items a thousandfold); ``runs`` (optional) is the input read run by run (the pool's
        feed, see :class:`RunSource`): each run is pulled in with one ``list.extend``, not a
        Python loop per item, unless the receiving thread waits on each item, and survives
        an error of one run if the source recovers from it."""
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"timeout must be positive or None, got {timeout!r}")
        self.runner = runner
        self.workers = runner._active_workers()
        settings = runner._settings
        self.codec = settings.codec()
        self.call = next(runner._calls)
        self.kind_work = wire.pack_kind(wire.WORK, self.call)
        self.is_imap = is_imap
        self.timeout = timeout
        # Threads taking part (the first one made the call). Thread objects, not idents: an
        # ident is reused as soon as its thread ends.
        self.threads: list[threading.Thread] = []
        self.total: int | None
        try:
            self.total = len(data_iter)  # type: ignore[arg-type]
        except TypeError:
            self.total = None
        sliced = type(data_iter) in _SEQUENCES
        self.seq_data = cast("Sequence[Any]", data_iter) if sliced else None
        self.it = None if self.seq_data is not None else iter(data_iter)
        self.pos = 0  # next index of seq_data to send
        # Items read from self.it; those before buf_off are sent. The reader only appends;
        # the sender (under send_lock) advances buf_off. The sent prefix is removed now and
        # then, under send_lock (each step atomic under the GIL), by the sender, or by a run
        # reader between two runs (runs_compact): it counts a run's items by how much
        # len(buf) grew. Removing the prefix at each batch would move every item behind it:
        # with tens of thousands read ahead, that memmove was an eighth of the sender's time
        # on tiny items.
        self.buf: list[Any] = []
        self.buf_off = 0
        if runs is None and self.it is not None and read_ahead:
            runs = IteratorRuns(self.it)  # a runner's iterator input, read in runs too
        self.runs_compact = runs is not None and self.it is not None and read_ahead
        self.reader: threading.Thread | None = None
        self.read_ahead = read_ahead  # False: the receiving thread reads, one item at a time
        self.reader_done = self.seq_data is not None
        self.pack = pack
        self.cost = cost
        self.runs = runs
        # The reader is inside a list.extend of a run: the receiving thread, wanting each
        # item as it comes, must cut the run (set before the reader looks at attention).
        self.bulk = False
        self.reader_waiting = False
        self.receiver_waiting = False
        # receiver_waiting or abort: the reader's one check per item
        self.attention = _Flag()
        self.input_error: BaseException | None = None
        self.send_error: BaseException | None = None
        self.send_lock = threading.Lock()
        self.in_full = False
        self.window = settings.window  # the most items in flight (see _window_now)
        self.window_floor = settings.window_floor
        self.devices = settings.devices
        self.ordered = settings.ordered
        self.n = len(settings.devices)
        self.max_batch = max(1, self.window // (4 * self.n))
        self.reorder: ReorderBuffer | None = None  # an ordered runner's, taken in _start
        self.next_item = 0  # index of the next item to send
        self.next_batch = 0  # sequence number of the next batch (see _start)
        self.pending: tuple[int, int, Any] | None = None  # (seq, n_items, parts) unsent
        # seq -> input items of a sent batch that ``pack`` made into fewer work items (its
        # results, one per work item, stand for that many items); written under send_lock
        # before the batch is sent, removed by the receiving thread when its results come.
        self.packed_counts: dict[int, int] = {}
        self.dispatched = 0  # items sent (under send_lock)
        self.dropped = 0  # items read but never sent (unpicklable, dropped by the runner)
        self.delivered = 0  # items handed out (written by the receiving thread only)
        self.results_in = 0  # result messages of this call received (one per batch sent)
        self.bytes_per_item = 0.0  # pickled input per item (last batch)
        # Results in flight (queued, being consumed, or waiting in the reorder buffer) stay
        # within about twice the output queue's side budget, however large each result is.
        self.max_inflight_bytes = 2 * self.workers.out_budget
        self.busy_seen: dict[int, float] = {}
        self.wait_seen: dict[int, float] = {}
        self.error: BaseException | None = None
        self.abort = False
        self.cond = threading.Condition()
        self.last_progress = time.monotonic()
        self.stats = RunnerStats(
            producer_busy_s={i: 0.0 for i in range(self.n)},
            producer_wait_s={i: 0.0 for i in range(self.n)},
        )
        self.progress = progress
        self.bar: Any = None  # a tqdm bar (progress=True)
        self.t0 = 0.0
        self.in_wait0 = 0.0
        self.out_wait0 = 0.0
        self.ended = False
        self.consumer: threading.Thread | None = None

    def _start(self) -> None:
        """Takes the runner (one call at a time) and starts the clocks and the reader."""
        self.runner._begin(self, self.timeout)
        if self.ordered:
            # Only once the call owns the runner: the buffer may be the last call's, reused
            # (two calls made at once from two threads must not share it).
            self.reorder = self.runner._reorder_buffer(self.window)
            self.next_batch = self.reorder.next_seq  # where the buffer expects the next one
        self.threads.append(threading.current_thread())
        self.t0 = time.perf_counter()
        self.last_progress = time.monotonic()
        self.in_wait0, self.out_wait0 = self.workers.wait_seconds()
        if self.workers.exited():
            # A producer died since the last call (while the runner was idle): say so now,
            # before any input is read or any hook runs, not after the call did its work.
            try:
                self._check_health()
            except BaseException as e:
                self._fail(e)  # closes the runner: activate() restarts it
                raise
        if self.progress:
            import tqdm

            tqdm.tqdm.monitor_interval = 0  # no monitor thread (it would make fork unsafe)
            self.bar = tqdm.tqdm(total=self.total, unit="item", desc=type(self.runner).__name__)
        if self.it is not None and self.read_ahead:
            self.reader = threading.Thread(
                target=self._read_runs, name="easycore-input", daemon=True
            )
            self.threads.append(self.reader)
            self.reader.start()

    # ----- reading (a helper thread, for inputs other than range/list/tuple) -----

    def _room(self, read: int) -> int:
        """Items the reader may read now (``read``: read so far): within the window (items
        read but not delivered), a few batches at a time, so that the room is weighed again
        as the sizes of items and results become known (large items are held to a few).
        (Holding the reader to two batches beyond what the sender took was tried: under the
        GIL it then waits for the GIL to refill, and the runners lost a third of their speed
        on tiny items.)"""
        room = self._window_now() - (read - self.delivered - self.dropped)
        return min(room, 2 * self._batch_size())

    def _wait_for_room(self, read: int) -> int:
        """:meth:`_room`, waiting until there is some (the receiving thread wakes the reader
        as results are delivered); 0 once the call is aborted."""
        room = self._room(read)
        if room > 0:
            return room
        with self.cond:
            self.reader_waiting = True
            while not self.abort and (room := self._room(read)) <= 0:
                self.cond.wait(TICK)
            self.reader_waiting = False
        return 0 if self.abort else room

    def _wake_reader(self) -> None:
        """The reader may wait for room: wake it (room was made)."""
        if self.reader_waiting:
            with self.cond:
                self.cond.notify_all()

    def _read_one(self) -> None:
        """``read_ahead=False``: the next input item, read in the receiving thread. Nothing
        is in flight, so waiting for it here holds no result back."""
        try:
            self.buf.append(next(self.it))  # type: ignore[arg-type]
        except StopIteration:
            self.reader_done = True
        except BaseException as e:  # noqa: BLE001 - raised by the loop, as the reader's are
            self.input_error = e
            self.reader_done = True

    def _read_runs(self) -> None:
        """The input thread (an iterator input, ``read_ahead``): the :class:`RunSource`
        (the pool's feed, or :class:`~easycore._engine.runs.IteratorRuns` over a
        runner's input) a run at a time, each pulled in by one ``list.extend`` (no Python
        frame per item) while the receiving thread does not wait on each item; while it
        does, item by item, waking the receiver as each comes. If it starts to wait
        during an extend, it cuts the run (:meth:`RunSource.cut`): the extend ends after
        the item being read, and the receiver is woken. Race-free: the reader announces
        ``bulk`` before it looks at ``attention``; the receiver sets ``attention`` before
        it looks at ``bulk``. A run's items are counted by how much ``len(buf)`` grew: only
        this thread removes the sent prefix of ``buf`` (:meth:`_compact`), between runs."""
        src = self.runs
        assert src is not None
        buf = self.buf
        append, extend = buf.append, buf.extend
        attention = self.attention
        read = 0
        got: int | None = None  # items the last run gave (None: no run to report)
        try:
            while not self.abort:
                room = self._wait_for_room(read)
                if room <= 0:
                    continue  # aborted
                self._compact()
                run = src.next_run(room, got)
                got = None
                if run is None:
                    break  # the input is over
                items = iter(run)
                start = len(buf)
                try:
                    while True:
                        self.bulk = True
                        if not attention:
                            extend(items)  # to the run's end, or until the receiver cuts it
                            self.bulk = False
                            if attention:
                                self._input_arrived()  # the run was cut for it (or ended)
                            break
                        self.bulk = False
                        # The receiver waits on each item (a producer may be idle): each one
                        # goes to it as it comes, until it no longer waits (every producer
                        # has a batch); then the rest of the run in bulk.
                        for x in items:
                            append(x)
                            if not attention:
                                break
                            if self.abort:
                                return
                            self._input_arrived()
                        else:
                            break  # the run is over
                except BaseException as e:
                    self.bulk = False
                    n = len(buf) - start
                    read += n
                    if src.recover(e, n) is None:
                        raise
                    continue
                got = len(buf) - start
                read += got
        except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
            self.input_error = e
        finally:
            self.reader_done = True
            self._input_arrived()

    def _cut_bulk(self) -> None:
        """A run being pulled in by ``list.extend`` ends after its item (the call stops, or
        the receiver waits on each item)."""
        if self.bulk and self.runs is not None:
            self.runs.cut()

    def _input_arrived(self) -> None:
        """New input (or its end) while the receiver may sleep on the output queue. While a
        producer may be idle (fewer batches on their way than producers), it is sent from
        here at once, and the receiver sleeps on, still hearing of each new item: so the next
        item too goes out as it comes, not when a result or the receiver's tick wakes it.
        Otherwise (or if the sender is busy) the receiver is woken to send it."""
        if not self.receiver_waiting or self.abort:
            return
        if (
            self.input_error is None
            and self._producer_idle()
            and self.send_lock.acquire(blocking=False)
        ):
            try:
                sent = self._send_available()
            except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
                self.send_error = e
                sent = False
            finally:
                self.send_lock.release()
            if sent:
                # Its results will wake the receiver. Until then, the next item is ours to
                # send while a producer may still be idle. (A receiver that woke meanwhile
                # finds this flag set: harmless, it sets it afresh before it sleeps again.)
                if self.receiver_waiting:
                    self.attention.set(self._producer_idle() or self.abort)
                return
        self.receiver_waiting = False
        self.attention.set(self.abort)
        self.workers.wake(self.call)

    def _producer_idle(self) -> bool:
        """Whether a producer may be without work: fewer batches on their way (sent, their
        results not received yet) than producers."""
        return self.stats.batches - self.results_in < self.n

    # ----- sending -----

    def _cost(self) -> float:
        """Producer seconds per item that batches are sized by (0: not known yet)."""
        return self.runner._cost_per_item if self.cost is None else self.cost()

    def _blind(self) -> bool:
        """Whether the cost per item is not known yet and every producer has a batch: then
        nothing more is sent until results teach it. (Sent blind, every buffered item went
        as a batch of its own: a fresh pool's first imap over a generator of 300k tiny items
        sent 49k batches, its sender looping on them and never back to its results.)"""
        return self._cost() <= 0 and not self._producer_idle()

    def _batch_size(self) -> int:
        cost = self._cost()
        if cost <= 0:
            return 1
        bs = int(_TARGET_BATCH_S / cost)
        largest = max(self.bytes_per_item, self.runner._out_bytes_per_item)
        if largest > 0:
            bs = min(bs, int(_MAX_BATCH_BYTES / largest))
        return max(1, min(bs, self.max_batch))

    def _window_now(self) -> int:
        """Items allowed in flight: ``window``; with the runner's default window, only as
        many as keep four batches per producer in flight (at least the floor: more only once
        items are known to be cheap, so a slow input is not read far ahead); fewer when
        items or results are large (the items read ahead wait in this process's memory)."""
        window = self.window
        if self.window_floor < window:
            window = min(window, max(self.window_floor, 4 * self.n * self._batch_size()))
        largest = max(self.bytes_per_item, self.runner._out_bytes_per_item)
        if largest <= 0:
            return window
        by_bytes = int(self.max_inflight_bytes / largest)
        return max(1, min(window, by_bytes))

    def _next_items(self) -> Any:
        """The next batch's items (what the window and the buffer allow), or None."""
        if self.seq_data is not None:
            room = self._window_now() - (self.dispatched - self.delivered)
            if room <= 0 and self.dispatched > self.delivered:
                return None
            size = max(1, min(self._batch_size(), room))
            items = self.seq_data[self.pos : self.pos + size]
            if not items:
                self.pos = len(self.seq_data)
                return None
            self.pos += len(items)
            return items
        buf = self.buf
        off = self.buf_off
        n = len(buf) - off
        if n <= 0:
            return None
        end = off + min(n, self._batch_size())
        items = buf[off:end]
        self.buf_off = end
        if not self.runs_compact:
            self._compact_sent()
        return items

    def _compact_sent(self) -> None:
        """Under send_lock: removes the sent prefix of ``buf`` once it is at least half the
        list (moving no more items than were sent since the last removal). buf_off is reset
        first: a thread that reads len(buf) and then buf_off (see _unsent) may overcount,
        never undercount."""
        off = self.buf_off
        if off and 2 * off >= len(self.buf):
            self.buf_off = 0
            del self.buf[:off]

    def _compact(self) -> None:
        """The run reader, between two runs: :meth:`_compact_sent` if the sender is not busy
        (it waits for it only when more than a window of sent items piled up)."""
        if not self.buf_off:
            return
        lock = self.send_lock
        if lock.acquire(timeout=TICK) if self.buf_off > self.window else lock.acquire(False):
            try:
                self._compact_sent()
            finally:
                lock.release()

    def _unsent(self) -> int:
        """Items read but not taken by the sender (a racing sender makes it an overcount,
        never an undercount: len(buf) is read before buf_off)."""
        n = len(self.buf)
        return n - self.buf_off

    def _make_batch(self) -> tuple[int, int, Any] | None:
        """The next batch: ``(seq, count, parts)``, ``count`` the input items it carries."""
        items = self._next_items()
        if items is None:
            return None
        count = len(items)
        pack = self.pack
        if pack is not None:
            items = pack(items)
        first = self.next_item
        try:
            parts = self.codec.dumps((first, items))
        except Exception as e:
            kept = self.runner._drop_unsendable(list(items), first, e)
            if len(kept) != len(items):
                if pack is not None:  # which input items a dropped one stood for is unknown
                    raise EasycoreError("_drop_unsendable must keep a packed batch's length") from e
                self.dropped += count - len(kept)  # under send_lock
                count = len(kept)
            if not kept:
                return None
            items = kept
            parts = self.codec.dumps((first, items))
        nb = wire.nbytes(parts)
        self.bytes_per_item = nb / count
        self.stats.bytes_in += nb
        seq = self.next_batch
        self.next_batch += 1
        self.next_item += count
        if count != len(items):
            self.packed_counts[seq] = count  # its results are fewer than its input items
        return seq, count, parts

    def _send_available(self) -> bool:
        """Sends what is ready, never blocking (call under ``send_lock``); whether it sent."""
        send = self.workers.send
        sent = False
        while not self.abort:
            if self.pending is None:
                if self._blind():
                    return sent
                self.pending = self._make_batch()
                if self.pending is None:
                    return sent
            seq, count, parts = self.pending
            try:
                send(seq, self.kind_work, parts)
            except QueueFull:
                self.in_full = True
                return sent
            self.in_full = False
            leases.after_send()  # input arrays sent by reference become read-only
            if self.dispatched == self.delivered:
                self.last_progress = time.monotonic()
            self.pending = None
            self.dispatched += count
            self.stats.batches += 1
            sent = True
        return sent

    def drained(self) -> bool:
        """Whether every item read was sent and every batch sent came back (in the receiving
        thread, or once it stopped: then nothing is on its way)."""
        return self.pending is None and self._unsent() <= 0 and self.delivered >= self.dispatched

    def _input_over(self) -> bool:
        if self.seq_data is not None:
            return self.pos >= len(self.seq_data) and self.pending is None
        return self.reader_done and self._unsent() <= 0 and self.pending is None

    def _ready_to_send(self) -> bool:
        if self.pending is not None or self.in_full or self._blind():
            return False
        if self.seq_data is not None:
            return False  # sliced by the receiver itself: nothing arrives behind its back
        return self._unsent() > 0

    # ----- receiving -----

    def _check_health(self) -> None:
        if self.error is not None:
            raise self.error
        died = self.workers.dead()
        if died is not None:
            raise died

    def _chunks(self) -> Iterator[tuple[int, list[Any], int]]:
        """Sends and receives until every item is delivered; yields ``(first, results,
        count)`` in delivery order, ``count`` the input items the results stand for
        (``len(results)`` unless batches were packed). The caller counts each chunk with
        :meth:`delivered_chunk`."""
        get_many = self.workers.receive
        next_health = time.monotonic() + TICK
        while True:
            with self.send_lock:
                self._send_available()
            if self.send_error is not None:
                raise self.send_error
            if self.input_error is not None:
                raise self.input_error
            if self.delivered >= self.dispatched and self._input_over():
                # A producer that died during the call is reported, even if the others
                # delivered everything: the runner is not what the user made any more.
                self._check_health()
                return
            if time.monotonic() >= next_health:
                # Results may flow without a pause while a producer is dead: look anyway.
                self._check_health()
                next_health = time.monotonic() + TICK
            if self.abort:
                self._check_health()
                raise RunnerClosedError("the call was aborted")
            if (
                self.reader is None
                and self.it is not None
                and not self.reader_done
                and self._unsent() <= 0
                and self.pending is None
                and self.delivered >= self.dispatched
            ):
                self._read_one()
                continue
            # Sleep on the output queue. While fewer batches are on their way than there are
            # producers, one may run dry: the reader wakes us (or sends) as each item comes.
            # Otherwise the next result wakes us soon, and new input waits for it (every
            # producer has a batch meanwhile), without a check per item read.
            self.receiver_waiting = True
            need = self._producer_idle()
            self.attention.set(need)
            if need:
                self._cut_bulk()  # a run being extended ends after its item
            if (
                self._ready_to_send()
                or self.input_error is not None
                or self.send_error is not None
                or (self.reader_done and self.delivered >= self.dispatched and self._input_over())
            ):
                self.receiver_waiting = False
                self.attention.set(self.abort)
                continue
            idle = self.delivered >= self.dispatched
            wait = TICK
            if self.timeout is not None and not idle:
                wait = max(0.0, min(wait, self.last_progress + self.timeout - time.monotonic()))
            t = time.perf_counter()
            try:
                msgs = get_many(64, timeout=wait)
            except QueueEmpty:
                msgs = None
            except QueueClosed:
                raise RunnerClosedError("the runner was closed during the call") from None
            finally:
                self.receiver_waiting = False
                self.attention.set(self.abort)
            if idle:
                self.stats.input_wait_s += time.perf_counter() - t
            if msgs is None:
                self._check_health()
                if (
                    self.timeout is not None
                    and self.delivered < self.dispatched
                    and time.monotonic() - self.last_progress >= self.timeout
                ):
                    raise self._timeout_error()
                continue
            yield from self._take(msgs)

    def _take(self, msgs: list[Any]) -> list[tuple[int, list[Any], int]]:
        out: list[tuple[int, list[Any], int]] = []
        for seq, kind, parts in msgs:
            t, call = wire.unpack_kind(kind)
            if call != self.call:
                continue  # a result, error or wake-up of an aborted earlier call
            if t == wire.ERROR:
                raise worker_error(self.codec.loads(parts))
            if t != wire.RESULT:
                continue
            self.last_progress = time.monotonic()
            nb = wire.nbytes(parts)
            self.stats.bytes_out += nb
            first, results, wi, busy, wait = self.codec.loads(parts)
            self.results_in += 1
            del parts
            count = self.packed_counts.pop(seq, None) or len(results)
            r = self.runner
            r._out_bytes_per_item = _ema(r._out_bytes_per_item, nb / max(1, count))
            self._learn(wi, busy, wait, count)
            if self.reorder is None:
                out.append((first, results, count))
            else:
                self.reorder.push(seq, (first, results, count))
                out.extend(cast("list[tuple[int, list[Any], int]]", self.reorder.pop_ready()))
        return out

    def _timeout_error(self) -> RunnerTimeoutError:
        view = self.workers.view
        now = time.monotonic_ns()
        stuck = []
        for i in range(self.n):
            base = _producer.STATE_FIELDS * i
            item = view[base + _producer.ITEM]
            if item >= 0 and view[base + _producer.CALL] == self.call:
                stuck.append(
                    (view[base + _producer.SINCE_NS], i, item, view[base + _producer.COUNT])
                )
        in_flight = self.dispatched - self.delivered
        if stuck:
            since, i, item, count = min(stuck)
            proc = self.workers.procs[i]
            dev = self.devices[i]
            which = f"item {item}" if count <= 1 else f"one of items {item}..{item + count - 1}"
            return RunnerTimeoutError(
                f"no result within timeout={self.timeout} s: producer {i} (device {dev!r}, "
                f"pid {proc.pid}) is stuck in producer_work on {which} (its batch started "
                f"{(now - since) / 1e9:.1f} s ago). The runner was closed (its producers were "
                "stopped); call activate() to restart it",
                timeout=self.timeout or 0.0,
                item=item,
                producer=i,
                device=dev,
                pid=proc.pid,
            )
        return RunnerTimeoutError(
            f"no result within timeout={self.timeout} s ({in_flight} items in flight, none "
            "in producer_work: the producers are slow to take or return work). The runner "
            "was closed; call activate() to restart it",
            timeout=self.timeout or 0.0,
        )

    def _learn(self, wi: int, busy: float, wait: float, count: int) -> None:
        prev = self.busy_seen.get(wi)
        self.busy_seen[wi] = busy
        prev_wait = self.wait_seen.get(wi, wait)
        self.wait_seen[wi] = wait
        if prev is None:
            return  # the first report of a producer only sets its baseline
        delta = busy - prev
        self.stats.producer_busy_s[wi] += delta
        self.stats.producer_wait_s[wi] += wait - prev_wait
        r = self.runner
        # A batch's cost includes a fixed part (unpickling, bookkeeping: microseconds) that a
        # batch of few items charges to each item. Weighted by its share of a full batch, the
        # lone item each call starts with no longer shrinks the next batches tenfold.
        share = min(1.0, count / self._batch_size())
        per = max(delta / max(1, count), 1e-9)  # never 0, which means "not known"
        r._cost_per_item = _ema(r._cost_per_item, per, 0.3 * share)

    def delivered_chunk(self, count: int) -> None:
        self.delivered += count
        if self.bar is not None:
            self.bar.update(count)
        self._wake_reader()

    # ----- the two ways to run a call -----

    def run_with_consumer(self) -> Any:
        runner = self.runner
        self._start()
        cfg = copy.deepcopy(runner._cfg)
        result: list[Any] = []
        try:
            consumer = threading.Thread(
                target=self._consume, args=(cfg, result), name="easycore-consumer", daemon=True
            )
            self.consumer = consumer
            consumer.start()
            while consumer.is_alive():
                consumer.join(TICK)
        except BaseException as e:
            self._fail(e)
            raise
        if self.error is not None:
            self._fail(self.error)
            raise self.error
        self._finish()
        return result[0]

    def _consume(self, cfg: Any, result: list[Any]) -> None:
        # Hooks are looked up on the class, as the producers do: a plain function assigned
        # as a hook then works like a staticmethod.
        self.threads.append(threading.current_thread())
        runner = type(self.runner)
        try:
            call_hook("consumer_init", runner.consumer_init, cfg)
            work = runner.consumer_work
            busy = 0.0
            for first, results, _count in self._chunks():  # no pack: count == len(results)
                t = time.perf_counter()
                for i, r in enumerate(results):
                    try:
                        work(cfg, r)
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except BaseException as e:
                        raise hook_error("consumer_work", e, first + i) from e
                busy += time.perf_counter() - t
                self.delivered_chunk(len(results))
            self.stats.consumer_busy_s = busy
            result.append(call_hook("consumer_end", runner.consumer_end, cfg))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            if self.error is None:
                self.error = e
            self._abort()

    def iterate(self) -> Iterator[Any]:
        chunks = self.iterate_chunks()
        try:
            for results in chunks:
                yield from results
        finally:
            chunks.close()

    def iterate_chunks(self) -> Generator[list[Any], None, None]:
        """As :meth:`iterate`, one message's results (a list) at a time: for callers that
        handle results in bulk (the pool routes whole lists to their jobs)."""
        self._start()
        finished = False
        try:
            for _first, results, count in self._chunks():
                self.delivered_chunk(count)
                yield results
            finished = True
        except BaseException as e:
            self._fail(e)
            raise
        finally:
            if finished:
                self._finish()
            elif not self.ended:
                self._fail(None)  # closed early (break, close(), garbage collection)

    def _abort(self) -> None:
        """Tells the reader and the receiver to stop (any thread): the flag they test, a
        run being extended cut after its item, a reader waiting for room woken."""
        self.abort = True
        self.attention.set()
        self._cut_bulk()
        with self.cond:
            self.cond.notify_all()

    def _fail(self, exc: BaseException | None) -> None:
        """Stops the call; closes the runner if a producer died, on Ctrl-C and on timeout."""
        if self.ended:
            return
        self.ended = True
        self._abort()
        if self.consumer is not None and self.consumer is not threading.current_thread():
            # It stops within a tick (unless busy in consumer_work); it must not read the
            # output queue while a shutdown collects the producers' goodbyes.
            self.consumer.join(2.0)
        self._join_reader()
        self._record_stats()
        fatal = isinstance(
            exc, WorkerDiedError | KeyboardInterrupt | SystemExit | RunnerTimeoutError
        )
        try:
            if fatal or self.workers.dead():
                try:
                    self.runner._shutdown(interrupt=True)
                except EasycoreError:
                    pass
            elif not self.workers.closed:
                self.workers.drain_input()
        finally:
            self.runner._end(self)

    def _record_stats(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self._fill_stats(self.stats)
        self.runner.stats = self.stats

    def _fill_stats(self, s: RunnerStats) -> None:
        s.items = self.delivered
        s.wall_s = time.perf_counter() - self.t0
        if not self.workers.closed:
            in_wait, out_wait = self.workers.wait_seconds()
            s.dispatch_wait_s = self.stats.dispatch_wait_s + in_wait - self.in_wait0
            s.consumer_wait_s = out_wait - self.out_wait0

    def stats_now(self) -> RunnerStats:
        """The figures of this call so far (a copy: a running stream's, e.g. the pool's)."""
        s = dataclasses.replace(
            self.stats,
            producer_busy_s=dict(self.stats.producer_busy_s),
            producer_wait_s=dict(self.stats.producer_wait_s),
        )
        self._fill_stats(s)
        return s

    def _join_reader(self) -> None:
        """Waits (a tick at most) for the input thread to end: told to stop, it ends after
        the item being read. Left running, it would also count as a thread in this process
        when the next runner picks its start method (fork only while one thread runs). An
        input blocked for longer is left to end on its own (a daemon thread)."""
        reader = self.reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(TICK)

    def _finish(self) -> None:
        self.ended = True
        self._join_reader()  # done reading: it is only waking the receiver on its way out
        self._record_stats()
        self.runner._end(self)
