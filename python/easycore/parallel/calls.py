"""A pool's ``map``/``imap`` call in the caller's thread: handing out its results as they
arrive, closing it when its caller leaves, and ``map_async``'s collecting thread.

Nothing here holds the pool: what a call needs (its job, the scheduler, how to close it) is
passed in, so a results iterator never keeps a dropped pool's workers alive by itself.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from easycore._engine.lifecycle import TICK
from easycore._engine.probes import PROBE_INHERITED_S
from easycore.errors import PoolClosedError, PoolTimeoutError
from easycore.parallel.job import ASK, GIVE, READ, RECEIVE, WAIT, _Job
from easycore.parallel.results import AsyncResult, _async_result
from easycore.parallel.schedule import Scheduler
from easycore.parallel.tasks import mark_abandoned


def close_job(job: _Job, scheduler: Scheduler, abandoned: Any) -> None:
    """``job``'s caller is done with it: its input is not read further, and if it left
    before the end (``break``), the workers skip its items still queued."""
    with job.cv:
        if not (job.input_done and job.consumed >= job.pulled):
            mark_abandoned(abandoned, job.jid)  # left early: skip what is queued
        job.closed = True
    scheduler.close_job(job.jid)


def _abandon(job: _Job, scheduler: Scheduler, abandoned: Any) -> None:
    """``job``'s results iterator was dropped: the call is abandoned. Takes no lock (this
    runs wherever the garbage collector does): the feed drops a closed job."""
    job.closed = True
    mark_abandoned(abandoned, job.jid)
    scheduler.cut_reading()


def results(
    job: _Job,
    chunks: Iterator[Iterator[Any]],
    scheduler: Scheduler,
    abandoned: Any,
) -> Iterator[Any]:
    """The results of ``job``, one at a time: a C-level chain over the lists that
    ``chunks`` (:func:`result_chunks`) hands out (no Python frame per result)."""
    # A results iterator dropped unconsumed (never started: its finally never runs)
    # abandons its call, so that close()/shutdown() do not wait for it.
    weakref.finalize(chunks, _abandon, job, scheduler, abandoned)
    return itertools.chain.from_iterable(chunks)


_LAST = (-1,)  # the argument of list.pop that hands out a one-result list's result


def _handed_out(chunk: list[Any]) -> Iterator[Any]:
    """The results of ``chunk`` in order, each dropped from the list as it is handed out:
    a result the caller has dropped is freed at once, not when its whole chunk is consumed
    (as the stdlib's pools keep no result). C-level, no Python frame per result."""
    chunk.reverse()
    return map(chunk.pop, itertools.repeat(-1, len(chunk)))


def result_chunks(
    job: _Job,
    scheduler: Scheduler,
    timeout: float | None,
    begin: Callable[[], Any],
    close: Callable[[], None],
    terminate: Callable[[], None],
) -> Iterator[Iterator[Any]]:
    """The runs of ``job``'s results as they can be handed out (in order, or as they
    arrived). ``begin`` is called when the caller first asks (it may refuse the calling
    thread) and returns a progress bar or None; ``close`` closes the job (called at the end,
    however it ends); ``terminate`` stops the pool (Ctrl-C)."""
    bar = begin()
    deadline = None if timeout is None else time.monotonic() + timeout
    # A request/response input is read here, in the caller's thread (see job.wait_step and
    # turn.py); not with a deadline (reading the input could outlast it).
    allowed = deadline is None and scheduler.direct_ok
    drained = scheduler.stream_drained
    # With nothing to take, the caller receives itself while the stream lets it (the one
    # call the pool has: turn.py, StreamService._lone_caller), else it waits on the job;
    # after a receive, not again before a wait or a result (``tried``).
    job.receives = allowed
    turn_free = scheduler.turn_free
    tried = False
    # Results of the chunks handed out whole since they were last counted in job.consumed.
    # A result counts as consumed only once the caller has it: until then it is held here,
    # in its chunk, and (large results) in its pooled segment, and the feed must not read
    # ahead for it (see job.has_room).
    done = 0
    try:
        while True:
            step = WAIT
            full = False
            with job.lock:
                if done:
                    if job.direct:  # (_consumed's first case, inline: once a round trip)
                        job.consumed += done
                    else:
                        full = _consumed(job, done)
                    done = 0
                while True:
                    if job.error is not None and job.next_index >= job.error_at:
                        raise job.error
                    if scheduler.terminated:
                        raise PoolClosedError("the pool was terminated")
                    n = 0  # results in got (a list of lists: none is copied)
                    if job.ordered:
                        by_index: dict[int, list[Any]] = job.ready  # type: ignore[assignment]
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
                        arrived: collections.deque[list[Any]] = job.ready  # type: ignore[assignment]
                        if arrived:
                            got = list(arrived)
                            arrived.clear()
                            for chunk in got:
                                n += len(chunk)
                        else:
                            got = []
                    if n:
                        tried = False
                        break
                    if job.input_done and job.consumed >= job.pulled:
                        return
                    step = job.wait_step(allowed, drained)
                    if step != WAIT:
                        break
                    if allowed and not tried and turn_free():
                        step = RECEIVE
                        break
                    # On trial, its end is looked at after a wait of its span (wait_step).
                    wait = PROBE_INHERITED_S if job.trial_until else TICK
                    if deadline is not None:
                        wait = min(wait, deadline - time.monotonic())
                        if wait <= 0:
                            raise PoolTimeoutError(f"no result within timeout={timeout} s")
                    job.waiting = True
                    job.cv.wait(wait)
                    job.waiting = False
                    tried = False
                if step == WAIT and n > 1:
                    job.ran_ahead()
            if full:  # the feed may wait for this job's room: wake it (not under job.cv)
                scheduler.notify()
            if step == RECEIVE:
                # Once a receive ends without a result to take, the next look waits on the
                # job (a result handed out allows another receive).
                scheduler.receive_for(job)
                tried = True
                continue
            if step == READ:
                own = scheduler.read_and_send(job)
                if own is None:
                    continue  # it comes the common way (a result, or an error)
                n = len(own)
                if job.ordered:
                    with job.lock:
                        job.next_index += n
                if bar is not None:
                    bar.update(n)
                # (One result: its list's pop, as _handed_out does, without the frame.)
                yield map(own.pop, _LAST) if n == 1 else _handed_out(own)
                del own
                done = n  # counted with the next look at the job
                continue
            if step == ASK:
                scheduler.want_input()
                continue
            if step == GIVE:
                scheduler.notify()  # the feed reads the input from now on
                continue
            if bar is not None:
                bar.update(n)
            last = len(got) - 1
            for k, chunk in enumerate(got):
                size = len(chunk)
                yield _handed_out(chunk)
                # The caller took the whole chunk (the next one is asked for).
                if k < last:
                    with job.lock:
                        full = _consumed(job, size)
                    if full:
                        scheduler.notify()
                else:
                    done = size  # counted with the next look at the job
            del got, chunk  # not held while the caller consumes the next chunk
    except KeyboardInterrupt:
        # Ctrl-C: stop everything, as the runners do (busy workers are interrupted).
        close()
        terminate()
        raise
    finally:
        if bar is not None:
            bar.close()
        close()


def _consumed(job: _Job, n: int) -> bool:
    """Under ``job.cv``: ``n`` more results of ``job`` were handed to its caller. Whether
    that gave the job room to read ahead again (the feed may be waiting for it)."""
    if job.direct:  # the caller reads the input itself: the feed reads none of it
        job.consumed += n
        return False
    full = not job.has_room()
    job.consumed += n
    return full and job.has_room()


def collect(
    values: Callable[[], Iterator[Any]],
    callback: Callable[[list[Any]], Any] | None,
    error_callback: Callable[[BaseException], Any] | None,
) -> AsyncResult:
    """``map_async``: a thread makes a list of ``values()``; the :class:`AsyncResult` of it."""
    fut: Future[list[Any]] = Future()
    fut.set_running_or_notify_cancel()
    result = _async_result(fut, callback, error_callback)

    def run() -> None:
        try:
            value = list(values())
        except BaseException as e:  # noqa: BLE001 - handed to get()
            fut.set_exception(e)
        else:
            fut.set_result(value)

    threading.Thread(target=run, name="easycore-map-async", daemon=True).start()
    return result
