"""The runners: :class:`BaseRunner` and its two flavours. A runner starts one producer
process per device (``activate``), runs one call at a time (``runner(data)``, ``imap``) and
closes its producers (``close``, at exit, on a producer's death, Ctrl-C, a call's timeout).

Where the rest lives (the private engine, ``easycore._engine``, whose ``__init__``
documents its interfaces):

* ``stream.py``: one call's data path (reader, sender, receiver, consumer thread, window,
  batching, stats), configured by :class:`~easycore._engine.stream.StreamSettings`;
* ``local.py``: starting local producers; ``transport.py``: the producers as a call sees
  them, and how they are stopped;
* ``process_main.py``: the producer process around ``producer.py``'s producer core;
* ``wire.py``: message kinds and the codec; ``reports.py``: error reports and the
  exceptions raised for them; ``flavour.py``: what the torch runners change;
* ``lifecycle.py``: what is stopped at exit; ``sigterm.py``: SIGTERM to the caller.

A dead producer, Ctrl-C, a call's timeout or SIGTERM close the runner: producers busy in
``producer_work`` are interrupted (SIGUSR1), then stopped; ``activate()`` restarts them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from easycore._core import (
    Queue,
    ReorderBuffer,
)
from easycore._engine import lifecycle, plugins, wire
from easycore._engine.consumer_thread import ConsumerSlot, retire_parked
from easycore._engine.extension import NO_EXTENSION, Extension
from easycore._engine.flavour import PLAIN, Flavour
from easycore._engine.host import CallGate, Learned, StreamHost, StreamSettings
from easycore._engine.lifecycle import Stage
from easycore._engine.local import ProducerStart, make_zygote, start_local
from easycore._engine.reports import worker_error
from easycore._engine.sigterm import install_handler
from easycore._engine.stats import RunnerStats
from easycore._engine.stream import Call
from easycore._engine.transport import Transport
from easycore._engine.zygote import Zygote
from easycore.common.parallel.devices import (
    choose_start_method,
    parse_devices,
    start_method_reason,
)
from easycore.common.parallel.hooks import RunnerHooks
from easycore.errors import (
    InvalidArgument,
    RunnerBusyError,
    RunnerClosedError,
)

# Most items in flight by default once items are known to be cheap (the pool's default
# window too): batches of tiny items of up to 65536 / (4 * producers) items.
_CHEAP_ITEMS_WINDOW = 65536


def _to_cfg(cfg: Any) -> Any:
    """The runner's cfg as a CfgNode (a plain dict is accepted)."""
    from easycore.common.config import CfgNode

    if cfg is None:
        return CfgNode()
    if isinstance(cfg, CfgNode):
        return cfg
    if isinstance(cfg, dict):
        return CfgNode(cfg)
    raise InvalidArgument(f"cfg must be a CfgNode or a dict, got {type(cfg).__name__}")


def _random_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _remote_plan(backend: Any, devices: Any, start_method: str | None) -> Any:
    """The seam to producers that are not local processes: None for ``backend=None`` or
    ``"local"``, else the backend's plan for ``devices``. A plan has ``devices`` (one device
    string per producer), ``start_method`` (a ``(name, reason)`` pair) and ``start(start)``
    (given the runner's :class:`~easycore._engine.local.ProducerStart`), which returns a
    :class:`~easycore._engine.transport.Transport` (``send``, ``receive``, ``wake``,
    ``dead``, ``shutdown``…) on which the stream runs unchanged. Only
    ``easycore.ray`` makes plans today; ``"ray"`` loads it on demand
    (``easycore._engine.plugins``)."""
    if backend is None or backend == "local":
        return None
    if start_method is not None:
        raise InvalidArgument(f"start_method cannot be given with backend={backend!r}")
    if backend == "ray":
        backend = plugins.load("backend:ray")()
    if not callable(getattr(backend, "plan", None)):
        raise InvalidArgument(
            f"backend must be None, 'local', 'ray' or an easycore.ray.RayBackend, got {backend!r}"
        )
    return backend.plan(devices)


class BaseRunner(RunnerHooks):
    """A multi-process runner: one producer process per device, one consumer thread.

    Subclass :class:`UnorderedRunner` or :class:`OrderedRunner` and override the six static
    hooks. The runner is active (its processes started) after construction. Inside the
    producer hooks, :func:`~easycore.common.parallel.worker_info` tells which producer runs.

    The consumer hooks run in the runner's consumer thread (``"easycore-consumer"``), one for
    the runner's life: it waits between calls, and is ended by :meth:`close` and before any
    fork of the process (forks, and runners made later, see no thread of this runner); the
    next call then starts a new one. Thread-local state a consumer hook sets (torch's grad
    mode, say) therefore carries to the next call's hooks while the thread lasts.

    Args:
        devices (int or Iterable): an int ``n`` uses ``n`` ``"cpu"`` producers; an iterable
            gives one producer per entry, such as ``["cpu", "cuda:0", "cuda:1"]``.
        cfg (easycore.common.config.CfgNode): user data carried into every hook; each
            producer gets its own copy, and each call gives the consumer a fresh copy.
            A plain dict is accepted.
        queue_scale (float): scales the shared-memory queues and the number of items in
            flight (``window``) with ``len(devices) * queue_scale``.
        start_method (str, optional): ``"fork"``, ``"spawn"`` or ``"forkserver"``. By default
            ``"fork"`` on Linux for CPU-only runners created while a single thread runs, else
            ``"spawn"`` (the runner's repr says which, and why); GPU devices always use
            ``"spawn"``. Under spawn and forkserver the runner class must be importable
            (define it at module level; create the runner under
            ``if __name__ == "__main__":``) and ``cfg`` picklable.
        window (int, optional): most items in flight at once. By default
            ``max(16, int(256 * len(devices) * queue_scale))``, and more once the producers'
            time per item is known to be small: as many as make four batches of about 4 ms
            of work per producer, up to 65536 (so tiny items travel in batches of
            thousands). Items in flight are bounded by bytes as well, either way.
        close_timeout (float): seconds ``close()`` waits for ``producer_end`` before it
            terminates a producer.
        seed (int, optional): producer ``i`` seeds ``random``, numpy and torch (those it has
            imported) with ``seed + i`` before ``producer_init``; default: a random base, so
            producers always draw different random streams.
        seed_per_item (bool): also seed ``random``, numpy's global generator and torch's CPU
            generator (where imported) before *each item*, from ``seed``, the call's number and the
            item's index, so that what ``producer_work`` draws for an item is the same with
            any number of producers and any scheduling (give ``seed`` to repeat a run).
            Costs about 4 to 7 µs per item (more with numpy and torch imported); off by default.
        init_timeout (float, optional): most seconds the producers may take to start and
            run ``producer_init`` (local producers; default 600); past it they are stopped
            and :class:`~easycore.errors.RunnerTimeoutError` is raised.
        backend (str or object, optional): where the producers run. None (or ``"local"``):
            processes on this machine. ``"ray"``, or an ``easycore.ray.RayBackend(...)``:
            one Ray actor per device, anywhere on a Ray cluster (``pip install
            'easycore[ray]'``; see docs/ray.md); the hooks, calls and errors are the same.
    """

    _ordered = False

    #: codec, start context, device check and set-up (the torch runners: torch's)
    _flavour: ClassVar[Flavour] = PLAIN
    #: what a runner built on the engine adds (``easycore._engine.extension``): none here;
    #: the pool's runner sets its own on the instance before this class's ``__init__`` runs
    _extension: Extension = NO_EXTENSION

    def __init__(
        self,
        devices: int | Iterable[str],
        cfg: Any = {},  # noqa: B006 - the manual's signature; never mutated
        queue_scale: float = 3.0,
        *,
        start_method: str | None = None,
        window: int | None = None,
        close_timeout: float = 10.0,
        seed: int | None = None,
        seed_per_item: bool = False,
        init_timeout: float | None = None,
        backend: Any = None,
    ) -> None:
        self._owner_pid = os.getpid()
        self._remote = _remote_plan(backend, devices, start_method)
        if self._remote is None:
            self._devices = parse_devices(devices)
            self._flavour.check_devices(self._devices)
            start_method = self._flavour.default_start_method(start_method)
        else:
            self._devices = self._remote.devices
        self._cfg = _to_cfg(cfg)
        if not queue_scale > 0:
            raise InvalidArgument(f"queue_scale must be positive, got {queue_scale!r}")
        self._queue_scale = float(queue_scale)
        if self._remote is None:
            retire_parked()  # other runners' consumer threads between calls do not count
            self._start_method = choose_start_method(start_method, self._devices)
            self._start_reason = start_method_reason(
                start_method, self._devices, self._start_method
            )
        else:
            self._start_method, self._start_reason = self._remote.start_method
        n = len(self._devices)
        # Items in flight. By default at least the floor, and up to _CHEAP_ITEMS_WINDOW once
        # items are known to be cheap (Call._window_now): batches of tiny items then grow to
        # thousands (a batch is at most a quarter of the window per producer). A window the
        # user sets is the window, floor and cap alike.
        floor = max(16, int(256 * n * self._queue_scale))
        self._window = int(window) if window else max(floor, _CHEAP_ITEMS_WINDOW)
        self._window_floor = self._window if window else floor
        if self._window < 1:
            raise InvalidArgument(f"window must be at least 1, got {window!r}")
        self._settings = StreamSettings(
            ordered=self._ordered,
            window=self._window,
            window_floor=self._window_floor,
            devices=tuple(self._devices),
            codec=self._codec,
        )
        if seed is not None and not isinstance(seed, int):
            raise InvalidArgument(f"seed must be an int or None, got {seed!r}")
        self._seed = _random_seed() if seed is None else int(seed)
        self._seed_per_item = bool(seed_per_item)
        if init_timeout is not None and not init_timeout > 0:
            raise InvalidArgument(f"init_timeout must be positive or None, got {init_timeout!r}")
        self._init_timeout = init_timeout
        self._close_timeout = close_timeout
        self._workers: Transport | None = None
        self._zygote: Zygote | None = None
        self._zygote_made = False  # made once: one that died is not made again
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._calls = itertools.count(1)
        self._learned = Learned()  # producer seconds and result bytes per item
        # An ordered runner's reorder buffer, kept for the next call while it is empty
        # (making one of the default window's 65536 slots took ~27 us a call).
        self._reorder: ReorderBuffer | None = None
        self._lock = threading.Lock()
        self._gate = CallGate(type(self).__name__)  # one call at a time
        # The consumer hooks' thread, parked between calls; ended with the runner.
        self._consumer = ConsumerSlot("easycore-consumer")
        weakref.finalize(self, self._consumer.retire, False).atexit = False
        self.stats = RunnerStats()
        # What each producer's producer_end returned, by position in devices, when the
        # producers last stopped (close()); None for one that returned nothing or died.
        self.exit_results: list[Any] = []
        install_handler()
        self.activate()

    # ----- what the engine gets -----

    @classmethod
    def _codec(cls) -> wire.Codec:
        """How items and results are pickled (the torch flavour sends tensors out of band)."""
        return cls._flavour.codec()

    def _stream_host(self) -> StreamHost:
        """What the next call uses of this runner (raises if the runner is closed)."""
        return StreamHost(
            settings=self._settings,
            name=type(self).__name__,
            hooks=type(self),
            cfg=self._cfg,
            number=next(self._calls),
            workers=self._active_workers(),
            learned=self._learned,
            gate=self._gate,
            reorder_buffer=self._reorder_buffer,
            keep_stats=self._keep_stats,
            shutdown=self._shutdown,
            keep_sendable=self._extension.keep_sendable,
            consumer=self._consumer,
        )

    def _keep_stats(self, stats: RunnerStats) -> None:
        self.stats = stats

    def _producer_start(self) -> ProducerStart:
        """What the producers are started with, local or remote."""
        n = len(self._devices)
        base = self._flavour.producer_setup(n, self._start_method)
        return ProducerStart(
            hooks=type(self),
            devices=tuple(self._devices),
            cfg=self._cfg,
            seed=self._seed,
            start_method=self._start_method,
            start_reason=self._start_reason,
            window=self._window,
            queue_scale=self._queue_scale,
            flavour=self._flavour,
            setup=self._extension.producer_setup(base, self._seed),
            fix_unsendable=self._extension.fix_unsendable,
            seed_per_item=self._seed_per_item,
            init_timeout=self._init_timeout,
            max_tasks=self._extension.max_tasks,
            replaceable=self._extension.replaceable or self._extension.max_tasks > 0,
        )

    # ----- life cycle -----

    def _input_queue(self) -> Queue | None:
        """The input queue while active: ``easycore.shm.empty(..., runner=self)`` leases
        input arrays from its pool."""
        w = self._workers
        return w.input_queue() if w is not None and not w.closed else None

    @property
    def is_activate(self) -> bool:
        """bool: whether the runner is alive (its producer processes started)."""
        return self._workers is not None and not self._workers.closed

    @property
    def devices(self) -> list[str]:
        """list[str]: one device per producer process."""
        return list(self._devices)

    @property
    def start_method(self) -> str:
        """str: how producer processes are started."""
        return self._start_method

    @property
    def seed(self) -> int:
        """int: the base seed; producer ``i`` uses ``seed + i``."""
        return self._seed

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid:
            raise RunnerBusyError(
                f"this {type(self).__name__} belongs to process {self._owner_pid}, which made "
                f"it; process {os.getpid()} (a forked child) cannot use it. Make a new runner "
                "in this process; the parent's runner is unaffected"
            )

    def activate(self) -> None:
        """Restart all processes if this runner is closed (a no-op while active)."""
        self._check_owner()
        with self._lock:
            if self.is_activate:
                return
            start = self._producer_start()
            if self._remote is not None:  # producers elsewhere: the same calls on its workers
                workers: Transport = self._remote.start(start)
            else:
                workers = self._start_local(start)
            self._workers = workers
            self._finalizer = self._finalize_with(workers)

    def _start_local(self, start: ProducerStart) -> Transport:
        """Starts local producers: forked by the zygote where the extension asks for one
        (made at the first start, under fork: see ``_engine/zygote.py``)."""
        first = self._extension.fork_from_zygote and not self._zygote_made
        if first:
            retire_parked()  # as in __init__: parked threads do not count
        if first and threading.active_count() == 1:
            # One thread: the first producers are forked here (no round trip to a zygote),
            # and the zygote right after, as they saw this process, forks their replacements.
            workers = start_local(start)
            try:
                self._make_zygote(start)
            except BaseException:
                workers.shutdown(timeout=2.0, interrupt=True)
                raise
            workers.adopt_zygote(self._zygote)  # it forks their replacements (retire.py)
            return workers
        if first:
            self._make_zygote(start)
        try:
            return start_local(dataclasses.replace(start, zygote=self._zygote))
        except BaseException:
            if first:  # the constructor fails: nobody will restart the producers
                self._close_zygote()
            raise

    def _make_zygote(self, start: ProducerStart) -> None:
        self._zygote_made = True
        self._zygote = make_zygote(start)
        if self._zygote is not None:
            weakref.finalize(self, self._zygote.close).atexit = False

    def _close_zygote(self) -> None:
        """Stops the zygote, if any: no producer will be started again."""
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

    def _finalize_with(self, workers: Transport) -> weakref.finalize[Any, Any]:
        """Registers the runner as live (stopped at exit, in order: ``lifecycle``) and
        returns the finalizer that stops ``workers`` if the runner is dropped unclosed. The
        finalizer does not run at exit: weakref's exit hook would run before lifecycle's and
        close a pool's runner (waiting ``close_timeout`` for busy producers) under the pool."""
        finalizer = weakref.finalize(self, workers.shutdown, self._close_timeout)
        finalizer.atexit = False
        lifecycle.register(Stage.RUNNER, self)
        return finalizer

    def close(self) -> None:
        """Shutdown all processes if this runner is alive (``producer_end`` runs in each).

        What each ``producer_end`` returned is then in ``exit_results`` (a list by position
        in ``devices``; None for a producer that returned nothing or died).
        Closing twice is harmless. Errors raised by ``producer_end`` are reported as a
        :class:`~easycore.errors.WorkerError` after every process has stopped. Ctrl-C while
        ``close()`` waits kills the producers at once. In a forked child the parent's runner
        is left alone.
        """
        self._shutdown(interrupt=False)

    def _shutdown(self, interrupt: bool) -> None:
        self._consumer.retire()
        with self._lock:
            workers, self._workers = self._workers, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            lifecycle.discard(Stage.RUNNER, self)
        if workers is None or workers.closed:
            return
        workers.shutdown(self._close_timeout, interrupt=interrupt)
        results = workers.exit_results
        self.exit_results = [results.get(i) for i in range(len(self._devices))]
        if workers.end_errors:
            raise worker_error(workers.end_errors[0])

    def __enter__(self) -> BaseRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "active" if self.is_activate else "closed"
        reason = "" if self._start_method == "fork" else f" ({self._start_reason})"
        return (
            f"<{type(self).__name__} devices={self._devices} start_method="
            f"{self._start_method!r}{reason} {state}>"
        )

    def __getstate__(self) -> None:
        raise TypeError(
            "a runner cannot be pickled or sent to another process; create it in the process "
            "that calls it"
        )

    def _reorder_buffer(self, window: int) -> ReorderBuffer:
        """A reorder buffer of ``window`` slots for a new call: the last call's if it holds
        nothing (the call numbers its batches from its ``next_seq``), else a new one (a
        failed call may have left results in it)."""
        rb = self._reorder
        if rb is None or len(rb) or rb.window != window:
            rb = self._reorder = ReorderBuffer(window)
        return rb

    def _active_workers(self) -> Transport:
        self._check_owner()
        w = self._workers
        if w is None or w.closed:
            raise RunnerClosedError(
                f"this {type(self).__name__} is closed; call activate() to restart it"
            )
        return w

    # ----- calls -----

    def __call__(
        self,
        data_iter: Iterable[Any],
        progress: bool | dict[str, Any] = False,
        timeout: float | None = None,
        *,
        read_ahead: bool | None = None,
    ) -> Any:
        """Runs every item of ``data_iter`` through the producers and the consumer.

        A runner runs one call at a time: a call from another thread waits for the running
        one; a call that would wait on itself (from inside ``consumer_work``, or while an
        ``imap`` of the runner is open) raises :class:`~easycore.errors.RunnerBusyError`.

        Args:
            data_iter (Iterable): iterator of data; read lazily (a ``range``, list or tuple
                in place, any other iterable by a helper thread that keeps at most
                ``window`` items ahead).
            progress (bool or dict): show a tqdm progress bar (with a total when
                ``data_iter`` has a length); a dict gives ``tqdm.tqdm``'s keyword arguments
                (``desc``, ``leave``, ``position``…, ``total`` for an input of unknown length).
            timeout (float, optional): seconds to wait for the next result while items are
                in flight; when it runs out, :class:`~easycore.errors.RunnerTimeoutError`
                (a ``TimeoutError``) names the stuck item and producer, and the runner is
                closed (``activate()`` restarts it). A stall limit, not a deadline: a long
                call that keeps delivering never times out. (The pool's ``timeout=`` is the
                stdlib's: a deadline for the whole call.)
            read_ahead (bool, optional): how an iterator input is read. None (the default)
                adapts: a helper thread reads ahead and the sender batches what it read;
                once the input behaves as a request/response loop (each item comes only
                after the previous result), the receiving thread reads it itself, one item
                whenever none is in flight, saving the hand-off through the helper thread
                on each round trip; when the input runs ahead again, the helper thread
                takes it back (``runner.stats.direct_items`` counts the items read
                directly). True always reads ahead; False always reads in the receiving
                thread (fast inputs then lose their batching). A range, list or tuple is
                sliced in place either way.

        Returns:
            Any: result (the value ``consumer_end`` returns)
        """
        host = self._stream_host()
        call = Call(host, data_iter, progress, timeout, is_imap=False, read_ahead=read_ahead)
        return call.run_with_consumer()

    def imap(
        self,
        data_iter: Iterable[Any],
        progress: bool | dict[str, Any] = False,
        timeout: float | None = None,
        *,
        read_ahead: bool | None = None,
    ) -> Iterator[Any]:
        """Yields the producers' results in the caller's thread, without the consumer hooks.

        ``OrderedRunner`` yields in input order, ``UnorderedRunner`` as results arrive. The
        input is read lazily and at most ``window`` items are in flight. The call starts at
        the first ``next()`` and holds the runner until the iterator is exhausted or closed;
        stopping early (``break``, or closing the generator) leaves the runner usable.

        Args:
            data_iter (Iterable): iterator of data.
            progress (bool or dict): as for ``__call__``.
            timeout (float, optional): as for :meth:`__call__`.
            read_ahead (bool): as for :meth:`__call__`.

        Yields:
            Any: what ``producer_work`` returned for each item.
        """
        host = self._stream_host()
        call = Call(host, data_iter, progress, timeout, is_imap=True, read_ahead=read_ahead)
        return call.iterate()


class UnorderedRunner(BaseRunner):
    """A multi-process runner whose consumer receives data unordered (as results arrive).

    The runner starts one producer process per device and one thread for the consumer.
    """

    _ordered = False


class OrderedRunner(BaseRunner):
    """A multi-process runner whose consumer receives data in input order.

    The runner starts one producer process per device and one thread for the consumer;
    results that arrive early wait in a bounded reorder buffer.
    """

    _ordered = True
