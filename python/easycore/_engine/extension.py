"""The one extension point of a runner built on the engine: :class:`Extension`.

A plain runner has none (:data:`NO_EXTENSION`). The pool's runner
(``easycore.parallel.tasks``) makes one per runner and sets it as the runner's
``_extension`` before the runner's constructor runs; the runner then asks it, never the
other way round:

* on the caller's side, when producers start: :meth:`Extension.producer_setup` wraps the
  flavour's device set-up (the pool keeps its initializer there);
* on the caller's side, when a batch of input does not pickle:
  :meth:`Extension.keep_sendable` says which items to send anyway (a runner's call fails;
  the pool fails only the culprit's own call);
* in each producer, when a batch's results do not pickle: :attr:`Extension.fix_unsendable`
  (a module-level function, sent to the producers by reference) replaces the culprits by
  error reports, so that one bad result fails only its own call;
* when local producers start under fork: :attr:`Extension.fork_from_zygote` has them forked
  by a zygote made at the first start (``zygote.py``), for a runner that restarts them while
  threads of its own run (the pool);
* when local producers start: :attr:`Extension.max_tasks` has each retire after that many
  work messages, replaced in the running stream (``retire.py``; the pool's
  ``maxtasksperchild``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from easycore._engine.reports import not_picklable_error

#: ``setup(device)``, run first in each producer (or None)
Setup = Callable[[str], Any] | None
#: ``fix(results, device)``: the results with the culprits replaced, or None (no fix)
Fixer = Callable[[list[Any], str], list[Any] | None]


class Extension:
    """What a runner built on the engine adds to a plain runner (see the module). This base
    adds nothing: subclasses override what they change."""

    #: run in each producer on a batch whose results do not pickle (None: the call fails)
    fix_unsendable: Fixer | None = None
    #: under fork, producers come from a zygote forked at the first start (``zygote.py``)
    fork_from_zygote: bool = False
    #: each local producer retires after this many work messages and a new one takes its
    #: place in the running stream (``retire.py``); 0: never
    max_tasks: int = 0
    #: local producers may be replaced in the running stream (``retire.py``): by
    #: ``max_tasks``, or when the runner gives one up (the pool's stuck tasks)
    replaceable: bool = False

    def producer_setup(self, base: Setup, seed: int) -> Setup:
        """The ``setup(device)`` run first in each producer, given the flavour's ``base``
        (or None) and the runner's base ``seed``: ``base`` itself here."""
        return base

    def keep_sendable(self, items: list[Any], first: int, error: Exception) -> list[Any]:
        """A batch of input items ``first...`` did not pickle (``error``): returns the items
        to send anyway (same length; a dropped one as None, or fewer items to drop them), or
        raises. Here: raises :class:`~easycore.errors.SerializationError` naming the
        culprit, so the call fails."""
        what = f"input item {first}..{first + len(items) - 1}"
        raise not_picklable_error(what, items, error) from error


NO_EXTENSION = Extension()
