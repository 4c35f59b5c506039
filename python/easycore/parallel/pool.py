"""A function-style process pool on the runners' engine.

``Pool`` is the API of ``multiprocessing.Pool`` and ``concurrent.futures`` (``map``,
``imap``, ``imap_unordered``, ``starmap``, ``submit`` → ``Future``, ``apply_async``) on the
same producers, Rust shared-memory queues, adaptive batching, devices, seeds and failure
semantics as :mod:`easycore.common.parallel`. There is one dispatcher, the runners': the pool
owns an internal runner whose ``producer_work`` calls the shipped function (``tasks.py``),
and keeps one streaming call of it open while the pool lives.

How work travels::

    map/imap inputs ─┐                                  ┌─▶ map/imap jobs (by job id)
    submit tasks ────┴─▶ [feed] ─▶ runner stream ─▶ [service thread]
                                  (engine: batches,    └─▶ futures (by task id)
                                   queues, producers)

* The feed (``feed.py``) is the stream's input iterable: it takes queued ``submit`` tasks
  first, then items of the open ``map``/``imap`` jobs in turn, each job at most ``window`` items
  ahead of what its caller consumed (so a lazy input is read lazily and memory stays bounded).
  An input iterator is read item by item at C speed, in segments that the engine's sender
  packs into one work item per run of a job's items.
* Every item is ``(job, index, function, argument, mode)``; a producer returns
  ``(job, index, ok, value)``. A task's exception is caught in the producer and re-raised in
  the caller as the stdlib's pools do (the original exception, its type and ``args``, with
  the remote traceback as ``__cause__``; ``job.task_error``), so it fails only its own job
  or future while the stream goes on.
* A function that plain pickle sends by name travels so; others (lambdas, closures, functions
  of an interactive ``__main__``) travel by value with cloudpickle, which each producer
  unpickles once and caches (``functions.py``). Within one batch a function is pickled once
  (pickle's memo).
* If the stream fails (a producer died, an item or result could not be pickled), every pending
  job and future fails with that error, and the pool restarts its producers at its next task.
  The feed looks at the producers before it takes more work: if one died, it takes nothing,
  and if then everything sent comes back, nothing was lost and nothing fails (the stream is
  restarted quietly, see ``Pool._quiet_restart``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from multiprocessing.pool import RemoteTraceback  # type: ignore[attr-defined]
from typing import Any, ParamSpec, TypeVar, cast

from easycore._engine import lifecycle
from easycore._engine.lifecycle import TICK, Stage
from easycore._engine.stats import RunnerStats
from easycore._engine.stream import progress_bar
from easycore._engine.zygote import await_thread_gone
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    PoolClosedError,
    PoolTimeoutError,
    SerializationError,
)
from easycore.parallel.feed import _ONE, _STAR, Feed
from easycore.parallel.functions import Bodies, pickle_args, portable
from easycore.parallel.job import _Job
from easycore.parallel.results import AsyncResult, _async_result
from easycore.parallel.service import _WINDOW, StreamService, _service_main
from easycore.parallel.tasks import _TaskHooks, _TaskRunner, abandoned_ring, mark_abandoned

_T = TypeVar("_T")
_S = TypeVar("_S")
_P = ParamSpec("_P")


# ----- in the caller -----


def _finalize_pool(runner: Any, cv: threading.Condition, open_flag: list[bool], text: str) -> None:
    """A pool was collected: warns if it was left open, and stops its workers."""
    if open_flag[0]:
        open_flag[0] = False
        if len(open_flag) == 1:  # not an executor's pool (they do not warn, as the stdlib)
            warnings.warn(
                f"unclosed running multiprocessing pool {text}", ResourceWarning, stacklevel=2
            )
    with cv:
        cv.notify_all()  # the service thread finds its pool gone and ends
    try:
        runner._shutdown(interrupt=True)
    except BaseException:  # noqa: BLE001, S110 - nothing to report to: the pool is gone
        pass
    runner._close_zygote()


def _abandon(job: _Job, pool: weakref.ref[Pool]) -> None:
    """``job``'s results iterator was dropped: the call is abandoned. Takes no lock (this
    runs wherever the garbage collector does): the feed drops a closed job."""
    job.closed = True
    p = pool()
    if p is not None:
        mark_abandoned(p._abandoned, job.jid)
    feed = p._feed if p is not None else None
    if feed is not None:
        feed.cut()


def _keep(obj: Any, fut: Future[Any]) -> None:
    """A done-callback that does nothing: it keeps ``obj`` referenced until ``fut`` is done."""


class Pool(StreamService):
    """A pool of worker processes with the API of ``multiprocessing.Pool`` and
    ``concurrent.futures``, on easycore's runner engine.

    Functions, lambdas and closures are accepted under every start method. A task's exception
    is re-raised in the caller as ``multiprocessing`` re-raises it: the original exception
    (its type and ``args``), with the remote traceback as ``__cause__``, and easycore's
    context as attributes (``item``, ``device``, ``hook``) and a note; a worker that dies
    while work is on its way fails every pending call and future with
    :class:`~easycore.errors.WorkerDiedError` (a ``BrokenProcessPool``) at once (the pool
    restarts its workers at the next call); one that died while nothing was on its way fails
    nothing.

    Args:
        processes (int or Iterable[str], optional): an int ``n`` starts ``n`` ``"cpu"``
            workers; an iterable gives one worker per device, such as ``["cuda:0", "cuda:1"]``
            (as the runners take ``devices``); default ``os.cpu_count()``.
        devices (int or Iterable[str], optional): the runners' spelling of ``processes``
            (give one or the other), e.g. ``Pool(devices=["cuda:0", "cuda:1"])``.
        initializer (Callable, optional): run once in each worker before any task, as
            ``initializer(*initargs)``; what it returns is that worker's :func:`context`.
        initargs (tuple): arguments of ``initializer``.
        start_method (str, optional): ``"fork"``, ``"spawn"`` or ``"forkserver"``; default
            as the runners choose (fork on Linux for CPU workers made while one thread runs).
        seed (int, optional): worker ``i`` seeds ``random``, numpy and torch with
            ``seed + i``; default a random base.
        seed_per_item (bool): also seed ``random``, numpy's global generator and torch's CPU
            generator (where imported) before *each item* (and each task), from ``seed``, the call
            and the item's index: what an item draws is then the same with any number of
            workers and any scheduling, run after run (give ``seed``). Costs about 4 to
            7 µs per item (more with numpy and torch imported); off by default.
        worker_exit (Callable, optional): called with no argument in each worker as it
            stops (after its last task; :func:`context` still works); what it returns is in
            :attr:`exit_results` once :meth:`join` returned.
        init_timeout (float, optional): most seconds the workers may take to start and run
            ``initializer`` (default 600); past it they are stopped and
            :class:`~easycore.errors.RunnerTimeoutError` (a ``TimeoutError``) is raised,
            by the constructor or by the call that restarts them. ``close_timeout`` bounds
            ``worker_exit`` likewise (then the worker is terminated).
        task_timeout (float, optional): most seconds one task or one ``map`` item may run:
            past it a ``TimeoutError`` is raised inside it (a timer of the worker process),
            which stops it and fails that item's call or future only; the worker goes on.
            Python code and interruptible waits stop; a C call that never returns to Python
            does not. Local workers only (ignored under Ray). Costs a few microseconds per
            item; off by default.
        window (int, optional): most items of one ``map``/``imap`` read ahead of what its
            caller consumed, and most items in flight; default 65536, so that cheap items
            travel in large batches and are read in long runs. Items in flight and results
            waiting for their caller are also bounded by bytes, so large items are held to a
            few.
        queue_scale (float): scales the shared-memory queues (as for the runners).
        close_timeout (float): seconds ``close()``/``join()`` leave the workers to exit.
        maxtasksperchild (int, optional): replace the workers after this many tasks each
            (``multiprocessing.Pool``'s worker recycling, for code that leaks): once the
            pool has sent ``maxtasksperchild`` × workers tasks (a submitted task, or one
            item of a ``map``), it stops sending, lets them finish, and starts new workers
            for the rest. Every worker is replaced together, so one worker may run more
            than its share (at most ``maxtasksperchild`` × workers) when others are slow.
            Default None: workers live as long as the pool.
        backend (str or object, optional): where the workers run, as for the runners:
            ``"ray"`` (or an ``easycore.ray.RayBackend``) makes each worker a Ray actor
            (``processes`` then as the Ray backend's ``devices``; default ``"all"``, one
            worker per CPU of the cluster). See docs/ray.md.
    """

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
        if devices is not None:
            if processes is not None:
                raise InvalidArgument("give processes or devices, not both")
            processes = devices
        remote = backend is not None and backend != "local"
        if processes is None:
            processes = "all" if remote else os.cpu_count() or 1
        if isinstance(processes, int) and processes < 1:
            raise InvalidArgument(f"processes must be at least 1, got {processes}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        initargs = tuple(initargs)
        # Unless fork is asked for, assume a spawned worker (by value costs nothing under fork).
        how = "ray" if remote else start_method or "spawn"
        init = None if initializer is None else portable(initializer, how)
        if task_timeout is not None and not task_timeout > 0:
            raise InvalidArgument(f"task_timeout must be positive or None, got {task_timeout!r}")
        self._cv = threading.Condition(threading.Lock())
        self._bodies = Bodies()  # large function bodies, stored once (see functions.py)
        # (future, task id, pickle)
        self._tasks: collections.deque[tuple[Future[Any], int, bytes]] = collections.deque()
        self._running: dict[int, Future[Any]] = {}  # sent tasks by id
        self._jobs: dict[int, _Job] = {}  # open map/imap calls by id
        self._ids = itertools.count(1)
        self._turn = 0
        self._generation = 0
        self._feed: Feed | None = None  # the current stream's input
        self._cuts = 0  # times the feed was asked to end the segment it reads (see feed.py)
        self._feed_waiting = False
        self._quiet_before = False  # the last stream failure was a quiet restart
        self._closing = False
        self._terminated = False
        self._call: Any = None
        # Calls abandoned while their items are queued: the workers skip those items.
        self._abandoned = None if remote else abandoned_ring()
        self._runner = self._runner_cls(
            processes,
            (init, initargs, self._abandoned),
            queue_scale=queue_scale,
            start_method=start_method,
            window=window or _WINDOW,
            close_timeout=close_timeout,
            seed=seed,
            backend=backend,
            on_unsendable=weakref.WeakMethod(self._unsendable),
            item_seeds=seed_per_item,
            init_timeout=init_timeout,
            task_timeout=task_timeout,
            worker_exit=None if worker_exit is None else portable(worker_exit, how),
        )
        self._window = self._runner._window
        self._recycle = False
        self._tasks_per_stream = (maxtasksperchild or 0) * len(self._runner.devices)
        # Tasks sent ahead of the workers: few, so that a future cancelled soon after submit()
        # is still cancellable (it is "running" once sent), yet every worker has a next one.
        self._task_window = max(4, 2 * len(self._runner.devices))
        self._item_cost = 0.0  # worker seconds per map item, learned
        self._room = [_WINDOW]  # results a job may hold ahead of its caller (by bytes)
        self._n_results = 0  # map results received by the current stream
        self._service = threading.Thread(
            target=_service_main,
            args=(weakref.ref(self), self._cv),
            name="easycore-pool",
            daemon=True,
        )
        self._service.start()
        lifecycle.register(Stage.POOL, self)
        # A pool dropped without close() or terminate() (as multiprocessing.Pool.__del__):
        # a ResourceWarning, and its workers are stopped. The service thread holds the pool
        # only weakly while it waits for work, so an idle dropped pool is collected.
        self._open_flag = [True]  # cleared by close() and terminate()
        fin = weakref.finalize(
            self, _finalize_pool, self._runner, self._cv, self._open_flag, repr(self)
        )
        fin.atexit = False  # at exit, lifecycle.stop_all stops what is still open

    # ----- properties -----

    @property
    def devices(self) -> list[str]:
        """list[str]: one device per worker process."""
        return self._runner.devices

    @property
    def start_method(self) -> str:
        """str: how worker processes are started."""
        return self._runner.start_method

    @property
    def exit_results(self) -> list[Any]:
        """What ``worker_exit`` returned in each worker (by worker index) when the workers
        last stopped: after :meth:`join` (or leaving a ``with`` block); None for a worker
        that died or, without ``worker_exit``, for every worker."""
        return list(self._runner.exit_results)

    @property
    def seed(self) -> int:
        """int: the base seed; worker ``i`` uses ``seed + i``."""
        return self._runner.seed

    @property
    def stats(self) -> RunnerStats:
        """:class:`~easycore.common.parallel.RunnerStats`: what the pool's stream moved and
        where its time went, as a runner's ``stats`` say of its last call. The pool's calls
        share one stream, so the figures are those of the stream so far (since the workers
        last (re)started: a failure restarts them), all calls and futures together."""
        call = self._call
        return call.stats_now() if call is not None else self._runner.stats

    def __repr__(self) -> str:
        state = "terminated" if self._terminated else "closed" if self._closing else "open"
        return (
            f"<{type(self).__name__} devices={self.devices} "
            f"start_method={self.start_method!r} {state}>"
        )

    def __getstate__(self) -> None:
        raise TypeError("a Pool cannot be pickled or sent to another process")

    def _check_open(self) -> None:
        if self._closing:
            raise PoolClosedError(f"this {type(self).__name__} is closed (Pool not running)")
        if os.getpid() != self._runner._owner_pid:
            raise PoolClosedError(
                f"this {type(self).__name__} belongs to process {self._runner._owner_pid}; a "
                "forked child cannot use it"
            )

    def _check_not_service(self) -> None:
        if threading.current_thread() is self._service:
            raise EasycoreError(
                "a Future's done-callback waited on its own pool (the callback runs in the "
                "pool's result thread, which would wait on itself); submit() from a callback "
                "is fine, but wait for results elsewhere"
            )

    # ----- map family -----

    def _open_job(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Any],
        mode: int,
        ordered: bool,
        chunksize: int | None,
    ) -> _Job:
        self._check_open()
        if chunksize is not None and not (isinstance(chunksize, int) and chunksize >= 1):
            raise InvalidArgument(f"chunksize must be a positive int or None, got {chunksize!r}")
        f = portable(fn, self._runner.start_method, self._bodies)
        with self._cv:
            self._check_open()
            window = self._window
            job = _Job(next(self._ids), f, iterable, mode, ordered, window, chunksize, self._room)
            self._jobs[job.jid] = job
            self._cut_feed()  # its turn comes at the next segment
            self._cv.notify_all()
        return job

    def _close_job(self, job: _Job) -> None:
        with job.cv:
            if not (job.input_done and job.consumed >= job.pulled):
                mark_abandoned(self._abandoned, job.jid)  # left early: skip what is queued
            job.closed = True
        with self._cv:
            self._jobs.pop(job.jid, None)
            self._cut_feed()  # stop reading its input
            self._cv.notify_all()

    def _results(
        self, job: _Job, timeout: float | None, progress: bool | dict[str, Any] = False
    ) -> Iterator[Any]:
        """The results of ``job``, one at a time: a C-level chain over the lists that
        :meth:`_result_chunks` hands out (no Python frame per result)."""
        chunks = self._result_chunks(job, timeout, progress)
        # A results iterator dropped unconsumed (never started: its finally never runs)
        # abandons its call, so that close()/shutdown() do not wait for it.
        weakref.finalize(chunks, _abandon, job, weakref.ref(self))
        return itertools.chain.from_iterable(chunks)

    def _result_chunks(
        self, job: _Job, timeout: float | None, progress: bool | dict[str, Any]
    ) -> Iterator[list[Any]]:
        self._check_not_service()
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:
            bar = progress_bar(progress, job.total, type(self).__name__)
        try:
            while True:
                with job.cv:
                    while True:
                        if job.error is not None and job.next_index >= job.error_at:
                            raise job.error
                        if self._terminated:
                            raise PoolClosedError("the pool was terminated")
                        n = 0  # results in got (a list of lists: none is copied)
                        if job.ordered:
                            by_index = cast("dict[int, list[Any]]", job.ready)  # ordered: a dict
                            got = []
                            i = job.next_index
                            stop = job.error_at if job.error is not None else -1
                            while i in by_index and i != stop:
                                chunk = by_index.pop(i)
                                got.append(chunk)
                                i += len(chunk)
                            n = i - job.next_index
                            job.next_index = i
                        else:
                            arrived = cast("collections.deque[list[Any]]", job.ready)
                            got = list(arrived)
                            arrived.clear()
                            for chunk in got:
                                n += len(chunk)
                        if n:
                            break
                        if job.input_done and job.consumed >= job.pulled:
                            return
                        wait = TICK
                        if deadline is not None:
                            wait = min(wait, deadline - time.monotonic())
                            if wait <= 0:
                                raise PoolTimeoutError(f"no result within timeout={timeout} s")
                        job.waiting = True
                        job.cv.wait(wait)
                        job.waiting = False
                    full = not job.has_room()
                    job.consumed += n
                    full = full and job.has_room()
                if full:  # the feed may wait for this job's room: wake it (under the lock)
                    with self._cv:
                        self._cv.notify_all()
                if bar is not None:
                    bar.update(n)
                yield from got
        except KeyboardInterrupt:
            # Ctrl-C: stop everything, as the runners do (busy workers are interrupted).
            self._close_job(job)
            self.terminate()
            raise
        finally:
            if bar is not None:
                bar.close()
            self._close_job(job)

    def imap(
        self,
        func: Callable[[_S], _T],
        iterable: Iterable[_S],
        chunksize: int | None = None,
        *,
        timeout: float | None = None,
        progress: bool | dict[str, Any] = False,
    ) -> Iterator[_T]:
        """Lazily yields ``func(x)`` for each ``x`` of ``iterable``, in input order.

        The input is read lazily (in the pool's input thread), at most ``window`` items ahead
        of what the caller consumed. Leaving the loop early (``break``) stops the call.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable): the arguments.
            chunksize (int, optional): items per task. By default a range, list or tuple is
                cut in chunks of about 2 ms of work (learned from the chunks done), and any
                other iterable goes item by item (the engine still batches the messages);
                a chunksize makes the pool wait to fill each chunk from such an iterable.
            timeout (float, optional): seconds the whole iteration may take before
                ``TimeoutError`` (the pool stays usable). This is the meaning of
                ``concurrent.futures`` and ``multiprocessing.Pool``: a deadline for the
                call. (A runner's ``timeout=`` is the manual's: seconds without a result.)
            progress (bool or dict): show a tqdm progress bar of the results handed out;
                a dict gives ``tqdm.tqdm``'s keyword arguments (``desc``, ``leave``,
                ``position``…, and ``total`` for an input whose length is not known). The
                total is the input's length when it has one (a sequence, a set, a dict…).

        Returns:
            Iterator: the results, in input order.
        """
        return self._results(
            self._open_job(func, iterable, _ONE, True, chunksize), timeout, progress
        )

    def imap_unordered(
        self,
        func: Callable[[_S], _T],
        iterable: Iterable[_S],
        chunksize: int | None = None,
        *,
        timeout: float | None = None,
        progress: bool | dict[str, Any] = False,
    ) -> Iterator[_T]:
        """As :meth:`imap`, but yields results as they arrive.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable): the arguments.
            chunksize (int, optional): as for :meth:`imap`.
            timeout (float, optional): as for :meth:`imap`.
            progress (bool or dict): as for :meth:`imap`.

        Returns:
            Iterator: the results, in completion order.
        """
        return self._results(
            self._open_job(func, iterable, _ONE, False, chunksize), timeout, progress
        )

    def istarmap(
        self,
        func: Callable[..., _T],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        *,
        ordered: bool = True,
        timeout: float | None = None,
        progress: bool | dict[str, Any] = False,
    ) -> Iterator[_T]:
        """Lazily yields ``func(*args)`` for each ``args`` of ``iterable``.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable[Iterable]): argument tuples.
            chunksize (int, optional): as for :meth:`imap`.
            ordered (bool): in input order (default) or as results arrive.
            timeout (float, optional): as for :meth:`imap`.
            progress (bool or dict): as for :meth:`imap`.

        Returns:
            Iterator: the results.
        """
        return self._results(
            self._open_job(func, iterable, _STAR, ordered, chunksize), timeout, progress
        )

    def map(
        self,
        func: Callable[[_S], _T],
        iterable: Iterable[_S],
        chunksize: int | None = None,
        *,
        timeout: float | None = None,
        progress: bool | dict[str, Any] = False,
    ) -> list[_T]:
        """``[func(x) for x in iterable]``, computed by the workers.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable): the arguments (read lazily, as for :meth:`imap`).
            chunksize (int, optional): as for :meth:`imap`.
            timeout (float, optional): as for :meth:`imap`.
            progress (bool or dict): as for :meth:`imap`.

        Returns:
            list: the results, in input order.
        """
        return list(self.imap(func, iterable, chunksize, timeout=timeout, progress=progress))

    def starmap(
        self,
        func: Callable[..., _T],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        *,
        timeout: float | None = None,
        progress: bool | dict[str, Any] = False,
    ) -> list[_T]:
        """``[func(*args) for args in iterable]``, computed by the workers.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable[Iterable]): argument tuples.
            chunksize (int, optional): as for :meth:`imap`.
            timeout (float, optional): as for :meth:`imap`.
            progress (bool or dict): as for :meth:`imap`.

        Returns:
            list: the results, in input order.
        """
        return list(self.istarmap(func, iterable, chunksize, timeout=timeout, progress=progress))

    # ----- single tasks -----

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Schedules ``fn(*args, **kwargs)``; safe to call from several threads at once.

        The function and arguments are pickled here (an unpicklable one raises at once).
        Cancelling the future before a worker takes it means it never runs. Do not wait on
        the pool's results from a future's done-callback (it runs in the pool's result
        thread); submitting from one is fine.

        Args:
            fn (Callable): any function, lambda or closure.
            *args, **kwargs: its arguments.

        Returns:
            concurrent.futures.Future: the task's result or exception.

        Raises:
            SerializationError: if the arguments cannot be pickled.
        """
        self._check_open()
        f = portable(fn, self._runner.start_method, self._bodies)
        try:
            blob = pickle_args((f, args, kwargs))
        except Exception as e:
            raise SerializationError(
                f"the arguments of {getattr(fn, '__qualname__', fn)!r} cannot be sent to the "
                f"workers: {type(e).__name__}: {e}"
            ) from e
        fut: Future[_T] = Future()
        # A function whose body lies in a shared arena (see functions.py) keeps it there
        # until its task is done.
        fut.add_done_callback(functools.partial(_keep, f))
        with self._cv:
            self._check_open()
            self._tasks.append((fut, next(self._ids), blob))
            self._cut_feed()  # a task goes ahead of the rest of a job's input
            self._cv.notify_all()
        return fut

    def apply_async(
        self,
        func: Callable[..., Any],
        args: Iterable[Any] = (),
        kwds: dict[str, Any] | None = None,
        callback: Callable[[Any], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``multiprocessing.Pool.apply_async``: schedules ``func(*args, **kwds)``.

        Args:
            func (Callable): any function, lambda or closure.
            args (Iterable): positional arguments.
            kwds (dict, optional): keyword arguments.
            callback (Callable, optional): called with the result (in the pool's result
                thread).
            error_callback (Callable, optional): called with the exception instead.

        Returns:
            AsyncResult: ``get(timeout)``, ``wait``, ``ready``, ``successful``.
        """
        fut = self.submit(func, *tuple(args), **(kwds or {}))
        return _async_result(fut, callback, error_callback)

    def map_async(
        self,
        func: Callable[[_S], _T],
        iterable: Iterable[_S],
        chunksize: int | None = None,
        callback: Callable[[list[_T]], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``multiprocessing.Pool.map_async``: :meth:`map` without waiting for it.

        The input is read lazily as for :meth:`imap`; a helper thread collects the results.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable): the arguments.
            chunksize (int, optional): as for :meth:`imap`.
            callback (Callable, optional): called with the list of results.
            error_callback (Callable, optional): called with the exception instead.

        Returns:
            AsyncResult: its ``get(timeout)`` returns the list of results, in input order.
        """
        job = self._open_job(func, iterable, _ONE, True, chunksize)
        return self._collect(job, callback, error_callback)

    def starmap_async(
        self,
        func: Callable[..., _T],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        callback: Callable[[list[_T]], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``multiprocessing.Pool.starmap_async``: :meth:`starmap` without waiting for it.

        Args:
            func (Callable): any function, lambda or closure.
            iterable (Iterable[Iterable]): argument tuples.
            chunksize (int, optional): as for :meth:`imap`.
            callback (Callable, optional): called with the list of results.
            error_callback (Callable, optional): called with the exception instead.

        Returns:
            AsyncResult: its ``get(timeout)`` returns the list of results, in input order.
        """
        job = self._open_job(func, iterable, _STAR, True, chunksize)
        return self._collect(job, callback, error_callback)

    def _collect(
        self,
        job: _Job,
        callback: Callable[[list[Any]], Any] | None,
        error_callback: Callable[[BaseException], Any] | None,
    ) -> AsyncResult:
        fut: Future[list[Any]] = Future()
        fut.set_running_or_notify_cancel()
        result = _async_result(fut, callback, error_callback)

        def collect() -> None:
            try:
                value = list(self._results(job, None))
            except BaseException as e:  # noqa: BLE001 - handed to get()
                fut.set_exception(e)
            else:
                fut.set_result(value)

        threading.Thread(target=collect, name="easycore-map-async", daemon=True).start()
        return result

    def apply(
        self, func: Callable[..., _T], args: Iterable[Any] = (), kwds: dict[str, Any] | None = None
    ) -> _T:
        """``func(*args, **kwds)`` run by a worker; waits for the result.

        Args:
            func (Callable): any function, lambda or closure.
            args (Iterable): positional arguments.
            kwds (dict, optional): keyword arguments.

        Returns:
            Any: the result.
        """
        self._check_not_service()
        return self.submit(func, *tuple(args), **(kwds or {})).result()

    # ----- life cycle -----

    def close(self) -> None:
        """Accepts no new work; the workers exit once the work already given is done
        (``join()`` waits for that, not for callers to take their results: the inputs of
        open calls are then read to their end, as the stdlib's pools do). Closing twice is
        harmless."""
        self._open_flag[0] = False
        with self._cv:
            self._closing = True
            for job in self._jobs.values():
                job.drain = True
            self._cv.notify_all()
        self._bodies.clear()  # a call still running holds its own function's body

    def terminate(self) -> None:
        """Stops at once: queued futures are cancelled, running ones and open calls fail with
        :class:`~easycore.errors.RunnerClosedError`, and the workers are stopped (busy ones
        interrupted). Waits for that."""
        self._open_flag[0] = False
        with self._cv:
            self._closing = True
            self._terminated = True
            queued = list(self._tasks)
            self._tasks.clear()
            self._cv.notify_all()
        self._bodies.clear()
        for fut, _tid, _blob in queued:
            fut.cancel()
        call = self._call
        if call is not None:
            call.abort = True
            call.attention.set()
        self._fail_pending(PoolClosedError("the pool was terminated"))
        self.join()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the workers to exit, after :meth:`close` or :meth:`terminate`.

        Args:
            timeout (float, optional): most seconds to wait.

        Raises:
            ValueError: if the pool is still open.
            WorkerError: what a worker's exit raised, if anything.
        """
        if not self._closing:
            raise ValueError("join() needs close() or terminate() first")
        if threading.current_thread() is not self._service:
            self._service.join(timeout)
            if not self._service.is_alive():
                await_thread_gone(self._service)  # gone from the OS too: a fork may follow
        if not self._service.is_alive():
            lifecycle.discard(Stage.POOL, self)
            err = getattr(self, "_end_error", None)
            if err is not None:
                self._end_error = None
                raise err

    def __enter__(self) -> Pool:
        self._check_open()
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        """Without an exception: ``close()`` then ``join()`` (pending work finishes); with
        one: ``terminate()``. (``multiprocessing.Pool`` always terminates.)"""
        if exc_type is None:
            self.close()
            self.join()
        else:
            self.terminate()
