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

* The pool's parts (``poolbase.py`` builds them): the scheduler (``schedule.py``) holds the
  work waiting under one lock; the stream service (``service.py``) owns the internal runner
  and the service thread that runs its streams; each stream's feed (``feed.py``) is its
  input iterable and asks the scheduler for work: queued ``submit`` tasks first, then items
  of the open ``map``/``imap`` jobs in turn, each job at most ``window`` items ahead of what
  its caller consumed (so a lazy input is read lazily and memory stays bounded). An input
  iterator is read item by item at C speed, in segments that the engine's sender packs into
  one work item per run of a job's items. A call's results are handed out in the caller's
  thread (``calls.py``).
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
  restarted quietly, see ``StreamService.quiet_restart``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

import easycore.parallel.calls as calls
from easycore._engine.wire import OUT_OF_BAND_MIN
from easycore.errors import InvalidArgument
from easycore.parallel.chunk_args import ChunkArgs
from easycore.parallel.feed import _ONE, _STAR, _TaskBlob
from easycore.parallel.functions import pickle_args, portable
from easycore.parallel.poolbase import _keep, _PoolBase
from easycore.parallel.results import AsyncResult, _async_result

_T = TypeVar("_T")
_S = TypeVar("_S")
_P = ParamSpec("_P")


class Pool(_PoolBase):
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
        processes (int, optional): how many worker processes, as for ``multiprocessing.Pool``:
            ``n`` ``"cpu"`` workers; default ``os.cpu_count()`` (under Ray: one worker per
            CPU of the cluster). A list of devices in its place is read as ``devices``.
        devices (int or Iterable[str], optional): the runners' ``devices=``: one worker per
            entry, such as ``Pool(devices=["cuda:0", "cuda:1"])`` for a GPU pool (an int
            ``n``: ``n`` ``"cpu"`` workers). Give ``processes`` or ``devices``, not both:
            both raise ``TypeError`` (an :class:`~easycore.errors.InvalidArgument` too).
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
            does not: one still running ``task_timeout_grace`` seconds later is stopped by
            killing its worker (the pool's workers are then replaced; only that task
            fails). Local workers only (ignored under Ray). Costs a few microseconds per
            item; off by default.
        task_timeout_grace (float): seconds a task may run past ``task_timeout`` before its
            worker is killed (default 1.0; 0 kills it as soon as the timeout passes, which
            leaves a task no time to handle its ``TimeoutError``). A number at least 0:
            ``TypeError`` otherwise, :class:`~easycore.errors.InvalidArgument` (a
            ``ValueError``) if negative or not finite.
        window (int, optional): most items of one ``map``/``imap`` read ahead of what its
            caller consumed, and most items in flight; default 65536, so that cheap items
            travel in large batches and are read in long runs. Items in flight and results
            waiting for their caller are also bounded by bytes, so large items are held to a
            few.
        queue_scale (float): scales the shared-memory queues (as for the runners).
        close_timeout (float): seconds ``close()``/``join()`` leave the workers to exit.
        maxtasksperchild (int, optional): each worker retires after this many tasks
            (``multiprocessing.Pool``'s worker recycling, for code that leaks; a task is a
            submitted task, a ``map`` chunk, or one item of an ``imap`` without a
            ``chunksize``): it runs ``worker_exit`` and exits, and a new worker takes its
            place while the others go on (``_engine/retire.py``). Each message to the
            workers then holds one task. Under the Ray backend every worker is replaced
            together, after ``maxtasksperchild`` × workers tasks. Default None: workers
            live as long as the pool.
        backend (str or object, optional): where the workers run, as for the runners:
            ``"ray"`` (or an ``easycore.ray.RayBackend``) makes each worker a Ray actor
            (``devices`` then as the Ray backend's; default ``"all"``, one
            worker per CPU of the cluster). See docs/ray.md.
    """

    # A task's pickle was large: its large ``bytes`` arguments leave the pickle from now on
    # (see functions.pickle_args). Written by any submitting thread; only ever set.
    _large_args = False

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
            self._open_job(func, iterable, _ONE, True, chunksize, timeout), timeout, progress
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
            self._open_job(func, iterable, _ONE, False, chunksize, timeout), timeout, progress
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
            self._open_job(func, iterable, _STAR, ordered, chunksize, timeout), timeout, progress
        )

    def _map_tasks(
        self, iterable: Iterable[Any], chunksize: int | None
    ) -> tuple[Iterable[Any], int | None]:
        """With ``maxtasksperchild`` and no ``chunksize``, a ``map`` call is cut into tasks as
        ``multiprocessing.Pool.map`` cuts it: the input read into a list, in chunks of
        ``ceil(len / (4 * workers))`` items, each a task. (Otherwise the first calls, whose
        cost is not known yet, went one item per task: a worker retired every
        ``maxtasksperchild`` items.)"""
        if not self._max_tasks or chunksize is not None:
            return iterable, chunksize
        items = iterable if hasattr(iterable, "__len__") else list(iterable)
        chunks, extra = divmod(len(items), 4 * len(self._runner.devices))  # type: ignore[arg-type]
        return items, max(1, chunks + bool(extra))

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
        iterable, chunksize = self._map_tasks(iterable, chunksize)
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
        iterable, chunksize = self._map_tasks(iterable, chunksize)
        return list(self.istarmap(func, iterable, chunksize, timeout=timeout, progress=progress))

    # ----- single tasks -----

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Schedules ``fn(*args, **kwargs)``; safe to call from several threads at once.

        The function and arguments are pickled here: where that fails, the future fails at
        once with the pickler's own exception (as ``concurrent.futures`` and
        ``multiprocessing.Pool.apply_async`` report it; for a function that neither pickle
        nor cloudpickle can send, a :class:`~easycore.errors.SerializationError`, which is a
        ``PicklingError``), with a note.
        Cancelling the future before a worker takes it means it never runs. Do not wait on
        the pool's results from a future's done-callback (it runs in the pool's result
        thread); submitting from one is fine.

        Args:
            fn (Callable): any function, lambda or closure.
            *args, **kwargs: its arguments.

        Returns:
            concurrent.futures.Future: the task's result or exception.

        """
        self._check_open()
        fut, blob = self._task(fn, args, kwargs)
        # Sent by this thread if nothing is on its way (no hand-over to the pool's input
        # thread), else queued for it.
        if blob is not None and not self._stream.send_task(fut, blob):
            if not self._schedule.add_task(fut, blob):
                raise self._closed_error()
        return fut

    def _task(
        self, fn: Callable[..., _T], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Future[_T], _TaskBlob | None]:
        """A task's future and pickle (None: the future failed, it does not pickle)."""
        fut: Future[_T] = Future()
        try:
            f = portable(fn, self.start_method, self._bodies)
            parts = pickle_args((f, args, kwargs), self._large_args)
            if len(parts[0]) >= OUT_OF_BAND_MIN:
                self._large_args = True
            blob = parts[0] if len(parts) == 1 else ChunkArgs(*parts)
        except InvalidArgument:
            raise  # not a callable
        except Exception as e:
            # As the stdlib's pools: the pickler's own exception fails this future.
            try:
                e.add_note(
                    f"the arguments of {getattr(fn, '__qualname__', fn)!r} cannot be sent to "
                    "the workers"
                )
            except Exception:  # noqa: BLE001 - never hide the error for its note
                pass
            fut.set_exception(e)
            return fut, None
        # A function whose body lies in a shared arena (see functions.py) keeps it there
        # until its task is done.
        fut.add_done_callback(functools.partial(_keep, f))
        return fut, blob

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
        iterable, chunksize = self._map_tasks(iterable, chunksize)
        job = self._open_job(func, iterable, _ONE, True, chunksize)
        return calls.collect(lambda: self._results(job, None), callback, error_callback)

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
        iterable, chunksize = self._map_tasks(iterable, chunksize)
        job = self._open_job(func, iterable, _STAR, True, chunksize)
        return calls.collect(lambda: self._results(job, None), callback, error_callback)

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
        self._check_open()
        fut, blob = self._task(func, tuple(args), kwds or {})
        # Sent and received by this thread if nothing else is on its way (a request/response
        # loop: no hand-over through the pool's threads), else queued as submit() does.
        if blob is not None and not self._stream.call_task(fut, blob):
            if not self._schedule.add_task(fut, blob):
                raise self._closed_error()
        return fut.result()

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
