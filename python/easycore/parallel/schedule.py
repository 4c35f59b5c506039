"""The work waiting for a pool's stream, and who gets the next turn.

A :class:`Scheduler` holds, under one lock, the submitted tasks not sent yet, the tasks on
their way (by id), the open ``map``/``imap`` calls (jobs, by id), the round-robin turn, the
stream's generation and the count of cuts, and whether the pool is closing. Three parties
use it, each through its own methods:

* the pool's API (``Pool.submit``, ``Pool.imap``…, ``close``, ``terminate``):
  :meth:`~Scheduler.add_task`, :meth:`~Scheduler.open_job`, :meth:`~Scheduler.close_job`,
  :meth:`~Scheduler.notify`, :meth:`~Scheduler.close`, :meth:`~Scheduler.terminate`,
  :meth:`~Scheduler.cancel_queued`;
* the feed (``feed.py``), the stream's input: :meth:`~Scheduler.next_work` (one lock
  acquisition per run it hands the engine), :meth:`~Scheduler.wake_feed`,
  :attr:`~Scheduler.cuts`, :attr:`~Scheduler.tasks_per_stream`, and the stream's questions
  (:meth:`~Scheduler.worker_died`, :meth:`~Scheduler.stream_drained`,
  :meth:`~Scheduler.auto_chunk`), which it forwards to the stream (a :class:`StreamProbe`);
* the stream service (``service.py``), which runs the streams: :meth:`~Scheduler.next_stream`,
  :meth:`~Scheduler.begin_stream`, :meth:`~Scheduler.settle_task`,
  :meth:`~Scheduler.take_pending`, :meth:`~Scheduler.end_generation_if`.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from easycore._engine.lifecycle import TICK
from easycore.parallel.feed import _TASK, _TaskBlob, _WorkItem

if TYPE_CHECKING:
    from easycore.parallel.feed import Feed
    from easycore.parallel.job import _Job

_IDLE_END_S = 1.0  # seconds without work after which a stream ends (see Scheduler.next_work)


class StreamProbe(Protocol):
    """What the scheduler asks of the stream that reads its work (the stream service)."""

    def worker_died(self) -> bool:
        """Whether a worker of the stream has died (then no more work is taken)."""

    def drained(self) -> bool:
        """Whether nothing is on its way in the stream (a guess)."""

    def compact_input(self) -> None:
        """Frees the stream's input already sent (before the feed waits)."""

    def input_coming(self) -> None:
        """The feed took work, or the stream's input ended (a parked stream looks)."""

    def round_trip(self, item: _WorkItem, job: _Job) -> bool:
        """A caller sends ``item`` of ``job``, read by itself, and receives its result, if
        the stream lets it; False: nothing was sent."""

    def turn_free(self) -> bool:
        """Whether a caller may take the stream's turn now (a guess)."""

    def receive_for(self, job: _Job) -> bool:
        """``job``'s caller, with no result to take, receives in its own thread until one
        came, if the stream lets it; False: nothing was done."""

    def auto_chunk(self, job: _Job) -> int:
        """The chunk size of a sliced job without a ``chunksize``."""

    def injectable(self, generation: int) -> bool:
        """Whether :meth:`inject` may take work into stream ``generation`` (a guess: it
        may still refuse)."""

    def inject(self, items: list[_WorkItem], generation: int) -> bool:
        """Sends ``items`` into stream ``generation`` from the calling thread, ahead of
        what the feed read (the feed is away, reading an input); False: nothing was sent."""


class Scheduler:
    """The work waiting for a pool's stream (see the module)."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())  # guards everything below
        # Submitted, not sent: (future, task id, pickle).
        self._tasks: collections.deque[tuple[Future[Any], int, _TaskBlob]] = collections.deque()
        self._running: dict[int, Future[Any]] = {}  # sent tasks by id
        self._resend: collections.deque[_WorkItem] = collections.deque()  # see resend()
        self._jobs: dict[int, _Job] = {}  # open map/imap calls by id
        self._habit = 0  # how the next call starts (_Job.habit, _Job.start_as)
        self._ids = itertools.count(1)  # of tasks and jobs alike
        self._turn = 0  # the next job to take items from, round robin
        self._generation = 0  # the stream's number: a feed of an older one takes nothing
        self._cuts = 0  # times the feed was asked to end the segment it reads (see feed.py)
        self._feed: Feed | None = None  # the current stream's input
        self._feed_waiting = False  # the feed waits for work
        self._closing = False
        self.terminated = False  # the pool was terminated (read by every caller's wait)
        self._task_window = 4  # most submitted tasks sent ahead of the workers
        self._tasks_per_stream = 0
        self._direct_ok = True
        self._stream: StreamProbe | None = None

    def set_bounds(self, task_window: int, tasks_per_stream: int, direct_ok: bool = True) -> None:
        """Before the first stream: at most ``task_window`` submitted tasks are sent ahead of
        the workers, a stream ends after ``tasks_per_stream`` tasks and items, for its
        workers to be replaced (a remote backend's ``maxtasksperchild`` × workers; 0: no
        bound), and a caller may read its call's input itself only with ``direct_ok``
        (not with a ``maxtasksperchild``)."""
        self._task_window = task_window
        self._tasks_per_stream = tasks_per_stream
        self._direct_ok = direct_ok and not tasks_per_stream

    def attach(self, stream: StreamProbe) -> None:
        """The stream that reads the work: the feed's questions go to it."""
        self._stream = stream

    # ----- state -----

    @property
    def closing(self) -> bool:
        """bool: the pool accepts no new work (after ``close()`` or ``terminate()``)."""
        return self._closing

    @property
    def cuts(self) -> int:
        """int: times the feed was asked to end the segment it reads."""
        return self._cuts

    @property
    def tasks_per_stream(self) -> int:
        """int: tasks and items after which a stream ends (0: no bound)."""
        return self._tasks_per_stream

    @property
    def direct_ok(self) -> bool:
        """bool: a caller may read its call's input itself (no ``maxtasksperchild``)."""
        return self._direct_ok

    def any_direct(self) -> bool:
        """Whether a caller reads its call's input itself (a guess, without the lock)."""
        jobs = self._jobs
        return bool(jobs) and any(job.direct for job in list(jobs.values()))

    def lone_job(self) -> _Job | None:
        """The one open call, if it is all the pool has to do: no other call, and no task
        queued or on its way (a guess, without the lock)."""
        jobs = self._jobs
        if len(jobs) != 1 or self._tasks or self._running or self._resend:
            return None
        try:
            return next(iter(jobs.values()))
        except (StopIteration, RuntimeError):  # closed meanwhile (another thread)
            return None

    @property
    def feed_waiting(self) -> bool:
        """bool: the feed waits for work (a guess unless read under the lock)."""
        return self._feed_waiting

    # ----- the pool's API -----

    def add_task(self, fut: Future[Any], blob: _TaskBlob) -> bool:
        """Queues a submitted task ahead of the rest of every job's input; False if the
        pool is closing (nothing queued)."""
        with self._cv:
            if self._closing:
                return False
            self._tasks.append((fut, next(self._ids), blob))
            self._send_ready()
            if self._tasks:
                self._cut()  # a task goes ahead of the rest of a job's input
            self._cv.notify_all()
        return True

    def open_job(self, make: Callable[[int], _Job], deadline: bool = False) -> _Job | None:
        """Opens the job ``make(job id)`` returns; None if the pool is closing. With a
        ``deadline`` (a call's ``timeout``) its caller never reads its input itself."""
        with self._cv:
            if self._closing:
                return None
            job = make(next(self._ids))
            job.start_as(self._habit, self._direct_ok and not deadline)
            self._jobs[job.jid] = job
            self._send_ready()
            self._cut()  # its turn comes at the next segment
            self._cv.notify_all()
        return job

    def close_job(self, jid: int) -> None:
        """Forgets job ``jid`` (finished or abandoned): its input is not read further."""
        with self._cv:
            job = self._jobs.pop(jid, None)
            if job is not None:
                self._habit = job.habit(self._habit)
            self._cut()  # stop reading its input
            self._cv.notify_all()

    def cut(self) -> None:
        """The feed ends the segment it reads after the item being read."""
        with self._cv:
            self._cut()

    def cut_reading(self) -> None:
        """As :meth:`cut`, without the lock (any thread, the garbage collector's too): for an
        abandoned job, which the feed drops once it looks."""
        feed = self._feed
        if feed is not None:
            feed.cut()

    def want_input(self) -> None:
        """A caller asks for its call's input (``_Job.wait_step``): the feed ends the segment
        it reads, and hands the input over when it next looks for work."""
        with self._cv:
            self._cut()
            self._cv.notify_all()

    def read_and_send(self, job: _Job) -> list[Any] | None:
        """``job``'s caller reads its next item itself (``_Job.read_direct``) and sends it:
        sent and received by the caller if the stream lets it (``StreamService.round_trip``),
        else queued for the feed, ahead of everything. Returns the item's results if they
        came straight back to the caller (``job.own``), else None: they come the common way
        (through the job, as an error does, or the input's end)."""
        item = job.read_direct()
        if item is None:
            self.wake_feed()  # the input ended or failed (a closing pool may end)
            return None
        try:
            stream = self._stream
            if stream is None or not stream.round_trip(item, job):
                self.resend([item])
        finally:
            if job.caller_reads:  # the round trip did not say so as it sent the item
                self.sent_direct(job)
        own, job.own = job.own, None
        return own

    def turn_free(self) -> bool:
        """Whether a caller may take the stream's turn now (a guess, see
        :meth:`receive_for`)."""
        stream = self._stream
        return stream is not None and stream.turn_free()

    def receive_for(self, job: _Job) -> bool:
        """``job``'s caller found no result: it receives in its own thread, if the stream
        lets it (``StreamService.receive_for``), until one came; False: nothing was done."""
        stream = self._stream
        return stream is not None and stream.receive_for(job)

    def sent_direct(self, job: _Job) -> None:
        """The item that ``job``'s caller read itself is sent, or queued ahead of all else
        (:meth:`read_and_send`): if the caller hands the input back to the feed with it (a
        probe, see ``_Job.sent_direct``), the feed reads it again from now on (not before:
        blocked in an input that waits for that item's result, it would never send an item
        queued behind it)."""
        if job.sent_direct():
            self.notify()

    def begin_task(self, fut: Future[Any]) -> int | None:
        """A submitted task that its caller sends itself while it holds the stream
        (``Pool.apply``, see ``StreamService.call_task``): its future runs and it counts as
        on its way; returns its id, or None (nothing done) if the pool is closing or the
        future was cancelled."""
        with self._cv:
            if self._closing or not fut.set_running_or_notify_cancel():
                return None
            tid = next(self._ids)
            self._running[tid] = fut
        return tid

    def send_task(
        self, fut: Future[Any], blob: _TaskBlob, generation: int, send: Callable[[_WorkItem], bool]
    ) -> bool:
        """``Pool.submit`` while nothing is on its way (see ``StreamService.send_task``): if
        stream ``generation`` is the current one, its feed waits for work and no task waits
        before this one, the task runs, counts as on its way and is given to ``send`` (the
        caller's thread sends it), under the lock, so that the stream cannot end meanwhile;
        one that ``send`` could not send goes to the feed, ahead of other work. False:
        nothing was done."""
        with self._cv:
            if (
                self._closing
                or generation != self._generation
                or not self._feed_waiting
                or self._tasks
                or self._resend
                or len(self._running) >= self._task_window
                or not fut.set_running_or_notify_cancel()
            ):
                return False
            tid = next(self._ids)
            self._running[tid] = fut
            item: _WorkItem = (0, tid, None, blob, _TASK)
            if not send(item):
                self._resend.append(item)
                self._cv.notify_all()
        return True

    def notify(self) -> None:
        """Wakes whoever waits for work (a job's caller made room, say); while the feed is
        away, ready work goes now."""
        with self._cv:
            self._send_ready()
            self._cv.notify_all()

    def close(self) -> None:
        """No new work; every open job's input is read to its end (``job.drain``)."""
        with self._cv:
            self._closing = True
            for job in self._jobs.values():
                job.drain = True
            self._cv.notify_all()

    def terminate(self) -> list[Future[Any]]:
        """No new work, the pool stops: returns the queued tasks' futures (taken out)."""
        with self._cv:
            self._closing = True
            self.terminated = True
            queued = [fut for fut, _tid, _blob in self._tasks]
            self._tasks.clear()
            self._cv.notify_all()
        return queued

    def cancel_queued(self) -> list[Future[Any]]:
        """Takes out the queued tasks beyond those the workers take next (they count as
        running, as the stdlib's call queue holds as many) and returns their futures."""
        with self._cv:
            keep = max(0, self._task_window - len(self._running))
            queued = list(self._tasks)[keep:]
            for _ in queued:
                self._tasks.pop()
        return [fut for fut, _tid, _blob in queued]

    # ----- the feed -----

    def next_work(
        self, generation: int, before_taking: Callable[[], None]
    ) -> tuple[_Job | _WorkItem, int]:
        """A task's work item to send, or a job with room, and the cut count when chosen;
        waits for either. ``before_taking`` is called (under the lock) before work is taken:
        the feed's health check, which may end the stream. StopIteration at the end: a newer
        stream (``generation`` is old), the pool closed with everything sent, or idle a
        while."""
        idle_since: float | None = None
        tasks, running, window = self._tasks, self._running, self._task_window
        with self._cv:
            while True:
                if generation != self._generation:
                    raise StopIteration
                if self._resend:
                    before_taking()
                    return self._resend.popleft(), self._cuts
                if tasks and len(running) < window:
                    before_taking()
                while tasks and len(running) < window:
                    fut, tid, blob = tasks.popleft()
                    if fut.set_running_or_notify_cancel():
                        running[tid] = fut
                        return (0, tid, None, blob, _TASK), self._cuts
                jobs = self._jobs
                if jobs:
                    # Round robin: rotate the job order so every open job gets its turn.
                    order = list(jobs.values())
                    start = self._turn % len(order)
                    self._turn += 1
                    for job in order[start:] + order[:start]:
                        if job.want_direct or job.direct:
                            job.input_turn()  # handed to its caller, or taken back
                        if job.has_room():
                            before_taking()
                            return job, self._cuts
                    del order, job  # not held while waiting: a finished job is freed
                if jobs and any(j.closed for j in jobs.values()):
                    for jid in [jid for jid, j in jobs.items() if j.closed]:
                        # Abandoned (its results iterator was dropped), or closed by its
                        # caller, who finds it gone: its habit is taken here then.
                        self._habit = jobs.pop(jid).habit(self._habit)
                if self._closing and self._all_sent():
                    raise StopIteration  # closed, and every call and task was sent
                if jobs or tasks or running or not self.stream_drained():
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > _IDLE_END_S:
                    # Idle a while: the stream ends (the next call starts another), so that
                    # the service thread holds its pool only weakly and a pool dropped
                    # without close() is collected and finalized.
                    raise StopIteration
                if not self._feed_waiting and not jobs and not tasks:
                    stream = self._stream
                    if stream is not None:
                        stream.compact_input()  # nothing to read: free what was sent
                self._feed_waiting = True
                self._cv.wait(TICK)
                self._feed_waiting = False

    def send_ready(self) -> None:
        """The feed is inside an iterator input's segment, about to read it: work that is
        ready now (left for the feed a moment ago, say, while it chose this input) goes into
        the stream from the feed's thread (see :meth:`_send_ready`; work made ready later
        goes from the thread that makes it ready)."""
        with self._cv:
            self._send_ready()

    def wake_feed(self) -> None:
        """Wakes the feed if it waits for work."""
        if self._feed_waiting:
            with self._cv:
                self._cv.notify_all()

    def input_coming(self) -> None:
        """The feed took work, or its input ended: a parked stream looks (see turn.py)."""
        stream = self._stream
        if stream is not None:
            stream.input_coming()

    def worker_died(self) -> bool:
        """Whether a worker of the stream has died (the feed asks before it takes work)."""
        stream = self._stream
        return stream is not None and stream.worker_died()

    def stream_drained(self) -> bool:
        """Whether nothing is on its way in the stream (a guess)."""
        stream = self._stream
        return stream is not None and stream.drained()

    def auto_chunk(self, job: _Job) -> int:
        """The chunk size of a sliced job without a ``chunksize``."""
        stream = self._stream
        return 1 if stream is None else stream.auto_chunk(job)

    # ----- the stream service -----

    def next_stream(self, timeout: float) -> tuple[bool, int] | None:
        """Whether a stream should run: None if there is no work (after waiting up to
        ``timeout`` for some), else ``(end, generation)``: ``end`` if the service is over
        (terminated, or closed with everything sent), and the generation to run."""
        with self._cv:
            if not (self._tasks or self._jobs or self._closing or self._resend):
                self._cv.wait(timeout)
                return None
            end = self.terminated or (self._closing and self._all_sent())
            return end, self._generation

    def begin_stream(self, feed: Feed | None) -> None:
        """``feed`` is the current stream's input (None: no stream)."""
        self._feed = feed

    def closed_and_all_sent(self) -> bool:
        """Whether the pool is closing and every call and task was sent."""
        with self._cv:
            return self._closing and self._all_sent()

    def jobs(self) -> Mapping[int, _Job]:
        """The open jobs by id (read without the lock: results are routed by id)."""
        return self._jobs

    def settle_task(self, tid: int) -> Future[Any] | None:
        """The future of sent task ``tid``, no longer on its way (None if it was failed
        meanwhile); wakes the feed if a task waits (it may send it now)."""
        fut = self._running.pop(tid, None)
        if fut is not None and self._tasks:
            if self._feed_waiting:
                self.wake_feed()  # room for a task that waits for it
            else:
                with self._cv:
                    self._send_ready()  # the feed is away: the task goes now
        return fut

    def take_pending(self, unfinished_only: bool) -> tuple[list[_Job], list[Future[Any]]]:
        """The stream is gone: a new generation starts (the old feed takes nothing more), and
        every open job (with ``unfinished_only``, those whose input was not all read) and
        every running and queued task's future is returned, to be failed."""
        with self._cv:
            self._generation += 1
            jobs = [j for j in self._jobs.values() if not (unfinished_only and j.input_done)]
            futures = list(self._running.values()) + [q[0] for q in self._tasks]
            self._running.clear()
            self._tasks.clear()
            self._resend.clear()
            self._cut()
            self._cv.notify_all()
        return jobs, futures

    def resend(self, items: list[_WorkItem]) -> None:
        """Work items that a stream gave back untaken (its workers are being replaced: see
        ``hardstop.py``), or that a caller read itself and could not send (``read_and_send``):
        sent, before other work, by the feed (the next stream's, for the former)."""
        with self._cv:
            self._resend.extend(items)
            self._send_ready()
            self._cv.notify_all()

    def end_generation_if(self, quiet: Callable[[bool], bool]) -> bool:
        """Under the lock: if ``quiet(feed_waiting)``, the stream's generation ends (a
        waiting feed takes nothing more) and True is returned."""
        with self._cv:
            if not quiet(self._feed_waiting):
                return False
            self._generation += 1
            self._cv.notify_all()
        return True

    # ----- under the lock -----

    def _all_sent(self) -> bool:
        """Whether no task waits and every open job's input was read (or the job was
        abandoned): a closing pool's stream ends then."""
        jobs = self._jobs.values()
        return not (self._tasks or self._resend) and all(j.input_done or j.closed for j in jobs)

    def _send_ready(self) -> None:
        """Sends the work that is ready to go from the calling thread, while the feed is away
        from :meth:`next_work`: reading a call's input, whose ``next()`` may wait on a result
        that its caller is yet to take, after other work of its own (a request/response loop
        that runs a task, or a ``map`` of a list, and waits for it before its input yields
        the next item). Ready: items to send again and queued tasks within the window, and,
        while the feed is inside an iterator input's segment (when it slices no call
        itself), chunks of the sliced calls (range, list, tuple) with room. Nothing ready
        waits behind an input being read. Not for a pool whose streams end after so many
        tasks (``direct_ok`` is false then: the feed counts what each stream takes)."""
        stream = self._stream
        feed = self._feed
        if (
            self._feed_waiting
            or feed is None
            or stream is None
            or self.terminated
            or not self._direct_ok
            or not stream.injectable(self._generation)
        ):
            return
        items = list(self._resend)
        self._resend.clear()
        tasks, running = self._tasks, self._running
        while tasks and len(running) < self._task_window:
            fut, tid, blob = tasks.popleft()
            if fut.set_running_or_notify_cancel():
                running[tid] = fut
                items.append((0, tid, None, blob, _TASK))
        if feed.reading is not None:
            for job in list(self._jobs.values()):
                if job.seq is None or job.drain:
                    continue  # an iterator is the feed's to read; draining: read to its end
                while job.has_room():
                    size = max(1, min(job.chunksize or stream.auto_chunk(job), job.ahead()))
                    chunk = job.take_chunk(size)
                    if chunk is None:
                        break
                    items.append(chunk)
        if not items:
            return
        try:
            sent = stream.inject(items, self._generation)
        except Exception:  # noqa: BLE001 - not sent (it did not pickle…): the feed finds out
            sent = False
        if not sent:
            # The feed sends them, ahead of the rest of the input it reads (a new stream's
            # feed, if need be).
            self._resend.extend(items)
            self._cut()

    def _cut(self) -> None:
        self._cuts += 1
        feed = self._feed
        if feed is not None:
            feed.cut()
