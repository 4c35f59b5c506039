"""The pool's request/response path: an ``imap`` whose input yields item i+1 only after its
caller took result i is read, sent and received by the caller itself (no hand-off through the
pool's input and service threads), while inputs that run ahead keep their batches, and every
pool semantics holds on that path (submit interleaved, several callers, abandoning, input
errors, close, maxtasksperchild, a worker killed between two round trips).

Every verdict counts (``pool.stats.direct_items``, the thread that read each item, batches);
nothing is timed. Each feedback input waits on its results with a timeout of its own, so a
regression fails instead of hanging.
"""

from __future__ import annotations

import functools
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Iterator

import pool_defs as pd
import pytest
from easycore.parallel import Pool

pytestmark = pytest.mark.timeout(180)

N = 400


def _feedback(n: int, got: queue.Queue[int], names: list[str] | None = None) -> Iterator[int]:
    """Yields item i+1 only after result i came back; records the reading thread's name."""
    for i in range(n):
        if i:
            got.get(timeout=30)  # raises queue.Empty instead of hanging
        if names is not None:
            names.append(threading.current_thread().name)
        yield i


def _loop(it: Iterator[int], got: queue.Queue[int], out: list[int], stop: int = -1) -> None:
    for y in it:
        out.append(y)
        if len(out) == stop:
            break
        got.put(y)


def _recorded(n: int, names: list[str]) -> Iterator[int]:
    """``range(n)``, recording the name of the thread that reads each item."""
    for i in range(n):
        names.append(threading.current_thread().name)
        yield i


def _take_the_habit(p: Pool) -> None:
    """A request/response call that its caller read: the pool's next call over an iterator
    starts in its caller's hands."""
    got: queue.Queue[int] = queue.Queue()
    _loop(p.imap_unordered(pd.square, _feedback(N, got)), got, [])
    assert p.stats.direct_items > N // 4  # (the input was handed over)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_feedback_loop_is_read_sent_and_received_by_its_caller(ordered):
    got: queue.Queue[int] = queue.Queue()
    names: list[str] = []
    with Pool(2) as p:
        imap = p.imap if ordered else p.imap_unordered
        out: list[int] = []
        _loop(imap(pd.square, _feedback(N, got, names)), got, out)
        assert sorted(out) == [x * x for x in range(N)]
        if ordered:
            assert out == [x * x for x in range(N)]
        me = threading.current_thread().name
        # The feed reads the first items and each probe's; a loaded machine may interleave
        # differently, hence a generous bound (on the old path: none at all).
        assert names.count(me) > N // 4
        assert p.stats.direct_items > N // 4
        assert p.stats.direct_items <= names.count(me)


def test_a_result_already_there_after_a_callers_send_is_taken_without_a_sleep(
    sleeps_after_results_came,
):
    # Where the worker shares the caller's core, it runs while the caller sends its item,
    # and the result waits when the caller looks: it took it only after saying it would
    # sleep (receiver_sleeps, a few tenths of a microsecond of a round trip).
    slept = sleeps_after_results_came("send_direct")
    got: queue.Queue[int] = queue.Queue()
    with Pool(2) as p:
        out: list[int] = []
        _loop(p.imap_unordered(pd.square, _feedback(N // 4, got)), got, out)
        assert sorted(out) == [x * x for x in range(N // 4)]
        assert p.stats.direct_items > 0
        assert slept[0] == 0  # one each before


@pytest.mark.parametrize("kind", ["by_name", "lambda", "large_partial"])
def test_a_feedback_loop_sends_any_function(kind):
    """The caller's own items carry their function pickled once where plain pickle sends it
    and it is small (the workers keep it), else the function itself."""
    import functools

    k = 7
    big = b"x" * 100_000
    fn = {
        "by_name": pd.square,
        "lambda": lambda x: x * x + k,
        "large_partial": functools.partial(pd.raise_on, bad=big, kind="value"),  # x itself
    }[kind]
    want = {"by_name": lambda x: x * x, "lambda": lambda x: x * x + k}.get(kind, lambda x: x)
    got: queue.Queue[int] = queue.Queue()
    with Pool(2) as p:
        out: list[int] = []
        _loop(p.imap(fn, _feedback(N, got)), got, out)
        assert out == [want(i) for i in range(N)]
        assert p.stats.direct_items > 0


def test_inputs_that_run_ahead_keep_their_batching():
    n = 20_000
    with Pool(2) as p:
        assert p.map(pd.square, range(n)) == [x * x for x in range(n)]  # learn the cost
        assert sum(p.imap_unordered(pd.square, iter(range(n)))) == sum(x * x for x in range(n))
        assert p.stats.direct_items < n // 4
        assert p.stats.batches < n // 4


def test_a_feedback_input_that_turns_fast_is_read_ahead_again():
    got: queue.Queue[int] = queue.Queue()
    slow, fast = 100, 30_000

    def gen() -> Iterator[int]:
        yield from _feedback(slow, got)
        yield from range(slow, slow + fast)

    with Pool(2) as p:
        assert len(p.map(pd.square, range(20_000))) == 20_000  # learn that items are cheap
        out: list[int] = []
        for y in p.imap_unordered(pd.same, gen()):
            out.append(y)
            if y < slow:
                got.put(y)
        assert sorted(out) == list(range(slow + fast))
        # Without the hand-back every item would be read by the caller, one per round trip;
        # the caller asks for the input again only after the feed began to read it, however
        # late the feed runs.
        assert 0 < p.stats.direct_items < fast // 2
        assert p.stats.batches < fast // 2


def test_each_probe_comes_after_the_interval_the_schedule_gives(probes_asked):
    """The caller hands the input back to the feed after exactly the interval the schedule
    (``probes.next_probe_at``) gave, with that interval's items and its time: a schedule that
    keeps the first interval (as for a slow loop) gets a probe every ``PROBE_FIRST`` items."""
    from easycore._engine.probes import PROBE_FIRST

    asked = probes_asked
    got: queue.Queue[int] = queue.Queue()
    with Pool(2) as p:
        out: list[int] = []
        _loop(p.imap(pd.same, _feedback(N, got)), got, out)
        assert out == list(range(N))
        # Each probe ends an interval of PROBE_FIRST items read by the caller, and the input
        # goes back and forth: several probes in N items (one in 16 and a few).
        assert len(asked) >= 3
        assert all(items == PROBE_FIRST and seconds >= 0 for items, seconds in asked)
        assert p.stats.direct_items >= PROBE_FIRST * len(asked)


@pytest.mark.parametrize("how", ["submit", "apply", "map"])
def test_a_loop_that_waits_for_a_task_before_its_next_item_does_not_wait_for_its_input(how):
    """Each round trip of a request/response loop runs a task (or a ``map`` of a list) and
    waits for it before the input may yield its next item. At first (and at each probe)
    the pool's feed reads the input, inside its next() until the loop takes its result:
    work queued for the feed would wait for it for ever. It goes from the loop's thread
    instead."""
    got: queue.Queue[int] = queue.Queue()
    with Pool(2) as p:
        out = []
        for y in p.imap(pd.same, _feedback(60, got)):
            out.append(y)
            if how == "submit":
                assert p.submit(pd.square, y).result(timeout=60) == y * y
            elif how == "apply":
                assert p.apply(pd.square, (y,)) == y * y
            else:  # a call of a list, of a range: its chunks too go without the feed
                assert p.map(pd.square, [y, y + 1]) == [y * y, (y + 1) ** 2]
                assert list(p.imap(pd.square, range(y % 5))) == [x * x for x in range(y % 5)]
            got.put(y)
        assert out == list(range(60))


def test_submit_and_other_callers_interleave_with_a_direct_loop():
    got: queue.Queue[int] = queue.Queue()
    errors: list[BaseException] = []
    callback_threads: list[str] = []

    def other_caller() -> None:
        try:
            for k in range(40):
                fut = p.submit(pd.square, k)
                fut.add_done_callback(
                    lambda _f: callback_threads.append(threading.current_thread().name)
                )
                assert fut.result(timeout=60) == k * k
                assert p.map(pd.square, range(k)) == [x * x for x in range(k)]
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    with Pool(2) as p:
        t = threading.Thread(target=other_caller)
        t.start()
        out = []
        for y in p.imap(pd.same, _feedback(N, got)):
            out.append(y)
            if y % 50 == 7:  # a task from inside the loop, waited on there
                assert p.submit(pd.square, y).result(timeout=60) == y * y
            got.put(y)
        t.join(120)
        assert not t.is_alive() and errors == []
        # A task's result that a caller received in its round trip is routed by the service
        # thread: callbacks run where they always do (or in the submitting thread, if done).
        assert set(callback_threads) <= {"easycore-pool", t.name}
        assert out == list(range(N))
        assert p.stats.direct_items > 0


def test_the_item_read_as_its_caller_hands_the_input_back_goes_out_first(monkeypatch):
    """The item a caller reads as it hands its input back to the feed (a probe) is sent, or
    queued ahead of all else, before the feed may read on: the feed, blocked in an input that
    waits for that item's result, would never send it. Here the stream never lets the caller
    send its items itself (the feed sends them: the stream is busy with others' work, say),
    and the feed gets every chance to read on first."""
    from easycore._engine.probes import PROBE_FIRST
    from easycore.parallel.service import StreamService

    got: queue.Queue[int] = queue.Queue()
    me = threading.current_thread()
    feed_enters = threading.Event()  # the feed asked the input for an item
    in_a_row = [0]  # items the caller read in a row
    probed: list[int] = []

    def feedback(n: int) -> Iterator[int]:
        for i in range(n):
            if threading.current_thread() is not me:
                in_a_row[0] = 0
                feed_enters.set()
            if i:
                got.get(timeout=30)  # raises queue.Empty instead of hanging
            if threading.current_thread() is me:
                in_a_row[0] += 1
                feed_enters.clear()
            yield i

    def round_trip(self: StreamService, item: object, job: object) -> bool:
        if in_a_row[0] == PROBE_FIRST and not probed:
            probed.append(in_a_row[0])
            feed_enters.wait(5)  # the feed's chance to read on before the item is queued
        return False  # queued for the feed

    monkeypatch.setattr(StreamService, "round_trip", round_trip)
    n = 3 * PROBE_FIRST
    with Pool(2) as p:
        out: list[int] = []
        _loop(p.imap(pd.same, feedback(n)), got, out)
        assert out == list(range(n))
        assert probed == [PROBE_FIRST]  # the caller read the input itself, to a probe


def test_two_feedback_loops_from_two_threads():
    results: dict[int, list[int]] = {}

    def run(k: int) -> None:
        got: queue.Queue[int] = queue.Queue()
        out: list[int] = []
        _loop(p.imap_unordered(pd.same, _feedback(N, got)), got, out)
        results[k] = out

    with Pool(2) as p:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        assert sorted(results) == [0, 1]
        assert all(sorted(v) == list(range(N)) for v in results.values())


def test_abandoning_and_input_errors_on_the_direct_path():
    got: queue.Queue[int] = queue.Queue()

    def bad() -> Iterator[int]:
        yield from _feedback(100, got)
        raise pd.CustomError("input broke")

    with Pool(1) as p:
        out: list[int] = []
        _loop(p.imap_unordered(pd.same, _feedback(N, got)), got, out, stop=200)  # break
        assert len(out) == 200
        assert p.stats.direct_items > 0
        got = queue.Queue()
        out = []
        with pytest.raises(pd.CustomError, match="input broke"):
            _loop(p.imap(pd.same, bad()), got, out)
        assert out == list(range(100))
        got = queue.Queue()
        out = []
        _loop(p.imap(pd.same, _feedback(50, got)), got, out)  # the pool stays usable
        assert out == list(range(50))
        assert p.map(pd.square, range(100)) == [x * x for x in range(100)]


def test_the_callers_own_items_fail_one_by_one_as_the_feeds_do():
    """On the direct path (an item read in the caller's thread), an item's error is raised at
    that item, with the results before it; an item that cannot be pickled fails its call
    with the pickler's error naming it, as on the feed's way; the pool goes on."""
    me = threading.current_thread()

    def one_bad(got: queue.Queue[int], bad: object, at: list[int]) -> Iterator[object]:
        """Yields ``bad`` in place of the first item from 100 on that the caller reads itself
        (noted in ``at``), and ends there (nothing waits for its result)."""
        for i in _feedback(N, got):
            if i >= 100 and threading.current_thread() is me:
                at.append(i)
                yield bad
                return
            yield i

    with Pool(2) as p:
        got: queue.Queue[int] = queue.Queue()
        out: list[object] = []
        at: list[int] = []
        fails = functools.partial(pd.raise_on, bad=-1, kind="custom")
        with pytest.raises(pd.CustomError, match="custom -1") as ei:
            _loop(p.imap(fails, one_bad(got, -1, at)), got, out)  # type: ignore[arg-type]
        assert ei.value.code == -1
        assert out == list(range(at[0]))
        got, out, at = queue.Queue(), [], []
        with pytest.raises(TypeError, match="cannot pickle") as te:
            _loop(p.imap(pd.same, one_bad(got, threading.Lock(), at)), got, out)  # type: ignore[arg-type]
        assert te.value.item == at[0]  # type: ignore[attr-defined]
        assert out == list(range(at[0]))
        got, out = queue.Queue(), []
        _loop(p.imap(pd.square, _feedback(50, got)), got, out)  # type: ignore[arg-type]
        assert out == [x * x for x in range(50)]


def test_the_callers_own_items_draw_from_their_own_seeds():
    """With seeds per item, each of the caller's own items still draws from its own seed:
    the same draws with one worker or two, a different one for each item."""

    def run(workers: int) -> tuple[list[object], int]:
        got: queue.Queue[object] = queue.Queue()
        out: list[object] = []
        with Pool(workers, seed=1234, seed_per_item=True) as p:
            _loop(p.imap(pd.augment, _feedback(200, got)), got, out)  # type: ignore[arg-type]
            return out, p.stats.direct_items

    one, direct_one = run(1)
    two, direct_two = run(2)
    assert direct_one > 0 and direct_two > 0
    assert one == two
    assert len({r[1] for r in one}) == 200  # type: ignore[index]


def test_close_reads_a_direct_input_to_its_end():
    """close() + join() while a call's caller holds its input and stopped consuming: the
    feed takes the input back and reads it to its end, as the stdlib's pools do."""
    got: queue.Queue[int] = queue.Queue()
    slow = 60

    def gen() -> Iterator[int]:
        yield from _feedback(slow, got)
        yield from range(slow, slow + 40)

    p = Pool(2)
    it = p.imap(pd.same, gen())
    out = []
    for y in it:
        out.append(y)
        if y == slow - 1:
            break  # (the iterator stays open)
        got.put(y)
    assert p.stats.direct_items > 0
    got.put(slow - 1)
    p.close()
    p.join(60)
    out += list(it)
    assert out == list(range(slow + 40))


def test_a_call_that_follows_a_feedback_call_starts_in_its_callers_hands(tmp_path):
    """The pool's habit: after a request/response call, the next call's caller reads its
    first item itself (no hop through the pool's threads); a call with a ``timeout`` keeps
    its input to the feed; a call on trial whose input runs ahead with slow items hands it
    back while it waits, and its items run side by side (each waits for the other)."""
    me = threading.current_thread().name

    def feedback(n: int, timeout: float | None = None) -> list[str]:
        got: queue.Queue[int] = queue.Queue()  # (one a call: _loop leaves its last result)
        names: list[str] = []
        out: list[int] = []
        _loop(p.imap_unordered(pd.square, _feedback(n, got, names), timeout=timeout), got, out)
        assert sorted(out) == [x * x for x in range(n)]
        return names

    with Pool(2) as p:
        feedback(N)
        assert p.stats.direct_items > N // 4  # (the habit: the input was handed over)
        for _ in range(3):
            assert feedback(50)[0] == me
        assert feedback(50, timeout=60)[0] != me
        assert feedback(50)[0] == me  # (a deadline leaves the habit as it was)
        a, b = str(tmp_path / "a"), str(tmp_path / "b")
        both = list(p.imap_unordered(pd.mark_then_wait, iter([(a, b), (b, a)])))
        assert both == [True, True]


def test_close_reads_a_call_that_started_in_its_callers_hands_and_was_never_iterated():
    """A call that starts in its caller's hands (the pool's habit) and whose results are not
    asked for yet: close() + join() take its input back and read it to its end, as for any
    call (the stdlib's pools finish every task given)."""
    p = Pool(2)
    try:
        _take_the_habit(p)
        it = p.imap(pd.square, iter(range(50)))
        p.close()
        p.join(60)
        assert list(it) == [x * x for x in range(50)]
    finally:
        p.terminate()


def test_a_call_that_started_in_its_callers_hands_is_read_ahead_if_its_caller_waits_not():
    """A call that starts in its caller's hands (the pool's habit) whose caller does not
    ask for a result within its trial: the feed takes the input and reads it ahead, as the
    stdlib's pools start every input at once."""
    names: list[str] = []
    with Pool(2) as p:
        _take_the_habit(p)
        it = p.imap(pd.square, _recorded(50, names))
        deadline = time.monotonic() + 60
        while len(names) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(names) == 50
        assert threading.current_thread().name not in names
        assert list(it) == [x * x for x in range(50)]


def test_a_call_on_the_habit_whose_input_runs_ahead_ends_the_habit():
    """A call that starts in its caller's hands (the pool's habit) and whose input then runs
    ahead leaves no habit: the next call's input is read by the feed from its start (each
    call after it paid a trial, read one item at a time by its caller)."""
    names: list[str] = []
    with Pool(2) as p:
        _take_the_habit(p)
        before = p.stats.direct_items
        assert sorted(p.imap_unordered(pd.square, iter(range(3000)))) == [
            x * x for x in range(3000)
        ]
        assert p.stats.direct_items > before  # it started in its caller's hands
        assert sorted(p.imap_unordered(pd.square, _recorded(50, names))) == [
            x * x for x in range(50)
        ]
        assert names[0] != threading.current_thread().name


def test_maxtasksperchild_keeps_to_the_feed():
    got: queue.Queue[int] = queue.Queue()
    with Pool(2, maxtasksperchild=50) as p:
        out: list[int] = []
        _loop(p.imap(pd.who, _feedback(N, got)), got, out)
        assert len(out) == N
        assert len(set(out)) >= N // 100  # workers were replaced
        assert p.stats.direct_items == 0


def test_a_worker_killed_between_two_round_trips_fails_nothing():
    """A worker killed while nothing is on its way held nothing: the loop goes on (the
    workers restart before its next item is sent), as for a pool that idles."""
    got: queue.Queue[int] = queue.Queue()
    with Pool(1) as p:
        out: list[int] = []
        kills = 0
        for y in p.imap(pd.same, _feedback(N, got)):
            out.append(y)
            # Only while the caller holds its input (between the feed's probes, the feed
            # is inside the input, waiting for the next item: work on its way).
            if y >= 150 * (kills + 1) and p._stream.scheduler.any_direct():
                victim = p._stream.runner._workers.procs[0]
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(30)
                kills += 1
            got.put(y)
        assert out == list(range(N))
        assert kills == 2


def test_ctrl_c_while_the_caller_receives_leaves_no_orphans_or_shared_memory():
    """Ctrl-C reaches a caller while it advances the stream itself (its item is on its way):
    KeyboardInterrupt, the workers stopped, no shared memory left behind."""

    from ctrl_c import assert_workers_and_names_gone, ctrl_c_after

    out = ctrl_c_after(
        """
        import os, queue, time
        from easycore.parallel import Pool

        def slow_from_100(x):
            if x >= 100:
                time.sleep(600)
            return x

        if __name__ == "__main__":
            p = Pool(1, start_method="fork", close_timeout=300)
            print("pids", *[w.pid for w in p._stream.runner._workers.procs], flush=True)
            print("me", os.getpid(), flush=True)
            got = queue.Queue()

            def gen():
                for i in range(1000):
                    if i:
                        got.get(timeout=60)
                    yield i

            try:
                for y in p.imap(slow_from_100, gen()):
                    if y == 99:
                        print("direct", p.stats.direct_items > 0, flush=True)
                        print("started", flush=True)
                    got.put(y)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
        """,
        after="started",
        limit=60,
    )
    assert "direct True" in out
    assert "interrupted" in out
    assert_workers_and_names_gone(out)


# ----- apply and submit(...).result(): a caller that waits for its own task -----

WAYS = ["apply", "submit"]


def _call(p: Pool, way: str, fn, *args):
    """``fn(*args)`` through ``p.apply`` or ``p.submit(...).result()``."""
    if way == "apply":
        return p.apply(fn, args)
    return p.submit(fn, *args).result(timeout=60)


@pytest.mark.parametrize("way", WAYS)
def test_tasks_waited_on_in_a_loop_are_sent_by_their_caller(way):
    with Pool(2) as p:
        assert [_call(p, way, pd.square, i) for i in range(N)] == [i * i for i in range(N)]
        assert p.apply(pd.kwargs_fn, (1,), {"b": 2, "c": 3}) == 6
        assert p.submit(pd.kwargs_fn, 1, b=2, c=3).result(timeout=60) == 6
        # apply: the first goes the common way; after it the service thread leaves the
        # stream to the next ones. submit: sent by its caller whenever nothing is on its
        # way. (A loaded machine may interleave differently: > 0.)
        assert p.stats.direct_items > 0
        assert p.map(pd.square, range(1000)) == [x * x for x in range(1000)]


def test_submits_while_tasks_wait_keep_to_the_feed_and_all_complete():
    with Pool(1) as p:
        futures = [p.submit(pd.square, i) for i in range(300)]  # the first ones go direct
        assert [f.result(timeout=60) for f in futures] == [i * i for i in range(300)]
        assert p.stats.direct_items < 300  # not while others wait (or are on their way)


@pytest.mark.parametrize("way", WAYS)
def test_tasks_after_the_stream_idled_out_go_to_the_next_stream(way):
    """An idle stream ends after a second (the next one keeps its generation): a task sent
    by its caller then must reach the new stream's call, not the old one's."""
    with Pool(1) as p:
        assert [_call(p, way, pd.square, i) for i in range(20)] == [i * i for i in range(20)]
        for _ in range(2):
            time.sleep(1.5)  # longer than a stream's idle end
            assert [_call(p, way, pd.square, i) for i in range(20)] == [i * i for i in range(20)]
        assert p.stats.direct_items > 0


@pytest.mark.parametrize("way", WAYS)
def test_task_errors_on_the_direct_path_fail_that_call_only(way):
    with Pool(1) as p:
        for i in range(50):
            assert _call(p, way, pd.square, i) == i * i
        before = p.stats.direct_items
        for i in range(20):
            with pytest.raises(pd.CustomError, match=f"custom {i}") as info:
                _call(p, way, pd.raise_on, i, i, "custom")
            assert info.value.code == i
            assert _call(p, way, pd.square, i) == i * i  # the pool goes on
        assert p.stats.direct_items > before
        with pytest.raises(Exception, match="pickle|Pickl"):
            _call(p, way, pd.call_it, lambda: threading.Lock())  # a result that cannot travel
        assert _call(p, way, pd.square, 3) == 9


@pytest.mark.parametrize("way", WAYS)
def test_a_worker_killed_between_two_tasks_fails_nothing(way):
    """As for a pool that idles: the next task's caller finds the death before it sends,
    and the workers restart for it."""
    with Pool(1) as p:
        out = []
        for i in range(200):
            out.append(_call(p, way, pd.square, i))
            if i in (60, 140):
                victim = p._stream.runner._workers.procs[0]
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(30)
        assert out == [i * i for i in range(200)]
        assert p.stats.direct_items > 0


@pytest.mark.parametrize("way", WAYS)
def test_a_worker_dying_in_a_direct_task_fails_that_task_and_the_pool_goes_on(way):
    from easycore.errors import WorkerDiedError

    with Pool(1) as p:
        for i in range(50):
            assert _call(p, way, pd.square, i) == i * i
        with pytest.raises(WorkerDiedError):
            _call(p, way, pd.die_on, 7, 7)
        assert [_call(p, way, pd.square, i) for i in range(50)] == [i * i for i in range(50)]


def test_apply_beside_a_direct_loop_submits_and_maps_from_other_threads():
    got: queue.Queue[int] = queue.Queue()
    errors: list[BaseException] = []
    callback_threads: list[str] = []

    def applier() -> None:
        try:
            for k in range(150):
                assert p.apply(pd.square, (k,)) == k * k
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    def submitter() -> None:
        try:
            for k in range(60):
                fut = p.submit(pd.square, k)
                fut.add_done_callback(
                    lambda _f: callback_threads.append(threading.current_thread().name)
                )
                assert fut.result(timeout=60) == k * k
                assert p.map(pd.square, range(k)) == [x * x for x in range(k)]
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    with Pool(2) as p:
        threads = [threading.Thread(target=applier), threading.Thread(target=submitter)]
        for t in threads:
            t.start()
        out: list[int] = []
        _loop(p.imap(pd.same, _feedback(N, got)), got, out)
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads) and errors == []
        assert out == list(range(N))
        # Others' results that a caller received are routed by the service thread.
        assert set(callback_threads) <= {"easycore-pool", threads[1].name}


def test_ctrl_c_during_a_direct_apply_reaches_the_caller_and_the_pool_goes_on():
    from ctrl_c import assert_workers_and_names_gone, ctrl_c_after

    out = ctrl_c_after(
        """
        import os
        import pool_defs as pd
        from easycore.parallel import Pool

        if __name__ == "__main__":
            p = Pool(2, start_method="fork", close_timeout=300)
            print("pids", *[w.pid for w in p._stream.runner._workers.procs], flush=True)
            print("me", os.getpid(), flush=True)
            for i in range(100):
                assert p.apply(pd.square, (i,)) == i * i
            print("direct", p.stats.direct_items > 0, flush=True)
            print("started", flush=True)
            try:
                p.apply(pd.wait_for, ("/nonexistent", 1, 600))
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            print("after", p.apply(pd.square, (3,)), flush=True)
            p.terminate()
            p.join()
        """,
        after="started",
        limit=60,
    )
    assert "direct True" in out
    assert "interrupted" in out
    assert "after 9" in out
    assert_workers_and_names_gone(out)


def test_workers_killed_at_random_while_a_loop_injects_work_never_hang_or_lose_results():
    """A request/response loop whose round trips each run a task and a map of a list (work
    the loop's thread may send itself while the feed is inside the loop's input), with a
    worker SIGKILLed at a random moment of each of several rounds. Whatever the moment, the
    round ends: every result it handed out is right, and it either finished or failed with
    the pool's WorkerDiedError (a BrokenProcessPool); once the worker is dead, the pool
    works again."""
    import random

    from easycore.errors import WorkerDiedError

    rng = random.Random(20261126)
    finished = failed = kills = 0
    with Pool(2) as p:
        for _round in range(12):
            got: queue.Queue[int] = queue.Queue()
            delay = rng.uniform(0.0, 0.06)
            killed = threading.Event()

            def kill_one(delay: float = delay, killed: threading.Event = killed) -> None:
                time.sleep(delay)
                # Empty while the workers restart; one that died is listed until the pool
                # has seen it.
                procs = [w for w in p.worker_processes() if w.is_alive()]
                if procs:
                    victim = procs[rng.randrange(len(procs))]
                    try:
                        os.kill(victim.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        return
                    killed.set()
                    # SIGKILL lands when the victim is next scheduled (milliseconds on a
                    # loaded machine): a call made while it is still dying may fail with it,
                    # as documented. The round ends once it is dead.
                    victim.join(60)

            killer = threading.Thread(target=kill_one)
            out: list[int] = []
            try:
                it = p.imap(pd.same, _feedback(40, got))
                killer.start()
                for y in it:
                    out.append(y)
                    try:
                        assert p.submit(pd.square, y).result(timeout=60) == y * y
                        assert p.map(pd.square, [y, y + 1]) == [y * y, (y + 1) ** 2]
                    finally:
                        got.put(y)  # the input may go on (or end) either way
                assert out == list(range(40))  # ended: every item came, in order
                finished += 1
            except WorkerDiedError:
                assert out == list(range(len(out)))  # what came before, came right
                failed += 1
            finally:
                killer.join(60)
            assert p.map(pd.square, range(50)) == [x * x for x in range(50)]
            kills += killed.is_set()
    assert finished + failed == 12 and kills > 0


@pytest.mark.parametrize("arg", [[3], [2, 3], [4]])
@pytest.mark.parametrize("fails", [False, True])
def test_a_callers_own_item_runs_in_the_worker_as_any_chunk_does(arg, fails):
    """In a worker, an item of the caller's own reads (its function pickled, one argument)
    takes a short way: the same result, or the same report, as the common way."""
    from easycore.parallel import tasks
    from easycore.parallel.feed import _ONE

    fn = functools.partial(pd.raise_on, bad=3, kind="value") if fails else pd.square
    short = tasks._run_item("cpu", None, (1, 5, pickle.dumps(fn, protocol=5), arg, _ONE))
    common = tasks._run_item("cpu", None, (1, 5, fn, arg, _ONE))
    assert short is not None and common is not None
    assert short[:3] == common[:3]
    if short[2]:
        assert short[3][0] == common[3][0] == [fn(x) for x in arg]
        assert short[3][1] > 0
    else:
        drop = ("traceback",)  # (its lines differ)
        assert {k: v for k, v in short[3].items() if k not in drop} == {
            k: v for k, v in common[3].items() if k not in drop
        }
        assert short[3]["item"] == 5 + arg.index(3)


def test_a_callers_own_item_that_finds_the_workers_full_is_sent_once_there_is_room(
    monkeypatch,
):
    """The workers' input queue refuses one of every few of the caller's own sends (as
    when full): the item waits as the call's pending batch and goes out with the next send
    or receive, once; every result comes, in order."""
    from easycore._engine.transport import LocalWorkers
    from easycore.errors import QueueFull

    me = threading.current_thread()
    refused: list[int] = []
    init = LocalWorkers.__init__

    def refusing_init(self: LocalWorkers, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        send = self.send
        tries = [0]

        def sometimes_full(seq: int, kind: int, parts: list[object]) -> None:
            if threading.current_thread() is me:
                tries[0] += 1
                if tries[0] % 5 == 0:
                    refused.append(seq)
                    raise QueueFull("refused by the test")
            send(seq, kind, parts)

        self.send = sometimes_full  # type: ignore[method-assign]

    monkeypatch.setattr(LocalWorkers, "__init__", refusing_init)
    got: queue.Queue[int] = queue.Queue()
    with Pool(2) as p:
        out: list[int] = []
        _loop(p.imap(pd.square, _feedback(N, got)), got, out)
        assert out == [x * x for x in range(N)]
        assert p.stats.direct_items > N // 4
        assert len(refused) > 5
        assert p.map(pd.square, range(100)) == [x * x for x in range(100)]
