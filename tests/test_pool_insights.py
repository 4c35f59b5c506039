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
        pairs = [(i, 0.6 if i == 7 else 0.0) for i in range(20)]
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
