"""The pool's input: the iterable that the pool's one streaming runner call reads.

The feed talks to one object, the pool's scheduler (``schedule.py``, the :class:`WorkSource`
below): it asks it for the next work (queued ``submit`` tasks first, then the open
``map``/``imap`` jobs in turn, each at most its room ahead of what its caller consumed, see
``job.py``), one lock acquisition per run, and turns that work into runs. What it hands the
engine are *work items* ``(job, index, function, argument, mode)``; a producer returns
``(job, index, ok, value)`` for each.

**Why segments.** An input iterator must be read one item at a time: an input that yields
item i+1 only once result i arrived (a feedback loop) would wait forever if the pool waited
to fill a chunk. The engine's input thread does read item by item and its sender sends
whatever has arrived. But a Python ``__next__`` per item, wrapping each item in its own work
item, costs about a microsecond, more than the rest of the pool's path. So an iterator job is
read in *segments*: a segment is a C-level iterator over the job's own items, cut by
emptying its gate (``easycore._engine.runs.gated``, which runners use too)::

    map(itemgetter(1), zip(gate, job.it))

handed to the engine's input thread as a *run* (:meth:`Feed.next_run`, the engine's
``RunSource``). The engine pulls a run in with one ``list.extend``: no Python frame per item.
Only while its receiving thread waits on each item (fewer batches on their way than workers:
one may run dry, or the input is a feedback loop) does it read item by item and wake the
receiver as each comes; if the receiver starts to wait during an extend, it cuts the run
(:meth:`Feed.cut`), so the extend ends after the item being read. (``iter(feed)`` chains the
runs: the stream's input iterable, and what :meth:`Feed.recover` goes on with.) The feed
registers each
segment (where it starts in the stream of raw items) before the engine sees its first item,
and :meth:`Feed.pack`, run by the engine's sender on each batch, turns a run of one
segment's raw items into one work item (the engine counts the batch's raw items, so that
its results stand for them all: no padding travels).

A segment:

* reads at most ``n`` items: the job's room when it began, at most 16384 and at most what the
  engine asked for (``gate`` has ``n`` entries);
* is *cut* between two items (``gate`` emptied, from any thread) when a task is submitted, a
  job opens or closes, the stream ends or the engine's receiver starts to wait on each item,
  so nothing waits behind a slow input for more than the item being read;
* is counted by its reader (the engine's input thread counts how much its buffer grew; a
  counter inside the chain cost ~10 ns an item), and a segment that read fewer than ``n``
  items and was not cut has seen the end of its input;
* ends with the error of its input: the engine's input thread calls :meth:`Feed.recover`,
  which fails that job only; reading goes on with the next segment.

Ranges, lists and tuples are sliced into chunks (one work item each), an iterator with a
``chunksize`` is read a chunk at a time, and a task is one work item: each travels as a
segment of one premade item.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from easycore._engine.runs import after_first, gated

if TYPE_CHECKING:
    from easycore.parallel.job import _Job

_WorkItem: TypeAlias = tuple[int, int, Any, Any, int]
"""``(job, index, function, argument, mode)``: job 0 is a submitted task (index: its id)."""
_WorkResult: TypeAlias = tuple[int, int, bool, Any]
"""``(job, index, ok, value)``, what a producer returns for a work item."""
_TaskBlob: TypeAlias = Any
"""A submitted task's function and arguments, pickled: ``bytes``, or a
``chunk_args.ChunkArgs`` whose parts carry its large buffers out of band."""

_ONE, _STAR, _TASK = 0, 1, 2  # how a producer calls the function of a work item
_HEALTH_EVERY_S = 0.005  # at most this often, the feed asks whether a worker died
# Most items in one segment: its gate list is allocated whole, and a segment that a submit
# cuts early would waste the rest (a few µs of bookkeeping per segment is nothing at this size).
_SEGMENT_MAX = 16384


class _Segment:
    """A run of raw items in the stream: one job's items, or one premade work item."""

    __slots__ = ("start", "job", "index", "n", "gate", "cut")

    def __init__(self, start: int, job: _Job | None = None, index: int = 0, n: int = 1) -> None:
        self.start = start  # position of its first raw item in the stream
        self.job = job  # None: a premade work item (a task, or a chunk made by the feed)
        self.index = index  # the job's input index of its first item
        self.n = n  # most items it may read
        # Emptied to cut the segment between two items (see runs.gated); set when it is read.
        self.gate: list[None] | None = None
        self.cut = False


class WorkSource(Protocol):
    """What the feed asks of the pool's scheduler (``schedule.Scheduler``), its one
    counterpart: the next work, and the stream's questions."""

    @property
    def cuts(self) -> int:
        """Times the feed was asked to end the segment it reads."""

    @property
    def tasks_per_stream(self) -> int:
        """Tasks and items after which the stream ends (0: no bound)."""

    def next_work(
        self, generation: int, before_taking: Callable[[], None]
    ) -> tuple[_Job | _WorkItem, int]:
        """A task's work item or a job with room, and the cut count; waits. StopIteration
        at the end. ``before_taking`` runs (under the scheduler's lock) before work is
        taken."""

    def send_ready(self) -> None:
        """The feed is about to read an iterator input: the work that is ready goes into
        the stream from here (it would wait behind the input's next())."""

    def wake_feed(self) -> None:
        """Wakes the feed if it waits for work."""

    def input_coming(self) -> None:
        """The feed took work, or its input ended: the stream (if parked) looks."""

    def worker_died(self) -> bool:
        """Whether a worker of the stream has died."""

    def stream_drained(self) -> bool:
        """Whether nothing is on its way in the stream (a guess)."""

    def auto_chunk(self, job: _Job) -> int:
        """The chunk size of a sliced job without a ``chunksize``."""


class Feed:
    """The input of one stream of a :class:`~easycore.parallel.Pool` (one generation):
    iterated by the engine's input thread, :meth:`pack` called by its sender. Ends when the
    stream is replaced or the pool closes."""

    # A run takes the scheduler's lock, a job's turn, a segment and its settling (and often a
    # wake-up): the engine reads large items a quarter of its window at a time.
    costly = True

    def __init__(self, scheduler: WorkSource, generation: int) -> None:
        self.scheduler = scheduler
        self.generation = generation
        # Registered segments not yet packed, oldest first: the input thread appends, the
        # sender pops from the left (each an atomic deque operation).
        self.segs: deque[_Segment] = deque()
        self.reading: _Segment | None = None  # the job segment the input thread is in
        self.pos = 0  # raw items in every settled segment: where the next segment starts
        self.packed = 0  # raw items packed so far (the sender's position in the stream)
        # Set (under the scheduler's lock) when the feed found a worker dead before taking
        # more work: it ends the stream and takes nothing more, so a stream that then
        # delivered everything it sent lost nothing (see StreamService.quiet_restart).
        self.stopped_for_death = False
        # Set when the stream ended for its workers to be replaced (maxtasksperchild).
        self.recycled = False
        self._next_health = 0.0
        self.sent = 0  # tasks and items taken (at most; for maxtasksperchild)

    def __iter__(self) -> Iterator[Any]:
        """The stream item by item, counting each run's items: the stream's input iterable
        (the engine reads runs, see :meth:`next_run`), and the chain :meth:`recover` returns.
        After an input error, :meth:`recover` it with the number of items the failing run
        gave."""
        got = None
        run: Iterable[Any] | None = None
        x: Any = None
        while True:
            run = x = None  # the last item is not held while the next run is awaited
            run = self.next_run(_SEGMENT_MAX, got)
            if run is None:
                return
            got = 0
            for x in run:
                got += 1
                yield x

    # ----- the input thread -----

    def next_run(self, limit: int, got: int | None) -> Iterable[Any] | None:
        """The next run of the stream, waiting for one; None at the end. ``got``: how many
        items the previous run gave (the reader counts them; None if there was no run since
        the last :meth:`recover`). A job's run reads at most ``limit`` items; it is the
        segment being read (``reading``, cut by :meth:`cut`) from before it is returned, and
        settled by the next call. The stream hears of it (a parked stream takes it up)."""
        try:
            return self._next_run(limit, got)
        finally:
            self.scheduler.input_coming()

    def _next_run(self, limit: int, got: int | None) -> Iterable[Any] | None:
        scheduler = self.scheduler
        while True:
            seg = self.reading
            if seg is not None:
                assert got is not None, "a job's run ended without its count"
                self._settle(seg, got, None)
            budget = scheduler.tasks_per_stream
            if budget and self.sent >= budget:
                self.recycled = True  # the workers ran their tasks: replace them
                return None
            # No reference to a finished job while waiting (its input and results are freed).
            job = seg = chosen = None
            try:
                chosen, cuts = scheduler.next_work(self.generation, self._stop_if_a_worker_died)
            except StopIteration:
                return None
            if isinstance(chosen, tuple):
                self.sent += 1
                return self._premade(chosen)  # a submitted task
            job = chosen
            index = job.pulled
            ahead = job.ahead()
            if budget:
                ahead = min(ahead, budget - self.sent)
            if job.it is not None and job.chunksize is None:
                seg = _Segment(self.pos, job, index, max(1, min(ahead, _SEGMENT_MAX, limit)))
                self.sent += seg.n
                run, seg.gate = gated(job.it, seg.n)
                if job.awaiting_feed:  # handed back (a probe): its caller asks again once
                    run = after_first(run, job.feed_read)  # the feed read an item of it
                self.segs.append(seg)  # registered before the engine sees its first item
                self.reading = seg
                if cuts != scheduler.cuts or job.closed:
                    self.cut()  # something asked for a cut since next_work looked
                # The input may block in next() (on a result its caller is yet to take,
                # after other work of its own): what is ready goes now, not after it.
                scheduler.send_ready()
                return run
            if job.seq is not None:  # a range/list/tuple is sliced
                size = max(1, min(job.chunksize or scheduler.auto_chunk(job), ahead))
                chunk = job.take_chunk(size)
                if chunk is None:
                    continue
                self.sent += len(chunk[3])
                return self._premade(chunk)
            # An iterator with a chunksize waits to fill one.
            size = max(1, min(job.chunksize or 1, ahead))
            try:
                items = list(itertools.islice(job.it, size))  # type: ignore[arg-type]
            except BaseException as e:  # noqa: BLE001 - the input's error, raised in its caller
                job.fail_input(e)
                continue
            job.pulled = index + len(items)  # before input_done: the caller checks both
            self.sent += len(items)
            if len(items) < size:
                self._ended(job)
                if not items:
                    continue
            return self._premade((job.jid, index, job.fn, items, job.mode))

    def _premade(self, item: _WorkItem) -> Iterator[_WorkItem]:
        self.segs.append(_Segment(self.pos))
        self.pos += 1
        # A list iterator lets go of its item once read: the engine's reader, which keeps
        # the run while it waits for the next, does not keep a finished call's arguments.
        return iter([item])

    def _settle(self, seg: _Segment, got: int, error: BaseException | None) -> None:
        """The input thread is done with ``seg``, which gave ``got`` items; its job's input is
        over if it read less than it could without being cut, or failed with ``error``."""
        job = seg.job
        self.pos += got
        self.reading = None
        job.pulled = seg.index + got  # type: ignore[union-attr]
        if error is not None:
            job.fail_input(error)  # type: ignore[union-attr]
        elif got < seg.n and not seg.cut:
            self._ended(job)  # type: ignore[arg-type]

    def recover(self, error: BaseException, got: int) -> Iterator[Any] | None:
        """The engine's input thread got ``error`` from the feed, after ``got`` items of the
        run. The input of the job being read raised: that job fails, and the returned chain
        goes on with the next segment. Anything else is the feed's own failure (None: the
        stream fails)."""
        seg = self.reading
        if seg is None:
            return None
        self._settle(seg, got, error)
        return iter(self)

    def _ended(self, job: _Job) -> None:
        """``job``'s input is over (``job.pulled`` counts every item read)."""
        job.input_done = True
        job.wake()
        self.scheduler.wake_feed()

    def _stop_if_a_worker_died(self) -> None:
        """Before taking more work (under the scheduler's lock): if a worker died, ends the stream
        here (StopIteration), taking nothing. Work sent into a stream with a dead worker
        would fail with it, though the worker died before that work existed (killed while
        the pool was idle, say). Asked whenever nothing is on its way, else at most every
        few ms (a system call per worker)."""
        now = time.monotonic()
        scheduler = self.scheduler
        if now < self._next_health and not scheduler.stream_drained():
            return
        self._next_health = now + _HEALTH_EVERY_S
        if scheduler.worker_died():
            self.stopped_for_death = True
            raise StopIteration

    def cut(self) -> None:
        """Ends the segment being read after the item being read (any thread)."""
        seg = self.reading
        if seg is not None and seg.gate is not None:
            seg.cut = True
            del seg.gate[:]

    # ----- the engine's sender -----

    def pack(self, items: list[Any]) -> list[_WorkItem]:
        """A batch of raw items (the next ``len(items)`` of the stream) -> work items: one
        per run of a segment's items, and premade items as they are. (The engine counts the
        batch's raw items: its results stand for that many.)"""
        segs = self.segs
        pos = self.packed
        end = pos + len(items)
        out: list[_WorkItem] = []
        i = 0
        while pos < end:
            seg = segs[0]
            # Items beyond the last registered segment's start are its own: the input
            # thread registers a segment before the engine reads its first item.
            nxt = segs[1].start if len(segs) > 1 else end
            if nxt <= pos:
                segs.popleft()  # used up (or empty)
                continue
            upto = min(end, nxt)
            m = upto - pos
            job = seg.job
            if job is None:
                out.append(items[i])
            elif job.closed:  # abandoned: its items travel as nothing (see _run_item)
                out.extend([None] * m)  # type: ignore[list-item]
            else:
                out.append(
                    (job.jid, seg.index + pos - seg.start, job.fn, items[i : i + m], job.mode)
                )
            pos = upto
            i += m
        self.packed = end
        return out
