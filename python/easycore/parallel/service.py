"""The pool's one stream, the half of :class:`~easycore.parallel.Pool` that its callers
never see: the service thread that keeps a streaming call of the pool's runner open, routes
each message's results to their jobs and futures, fails what is pending when the stream
fails, restarts the workers (quietly when nothing was lost), and answers its feed
(``feed.py``'s ``Scheduler``: what work waits, whether a worker died, chunk sizes).

``Pool`` sets the state declared on :class:`StreamService` in its constructor and adds the
API its callers use (``map``, ``submit``, ``close``…).
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from concurrent.futures import Future, InvalidStateError
from typing import Any

from easycore._engine.lifecycle import TICK
from easycore._engine.reports import not_picklable_error
from easycore._engine.stream import Call
from easycore.errors import PoolClosedError, WorkerDiedError
from easycore.parallel.feed import Feed, _WorkItem, _WorkResult
from easycore.parallel.job import _Job, task_error
from easycore.parallel.tasks import _TaskHooks

_TARGET_CHUNK_S = 0.002  # worker time per chunk the automatic chunk size aims at
# The pool's default ``window`` (items in flight in its stream, and a job's read ahead):
# large, so that tiny items travel in batches of thousands (an engine batch is at most a
# quarter of the window per worker). The engine bounds items in flight by bytes too, input
# and results alike, and each job's results by bytes (Pool._bound_room), so large items are
# held to a few.
_WINDOW = 65536


def _for_pool(e: BaseException) -> BaseException:
    """The runner's error reworded for pool users (the pool restarts its workers itself)."""
    if isinstance(e, WorkerDiedError):
        return e.then(
            "Every pending call and future of the pool failed; its next call restarts the workers"
        )
    return e


def _service_main(ref: weakref.ref[StreamService], cv: threading.Condition) -> None:
    """The service thread: waits for work holding only a weak reference to its pool (so
    that a pool dropped without ``close()`` is collected and finalized: see
    ``Pool.__init__``), then runs streams while there is work."""
    while True:
        pool = ref()
        if pool is None:
            return  # dropped: its finalizer stops the workers
        try:
            with cv:
                if not (pool._tasks or pool._jobs or pool._closing):
                    del pool
                    cv.wait(TICK)
                    continue
                end = pool._terminated or (pool._closing and pool._all_sent())
                generation = pool._generation
            if end or pool._serve_stream(generation):
                pool._serve_end()
                return
        except BaseException:
            pool = ref()
            if pool is not None:
                pool._serve_end()
            raise
        del pool


class StreamService:
    """The pool's stream and its bookkeeping (see the module)."""

    _cv: threading.Condition  # guards the work waiting and the jobs
    _tasks: collections.deque[tuple[Future[Any], int, bytes]]  # (future, task id, pickle)
    _running: dict[int, Future[Any]]  # sent tasks by id
    _jobs: dict[int, _Job]  # open map/imap calls by id
    _ids: itertools.count[int]
    _turn: int
    _generation: int  # the stream's number: a feed of an older one takes nothing
    _feed: Feed | None  # the current stream's input
    _cuts: int  # times the feed was asked to end the segment it reads (see feed.py)
    _feed_waiting: bool
    _quiet_before: bool  # the last stream failure was a quiet restart
    _closing: bool
    _terminated: bool
    _call: Call | None
    _runner: _TaskHooks
    _window: int
    _task_window: int  # tasks sent ahead of the workers
    _item_cost: float  # worker seconds per map item, learned
    _room: list[int]  # results a job may hold ahead of its caller (by bytes)
    _n_results: int  # map results received by the current stream
    _tasks_per_stream: int  # maxtasksperchild × workers (0: no bound)
    _recycle: bool  # the last stream ended for its workers to be replaced
    _end_error: BaseException | None
    _remote_tb: type  # the type of a future's error's __cause__ (the remote traceback)

    # ----- the stream (service thread) -----

    def _serve(self) -> None:
        """The service thread's body (kept for callers that run it directly)."""
        _service_main(weakref.ref(self), self._cv)

    def _serve_stream(self, generation: int) -> bool:
        """Runs one stream (one generation) until it ends; True if the service is over."""
        runner = self._runner
        feed: Feed | None = None
        call: Call | None = None
        try:
            runner.activate()  # after a failure: restart the workers for new work
            feed = Feed(self, generation)
            call = Call(
                runner,
                feed,
                False,
                None,
                True,
                pack=feed.pack,
                cost=self._cost_per_value,
                runs=feed,
            )
            self._call = call
            self._feed = feed
            self._n_results = 0
            route = self._route
            for results in call.iterate_chunks():
                route(results)
                del results  # not held while waiting: results handed out are freed
            with self._cv:
                if self._closing and self._all_sent():
                    return True
            if self._recycle:  # maxtasksperchild: the next stream starts new workers
                self._recycle = False
                self._call = self._feed = None  # the old stream holds the old queues
                call = feed = None  # (route, a bound method, holds the pool only)
                self._runner._shutdown(interrupt=False)
        except BaseException as e:  # noqa: BLE001 - every pending caller gets it
            if self._quiet_restart(e, feed, call):
                return False  # the loop restarts the workers; nothing failed
            self._fail_pending(_for_pool(e))
            if self._terminated:
                return True
        return False

    def _serve_end(self) -> None:
        """The service is over: stops the workers and fails what is still pending."""
        self._call = None
        self._feed = None
        try:
            self._runner._shutdown(interrupt=self._terminated)
        except BaseException as e:  # noqa: BLE001 - producer_end's error, for join()
            self._end_error: BaseException | None = e
        self._runner._close_zygote()  # no worker starts again
        # After a close, a job whose input was all read got every result (the stream
        # ended once everything sent came back): its caller may still take them.
        self._fail_pending(
            PoolClosedError("the pool was closed"), unfinished_only=not self._terminated
        )

    def _all_sent(self) -> bool:
        """Whether no task waits and every open job's input was read (or the job was
        abandoned): a closing pool's stream ends then (call under ``_cv``)."""
        return not self._tasks and all(j.input_done or j.closed for j in self._jobs.values())

    def _compact_input(self) -> None:
        """Drops the stream's sent input from the engine's buffer (called by the feed's
        thread, the engine's run reader, before it waits for work): a finished call's
        arguments are not kept alive while the pool idles."""
        call = self._call
        if call is not None:
            call._compact()

    def _stream_drained(self) -> bool:
        """Whether nothing is on its way in the stream (read by the feed's thread: a guess)."""
        call = self._call
        return call is not None and call.drained()

    def _worker_died(self) -> bool:
        """Whether a worker of the stream has died, or the workers were already stopped (the
        stream failed: its receiver saw the death first). The feed asks before taking work."""
        workers = self._runner._workers
        return workers is None or workers.closed or workers.exited()

    def _quiet_restart(self, error: BaseException, feed: Feed | None, call: Call | None) -> bool:
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
        with self._cv:
            quiet = (
                not self._terminated
                # the feed saw the death, waits for work, or never ran (the call found the
                # death as it started)
                and (feed.stopped_for_death or self._feed_waiting or call.reader is None)
                and call.drained()
                and (call.delivered > 0 or not self._quiet_before)
            )
            self._quiet_before = quiet
            if quiet:
                self._generation += 1  # a waiting feed takes nothing more
                self._cv.notify_all()
        return quiet

    def _route(self, results: list[_WorkResult | None]) -> None:
        """Hands one message's results to their futures and jobs. Consecutive chunks of one
        job are merged and delivered together (one lock and one wake-up per message, not per
        item: an iterator input travels item by item)."""
        jobs = self._jobs
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
                    self._deliver(jobs.get(run_jid), run_start, True, run)
                run_jid, run_start, run = jid, index, out
            else:
                if run_jid:
                    self._deliver(jobs.get(run_jid), run_start, True, run)
                    run_jid = 0
                partial = value.pop("partial", None)
                if partial:  # results of the chunk before its failing item
                    self._deliver(jobs.get(jid), index, True, partial)
                    index += len(partial)
                self._deliver(jobs.get(jid), index, False, value)
        if run_jid:
            self._deliver(jobs.get(run_jid), run_start, True, run)
        if count:
            cost = max(seconds / count, 1e-9)  # never 0, which means "not known" (engine)
            prev = self._item_cost
            self._item_cost = cost if prev <= 0 else 0.7 * prev + 0.3 * cost
            self._bound_room(count)

    def _cost_per_value(self) -> float:
        """Worker seconds per input value, learned from the chunks done (0: not known yet);
        the engine sizes its batches of single values by it."""
        return self._item_cost

    def _unsendable(self, item: _WorkItem, error: Exception) -> None:
        """Fails the call whose input chunk ``item`` could not be pickled."""
        jid, index, _fn, arg, _mode = item
        job = self._jobs.get(jid)
        if job is None:
            return
        what = f"input item {index}..{index + len(arg) - 1} of this call"
        job.fail(not_picklable_error(what, list(arg), error, to="the workers"))

    @staticmethod
    def _deliver(job: _Job | None, index: int, ok: bool, value: Any) -> None:
        if job is not None:
            job.deliver(index, ok, value)

    def _settle(self, tid: int, ok: bool, value: Any) -> None:
        """Completes the future of submitted task ``tid``."""
        fut = self._running.pop(tid, None)
        if fut is None:
            return
        if self._feed_waiting:
            self._wake_feed()  # room for another task
        try:
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(task_error(value, self._remote_tb))
        except InvalidStateError:
            pass  # failed meanwhile by terminate()

    def _fail_pending(self, error: BaseException, unfinished_only: bool = False) -> None:
        """Fails every job and future not finished (the stream they travelled on is gone);
        with ``unfinished_only``, not the jobs whose input was all read and sent."""
        with self._cv:
            self._generation += 1  # the old feed stops taking work
            jobs = [j for j in self._jobs.values() if not (unfinished_only and j.input_done)]
            futures = list(self._running.values())
            self._running.clear()
            queued = list(self._tasks)
            self._tasks.clear()
            self._cut_feed()
            self._cv.notify_all()
        for job in jobs:
            job.fail(error)
        for fut in futures + [q[0] for q in queued]:
            try:
                fut.set_exception(error)
            except InvalidStateError:
                pass  # cancelled or done
            except BaseException:  # noqa: BLE001 - a pending (cancelled) future
                pass

    def _bound_room(self, n_results: int) -> None:
        """Bounds each job's results ahead of its caller by bytes too (as the runners bound
        items in flight): at most about twice the output queue's budget of results."""
        call = self._call
        if call is None:
            return
        self._n_results += n_results
        per = call.stats.bytes_out / max(1, self._n_results)
        if per > 0:
            self._room[0] = max(1, min(_WINDOW, int(call.max_inflight_bytes / per)))

    def _auto_chunk(self, job: _Job) -> int:
        """Items per chunk: about ``_TARGET_CHUNK_S`` of work, learned from the chunks done."""
        cost = self._item_cost
        if cost <= 0:
            return 1
        # At most a quarter of the job's window per worker, so every worker gets chunks.
        most = max(1, job.window // (4 * len(self._runner.devices)))
        return max(1, min(int(_TARGET_CHUNK_S / cost), most))

    def _cut_feed(self) -> None:
        """The feed ends the segment it reads after the current item (call under ``_cv``)."""
        self._cuts += 1
        feed = self._feed
        if feed is not None:
            feed.cut()

    def _wake_feed(self) -> None:
        if self._feed_waiting:
            with self._cv:
                self._cv.notify_all()
