"""The pool's one stream, the part of :class:`~easycore.parallel.Pool` that its callers
never see: the pool's internal runner, and the service thread that keeps a streaming call of
it open, routes each message's results to their jobs and futures, fails what is pending when
the stream fails and restarts the workers (quietly when nothing was lost).

:class:`StreamService` is a member of the pool (``Pool._stream``), made with keyword
arguments. It takes its work from the pool's :class:`~easycore.parallel.schedule.Scheduler`
(each stream's :class:`~easycore.parallel.feed.Feed` asks it), and answers the scheduler's
questions about the stream (:class:`~easycore.parallel.schedule.StreamProbe`: whether a
worker died, whether the stream is drained, chunk sizes). The pool uses its public methods
and properties only.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from easycore._engine.batching import MAX_BATCH_BYTES
from easycore._engine.lifecycle import TICK
from easycore._engine.stats import RunnerStats
from easycore._engine.stream import Call
from easycore._engine.zygote import await_gone
from easycore.errors import PoolClosedError, SerializationError, WorkerDiedError
from easycore.parallel.feed import _HEALTH_EVERY_S, Feed, _WorkItem, _WorkResult
from easycore.parallel.hardstop import StuckWatch, kill_doomed, watch
from easycore.parallel.job import _Job, broken_transfer, task_error, unsendable_error
from easycore.parallel.schedule import Scheduler
from easycore.parallel.tasks import _TaskHooks
from easycore.parallel.turn import CallerTurns, Turn

_TARGET_CHUNK_S = 0.002  # worker time per chunk the automatic chunk size aims at
# The pool's default ``window`` (items in flight in its stream, and a job's read ahead):
# large, so that tiny items travel in batches of thousands (an engine batch is at most a
# quarter of the window per worker). The engine bounds items in flight by bytes too, input
# and results alike, and each job's results by bytes (StreamService._learn_cost), so large
# items are held to a few.
_WINDOW = 65536
_ROOM_EVERY = 64  # result messages between two settings of the room, at most
# The service thread parks for callers that wait for their tasks (``apply``) for this long
# after the last one: long enough for a loop's next call, short enough that a pool whose
# tasks then come through ``submit`` alone soon sends them without a hand-over.
_TASK_WAIT_S = TICK


def _for_pool(e: BaseException) -> BaseException:
    """The runner's error, with the pool's consequence (the pool restarts its workers)."""
    if isinstance(e, WorkerDiedError):
        return e.then(
            "Every pending call and future of the pool failed; its next call restarts the workers"
        )
    if isinstance(e, SerializationError) and not isinstance(e, BrokenProcessPool):
        # The stream broke on something that could not be unpickled (results in the
        # caller): what the stdlib's executor calls a broken pool.
        return broken_transfer(f"{e}. Every pending call and future of the pool failed", e)
    return e


def _service_main(owner: weakref.ref[Any], service: StreamService) -> None:
    """The service thread: waits for work holding its pool (``owner``) only weakly, so that a
    pool dropped without ``close()`` is collected and finalized (see ``Pool.__init__``), then
    runs streams, holding the pool, while there is work."""
    scheduler = service.scheduler
    while True:
        if owner() is None:
            return  # dropped: its finalizer stops the workers
        try:
            start = scheduler.next_stream(TICK)  # None: no work (it waited a tick)
            if start is None:
                continue
            pool = owner()
            if pool is None:
                return
            end, generation = start
            if end or service.serve_stream(generation):
                service.serve_end()
                return
        except BaseException:
            if owner() is not None:
                service.serve_end()
            raise
        del pool


class StreamService(CallerTurns):
    """The pool's stream (see the module).

    Args:
        scheduler (Scheduler): the pool's work; the service attaches itself to it.
        runner_cls (type): the pool's internal runner (``tasks._TaskRunner``, or a flavour's).
        devices (int or Iterable[str]): the workers (the runner's ``devices``).
        setup (tuple): ``(initializer, initargs, abandoned ring or None)`` for the runner.
        window (int, optional): the runner's window and a job's read-ahead (default 65536).
        remote_tb (type): a failed future's ``__cause__`` (the remote traceback's type).
        **runner_options: the runner's other keyword arguments.
    """

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        runner_cls: type[_TaskHooks],
        devices: int | Iterable[str],
        setup: tuple[Any, tuple[Any, ...], Any],
        window: int | None = None,
        remote_tb: type,
        **runner_options: Any,
    ) -> None:
        self.scheduler = scheduler
        self.window = int(window or _WINDOW)
        self.remote_tb = remote_tb
        self.runner = runner_cls(
            devices,
            setup,
            window=self.window,
            on_unsendable=weakref.WeakMethod(self.unsendable),
            **runner_options,
        )
        self.call: Call | None = None  # the current stream's call
        self.turn: Turn | None = None  # who advances the current stream (see turn.py)
        self.item_cost = 0.0  # worker seconds per map item, learned
        self.room = [_WINDOW]  # results a job may hold ahead of its caller (by bytes)
        self.end_error: BaseException | None = None  # what the workers' exit raised
        self.thread: threading.Thread | None = None
        self._n_results = 0  # map results received by the current stream
        self._room_per = 0.0  # the bytes per result the room was last set for
        self._arg_bytes = 0.0  # pickled bytes per argument of the last chunk so pickled
        self._room_due = 0  # messages until the room is set again anyway
        self._quiet_before = False  # the last stream failure was a quiet restart
        self.task_timeout: float | None = runner_options.get("task_timeout")
        self.max_tasks = int(runner_options.get("max_tasks") or 0)
        self.doomed: list[Any] = []  # workers given up on, killed before the others stop
        self.watch: StuckWatch | None = None  # tasks stuck past task_timeout (hardstop.py)
        self.task_wait = 0.0  # when a caller last waited for its task (apply): see call_task
        self.generation = -1  # the current stream's (see Scheduler.begin_task)
        self._inject_health = 0.0  # when inject next asks whether a worker died
        scheduler.attach(self)

    def start(self, owner: Any) -> None:
        """Starts the service thread, which holds ``owner`` (the pool) only weakly while it
        waits for work."""
        self.thread = threading.Thread(
            target=_service_main, args=(weakref.ref(owner), self), name="easycore-pool", daemon=True
        )
        self.thread.start()
        self.watch = watch(self, self.runner.stuck_slots, self.task_timeout)

    # ----- what the pool asks -----

    @property
    def owner_pid(self) -> int:
        """int: the process that made the pool (a forked child must not use it)."""
        return self.runner.owner_pid

    @property
    def stats(self) -> RunnerStats:
        """The current stream's figures so far, else the runner's last."""
        call = self.call
        return call.stats_now() if call is not None else self.runner.stats

    def in_service_thread(self) -> bool:
        """Whether the calling thread is the service thread (a future's done-callback)."""
        return threading.current_thread() is self.thread

    def join(self, timeout: float | None) -> bool:
        """Waits for the service thread to end (not from itself); whether it has."""
        thread = self.thread
        if thread is None:
            return True
        if threading.current_thread() is not thread:
            thread.join(timeout)
            if not thread.is_alive():  # gone from the OS too, with its watch: a fork may follow
                await_gone([thread] + ([self.watch.thread] if self.watch is not None else []))
        return not thread.is_alive()

    def abort(self) -> None:
        """Stops the current stream at once (``terminate()``)."""
        call = self.call
        if call is not None:
            call.abort = True
            call.attention.set()
        self._wake_turn()  # a parked service thread takes the stream back

    def stop_workers(self, interrupt: bool, for_good: bool = False) -> None:
        """Stops the workers (interrupting busy ones with ``interrupt``); the next stream
        starts new ones, unless ``for_good`` (the pool's end: their zygote stops too)."""
        kill_doomed(self.doomed)
        try:
            self.runner.stop_producers(interrupt)
        finally:
            if for_good:
                self.runner.release_zygote()

    # ----- the stream (service thread) -----

    def serve_stream(self, generation: int) -> bool:
        """Runs one stream (one generation) until it ends; True if the service is over."""
        runner = self.runner
        scheduler = self.scheduler
        feed: Feed | None = None
        call: Call | None = None
        try:
            runner.activate()  # after a failure: restart the workers for new work
            feed = Feed(scheduler, generation)
            call = Call(
                runner.stream_host(),
                feed,
                False,
                None,
                True,
                pack=runner.guarded_pack(feed.pack, self._sized_args),
                cost=self._cost_per_value,
                runs=feed,
            )
            if self.watch is not None or self.max_tasks:
                # A killed worker loses one work item; a worker that retires after
                # maxtasksperchild work messages ran as many tasks (_engine/retire.py).
                call.input.sizing.max_batch = 1
            self.call = call
            self.generation = generation
            scheduler.begin_stream(feed)
            self._n_results = self._room_due = self.own_count = 0
            self.own_secs = 0.0
            self._run(call)
            if scheduler.closed_and_all_sent():
                return True
            if feed.recycled:  # a remote backend's maxtasksperchild, or a stuck task
                # (hardstop.py): the next stream starts new workers
                self.call = None  # the old stream holds the old queues
                scheduler.begin_stream(None)
                call = feed = None  # (route, a bound method, holds the service only)
                self.stop_workers(interrupt=False)
        except BaseException as e:  # noqa: BLE001 - every pending caller gets it
            if self.quiet_restart(e, feed, call):
                return False  # the loop restarts the workers; nothing failed
            self.fail_pending(_for_pool(e))
            if scheduler.terminated:
                return True
        return False

    def _run(self, call: Call) -> None:
        """Receives the stream's results and routes them until it ends. While nothing else
        is on its way and a call reads its own input (a request/response loop), the service
        thread parks after routing, and that call's caller advances the stream itself
        (:meth:`round_trip`); what it leaves (others' results, an error, the end) is taken
        up here."""
        chunks = call.iterate_chunks()
        turn = self.turn = Turn(call, chunks)
        route = self._route
        park_ok = self._park_ok

        def still() -> bool:
            return (park_ok() or self._lone_caller(False)) and not self.worker_died()

        try:
            while True:
                try:
                    results = next(chunks)
                except StopIteration:
                    return
                parked = turn.park_if(park_ok)
                route(results)
                del results  # not held while waiting: results handed out are freed
                if not parked:
                    continue
                left = turn.wait(still)
                if left is None:
                    continue
                if left.handed is not None:
                    route(left.handed)
                if left.error is not None:
                    raise left.error
                if left.ended:
                    return
                del left  # the results a caller handed back are not held while waiting
        finally:
            turn.close()

    def _park_ok(self) -> bool:
        """Whether the service thread may leave the stream to a caller that reads its own
        input: no ``maxtasksperchild`` nor watch of stuck tasks (``hardstop.py``, which
        ends a stream behind its back), the feed waits for work, a call reads its own input,
        or a caller waits for its task (``apply``, lately), and nothing is on its way (read by
        the service thread: guesses, asked again every tick while parked)."""
        scheduler = self.scheduler
        call = self.call
        return (
            scheduler.feed_waiting
            and (scheduler.any_direct() or time.monotonic() - self.task_wait < _TASK_WAIT_S)
            and scheduler.direct_ok
            and self.watch is None
            and call is not None
            and not call.abort
            and call.drained()
        ) or self._lone_caller(True)

    def _lone_caller(self, waiting: bool) -> bool:
        """Whether the service thread may leave the stream to the caller of the one call the
        pool has (:meth:`receive_for`): no other call, no task queued or on its way (a
        task's future's callbacks run in this thread), no ``maxtasksperchild`` nor watch of
        stuck tasks, a call without a ``timeout`` whose caller is still there, and with
        ``waiting`` (the service thread parks only then) its caller waits for a result now.
        Guesses, asked again every tick while parked; a task or call that comes meanwhile
        wakes the service thread (the feed's ``input_coming``)."""
        call = self.call
        if call is None or call.abort or self.watch is not None:
            return False
        scheduler = self.scheduler
        job = scheduler.lone_job()
        return (
            job is not None
            and scheduler.direct_ok
            and job.receives
            and not job.closed
            and not job.drain
            and (job.waiting or not waiting)
        )

    def input_coming(self) -> None:
        """The feed took work, or the stream's input ended: a parked service thread takes the
        stream back (the feed's thread; any thread); not while it is parked for the caller
        of the pool's one call, which sends what the feed read as it receives (with no other
        work, the feed read that call's input: waking the service thread for each run cost
        a hand-off of the stream a quarter window, about 4 µs of its CPU a 1 MiB result)."""
        if not self._lone_caller(False):
            self._wake_turn()

    def _wake_turn(self) -> None:
        """A parked service thread takes the stream back."""
        turn = self.turn
        if turn is not None:
            turn.wake()

    def serve_end(self) -> None:
        """The service is over: stops the workers and fails what is still pending."""
        self.call = None
        self.scheduler.begin_stream(None)
        terminated = self.scheduler.terminated
        try:
            self.stop_workers(interrupt=terminated, for_good=True)
        except BaseException as e:  # noqa: BLE001 - producer_end's error, for join()
            self.end_error = e
        # After a close, a job whose input was all read got every result (the stream
        # ended once everything sent came back): its caller may still take them.
        self.fail_pending(PoolClosedError("the pool was closed"), unfinished_only=not terminated)

    def quiet_restart(self, error: BaseException, feed: Any, call: Any) -> bool:
        """Whether the stream's failure, a worker's death, lost nothing: the feed had stopped
        taking work (it saw the death, it was waiting for work, or it never started), and
        every item it read was sent and came back. Then no call or future fails: the old feed
        is stopped, and the workers restart for the work that is waiting. (A worker that died
        while the pool was idle failed the next call that spanned a health check.) Not twice
        in a row for streams that delivered nothing: workers that die as soon as they start
        would otherwise be restarted for ever, and the calls waiting on them never fail."""
        if not isinstance(error, WorkerDiedError) or feed is None or call is None:
            self._quiet_before = False
            return False
        scheduler = self.scheduler

        def quiet(feed_waiting: bool) -> bool:  # under the scheduler's lock
            q = (
                not scheduler.terminated
                # the feed saw the death, waits for work, or never ran (the call found the
                # death as it started)
                and (feed.stopped_for_death or feed_waiting or call.reader is None)
                and call.drained()
                and (call.delivered > 0 or not self._quiet_before)
            )
            self._quiet_before = q
            return bool(q)

        return self.scheduler.end_generation_if(quiet)

    def fail_pending(self, error: BaseException, unfinished_only: bool = False) -> None:
        """Fails every job and future not finished (the stream they travelled on is gone);
        with ``unfinished_only``, not the jobs whose input was all read and sent."""
        jobs, futures = self.scheduler.take_pending(unfinished_only)
        for job in jobs:
            job.fail(error)
        for fut in futures:
            try:
                fut.set_exception(error)
            except InvalidStateError:
                pass  # cancelled or done
            except BaseException:  # noqa: BLE001 - a pending (cancelled) future
                pass

    def unsendable(self, item: _WorkItem, error: Exception) -> None:
        """Fails the call whose input chunk ``item`` could not be pickled (the runner calls
        it from its sender)."""
        jid, index, _fn, arg, _mode = item
        job = self.scheduler.jobs().get(jid)
        if job is None:
            return
        job.fail(unsendable_error(error, index, arg))

    def _route(self, results: list[_WorkResult | None]) -> None:
        """Hands one message's results to their futures and jobs. Consecutive chunks of one
        job are merged and delivered together (one lock and one wake-up per message, not per
        item: an iterator input travels item by item)."""
        jobs = self.scheduler.jobs()
        run_jid = 0  # the job whose chunks are being merged (0: none)
        run_start = 0
        run: list[Any] = []
        seconds = 0.0
        count = 0
        for jid, index, ok, value in filter(None, results):  # None: an item never sent
            if jid == 0:
                self._settle(index, ok, value)
                continue
            if ok:
                out, secs = value
                seconds += secs
                count += len(out)
                if jid == run_jid and index == run_start + len(run):
                    run += out
                    continue
                if run_jid:
                    _deliver(jobs.get(run_jid), run_start, True, run)
                run_jid, run_start, run = jid, index, out
            else:
                if run_jid:
                    _deliver(jobs.get(run_jid), run_start, True, run)
                    run_jid = 0
                partial = value.pop("partial", None)
                if partial:  # results of the chunk before its failing item
                    _deliver(jobs.get(jid), index, True, partial)
                    index += len(partial)
                _deliver(jobs.get(jid), index, False, value)
        if run_jid:
            _deliver(jobs.get(run_jid), run_start, True, run)
        if count:
            self._learn_cost(seconds, count)

    def _learn_cost(self, seconds: float, count: int) -> None:
        """``count`` map results came, which took the workers ``seconds``: the cost per item
        and the room of each job follow.

        The room bounds each job's results ahead of its caller by bytes too (as the runners
        bound items in flight): at most about twice the output queue's budget of results, and
        no more large results than the output pool has segments for (a job's results wait
        for its caller in their segments; one that finds the pool full is built in private
        memory and copied). One method, no call inside: a request/response loop pays it at
        every round trip."""
        if not count:
            return
        cost = seconds / count
        if cost < 1e-9:
            cost = 1e-9  # never 0 for a known cost
        prev = self.item_cost
        self.item_cost = cost if prev <= 0 else 0.7 * prev + 0.3 * cost
        call = self.call
        if call is None:
            return
        self._n_results += count
        per = call.stats.bytes_out / self._n_results
        self._room_due -= 1
        off = 8 * (per - self._room_per)
        if self._room_due > 0 and -per <= off <= per:
            # Within an eighth of the size the room was last set for: set again only now
            # and then (the output pool may have grown), not at every message.
            return
        self._room_per, self._room_due = per, _ROOM_EVERY
        if per > 0:
            room = min(_WINDOW, int(call.max_inflight_bytes / per))
            pooled = call.input.sizing.pooled_results(per)
            if pooled is not None:
                room = min(room, pooled)
            self.room[0] = max(1, room)

    def _sized_args(self, per: float) -> None:
        """A chunk's arguments were pickled, ``per`` bytes each (the feed's thread): large
        arguments bound the chunks as large results do (:meth:`auto_chunk`)."""
        self._arg_bytes = per

    def _cost_per_value(self) -> float:
        """Worker seconds per input value, learned from the chunks done (0: not known yet);
        the engine sizes its batches of single values by it."""
        return self.item_cost

    def _settle(self, tid: int, ok: bool, value: Any) -> None:
        """Completes the future of submitted task ``tid``."""
        fut = self.scheduler.settle_task(tid)
        if fut is None:
            return
        try:
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(task_error(value, self.remote_tb))
        except InvalidStateError:
            pass  # failed meanwhile by terminate()

    # ----- the scheduler's questions (StreamProbe) -----

    def worker_died(self) -> bool:
        """Whether a worker of the stream has died, or the workers were already stopped (the
        stream failed: its receiver saw the death first). The feed asks before taking work."""
        return self.runner.producer_died()

    def drained(self) -> bool:
        """Whether nothing is on its way in the stream (read by the feed's thread: a guess)."""
        call = self.call
        return call is not None and call.drained()

    def compact_input(self) -> None:
        """Drops the stream's sent input from the engine's buffer (called by the feed's
        thread, the engine's run reader, before it waits for work): a finished call's
        arguments are not kept alive while the pool idles."""
        call = self.call
        if call is not None:
            call.compact()

    def injectable(self, generation: int) -> bool:
        """Whether :meth:`inject` may take work into the stream of ``generation``: its
        call is running and no stuck-task watch ends streams behind the feed's back."""
        call = self.call
        return (
            call is not None
            and not call.abort
            and not call.input.sealed
            and self.watch is None
            and generation == self.generation
        )

    def inject(self, items: list[_WorkItem], generation: int) -> bool:
        """Sends ``items`` (ready work, see ``Scheduler._send_ready``; under its lock) into
        the stream of ``generation`` from the calling thread, queued behind a batch waiting
        to go if need be; a parked service thread takes the stream back. False: nothing was
        sent: another stream's, a call that stops or ended, a stuck-task watch (which ends
        streams behind the feed's back), or a dead worker (the feed finds out first: a quiet
        restart), asked as often as the feed asks."""
        call = self.call
        if not self.injectable(generation) or call is None:
            return False
        now = time.monotonic()
        if now >= self._inject_health:  # as often as the feed looks
            self._inject_health = now + _HEALTH_EVERY_S
            if self.runner.producer_died():
                return False
        if not call.input.send_direct(items, now=True, queue=True):
            return False
        self.input_coming()
        return True

    def auto_chunk(self, job: _Job) -> int:
        """Items per chunk: about ``_TARGET_CHUNK_S`` of work, learned from the chunks done,
        and no more results or arguments than ``MAX_BATCH_BYTES`` (as the engine's batches
        of large items). A chunk's results travel in one message, in one pooled segment that
        stays held until the caller dropped the last of them: chunks of 2 ms of 1 MiB results
        (30 and more a chunk) held the whole output pool, and each result after found it
        full (a one-shot segment, made and faulted in on both sides: a tenth of the
        speed). Its arguments travel so too, the other way."""
        cost = self.item_cost
        if cost <= 0:
            return 1
        size = int(_TARGET_CHUNK_S / cost)
        # Bytes per result, as the room was last set, or per argument (0: not known).
        per = self._room_per if self._room_per > self._arg_bytes else self._arg_bytes
        if per > 0 and size * per > MAX_BATCH_BYTES:
            # Below the bound with each value's framing (a page: the engine's batches count
            # pickled bytes): a chunk of 4 MiB of 1 MiB bytes objects and its framing took
            # more than half the input queue's side budget (8 MiB with two workers), so
            # that one chunk travelled at a time and a worker waited.
            size = int(MAX_BATCH_BYTES / (per + 4096))
        # At most a quarter of the job's window per worker, so every worker gets chunks.
        most = max(1, job.window // (4 * len(self.runner.devices)))
        return max(1, min(size, most))


def _deliver(job: _Job | None, index: int, ok: bool, value: Any) -> None:
    if job is not None:
        job.deliver(index, ok, value)
