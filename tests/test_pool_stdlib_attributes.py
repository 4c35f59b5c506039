"""The stdlib's private attributes that code written for ``multiprocessing.Pool`` and
``ProcessPoolExecutor`` reads (``Pool._pool``, ``_processes``, ``_state``;
``ProcessPoolExecutor._processes``, ``_max_workers``, ``_executor_manager_thread``): the
real workers and threads, as they are at each moment (started, killed, replaced, stopped)."""

from __future__ import annotations

import gc
import multiprocessing.pool
import os
import threading
from concurrent.futures.process import BrokenProcessPool

import pool_defs as pd
import pytest
from easycore.errors import InvalidArgument, SerializationError, WorkerDiedError
from easycore.parallel import Pool, PoolExecutor

pytestmark = pytest.mark.timeout(180)

_HANDLE = ("pid", "name", "sentinel", "exitcode", "is_alive", "join", "terminate", "kill")


def _pid(_: object = None) -> int:
    return os.getpid()


def _alive(pool: Pool) -> set[int]:
    return {w.pid for w in pool._pool if w.is_alive()}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_pool_lists_its_worker_processes(start_method: str) -> None:
    with Pool(3, start_method=start_method) as pool:
        assert pool._processes == 3
        workers = pool._pool
        assert len(workers) == 3
        assert workers is not pool._pool  # a new list each time
        assert [w.pid for w in workers] == [w.pid for w in pool.worker_processes()]
        for w in workers:
            assert all(hasattr(w, attr) for attr in _HANDLE), w
            assert isinstance(w.pid, int) and w.pid != os.getpid()
            assert w.is_alive() and w.exitcode is None
        assert set(pool.map(_pid, range(60), chunksize=1)) <= {w.pid for w in workers}
        assert pool._state == multiprocessing.pool.RUN
    assert pool._pool == []
    for w in workers:  # the handles taken earlier see their processes' end
        w.join(60)
        assert not w.is_alive() and w.exitcode == 0


def test_a_killed_worker_is_seen_through_its_handle_and_replaced_in_the_list() -> None:
    with Pool(2, start_method="fork") as pool:
        first = pool._pool
        fut = pool.submit(pd.nap, 1, 300)
        pool.map(pd.square, range(4))  # the nap has a worker by now
        first[0].kill()
        with pytest.raises(BrokenProcessPool) as ei:
            fut.result(timeout=120)
        assert isinstance(ei.value, WorkerDiedError)
        first[0].join(60)
        assert first[0].exitcode == -9 and not first[0].is_alive()
        # The next call restarts the workers (forked by the pool's zygote): listed, alive.
        pid = pool.apply(_pid)
        now = pool._pool
        assert len(now) == 2 and all(w.is_alive() for w in now)
        assert pid in {w.pid for w in now}
        assert not {w.pid for w in first} & {w.pid for w in now}
        # A replacement's handle stops its process too; the pool lists it until it sees it.
        now[1].terminate()
        now[1].join(60)
        assert now[1].exitcode == -15
        assert pool.apply(pd.square, (3,)) == 9
        assert now[1].pid not in _alive(pool)
    assert pool._pool == []
    assert not any(w.is_alive() for w in first + now)


def test_workers_replaced_for_maxtasksperchild_are_the_ones_listed() -> None:
    with Pool(2, start_method="fork", maxtasksperchild=2) as pool:
        first = {w.pid for w in pool._pool}
        ran = set(pool.map(_pid, range(20), chunksize=1))
        assert not ran <= first
        # Between two generations nothing may be listed: a task brings the workers back.
        for _ in range(50):
            now = _alive(pool)
            if len(now) == 2:
                break
            pool.apply(pd.square, (2,))
        assert len(now) == 2 and not now & first
    assert pool._pool == []


def test_pool_state_follows_close_and_terminate() -> None:
    pool = Pool(1, start_method="fork")
    pool.close()
    assert pool._state == multiprocessing.pool.CLOSE
    pool.join()
    assert pool._state == multiprocessing.pool.CLOSE and pool._pool == []
    with pytest.raises(ValueError):
        pool._state = "OPEN"
    other = Pool(1, start_method="fork")
    other.terminate()
    assert other._state == multiprocessing.pool.TERMINATE and other._pool == []


def test_a_pool_forced_back_to_run_warns_when_dropped_and_stays_terminated() -> None:
    # CPython's test_resource_warning: forcing _state to RUN makes a dropped pool warn.
    pool = Pool(1, start_method="fork")
    pool.terminate()
    pool.join()
    pool._state = multiprocessing.pool.RUN
    assert pool._state == multiprocessing.pool.TERMINATE  # it does not reopen
    with pytest.raises(ValueError):
        pool.map(pd.square, [1])
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        del pool
        gc.collect()


def test_executor_processes_max_workers_and_manager_thread() -> None:
    with PoolExecutor(3, start_method="fork") as ex:
        assert ex._max_workers == 3
        procs = ex._processes
        assert len(procs) == 3
        assert all(pid == p.pid and p.is_alive() for pid, p in procs.items())
        pids = {ex.submit(_pid).result(timeout=60) for _ in range(30)}
        assert pids <= set(procs)
        manager = ex._executor_manager_thread
        assert isinstance(manager, threading.Thread) and manager.is_alive()
    assert ex._processes == {}
    assert not manager.is_alive()
    for p in procs.values():
        p.join(60)
        assert p.exitcode == 0
    with PoolExecutor(["cpu", "cpu"], start_method="fork") as ex2:
        assert ex2._max_workers == len(ex2._processes) == 2


def test_shutdown_without_wait_ends_the_manager_thread_and_workers_after_the_work() -> None:
    # CPython's test_shutdown_no_wait, but for its _call_queue (no such queue here).
    ex = PoolExecutor(5, start_method="fork")
    res = ex.map(abs, range(-5, 5))
    processes = ex._processes
    manager = ex._executor_manager_thread
    assert manager is not None
    ex.shutdown(wait=False)
    manager.join(120)
    assert not manager.is_alive()
    for p in processes.values():
        p.join(60)
        assert not p.is_alive()
    assert list(res) == [abs(v) for v in range(-5, 5)]


def test_a_broken_executor_has_no_processes_and_knows_its_size() -> None:
    ex = PoolExecutor(2, initializer=pd.fail_init, start_method="fork")
    assert ex._broken
    assert ex._processes == {} and ex._max_workers == 2
    assert ex._executor_manager_thread is None
    ex.shutdown()


def test_submit_of_a_function_that_cannot_be_sent_fails_its_future() -> None:
    # As ProcessPoolExecutor (CPython's test_saturation submits a semaphore's bound method):
    # submit() returns, and the future holds the error; the pool goes on.
    with PoolExecutor(2, start_method="fork") as ex:
        fut = ex.submit(threading.Lock().acquire)
        err = fut.exception(timeout=60)
        assert isinstance(err, SerializationError) and "cannot be sent" in str(err)
        assert ex.submit(pd.square, 4).result(timeout=60) == 16
    with Pool(1, start_method="fork") as pool:
        res = pool.apply_async(threading.Lock().acquire)
        with pytest.raises(SerializationError):
            res.get(timeout=60)
        with pytest.raises(InvalidArgument):  # not a callable: still refused at once
            pool.submit(1)  # type: ignore[arg-type]
