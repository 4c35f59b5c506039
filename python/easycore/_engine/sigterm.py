"""SIGTERM to a process that runs runners: their producers are stopped and their shared
memory released before it dies; forked children get the default disposition back."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from easycore._core import retire_identity
from easycore._engine import lifecycle
from easycore._engine.lifecycle import INTERRUPT_GRACE_S, Stage

_SIGTERM_PREVIOUS: Any = None


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM to the caller: stop every runner's producers and release their shared
    memory, then die of SIGTERM as the previous (default) disposition would have."""
    for w in lifecycle.live(Stage.PRODUCERS):
        try:
            w.shutdown(INTERRUPT_GRACE_S, interrupt=True)
        except BaseException:  # noqa: BLE001 - dying anyway; kill what is left
            w.kill_now()
    previous = _SIGTERM_PREVIOUS
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    if previous in (None, signal.SIG_DFL):
        retire_identity()  # about to die of the signal: exit handlers will not remove it
    os.kill(os.getpid(), signum)


def _sigterm_default_in_child() -> None:
    """In a forked child (of any library: a ``multiprocessing.Pool`` worker too), SIGTERM
    gets back the disposition it had before :func:`_on_sigterm`. A Python-level handler runs
    only between bytecodes: a SIGTERM that lands just before a blocking call (a worker about
    to wait on a lock that its parent, terminating the pool, holds for good) is noted and
    never handled, and the child outlives its ``terminate()``. With our handler inherited,
    ``multiprocessing.Pool.terminate()`` hung in about 1 of 30 runs in a process that also
    ran an easycore pool. (Our producers reset it too, see ``worker.producer_main``.)"""
    global _SIGTERM_PREVIOUS
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            previous = _SIGTERM_PREVIOUS
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            _SIGTERM_PREVIOUS = None  # a runner made in the child installs it afresh
    except (ValueError, OSError):
        pass  # not the main thread of the main interpreter: nothing was inherited here


os.register_at_fork(after_in_child=_sigterm_default_in_child)


def install_handler() -> None:
    """Installs :func:`_on_sigterm` once, from the main thread, and only where SIGTERM still
    has its default disposition (a handler of the user's, or SIG_IGN, is left alone)."""
    global _SIGTERM_PREVIOUS
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return
    if current is _on_sigterm or current is not signal.SIG_DFL:
        return
    _SIGTERM_PREVIOUS = current
    signal.signal(signal.SIGTERM, _on_sigterm)
