"""The thread that runs a runner's consumer hooks (``runner(data)``): one a runner, kept
between its calls (:class:`ConsumerSlot`), so that a call wakes a parked thread instead of
starting one.

Starting a thread makes its caller wait until the new thread runs: ~45 µs on a quiet core,
and beside a busy process up to a scheduler slice (a new thread queues behind the running
ones; a woken one does not) — most of a short request/response call. A woken thread costs
a hand-off (~25 µs where the two threads share a core).

A parked thread must not change what the process forks or how a runner starts: before any
fork of this process (``os.register_at_fork``) and before a runner counts the threads that
choose its start method (:func:`retire_parked`), every parked consumer thread is ended and
has left the OS. A fork then sees the threads it saw before (easycore runs none between a
runner's calls), and a runner made after another's call still forks by default. A busy
consumer thread (in a call) is never ended: it counts, as it did before. The next call of a
runner whose thread was ended starts a new one.

States of a :class:`ConsumerThread` (``_LOCK`` guards ``_PARKED`` and ``keep``; the
thread's own condition guards its job): *running a job* (claimed: by its slot's call) →
*parked* (in ``_PARKED``, after the job, unless ``keep`` was cleared) → *claimed* (taken
out of ``_PARKED`` by its slot, given the next job) or *ending* (taken out of ``_PARKED`` by
:func:`retire_parked` or :meth:`ConsumerThread.retire`, told to end). A thread leaves
``_PARKED`` by one ``set.remove``/``set.pop`` (one step under the GIL), so exactly one party
takes it, and a call never hands a job to a thread that is ending: it finds the thread gone
and starts another. ``_LOCK`` is re-entrant: a runner's finalizer (garbage collection, at
any allocation) or a signal handler may end a thread while its own thread holds the lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from easycore._engine.zygote import await_gone

_LOCK = threading.RLock()
_PARKED: set[ConsumerThread] = set()  # guarded by _LOCK: threads between two jobs


class ConsumerThread:
    """A daemon thread that runs one job at a time and parks in between.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition(threading.Lock())
        # Guarded by _cond: the job to run next (set only by the party that claimed the
        # thread), and whether to end once no job is set.
        self._job: tuple[Callable[[], None], threading.Event] | None = None
        self._ending = False
        self.keep = True  # guarded by _LOCK: park after the running job (False: end)
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()  # claimed by its maker: not parked until its first job ends

    def claim(self) -> bool:
        """Takes the thread out of the parked ones; False if it is not parked (running a
        job, or ended)."""
        with _LOCK:
            try:
                _PARKED.remove(self)
            except KeyError:
                return False
            return True

    def run(self, job: Callable[[], None]) -> threading.Event:
        """Runs ``job`` (which must not raise) in the thread; only by the party that made or
        claimed it. The event is set once the job returned and the thread parked again."""
        done = threading.Event()
        with self._cond:
            self._job = (job, done)
            self._cond.notify()
        return done

    def retire(self, wait: bool) -> None:
        """Ends the thread: at once if parked, else after its running job; ``wait``: until
        a parked one has left the OS."""
        with _LOCK:
            self.keep = False
            try:
                _PARKED.remove(self)
            except KeyError:
                return  # running a job (it ends after it), or ended
        self.end()
        if wait:
            await_gone([self.thread])

    def end(self) -> None:
        """Tells a thread taken out of the parked ones (or never parked) to end once it has
        no job."""
        with self._cond:
            self._ending = True
            self._cond.notify()

    def _main(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._job is None and not self._ending:
                    cond.wait()
                task, self._job = self._job, None
            if task is None:
                return
            job, done = task
            del task
            ok = False
            try:
                job()
                ok = True
            finally:  # a job that raised ends the thread (the hook prints it), unparked
                del job  # the call and what it holds are not kept while parked
                with _LOCK:
                    keep = self.keep and ok
                    if keep:
                        _PARKED.add(self)
                done.set()
            if not keep:
                return


class ConsumerSlot:
    """A runner's consumer thread, kept between the runner's calls (one at a time: its
    ``CallGate``).

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: ConsumerThread | None = None

    def run(self, job: Callable[[], None]) -> tuple[threading.Thread, threading.Event]:
        """Runs ``job`` in the runner's consumer thread (a new one if none is parked);
        returns the thread and the event set once the job is over."""
        thread = self._thread
        if thread is None or not thread.claim():
            if thread is not None:
                thread.retire(wait=False)  # still busy (a call abandoned by its caller)
            thread = self._thread = ConsumerThread(self.name)
        return thread.thread, thread.run(job)

    def retire(self, wait: bool = True) -> None:
        """Ends the runner's consumer thread (the runner closed, or was dropped)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.retire(wait and thread.thread is not threading.current_thread())


def retire_parked() -> None:
    """Ends every parked consumer thread and waits until they have left the OS (before a
    fork, and before a runner counts threads to choose its start method)."""
    if not _PARKED:
        return
    parked: list[ConsumerThread] = []
    with _LOCK:
        while _PARKED:
            thread = _PARKED.pop()
            thread.keep = False
            parked.append(thread)
    for thread in parked:
        thread.end()
    await_gone([thread.thread for thread in parked])


def _forget_parked() -> None:
    """In a forked child: the parent's parked threads do not exist here, and another of
    its threads may have held the lock at the fork."""
    global _LOCK
    _LOCK = threading.RLock()
    _PARKED.clear()


os.register_at_fork(before=retire_parked, after_in_child=_forget_parked)
