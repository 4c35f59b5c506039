"""``concurrent.futures.Executor`` on a :class:`~easycore.parallel.Pool`."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures.process import _RemoteTraceback
from typing import Any, ParamSpec, TypeVar

from easycore._engine import lifecycle
from easycore.errors import BrokenInitializer, RunnerClosedError, WorkerError
from easycore.parallel.pool import Pool

_T = TypeVar("_T")
_P = ParamSpec("_P")


# The pools of live executors: at interpreter exit their pending work is finished (as
# concurrent.futures does), before easycore's own exit hook stops what is left.
_LIVE: weakref.WeakSet[Pool] = weakref.WeakSet()
# The pools of executors dropped without shutdown(), each held by the thread that waits for
# its work (see _drain_dropped).
_DRAINING: dict[Pool, threading.Thread | None] = {}


def _finish_at_exit() -> None:
    for pool in list(_LIVE):
        try:
            pool.close()  # harmless after terminate()
            pool.join()
        except BaseException:  # noqa: BLE001, S110 - exiting: the exit hook stops the rest
            pass
    # Their threads let go of the pools now (a pool still held when the interpreter ends
    # would keep its queues' names in /dev/shm until the next sweep).
    for thread in list(_DRAINING.values()):
        if thread is not None:
            thread.join(30.0)


def _drain_dropped(pool: Pool) -> None:
    """An executor was dropped without ``shutdown()``: its pool takes no new work, and is
    held, by a thread that waits for its pending work and its workers, until both are done
    (collected at once, the pool would stop its workers and fail that work)."""
    pool.close()

    def drain() -> None:
        try:
            pool.join()
        except BaseException:  # noqa: BLE001, S110 - a worker's exit error: nobody to tell
            pass
        finally:
            _DRAINING.pop(pool, None)

    thread = threading.Thread(target=drain, name="easycore-executor-drain", daemon=True)
    _DRAINING[pool] = thread
    try:
        thread.start()
    except RuntimeError:  # no new threads at exit: held here, _finish_at_exit joins it
        _DRAINING[pool] = None


# concurrent.futures finishes its pending work from threading's exit hooks, which run before
# the interpreter joins its threads and, from Python 3.12 on, stop new threads from starting
# (finishing a pool's work may need one). Where that hook is missing, an atexit hook
# registered after easycore's own (imported above) runs before it.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_finish_at_exit)
else:  # pragma: no cover - CPython has had it since 3.9
    atexit.register(_finish_at_exit)
# A multiprocessing child runs threading's exit hooks only after its exit finalizers: there
# the engine's child exit finishes the pending work first.
lifecycle.before_stop(_finish_at_exit)


def _count(max_workers: Any, kwargs: dict[str, Any]) -> int | None:
    """How many workers ``PoolExecutor(max_workers, **kwargs)`` runs, where that is known
    before its pool starts (for an executor whose initializer fails: no pool is left)."""
    devices = kwargs.get("devices")
    given = max_workers if max_workers is not None else devices
    if isinstance(given, int):
        return given
    if isinstance(given, (list, tuple)):
        return len(given)
    if given is None and kwargs.get("backend") in (None, "local"):
        return os.cpu_count() or 1
    return None


class PoolExecutor(Executor):
    """A ``concurrent.futures.Executor`` on a :class:`Pool`; drop-in for
    ``ProcessPoolExecutor``.

    Args:
        max_workers (int or Iterable[str], optional): as ``Pool``'s ``processes`` (a number of
            CPU workers, or a list of devices).
        initializer (Callable, optional): as for :class:`Pool`.
        initargs (tuple): as for :class:`Pool`.
        max_tasks_per_child (int, optional): ``ProcessPoolExecutor``'s worker recycling:
            :class:`Pool`'s ``maxtasksperchild``. As in the stdlib, the start method then
            defaults to spawn, and fork is refused (``ValueError``).
        **kwargs: the other keyword arguments of :class:`Pool`.

    ``ProcessPoolExecutor``'s private attributes that code written for it reads are there,
    backed by the pool's workers: ``_processes`` (pid → process), ``_max_workers``,
    ``_executor_manager_thread``, ``_mp_context``, ``_broken``.
    """

    _pool_cls: type[Pool] = Pool

    def __init__(
        self,
        max_workers: int | Iterable[str] | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: Iterable[Any] = (),
        *,
        max_tasks_per_child: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(max_workers, int) and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if max_tasks_per_child is not None:
            if type(max_tasks_per_child) is not int:
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
            # As ProcessPoolExecutor: workers are restarted while the pool's threads run,
            # which fork must not do; spawn is the default then.
            if kwargs.get("start_method") == "fork":
                raise ValueError(
                    "max_tasks_per_child is incompatible with the 'fork' start method; "
                    "use 'spawn' or 'forkserver'"
                )
            kwargs.setdefault("start_method", "spawn")
            kwargs["maxtasksperchild"] = max_tasks_per_child
        self._broken: str | bool = False  # as ProcessPoolExecutor's: False, or why
        self._mp_context: multiprocessing.context.BaseContext
        self._init_error: BaseException | None = None
        self._n_workers: int | None = _count(max_workers, kwargs)
        try:
            self.pool = self._pool_cls(max_workers, initializer, initargs, **kwargs)
        except WorkerError as e:
            if initializer is None or e.hook != "producer_init":
                raise
            # As ProcessPoolExecutor: the executor is made, broken; its initializer's error
            # is logged (there by the worker) and raised as the cause of what submit raises.
            logging.getLogger("concurrent.futures").critical(
                "Exception in initializer:", exc_info=e
            )
            self._broken = f"A process in the process pool failed in its initializer: {e}"
            self._init_error = e
            self._mp_context = multiprocessing.get_context(kwargs.get("start_method") or "spawn")
            return
        self._n_workers = len(self.pool.devices)
        # Dropped without shutdown(): no warning; a future's error's cause as the stdlib's.
        self.pool._for_executor(_RemoteTraceback)
        # What ProcessPoolExecutor calls its start method (code written for it reads it).
        self._mp_context = multiprocessing.get_context(self.pool.start_method)
        _LIVE.add(self.pool)
        # Dropped without shutdown(): as ProcessPoolExecutor, shutdown(wait=False), the
        # pending futures still finish (at exit, _finish_at_exit waits for them).
        self._dropped = weakref.finalize(self, _drain_dropped, self.pool)
        self._dropped.atexit = False

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Schedules ``fn(*args, **kwargs)`` (see :meth:`Pool.submit`).

        Returns:
            concurrent.futures.Future: the task's result or exception.

        Raises:
            BrokenInitializer: the initializer raised (a ``BrokenProcessPool``).
            RuntimeError: after ``shutdown()``.
        """
        self._check_broken()
        try:
            return self.pool.submit(fn, *args, **kwargs)
        except RunnerClosedError as e:
            raise RuntimeError("cannot schedule new futures after shutdown") from e

    def map(
        self,
        fn: Callable[..., _T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[_T]:
        """``Executor.map``: lazily yields ``fn(*args)`` for the zipped ``iterables``, in order.

        Unlike ``ProcessPoolExecutor.map``, the input is read lazily (bounded in flight).

        Args:
            fn (Callable): any function, lambda or closure.
            *iterables: as for ``map()``.
            timeout (float, optional): seconds the whole iteration may take.
            chunksize (int): items per task (1: item by item; the engine still batches).
            buffersize (int, optional): Python 3.14's ``Executor.map`` argument, accepted so
                that code written for it runs: it bounds the input read ahead, which the pool
                bounds already (by ``window``, and by bytes). Must be None or positive.

        Returns:
            Iterator: the results.
        """
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0")
        self._check_broken()
        try:
            chunk = chunksize if chunksize > 1 else None
            return self.pool.istarmap(fn, zip(*iterables, strict=False), chunk, timeout=timeout)
        except RunnerClosedError as e:
            raise RuntimeError("cannot schedule new futures after shutdown") from e

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accepts no new work; with ``wait``, waits for pending work and the workers.
        Without it, pending work still finishes (at interpreter exit too, as in
        ``concurrent.futures``).

        Args:
            wait (bool): wait for pending futures and the workers to finish.
            cancel_futures (bool): cancel the futures no worker has started.
        """
        if self._init_error is not None:
            return  # no pool was left running
        pool = self.pool
        if cancel_futures:
            # Those the workers take next count as running (the stdlib's call queue holds as
            # many): the rest is cancelled.
            pool._cancel_queued()
        pool.close()
        if wait:
            pool.join()
            # Nothing is left to drain: dropped later (often in a reference cycle, collected
            # whenever the collector runs), the executor starts no thread, which would
            # otherwise run beside whatever the program then forks.
            self._dropped.detach()

    # ----- ProcessPoolExecutor's private attributes, which code written for it reads -----

    @property
    def _processes(self) -> dict[int, Any]:
        """``ProcessPoolExecutor._processes``: the worker processes now started, by pid
        (:meth:`Pool.worker_processes`); empty once shut down (the stdlib's is then None)."""
        if self._init_error is not None:
            return {}
        return {p.pid: p for p in self.pool.worker_processes()}

    @property
    def _max_workers(self) -> int:
        """``ProcessPoolExecutor._max_workers``: how many workers the executor runs (all of
        them from the start, under every start method)."""
        if self._n_workers is None:
            raise AttributeError("how many workers this executor would have run is not known")
        return self._n_workers

    @property
    def _executor_manager_thread(self) -> threading.Thread | None:
        """``ProcessPoolExecutor._executor_manager_thread``: the thread that completes the
        futures and stops the workers once shut down (the pool's
        :attr:`~Pool.service_thread`); None if the initializer failed."""
        if self._init_error is not None:
            return None
        return self.pool.service_thread

    def _check_broken(self) -> None:
        """Raises :class:`BrokenInitializer` if the initializer failed."""
        if self._init_error is not None:
            raise BrokenInitializer(self._broken) from self._init_error
