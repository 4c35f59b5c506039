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
"""

from __future__ import annotations

import atexit
import enum
import multiprocessing.util  # noqa: F401 - its exit hook first, so that ours runs before it
import weakref
from typing import Any

import easycore._core  # noqa: F401 - its exit hook (_prepare_exit) too: ours runs before it

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
