"""Pool and PoolExecutor as drop-ins for ``multiprocessing.Pool`` and
``concurrent.futures.ProcessPoolExecutor``: no hang on results nobody consumes, abandoned
calls, and the stdlib's exception shapes."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
import zlib
from concurrent.futures import BrokenExecutor
from concurrent.futures.process import BrokenProcessPool

import pool_defs as pd
import pytest
from ctrl_c import gone
from easycore.errors import (
    BrokenInitializer,
    PoolClosedError,
    SerializationError,
    WorkerDiedError,
)
from easycore.parallel import Pool, PoolExecutor
from easycore.parallel.chunk_args import ChunkArgs

pytestmark = pytest.mark.timeout(120)


def _raise_missing(x: int) -> int:
    if x == 2:
        raise KeyError(42)
    return x


def _raise_runtime(x: int) -> int:
    raise RuntimeError("boom", x)


def _slow_square(x: int) -> int:
    time.sleep(0.01)
    return x * x


def test_shutdown_returns_when_a_map_iterator_is_never_consumed() -> None:
    # CPython's test_shutdown_race_issue12456: map() then shutdown(), the results dropped.
    ex = PoolExecutor(2, start_method="fork")
    ex.map(str, [2] * 3)
    ex.shutdown()
    with PoolExecutor(2, start_method="fork") as ex2:
        ex2.map(str, range(100))
    assert not ex2.pool._stream.thread.is_alive()


def test_close_join_finishes_a_retained_unconsumed_imap_and_keeps_its_results() -> None:
    # The caller holds the iterator but takes nothing until after join(): close()/join() end
    # (every task given is done, as in the stdlib), and the results are all still there.
    pool = Pool(2, start_method="fork", window=8)
    it = pool.imap(pd.square, range(200))
    pool.close()
    pool.join(timeout=90)
    assert not pool._stream.thread.is_alive()
    assert list(it) == [x * x for x in range(200)]


def test_breaking_out_of_imap_discards_its_work_and_frees_the_next_call() -> None:
    counter = multiprocessing.Value("q", 0, lock=True)
    pool = Pool(2, start_method="fork", initializer=pd.keep_counter, initargs=(counter,))
    try:
        for i, _ in enumerate(pool.imap(pd.count_and_sleep, itertools.count())):
            if i == 50:
                break
        gc.collect()
        time.sleep(0.5)
        at_break = counter.value
        # The next call is not queued behind the abandoned call's items.
        done = threading.Event()
        out: list[int] = []

        def next_call() -> None:
            out.extend(pool.imap(pd.square, range(50)))
            done.set()

        threading.Thread(target=next_call, daemon=True).start()
        assert done.wait(60), "the next call waited behind the abandoned one"
        assert out == [x * x for x in range(50)]
        time.sleep(0.5)
        # Nothing more of the abandoned call was run once its queued items were discarded.
        after = counter.value - at_break
        print(f"items run: {at_break} by the break (+0.5 s), {after} after it")
        assert after <= 2 * pool._schedule._task_window + 8, (at_break, counter.value)
    finally:
        pool.terminate()


def test_a_task_error_is_the_original_exception_with_its_args() -> None:
    with Pool(2, start_method="fork") as pool:
        with pytest.raises(KeyError) as info:
            pool.map(_raise_missing, range(5), chunksize=1)
        e = info.value
        assert type(e) is KeyError
        assert e.args == (42,)
        assert type(e.__cause__) is multiprocessing.pool.RemoteTraceback
        assert "_raise_missing" in str(e.__cause__)
        assert e.item == 2  # type: ignore[attr-defined]
        assert any("item 2" in note for note in e.__notes__)
        fut = pool.submit(_raise_runtime, 7)
        err = fut.exception(timeout=60)
        assert type(err) is RuntimeError and err.args == ("boom", 7)
        with pytest.raises(RuntimeError) as info2:
            pool.apply(_raise_runtime, (1,))
        assert type(info2.value) is RuntimeError


def test_error_classes_subclass_what_stdlib_users_catch() -> None:
    assert issubclass(WorkerDiedError, BrokenProcessPool)
    assert issubclass(WorkerDiedError, BrokenExecutor)
    assert issubclass(SerializationError, pickle.PicklingError)
    assert issubclass(SerializationError, multiprocessing.pool.MaybeEncodingError)
    assert str(SerializationError("bad")) == "bad"


def test_a_dead_worker_is_a_broken_process_pool() -> None:
    with PoolExecutor(2, start_method="fork") as ex:
        fut = ex.submit(os._exit, 1)
        assert isinstance(fut.exception(timeout=60), BrokenProcessPool)


def test_async_result_timeout_is_multiprocessing_timeout_error() -> None:
    with Pool(1, start_method="fork") as pool:
        res = pool.apply_async(time.sleep, (2,))
        with pytest.raises(multiprocessing.TimeoutError):
            res.get(timeout=0.01)
        with pytest.raises(TimeoutError):
            res.get(timeout=0.01)
        assert res.get(timeout=60) is None


def test_argument_checks_raise_the_stdlib_types() -> None:
    with pytest.raises(TypeError):
        Pool(1, initializer=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        PoolExecutor(0)
    pool = Pool(1, start_method="fork")
    pool.close()
    with pytest.raises(ValueError):
        pool.map(pd.square, [1])
    with pytest.raises(ValueError):
        with pool:
            pass
    pool.join()
    with PoolExecutor(1, start_method="fork") as ex:
        with pytest.raises(ValueError):
            ex.map(pd.square, [1], chunksize=-1)
    with Pool(1, start_method="fork") as pool2:
        with pytest.raises(ValueError):
            pool2.map(pd.square, [1], chunksize=0)


def _ended(pids: list[int], limit: float = 60.0) -> bool:
    """Whether every process of ``pids`` ended within ``limit`` seconds (a hard bound, not a
    timing assertion). Read from ``/proc``, not from the ``Process`` handles: the pool reaps
    its workers through them from its own thread, and a handle that another thread reaped
    says ``is_alive()`` (its ``waitpid`` fails with ECHILD and leaves the exit code unset)."""
    deadline = time.monotonic() + limit
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(gone(pid) for pid in pids)


def test_a_dropped_pool_warns_and_stops_its_workers() -> None:
    pool = Pool(2, start_method="fork")
    assert pool.map(pd.square, range(10)) == [x * x for x in range(10)]
    procs = list(pool._stream.runner._workers.procs)
    time.sleep(1.5)  # idle: its stream ends, the service thread holds it weakly
    service = pool._stream.thread
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        del pool
        gc.collect()
    service.join(60)
    assert not service.is_alive()
    assert _ended([p.pid for p in procs])


def test_a_dropped_executor_does_not_warn() -> None:
    import warnings

    ex = PoolExecutor(1, start_method="fork")
    assert ex.submit(pd.square, 3).result(timeout=60) == 9
    procs = list(ex.pool._stream.runner._workers.procs)
    time.sleep(1.5)  # idle: its stream ends, the service thread holds it weakly
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del ex
        gc.collect()
    assert _ended([p.pid for p in procs])  # its workers are stopped all the same


def test_work_queued_on_a_dropped_pool_fails_instead_of_waiting_forever() -> None:
    # Collected while its service thread held it weakly, the pool stopped its workers and
    # left the queued task's result waiting for ever (as the stdlib's does). If the service
    # thread takes the work before the pool is collected, the work holds the pool and is
    # done: either way the result comes.
    pool = Pool(2, start_method="fork")
    assert pool.map(pd.square, range(4)) == [0, 1, 4, 9]
    time.sleep(1.5)  # idle: its stream ends, the service thread holds it weakly
    res = pool.apply_async(pd.square, (3,))
    fut = pool.submit(pd.square, 4)
    ref = weakref.ref(pool)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del pool
        gc.collect()
        collected = ref() is None
        for get in (res.get, fut.result):
            try:
                assert get(timeout=60) in (9, 16)
            except PoolClosedError as e:
                assert collected, "only a collected pool fails its work"
                assert "garbage-collected while work was pending" in str(e)
        # A pool the work held is collected once its service thread holds it weakly again.
        deadline = time.monotonic() + 60
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
            gc.collect()
        assert ref() is None, "the pool was never collected"
    said = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert any("unclosed running multiprocessing pool" in str(w.message) for w in said)


def test_a_dropped_executor_finishes_its_pending_futures() -> None:
    # As ProcessPoolExecutor: dropped without shutdown() is shutdown(wait=False). Before,
    # a pool collected with work queued stopped its workers and the futures never finished.
    ex = PoolExecutor(2, start_method="fork")
    assert ex.submit(pd.square, 3).result(timeout=60) == 9
    time.sleep(1.5)  # idle: its stream ends, the service thread holds it weakly
    futs = [ex.submit(_slow_square, i) for i in range(6)]
    del ex
    gc.collect()
    assert [f.result(timeout=60) for f in futs] == [i * i for i in range(6)]


def test_an_executor_shut_down_and_dropped_later_starts_no_thread(monkeypatch) -> None:
    # Shut down with wait, an executor has nothing left to drain: collected later (here in a
    # reference cycle, as pytest.raises makes one: whenever the collector runs, maybe while
    # the program forks), it started a thread that joined the joined pool, beside that fork.
    import easycore.parallel.executor as executor

    drained: list[object] = []
    monkeypatch.setattr(executor, "_drain_dropped", drained.append)
    for wait in (True, False):
        ex = PoolExecutor(1, start_method="fork")
        cycle = [ex]
        cycle.append(cycle)
        assert ex.submit(pd.square, 3).result(timeout=60) == 9
        ex.shutdown(wait=wait)
        if not wait:
            ex.pool.join()
        del ex, cycle
        gc.collect()
    # Shut down without wait: the drop still holds its pool until its work is done.
    assert len(drained) == 1


def _sleepy(x: int) -> int:
    time.sleep(0.01)
    return x


@pytest.mark.parametrize("how", ["shutdown_cancel_futures", "terminate"])
def test_futures_the_pool_cancels_count_as_done_for_wait_and_as_completed(how) -> None:
    # concurrent.futures.wait and as_completed count a cancelled future once its executor
    # said so (set_running_or_notify_cancel); the pool only cancelled them, and wait() on
    # them waited for ever (as it does on the stdlib's executor after cancel_futures=True).
    import concurrent.futures as cf

    if how == "terminate":
        pool = Pool(2, start_method="fork")
        futs = [pool.submit(_sleepy, i) for i in range(300)]
        pool.terminate()
    else:
        ex = PoolExecutor(2, start_method="fork")
        futs = [ex.submit(_sleepy, i) for i in range(300)]
        ex.shutdown(wait=False, cancel_futures=True)
    done, not_done = cf.wait(futs, timeout=30)
    assert not not_done, f"{len(not_done)} futures never counted as done"
    assert sum(1 for _ in cf.as_completed(futs, timeout=30)) == len(futs)
    assert sum(f.cancelled() for f in futs) > 0
    if how != "terminate":
        ex.shutdown()


def _failing_input(n: int, bad: int):  # type: ignore[no-untyped-def]
    for i in range(n):
        if i == bad:
            raise OSError("input broke")
        yield i


@pytest.mark.parametrize("chunksize", [None, 1])
def test_imap_yields_the_results_ahead_of_an_input_error(chunksize: int | None) -> None:
    with Pool(2, start_method="fork") as pool:
        it = pool.imap(pd.square, _failing_input(10, 5), chunksize)
        assert [next(it) for _ in range(5)] == [0, 1, 4, 9, 16]
        with pytest.raises(OSError, match="input broke") as info:
            next(it)
        assert info.value.__cause__ is None  # the caller's own error, not a remote one


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@pytest.mark.parametrize("how", ["map", "submit"])
def test_maxtasksperchild_replaces_the_workers_and_keeps_results(how: str) -> None:
    with Pool(2, start_method="fork", maxtasksperchild=3) as pool:
        first = {p.pid for p in pool._stream.runner._workers.procs}
        if how == "map":
            out = pool.map(_square_and_pid, range(30), chunksize=1)
        else:
            futs = [pool.submit(_square_and_pid, x) for x in range(30)]
            out = [f.result(timeout=60) for f in futs]
    assert [r for r, _ in out] == [x * x for x in range(30)]
    pids = {p for _, p in out}
    # 30 tasks, 2 workers, 3 tasks each: at least 5 generations of workers (each ran some)
    assert len(pids) >= 5 and not pids <= first, pids
    assert max(sum(1 for _, p in out if p == pid) for pid in pids) <= 3  # each its own 3


@pytest.mark.parametrize("bad", [0, -1, 0.5, "12"])
def test_maxtasksperchild_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError):
        Pool(1, maxtasksperchild=bad)  # type: ignore[arg-type]


def test_shutdown_without_wait_and_interpreter_exit_finish_pending_tasks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    script = f"""
import sys, time
sys.path.insert(0, {os.path.dirname(__file__)!r})
import pool_defs as pd
from easycore.parallel import PoolExecutor
ex = PoolExecutor(1, start_method="fork")
for i in range(4):
    ex.submit(pd.mark, {str(tmp_path)!r} + f"/done{{i}}", i)
ex.submit(time.sleep, 0.3)
ex.shutdown(wait=False)
"""
    proc = subprocess.run([sys.executable, "-c", script], timeout=90, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"done{i}" for i in range(4)]


def test_shutdown_cancel_futures_cancels_only_tasks_not_started() -> None:
    ex = PoolExecutor(2, start_method="fork")
    fs = [ex.submit(time.sleep, 0.05) for _ in range(50)]
    ex.shutdown(cancel_futures=True)
    cancelled = [f for f in fs if f.cancelled()]
    assert len(cancelled) > 20
    for f in fs:
        if not f.cancelled():  # those already running finished, without error
            assert f.done() and f.exception() is None


class _RefusesPickling:
    """An input whose pickling raises ``RuntimeError`` (CPython's test_map_unplicklable)."""

    def __reduce__(self) -> tuple[object, ...]:
        raise RuntimeError("cannot pickle")


@pytest.mark.parametrize("items", [[1, _RefusesPickling(), 3], iter([1, _RefusesPickling(), 3])])
def test_an_unpicklable_map_input_raises_the_picklers_own_error(items: object) -> None:
    # As multiprocessing.Pool.map: the pickler's exception itself reaches the caller, with
    # easycore's context as a note and the input index; the pool goes on.
    with Pool(2, start_method="fork") as pool:
        with pytest.raises(RuntimeError) as ei:
            pool.map(pd.square, items)  # type: ignore[arg-type]
        assert type(ei.value) is RuntimeError and ei.value.args == ("cannot pickle",)
        notes = "\n".join(getattr(ei.value, "__notes__", []))
        assert "cannot be sent to the workers" in notes and "_RefusesPickling" in notes
        assert ei.value.item == 1  # type: ignore[attr-defined]
        assert "input item 1 of this call" in notes
        with pytest.raises(TypeError, match="cannot pickle"):
            pool.map(pd.square, [threading.Lock()])
        assert pool.map(pd.square, range(4)) == [0, 1, 4, 9]


class _Counted:
    """Counts its live instances in this process (CPython's CountedObject)."""

    alive = 0

    def __new__(cls) -> _Counted:
        cls.alive += 1
        return super().__new__(cls)

    def __del__(self) -> None:
        type(self).alive -= 1


def _identity(x: object) -> object:
    return x


def _make_counted(_: int) -> _Counted:
    return _Counted()


def _gone(refs: list[weakref.ref[_Counted]], every: bool = True) -> bool:
    """Whether the objects of ``refs`` (and with ``every``, all ``_Counted`` objects) are
    freed, looking again for a while (the pool's threads may be between two steps; nothing
    here depends on how long that takes)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gc.collect()
        if all(r() is None for r in refs) and (_Counted.alive == 0 or not every):
            return True
        time.sleep(0.05)
    return False


def test_map_keeps_neither_its_arguments_nor_its_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # CPython's test_release_task_refs: once map() returned and its list is dropped, the
    # arguments and the results (copies made in this process) are freed, while the pool's
    # stream stays open (a task still runs: no later message or idle end frees them).
    release = str(tmp_path / "release")
    with Pool(2, start_method="fork") as pool:
        busy = pool.submit(pd.wait_for, release, "done", 120.0)
        try:
            objs = [_Counted() for _ in range(10)]
            refs = [weakref.ref(o) for o in objs]
            pool.map(_identity, objs)
            del objs
            assert _gone(refs), f"{_Counted.alive} still alive"
            pool.map(_make_counted, range(20))
            assert _gone([]), f"{_Counted.alive} still alive"
        finally:
            open(release, "w").close()
        assert busy.result(timeout=60) == "done"


@pytest.mark.parametrize("how", ["imap", "executor"])
def test_each_result_handed_out_is_freed_when_its_caller_drops_it(how: str) -> None:
    # CPython's test_free_reference: the results iterator holds no result it handed out, not
    # even while the rest of the same chunk waits to be consumed.
    if how == "imap":
        pool = Pool(2, start_method="fork")
        it = pool.imap(_make_counted, range(50))
    else:
        ex = PoolExecutor(2, start_method="fork")
        it = ex.map(_make_counted, range(50))
    try:
        for obj in it:
            ref = weakref.ref(obj)
            del obj
            assert _gone([ref], every=False)
    finally:
        pool.close() if how == "imap" else ex.shutdown()


def _raise_unpickling() -> None:
    raise pickle.UnpicklingError("cannot be rebuilt")


class _ErrorAtUnpickle:
    """Its unpickling raises ``UnpicklingError`` (CPython's test_deadlock)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_raise_unpickling, ())


class _ExitAtUnpickle:
    """Its unpickling calls ``sys.exit(1)`` (CPython's test_deadlock)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (sys.exit, (1,))


class _ErrorAtPickle:
    def __reduce__(self) -> tuple[object, ...]:
        raise pickle.PicklingError("Error in pickle")


def _return_instance(cls: type) -> object:
    return cls()


@pytest.mark.parametrize("bad", [_ErrorAtUnpickle, _ExitAtUnpickle])
def test_a_task_or_result_that_does_not_unpickle_is_a_broken_process_pool(bad: type) -> None:
    # CPython's test_deadlock: a task's arguments that fail to unpickle in the worker, or a
    # result that fails to unpickle in the caller, fail that future with BrokenProcessPool
    # (here also a SerializationError; the pool goes on).
    with PoolExecutor(2, start_method="fork") as ex:
        with pytest.raises(BrokenProcessPool) as ei:
            ex.submit(id, bad()).result(timeout=60)
        assert isinstance(ei.value, SerializationError)
        assert "could not be unpickled in its worker" in str(ei.value)
        with pytest.raises(BrokenProcessPool) as ei:
            ex.submit(_return_instance, bad).result(timeout=60)
        assert isinstance(ei.value, SerializationError)
        assert "could not be unpickled in the caller" in str(ei.value)
        assert ex.submit(pd.square, 4).result(timeout=60) == 16


def test_a_tasks_large_buffers_leave_its_pickle() -> None:
    # submit pickled its arguments into one bytes object: a 1 MiB array was copied into it
    # (a fresh allocation, its pages faulted in), then into the message's segment: 1 GB/s.
    # Buffers of 64 KiB and more now travel out of band, copied once as they are sent.
    import numpy as np
    from easycore.parallel.functions import pickle_args

    big, small = np.arange(1 << 18, dtype=np.int32), np.arange(16)
    parts = pickle_args((pd.square, (big, small), {"k": big[:10]}))
    assert len(parts) == 2 and memoryview(parts[1]).nbytes == big.nbytes
    f, args, kwargs = pickle.loads(parts[0], buffers=parts[1:])
    assert f is pd.square and (args[0] == big).all() and (args[1] == small).all()
    assert (kwargs["k"] == big[:10]).all()
    assert len(pickle_args((pd.square, (small,), {}))) == 1  # small: in the pickle
    strided = pickle.PickleBuffer(memoryview(bytes(1 << 20))[::2])  # no raw bytes
    with pytest.raises(pickle.PicklingError):  # as plain pickle says of it
        pickle_args((pd.square, (strided,), {}))
    assert len(pickle_args((lambda x: x, (big,), {}))) == 2  # cloudpickle's way too


class _Bytes(bytes):
    """A ``bytes`` subclass: pickled as itself, in the pickle."""


def test_large_bytes_arguments_of_tasks_leave_the_pickle() -> None:
    # pickle copies a bytes object into the pickle (its C fast path asks no reducer): a
    # task's 1 MiB bytes argument went into a fresh 1 MiB pickle, then into its segment
    # (0.9 GB/s, as the stdlib's pools). Asked (once a pool's task pickles were large), the
    # task's own large bytes arguments now travel out of band, and arrive as bytes.
    from easycore.parallel.functions import pickle_args

    big, other = bytes(range(256)) * 4096, bytes(1 << 17)
    parts = pickle_args((pd.kinds, (big, b"x", [big]), {"k": other, "s": "y"}), apart=True)
    assert len(parts) == 3 and len(parts[0]) < len(big) + 1024  # the listed one stays in
    f, args, kwargs = pickle.loads(parts[0], buffers=parts[1:])
    assert f is pd.kinds and args == (big, b"x", [big]) and kwargs == {"k": other, "s": "y"}
    assert type(args[0]) is bytes and type(kwargs["k"]) is bytes
    assert len(pickle_args((pd.kinds, (big,), {}))) == 1  # not asked: in the pickle
    assert len(pickle_args((pd.kinds, (b"x", other[:100]), {}), apart=True)) == 1  # small
    crc, crc_other = zlib.crc32(big), zlib.crc32(other)
    want = ([("bytes", crc), ("_Bytes", crc)], {"k": ("bytes", crc_other)})
    with Pool(2) as p:
        for _ in range(3):  # the first pickle is large, the next ones leave it
            assert p.apply(pd.kinds, (big, _Bytes(big)), {"k": other}) == want
            assert p.submit(pd.kinds, big, _Bytes(big), k=other).result(timeout=60) == want
        _fut, blob = p._task(pd.kinds, (big,), {})  # as submit packs it
        assert type(blob) is ChunkArgs and len(blob.parts) == 2, blob
    with PoolExecutor(2) as ex:
        futs = [ex.submit(pd.kinds, big, _Bytes(big), k=other) for _ in range(4)]
        assert [f.result(timeout=60) for f in futs] == [want] * 4


def test_tasks_with_large_array_arguments_run_and_fail_alone() -> None:
    import numpy as np

    big = np.arange(1 << 18, dtype=np.int64)
    want = int(big.sum())
    with Pool(2) as p:
        assert p.submit(np.sum, big).result(timeout=60) == want
        assert p.apply_async(np.sum, (big,)).get(timeout=60) == want
        assert p.apply(np.sum, (big,)) == want
        # The large buffer beside an argument that does not unpickle: its future fails.
        with pytest.raises(BrokenProcessPool, match="could not be unpickled in its worker"):
            p.submit(pd.call_it, id, (big, _ErrorAtUnpickle())).result(timeout=60)
        assert p.submit(np.sum, big).result(timeout=60) == want
    with PoolExecutor(2) as ex:
        futs = [ex.submit(np.add, big, k) for k in range(8)]
        assert [int(f.result(timeout=60)[-1]) for f in futs] == [len(big) - 1 + k for k in range(8)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bad", [_ErrorAtUnpickle, _ExitAtUnpickle])
@pytest.mark.parametrize("how", ["map", "imap", "executor"])
def test_a_map_item_that_does_not_unpickle_fails_its_own_call_only(bad: type, how: str) -> None:
    # The stdlib's executor breaks (BrokenProcessPool); here the error is the same, for the
    # culprit's call only: calls running beside it, and the next ones, go on.
    items = [1, 2, bad(), 4]
    with PoolExecutor(2, start_method="fork") as ex:
        pool = ex.pool
        beside = pool.map_async(pd.square, range(200), chunksize=7)
        task = pool.submit(pd.nap, 3, 0.2)
        with pytest.raises(BrokenProcessPool) as ei:
            if how == "map":
                pool.map(pd.square, items)
            elif how == "imap":
                list(pool.imap(pd.square, iter(items)))
            else:
                list(ex.map(pd.square, items))
        assert isinstance(ei.value, SerializationError)
        assert "could not be unpickled in their worker" in str(ei.value)
        assert beside.get(timeout=60) == [i * i for i in range(200)]
        assert task.result(timeout=60) == 3
        assert pool.map(pd.square, range(5)) == [0, 1, 4, 9, 16]
        assert list(pool.imap(pd.square, iter(range(3)))) == [0, 1, 4]


def test_a_task_that_does_not_pickle_fails_its_future_with_the_picklers_error() -> None:
    # CPython's test_error_at_task_pickle: submit() returns; the future holds the error.
    with PoolExecutor(2, start_method="fork") as ex:
        fut = ex.submit(id, _ErrorAtPickle())
        with pytest.raises(pickle.PicklingError, match="Error in pickle") as ei:
            fut.result(timeout=60)
        assert type(ei.value) is pickle.PicklingError
        assert "cannot be sent to the workers" in "".join(ei.value.__notes__)
        assert ex.submit(pd.square, 4).result(timeout=60) == 16


@pytest.mark.parametrize("case", ["exit", "atexit-submit"])
def test_interpreter_exit_finishes_a_task_and_refuses_one_from_an_exit_hook(case: str) -> None:
    # CPython's test_interpreter_shutdown and test_submit_after_interpreter_shutdown, run on
    # PoolExecutor itself (through the conformance adapter they cannot be: their fresh
    # interpreter imports the executor by name from concurrent.futures).
    import subprocess

    head = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
    if case == "exit":
        script = head + (
            "import time, pool_defs as pd\n"
            "from easycore.parallel import PoolExecutor\n"
            "t = PoolExecutor(5, start_method='fork')\n"
            "t.submit(pd.nap, 'apple', 1.0).add_done_callback(lambda f: print(f.result()))\n"
        )
    else:
        script = head + (
            "import atexit\n"
            "@atexit.register\n"
            "def run_last():\n"
            "    try:\n"
            "        t.submit(id, None)\n"
            "    except RuntimeError:\n"
            "        print('runtime-error')\n"
            "        raise\n"
            "from easycore.parallel import PoolExecutor\n"
            "t = PoolExecutor(5, start_method='fork')\n"
            "assert t.submit(abs, -42).result() == 42\n"
        )
    proc = subprocess.run([sys.executable, "-c", script], timeout=90, capture_output=True)
    out, err = proc.stdout.decode().strip(), proc.stderr.decode()
    assert proc.returncode == 0, err[-2000:]
    if case == "exit":
        assert out == "apple" and not err, err[-2000:]
    else:
        assert out == "runtime-error"
        assert "RuntimeError: cannot schedule new futures" in err


@pytest.mark.timeout(120)
def test_work_first_sent_while_the_interpreter_exits_finishes() -> None:
    # A threading exit hook runs while the interpreter exits, where Python 3.12 starts no
    # thread: the pool's stream, started there for the first time, reads its input without
    # its input thread. Registered after the executor's own hook, it runs before it.
    import subprocess

    script = (
        f"import sys, threading; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "import pool_defs as pd\n"
        "from easycore.parallel import PoolExecutor\n"
        "ex = PoolExecutor(2, start_method='fork')\n"
        "def late():\n"
        "    fs = [ex.submit(pd.square, i) for i in range(5)]\n"
        "    print(list(ex.map(pd.square, range(5, 8))), [f.result(timeout=60) for f in fs])\n"
        "threading._register_atexit(late)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=90, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split("\n")[0] == "[25, 36, 49] [0, 1, 4, 9, 16]"


@pytest.mark.timeout(120)
def test_an_executor_whose_initializer_fails_is_broken(caplog: pytest.LogCaptureFixture) -> None:
    # As ProcessPoolExecutor: made, then broken; what submit and map raise is a
    # BrokenProcessPool, caused by the initializer's own error; the error is logged.
    with caplog.at_level("CRITICAL", logger="concurrent.futures"):
        ex = PoolExecutor(2, initializer=pd.fail_init, start_method="fork")
    assert ex._broken
    assert any("Exception in initializer" in r.getMessage() for r in caplog.records)
    with ex:
        for call in (lambda: ex.submit(pd.square, 2), lambda: ex.map(pd.square, [1])):
            with pytest.raises(BrokenProcessPool) as ei:
                call()
            assert isinstance(ei.value, BrokenExecutor)
            assert isinstance(ei.value, BrokenInitializer)
            assert isinstance(ei.value.__cause__, pd.CustomError)
    with PoolExecutor(1, start_method="fork") as ok:
        assert not ok._broken
