"""What a stream (:class:`~easycore._engine.stream.Call`) gets from its runner: the
:class:`StreamHost`, made by the runner for each call. The stream never reads the runner
itself.

* :class:`StreamSettings`: how the runner's streams run, fixed when the runner is made;
* :class:`Learned`: the figures a runner learns across its calls (producer seconds and
  result bytes per item), which size the next call's batches from its first one;
* :class:`CallGate`: one call at a time (``begin`` waits for a call of another thread,
  ``end`` lets the next one in);
* :class:`StreamHost`: the above, plus the call's number and producers (its transport),
  the consumer hooks and cfg, and what the call may ask of the runner: a reorder buffer,
  to keep its statistics, to close it (a producer died, Ctrl-C, a timeout), what to send
  of input that does not pickle (the runner's :class:`~easycore._engine.extension.Extension`),
  and the runner's consumer thread (``consumer_thread.py``).

It also holds the progress bar that runners and the pool show (:func:`progress_bar`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from easycore._engine import wire
from easycore._engine.stats import RunnerStats
from easycore.errors import RunnerBusyError, RunnerTimeoutError

if TYPE_CHECKING:
    from easycore._core import ReorderBuffer
    from easycore._engine.consumer_thread import ConsumerSlot
    from easycore._engine.transport import Transport


@dataclass(frozen=True)
class StreamSettings:
    """How a runner's streams run, fixed when the runner is made.

    Attributes:
        ordered: results are delivered in input order (through a reorder buffer).
        window: the most items in flight (read and not yet delivered).
        window_floor: the window while the producers' cost per item is not known to be
            small (equal to ``window`` when the user set it).
        devices: one device per producer.
        codec: makes the codec that pickles items and results (the flavour's).
    """

    ordered: bool
    window: int
    window_floor: int
    devices: tuple[str, ...]
    codec: Callable[[], wire.Codec]


@dataclass
class Learned:
    """What a runner learns across calls (0: not known yet), written by its streams.

    Attributes:
        cost_per_item: producer seconds per item (sizes batches).
        out_bytes_per_item: pickled result bytes per item (bounds batches and the window
            by bytes).
        probe_habit: how the next call's adaptive reading starts (``probes.py``): the
            first probe interval of a call that follows a request/response one (0: none).
    """

    cost_per_item: float = 0.0
    out_bytes_per_item: float = 0.0
    probe_habit: int = 0


class GatedCall(Protocol):
    """What :class:`CallGate` reads of a call."""

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads taking part in the call (the first one made it)."""

    @property
    def is_imap(self) -> bool:
        """Whether the call is an ``imap`` (it holds the runner between two ``next()``)."""


class CallGate:
    """One call at a time on a runner (see ``BaseRunner.__call__``).

    Args:
        name: the runner's class name, for errors.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.cond = threading.Condition()
        self.active: GatedCall | None = None

    def begin(self, call: GatedCall, timeout: float | None) -> None:
        """Makes ``call`` the running call. Waits for a call of another thread to end;
        raises :class:`RunnerBusyError` at once where waiting could never end."""
        me = threading.current_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.active is not None:
                active = self.active
                if any(t is me for t in active.threads):
                    where = (
                        "from inside the running call (a consumer hook, or its input iterable)"
                        if me is not active.threads[0]
                        else "while an imap of it is still open in this thread"
                    )
                    raise RunnerBusyError(
                        f"this {self.name} runs one call at a time and a call was "
                        f"made {where}: it would wait on itself. Finish or close() the open "
                        "imap first, or use a second runner"
                    )
                if active.is_imap:
                    raise RunnerBusyError(
                        f"an imap of this {self.name} is open in another thread; "
                        "a runner runs one call at a time: finish or close() that imap first, "
                        "or use a second runner"
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RunnerTimeoutError(
                        f"timeout={timeout} s ran out while waiting for another thread's call "
                        "on this runner to finish",
                        timeout=timeout or 0.0,
                    )
                self.cond.wait(left)
            self.active = call

    def end(self, call: GatedCall) -> None:
        """``call`` is over: the next call may run."""
        with self.cond:
            if self.active is call:
                self.active = None
                self.cond.notify_all()


class ConsumerHooks(Protocol):
    """The consumer hooks of a runner class (looked up on the class)."""

    @staticmethod
    def consumer_init(cfg: Any) -> None: ...
    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None: ...
    @staticmethod
    def consumer_end(cfg: Any) -> Any: ...


@dataclass(frozen=True)
class StreamHost:
    """Everything one call uses of its runner (made by the runner for each call).

    Attributes:
        settings: the runner's :class:`StreamSettings`.
        name: the runner's class name (progress bars).
        hooks: the runner class, whose consumer hooks the call runs.
        cfg: the runner's cfg (the consumer gets a fresh copy per call).
        number: this call's number (messages of other calls are dropped).
        workers: the runner's producers (checked to be running when the host was made).
        learned: the runner's :class:`Learned` figures, updated by the call.
        gate: the runner's :class:`CallGate`.
        reorder_buffer: ``reorder_buffer(window)``: a reorder buffer for an ordered call.
        keep_stats: ``keep_stats(stats)``: the call's statistics become the runner's.
        shutdown: ``shutdown(interrupt)``: closes the runner (a producer died, Ctrl-C, a
            timeout).
        keep_sendable: ``keep_sendable(items, first, error)``: what to send of a batch that
            does not pickle (see :meth:`~easycore._engine.extension.Extension.keep_sendable`).
        consumer: the runner's :class:`~easycore._engine.consumer_thread.ConsumerSlot`: the
            thread that runs the consumer hooks, kept between calls.
    """

    settings: StreamSettings
    name: str
    hooks: type[ConsumerHooks]
    cfg: Any
    number: int
    workers: Transport
    learned: Learned
    gate: CallGate
    reorder_buffer: Callable[[int], ReorderBuffer]
    keep_stats: Callable[[RunnerStats], None]
    shutdown: Callable[[bool], None]
    keep_sendable: Callable[[list[Any], int, Exception], list[Any]]
    consumer: ConsumerSlot


def progress_bar(progress: Any, total: int | None, desc: str) -> Any:
    """A tqdm bar for ``progress=``: True, or a dict of ``tqdm.tqdm`` keyword arguments
    (``desc``, ``total``, ``leave``, ``position``, ``unit``…) that override the defaults
    (``total``: the input's length when known; ``desc``: the runner's or pool's class)."""
    import tqdm

    tqdm.tqdm.monitor_interval = 0  # no monitor thread (it would make fork unsafe)
    options: dict[str, Any] = {"total": total, "unit": "item", "desc": desc}
    if isinstance(progress, dict):
        options.update(progress)
    return tqdm.tqdm(**options)
