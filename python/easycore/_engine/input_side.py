"""The input side of one call (:class:`~easycore._engine.stream.Call` extends it): reading
the input on its helper thread, in runs (``runs.py``) or item by item, within the window;
sizing batches by the producers' measured cost; packing, pickling and sending them through
the transport, never blocking. ``stream.py`` holds the receiving side and the call's life.

The state is declared here and set by ``Call.__init__``; the thread that writes each field
is said beside it there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from easycore._engine import leases, wire
from easycore._engine.lifecycle import TICK
from easycore._engine.stats import RunnerStats
from easycore._engine.transport import Transport
from easycore.errors import EasycoreError, QueueFull

_TARGET_BATCH_S = 0.004  # producer work per message the batching aims at
# Adaptive reading: after the receiving thread waited this many times in a row for input with
# nothing in flight (never more than one item in flight between: a request/response input),
# it asks the input thread for the input; after this many items read there, it hands the
# input back (the interval doubles each time the input proves request/response still).
_DIRECT_AFTER = 4
_PROBE_FIRST, _PROBE_LAST = 16, 1024
_MAX_BATCH_BYTES = 1 << 20  # do not grow batches of large items past this
_CACHED_INFLIGHT_BYTES = 48 << 20  # large items in flight: about this many bytes (see _window_now)
_CACHED_MIN_PER_PRODUCER = 8  # ... but at least this many items per producer


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


class InputOwner(Protocol):
    """What the input side uses of its runner: the figures it learns across calls (the
    stream writes them) and what to do with input that does not pickle."""

    _cost_per_item: float  # producer seconds per item
    _out_bytes_per_item: float  # pickled result bytes per item

    def _drop_unsendable(self, items: list[Any], first: int, error: Exception) -> list[Any]:
        """The items of a batch to send anyway (the others travel as None), or raises."""


class InputSide:
    """Reading and sending (see the module)."""

    runner: InputOwner
    workers: Transport
    codec: wire.Codec
    call: int
    kind_work: int
    seq_data: Sequence[Any] | None
    it: Iterator[Any] | None
    pos: int
    buf: list[Any]
    buf_off: int
    runs_compact: bool
    reader: threading.Thread | None
    read_ahead: bool
    adaptive: bool
    direct: bool
    want_direct: bool
    starved: int
    direct_reads: int
    direct_total: int
    probe_at: int
    reader_done: bool
    pack: Callable[[list[Any]], list[Any]] | None
    cost: Callable[[], float] | None
    runs: RunSource | None
    bulk: bool
    reader_waiting: bool
    receiver_waiting: bool
    attention: _Flag
    input_error: BaseException | None
    send_error: BaseException | None
    send_lock: threading.Lock
    in_full: bool
    window: int
    window_floor: int
    n: int
    max_batch: int
    next_item: int
    next_batch: int
    pending: tuple[int, int, Any] | None
    packed_counts: dict[int, int]
    dispatched: int
    dropped: int
    delivered: int
    results_in: int
    bytes_per_item: float
    max_inflight_bytes: int
    abort: bool
    cond: threading.Condition
    last_progress: float
    stats: RunnerStats

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
        """The next input item, read in the receiving thread (``read_ahead=False``, or while
        the input thread handed the input over: see :meth:`_hand_over`). Nothing is in
        flight, so waiting for it here holds no result back."""
        t = time.perf_counter()
        if self.buf_off and self.reader is not None:
            # Everything read is sent (see _reads_direct), and the input thread, parked,
            # removes no prefix meanwhile: drop the sent items here, so that they are not
            # kept alive until it takes the input back.
            with self.send_lock:
                self._compact_sent()
        try:
            self.buf.append(next(self.it))  # type: ignore[arg-type]
        except StopIteration:
            self._input_ended()
        except BaseException as e:  # noqa: BLE001 - raised by the loop, as the reader's are
            self.input_error = e
            self._input_ended()
        else:
            self.direct_total += 1
            if self.direct:
                self.direct_reads += 1
                if self.direct_reads >= self.probe_at:
                    # Try reading ahead again, while this item is in flight: an input that
                    # now runs ahead gets its batches back; a request/response one is
                    # handed back after its next item, and tried again twice as late.
                    self.probe_at = min(2 * self.probe_at, _PROBE_LAST)
                    self.starved = _DIRECT_AFTER - 1  # still request/response: ask at once
                    with self.cond:
                        self.want_direct = False
                        self.direct = False
                        self.cond.notify_all()
        self.stats.input_wait_s += time.perf_counter() - t

    def _note_starved(self) -> None:
        """The receiving thread, about to wait (adaptive reading): it counts the waits for
        input with nothing in flight and nothing buffered, and after a few in a row (never
        more than one item in flight between them) asks the input thread for the input
        (``want_direct``: the input thread hands it over after the item it is reading).
        A fast input, with many items in flight, never gets there."""
        if self.dispatched - self.delivered > 1:
            self.starved = 0  # it ran ahead
        elif (
            self.delivered >= self.dispatched
            and not self.reader_done
            and self.pending is None
            and self._unsent() <= 0
        ):
            self.starved += 1
            if self.starved >= _DIRECT_AFTER:
                self.want_direct = True
                self._cut_bulk()

    def _input_ended(self) -> None:
        """The receiving thread saw the input end: a parked input thread ends too."""
        self.reader_done = True
        if self.reader is not None:
            with self.cond:
                self.cond.notify_all()

    def _reads_direct(self) -> bool:
        """Whether the receiving thread reads the next item itself now: it reads the input
        (``read_ahead=False``, or handed over), nothing is in flight, nothing is waiting to
        be sent, and the input is not over."""
        return (
            (self.reader is None or self.direct)
            and self.it is not None
            and not self.reader_done
            and self.pending is None
            and self.delivered >= self.dispatched
            and self._unsent() <= 0
        )

    def _hand_over(self) -> bool:
        """The input thread, adaptive reading: the receiving thread asked for the input (it
        behaved as a request/response loop: see :meth:`_note_starved`), so it reads it from
        now on, whenever nothing is in flight (no hand-off through this thread for each
        item: a thread switch or two per round trip). This thread waits until the
        receiving thread hands it back (see :meth:`_read_one`); False: the call or the
        input is over meanwhile."""
        with self.cond:
            self.direct = True
            self.direct_reads = 0
            if self.receiver_waiting:
                self.workers.wake(self.call)  # it may sleep with nothing in flight
            while self.direct and not self.abort and not self.reader_done:
                self.cond.wait(TICK)
        return not (self.abort or self.reader_done)

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
                room = self._wait_for_room(read + self.direct_total)
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
                    while not self.want_direct:  # (it then asks for the input)
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
                            if self.want_direct:
                                break  # the receiving thread asks for the input
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
                if self.want_direct:
                    if not self._hand_over():
                        break
                    got = None  # the receiving thread read meanwhile
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
        # Large items: about a cache's worth in flight, not the whole budget (at least a few
        # per producer): the segments they travel in are then written and read while still
        # cached. With the whole budget in flight, 1 MiB results took 191 MiB of segments
        # in turn and came 1.5x slower (2-core VM, 32 MiB L3).
        cached = max(int(_CACHED_INFLIGHT_BYTES / largest), _CACHED_MIN_PER_PRODUCER * self.n)
        # And no more than the output pool has segments for (none: Ray's transport).
        out_q = getattr(self.workers, "out_q", None)
        pooled = leases.results_in_flight(out_q, int(largest), self.n) or window
        return max(1, min(window, by_bytes, cached, pooled))

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
