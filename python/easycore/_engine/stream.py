"""One call of a runner (or the pool's one stream): receiving, ordering, the consumer hooks,
accounting and clean-up (:class:`Call`). Its input side (reading, batching, sending) is the
:class:`~easycore._engine.input_side.InputSide` it holds; what it uses of its runner is the
:class:`~easycore._engine.host.StreamHost` the runner made for it.

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
  raises, or an abandoned ``imap``. One call runs at a time (``host.CallGate``).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, cast

from easycore._core import ReorderBuffer
from easycore._engine import reader, wire
from easycore._engine.host import Learned, StreamHost, StreamSettings, progress_bar
from easycore._engine.input_side import InputSide
from easycore._engine.insights import merge_slow, started
from easycore._engine.lifecycle import TICK
from easycore._engine.probes import PROBE_INHERITED_S
from easycore._engine.reports import call_hook, hook_error, safe_str, worker_error
from easycore._engine.runs import Flag, RunSource
from easycore._engine.stats import RunnerStats
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    RunnerClosedError,
    RunnerTimeoutError,
    SerializationError,
    WorkerDiedError,
)

__all__ = [
    "Call",
    "Learned",
    "StreamHost",
    "StreamSettings",
    "WaitInterrupted",
    "progress_bar",
]


class WaitInterrupted(KeyboardInterrupt):
    """Ctrl-C while :meth:`Call.exchange` waited for results: nothing was received, so the
    call goes on (its receiving loop takes it up) unless the caller ends it."""


class Call:
    """The state of one call: receiving, ordering, accounting, clean-up; its input side in
    :attr:`input`."""

    def __init__(
        self,
        host: StreamHost,
        data_iter: Iterable[Any],
        progress: bool | dict[str, Any],
        timeout: float | None,
        is_imap: bool,
        read_ahead: bool | None = None,
        pack: Callable[[list[Any]], list[Any]] | None = None,
        cost: Callable[[], float] | None = None,
        runs: RunSource | None = None,
    ) -> None:
        """``host``: what the call uses of its runner (made by the runner for this call).
        ``read_ahead``: True reads an iterator input in the input thread, False in the
        receiving thread (one item, when none is in flight), None (the default) adapts:
        the input thread hands a request/response input over (see the module). ``pack``
        (optional) turns each batch's items into what is sent: fewer work items,
        each standing for a run of input items (one result each; the call counts input
        items, so it keeps each such batch's count in ``packed_counts``);
        ``cost`` (optional) gives the producers' seconds per item that batches are sized by,
        instead of the runner's figure learned per item sent (the pool sends single items
        and whole chunks in one stream: a chunk's cost would shrink the batches of single
        items a thousandfold); ``runs`` (optional) is the input read run by run (the pool's
        feed, see :class:`~easycore._engine.runs.RunSource`): each run is pulled in with one
        ``list.extend``, not a Python loop per item, unless the receiving thread waits on
        each item, and survives an error of one run if the source recovers from it."""
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"timeout must be positive or None, got {timeout!r}")
        self.host = host
        self.workers = host.workers
        settings = host.settings
        self.codec = settings.codec()
        self.call = host.number
        self.learned = host.learned
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
        self.devices = settings.devices
        self.ordered = settings.ordered
        self.n = len(settings.devices)
        self.stats = RunnerStats(
            producer_busy_s={i: 0.0 for i in range(self.n)},
            producer_wait_s={i: 0.0 for i in range(self.n)},
            producer_items={i: 0 for i in range(self.n)},
            producer_start_s=started(self.workers, "start_s"),
            producer_init_s=started(self.workers, "init_s"),
        )
        self.input = InputSide(
            data_iter,
            self.workers,
            self.codec,
            self.call,
            settings,
            host.learned,
            self.stats,
            host.keep_sendable,
            read_ahead=read_ahead,
            pack=pack,
            cost=cost,
            runs=runs,
        )
        self.reorder: ReorderBuffer | None = None  # an ordered runner's, taken in _start
        # The receiving loop's chunks taken from messages and not yet yielded (it yields one
        # at a time): exchange hands them out before it takes new messages.
        self.held: list[tuple[int, list[Any], int]] = []
        # Per producer (by position): ``[busy, wait]`` as counted into ``stats`` so far, then
        # ``[busy, wait]`` as it last reported them (the cumulative seconds of that process,
        # sent with each result message). A message only stores its figures (in the receiving
        # thread; a request/response loop pays it every round trip, where each object touched
        # after the worker ran on the same core is a cache miss); the difference goes into
        # ``stats`` when the producer is replaced and when the call's figures are read
        # (:meth:`_fold_reports`, :meth:`stats_now`).
        self.reports: dict[int, list[float]] = {}
        self.error: BaseException | None = None
        self.progress = progress
        self.bar: Any = None  # a tqdm bar (progress=True)
        self.t0 = 0.0
        self.in_wait0 = 0.0
        self.out_wait0 = 0.0
        self.ended = False
        # The thread that runs the hooks (run_with_consumer), and the event set once they
        # are over (its job, not the thread, ends: consumer_thread.py).
        self.consumer: threading.Thread | None = None
        self.consumer_done: threading.Event | None = None

    # ----- what the pool's stream reads of its call -----

    @property
    def abort(self) -> bool:
        """Whether the call was told to stop (setting it tells the input side too)."""
        return self.input.abort

    @abort.setter
    def abort(self, value: bool) -> None:
        self.input.abort = value

    @property
    def attention(self) -> Flag:
        """The flag the input thread tests per item (set it to have it look)."""
        return self.input.attention

    @property
    def reader(self) -> threading.Thread | None:
        """The input thread, if one was started."""
        return self.input.reader

    @property
    def delivered(self) -> int:
        """Input items handed out so far."""
        return self.input.delivered

    @property
    def max_inflight_bytes(self) -> int:
        """The most bytes of results in flight."""
        return self.input.sizing.max_inflight_bytes

    def drained(self) -> bool:
        """Whether every item read was sent and came back (see ``InputSide.drained``)."""
        return self.input.drained()

    def compact(self) -> None:
        """Drops the sent input from the input side's buffer (the pool, between streams)."""
        self.input.compact()

    def stop(self) -> None:
        """Tells the reader and the receiver to stop (any thread)."""
        self.input.stop()

    def _start(self) -> None:
        """Takes the runner (one call at a time) and starts the clocks and the reader."""
        self.host.gate.begin(self, self.timeout)
        inp = self.input
        if self.ordered:
            # Only once the call owns the runner: the buffer may be the last call's, reused
            # (two calls made at once from two threads must not share it).
            self.reorder = self.host.reorder_buffer(inp.window)
            inp.next_batch = self.reorder.next_seq  # where the buffer expects the next one
        self.threads.append(threading.current_thread())
        self.t0 = time.perf_counter()
        inp.last_progress = time.monotonic()
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
            self.bar = progress_bar(self.progress, self.total, self.host.name)
        inp.start_reader(reader.read_runs, self.threads)

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
        results_waiting = self.workers.results_waiting
        inp = self.input
        next_health = time.monotonic() + TICK
        while True:
            inp.send_ready()
            if inp.send_error is not None:
                raise inp.send_error
            if inp.input_error is not None:
                raise inp.input_error
            if inp.delivered >= inp.dispatched and inp.input_over() and inp.seal():
                # A producer that died during the call is reported, even if the others
                # delivered everything: the runner is not what the user made any more.
                self._check_health()
                return
            if time.monotonic() >= next_health:
                # Results may flow without a pause while a producer is dead: look anyway.
                self._check_health()
                next_health = time.monotonic() + TICK
            if inp.abort:
                self._check_health()
                raise RunnerClosedError("the call was aborted")
            direct = inp.reads_direct()
            if direct and not inp.read_and_send():
                continue  # the input ended or raised: the checks above say what follows
            # Sleep on the output queue. While fewer batches are on their way than there are
            # producers, one may run dry: the reader wakes us (or sends) as each item comes.
            # Otherwise the next result wakes us soon, and new input waits for it (every
            # producer has a batch meanwhile), without a check per item read. A result
            # already there after a direct read (a producer that shares this thread's core
            # ran while it sent) is taken without saying so first.
            if not (direct and results_waiting()) and not inp.receiver_sleeps():
                continue
            idle = inp.delivered >= inp.dispatched
            wait = PROBE_INHERITED_S if inp.trial_until else TICK  # (see waited_on_trial)
            if self.timeout is not None and not idle:
                wait = max(0.0, min(wait, inp.last_progress + self.timeout - time.monotonic()))
            t = time.perf_counter()
            try:
                msgs = get_many(64, timeout=wait)
            except QueueEmpty:
                msgs = None
            except QueueClosed:
                raise RunnerClosedError("the runner was closed during the call") from None
            finally:
                inp.receiver_woke()
            if idle:
                self.stats.input_wait_s += time.perf_counter() - t
            if msgs is None:
                if inp.trial_until:
                    inp.waited_on_trial()
                self._check_health()
                if (
                    self.timeout is not None
                    and inp.delivered < inp.dispatched
                    and time.monotonic() - inp.last_progress >= self.timeout
                ):
                    raise self._timeout_error()
                continue
            # Each chunk leaves this frame as it is yielded: results delivered must not stay
            # referenced here (their segments held) while the next get_many waits.
            ready = self._take(msgs)
            msgs = None
            ready.reverse()
            self.held = ready
            while ready:
                yield ready.pop()

    def exchange(self, wait: float, loop: Generator[list[Any], None, None]) -> list[list[Any]]:
        """One step of the receiving loop for a thread that holds the stream while the loop
        ``loop`` (this call's :meth:`iterate_chunks`) is suspended between two messages,
        with nothing else to do (the pool's caller that holds the stream): sends the batch
        that ``InputSide.send_direct`` left pending and input read meanwhile (if any), waits
        up to ``wait`` seconds for result messages and returns their results, one list per
        message, each counted as delivered. ``[]``: none came (a wake-up, or the wait ran
        out). Where the loop has other work first (an error to raise, an ordered call, the
        call stopped, results it took from a message and has not yielded yet), the loop
        itself runs one step instead (its next message's results, in a list); an error of
        this step is thrown into the loop, which ends the call as for its own errors and
        raises it (StopIteration: the loop ended).

        Raises:
            WaitInterrupted: Ctrl-C while it waited: nothing was taken, the call goes on
                unless its caller ends it.
        """
        inp = self.input
        if self.reorder is not None or inp.abort or self.held:
            return [next(loop)]
        # (Each step here runs at every round trip of a request/response loop, where a
        # Python frame costs about 0.1 µs on a core shared with the worker: no frame that
        # only forwards a call.)
        try:
            # (send_ready's own first look, inline: a round trip's send left nothing behind.)
            if (
                inp.pending is not None
                or inp.urgent
                or inp.seq_data is not None
                or len(inp.buf) > inp.buf_off
            ):
                inp.send_ready()
            # (receiver_sleeps says False, and no sleep, on a send or input error too.) Results
            # already there (the worker shared this thread's core while it sent) are taken
            # without saying first that it sleeps.
            if (
                inp.send_error is None
                and inp.input_error is None
                and self.workers.results_waiting()
            ) or inp.receiver_sleeps():
                try:
                    msgs = self.workers.receive(64, timeout=wait)
                except (QueueEmpty, QueueClosed):
                    return []  # the loop looks at the producers' health, or the queue closed
                except KeyboardInterrupt:
                    raise WaitInterrupted from None
                finally:
                    inp.receiver_woke()
                out: list[list[Any]] = []
                bar = self.bar
                for _first, results, count in self._take(msgs):
                    inp.delivered_chunk(count)
                    if bar is not None:
                        bar.update(count)
                    out.append(results)
                return out
        except WaitInterrupted:
            raise
        except BaseException as e:  # noqa: BLE001 - the loop ends the call and raises it
            return [loop.throw(e)]
        return [next(loop)]

    def wake_receiver(self) -> None:
        """Wakes the thread waiting for this call's results (in :meth:`exchange`, or the
        receiving loop) with a ``WAKE`` message, from any thread; never blocks (a full
        output queue has messages for it anyway)."""
        self.workers.wake(self.call, timeout=0.0)

    def _take(self, msgs: list[Any]) -> list[tuple[int, list[Any], int]]:
        out: list[tuple[int, list[Any], int]] = []
        inp = self.input
        learned = self.learned
        stats = self.stats
        done = stats.producer_items
        me = self.call
        loads = self.codec.loads
        for seq, kind, parts in msgs:
            t, call = kind & 0xFF, kind >> 8  # wire.unpack_kind, inline: a frame less
            if call != me:
                if call == 0 and t != wire.WAKE:
                    # A producer that retires, or its replacement (see retire.py).
                    self.workers.control(seq, kind, parts)
                continue  # a result, error or wake-up of an aborted earlier call
            if t == wire.ERROR:
                raise worker_error(loads(parts))
            if t != wire.RESULT:
                continue
            inp.last_progress = time.monotonic()
            # (One bytes part, the common case: its length, without a frame.)
            if len(parts) == 1 and type(p0 := parts[0]) is bytes:
                nb = len(p0)
            else:
                nb = wire.nbytes(parts)
            stats.bytes_out += nb
            try:
                first, results, wi, busy, wait, slow = loads(parts)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit too: the call's error
                raise SerializationError(
                    f"results could not be unpickled in the caller: {safe_str(e)}"
                ) from e
            if slow is not None:
                merge_slow(stats, wi, slow)
            del parts
            count = inp.result_received(seq, len(results))
            per = nb / count if count > 1 else nb
            prev = learned.out_bytes_per_item  # a running average (0: none learned yet)
            learned.out_bytes_per_item = per if prev <= 0 else 0.7 * prev + 0.3 * per
            self._learn(wi, busy, wait, count)
            done[wi] = done.get(wi, 0) + count
            if self.reorder is None:
                out.append((first, results, count))
            else:
                self.reorder.push(seq, (first, results, count))
                out.extend(cast("list[tuple[int, list[Any], int]]", self.reorder.pop_ready()))
        return out

    def _timeout_error(self) -> RunnerTimeoutError:
        in_flight = self.input.dispatched - self.input.delivered
        return self.workers.stall_error(self.devices, self.call, self.timeout or 0.0, in_flight)

    def _learn(self, wi: int, busy: float, wait: float, count: int) -> None:
        # Once per result message: each step inline (a request/response loop pays it at
        # every round trip).
        r = self.reports.get(wi)
        if r is None:
            self.reports[wi] = [busy, wait, busy, wait]
            return  # the first report of a producer only sets its baseline
        prev = r[2]
        if busy < prev:  # a new producer in that place (retire.py): its figures start at 0
            self._fold(wi, r)
            r[0] = r[1] = prev = 0.0
        r[2] = busy
        r[3] = wait
        sizing = self.input.sizing
        if sizing.cost is not None:
            return  # batches are sized by the call's own figure (the pool's), not learned
        delta = busy - prev
        learned = self.learned
        # A batch's cost includes a fixed part (unpickling, bookkeeping: microseconds) that a
        # batch of few items charges to each item. Weighted by its share of a full batch, the
        # lone item each call starts with no longer shrinks the next batches tenfold.
        full = sizing.batch_size()
        weight = 0.3 if count >= full else 0.3 * count / full
        per = delta / count if count > 1 else delta
        if per < 1e-9:
            per = 1e-9  # never 0, which means "not known"
        old = learned.cost_per_item
        learned.cost_per_item = per if old <= 0 else old + weight * (per - old)

    def delivered_chunk(self, count: int) -> None:
        """``count`` input items were handed out."""
        self.input.delivered_chunk(count)
        if self.bar is not None:
            self.bar.update(count)

    # ----- the two ways to run a call -----

    def run_with_consumer(self) -> Any:
        self._start()
        cfg = copy.deepcopy(self.host.cfg)
        result: list[Any] = []
        try:
            # The runner's consumer thread, parked since its last call (a new one at the
            # first call, or after a fork ended it: consumer_thread.py).
            self.consumer, done = self.host.consumer.run(lambda: self._consume(cfg, result))
            self.consumer_done = done
            while not done.wait(TICK):
                pass
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
        runner = self.host.hooks
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
            self.stop()

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
                # Not held while the next message is awaited: results the caller handed out
                # and dropped are freed (the stdlib's pools keep none).
                del results
            finished = True
        except BaseException as e:
            self._fail(e)
            raise
        finally:
            if finished:
                self._finish()
            elif not self.ended:
                self._fail(None)  # closed early (break, close(), garbage collection)

    def _fail(self, exc: BaseException | None) -> None:
        """Stops the call; closes the runner if a producer died, on Ctrl-C and on timeout."""
        if self.ended:
            return
        self.ended = True
        self.stop()
        done = self.consumer_done
        if done is not None and self.consumer is not threading.current_thread():
            # It stops within a tick (unless busy in consumer_work); it must not read the
            # output queue while a shutdown collects the producers' goodbyes.
            done.wait(2.0)
        self.input.join_reader()
        self._record_stats()
        fatal = isinstance(
            exc, WorkerDiedError | KeyboardInterrupt | SystemExit | RunnerTimeoutError
        )
        try:
            if fatal or self.workers.dead():
                try:
                    self.host.shutdown(True)
                except EasycoreError:
                    pass
            elif not self.workers.closed:
                self.workers.drain_input()
        finally:
            self.host.gate.end(self)

    def _fold(self, wi: int, r: list[float]) -> None:
        """Counts into ``stats`` what producer ``wi`` reported since it was last counted
        (``r``, its entry of ``reports``; in the receiving thread, or once it stopped)."""
        busy, wait = r[2], r[3]
        stats = self.stats
        stats.producer_busy_s[wi] += busy - r[0]
        stats.producer_wait_s[wi] += wait - r[1]
        r[0], r[1] = busy, wait

    def _fold_reports(self) -> None:
        """Counts every producer's reports into ``stats`` (see ``reports``)."""
        for wi, r in list(self.reports.items()):
            self._fold(wi, r)

    def last_report(self, wi: int) -> tuple[float, float]:
        """The busy and waiting seconds producer ``wi`` last reported (0, 0 if none)."""
        r = self.reports.get(wi)
        return (r[2], r[3]) if r is not None else (0.0, 0.0)

    def _record_stats(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self._fold_reports()
        self._fill_stats(self.stats)
        self.host.keep_stats(self.stats)

    def _fill_stats(self, s: RunnerStats) -> None:
        s.items = self.input.delivered
        s.direct_items = self.input.direct_total
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
            slowest=list(self.stats.slowest),
        )
        # What the producers reported and ``stats`` does not count yet (read only: the
        # receiving thread may be storing a report meanwhile; a list unpacks in one step).
        for wi, r in list(self.reports.items()):
            counted_busy, counted_wait, busy, wait = r
            s.producer_busy_s[wi] += busy - counted_busy
            s.producer_wait_s[wi] += wait - counted_wait
        self._fill_stats(s)
        return s

    def _finish(self) -> None:
        self.ended = True
        self.input.join_reader()  # done reading: it only wakes the receiver on its way out
        self.input.leave_habit()
        self._record_stats()
        self.host.gate.end(self)
