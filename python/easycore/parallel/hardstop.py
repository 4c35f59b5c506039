"""The pool's ``task_timeout`` for a task that does not stop: one stuck in C code, which the
``TimeoutError`` raised inside it (a SIGALRM timer of its worker) cannot reach until it
returns to Python (a C loop, a blocking call that restarts on EINTR, a signal blocked).

In the worker, :func:`limited` runs each task or ``map`` item under the timer and says in a
shared slot which one runs since when (three int64 stores a task, beside the timer's two
system calls). In the caller, a :class:`StuckWatch` thread looks at the slots every
``_POLL_S``. A task still running past its timeout by the pool's ``task_timeout_grace``
(default :data:`GRACE_S`, read from the pool's runner) is given up:

1. its worker is stopped (SIGSTOP), and the slot read again (the task may just have ended);
2. the task's call (or future) fails with :class:`~easycore.errors.PoolTimeoutError`;
3. the stream is told the worker's batch came back empty (a result message put on the way
   back for it: with a ``task_timeout``, each batch holds one work item, so nothing else was
   in it);
4. the stopped worker is killed and a new one takes its place in the running stream
   (``LocalWorkers.replace``, see ``_engine/retire.py``): the other workers, the tasks they
   run and the work queued for them are not touched. Nothing else fails.

Where that replacement cannot be made (the workers are being stopped), the stream takes
no more work, the batches it queued that no worker took yet
are taken back (each answered empty) and handed to the pool, the stream ends once the other
workers are done with theirs, and every worker is replaced (the stopped one killed first).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from itertools import repeat
from typing import Any

from easycore._engine import wire
from easycore.errors import PoolTimeoutError, QueueClosed, QueueEmpty
from easycore.parallel.feed import Feed
from easycore.parallel.functions import by_cloudpickle

# ``service``: the pool's ``StreamService`` (service.py imports this module).
StreamService = Any

GRACE_S = 1.0  # the default task_timeout_grace: past the timeout, until the worker is killed
_POLL_S = 0.1  # how often the caller looks at the slots
_FIELDS = 3  # per worker: since (monotonic ns, 0: idle), job (0: a submitted task), index
_SINCE, _JOB, _INDEX = 0, 1, 2
_NO_SEQ = 1 << 62  # the sequence number of the message that stands for a killed batch

# ----- in the worker -----

_SLOT: list[Any] = [None, 0]  # the slots (int64 view), this worker's offset


def slots(n_workers: int = 1024) -> Any:
    """A new array of slots in shared memory that forked and spawned workers see (by
    default for 1024 workers, the most processes a queue serves: 24 KiB)."""
    import multiprocessing

    return multiprocessing.RawArray("q", _FIELDS * n_workers)


def bind(array: Any, worker: int) -> None:
    """In a worker: its slot is ``worker``'s of ``array`` (None: no slots, no watch)."""
    if array is None:
        _SLOT[0] = None
        return
    view = memoryview(array).cast("B").cast("q")
    me = _FIELDS * worker
    view[me + _SINCE] = 0
    _SLOT[0], _SLOT[1] = view, me


def limited(
    limit: float, job: int, index: int, f: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """``f(*args, **kwargs)``, stopped by a ``TimeoutError`` raised inside it after ``limit``
    seconds (a SIGALRM timer of this worker process; the handler is the pool's), its slot
    saying meanwhile that item ``index`` of call ``job`` (or task ``index``) runs."""
    view, me = _SLOT
    if view is not None:
        view[me + _JOB] = job
        view[me + _INDEX] = index
        view[me + _SINCE] = time.monotonic_ns()
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return f(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if view is not None:
            view[me + _SINCE] = 0


# ----- in the caller -----


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (or gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"T", b"t", b"Z", b"X")


def _stop(pid: int) -> bool:
    """Stops process ``pid`` (SIGSTOP) and waits until it is (a second at most)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        return False
    deadline = time.monotonic() + 1.0
    while not _stopped(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def kill_doomed(doomed: list[Any]) -> None:
    """Kills the workers given up on (stopped, see the module) before the others stop."""
    while doomed:
        proc = doomed.pop()
        try:
            proc.kill()
            proc.join(2.0)
        except (OSError, AttributeError, AssertionError):
            pass


class StuckWatch:
    """The caller's side (see the module): a daemon thread while the pool's service runs.

    Args:
        service: the pool's stream service (held weakly).
        array: the slots (:func:`slots`), shared with the workers.
        limit: the pool's ``task_timeout``; the grace past it is the pool runner's
            ``task_timeout_grace``.
    """

    def __init__(self, service: StreamService, array: Any, limit: float) -> None:
        self.service = weakref.ref(service)
        self.view = memoryview(array).cast("B").cast("q")
        self.limit = limit
        self.grace = float(getattr(service.runner, "task_timeout_grace", GRACE_S))
        self.ending: Any = None  # the stream (its Call) that ends for a stuck worker
        self.thread = threading.Thread(target=self._main, name="easycore-task-watch", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        late_ns = int((self.limit + self.grace) * 1e9)
        view = self.view
        while True:
            time.sleep(_POLL_S)
            service = self.service()
            if service is None or (service.thread is not None and not service.thread.is_alive()):
                return
            try:
                self._look(service, view, late_ns)
            except Exception:  # noqa: BLE001, S110 - the stream failed meanwhile (its queues
                pass  # closed): the pool fails or restarts it; the watch goes on
            del service

    def _look(self, service: StreamService, view: Any, late_ns: int) -> None:
        """One look at the slots, and at the stream that ends for a stuck worker."""
        now = time.monotonic_ns()
        procs = getattr(service.runner.producers(), "procs", ())
        for w in range(min(len(procs), len(view) // _FIELDS)):
            since = view[_FIELDS * w + _SINCE]
            if since and now - since > late_ns:
                self._give_up(service, w, since)
        if self.ending is not None:
            if service.call is self.ending:
                self._hand_back(service, self.ending)
            else:
                self.ending = None  # that stream is over

    def _give_up(self, service: StreamService, w: int, since: int) -> None:
        """Worker ``w`` has run the task in its slot (begun at ``since``) past its timeout
        and grace: see the module."""
        view, me = self.view, _FIELDS * w
        call = service.call
        workers = service.runner.producers()
        procs = getattr(workers, "procs", None)
        if call is None or procs is None or w >= len(procs) or workers.closed:
            return
        proc = procs[w]
        if proc.pid is None or not _stop(proc.pid):
            return
        if view[me + _SINCE] != since:  # it ended meanwhile: its result is on its way
            os.kill(proc.pid, signal.SIGCONT)
            return
        job, index = view[me + _JOB], view[me + _INDEX]
        view[me + _SINCE] = 0
        what = f"task (call {index})" if job == 0 else f"item {index} of call {job}"
        err = PoolTimeoutError(
            f"{what} ran longer than the pool's task_timeout={self.limit:g} s and did not stop "
            f"within {self.grace:g} s more (blocked in C code?): its worker (pid {proc.pid}) was "
            "killed and replaced"
        )
        service.doomed.append(proc)
        _fail(service, job, index, err)
        # Its batch (one work item: the stream's batches hold one each) comes back empty.
        if not _put_empty(workers, call, _NO_SEQ, 0, 1, w):
            return
        if workers.replace(w, proc):
            # Killed, and a new worker took its place in the running stream: the others
            # and their work go on (_engine/retire.py).
            if proc in service.doomed:
                service.doomed.remove(proc)
            return
        # The stream takes no more work; what it queued and no worker took yet is given back
        # to the pool (sent again by the next stream), so the stream ends once the other
        # workers are done with their batches; its workers are then replaced (the stopped
        # one killed first: StreamService.stop_workers).
        feed = call.input.runs
        if isinstance(feed, Feed):
            feed.recycled = True
        service.scheduler.end_generation_if(lambda _feed_waiting: True)
        self.ending = call
        self._hand_back(service, call)

    def _hand_back(self, service: StreamService, call: Any) -> None:
        """Takes the batches of the ending stream that no worker took yet, gives their work
        items back to the pool and answers each with an empty result."""
        workers = service.runner.producers()
        if workers is None or workers.closed:
            return
        try:
            msgs = workers.in_q.get_many(1024, block=False)
        except (QueueEmpty, QueueClosed):
            return
        scheduler = service.scheduler
        for seq, kind, parts in msgs:
            t, c = wire.unpack_kind(kind)
            if t != wire.WORK or c != call.call:
                continue
            first, items = call.codec.loads(parts)
            del parts
            scheduler.resend([r for r in map(_again, items, repeat(scheduler)) if r is not None])
            _put_empty(workers, call, seq, first, len(items), 0)


def _again(item: Any, scheduler: Any) -> Any:
    """A work item taken back from the queue, made to be sent again (None: not to be). A
    task's travels as it came (its function and arguments are one pickle); a chunk of a call
    gets the call's function as the call sent it, and its arguments copied in band (they
    must outlive this stream's queues), by value where plain pickle cannot (a lambda among
    them); a chunk of a call that ended is dropped."""
    if item is None or item[0] == 0:
        return item
    jid, index, _fn, arg, mode = item
    job = scheduler.jobs().get(jid)
    if job is None or job.closed:
        return None
    try:
        arg = pickle.loads(pickle.dumps(arg, protocol=5))
    except Exception:  # noqa: BLE001 - what plain pickle cannot send, cloudpickle does
        try:
            arg = by_cloudpickle(arg)
        except Exception as e:  # noqa: BLE001 - reported to the call
            job.fail(e)
            return None
    return jid, index, job.fn, arg, mode


def _put_empty(workers: Any, call: Any, seq: int, first: int, n: int, w: int) -> bool:
    """Puts, for the stream, the results of batch ``seq`` (``n`` work items from ``first``)
    as if worker ``w`` had sent them: nothing (None each, which the pool's router skips)."""
    busy, wait = call.last_report(w)
    parts = call.codec.dumps((first, [None] * n, w, busy, wait, None))
    try:
        workers.out_q.put(seq, wire.pack_kind(wire.RESULT, call.call), parts, timeout=5.0)
    except Exception:  # noqa: BLE001 - the stream failed meanwhile: it fails the rest
        return False
    return True


def _fail(service: StreamService, job: int, index: int, err: BaseException) -> None:
    """Fails call ``job`` (or, ``job`` 0, the future of task ``index``) with ``err``."""
    scheduler = service.scheduler
    if job:
        j = scheduler.jobs().get(job)
        if j is not None:
            j.fail(err)
        return
    fut = scheduler.settle_task(index)
    if fut is not None:
        try:
            fut.set_exception(err)
        except InvalidStateError:
            pass  # cancelled or failed meanwhile (terminate)


def watch(service: StreamService, array: Any, limit: float | None) -> StuckWatch | None:
    """A :class:`StuckWatch` of the pool's service, if its workers have slots (a
    ``task_timeout`` with local workers)."""
    if array is None or limit is None:
        return None
    return StuckWatch(service, array, limit)
