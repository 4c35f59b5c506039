"""What lives, and how it all stops: the one registry of live pools, runners and producer
groups, the exit hook that stops them in that order, and the engine's shared timings.

* :data:`TICK`: seconds between health checks of every wait in the caller (a dead producer
  is noticed within it; a stopped call ends within it).
* :data:`INTERRUPT_GRACE_S`: after an interrupt (Ctrl-C, timeout, SIGTERM), the time left to
  ``producer_end`` before producers are killed.
* :func:`register` / :func:`discard`: an object is registered at one :class:`Stage` while it
  holds processes; :func:`stop_all` (at exit, in a producer that leaves, on SIGTERM) stops
  what is live, the pools first (their streams use runners), then the runners (their
  producers run ``producer_end``), then whatever producers are left (killed at once).
* :func:`before_stop`: a step the exit of a multiprocessing child runs first (see below).

A process that multiprocessing started (``Process``, a stdlib pool's worker) ends by
``os._exit`` after its target returns: Python's exit hooks, and the core's hook that removes
the process's liveness token, never run there. Such a process that used easycore would leave
its token, and the names of the queues it made, in ``/dev/shm`` until the next sweep, and
whatever it left open would be stopped only by its producers noticing its death. So in such a
process the same exit runs from multiprocessing's own exit function, before it joins its
children: the :func:`before_stop` steps (what threading's exit hooks do in a main process),
:func:`stop_all`, then the process lets go of its queues and removes its token.
"""

from __future__ import annotations

import atexit
import enum
import multiprocessing
import multiprocessing.util  # its exit hook first, so that ours runs before it
import weakref
from collections.abc import Callable
from typing import Any

# The core registers its exit hook (_prepare_exit) on import: ours runs before it too.
from easycore._core import leave_queues, retire_identity

TICK = 0.1
INTERRUPT_GRACE_S = 2.0


class Stage(enum.IntEnum):
    """Who is stopped when at exit, and how (the method called)."""

    POOL = 0  #: ``terminate()``
    RUNNER = 1  #: ``close()``
    PRODUCERS = 2  #: ``kill_now()``


_STOP = {Stage.POOL: "terminate", Stage.RUNNER: "close", Stage.PRODUCERS: "kill_now"}

# Pools and runners weakly (a dropped one is closed by its finalizer); producer groups
# strongly, until they are shut down: a group must be stopped even if nothing else holds it.
_WEAK: dict[Stage, weakref.WeakSet[Any]] = {
    Stage.POOL: weakref.WeakSet(),
    Stage.RUNNER: weakref.WeakSet(),
}
_PRODUCERS: set[Any] = set()


def register(stage: Stage, obj: Any) -> None:
    """``obj`` holds processes until :func:`discard`: stop it at exit."""
    if stage is Stage.PRODUCERS:
        _PRODUCERS.add(obj)
    else:
        _WEAK[stage].add(obj)


def discard(stage: Stage, obj: Any) -> None:
    """``obj`` holds no processes any more."""
    if stage is Stage.PRODUCERS:
        _PRODUCERS.discard(obj)
    else:
        _WEAK[stage].discard(obj)


def live(stage: Stage) -> list[Any]:
    """The objects registered at ``stage`` now."""
    return list(_PRODUCERS) if stage is Stage.PRODUCERS else list(_WEAK[stage])


def stop_all() -> None:
    """Stops everything live: pools, then runners, then producer groups (see the module)."""
    for stage in Stage:
        for obj in live(stage):
            try:
                getattr(obj, _STOP[stage])()
            except BaseException:  # noqa: BLE001, S110 - nothing useful to do at exit
                pass


# Registered after the exit hooks of multiprocessing and of the Rust core (imported above),
# so it runs before them: producers are stopped before multiprocessing joins its children
# (which would wait forever on one stuck in producer_end after an interrupted close()), and
# while the core's queues still work.
atexit.register(stop_all)

_BEFORE_STOP: list[Callable[[], None]] = []

# Above any priority a user would pick: multiprocessing runs its exit finalizers highest
# first, and those of priority >= 0 before it joins the process's children.
_CHILD_EXIT_PRIORITY = 1 << 40


def before_stop(step: Callable[[], None]) -> None:
    """Runs ``step`` first when a multiprocessing child exits (see the module): the steps a
    main process runs from threading's exit hooks, before the atexit hooks (finishing an
    executor's pending work)."""
    _BEFORE_STOP.append(step)


def _exit_child() -> None:
    """A multiprocessing child's exit: what the exit hooks would do (see the module)."""
    for step in _BEFORE_STOP:
        try:
            step()
        except BaseException:  # noqa: BLE001, S110 - nothing useful to do at exit
            pass
    stop_all()
    leave_queues()  # the names of queues this process was the last to use go too
    retire_identity()


class _ChildExit:
    """multiprocessing's after-fork registry holds its objects weakly: this one lives with
    the module, and registers :func:`_exit_child` in every child that multiprocessing starts
    after this module was imported (its finalizers are cleared there first)."""

    @staticmethod
    def register(_: object = None) -> None:
        multiprocessing.util.Finalize(None, _exit_child, exitpriority=_CHILD_EXIT_PRIORITY)


_CHILD_EXIT = _ChildExit()
multiprocessing.util.register_after_fork(_CHILD_EXIT, _ChildExit.register)
if multiprocessing.parent_process() is not None:  # imported in a child that already runs
    _ChildExit.register()
