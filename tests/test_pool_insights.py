"""mpire's conveniences beyond the basics: insights (start-up and init time per worker, the
slowest tasks, a readable summary) and a ``task_timeout`` that stops a task stuck in C code
(its worker is killed and replaced; only that task fails). Nothing here asserts a duration
beyond what a task sleeps for."""

from __future__ import annotations

import os
import re

import pool_defs as pd
import pytest
import runner_defs as rd
from easycore.errors import PoolTimeoutError
from easycore.parallel import Pool

METHODS = ["fork", "spawn"]


def _covers(label: str, call: int | None, item: int) -> bool:
    """Whether a slow entry's label names ``item`` (of ``call``, if given)."""
    for part in label.split("; "):
        m = re.fullmatch(r"call (\d+), items? (\d+)(?:\.\.(\d+))?", part)
        if m and (call is None or int(m[1]) == call):
            lo = int(m[2])
            hi = int(m[3]) if m[3] else lo
            if lo <= item <= hi:
                return True
    return False


@pytest.mark.timeout(120)
def test_pool_stats_give_start_up_init_and_the_slowest_tasks():
    with Pool(2, initializer=pd.nap, initargs=(None, 0.3), start_method="fork") as pool:
        # (The others nap 0.1 ms: items that take microseconds may be timed per batch.)
        pairs = [(i, 0.6 if i == 7 else 1e-4) for i in range(20)]
        assert pool.starmap(pd.nap, pairs, chunksize=1) == list(range(20))
        assert pool.submit(pd.nap, "t", 0.4).result(timeout=60) == "t"
        s = pool.stats
    assert set(s.producer_init_s) == {0, 1} and set(s.producer_start_s) == {0, 1}
    for i in (0, 1):
        assert s.producer_init_s[i] >= 0.3  # the initializer slept that long
        assert s.producer_start_s[i] >= s.producer_init_s[i]
    slowest = s.slowest
    assert 2 <= len(slowest) <= 5
    assert [e.seconds for e in slowest] == sorted((e.seconds for e in slowest), reverse=True)
    assert slowest[0].seconds >= 0.6
    assert any(e.seconds >= 0.6 and _covers(e.label or "", None, 7) for e in slowest)
    assert any(e.seconds >= 0.4 and (e.label or "").startswith("task (call ") for e in slowest)
    text = s.summary()
    for word in ("start-up", "init", "in tasks", "slowest", "bottleneck"):
        assert word in text
    assert str(slowest[0]) in text


@pytest.mark.timeout(120)
def test_runner_stats_give_start_up_and_the_slowest_batches():
    with rd.Slow(devices=2, cfg={"sleep": 0.05}) as r:
        r(range(6))
        s = r.stats
    assert set(s.producer_start_s) == {0, 1} and set(s.producer_init_s) == {0, 1}
    assert all(v > 0 for v in s.producer_start_s.values())
    assert 1 <= len(s.slowest) <= 5
    top = s.slowest[0]
    assert top.seconds >= 0.05 and top.label is None and top.producer in (0, 1)
    assert 0 <= top.item < 6 and top.count >= 1
    assert "producer" in s.summary()


@pytest.mark.timeout(120)
def test_the_slowest_are_tasks_and_items_not_messages():
    # A runner's batches hold many items by item 1500: each slow item is an entry of its own.
    with rd.SlowPair(devices=2) as r:
        assert r(range(2000)) == list(range(2000))
        top = r.stats.slowest
    # (Their other items take 20 µs each, so every batch is timed item by item; a busy
    # machine may stall some of them past 0.2 s, but not four.)
    alone = {e.item: e for e in top if e.count == 1}
    assert alone[1500].seconds >= 0.3 and alone[1501].seconds >= 0.2, top
    # Items of microseconds may be timed per batch (a clock read each would cost them too
    # much): an entry then names its range of items.
    with rd.SumSquares(devices=2) as r:
        assert r(range(50_000)) == sum(x * x for x in range(50_000))
        top = r.stats.slowest
    assert top
    for e in top:
        what = f"item {e.item}" if e.count == 1 else f"items {e.item}..{e.item + e.count - 1}"
        assert f"  {what} (producer {e.producer})" in str(e), e
    # A pool's entries are its tasks: each chunk of a map (as multiprocessing.Pool counts
    # tasks) or submitted task, named alone, whatever else its message held.
    with Pool(2, start_method="fork") as pool:
        pairs = [(i, 0.3 if i == 47 else 0.0) for i in range(200)]
        assert pool.starmap(pd.nap, pairs, chunksize=10) == list(range(200))
        futs = [pool.submit(pd.nap, i, 0.2 if i == 3 else 0.0) for i in range(6)]
        assert [f.result(timeout=60) for f in futs] == list(range(6))
        s = pool.stats
    labels = [e.label or "" for e in s.slowest]
    assert "call 1, items 40..49" in labels, labels
    assert any(x.startswith("task (call ") for x in labels), labels
    assert all("; " not in x for x in labels), labels


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", METHODS)
def test_a_task_stuck_in_c_is_stopped_by_killing_its_worker_and_fails_alone(method):
    pool = Pool(2, task_timeout=1.0, start_method=method)
    try:
        stuck = pool.submit(pd.stuck_in_c, 1)  # blocks SIGALRM: the timer cannot stop it
        others = [pool.submit(pd.nap, i, 0.2) for i in range(8)]
        # A call going on meanwhile (lambdas as its function and in its arguments): what it
        # queued that no worker took yet when the stuck worker is killed is sent again.
        k = 3
        calls = [(lambda i=i: i) for i in range(200)]
        going = pool.imap(lambda f: pd.nap(f(), 0.01) + k, calls, chunksize=1)
        with pytest.raises(PoolTimeoutError) as info:
            stuck.result(timeout=60)
        assert isinstance(info.value, TimeoutError) and "task_timeout" in str(info.value)
        pid = int(re.search(r"pid (\d+)", str(info.value))[1])
        assert [f.result(timeout=60) for f in others] == list(range(8))
        assert list(going) == [i + k for i in range(200)]
        # A map whose items all get stuck (both workers at once) fails alone too.
        with pytest.raises(PoolTimeoutError):
            pool.map(pd.stuck_in_c, [0, 1, 2, 3], chunksize=1)
        assert pool.map(pd.square, range(20)) == [x * x for x in range(20)]
        assert pool.submit(os.getpid).result(timeout=60) != pid
        assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    finally:
        pool.terminate()
        pool.join()


@pytest.mark.timeout(150)
def test_task_timeout_grace_is_how_long_a_stopped_task_may_clean_up():
    # The task catches its TimeoutError and cleans up for 2 s: within a 60 s grace it ends
    # on its own (its value is the result); past a 0.2 s one its worker is killed.
    with Pool(1, task_timeout=0.5, task_timeout_grace=60, start_method="fork") as pool:
        assert pool.submit(pd.cleans_up, 1, 2.0).result(timeout=100) == ("cleaned", 1)
    with Pool(1, task_timeout=5.0, task_timeout_grace=0, start_method="fork") as pool:
        assert pool.map(pd.square, range(5)) == [0, 1, 4, 9, 16]  # 0 is a grace too
    pool = Pool(1, task_timeout=0.5, task_timeout_grace=0.2, start_method="fork")
    try:
        with pytest.raises(PoolTimeoutError) as info:
            pool.submit(pd.cleans_up, 2, 30.0).result(timeout=100)
        assert "within 0.2 s more" in str(info.value)
        assert pool.map(pd.square, range(5)) == [0, 1, 4, 9, 16]  # new workers
    finally:
        pool.terminate()
        pool.join()


@pytest.mark.parametrize(
    ("grace", "error"),
    [
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
        (-0.5, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
    ],
)
def test_task_timeout_grace_must_be_a_number_at_least_0(grace, error):
    with pytest.raises(error, match="task_timeout_grace"):
        Pool(1, task_timeout=1.0, task_timeout_grace=grace, start_method="fork")


def test_a_batch_timed_as_a_whole_is_one_entry_naming_its_items():
    # What a producer does for items of microseconds (see easycore._engine.insights): one
    # note for the batch; the caller's entry counts and names its items.
    from types import SimpleNamespace

    from easycore._engine.insights import SLOWEST, SlowItems, merge_slow

    slow = SlowItems()
    assert slow.floor(1) == -1.0
    slow.note(0.004, 100, 100, count=64)
    for k in range(SLOWEST):
        slow.note(0.001 * (k + 1), k, k)
    stats = SimpleNamespace(slowest=[])
    merge_slow(stats, 1, slow.take())
    assert slow.take() is None
    assert [(e.item, e.count) for e in stats.slowest] == [
        (4, 1),
        (100, 64),
        (3, 1),
        (2, 1),
        (1, 1),
    ]
    assert "items 100..163 (producer 1)" in str(stats.slowest[1])
    assert "item 4 (producer 1)" in str(stats.slowest[0])


def test_the_bottleneck_of_large_copied_results_is_their_sending():
    # 2 producers, 1,000 results of 1 MiB in 1 s: producer_work took 20 % of their time,
    # waiting on the queues 10 %, the rest (copying the results into shared memory) is
    # theirs to send: the reading says so, and how to avoid the copy.
    from easycore._engine.stats import RunnerStats

    def stats(per_result: int, waits: float) -> RunnerStats:
        return RunnerStats(
            items=1000,
            bytes_out=1000 * per_result,
            wall_s=1.0,
            producer_busy_s={0: 0.2, 1: 0.2},
            producer_wait_s={0: waits, 1: waits},
        )

    reading = stats(1 << 20, 0.1).bottleneck()
    assert reading.startswith("sending the results: each is 1.00 MiB"), reading
    assert "70%" in reading and "20% in producer_work" in reading, reading
    assert "easycore.shm.empty" in reading, reading
    # Small results: the runner's cost per item, as before.
    assert stats(100, 0.1).bottleneck().startswith("per-item overhead"), stats(100, 0.1)
    # Producers that mostly waited (on the consumer) are not slowed by sending.
    assert not stats(1 << 20, 0.6).bottleneck().startswith("sending"), stats(1 << 20, 0.6)
    # Waits not measured (Ray's actors report none): no reading from them.
    assert not stats(1 << 20, 0.0).bottleneck().startswith("sending"), stats(1 << 20, 0.0)
