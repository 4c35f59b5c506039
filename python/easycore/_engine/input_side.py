"""The input side of one call (:class:`InputSide`, held by
:class:`~easycore._engine.stream.Call`): reading the input on its helper thread, in runs
(``runs.py``) or item by item, within the window; sizing batches by the producers'
measured cost; packing, pickling and sending them through the transport, never blocking.
``stream.py`` holds the receiving side and the call's life.

What the receiving side uses, its whole interface:

* to run the input: :meth:`InputSide.start_reader` (with ``reader.read_runs``, the input
  thread's body), :meth:`~InputSide.send_available` (under ``send_lock``) or
  :meth:`~InputSide.send_ready` (it takes the lock if anything may be ready),
  :meth:`~InputSide.reads_direct` and :meth:`~InputSide.read_and_send` (it reads the input
  itself), :meth:`~InputSide.send_direct` (the pool's caller read them, or other threads
  queue ready work), :meth:`~InputSide.receiver_sleeps` and
  :meth:`~InputSide.receiver_woke` around each wait for results, :meth:`~InputSide.stop`,
  :meth:`~InputSide.join_reader`, :meth:`~InputSide.seal` (before the call ends);
* to account: :meth:`~InputSide.result_received` (one per result message, giving the input
  items it stands for), :meth:`~InputSide.delivered_chunk`, and ``sizing``
  (``batching.Sizing``: the batch size the producers' cost is weighed by);
* to decide: :meth:`~InputSide.input_over`, :meth:`~InputSide.drained`, and the fields
  ``dispatched``, ``delivered``, ``last_progress``, ``input_error``, ``send_error``,
  ``abort``, ``reader``, ``direct_total``, ``injected`` (each written where its comment
  says).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from easycore._engine import leases, wire
from easycore._engine.batching import Sizing
from easycore._engine.host import Learned, StreamSettings
from easycore._engine.lifecycle import TICK
from easycore._engine.probes import (
    DIRECT_AFTER,
    PROBE_FIRST,
    PROBE_INHERITED_S,
    after_probe,
    habit_after,
    trial_over,
)
from easycore._engine.runs import FLAG_ON, Flag, IteratorRuns, RunSource
from easycore._engine.stats import RunnerStats
from easycore._engine.transport import Transport
from easycore.errors import EasycoreError, QueueFull

_SEQUENCES = (range, list, tuple)  # inputs sliced in place: reading them never blocks


class InputSide:
    """Reading and sending for one call (see the module).

    Args:
        data_iter: the call's input.
        workers: the call's transport (``send``, ``wake``, ``out_budget``).
        codec: pickles the batches.
        call: the call's number.
        settings: the runner's stream settings (window, producers).
        learned: the runner's learned figures (read here to size batches).
        stats: the call's statistics (``batches``, ``bytes_in``, ``input_wait_s``).
        keep_sendable: what to send of a batch that does not pickle (or it raises).
        read_ahead, pack, cost, runs: as for :class:`~easycore._engine.stream.Call`.
    """

    def __init__(
        self,
        data_iter: Iterable[Any],
        workers: Transport,
        codec: wire.Codec,
        call: int,
        settings: StreamSettings,
        learned: Learned,
        stats: RunnerStats,
        keep_sendable: Callable[[list[Any], int, Exception], list[Any]],
        read_ahead: bool | None = None,
        pack: Callable[[list[Any]], list[Any]] | None = None,
        cost: Callable[[], float] | None = None,
        runs: RunSource | None = None,
    ) -> None:
        self.workers = workers
        self.codec = codec
        self.call = call
        self.kind_work = wire.pack_kind(wire.WORK, call)
        self.stats = stats
        self.keep_sendable = keep_sendable
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
        ahead = read_ahead is not False
        # Adaptive reading: only for a runner's own iterator input (the pool's feed mixes
        # many jobs' inputs in one stream).
        self.adaptive = read_ahead is None and runs is None and self.it is not None
        if runs is None and self.it is not None and ahead:
            runs = IteratorRuns(self.it)  # a runner's iterator input, read in runs too
        self.runs_compact = runs is not None and self.it is not None and ahead
        self.reader: threading.Thread | None = None
        self.read_ahead = ahead  # False: the receiving thread reads, one item at a time
        # The input thread handed the input over (adaptive): the receiving thread reads it
        # while nothing is in flight; set by the input thread (then parked), cleared by the
        # receiving thread (between two reads) to hand it back. Under cond.
        self.direct = False
        # Set by the receiving thread to ask for the input (adaptive), cleared with direct.
        self.want_direct = False
        self.starved = 0  # the receiving thread's waits for input in a row (adaptive)
        self.direct_reads = 0  # items read by the receiving thread since the hand-over
        self.direct_total = 0  # items read by the receiving thread in this call
        self.injected = 0  # work items other threads queued (send_direct's ``queue``)
        # Adaptive reading's schedule (``probes.py``): direct reads before the input thread
        # tries again (a probe), and when the input was handed over (``reader._hand_over``).
        self.probe_at = PROBE_FIRST
        self.direct_since = 0.0
        self.probe_pace = 0.0  # seconds per item of the last probe interval (0: none yet)
        self.handed_over = False  # the receiving thread read the input itself (once at least)
        self.took_several = False  # more than one item was in flight (the input ran ahead)
        self.learned = learned
        # A call on the runner's habit starts with its input in the receiving thread's
        # hands, on trial until then (time.monotonic; 0: not on trial, or no longer): the
        # input is handed back at the first read or vain wait after it (probes.py). Its
        # input thread starts only then (``deferred``: its body and the call's threads).
        self.trial_until = 0.0
        self.deferred: tuple[Callable[[InputSide], None], list[threading.Thread]] | None = None
        if self.adaptive and learned.probe_habit:
            # The runner's last call was request/response (probes.py): its interval, and the
            # input read by the receiving thread from the start.
            self.probe_at = learned.probe_habit
            now = time.monotonic()
            self.direct = self.want_direct = self.handed_over = True
            self.direct_since = now
            self.trial_until = now + PROBE_INHERITED_S
        # Handed back (a probe) and the input thread has not read an item since: the
        # receiving thread does not ask for the input again until it did (on a loaded
        # machine it would ask before the input thread ran, and an input that turned fast
        # would never be read ahead again). Set by read_and_send, cleared by the input thread.
        self.awaiting_reader = False
        self.reader_done = self.seq_data is not None
        self.pack = pack
        self.runs = runs
        # The reader is inside a list.extend of a run: the receiving thread, wanting each
        # item as it comes, must cut the run (set before the reader looks at attention).
        self.bulk = False
        self.reader_waiting = False
        # While it waits: the delivered count that gives it the room it waits for.
        self.reader_wake_at = 0
        self.receiver_waiting = False
        # receiver_waiting or abort: the reader's one check per item
        self.attention = Flag()
        self.abort = False  # the call stops (any thread, through stop())
        self.cond = threading.Condition()
        self.input_error: BaseException | None = None
        self.send_error: BaseException | None = None
        self.send_lock = threading.Lock()
        self.in_full = False
        self.window = settings.window  # the most items in flight (see Sizing.window_now)
        self.n = len(settings.devices)
        # Results in flight (queued, being consumed, or waiting in the reorder buffer) stay
        # within a bound of the output queue's side budget, however large each result is.
        self.sizing = Sizing(
            settings,
            learned,
            cost,
            leases.max_inflight_bytes(workers.out_budget),
            getattr(workers, "out_q", None),
        )
        self.next_item = 0  # index of the next item to send
        self.next_batch = 0  # sequence number of the next batch (see Call.start)
        self.pending: tuple[int, int, Any] | None = None  # (seq, n_items, parts) unsent
        # Work items queued by other threads behind ``pending`` (see send_direct), one input
        # item each: the next batches (one each), ahead of ``buf``. Under send_lock.
        self.urgent: list[Any] = []
        # The receiving thread ended the call (everything sent came back, the input is over):
        # send_direct takes nothing more. Set under send_lock (see seal).
        self.sealed = False
        # seq -> input items of a sent batch that ``pack`` made into fewer work items (its
        # results, one per work item, stand for that many items); written under send_lock
        # before the batch is sent, removed by the receiving thread when its results come.
        self.packed_counts: dict[int, int] = {}
        self.dispatched = 0  # items sent (under send_lock)
        self.dropped = 0  # items read but never sent (unpicklable, dropped by the runner)
        self.delivered = 0  # items handed out (written by the receiving thread only)
        self.results_in = 0  # result messages of this call received (one per batch sent)
        # when a result last came, or work went out with nothing in flight (the timeout's
        # clock): written by the receiving thread and the sender
        self.last_progress = time.monotonic()

    # ----- the receiving side's interface (besides sending and reading directly) -----

    def start_reader(
        self, body: Callable[[InputSide], None], threads: list[threading.Thread]
    ) -> None:
        """Starts the input thread, ``body(self)`` (``reader.read_runs``), where the input
        is an iterator read ahead, adding it to the call's ``threads`` first (a call its
        input makes on the runner is then seen as one from inside the call); on the
        runner's habit, once the receiving thread hands the input back (:meth:`hand_back`)."""
        if self.it is None or not self.read_ahead:
            return
        if self.direct:
            self.deferred = (body, threads)
            return
        reader = threading.Thread(target=body, args=(self,), name="easycore-input", daemon=True)
        self.reader = reader
        threads.append(reader)
        try:
            reader.start()
        except RuntimeError:
            # Python 3.12 starts no thread once the interpreter exits (its exit hooks, where
            # an executor finishes its pending work, run then): the receiving thread reads
            # the input itself, one item at a time, as with read_ahead=False.
            threads.remove(reader)
            self.reader = None
            self.read_ahead = False

    def receiver_sleeps(self) -> bool:
        """The receiving thread is about to sleep on the output queue: it says so (the
        reader then sends, or wakes it, as each item comes while a producer may be idle) and
        gets True; False (and no sleep): there is something to do first."""
        self.receiver_waiting = True
        if self.adaptive and not self.want_direct:
            self.note_starved()
        # (producer_idle, Flag.set and cut_bulk inline, the flag set only if it changes:
        # a request/response loop with two producers passes here at every round trip)
        need = self.stats.batches - self.results_in < self.n
        attention = self.attention
        if need:
            if not attention:
                attention[:] = FLAG_ON
            if self.bulk and self.runs is not None:
                self.runs.cut()  # a run being extended ends after its item
        elif attention:
            attention[:] = ()
        # Whether there is a batch to send first: not while one waits for room; queued work
        # is; items read and not sent are unless the sender is blind (a sliced sequence is
        # sent by the receiver as it goes: nothing comes behind its back).
        if self.pending is not None or self.in_full:
            ready = False
        elif self.urgent:
            ready = True
        elif self.seq_data is not None or len(self.buf) <= self.buf_off:
            ready = False
        else:
            ready = not self.blind()
        if (
            ready
            or self.input_error is not None
            or self.send_error is not None
            or (self.direct and self.delivered >= self.dispatched and self.reads_direct())
            or (self.reader_done and self.delivered >= self.dispatched and self.input_over())
        ):
            self.receiver_woke()
            return False
        return True

    def receiver_woke(self) -> None:
        """The receiving thread no longer sleeps."""
        self.receiver_waiting = False
        attention = self.attention
        if attention or self.abort:
            attention[:] = FLAG_ON if self.abort else ()  # (Flag.set inline)

    def result_received(self, seq: int, n_results: int) -> int:
        """A result message of batch ``seq`` came with ``n_results`` results: returns the
        input items it stands for."""
        self.results_in += 1
        return self.packed_counts.pop(seq, None) or n_results

    def delivered_chunk(self, count: int) -> None:
        """``count`` input items were handed out: room for the reader."""
        self.delivered += count
        if self.reader_waiting and self.delivered >= self.reader_wake_at:
            with self.cond:
                self.cond.notify_all()

    def stop(self) -> None:
        """Tells the reader and the receiver to stop (any thread): the flag they test, a
        run being extended cut after its item, a reader waiting for room woken."""
        self.abort = True
        self.attention.set()
        self.cut_bulk()
        with self.cond:
            self.cond.notify_all()

    def join_reader(self) -> None:
        """Waits (a tick at most) for the input thread to end: told to stop, it ends after
        the item being read. Left running, it would also count as a thread in this process
        when the next runner picks its start method (fork only while one thread runs). An
        input blocked for longer is left to end on its own (a daemon thread)."""
        reader = self.reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(TICK)

    # ----- reading: in the receiving thread, and what the input thread calls -----

    def read_and_send(self) -> bool:
        """Reads the next input item in the receiving thread (``read_ahead=False``, or while
        the input thread handed the input over: see :meth:`note_starved`) and sends it at
        once, as a batch of its own: whether a batch went out (False: the input ended or
        raised, or the item waits to be sent). Nothing is in flight, so waiting for the item
        here holds no result back, and a request/response loop's round trip takes one pass
        through the receiving loop."""
        t = time.perf_counter()
        if self.buf_off and self.reader is not None:
            # Everything read is sent (see reads_direct), and the input thread, parked,
            # removes no prefix meanwhile: drop the sent items here, so that they are not
            # kept alive until it takes the input back.
            with self.send_lock:
                self.compact_sent()
        try:
            item = next(self.it)  # type: ignore[arg-type]
        except StopIteration:
            self.input_ended()
            return False
        except BaseException as e:  # noqa: BLE001 - raised by the loop, as the reader's are
            self.input_error = e
            self.input_ended()
            return False
        finally:
            self.stats.input_wait_s += time.perf_counter() - t
        self.direct_total += 1
        with self.send_lock:
            if self.pending is None and not self.urgent and not self.abort:
                # The buffer is all sent (see reads_direct): the item's batch is the next.
                pack = self.pack
                self.pending = self.encode(
                    [item] if pack is None else pack([item]), 1, pack is not None
                )
                sent = self.pending is not None and self.send_pending(self.workers.send)
            else:  # queued work goes first (or the call stops: nothing is sent)
                self.buf.append(item)
                sent = self.send_available()
        if self.direct:
            reads = self.direct_reads = self.direct_reads + 1
            if reads >= self.probe_at or (self.trial_until and trial_over(reads, self.trial_until)):
                # Try reading ahead again, while this item is in flight (sent first: what
                # the input thread reads next goes behind it): an input that now runs ahead
                # gets its batches back; a request/response one is handed back after its
                # next item, and tried again later (probes.py).
                self.hand_back()
        return sent

    def hand_back(self) -> None:
        """The receiving thread hands the input back to the input thread (a probe, or the
        end of a trial), started now if the call began on the runner's habit; it asks for
        the input again once that thread read an item of it. The next interval follows from
        this one's pace; a trial cut short leaves the inherited one."""
        self.probe_at, self.probe_pace = after_probe(
            self.direct_reads,
            time.monotonic() - self.direct_since,
            self.probe_at if self.trial_until else 0,
        )
        self.trial_until = 0.0
        self.starved = DIRECT_AFTER - 1  # still request/response: ask at once
        with self.cond:
            self.awaiting_reader = True
            self.want_direct = False
            self.direct = False
            self.cond.notify_all()
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            self.start_reader(*deferred)

    def waited_on_trial(self) -> None:
        """The receiving thread waited in vain for a result with an item it read itself in
        flight: past the trial, it hands the input back at once (an input that runs ahead,
        of costly items, is read ahead again)."""
        if (
            self.direct
            and self.trial_until
            and self.delivered < self.dispatched
            and time.monotonic() >= self.trial_until
        ):
            self.hand_back()

    def reader_read(self) -> None:
        """The input thread read an item of the input handed back to it: the receiving
        thread may ask for it again."""
        self.awaiting_reader = False

    def note_starved(self) -> None:
        """The receiving thread, about to wait (adaptive reading): it counts the waits for
        input with nothing in flight and nothing buffered, once a result came (before, the
        input may not have been read at all), and after a few in a row (never
        more than one item in flight between them) asks the input thread for the input
        (``want_direct``: the input thread hands it over after the item it is reading).
        A fast input, with many items in flight, never gets there."""
        if self.dispatched - self.delivered > 1:
            self.starved = 0  # it ran ahead
            self.took_several = True
        elif (
            self.delivered >= self.dispatched
            and self.delivered  # (not at the call's start: its input may not have been read)
            and not self.reader_done
            and not self.awaiting_reader
            and self.pending is None
            and not self.urgent
            and self.unsent() <= 0
        ):
            self.starved += 1
            if self.starved >= DIRECT_AFTER:
                self.want_direct = True
                self.cut_bulk()

    def leave_habit(self) -> None:
        """The call ends: how the runner's next call starts its adaptive reading
        (``learned.probe_habit``, see probes.py): where the receiving thread read this
        input, at its next probe interval; where the input ran ahead, as usual; else (a
        call too short to tell) as this one did."""
        if self.adaptive:
            learned = self.learned
            learned.probe_habit = habit_after(
                learned.probe_habit,
                self.handed_over,
                self.took_several,
                self.probe_at,
                self.probe_pace,
            )

    def input_ended(self) -> None:
        """The receiving thread saw the input end: a parked input thread ends too."""
        self.reader_done = True
        if self.reader is not None:
            with self.cond:
                self.cond.notify_all()

    def reads_direct(self) -> bool:
        """Whether the receiving thread reads the next item itself now: it reads the input
        (``read_ahead=False``, or handed over), nothing is in flight, nothing is waiting to
        be sent, and the input is not over."""
        return (
            (self.reader is None or self.direct)
            and self.it is not None
            and not self.reader_done
            and self.pending is None
            and not self.urgent
            and self.delivered >= self.dispatched
            and self.unsent() <= 0
        )

    def cut_bulk(self) -> None:
        """A run being pulled in by ``list.extend`` ends after its item (the call stops, or
        the receiver waits on each item)."""
        if self.bulk and self.runs is not None:
            self.runs.cut()

    def input_arrived(self) -> None:
        """New input (or its end) while the receiver may sleep on the output queue. While a
        producer may be idle (fewer batches on their way than producers), it is sent from
        here at once, and the receiver sleeps on, still hearing of each new item: so the next
        item too goes out as it comes, not when a result or the receiver's tick wakes it.
        Otherwise (or if the sender is busy) the receiver is woken to send it."""
        if not self.receiver_waiting or self.abort:
            return
        if (
            self.input_error is None
            and self.producer_idle()
            and self.send_lock.acquire(blocking=False)
        ):
            try:
                sent = self.send_available()
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
                    self.attention.set(self.producer_idle() or self.abort)
                return
        self.receiver_waiting = False
        if self.abort or self.attention:
            self.attention.set(self.abort)
        self.workers.wake(self.call)

    def producer_idle(self) -> bool:
        """Whether a producer may be without work: fewer batches on their way (sent, their
        results not received yet) than producers."""
        return self.stats.batches - self.results_in < self.n

    # ----- sending -----

    def blind(self) -> bool:
        """Whether the cost per item is not known yet and every producer has a batch: then
        nothing more is sent until results teach it. (Sent blind, every buffered item went
        as a batch of its own: a fresh pool's first imap over a generator of 300k tiny items
        sent 49k batches, its sender looping on them and never back to its results.)"""
        return self.sizing.cost_now() <= 0 and not self.producer_idle()

    def next_items(self) -> Any:
        """The next batch's items (what the window and the buffer allow), or None."""
        if self.seq_data is not None:
            room = self.sizing.window_now() - (self.dispatched - self.delivered)
            if room <= 0 and self.dispatched > self.delivered:
                return None
            size = max(1, min(self.sizing.batch_size(), room))
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
        end = off + min(n, self.sizing.batch_size())
        items = buf[off:end]
        self.buf_off = end
        if not self.runs_compact:
            self.compact_sent()
        return items

    def compact_sent(self) -> None:
        """Under send_lock: removes the sent prefix of ``buf`` once it is at least half the
        list (moving no more items than were sent since the last removal). buf_off is reset
        first: a thread that reads len(buf) and then buf_off (see unsent) may overcount,
        never undercount."""
        off = self.buf_off
        if off and 2 * off >= len(self.buf):
            self.buf_off = 0
            del self.buf[:off]

    def compact(self) -> None:
        """The run reader, between two runs: :meth:`compact_sent` if the sender is not busy
        (it waits for it only when more than a window of sent items piled up)."""
        if not self.buf_off:
            return
        lock = self.send_lock
        if lock.acquire(timeout=TICK) if self.buf_off > self.window else lock.acquire(False):
            try:
                self.compact_sent()
            finally:
                lock.release()

    def unsent(self) -> int:
        """Items read but not taken by the sender (a racing sender makes it an overcount,
        never an undercount: len(buf) is read before buf_off)."""
        n = len(self.buf)
        return n - self.buf_off

    def make_batch(self) -> tuple[int, int, Any] | None:
        """The next batch: ``(seq, count, parts)``, ``count`` the input items it carries."""
        items = self.next_items()
        if items is None:
            return None
        count = len(items)
        pack = self.pack
        if pack is not None:
            items = pack(items)
        elif self.sizing.bytes_per_item >= wire.OUT_OF_BAND_MIN:
            items = wire.bytes_apart(items)  # large bytes items out of band
        return self.encode(items, count, pack is not None)

    def encode(self, items: list[Any], count: int, packed: bool) -> tuple[int, int, Any] | None:
        """Under send_lock: ``items`` (standing for ``count`` input items; ``packed``: their
        number must not change) pickled as the next batch, or None if none is sendable."""
        first = self.next_item
        try:
            parts = self.codec.dumps((first, items))
        except Exception as e:
            kept = self.keep_sendable(list(items), first, e)
            if len(kept) != len(items):
                if packed:  # which input items a dropped one stood for is unknown
                    raise EasycoreError("keep_sendable must keep a packed batch's length") from e
                self.dropped += count - len(kept)  # under send_lock
                count = len(kept)
            if not kept:
                return None
            items = kept
            parts = self.codec.dumps((first, items))
        # (One bytes part, the common case: its length, without a frame.)
        nb = len(parts[0]) if len(parts) == 1 and type(parts[0]) is bytes else wire.nbytes(parts)
        self.sizing.bytes_per_item = nb / count
        self.stats.bytes_in += nb
        seq = self.next_batch
        self.next_batch += 1
        self.next_item += count
        if count != len(items):
            self.packed_counts[seq] = count  # its results are fewer than its input items
        return seq, count, parts

    def send_ready(self) -> None:
        """Takes ``send_lock`` and sends what is ready, if anything may be (the receiving
        loop, at each turn: most turns of a request/response loop find nothing)."""
        if self.pending is None and not self.urgent and self.seq_data is None:
            if len(self.buf) <= self.buf_off:
                return
        with self.send_lock:
            self.send_available()

    def send_available(self) -> bool:
        """Sends what is ready, never blocking (call under ``send_lock``); whether it sent."""
        send = self.workers.send
        sent = False
        while not self.abort:
            if self.pending is None:
                urgent = self.urgent
                if not urgent and self.seq_data is None and len(self.buf) <= self.buf_off:
                    return sent  # nothing read waits (the common case between two results)
                if urgent:
                    # One work item a batch (a task, or a chunk of a call sized to a few
                    # ms of work): each may go to another producer.
                    self.pending = self.encode(urgent[:1], 1, True)
                    del urgent[:1]
                    if self.pending is None:
                        continue
                elif self.blind():
                    return sent
                else:
                    self.pending = self.make_batch()
                if self.pending is None:
                    return sent
            if not self.send_pending(send):
                return sent
            sent = True
        return sent

    def send_pending(self, send: Callable[[int, int, list[Any]], None]) -> bool:
        """Under ``send_lock``: sends the pending batch by ``send`` (the transport's), never
        blocking; whether it went (else it stays pending: the producers have enough)."""
        seq, count, parts = self.pending  # type: ignore[misc]
        try:
            send(seq, self.kind_work, parts)
        except QueueFull:
            self.in_full = True
            return False
        self.in_full = False
        leases.after_send()  # input arrays sent by reference become read-only
        if self.dispatched == self.delivered:
            self.last_progress = time.monotonic()
        self.pending = None
        self.dispatched += count
        self.stats.batches += 1
        return True

    def send_direct(self, items: list[Any], now: bool = False, queue: bool = False) -> bool:
        """``items``, work items read and packed outside the input thread (by the pool's
        caller, a request/response loop, or a task submitted while the input thread reads),
        one input item each, become the next batch, which the calling thread sends at once
        if the producers have room (else the receiving loop sends it first); False if
        another batch waits (nothing taken). With ``queue``, they are queued instead
        (``urgent``: a batch each, behind a waiting one, ahead of what the input thread
        read; sent by whichever thread sends next, the receiving one woken for it, or by
        the calling thread with ``now``).
        False too once the call stops or ended (nothing taken)."""
        with self.send_lock:
            if self.abort or self.sealed:
                return False
            if queue:
                self.urgent.extend(items)
                self.injected += len(items)
                if now:
                    try:
                        self.send_available()
                    except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
                        self.send_error = e  # (the items are taken: not to be sent again)
                queued = (
                    self.pending is not None or bool(self.urgent) or self.send_error is not None
                )
            elif self.pending is not None or self.urgent:
                return False
            else:
                queued = False
                n = len(items)
                try:
                    parts = self.codec.dumps((self.next_item, items))
                except Exception:  # noqa: BLE001 - encode keeps what pickles, and says why
                    batch = self.encode(items, n, True)
                    if batch is not None:
                        self.pending = batch
                        self.direct_total += n
                        self.send_pending(self.workers.send)
                else:
                    # (encode's and send_pending's steps, inline: a request/response loop
                    # sends a batch like this at every round trip, where each frame costs.)
                    p0 = parts[0]
                    nb = len(p0) if len(parts) == 1 and type(p0) is bytes else wire.nbytes(parts)
                    self.sizing.bytes_per_item = nb / n
                    self.stats.bytes_in += nb
                    seq = self.next_batch
                    self.next_batch = seq + 1
                    self.next_item += n
                    self.direct_total += n
                    try:
                        self.workers.send(seq, self.kind_work, parts)
                    except QueueFull:
                        self.in_full = True
                        self.pending = (seq, n, parts)  # the receiving loop sends it
                    else:
                        self.in_full = False
                        leases.after_send()  # input arrays sent by reference: read-only
                        if self.dispatched == self.delivered:
                            self.last_progress = time.monotonic()
                        self.dispatched += n
                        self.stats.batches += 1
        if queued and self.receiver_waiting:
            self.input_arrived()  # the receiving thread sends them (or this thread, now)
        return True

    def drained(self) -> bool:
        """Whether every item read was sent and every batch sent came back (in the receiving
        thread, or once it stopped: then nothing is on its way)."""
        return (
            self.pending is None
            and not self.urgent
            and len(self.buf) <= self.buf_off  # (unsent(), inline: once a round trip)
            and self.delivered >= self.dispatched
        )

    def seal(self) -> bool:
        """The receiving thread is about to end the call (everything sent came back and
        :meth:`input_over`): whether it may, asked again under ``send_lock``, after which
        :meth:`send_direct` takes nothing more (False: another thread queued work
        meanwhile)."""
        with self.send_lock:
            if not self.input_over():
                return False
            self.sealed = True
        return True

    def input_over(self) -> bool:
        if self.pending is not None or self.urgent:
            return False
        if self.seq_data is not None:
            return self.pos >= len(self.seq_data)
        return self.reader_done and self.unsent() <= 0
