"""The pool's feed (easycore/parallel/feed.py) driven by hand, without processes: what the
engine's input thread reads and what its sender packs must cover every input item exactly
once, at its index, however batches cut the segments; cuts, input errors and ends."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from easycore.parallel.feed import _ONE, _TASK, Feed
from easycore.parallel.job import ASK, GIVE, READ, WAIT, _Job
from easycore.parallel.schedule import Scheduler


def fn(x):
    return x


class FakeStream:
    """What the scheduler asks of its stream (no processes: nothing died or is on its way)."""

    def worker_died(self) -> bool:
        return False

    def drained(self) -> bool:
        return False

    def compact_input(self) -> None:
        pass

    def input_coming(self) -> None:
        pass

    def round_trip(self, item, job) -> bool:
        return False  # a caller's item goes through the feed

    def auto_chunk(self, job: _Job) -> int:
        return 3

    def injectable(self, generation) -> bool:
        return False  # ready work goes through the feed

    def inject(self, items, generation) -> bool:
        raise AssertionError("not injectable")


class InjectingStream(FakeStream):
    """A stream that takes ready work from any thread while the feed is away (as the
    pool's stream service does), recording it; ``refuse``: it takes nothing (say, a
    worker died)."""

    def __init__(self) -> None:
        self.sent: list = []
        self.refuse = False

    def injectable(self, generation) -> bool:
        return True

    def inject(self, items, generation) -> bool:
        if self.refuse:
            return False
        self.sent.extend((w[0], w[1], w[3]) for w in items)
        return True


class FakePool:
    """A pool's scheduler (the feed's one counterpart) without a pool: jobs and tasks are
    added to it by hand; ``jobs`` is its table of open jobs, changed without a cut."""

    def __init__(self) -> None:
        self.scheduler = Scheduler()
        self.scheduler.attach(FakeStream())
        self.jobs = self.scheduler._jobs
        self.feed: Feed | None = None

    def new_feed(self) -> Feed:
        self.feed = Feed(self.scheduler, 0)
        self.scheduler.begin_stream(self.feed)
        return self.feed

    def close(self) -> None:
        self.scheduler.close()

    def open(
        self,
        jid: int,
        data,
        window: int = 100,
        chunksize: int | None = None,
        deadline: bool = False,
    ) -> _Job:
        job = self.scheduler.open_job(
            lambda _jid: _Job(jid, fn, data, _ONE, True, window, chunksize, [10**6]), deadline
        )
        assert job is not None
        return job

    def submit(self, tid: int) -> None:
        self.scheduler._ids = itertools.count(tid)  # the task's id, as the test names it
        assert self.scheduler.add_task(Future(), b"blob%d" % tid)

    def cut(self) -> None:
        self.scheduler.cut()


def unpack(work: list) -> list:
    """Packed work items -> (job, index, argument) per input item, in stream order."""
    out = []
    for w in work:
        jid, index, f, arg, mode = w
        if mode == _TASK:
            out.append((0, index, arg))
            continue
        assert f is fn
        out.extend((jid, index + k, x) for k, x in enumerate(arg))
    return out


def read(it, n: int) -> list:
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("batch", [1, 2, 3, 7, 50])
def test_packed_batches_cover_every_item_once_at_its_index(batch):
    pool = FakePool()
    feed = pool.new_feed()
    pool.open(1, (x for x in "abcdefghij"), window=4)  # segments of at most 4 items
    pool.open(2, [10, 11, 12, 13, 14])  # a list: premade chunks of 3
    it = iter(feed)
    raw = []
    packed = []
    n_packed = 0  # raw items packed so far
    job1, job2 = pool.jobs[1], pool.jobs[2]
    while len(raw) < 12:  # job 1's 10 items and job 2's two chunks
        raw += read(it, 1)
        if len(raw) % batch == 0:
            packed += feed.pack(raw[n_packed:])
            n_packed = len(raw)
        # the callers consume what was read: room for the next segment
        job1.consumed, job2.consumed = job1.pulled, job2.pulled
    pool.jobs.clear()
    pool.close()
    assert list(it) == []  # the next read finds job 1's end, then the stream's
    assert job1.input_done and job2.input_done
    packed += feed.pack(raw[n_packed:])
    # a run of one segment's items in a batch travels as one work item
    assert len(packed) == len(raw) if batch == 1 else len(packed) < len(raw)
    items = unpack(packed)
    assert sorted((j, i, x) for j, i, x in items if j == 1) == [
        (1, i, x) for i, x in enumerate("abcdefghij")
    ]
    assert sorted((j, i, x) for j, i, x in items if j == 2) == [(2, i, 10 + i) for i in range(5)]
    assert job1.pulled == 10 and job2.pulled == 5


def test_a_submitted_task_cuts_the_segment_and_goes_first():
    pool = FakePool()
    feed = pool.new_feed()
    job = pool.open(1, iter(range(100)))
    it = iter(feed)
    assert read(it, 2) == [0, 1]  # one segment of up to 100 items
    pool.submit(7)  # between two reads: the segment ends before its next item
    task = next(it)
    assert task[0] == 0 and task[4] == _TASK
    assert job.pulled == 2 and not job.input_done, "a cut is not the end of the input"
    assert read(it, 2) == [2, 3]
    assert unpack(feed.pack([0, 1, task, 2, 3])) == [
        (1, 0, 0),
        (1, 1, 1),
        (0, 7, b"blob7"),
        (1, 2, 2),
        (1, 3, 3),
    ]


def test_an_input_error_fails_its_job_only_and_the_feed_goes_on():
    pool = FakePool()
    feed = pool.new_feed()

    def bad():
        yield from (1, 2, 3)
        raise ValueError("input broke")

    job1 = pool.open(1, bad())
    it = iter(feed)
    assert read(it, 3) == [1, 2, 3]
    with pytest.raises(ValueError) as ei:
        next(it)
    it = feed.recover(ei.value, 3)  # the failing run gave 1, 2, 3, then raised
    assert it is not None
    assert job1.pulled == 3 and isinstance(job1.error, ValueError) and job1.input_done
    del pool.jobs[1]
    job2 = pool.open(2, iter("xy"))
    assert read(it, 2) == ["x", "y"]
    del pool.jobs[2]
    pool.close()
    assert list(it) == [], "closed with nothing left: the stream's input ends"
    assert job2.input_done and job2.pulled == 2
    assert unpack(feed.pack([1, 2, 3, "x", "y"])) == [
        (1, 0, 1),
        (1, 1, 2),
        (1, 2, 3),
        (2, 0, "x"),
        (2, 1, "y"),
    ]


def test_the_feeds_own_failure_is_not_recovered():
    pool = FakePool()
    feed = pool.new_feed()
    assert feed.recover(RuntimeError("not from a job's input"), 0) is None


def test_a_closed_job_is_not_read_further():
    pool = FakePool()
    feed = pool.new_feed()
    job = pool.open(1, iter(range(1000)))
    it = iter(feed)
    assert read(it, 3) == [0, 1, 2]
    job.closed = True
    del pool.jobs[1]
    pool.cut()
    pool.close()
    assert list(it) == []
    assert job.pulled == 3 and not job.input_done


def test_window_bounds_each_segment():
    pool = FakePool()
    feed = pool.new_feed()
    job = pool.open(1, iter(range(1000)), window=5)
    it = iter(feed)
    assert read(it, 5) == [0, 1, 2, 3, 4]
    done = threading.Event()

    def more():
        next(it)
        done.set()

    t = threading.Thread(target=more, daemon=True)
    t.start()
    assert not done.wait(0.3), "read past the window while the caller consumed nothing"
    assert job.pulled == 5
    job.consumed = 2
    pool.scheduler.notify()
    assert done.wait(5)
    t.join(5)


def test_a_cut_while_the_input_blocks_takes_effect_after_that_item():
    pool = FakePool()
    feed = pool.new_feed()
    release = threading.Event()

    def slow():
        yield 0
        release.wait(10)
        yield 1
        yield 2

    job = pool.open(1, slow())
    it = iter(feed)
    assert next(it) == 0
    got: list = []
    t = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "the reader waits inside the input"
    pool.submit(5)  # cut while next() blocks
    release.set()
    t.join(10)
    assert got == [1]  # the item being read is kept
    task = next(it)
    assert task[0] == 0 and task[1] == 5
    assert next(it) == 2
    assert job.pulled == 2


def _inside_an_input() -> tuple[FakePool, InjectingStream, Feed, Iterator[Any]]:
    """A pool with an injecting stream whose feed is inside job 1's segment (an iterator
    input: away from ``next_work``), two items read."""
    pool = FakePool()
    stream = InjectingStream()
    pool.scheduler.attach(stream)
    feed = pool.new_feed()
    pool.open(1, iter(range(100)))
    it = iter(feed)
    assert read(it, 2) == [0, 1]
    return pool, stream, feed, it


def test_a_task_submitted_while_the_feed_reads_an_input_goes_without_it():
    """A request/response loop may submit a task and wait for it before its input yields
    the next item: the feed, inside that input's next(), would never send the task. Work
    that is ready (tasks within the window, items to send again) goes from the submitting
    thread then, in order; what the stream refuses goes through the feed as before."""
    pool, stream, feed, it = _inside_an_input()
    pool.submit(7)
    assert stream.sent == [(0, 7, b"blob7")]
    assert pool.scheduler._tasks == collections.deque() and 7 in pool.scheduler._running
    # Beyond the window (4 tasks on their way), tasks wait; each settled one lets the next go.
    for tid in (8, 9, 10, 11, 12):
        pool.submit(tid)
    assert [s[1] for s in stream.sent] == [7, 8, 9, 10]
    assert [q[1] for q in pool.scheduler._tasks] == [11, 12]
    assert pool.scheduler.settle_task(8) is not None
    assert [s[1] for s in stream.sent] == [7, 8, 9, 10, 11]
    # Refused (a dead worker, the call ended): the feed sends it, ahead of the input.
    stream.refuse = True
    assert pool.scheduler.settle_task(9) is not None
    assert [s[1] for s in stream.sent] == [7, 8, 9, 10, 11]
    task = next(it)
    assert task[0] == 0 and task[1] == 12 and task[4] == _TASK
    # While the feed waits for work, it sends tasks itself (nothing is injected).
    stream.refuse = False
    pool.jobs.clear()
    for tid in (7, 10, 11, 12):
        assert pool.scheduler.settle_task(tid) is not None  # nothing waits: nothing sent
    assert [s[1] for s in stream.sent] == [7, 8, 9, 10, 11]
    waiting = threading.Thread(target=lambda: read(it, 1))
    waiting.start()
    try:
        for _ in range(3000):  # until the feed waits (30 s at most)
            if pool.scheduler.feed_waiting:
                break
            time.sleep(0.01)
        assert pool.scheduler.feed_waiting
        pool.submit(13)
        waiting.join(10)
        assert not waiting.is_alive()
        assert [s[1] for s in stream.sent] == [7, 8, 9, 10, 11]
    finally:
        pool.close()
        waiting.join(10)


def test_chunks_of_a_sliced_call_go_while_the_feed_is_inside_an_iterator_input():
    """A ``map`` of a list made inside a request/response loop, while the feed is inside
    the loop's input: its chunks go from the thread that opened it (and, as its caller
    consumes, from that thread), within its room; the feed takes the rest as before."""
    pool, stream, feed, it = _inside_an_input()
    job2 = pool.open(2, list(range(10, 20)), window=6)  # chunks of 3 (FakeStream), room 6
    assert stream.sent == [(2, 0, [10, 11, 12]), (2, 3, [13, 14, 15])]
    assert job2.pulled == 6 and not job2.input_done
    job2.consumed = 6  # its caller took them: room again
    pool.scheduler.notify()
    assert stream.sent[2:] == [(2, 6, [16, 17, 18]), (2, 9, [19])]
    assert job2.pulled == 10 and job2.input_done
    # Within its room only; the rest is the feed's, once it left the segment.
    job3 = pool.open(3, [1, 2, 3, 4], window=3)
    assert stream.sent[4:] == [(3, 0, [1, 2, 3])] and job3.pulled == 3
    job3.consumed = 3
    pool.jobs.pop(1)
    feed.cut()
    chunk = next(it)
    assert chunk[:2] == (3, 3) and chunk[3] == [4] and job3.input_done
    assert len(stream.sent) == 5
    pool.jobs.clear()
    pool.close()
    assert list(it) == []


def test_a_caller_asks_for_its_input_again_only_after_the_feed_began_to_read_it():
    """A probe hands a request/response input back to the feed. However often its caller
    waits before the feed runs (a loaded machine), it asks for the input again only once
    the feed began to read it: an input that turned fast is then read ahead again."""
    pool = FakePool()
    feed = pool.new_feed()
    job = pool.open(1, iter(range(100)))
    with job.lock:
        job.want_direct = True
    job.input_turn()  # the feed hands it over
    job.probe_at = 1  # the probe comes with the caller's first item
    with job.lock:
        assert job.wait_step(True, lambda: True) == READ
    assert job.read_direct() == (job.jid, 0, job.fn_wire(), [0], job.mode)
    assert job.sent_direct()  # handed back
    job.consumed = 1
    with job.lock:
        for _ in range(10):
            assert job.wait_step(True, lambda: True) == WAIT
    it = iter(feed)
    assert read(it, 1) == [1]  # the feed began a segment of it
    with job.lock:
        assert job.wait_step(True, lambda: True) == ASK
    pool.jobs.clear()
    pool.close()
    feed.cut()
    assert list(it) == []


def test_a_call_that_follows_a_request_response_call_starts_with_its_input():
    """The pool's habit: a call that follows one whose caller read its input starts with
    its own in its caller's hands, with its predecessor's probe interval (at most
    PROBE_INHERITED_MAX items, or PROBE_INHERITED_S of a fast loop's pace); one with a
    deadline starts as any call; a list or a chunked call leaves the habit as it is; a call
    whose input ran ahead ends it."""
    from easycore._engine.probes import (
        DIRECT_AFTER,
        PROBE_FIRST,
        PROBE_INHERITED_MAX,
        PROBE_INHERITED_S,
    )

    def first_waits(job: _Job) -> list[int]:
        with job.lock:
            # At the call's start (no result taken yet) no wait counts, habit or not.
            assert [job.wait_step(True, lambda: True) for _ in range(9)] == [WAIT] * 9
            job.pulled = job.consumed = 1  # an item read, its result taken
            return [job.wait_step(True, lambda: True) for _ in range(DIRECT_AFTER)]

    usual = [WAIT] * (DIRECT_AFTER - 1) + [ASK]
    pool = FakePool()
    pool.new_feed()
    job = pool.open(1, iter(range(100)))
    assert first_waits(job) == usual  # no habit yet
    job.input_turn()  # handed over
    job.probe_at = 10 * PROBE_INHERITED_MAX  # (as a fast loop's schedule may have it)
    pool.scheduler.close_job(1)
    for jid, data, chunksize in [(2, [1, 2, 3], None), (3, iter(range(9)), 2)]:
        pool.open(jid, data, chunksize=chunksize)
        pool.scheduler.close_job(jid)  # neither changes the habit
    job = pool.open(4, iter(range(100)))
    assert job.probe_at == PROBE_INHERITED_MAX
    # It starts in its caller's hands, on trial: the caller reads its first item itself.
    assert job.direct and job.trial_until > 0
    with job.lock:
        assert job.wait_step(True, lambda: True) == READ
    job.caller_reads = False
    pool.scheduler.close_job(4)
    # With a deadline (a call's timeout) it is the feed's (its caller never asks for it).
    job = pool.open(41, iter(range(100)), deadline=True)
    assert not job.direct and job.probe_at == PROBE_FIRST and not job.trial_until
    job.ran_ahead()  # several results at once: this input runs ahead
    pool.scheduler.close_job(41)
    job = pool.open(5, iter(range(100)))
    assert job.probe_at == PROBE_FIRST
    assert first_waits(job) == usual
    pool.scheduler.close_job(5)
    # A fast loop (20 µs an item in its last probe interval) inherits up to
    # PROBE_INHERITED_S of its pace, more than PROBE_INHERITED_MAX items.
    job = pool.open(6, iter(range(100)))
    assert first_waits(job) == usual
    job.input_turn()
    job.probe_at, job.probe_pace = 1 << 20, 20e-6
    pool.scheduler.close_job(6)
    job = pool.open(7, iter(range(100)))
    assert job.probe_at == int(PROBE_INHERITED_S / 20e-6) > PROBE_INHERITED_MAX
    pool.scheduler.close_job(7)
    pool.close()


def test_work_left_for_the_feed_goes_as_it_begins_to_read_an_iterator_input():
    """A call of a list opened while the feed chose a request/response input to read next
    (nothing injected: the feed was not inside an input yet) goes as the feed begins that
    input's segment: the input's next() may wait on that call's results."""
    pool = FakePool()
    stream = InjectingStream()
    pool.scheduler.attach(stream)
    feed = pool.new_feed()
    pool.open(1, iter(range(100)))
    job2 = pool.open(2, [5, 6, 7, 8])
    assert stream.sent == [] and job2.pulled == 0
    it = iter(feed)
    assert read(it, 1) == [0]  # job 1 first (round robin), its segment begun
    assert stream.sent == [(2, 0, [5, 6, 7]), (2, 3, [8])] and job2.input_done
    pool.jobs.clear()
    pool.close()
    feed.cut()
    assert list(it) == []


def test_a_call_on_trial_hands_its_input_back_once_the_trial_is_over():
    """A call that starts in its caller's hands on the pool's habit hands its input back to
    the feed (GIVE: the caller wakes it) when its caller waits for its own item past the
    trial, or at a read past it (its clock is read at the 1st, 2nd, 4th... read); the
    interval it inherited stands for the next hand-over."""
    pool = FakePool()
    pool.new_feed()
    pool.scheduler._habit = 64  # (as a request/response call leaves it)
    for jid, how in [(1, "wait"), (2, "read")]:
        job = pool.open(jid, iter(range(100)))
        assert job.direct and job.trial_until > 0
        with job.lock:
            assert job.wait_step(True, lambda: True) == READ
        assert job.read_direct() is not None
        assert not job.sent_direct()  # on trial, within it: the caller keeps its input
        if how == "wait":
            with job.lock:
                assert job.wait_step(True, lambda: True) == WAIT  # its item on its way
                job.trial_until = time.monotonic() - 1.0
                assert job.wait_step(True, lambda: True) == GIVE
        else:
            job.consumed = 1  # its result taken
            job.trial_until = time.monotonic() - 1.0
            with job.lock:
                assert job.wait_step(True, lambda: True) == READ
            assert job.read_direct() is not None
            assert job.sent_direct()  # handed back with this item
        assert not job.direct and job.awaiting_feed and job.trial_until == 0.0
        assert job.probe_at == 64
        assert job.has_room()  # the feed reads it from now on
        pool.scheduler.close_job(jid)


def test_a_closed_job_the_feed_dropped_first_still_leaves_its_habit():
    """A caller's close marks its job closed, then tells the scheduler; a feed that looked
    for work in between dropped it already: its habit (here, a request/response call's) is
    kept all the same (it was lost: the next call started as the first one)."""
    pool = FakePool()
    feed = pool.new_feed()
    job = pool.open(1, iter(range(100)))
    job.handed_over = True  # (its caller read its input: a request/response call)
    with job.lock:
        job.closed = True  # calls.close_job's first step
    it = iter(feed)
    got: list = []
    t = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while 1 in pool.jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 1 not in pool.jobs  # dropped by the feed, which now waits for work
    pool.scheduler.close_job(1)  # calls.close_job's second step finds it gone
    assert pool.scheduler._habit == job.habit(0) > 0
    pool.submit(5)
    t.join(30)
    assert got and got[0][1] == 5
