"""What every :class:`~easycore.parallel.Pool` is made of, and its life cycle: the
construction (arguments checked, the scheduler and the stream service made), the properties,
``close``/``terminate``/``join``, the finalizer of a pool dropped unclosed, and opening and
reading a ``map``/``imap`` call. ``pool.py`` adds the API its callers use on top.

A pool is three parts, each with its own module and interface:

* a :class:`~easycore.parallel.schedule.Scheduler`: the work waiting (tasks, open calls),
  under one lock;
* a :class:`~easycore.parallel.service.StreamService`: the internal runner and the service
  thread that runs its streams (each reads a :class:`~easycore.parallel.feed.Feed`, which
  asks the scheduler for work);
* the caller's side of each call: ``calls.py`` (results handed out, calls closed).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from multiprocessing import pool as stdlib_pool
from multiprocessing.pool import RemoteTraceback  # type: ignore[attr-defined]
from typing import Any

import easycore.parallel.calls as calls
from easycore._engine import lifecycle
from easycore._engine.lifecycle import Stage
from easycore._engine.stats import RunnerStats
from easycore._engine.stream import progress_bar
from easycore.errors import EasycoreError, InvalidArgument, PoolClosedError
from easycore.parallel.functions import Bodies, portable
from easycore.parallel.hardstop import GRACE_S
from easycore.parallel.job import _Job
from easycore.parallel.schedule import Scheduler
from easycore.parallel.service import StreamService
from easycore.parallel.tasks import _TaskHooks, _TaskRunner, abandoned_ring


class _BothGiven(InvalidArgument, TypeError):
    """``processes`` and ``devices`` were both given (a ``TypeError``, as for conflicting
    arguments, and an :class:`~easycore.errors.InvalidArgument`)."""


def _workers(
    processes: int | Iterable[str] | None, devices: int | Iterable[str] | None, remote: bool
) -> int | Iterable[str]:
    """The runner's ``devices`` from a pool's ``processes`` (how many CPU workers) or
    ``devices`` (one worker per entry)."""
    if processes is not None and devices is not None:
        raise _BothGiven(
            "give processes= (how many CPU worker processes) or devices= (one worker per "
            f"device, as the runners take it), not both: got processes={processes!r}, "
            f"devices={devices!r}"
        )
    if processes is not None:
        if isinstance(processes, int) and processes < 1:
            raise InvalidArgument(f"processes must be at least 1, got {processes}")
        return processes  # an iterable in its place is read as devices (older spelling)
    if devices is None:
        return "all" if remote else os.cpu_count() or 1
    if isinstance(devices, int) and devices < 1:
        raise InvalidArgument(f"devices must be at least 1, got {devices}")
    return devices


def _grace(value: Any) -> float:
    """``task_timeout_grace`` checked: a number of seconds, at least 0 and finite.

    Raises:
        TypeError: not a number (a bool is not one).
        InvalidArgument: negative, infinite or NaN (a ``ValueError``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"task_timeout_grace must be a number of seconds, got {value!r}")
    if not 0 <= value < math.inf:
        raise InvalidArgument(f"task_timeout_grace must be at least 0 and finite, got {value!r}")
    return float(value)


def _cancel(fut: Future[Any]) -> None:
    """Cancels a queued future and says so to those waiting for it: ``concurrent.futures.wait``
    and ``as_completed`` count a cancelled future only once its executor has called
    ``set_running_or_notify_cancel()`` (the stdlib's executors never do for the futures that
    ``shutdown(cancel_futures=True)`` cancels, and ``wait()`` on them waits for ever)."""
    # Taken out of the schedule, the future is the pool's alone: nothing else says anything
    # of it, and a caller's own cancel() leaves it cancelled and not yet said, as this one.
    if fut.cancel():
        fut.set_running_or_notify_cancel()


def _finalize_pool(
    service: StreamService, scheduler: Scheduler, open_flag: list[bool], text: str
) -> None:
    """A pool was collected: warns if it was left open, stops its workers, and fails the
    work still pending (a result or future kept without its pool would otherwise wait
    forever: the stdlib's pool leaves it so)."""
    if open_flag[0]:
        open_flag[0] = False
        if len(open_flag) == 1:  # not an executor's pool (they do not warn, as the stdlib)
            warnings.warn(
                f"unclosed running multiprocessing pool {text}", ResourceWarning, stacklevel=2
            )
    service.fail_pending(
        PoolClosedError(
            f"{text} was garbage-collected while work was pending, without close() or "
            "terminate(): its workers were stopped. Keep a reference to the pool (or use it "
            "in a with block) until its results are taken"
        )
    )
    scheduler.terminate()  # no new work; the service thread finds its pool gone and ends
    try:
        service.stop_workers(interrupt=True, for_good=True)
    except BaseException:  # noqa: BLE001, S110 - nothing to report to: the pool is gone
        pass


class _PoolBase:
    """The parts and the life cycle of a :class:`~easycore.parallel.Pool` (see the module;
    the arguments are documented on ``Pool``)."""

    _runner_cls: type[_TaskHooks] = _TaskRunner
    _remote_tb: type = RemoteTraceback  # a task error's __cause__, as multiprocessing's

    def __init__(
        self,
        processes: int | Iterable[str] | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: Iterable[Any] = (),
        *,
        start_method: str | None = None,
        seed: int | None = None,
        seed_per_item: bool = False,
        worker_exit: Callable[[], Any] | None = None,
        init_timeout: float | None = None,
        task_timeout: float | None = None,
        task_timeout_grace: float = GRACE_S,
        window: int | None = None,
        queue_scale: float = 3.0,
        close_timeout: float = 10.0,
        devices: int | Iterable[str] | None = None,
        backend: Any = None,
        maxtasksperchild: int | None = None,
    ) -> None:
        if maxtasksperchild is not None and (
            type(maxtasksperchild) is not int or maxtasksperchild < 1
        ):
            raise ValueError("maxtasksperchild must be a positive int or None")
        remote = backend is not None and backend != "local"
        workers = _workers(processes, devices, remote)
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        initargs = tuple(initargs)
        # Unless fork is asked for, assume a spawned worker (by value costs nothing under fork).
        how = "ray" if remote else start_method or "spawn"
        init = None if initializer is None else portable(initializer, how)
        if task_timeout is not None and not task_timeout > 0:
            raise InvalidArgument(f"task_timeout must be positive or None, got {task_timeout!r}")
        grace = _grace(task_timeout_grace)
        self._bodies = Bodies()  # large function bodies, stored once (see functions.py)
        # Calls abandoned while their items are queued: the workers skip those items.
        self._abandoned = None if remote else abandoned_ring()
        self._schedule = Scheduler()
        self._stream = StreamService(
            scheduler=self._schedule,
            runner_cls=self._runner_cls,
            devices=workers,
            setup=(init, initargs, self._abandoned),
            window=window,
            remote_tb=self._remote_tb,
            queue_scale=queue_scale,
            start_method=start_method,
            close_timeout=close_timeout,
            seed=seed,
            backend=backend,
            item_seeds=seed_per_item,
            init_timeout=init_timeout,
            task_timeout=task_timeout,
            task_timeout_grace=grace,
            worker_exit=None if worker_exit is None else portable(worker_exit, how),
            # Local workers retire one by one, replaced in the running stream; a remote
            # backend's are replaced together, by a new stream (set_bounds below).
            max_tasks=0 if remote else maxtasksperchild or 0,
        )
        # What easycore.shm's runner= reads of a pool (``_engine/leases.runner_queue``: the
        # input queue whose arena a caller's arrays are leased from).
        self._runner = self._stream.runner
        n = len(self._runner.devices)
        self._max_tasks = maxtasksperchild
        # Tasks sent ahead of the workers: few, so that a future cancelled soon after submit()
        # is still cancellable (it is "running" once sent), yet every worker has a next one.
        self._schedule.set_bounds(
            task_window=max(4, 2 * n),
            tasks_per_stream=(maxtasksperchild or 0) * n if remote else 0,
            direct_ok=not maxtasksperchild,
        )
        self._stream.start(self)
        lifecycle.register(Stage.POOL, self)
        # A pool dropped without close() or terminate() (as multiprocessing.Pool.__del__):
        # a ResourceWarning, and its workers are stopped. The service thread holds the pool
        # only weakly while it waits for work, so an idle dropped pool is collected.
        self._open_flag = [True]  # cleared by close() and terminate()
        fin = weakref.finalize(
            self, _finalize_pool, self._stream, self._schedule, self._open_flag, repr(self)
        )
        fin.atexit = False  # at exit, lifecycle.stop_all stops what is still open

    # ----- properties -----

    @property
    def devices(self) -> list[str]:
        """list[str]: one device per worker process."""
        return self._stream.runner.devices

    @property
    def start_method(self) -> str:
        """str: how worker processes are started."""
        return self._stream.runner.start_method

    @property
    def exit_results(self) -> list[Any]:
        """What ``worker_exit`` returned in each worker (by worker index) when the workers
        last stopped: after :meth:`join` (or leaving a ``with`` block); None for a worker
        that died or, without ``worker_exit``, for every worker."""
        return list(self._stream.runner.exit_results)

    @property
    def seed(self) -> int:
        """int: the base seed; worker ``i`` uses ``seed + i``."""
        return self._stream.runner.seed

    @property
    def stats(self) -> RunnerStats:
        """:class:`~easycore.common.parallel.RunnerStats`: what the pool's stream moved and
        where its time went, as a runner's ``stats`` say of its last call. The pool's calls
        share one stream, so the figures are those of the stream so far (since the workers
        last (re)started: a failure restarts them), all calls and futures together."""
        return self._stream.stats

    def worker_processes(self) -> list[Any]:
        """The worker processes now started, by worker index: the handles the pool itself
        waits on and stops (``pid``, ``name``, ``sentinel``, ``exitcode``, ``is_alive()``,
        ``join(timeout)``, ``terminate()``, ``kill()``): ``multiprocessing`` processes, or
        under fork the same view of a process that the pool's zygote forked.

        Empty while the workers are stopped: once the pool was joined or terminated, and
        from a worker's death until the pool restarts its workers (at its next call). A worker
        that died is listed, not alive, until the pool has seen the death. Killing a worker
        through its handle is a worker's death (see :class:`Pool`).

        Returns:
            list: one handle per worker (a new list each time).

        Raises:
            NotImplementedError: under Ray (the workers are actors, not local processes).
        """
        return self._stream.runner.worker_processes()

    @property
    def service_thread(self) -> threading.Thread | None:
        """threading.Thread: the pool's service thread, which routes results to their calls
        and futures (done-callbacks run in it) and stops the workers at the end; it ends once
        the pool is closed and its work is done, or terminated, or dropped."""
        return self._stream.thread

    # ----- the stdlib's private attributes, which code written for multiprocessing reads -----

    @property
    def _pool(self) -> list[Any]:
        """``multiprocessing.Pool._pool``: the worker processes (:meth:`worker_processes`)."""
        return self.worker_processes()

    @property
    def _processes(self) -> int:
        """``multiprocessing.Pool._processes``: how many workers the pool runs."""
        return len(self.devices)

    def _repopulate_pool(self) -> None:
        """``multiprocessing.Pool._repopulate_pool()``: starts workers in the places of those
        that exited. The pool replaces a worker that retires (``maxtasksperchild``) or is
        stopped (``task_timeout``) itself, as it goes, and restarts its workers after a death
        at its next call: nothing is left to do here."""

    @property
    def _state(self) -> str:
        """``multiprocessing.Pool._state``: ``"RUN"``, ``"CLOSE"`` or ``"TERMINATE"``
        (``multiprocessing.pool``'s constants). Setting it, as CPython's own tests do to make
        a dropped pool warn, only sets whether the pool's finalizer counts it as left open
        (``"RUN"``: a ``ResourceWarning`` when it is collected); a closed pool stays closed."""
        schedule = self._schedule
        if schedule.terminated:
            return stdlib_pool.TERMINATE
        return stdlib_pool.CLOSE if schedule.closing else stdlib_pool.RUN

    @_state.setter
    def _state(self, state: str) -> None:
        states = (stdlib_pool.RUN, stdlib_pool.CLOSE, stdlib_pool.TERMINATE)
        if state not in states:
            raise ValueError(f"a pool's state is one of {states}, got {state!r}")
        self._open_flag[0] = state == stdlib_pool.RUN

    def __repr__(self) -> str:
        schedule = self._schedule
        state = "terminated" if schedule.terminated else "closed" if schedule.closing else "open"
        return (
            f"<{type(self).__name__} devices={self.devices} "
            f"start_method={self.start_method!r} {state}>"
        )

    def __getstate__(self) -> None:
        raise TypeError("a Pool cannot be pickled or sent to another process")

    def _closed_error(self) -> PoolClosedError:
        return PoolClosedError(f"this {type(self).__name__} is closed (Pool not running)")

    def _check_open(self) -> None:
        if self._schedule.closing:
            raise self._closed_error()
        owner = self._stream.owner_pid
        if os.getpid() != owner:
            raise PoolClosedError(
                f"this {type(self).__name__} belongs to process {owner}; a forked child "
                "cannot use it"
            )

    def _check_not_service(self) -> None:
        if self._stream.in_service_thread():
            raise EasycoreError(
                "a Future's done-callback waited on its own pool (the callback runs in the "
                "pool's result thread, which would wait on itself); submit() from a callback "
                "is fine, but wait for results elsewhere"
            )

    # ----- for PoolExecutor -----

    def _for_executor(self, remote_tb: type) -> None:
        """Makes this pool an executor's: a failed future's ``__cause__`` is a
        ``remote_tb``, and a pool dropped unclosed does not warn (as the stdlib's)."""
        self._open_flag.append(False)
        self._stream.remote_tb = remote_tb

    def _cancel_queued(self) -> None:
        """Cancels the queued futures that no worker takes next
        (``shutdown(cancel_futures=True)``)."""
        for fut in self._schedule.cancel_queued():
            _cancel(fut)

    # ----- map calls -----

    def _open_job(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Any],
        mode: int,
        ordered: bool,
        chunksize: int | None,
        timeout: float | None = None,
    ) -> _Job:
        self._check_open()
        if chunksize is not None and not (isinstance(chunksize, int) and chunksize >= 1):
            raise InvalidArgument(f"chunksize must be a positive int or None, got {chunksize!r}")
        f = portable(fn, self._stream.runner.start_method, self._bodies)
        window, room = self._stream.window, self._stream.room

        def make(jid: int) -> _Job:
            return _Job(jid, f, iterable, mode, ordered, window, chunksize, room)

        job = self._schedule.open_job(make, deadline=timeout is not None)
        if job is None:
            raise self._closed_error()
        return job

    def _results(
        self, job: _Job, timeout: float | None, progress: bool | dict[str, Any] = False
    ) -> Iterator[Any]:
        """The results of ``job``, one at a time (see ``calls.py``)."""
        schedule, abandoned = self._schedule, self._abandoned

        def begin() -> Any:
            self._check_not_service()
            return progress_bar(progress, job.total, type(self).__name__) if progress else None

        def close() -> None:
            calls.close_job(job, schedule, abandoned)

        chunks = calls.result_chunks(job, schedule, timeout, begin, close, self.terminate)
        return calls.results(job, chunks, schedule, abandoned)

    # ----- life cycle -----

    def close(self) -> None:
        """Accepts no new work; the workers exit once the work already given is done
        (``join()`` waits for that, not for callers to take their results: the inputs of
        open calls are then read to their end, as the stdlib's pools do). Closing twice is
        harmless."""
        self._open_flag[0] = False
        self._schedule.close()
        self._bodies.clear()  # a call still running holds its own function's body

    def terminate(self) -> None:
        """Stops at once: queued futures are cancelled, running ones and open calls fail with
        :class:`~easycore.errors.RunnerClosedError`, and the workers are stopped (busy ones
        interrupted). Waits for that."""
        self._open_flag[0] = False
        queued = self._schedule.terminate()
        self._bodies.clear()
        for fut in queued:
            _cancel(fut)
        self._stream.abort()
        self._stream.fail_pending(PoolClosedError("the pool was terminated"))
        self.join()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the workers to exit, after :meth:`close` or :meth:`terminate`.

        Args:
            timeout (float, optional): most seconds to wait.

        Raises:
            ValueError: if the pool is still open.
            WorkerError: what a worker's exit raised, if anything.
        """
        if not self._schedule.closing:
            raise ValueError("join() needs close() or terminate() first")
        if self._stream.join(timeout):
            lifecycle.discard(Stage.POOL, self)
            err = self._stream.end_error
            if err is not None:
                self._stream.end_error = None
                raise err


def _keep(obj: Any, fut: Future[Any]) -> None:
    """A done-callback that does nothing: it keeps ``obj`` referenced until ``fut`` is done."""
