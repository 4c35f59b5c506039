"""The pool's internal runner and what it runs in the producers: its hooks call the shipped
function on a chunk of a job's items (or a submitted task), keep the initializer's value for
:func:`context`, and turn an error or an unpicklable result into a report for its own call.
"""

from __future__ import annotations

import itertools
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from easycore._engine import wire
from easycore._engine.extension import Extension, Setup
from easycore._engine.host import StreamHost
from easycore._engine.insights import describe_items_with
from easycore._engine.producer import Interrupted, seed_for_item, worker_info
from easycore._engine.reports import error_report, not_picklable_report
from easycore.common.parallel import engine
from easycore.parallel.chunk_args import ChunkArgs, guard_args
from easycore.parallel.feed import _ONE, _TASK, _WorkItem, _WorkResult
from easycore.parallel.functions import _ByValue, _load_by_value, by_cloudpickle, pickled_function
from easycore.parallel.hardstop import GRACE_S, bind, limited, slots
from easycore.parallel.slowest import describe_item

_CONTEXT: Any = None
_CODEC: list[wire.Codec] = [wire.Codec()]  # in producers: the flavour's codec
_IN_WORKER = False
_INIT: tuple[Any, tuple[Any, ...]] | None = None
# In producers: the pool's ring of abandoned calls (slot ``job & _RING_MASK`` holds ``job``
# once that call was abandoned), a shared int64 array, or None (a remote backend).
_ABANDONED: Any = None
_RING_MASK = 63


def abandoned_ring() -> Any:
    """A new ring of abandoned calls, in shared memory that forked and spawned workers see
    (passed to them with the pool's setup)."""
    import multiprocessing

    return multiprocessing.RawArray("q", _RING_MASK + 1)


def mark_abandoned(ring: Any, job: int) -> None:
    """Marks call ``job`` abandoned: workers skip its items still queued (any thread; one
    aligned word store). A later call that shares the slot overwrites it: then fewer items
    are skipped, never a wrong one."""
    if ring is not None:
        ring[job & _RING_MASK] = job


_ITEM_SEED: int | None = None  # in producers: the base seed of per-item streams, if asked
_EXIT: Any = None  # in producers: the pool's worker_exit, if any
_TASK_LIMIT: float | None = None  # in producers: the pool's task_timeout, if any
_PLAIN_RUN = True  # in producers: neither of the two above (an item is just called)


def context() -> Any:
    """The value the pool's ``initializer`` returned in this worker process.

    Call it from a task (a function given to ``map``, ``submit``…) to reach per-worker state
    built once, such as a model or an open connection; :func:`worker_info` says which worker
    and device run the task.

    Returns:
        Any: what ``initializer(*initargs)`` returned in this worker (None without one).

    Raises:
        RuntimeError: outside a pool's worker process.
    """
    if not _IN_WORKER:
        raise RuntimeError("context() is only available in a pool's worker process (in a task)")
    return _CONTEXT


class _Setup:
    """Run first in each producer: the flavour's own setup (CUDA device, threads), then keeps
    the initializer for ``producer_init``, which reports its errors to the caller."""

    def __init__(
        self,
        base: Any,
        initializer: Any,
        initargs: tuple[Any, ...],
        abandoned: Any,
        codec: Any,
        item_seed: int | None = None,
        worker_exit: Any = None,
        task_timeout: float | None = None,
        stuck_slots: Any = None,
    ) -> None:
        self.stuck_slots = stuck_slots
        self.codec = codec
        self.abandoned = abandoned
        self.worker_exit = worker_exit
        self.task_timeout = task_timeout
        self.base = base
        self.initializer = initializer
        self.initargs = initargs
        self.item_seed = item_seed

    def __call__(self, device: str) -> None:
        global _IN_WORKER, _INIT, _ABANDONED, _ITEM_SEED, _EXIT, _TASK_LIMIT, _PLAIN_RUN
        _ABANDONED = self.abandoned
        _ITEM_SEED = self.item_seed
        _TASK_LIMIT = None
        if self.task_timeout is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGALRM, _on_alarm)  # a worker process of its own: ours
            _TASK_LIMIT = self.task_timeout
            info = worker_info()
            bind(self.stuck_slots, info.index if info is not None else 0)
        _PLAIN_RUN = _ITEM_SEED is None and _TASK_LIMIT is None
        describe_items_with(describe_item)  # the labels of Pool.stats.slowest
        _EXIT = self.worker_exit
        if isinstance(_EXIT, _ByValue):  # not pickled on the way (fork)
            _EXIT = _load_by_value(_EXIT.key, _EXIT.blob)
        if self.base is not None:
            self.base(device)
        _IN_WORKER = True
        _CODEC[0] = self.codec
        init = self.initializer
        if isinstance(init, _ByValue):  # not pickled on the way (fork)
            init = _load_by_value(init.key, init.blob)
        _INIT = (init, self.initargs)


def _run_initializer(device: str, cfg: Any) -> None:
    global _CONTEXT
    if _INIT is not None and _INIT[0] is not None:
        init, initargs = _INIT
        _CONTEXT = init(*initargs)


def _run_exit(device: str, cfg: Any) -> Any:
    """The pool's ``worker_exit``, run once in each worker as it stops: its return value is
    one of the pool's ``exit_results``."""
    return _EXIT() if _EXIT is not None else None


def _run_item(device: str, cfg: Any, data: _WorkItem | None) -> _WorkResult | None:
    """Runs one work item (``data``): a chunk of a map job (``arg`` is a list of arguments)
    or a submitted task. Returns ``(job, index, ok, value)``: for a chunk ``value`` is
    ``(results, seconds)``; an exception is returned as a report (``ok`` False), not raised,
    so the stream goes on."""
    if data is None:
        return None  # a work item that could not be pickled (see PoolExtension)
    job, index, fn, arg, mode = data
    ring = _ABANDONED
    if job and ring is not None and ring[job & _RING_MASK] == job:
        return None  # its call was abandoned (an imap left by break): skipped
    if type(fn) is bytes:
        try:
            fn = pickled_function(fn)
        except Interrupted:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit too: this chunk's error
            return job, index, False, error_report("task", device, None, e, "unpickle_task")
        if mode == _ONE and _PLAIN_RUN and type(arg) is list and len(arg) == 1:
            # A caller's own read (``_Job.fn_wire``: one argument): a request/response loop
            # pays each step here at every round trip, on a core it may share with its
            # caller, where each object touched counts. Its short way, the same results.
            try:
                t0 = time.perf_counter()
                lone = [fn(arg[0])]
                return job, index, True, (lone, time.perf_counter() - t0)
            except Interrupted:
                raise
            except BaseException as e:  # noqa: BLE001 - sent to the caller, raised there
                return job, index, False, error_report("task", device, index, e, "hook")
    if type(arg) is ChunkArgs:
        try:
            arg = arg.load(_CODEC[0])  # a task's: its (function, args, kwargs)
        except Interrupted:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit too: this chunk's error
            if mode == _TASK:
                return job, index, False, error_report("task", device, None, e, "unpickle_task")
            return job, index, False, error_report("task", device, index, e, "unpickle_items")
    out: list[Any] = []
    try:
        seed = _ITEM_SEED
        if mode == _TASK:
            try:
                f, args, kwargs = pickle.loads(arg) if type(arg) is bytes else arg
            except Interrupted:
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit too: this task's error
                return job, index, False, error_report("task", device, None, e, "unpickle_task")
            if seed is not None:
                seed_for_item(seed, index, 0)  # a task's id is never a job's
            if _TASK_LIMIT is not None:
                value = limited(_TASK_LIMIT, 0, index, f, args, kwargs)
            else:
                value = f(*args, **kwargs)
            # A result that does not pickle fails this future only: the batch's pickling
            # fails, and _fix_unsendable reports it in its place (not pickled twice here).
            return job, index, True, value
        t0 = time.perf_counter()
        # list.extend appends each result as it comes: if fn raises, out holds the results
        # before the failing item (reported as "partial", and its index is index + len(out)).
        # No Python frame per item: about 25 ns an item less than a loop with append.
        if seed is not None or _TASK_LIMIT is not None:
            _run_each(fn, arg, mode, job, index, out)
        else:
            out.extend(map(fn, arg) if mode == _ONE else itertools.starmap(fn, arg))
        return job, index, True, (out, time.perf_counter() - t0)
    except Interrupted:
        raise
    except BaseException as e:  # noqa: BLE001 - sent to the caller, raised there
        where = index + len(out) if mode != _TASK else None
        report = error_report("task", device, where, e, "hook")
        if out:
            report["partial"] = out  # the chunk's results before the failing item
        return job, index, False, report


def _run_each(fn: Any, arg: list[Any], mode: int, job: int, index: int, out: list[Any]) -> None:
    """A chunk run item by item (``seed_per_item``, ``task_timeout``): each item's random
    stream is seeded from the seed, its call (the job) and its index, and each item may run
    for at most the task timeout; results are appended to ``out``."""
    seed, limit = _ITEM_SEED, _TASK_LIMIT
    for k, x in enumerate(arg):
        if seed is not None:
            seed_for_item(seed, job, index + k)
        args = (x,) if mode == _ONE else x
        out.append(fn(*args) if limit is None else limited(limit, job, index + k, fn, args, {}))


class _TaskTimeout(TimeoutError):
    """Raised inside a task that ran longer than the pool's ``task_timeout``."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _TaskTimeout("the task ran longer than the pool's task_timeout and was stopped")


def _fix_unsendable(results: list[_WorkResult | None], device: str) -> list[_WorkResult | None]:
    """The results of a batch did not pickle (see ``ProducerCore._dumps_fixed``): each chunk
    whose results do not pickle becomes an error report, so only its own call fails, not
    every call and future sharing the stream."""
    dumps = _CODEC[0].dumps
    fixed: list[_WorkResult | None] = []
    for r in results:
        if r is None:
            fixed.append(r)
            continue
        job, index, ok, value = r
        if ok:
            try:
                dumps(value)
            except Interrupted:
                raise
            except BaseException as e:  # noqa: BLE001 - reported to the chunk's call
                # The culprit: a chunk's first result that does not pickle, or the task's.
                culprit = value
                where = None
                if job:
                    out = value[0]
                    k = next((i for i, x in enumerate(out) if not _picklable(x)), 0)
                    culprit, where = out[k : k + 1], index + k
                if isinstance(e, Exception):
                    report = not_picklable_report("task", device, where, e, culprit)
                else:  # a __reduce__ that exits, say: the error with its type kept, as an
                    # exception the task raised would be
                    report = error_report("task", device, where, e, "hook")
                r = (job, index, False, report)
        elif "partial" in value and not _picklable(value["partial"]):
            del value["partial"]  # the call's error is then raised at its chunk's start
        fixed.append(r)
    return fixed


def _picklable(x: Any) -> bool:
    try:
        _CODEC[0].dumps(x)
    except Interrupted:
        raise
    except BaseException:  # noqa: BLE001 - any failure means no, a __reduce__ that exits too
        return False
    return True


def _by_value(
    item: _WorkItem | None,
    error: Exception,
    fail: Callable[[_WorkItem, Exception], None],
    codec: wire.Codec,
) -> _WorkItem | None:
    """A work item whose arguments plain pickle could not send: the same item with its
    arguments sent by value with cloudpickle (a lambda or closure among them, as for the
    function itself), or None after failing its call when cloudpickle cannot either."""
    if item is None:
        return None
    job, index, fn, arg, mode = item
    if type(arg) is ChunkArgs:
        arg = arg.load(codec)  # they pickled (by the pool's codec): fn did not
    try:
        wrapped = (job, index, fn, by_cloudpickle(arg), mode)
        codec.dumps(wrapped)
        return wrapped
    except Exception:  # noqa: BLE001 - the first error says why it cannot be sent
        fail(item, error)
        return None  # travels as nothing (the batch keeps its length: see Feed.pack)


class PoolExtension(Extension):
    """What the pool's runner adds to a plain runner (the engine's extension point, see
    ``easycore._engine.extension``): its producers' set-up keeps the initializer (and the
    abandoned ring, per-item seeds, ``worker_exit``, ``task_timeout``); an input item that
    cannot be pickled fails its own call, and so does a result, not the stream that every
    call and future of the pool shares.

    Args:
        setup: ``(initializer, initargs, abandoned ring or None)``.
        codec: the runner flavour's codec.
        on_unsendable: a weak reference (called with no argument) to what fails the call of
            an input item that cannot be pickled (the pool's), or None: such an item fails
            the whole stream.
        item_seeds: seed each item's random stream (the pool's ``seed_per_item``).
        worker_exit: run in each worker as it stops (its value is in ``exit_results``).
        task_timeout: the most seconds a task or map item may run.
        stuck_slots: where each worker says which task it runs since when (a task stuck
            past ``task_timeout``: see ``hardstop.py``), or None.
    """

    def __init__(
        self,
        setup: tuple[Any, tuple[Any, ...], Any],
        codec: wire.Codec,
        on_unsendable: Callable[[], Callable[[_WorkItem, Exception], None] | None] | None,
        item_seeds: bool,
        worker_exit: Any,
        task_timeout: float | None,
        stuck_slots: Any = None,
    ) -> None:
        self.stuck_slots = stuck_slots
        self.setup = setup
        self.codec = codec
        self.on_unsendable = on_unsendable
        self.item_seeds = item_seeds
        self.worker_exit = worker_exit
        self.task_timeout = task_timeout
        self.fix_unsendable = _fix_unsendable
        # The pool restarts its workers (a death, maxtasksperchild) while its threads run:
        # under fork they come from a zygote made with the first ones.
        self.fork_from_zygote = True

    def producer_setup(self, base: Setup, seed: int) -> _Setup:
        """The flavour's set-up, then the pool's (see :class:`_Setup`)."""
        return _Setup(
            base,
            *self.setup,
            self.codec,
            seed if self.item_seeds else None,
            self.worker_exit,
            self.task_timeout,
            self.stuck_slots,
        )

    def keep_sendable(
        self, items: list[_WorkItem], first: int, error: Exception
    ) -> list[_WorkItem | None]:
        """One item that cannot be pickled fails its own call, not the stream that every
        call and future of the pool shares: keeps the items that pickle (an item whose
        arguments only cloudpickle can send is sent so)."""
        fail = self.on_unsendable() if self.on_unsendable is not None else None
        if fail is None:
            return super().keep_sendable(items, first, error)
        codec = self.codec
        kept: list[_WorkItem | None] = []
        item: _WorkItem | None
        for item in items:
            try:
                codec.dumps(item)  # out-of-band buffers are not copied by this check
            except Exception as e:  # noqa: BLE001 - reported to the item's call
                item = _by_value(item, e, fail, codec)
            kept.append(item)
        return kept


class TaskHooks(engine.BaseRunner):
    """The hooks of the pool's internal runner, on a runner flavour (the engine's; torch's
    pool mixes it into its own flavour's ``UnorderedRunner``)."""

    def __init__(
        self,
        devices: Any,
        setup: tuple[Any, tuple[Any, ...], Any],
        *,
        on_unsendable: Callable[[], Callable[[_WorkItem, Exception], None] | None] | None = None,
        item_seeds: bool = False,
        worker_exit: Any = None,
        task_timeout: float | None = None,
        task_timeout_grace: float = GRACE_S,
        max_tasks: int = 0,
        **kwargs: Any,
    ) -> None:
        """``setup``, ``on_unsendable``, ``item_seeds``, ``worker_exit``, ``task_timeout``:
        see :class:`PoolExtension`; ``task_timeout_grace``: see ``hardstop.py``;
        ``max_tasks``: each local worker retires after that many work messages and is
        replaced in the running stream (``_engine/retire.py``); the rest as for a runner."""
        self.task_timeout_grace = task_timeout_grace
        local = task_timeout is not None and kwargs.get("backend") in (None, "local")
        self._extension = PoolExtension(
            setup,
            self._codec(),
            on_unsendable,
            item_seeds,
            worker_exit,
            task_timeout,
            slots() if local else None,
        )
        self._extension.max_tasks = max_tasks
        # A worker stuck past task_timeout is replaced alone, in the running stream.
        self._extension.replaceable = local
        super().__init__(devices, **kwargs)

    _extension: PoolExtension

    producer_init = staticmethod(_run_initializer)
    producer_work = staticmethod(_run_item)
    producer_end = staticmethod(_run_exit)

    def guarded_pack(
        self, pack: Callable[[list[Any]], list[Any]], sized: Callable[[float], None]
    ) -> Callable[[list[Any]], list[Any]]:
        """``pack`` with each chunk's arguments pickled on their own (see :func:`guard_args`,
        which tells ``sized`` their bytes per argument)."""
        return guard_args(pack, self._extension.codec, sized)

    def stream_host(self) -> StreamHost:
        """What the pool's stream uses of this runner (see ``easycore._engine.host``)."""
        return self._stream_host()

    @property
    def owner_pid(self) -> int:
        """int: the process that made this runner (a forked child must not use it)."""
        return self._owner_pid

    def stop_producers(self, interrupt: bool) -> None:
        """Stops the producers at once (interrupting busy ones with ``interrupt``); the
        runner stays usable: its next call starts new ones."""
        self._shutdown(interrupt=interrupt)

    def release_zygote(self) -> None:
        """No producer will start again (the pool's end): stops the zygote that forks them
        under fork, if any."""
        self._close_zygote()

    @property
    def stuck_slots(self) -> Any:
        """Where each worker says which task it runs since when (``hardstop.py``), or None."""
        return self._extension.stuck_slots

    def producers(self) -> Any:
        """The engine's transport of the current producers (None: stopped)."""
        return self._workers

    def worker_processes(self) -> list[Any]:
        """The producer processes now started, by index (empty while stopped); raises
        ``NotImplementedError`` for a remote backend's producers (not local processes)."""
        if self._remote is not None:
            raise NotImplementedError(
                "the workers are a remote backend's actors, not processes of this machine"
            )
        workers = self._workers
        if workers is None or workers.closed:
            return []
        return list(workers.procs)

    def producer_died(self) -> bool:
        """Whether a producer has died, or the producers are already stopped."""
        workers = self._workers
        return workers is None or workers.closed or workers.exited()


class _TaskRunner(TaskHooks, engine.UnorderedRunner):
    """The runner behind :class:`Pool`."""


_TaskHooks = TaskHooks  # the name the pool types its runner with
