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
  the receiver with a ``WAKE`` message on the output queue. An input that behaves as a
  request/response loop (each item comes only once nothing is in flight) is handed to the
  receiving thread, which then reads it itself whenever nothing is in flight (no thread
  hand-off per round trip); the reader takes it back now and then, and keeps it as soon as
  the input runs ahead again (``read_ahead=`` True or False fixes either way).
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
import operator
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from easycore._core import ReorderBuffer
from easycore._engine import producer as _producer
from easycore._engine import wire
from easycore._engine.input_side import _PROBE_FIRST, InputOwner, InputSide, RunSource, _Flag
from easycore._engine.lifecycle import TICK
from easycore._engine.reports import call_hook, hook_error, worker_error
from easycore._engine.runs import IteratorRuns
from easycore._engine.stats import RunnerStats
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
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


class RunnerLike(InputOwner, Protocol):
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


_SEQUENCES = (range, list, tuple)  # inputs sliced in place: reading them never blocks


def _ema(prev: float, x: float, weight: float = 0.3) -> float:
    """Running average of a figure the runner learns across calls (0: none learned yet)."""
    return x if prev <= 0 else (1.0 - weight) * prev + weight * x


def progress_bar(progress: Any, total: int | None, desc: str) -> Any:
    """A tqdm bar for ``progress=``: True, or a dict of ``tqdm.tqdm`` keyword arguments
    (``desc``, ``total``, ``leave``, ``position``, ``unit``…) that override the defaults
    (``total``: the input's length when known; ``desc``: the runner's or pool's class)."""
    import tqdm

    tqdm.tqdm.monitor_interval = 0  # no monitor thread (it would make fork unsafe)
    options: dict[str, Any] = {"total": total, "unit": "item", "desc": desc}
    if isinstance(progress, dict):
        options.update(progress)
    return tqdm.tqdm(**options)


class Call(InputSide):
    """The state of one call: reading, sending, receiving, ordering, accounting, clean-up."""

    runner: RunnerLike

    def __init__(
        self,
        runner: RunnerLike,
        data_iter: Iterable[Any],
        progress: bool | dict[str, Any],
        timeout: float | None,
        is_imap: bool,
        read_ahead: bool | None = None,
        pack: Callable[[list[Any]], list[Any]] | None = None,
        cost: Callable[[], float] | None = None,
        runs: RunSource | None = None,
    ) -> None:
        """``read_ahead``: True reads an iterator input in the input thread, False in the
        receiving thread (one item, when none is in flight), None (the default) adapts:
        the input thread hands a request/response input over (see the module). ``pack``
        (optional) turns each batch's items into what is sent: fewer work items,
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
        self.probe_at = _PROBE_FIRST  # direct reads before the input thread tries again
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
            producer_items={i: 0 for i in range(self.n)},
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
            self.bar = progress_bar(self.progress, self.total, type(self.runner).__name__)
        if self.it is not None and self.read_ahead:
            self.reader = threading.Thread(
                target=self._read_runs, name="easycore-input", daemon=True
            )
            self.threads.append(self.reader)
            self.reader.start()

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
            if self._reads_direct():
                self._read_one()
                continue
            # Sleep on the output queue. While fewer batches are on their way than there are
            # producers, one may run dry: the reader wakes us (or sends) as each item comes.
            # Otherwise the next result wakes us soon, and new input waits for it (every
            # producer has a batch meanwhile), without a check per item read.
            self.receiver_waiting = True
            if self.adaptive and not self.want_direct:
                self._note_starved()
            need = self._producer_idle()
            self.attention.set(need)
            if need:
                self._cut_bulk()  # a run being extended ends after its item
            if (
                self._ready_to_send()
                or self.input_error is not None
                or self.send_error is not None
                or (self.direct and self._reads_direct())
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
            # Each chunk leaves this frame as it is yielded: results delivered must not stay
            # referenced here (their segments held) while the next get_many waits.
            ready = self._take(msgs)
            msgs = None
            ready.reverse()
            while ready:
                yield ready.pop()

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
            done = self.stats.producer_items
            done[wi] = done.get(wi, 0) + count
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
            perf_counter = time.perf_counter
            for first, results, _count in self._chunks():  # no pack: count == len(results)
                t = perf_counter()
                # No per-item index: the list iterator's length hint says which item failed.
                it = iter(results)
                try:
                    for r in it:
                        work(cfg, r)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as e:
                    i = len(results) - operator.length_hint(it) - 1
                    raise hook_error("consumer_work", e, first + i) from e
                busy += perf_counter() - t
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
        s.direct_items = self.direct_total
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
            producer_items=dict(self.stats.producer_items),
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
