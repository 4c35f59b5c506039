"""The runners: producer processes fed through the Rust shared-memory queues, a consumer
thread, and the dispatcher that feeds them.

Data path of one call (``runner(data)``)::

    input ─▶ [reader] ─▶ batches ─▶ pickle ─▶ [input Queue] ─▶ producers: producer_work
    consumer thread: consumer_work ◀─ [ReorderBuffer] ◀─ unpickle ◀─ [output Queue] ◀─┘

* One thread receives results (the consumer thread, or the caller's thread for ``imap``) and
  also sends the input, whenever it runs: nothing waits to fill a batch. A ``range``, list
  or tuple is sliced in place. Any other iterable is read by a helper thread
  ("easycore-input") into a buffer bounded by the window: the sender takes whatever is
  there, so fast inputs travel in large batches and a slow or feedback input (item i+1
  exists only once result i arrived) is sent item by item, at once. When nothing is in
  flight and the receiver sleeps, the reader sends a new item itself; otherwise it wakes
  the receiver with a ``WAKE`` message on the output queue.
* At most ``window`` items are in flight (read and not yet handed to ``consumer_work``), so
  memory stays bounded whatever the input's length and however slow one producer is.
* Batch sizes adapt to the producers' measured time per item (about 4 ms of work per batch).
* Every message carries the call number: results, errors and wake-ups of an aborted call are
  dropped by later ones, so a runner stays usable after an error in a hook, an input that
  raises, or an abandoned ``imap``. One call runs at a time (see :meth:`BaseRunner.__call__`).
* A dead producer, Ctrl-C, a call's timeout or SIGTERM close the runner: producers busy in
  ``producer_work`` are interrupted (SIGUSR1), then stopped; ``activate()`` restarts them.
"""

from __future__ import annotations

import atexit
import copy
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from easycore._core import (
    Queue,
    ReorderBuffer,
    retire_identity,
    shm_space,
    sweep_stale_segments,
)
from easycore.common.parallel import leases, wire
from easycore.common.parallel import worker as _worker
from easycore.common.parallel.devices import (
    choose_start_method,
    parse_devices,
    start_method_reason,
)
from easycore.common.parallel.hooks import RunnerHooks
from easycore.common.parallel.worker import producer_main, safe_str
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    RemoteTraceback,
    RunnerBusyError,
    RunnerClosedError,
    RunnerTimeoutError,
    SerializationError,
    SharedMemoryError,
    StartMethodError,
    WorkerDiedError,
    WorkerError,
    worker_error_as,
)

_TICK = 0.1  # seconds between health checks while blocked
_TARGET_BATCH_S = 0.004  # producer work per message the batching aims at
_MAX_BATCH_BYTES = 1 << 20  # do not grow batches of large items past this
_START_TIMEOUT = 600.0  # a producer_init taking longer than this is reported as stuck
_RING_IN = 4 << 20  # ring bytes of the input queue (larger items use side segments)
_RING_OUT = 8 << 20  # ring bytes of the output queue
_INTERRUPT_GRACE_S = 2.0  # after an interrupt, time left for producer_end before a kill
_UNGUARDED_MAIN_EXIT = 87  # exit code of a spawned child that re-ran an unguarded script
_SEQUENCES = (range, list, tuple)  # inputs sliced in place: reading them never blocks
_NOT_TYPED = (StopIteration, StopAsyncIteration, GeneratorExit)  # never re-raised as such


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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


@dataclass
class RunnerStats:
    """What the last call moved and where the time went (also for a call that stopped
    early: an abandoned ``imap``, an error).

    Attributes:
        items: items delivered.
        batches: messages (batches of items) sent to the producers.
        bytes_in: payload bytes sent to the producers (pickles and buffers).
        bytes_out: payload bytes received from the producers.
        wall_s: duration of the call.
        producer_busy_s: per producer (by position in ``devices``), seconds spent in
            ``producer_work`` during the call.
        producer_wait_s: per producer, seconds blocked on the queues during the call
            (waiting for input or for room for results).
        dispatch_wait_s: seconds the sender waited for room in the input queue.
        consumer_wait_s: seconds the receiving thread waited for results.
        consumer_busy_s: seconds spent in ``consumer_work`` (0 for ``imap``).
        input_wait_s: seconds nothing was in flight while the receiving thread waited for
            the input iterable to yield (the input was the bottleneck then).
    """

    items: int = 0
    batches: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    wall_s: float = 0.0
    producer_busy_s: dict[int, float] = field(default_factory=dict)
    producer_wait_s: dict[int, float] = field(default_factory=dict)
    dispatch_wait_s: float = 0.0
    consumer_wait_s: float = 0.0
    consumer_busy_s: float = 0.0
    input_wait_s: float = 0.0

    def bottleneck(self) -> str:
        """A one-line reading of the figures: who waited on whom."""
        busy = sum(self.producer_busy_s.values())
        n = max(1, len(self.producer_busy_s))
        if self.wall_s <= 0:
            return "nothing ran"
        util = busy / (n * self.wall_s)
        if util > 0.7:
            return f"producers ({util:.0%} busy): add devices or make producer_work cheaper"
        if self.consumer_busy_s > 0.5 * self.wall_s:
            return "the consumer: make consumer_work cheaper"
        if self.input_wait_s > 0.3 * self.wall_s:
            return (
                f"the input: the data iterable yields items slowly (nothing was in flight "
                f"for {self.input_wait_s / self.wall_s:.0%} of the call)"
            )
        if self.items and util < 0.5:
            per_item_us = 1e6 * busy / self.items
            return (
                f"per-item overhead: each item takes {per_item_us:.1f} µs of producer_work, "
                f"so the runner's own cost per item (pickling, queues, the receiving thread) "
                f"sets the pace and the producers are {util:.0%} busy; give each item more "
                "work (e.g. pass batches of items) to use them fully"
            )
        return f"balanced (producers {util:.0%} busy)"


_LIVE_WORKERS: set[WorkerSet] = set()  # not yet shut down; stopped at exit and on SIGTERM


class WorkerSet:
    """What a call needs of an active runner's producers (local processes, or the Ray
    backend's actors), and the shutdown sequence they share. Subclasses set ``closed`` and
    ``owner_pid``, add themselves to ``_LIVE_WORKERS`` and implement ``_stop`` and
    ``kill_now``."""

    closed: bool
    owner_pid: int

    def mine(self) -> bool:
        """Whether this process made the producers (a forked child must not touch them)."""
        return os.getpid() == self.owner_pid

    def kill_now(self) -> None:
        """Kills every producer at once (second Ctrl-C, exit)."""
        raise NotImplementedError

    def _stop(self, timeout: float, interrupt: bool) -> None:
        raise NotImplementedError

    def shutdown(self, timeout: float = 10.0, interrupt: bool = False) -> None:
        """Stops the producers (``producer_end`` runs), then kills what does not stop.

        With ``interrupt``, producers busy in ``producer_work`` drop their work first and
        ``producer_end`` gets at most a short grace. A KeyboardInterrupt while waiting kills
        every producer at once and is re-raised: a second Ctrl-C always ends it.
        """
        if self.closed:
            return
        self.closed = True
        if not self.mine():
            return
        try:
            self._stop(timeout, interrupt)
        except BaseException:
            self.kill_now()
            raise
        _LIVE_WORKERS.discard(self)


class _Workers(WorkerSet):
    """The processes and queues of an active runner; closes them without a runner reference
    (so it can run from a finalizer, at exit or from a signal handler)."""

    def __init__(
        self, procs: list, devices: list[str], in_q: Queue, out_q: Queue, state: Any
    ) -> None:
        self.procs = procs
        self.devices = devices
        self.in_q = in_q
        self.out_q = out_q
        self.state = state
        self.view = memoryview(state).cast("B").cast("q")
        self.closed = False
        self.end_errors: list[dict] = []
        self.owner_pid = os.getpid()
        self.out_budget = out_q.ring_size  # bytes of results the output queue may hold
        _LIVE_WORKERS.add(self)

    def dead(self) -> WorkerDiedError | None:
        """An error describing the first producer that died, if any."""
        for i, p in enumerate(self.procs):
            if p.exitcode is not None or not p.is_alive():
                code = p.exitcode
                how = (
                    f"killed by {_signal_name(-code)}"
                    if code is not None and code < 0
                    else f"exited with code {code}"
                )
                hint = " (out of memory?)" if code == -signal.SIGKILL else ""
                return WorkerDiedError(
                    f"producer {i} (device {self.devices[i]!r}, pid {p.pid}) died: {how}{hint}. "
                    "The runner was closed; call activate() to restart it",
                    pid=p.pid or 0,
                    device=self.devices[i],
                    exitcode=code,
                )
        return None

    def drain_input(self) -> None:
        """Discards work nobody has taken yet."""
        try:
            while True:
                self.in_q.get_many(1024, block=False)
        except (QueueEmpty, QueueClosed):
            pass

    def interrupt(self) -> None:
        """Makes every producer drop the batch it is working on (SIGUSR1; a producer only
        obeys it for calls below the ``abort_below`` word, set here past every call)."""
        self.view[len(self.view) - 1] = 1 << 62
        for p in self.procs:
            if p.pid and p.exitcode is None:
                try:
                    os.kill(p.pid, _worker.INTERRUPT_SIGNAL)
                except OSError:
                    pass

    def kill_now(self) -> None:
        """Kills every producer and releases the queues at once (second Ctrl-C, exit)."""
        if not self.mine():
            return
        self.closed = True
        for p in self.procs:
            if p.exitcode is None:
                try:
                    p.kill()
                except (OSError, AttributeError):
                    pass
        self._release()
        for p in self.procs:
            try:
                p.join(2.0)
            except AssertionError:
                pass
        _LIVE_WORKERS.discard(self)

    def _release(self) -> None:
        self.in_q.close()
        self.out_q.close()
        # Normally already unlinked once the producers attached; not after a failed start.
        self.in_q.unlink()
        self.out_q.unlink()

    def _stop(self, timeout: float, interrupt: bool) -> None:
        codec = wire.Codec()
        self.drain_input()
        alive = [p for p in self.procs if p.is_alive()]
        for _ in alive:
            try:
                self.in_q.put(0, wire.STOP, [b""], timeout=1.0)
            except (QueueFull, QueueClosed):
                break
        if interrupt:
            self.interrupt()
            timeout = min(timeout, _INTERRUPT_GRACE_S)
        deadline = time.monotonic() + timeout
        byes = 0
        while byes < len(alive) and time.monotonic() < deadline:
            try:
                msgs = self.out_q.get_many(256, timeout=_TICK)
            except QueueEmpty:
                if not any(p.is_alive() for p in self.procs):
                    break
                continue
            except QueueClosed:
                break
            for _seq, kind, parts in msgs:
                if wire.unpack_kind(kind)[0] == wire.BYE:
                    byes += 1
                    _, err = codec.loads(parts)
                    if err is not None:
                        self.end_errors.append(err)
        self._release()
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: producers are
    # stopped before multiprocessing joins its children (which would wait forever on one
    # stuck in producer_end after an interrupted close()).
    for r in list(_LIVE):
        try:
            r.close()
        except BaseException:  # noqa: BLE001 - nothing useful to do at exit
            pass
    for w in list(_LIVE_WORKERS):
        w.kill_now()


_SIGTERM_PREVIOUS: Any = None


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM to the caller: stop every runner's producers and release their shared
    memory, then die of SIGTERM as the previous (default) disposition would have."""
    for w in list(_LIVE_WORKERS):
        try:
            w.shutdown(_INTERRUPT_GRACE_S, interrupt=True)
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


def _install_sigterm_handler() -> None:
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


def _random_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _spawned_child_bootstrapping() -> bool:
    """Whether this process is a spawn/forkserver child still importing the main script
    (so the script runs its runner-making code again: no ``__main__`` guard)."""
    proc = multiprocessing.process.current_process()
    return bool(getattr(proc, "_inheriting", False))


def _unpicklable_cfg_key(cfg: Any) -> str:
    """Names the first key of cfg whose value cannot be pickled."""
    for k, v in cfg.items():
        try:
            pickle.dumps(v)
        except Exception as e:  # noqa: BLE001 - describing the failure
            if isinstance(v, dict):
                inner = _unpicklable_cfg_key(v)
                if inner:
                    return f"{k}.{inner}"
            return f"{k} (an object of type {type(v).__qualname__}: {e})"
    return ""


def _remote_plan(backend: Any, devices: Any, start_method: str | None) -> Any:
    """The seam to producers that are not local processes: None for ``backend=None`` or
    ``"local"``, else the backend's plan for ``devices``. A plan has ``devices`` (one device
    string per producer), ``start_method`` (a ``(name, reason)`` pair) and ``start(runner)``,
    which returns an object with the interface of :class:`_Workers` (``in_q.put``,
    ``out_q.get_many``/``put``, ``dead()``, ``shutdown()``…) on which :class:`_Call` runs
    unchanged. Only ``easycore.ray`` makes plans today; it is imported here, on demand."""
    if backend is None or backend == "local":
        return None
    if start_method is not None:
        raise InvalidArgument(f"start_method cannot be given with backend={backend!r}")
    if backend == "ray":
        from easycore.ray import RayBackend

        backend = RayBackend()
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
        window (int, optional): most items in flight at once; default
            ``max(16, int(256 * len(devices) * queue_scale))``.
        close_timeout (float): seconds ``close()`` waits for ``producer_end`` before it
            terminates a producer.
        seed (int, optional): producer ``i`` seeds ``random``, numpy and torch (those it has
            imported) with ``seed + i`` before ``producer_init``; default: a random base, so
            producers always draw different random streams.
        backend (str or object, optional): where the producers run. None (or ``"local"``):
            processes on this machine. ``"ray"``, or an ``easycore.ray.RayBackend(...)``:
            one Ray actor per device, anywhere on a Ray cluster (``pip install
            'easycore[ray]'``; see docs/ray.md); the hooks, calls and errors are the same.
    """

    _ordered = False
    _start_context = staticmethod(multiprocessing.get_context)

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
        backend: Any = None,
    ) -> None:
        self._owner_pid = os.getpid()
        self._remote = _remote_plan(backend, devices, start_method)
        self._devices = parse_devices(devices) if self._remote is None else self._remote.devices
        self._cfg = _to_cfg(cfg)
        if not queue_scale > 0:
            raise InvalidArgument(f"queue_scale must be positive, got {queue_scale!r}")
        self._queue_scale = float(queue_scale)
        if self._remote is None:
            self._start_method = choose_start_method(start_method, self._devices)
            self._start_reason = start_method_reason(
                start_method, self._devices, self._start_method
            )
        else:
            self._start_method, self._start_reason = self._remote.start_method
        n = len(self._devices)
        self._window = int(window) if window else max(16, int(256 * n * self._queue_scale))
        if self._window < 1:
            raise InvalidArgument(f"window must be at least 1, got {window!r}")
        if seed is not None and not isinstance(seed, int):
            raise InvalidArgument(f"seed must be an int or None, got {seed!r}")
        self._seed = _random_seed() if seed is None else int(seed)
        self._close_timeout = close_timeout
        self._workers: _Workers | None = None
        self._finalizer: weakref.finalize | None = None
        self._calls = itertools.count(1)
        self._cost_per_item = 0.0  # producer seconds per item, learned across calls
        self._out_bytes_per_item = 0.0  # pickled result bytes per item, likewise
        self._lock = threading.Lock()
        self._call_cond = threading.Condition()
        self._active_call: _Call | None = None
        self.stats = RunnerStats()
        _install_sigterm_handler()
        self.activate()

    # ----- hooks of the flavours -----

    @classmethod
    def _codec(cls) -> wire.Codec:
        """How items and results are pickled (the torch flavour sends tensors out of band)."""
        return wire.Codec()

    def _drop_unsendable(self, items: list, first: int, error: Exception) -> list:
        """Called when a batch of input items cannot be pickled: returns the items to send
        anyway (the others are dropped), or raises. A runner raises: the call fails with
        :class:`~easycore.errors.SerializationError` naming the culprit."""
        what = wire.describe_unpicklable(items)
        raise SerializationError(
            f"input item {first}..{first + len(items) - 1} cannot be sent to the producers: "
            f"{what} is not picklable"
        ) from error

    @classmethod
    def _producer_setup(cls, n_producers: int) -> Any:
        """A picklable callable ``setup(device)`` run first in each producer, or None."""
        return None

    # ----- life cycle -----

    def _input_queue(self) -> Queue | None:
        """The input queue while active: ``easycore.shm.empty(..., runner=self)`` leases
        input arrays from its pool."""
        w = self._workers
        q = getattr(w, "in_q", None) if w is not None and not w.closed else None
        return q if isinstance(q, Queue) else None  # the Ray backend's input is no Queue

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

    def _queue_sizes(self) -> tuple[int, int]:
        scale = len(self._devices) * self._queue_scale
        want_in = int(min(256 << 20, max(4 << 20, (4 << 20) * scale)))
        want_out = int(min(1 << 30, max(8 << 20, (16 << 20) * scale)))
        space = shm_space()
        if space is not None:
            # Rings and their pools (twice a ring) take at most 3/4 of what is free; the rest
            # is left to one-shot segments and to other programs.
            free = space[0]
            want_in = max(1 << 20, min(want_in, free // 16))
            want_out = max(1 << 20, min(want_out, free // 6))
        return want_in, want_out

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid:
            raise RunnerBusyError(
                f"this {type(self).__name__} belongs to process {self._owner_pid}, which made "
                f"it; process {os.getpid()} (a forked child) cannot use it. Make a new runner "
                "in this process; the parent's runner is unaffected"
            )

    def _spawn_hint(self) -> str:
        return (
            f"The start method is {self._start_method!r} ({self._start_reason}); "
            "start_method='fork' avoids pickling and re-importing, on Linux with CPU devices"
        )

    def _check_spawnable(self) -> None:
        """Under spawn/forkserver, fails early and clearly where starting would fail."""
        if _spawned_child_bootstrapping():
            msg = (
                f"easycore: a {type(self).__name__} was created while a {self._start_method} "
                "child process was importing the main script: the script makes runners at "
                'import time. Put that code under `if __name__ == "__main__":`. '
                f"{self._spawn_hint()}\n"
            )
            sys.stderr.write(msg)
            sys.stderr.flush()
            os._exit(_UNGUARDED_MAIN_EXIT)
        if self._start_method == "fork":
            return
        cls = type(self)
        try:
            pickle.dumps(cls)
        except Exception as e:  # noqa: BLE001 - explained below
            where = (
                "is defined inside a function"
                if "<locals>" in cls.__qualname__
                else "cannot be imported by name"
            )
            raise StartMethodError(
                f"the runner class {cls.__module__}.{cls.__qualname__} {where}, so producer "
                "processes cannot import it: define it at module level (in the main script "
                f"or a module). {self._spawn_hint()}. ({type(e).__name__}: {e})"
            ) from None
        try:
            pickle.dumps(self._cfg)
        except Exception as e:  # noqa: BLE001 - explained below
            key = _unpicklable_cfg_key(self._cfg) or "?"
            raise StartMethodError(
                f"cfg cannot be sent to the producer processes: cfg.{key} cannot be pickled. "
                "Keep only picklable values in cfg (build objects such as models or open "
                f"files in producer_init). {self._spawn_hint()}. ({type(e).__name__}: {e})"
            ) from None

    def activate(self) -> None:
        """Restart all processes if this runner is closed (a no-op while active)."""
        self._check_owner()
        with self._lock:
            if self.is_activate:
                return
            if self._remote is not None:  # producers elsewhere: the same calls on its workers
                workers = self._remote.start(self)
                self._workers = workers
                self._finalizer = weakref.finalize(self, workers.shutdown, self._close_timeout)
                _LIVE.add(self)
                return
            self._check_spawnable()
            sweep_stale_segments()
            in_bytes, out_bytes = self._queue_sizes()
            n = len(self._devices)
            max_msgs = max(64, self._window + 4 * n)
            # Large items and results travel zero-copy in pooled segments (at most twice the
            # ring's bytes by default): /dev/shm use stays within 3 * (in_bytes + out_bytes).
            # The rings only hold small messages (larger ones go to side segments within the
            # side budget), and their space is committed and touched at creation: small
            # rings start in a few ms where rings of the full budget took ~70 ms.
            in_q = Queue(
                capacity_bytes=min(in_bytes, _RING_IN),
                max_messages=max_msgs,
                side_budget=in_bytes,
            )
            out_q = Queue(
                capacity_bytes=min(out_bytes, _RING_OUT),
                max_messages=max_msgs,
                side_budget=out_bytes,
            )
            ctx = self._start_context(self._start_method)
            state = ctx.RawArray("q", _worker.state_size(n))
            for i in range(n):
                state[_worker.STATE_FIELDS * i + _worker.ITEM] = -1
            setup = self._producer_setup(n)
            procs: list = []
            workers = _Workers(procs, self._devices, in_q, out_q, state)
            workers.out_budget = out_bytes
            try:
                for i, dev in enumerate(self._devices):
                    opts = {
                        "n": n,
                        "seed": self._seed,
                        "start_method": self._start_method,
                        "state": state,
                    }
                    p = ctx.Process(
                        target=producer_main,
                        args=(type(self), i, dev, self._cfg, in_q, out_q, os.getpid(), setup, opts),
                        name=f"easycore-producer-{i}-{dev}",
                        daemon=False,
                    )
                    try:
                        p.start()
                    except (pickle.PicklingError, AttributeError, TypeError) as e:
                        raise StartMethodError(
                            f"producer {i} could not be started: its arguments cannot be "
                            f"pickled ({type(e).__name__}: {e}). {self._spawn_hint()}"
                        ) from e
                    procs.append(p)
                self._await_ready(workers)
            except BaseException:
                workers.shutdown(timeout=2.0, interrupt=True)
                raise
            # Every producer has attached: the names can go, so nothing leaks even on SIGKILL.
            in_q.unlink()
            out_q.unlink()
            self._workers = workers
            self._finalizer = weakref.finalize(self, workers.shutdown, self._close_timeout)
            _LIVE.add(self)

    def _await_ready(self, workers: _Workers) -> None:
        codec = self._codec()
        ready = 0
        deadline = time.monotonic() + _START_TIMEOUT
        while ready < len(workers.procs):
            try:
                msgs = workers.out_q.get_many(64, timeout=_TICK)
            except QueueEmpty:
                died = workers.dead()
                if died is not None:
                    raise self._start_death(died) from None
                if time.monotonic() > deadline:
                    raise EasycoreError(
                        f"producers did not finish producer_init within {_START_TIMEOUT:.0f} s"
                    ) from None
                continue
            for _seq, kind, parts in msgs:
                t, _ = wire.unpack_kind(kind)
                if t == wire.READY:
                    ready += 1
                elif t == wire.ERROR:
                    raise _worker_error(codec.loads(parts))

    def _start_death(self, died: WorkerDiedError) -> EasycoreError:
        """The error for a producer that died before it was ready."""
        if self._start_method != "fork" and died.exitcode == _UNGUARDED_MAIN_EXIT:
            return StartMethodError(
                f"producer processes re-ran the main script and it made a runner again: "
                'the script has no `if __name__ == "__main__":` guard. Put the code that '
                f"makes and calls runners under that guard. {self._spawn_hint()}"
            )
        msg = str(died).replace(
            "The runner was closed; call activate() to restart it",
            "It died while starting (in producer_init or before).",
        )
        if self._start_method != "fork" and died.exitcode == 1:
            msg += (
                " Under spawn this is often the main script failing when the producer "
                "re-imports it (see the producer's traceback above): keep work under "
                f'`if __name__ == "__main__":`. {self._spawn_hint()}'
            )
        return WorkerDiedError(msg, pid=died.pid, device=died.device, exitcode=died.exitcode)

    def close(self) -> None:
        """Shutdown all processes if this runner is alive (``producer_end`` runs in each).

        Closing twice is harmless. Errors raised by ``producer_end`` are reported as a
        :class:`~easycore.errors.WorkerError` after every process has stopped. Ctrl-C while
        ``close()`` waits kills the producers at once. In a forked child the parent's runner
        is left alone.
        """
        self._shutdown(interrupt=False)

    def _shutdown(self, interrupt: bool) -> None:
        with self._lock:
            workers, self._workers = self._workers, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            _LIVE.discard(self)
        if workers is None or workers.closed:
            return
        workers.shutdown(self._close_timeout, interrupt=interrupt)
        if workers.end_errors:
            raise _worker_error(workers.end_errors[0])

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

    def _active_workers(self) -> _Workers:
        self._check_owner()
        w = self._workers
        if w is None or w.closed:
            raise RunnerClosedError(
                f"this {type(self).__name__} is closed; call activate() to restart it"
            )
        return w

    # ----- one call at a time -----

    def _begin(self, call: _Call, timeout: float | None) -> None:
        """Makes ``call`` the running call. Waits for a call of another thread to end;
        raises :class:`RunnerBusyError` at once where waiting could never end."""
        me = threading.current_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._call_cond:
            while self._active_call is not None:
                active = self._active_call
                if any(t is me for t in active.threads):
                    where = (
                        "from inside the running call (a consumer hook, or its input iterable)"
                        if me is not active.threads[0]
                        else "while an imap of it is still open in this thread"
                    )
                    raise RunnerBusyError(
                        f"this {type(self).__name__} runs one call at a time and a call was "
                        f"made {where}: it would wait on itself. Finish or close() the open "
                        "imap first, or use a second runner"
                    )
                if active.is_imap:
                    raise RunnerBusyError(
                        f"an imap of this {type(self).__name__} is open in another thread; "
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
                self._call_cond.wait(left)
            self._active_call = call

    def _end(self, call: _Call) -> None:
        with self._call_cond:
            if self._active_call is call:
                self._active_call = None
                self._call_cond.notify_all()

    # ----- calls -----

    def __call__(
        self,
        data_iter: Iterable[Any],
        progress: bool = False,
        timeout: float | None = None,
        *,
        read_ahead: bool = True,
    ) -> Any:
        """Runs every item of ``data_iter`` through the producers and the consumer.

        A runner runs one call at a time: a call from another thread waits for the running
        one; a call that would wait on itself (from inside ``consumer_work``, or while an
        ``imap`` of the runner is open) raises :class:`~easycore.errors.RunnerBusyError`.

        Args:
            data_iter (Iterable): iterator of data; read lazily (a ``range``, list or tuple
                in place, any other iterable by a helper thread that keeps at most
                ``window`` items ahead).
            progress (bool): show a tqdm progress bar (with a total when ``data_iter`` has a
                length).
            timeout (float, optional): seconds to wait for the next result while items are
                in flight; when it runs out, :class:`~easycore.errors.RunnerTimeoutError`
                (a ``TimeoutError``) names the stuck item and producer, and the runner is
                closed (``activate()`` restarts it).
            read_ahead (bool): False reads an iterator input in the receiving thread, one
                item at a time and only when no item is in flight: for request/response
                loops (each input waits for the previous result), it saves the hand-off
                through the input thread (about 10 µs a round trip); fast inputs lose
                their batching. A range, list or tuple is sliced in place either way.

        Returns:
            Any: result (the value ``consumer_end`` returns)
        """
        call = _Call(self, data_iter, progress, timeout, is_imap=False, read_ahead=read_ahead)
        return call.run_with_consumer()

    def imap(
        self,
        data_iter: Iterable[Any],
        progress: bool = False,
        timeout: float | None = None,
        *,
        read_ahead: bool = True,
    ) -> Iterator[Any]:
        """Yields the producers' results in the caller's thread, without the consumer hooks.

        ``OrderedRunner`` yields in input order, ``UnorderedRunner`` as results arrive. The
        input is read lazily and at most ``window`` items are in flight. The call starts at
        the first ``next()`` and holds the runner until the iterator is exhausted or closed;
        stopping early (``break``, or closing the generator) leaves the runner usable.

        Args:
            data_iter (Iterable): iterator of data.
            progress (bool): show a tqdm progress bar.
            timeout (float, optional): as for :meth:`__call__`.
            read_ahead (bool): as for :meth:`__call__`.

        Yields:
            Any: what ``producer_work`` returned for each item.
        """
        call = _Call(self, data_iter, progress, timeout, is_imap=True, read_ahead=read_ahead)
        return call.iterate()


class RunSource(Protocol):
    """An input read run by run (the pool's feed: ``easycore.parallel.feed.Feed``)."""

    def next_run(self, limit: int, got: int | None) -> Iterable[Any] | None:
        """The next run (at most ``limit`` items), waiting for one; None at the end.
        ``got``: how many items the previous run gave (None: there was none, or it raised
        and was given to :meth:`recover`). The run is the one :meth:`cut` cuts from before
        it is returned."""

    def cut(self) -> None:
        """Ends the run being read after the item being read (any thread)."""

    def recover(self, error: BaseException, got: int) -> Any:
        """The run raised ``error`` after giving ``got`` items: None if the whole input
        fails, else anything (reading goes on with the next run)."""


class _Flag(list):
    """A flag tested with ``if flag:`` at C speed (a list's length: no attribute lookup, no
    method call); set from any thread with :meth:`set` (one slice assignment, atomic)."""

    __slots__ = ()

    def set(self, value: bool = True) -> None:
        """Sets (or, with False, clears) the flag."""
        self[:] = _SET if value else ()


_SET = (True,)


def _ema(prev: float, x: float, weight: float = 0.3) -> float:
    """Running average of a figure the runner learns across calls (0: none learned yet)."""
    return x if prev <= 0 else (1.0 - weight) * prev + weight * x


def _loads_or_none(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - the type or state is not importable here
        return None


def _worker_error(err: dict) -> EasycoreError:
    """The exception for an error report sent by a producer: a WorkerError that is also an
    instance of the original exception's type where that type can be rebuilt here."""
    where = f"in {err['hook']} on device {err['device']!r}"
    if err.get("item") is not None:
        where += f" (item {err['item']})"
    kind = err.get("kind")
    if kind == "pickle_result":
        exc: EasycoreError = SerializationError(f"{err['message']} ({where})")
    elif kind == "unpickle_item":
        exc = SerializationError(f"an item could not be unpickled {where}: {err['message']}")
    elif kind == "shared_memory":
        exc = SharedMemoryError(
            f"a result could not be put in shared memory {where}: {err['message']}. "
            "The runner stays usable; make results smaller, lower queue_scale, or free "
            "/dev/shm"
        )
    else:
        original = _loads_or_none(err.get("type"))
        if not isinstance(original, type) or issubclass(original, _NOT_TYPED):
            original = None
        exc = worker_error_as(
            original,
            f"{err['message']} — raised {where}",
            hook=err["hook"],
            device=err["device"],
            item=err.get("item"),
            remote_traceback=err.get("traceback", ""),
            state=_loads_or_none(err.get("state")),
        )
    exc.__cause__ = RemoteTraceback(err.get("traceback", ""))
    return exc


class _Call:
    """The state of one call: reading, sending, receiving, ordering, accounting, clean-up."""

    def __init__(
        self,
        runner: BaseRunner,
        data_iter: Iterable[Any],
        progress: bool,
        timeout: float | None,
        is_imap: bool,
        read_ahead: bool = True,
        pack: Callable[[list], list] | None = None,
        cost: Callable[[], float] | None = None,
        runs: RunSource | None = None,
    ) -> None:
        """``pack`` (optional) turns each batch's items into what is sent: fewer work items,
        each standing for a run of input items (one result each; the call counts input
        items, so it keeps each such batch's count in ``packed_counts``);
        ``cost`` (optional) gives the producers' seconds per item that batches are sized by,
        instead of the runner's figure learned per item sent (the pool sends single items
        and whole chunks in one stream: a chunk's cost would shrink the batches of single
        items a thousandfold); ``runs`` (optional) is the input read run by run (the pool's
        feed, see :class:`RunSource`): each run is pulled in with one ``list.extend``, not a
        Python loop per item, unless the receiving thread waits on each item, and survives
        an error of one run if the source recovers from it."""
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"timeout must be positive or None, got {timeout!r}")
        self.runner = runner
        self.workers = runner._active_workers()
        self.codec = runner._codec()
        self.call = next(runner._calls)
        self.kind_work = wire.pack_kind(wire.WORK, self.call)
        self.is_imap = is_imap
        self.timeout = timeout
        # Threads taking part (the first one made the call). Thread objects, not idents: an
        # ident is reused as soon as its thread ends.
        self.threads: list[threading.Thread] = []
        try:
            self.total = len(data_iter)  # type: ignore[arg-type]
        except TypeError:
            self.total = None
        self.seq_data = data_iter if type(data_iter) in _SEQUENCES else None
        self.it = None if self.seq_data is not None else iter(data_iter)
        self.pos = 0  # next index of seq_data to send
        # Items read from self.it; those before buf_off are sent. The reader only appends;
        # the sender (under send_lock) advances buf_off. The sent prefix is removed now and
        # then, under send_lock (each step atomic under the GIL), by the sender, or by a run
        # reader between two runs (runs_compact): it counts a run's items by how much
        # len(buf) grew. Removing the prefix at each batch would move every item behind it:
        # with tens of thousands read ahead, that memmove was an eighth of the sender's time
        # on tiny items.
        self.buf: list = []
        self.buf_off = 0
        self.runs_compact = runs is not None and self.it is not None and read_ahead
        self.reader: threading.Thread | None = None
        self.read_ahead = read_ahead  # False: the receiving thread reads, one item at a time
        self.reader_done = self.seq_data is not None
        self.pack = pack
        self.cost = cost
        self.runs = runs
        # The reader is inside a list.extend of a run: the receiving thread, wanting each
        # item as it comes, must cut the run (set before the reader looks at attention).
        self.bulk = False
        self.reader_waiting = False
        self.receiver_waiting = False
        # receiver_waiting or abort: the reader's one check per item
        self.attention = _Flag()
        self.input_error: BaseException | None = None
        self.send_error: BaseException | None = None
        self.send_lock = threading.Lock()
        self.in_full = False
        self.window = runner._window
        self.n = len(runner._devices)
        self.max_batch = max(1, self.window // (4 * self.n))
        self.reorder = ReorderBuffer(self.window) if runner._ordered else None
        self.next_item = 0  # index of the next item to send
        self.next_batch = 0
        self.pending: tuple[int, int, Any] | None = None  # (seq, n_items, parts) unsent
        # seq -> input items of a sent batch that ``pack`` made into fewer work items (its
        # results, one per work item, stand for that many items); written under send_lock
        # before the batch is sent, removed by the receiving thread when its results come.
        self.packed_counts: dict[int, int] = {}
        self.dispatched = 0  # items sent (under send_lock)
        self.dropped = 0  # items read but never sent (unpicklable, dropped by the runner)
        self.delivered = 0  # items handed out (written by the receiving thread only)
        self.results_in = 0  # result messages of this call received (one per batch sent)
        self.bytes_per_item = 0.0  # pickled input per item (last batch)
        # Results in flight (queued, being consumed, or waiting in the reorder buffer) stay
        # within about twice the output queue's side budget, however large each result is.
        self.max_inflight_bytes = 2 * self.workers.out_budget
        self.busy_seen: dict[int, float] = {}
        self.wait_seen: dict[int, float] = {}
        self.error: BaseException | None = None
        self.abort = False
        self.cond = threading.Condition()
        self.last_progress = time.monotonic()
        self.stats = RunnerStats(
            producer_busy_s={i: 0.0 for i in range(self.n)},
            producer_wait_s={i: 0.0 for i in range(self.n)},
        )
        self.progress = progress
        self.bar = None
        self.t0 = 0.0
        self.in_wait0 = 0.0
        self.out_wait0 = 0.0
        self.ended = False
        self.consumer: threading.Thread | None = None

    def _start(self) -> None:
        """Takes the runner (one call at a time) and starts the clocks and the reader."""
        self.runner._begin(self, self.timeout)
        self.threads.append(threading.current_thread())
        self.t0 = time.perf_counter()
        self.last_progress = time.monotonic()
        self.in_wait0 = self.workers.in_q.wait_seconds
        self.out_wait0 = self.workers.out_q.wait_seconds
        if self.progress:
            import tqdm

            tqdm.tqdm.monitor_interval = 0  # no monitor thread (it would make fork unsafe)
            self.bar = tqdm.tqdm(total=self.total, unit="item", desc=type(self.runner).__name__)
        if self.it is not None and self.read_ahead:
            target = self._read if self.runs is None else self._read_runs
            self.reader = threading.Thread(target=target, name="easycore-input", daemon=True)
            self.threads.append(self.reader)
            self.reader.start()

    # ----- reading (a helper thread, for inputs other than range/list/tuple) -----

    def _read(self) -> None:
        it = self.it
        append = self.buf.append
        attention = self.attention  # tested once per item: a list's length, no attribute
        read = 0
        try:
            while not self.abort:
                step = self._wait_for_room(read)  # a few batches at most
                if step <= 0:
                    continue  # aborted
                got = 0
                # islice pulls one item at a time: nothing is held back while next() blocks.
                # (This loop in Rust would be 60 ns an item faster, but a Rust frame under a
                # daemon thread blocked in the user's iterator makes the interpreter abort at
                # exit: see src/python/detach.rs.)
                for got, x in enumerate(itertools.islice(it, step), 1):  # noqa: B007
                    append(x)
                    if attention:
                        if self.abort:
                            return
                        self._input_arrived()
                read += got
                if got < step:
                    break  # the input is over
        except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
            self.input_error = e
        finally:
            self.reader_done = True
            self._input_arrived()

    def _room(self, read: int) -> int:
        """Items the reader may read now (``read``: read so far): within the window (items
        read but not delivered), a few batches at a time, so that the room is weighed again
        as the sizes of items and results become known (large items are held to a few).
        (Holding the reader to two batches beyond what the sender took was tried: under the
        GIL it then waits for the GIL to refill, and the runners lost a third of their speed
        on tiny items.)"""
        room = self._window_now() - (read - self.delivered - self.dropped)
        return min(room, 2 * self._batch_size())

    def _wait_for_room(self, read: int) -> int:
        """:meth:`_room`, waiting until there is some (the receiving thread wakes the reader
        as results are delivered); 0 once the call is aborted."""
        room = self._room(read)
        if room > 0:
            return room
        with self.cond:
            self.reader_waiting = True
            while not self.abort and (room := self._room(read)) <= 0:
                self.cond.wait(_TICK)
            self.reader_waiting = False
        return 0 if self.abort else room

    def _wake_reader(self) -> None:
        """The reader may wait for room: wake it (room was made)."""
        if self.reader_waiting:
            with self.cond:
                self.cond.notify_all()

    def _read_one(self) -> None:
        """``read_ahead=False``: the next input item, read in the receiving thread. Nothing
        is in flight, so waiting for it here holds no result back."""
        try:
            self.buf.append(next(self.it))  # type: ignore[arg-type]
        except StopIteration:
            self.reader_done = True
        except BaseException as e:  # noqa: BLE001 - raised by the loop, as the reader's are
            self.input_error = e
            self.reader_done = True

    def _read_runs(self) -> None:
        """``_read`` for a :class:`RunSource`: a run at a time, each pulled in by one
        ``list.extend`` (no Python frame per item) while the receiving thread does not wait
        on each item; while it does, item by item as ``_read`` does. If it starts to wait
        during an extend, it cuts the run (:meth:`RunSource.cut`): the extend ends after
        the item being read, and the receiver is woken. Race-free: the reader announces
        ``bulk`` before it looks at ``attention``; the receiver sets ``attention`` before
        it looks at ``bulk``. A run's items are counted by how much ``len(buf)`` grew: only
        this thread removes the sent prefix of ``buf`` (:meth:`_compact`), between runs."""
        src = self.runs
        assert src is not None
        buf = self.buf
        append, extend = buf.append, buf.extend
        attention = self.attention
        read = 0
        got: int | None = None  # items the last run gave (None: no run to report)
        try:
            while not self.abort:
                room = self._wait_for_room(read)
                if room <= 0:
                    continue  # aborted
                self._compact()
                run = src.next_run(room, got)
                got = None
                if run is None:
                    break  # the input is over
                items = iter(run)
                start = len(buf)
                try:
                    while True:
                        self.bulk = True
                        if not attention:
                            extend(items)  # to the run's end, or until the receiver cuts it
                            self.bulk = False
                            if attention:
                                self._input_arrived()  # the run was cut for it (or ended)
                            break
                        self.bulk = False
                        # The receiver waits on each item (a producer may be idle): each one
                        # goes to it as it comes, until it no longer waits (every producer
                        # has a batch); then the rest of the run in bulk.
                        for x in items:
                            append(x)
                            if not attention:
                                break
                            if self.abort:
                                return
                            self._input_arrived()
                        else:
                            break  # the run is over
                except BaseException as e:
                    self.bulk = False
                    n = len(buf) - start
                    read += n
                    if src.recover(e, n) is None:
                        raise
                    continue
                got = len(buf) - start
                read += got
        except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
            self.input_error = e
        finally:
            self.reader_done = True
            self._input_arrived()

    def _cut_bulk(self) -> None:
        """A run being pulled in by ``list.extend`` ends after its item (the call stops, or
        the receiver waits on each item)."""
        if self.bulk and self.runs is not None:
            self.runs.cut()

    def _input_arrived(self) -> None:
        """New input (or its end) while the receiver may sleep on the output queue. While a
        producer may be idle (fewer batches on their way than producers), it is sent from
        here at once, and the receiver sleeps on, still hearing of each new item: so the next
        item too goes out as it comes, not when a result or the receiver's tick wakes it.
        Otherwise (or if the sender is busy) the receiver is woken to send it."""
        if not self.receiver_waiting or self.abort:
            return
        if (
            self.input_error is None
            and self._producer_idle()
            and self.send_lock.acquire(blocking=False)
        ):
            try:
                sent = self._send_available()
            except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
                self.send_error = e
                sent = False
            finally:
                self.send_lock.release()
            if sent:
                # Its results will wake the receiver. Until then, the next item is ours to
                # send while a producer may still be idle. (A receiver that woke meanwhile
                # finds this flag set: harmless, it sets it afresh before it sleeps again.)
                if self.receiver_waiting:
                    self.attention.set(self._producer_idle() or self.abort)
                return
        self.receiver_waiting = False
        self.attention.set(self.abort)
        try:
            self.workers.out_q.put(0, wire.pack_kind(wire.WAKE, self.call), [b""], timeout=1.0)
        except (QueueFull, QueueClosed):
            pass  # the receiver wakes on its tick anyway

    def _producer_idle(self) -> bool:
        """Whether a producer may be without work: fewer batches on their way (sent, their
        results not received yet) than producers."""
        return self.stats.batches - self.results_in < self.n

    # ----- sending -----

    def _cost(self) -> float:
        """Producer seconds per item that batches are sized by (0: not known yet)."""
        return self.runner._cost_per_item if self.cost is None else self.cost()

    def _blind(self) -> bool:
        """Whether the cost per item is not known yet and every producer has a batch: then
        nothing more is sent until results teach it. (Sent blind, every buffered item went
        as a batch of its own: a fresh pool's first imap over a generator of 300k tiny items
        sent 49k batches, its sender looping on them and never back to its results.)"""
        return self._cost() <= 0 and not self._producer_idle()

    def _batch_size(self) -> int:
        cost = self._cost()
        if cost <= 0:
            return 1
        bs = int(_TARGET_BATCH_S / cost)
        largest = max(self.bytes_per_item, self.runner._out_bytes_per_item)
        if largest > 0:
            bs = min(bs, int(_MAX_BATCH_BYTES / largest))
        return max(1, min(bs, self.max_batch))

    def _window_now(self) -> int:
        """Items allowed in flight: ``window``, fewer when items or results are large (the
        items read ahead wait in this process's memory)."""
        largest = max(self.bytes_per_item, self.runner._out_bytes_per_item)
        if largest <= 0:
            return self.window
        by_bytes = int(self.max_inflight_bytes / largest)
        return max(1, min(self.window, by_bytes))

    def _next_items(self) -> Any:
        """The next batch's items (what the window and the buffer allow), or None."""
        if self.seq_data is not None:
            room = self._window_now() - (self.dispatched - self.delivered)
            if room <= 0 and self.dispatched > self.delivered:
                return None
            size = max(1, min(self._batch_size(), room))
            items = self.seq_data[self.pos : self.pos + size]
            if not items:
                self.pos = len(self.seq_data)
                return None
            self.pos += len(items)
            return items
        buf = self.buf
        off = self.buf_off
        n = len(buf) - off
        if n <= 0:
            return None
        end = off + min(n, self._batch_size())
        items = buf[off:end]
        self.buf_off = end
        if not self.runs_compact:
            self._compact_sent()
        return items

    def _compact_sent(self) -> None:
        """Under send_lock: removes the sent prefix of ``buf`` once it is at least half the
        list (moving no more items than were sent since the last removal). buf_off is reset
        first: a thread that reads len(buf) and then buf_off (see _unsent) may overcount,
        never undercount."""
        off = self.buf_off
        if off and 2 * off >= len(self.buf):
            self.buf_off = 0
            del self.buf[:off]

    def _compact(self) -> None:
        """The run reader, between two runs: :meth:`_compact_sent` if the sender is not busy
        (it waits for it only when more than a window of sent items piled up)."""
        if not self.buf_off:
            return
        lock = self.send_lock
        if lock.acquire(timeout=_TICK) if self.buf_off > self.window else lock.acquire(False):
            try:
                self._compact_sent()
            finally:
                lock.release()

    def _unsent(self) -> int:
        """Items read but not taken by the sender (a racing sender makes it an overcount,
        never an undercount: len(buf) is read before buf_off)."""
        n = len(self.buf)
        return n - self.buf_off

    def _make_batch(self) -> tuple[int, int, Any] | None:
        """The next batch: ``(seq, count, parts)``, ``count`` the input items it carries."""
        items = self._next_items()
        if items is None:
            return None
        count = len(items)
        pack = self.pack
        if pack is not None:
            items = pack(items)
        first = self.next_item
        try:
            parts = self.codec.dumps((first, items))
        except Exception as e:
            kept = self.runner._drop_unsendable(list(items), first, e)
            if len(kept) != len(items):
                if pack is not None:  # which input items a dropped one stood for is unknown
                    raise EasycoreError("_drop_unsendable must keep a packed batch's length") from e
                self.dropped += count - len(kept)  # under send_lock
                count = len(kept)
            if not kept:
                return None
            items = kept
            parts = self.codec.dumps((first, items))
        nb = wire.nbytes(parts)
        self.bytes_per_item = nb / count
        self.stats.bytes_in += nb
        seq = self.next_batch
        self.next_batch += 1
        self.next_item += count
        if count != len(items):
            self.packed_counts[seq] = count  # its results are fewer than its input items
        return seq, count, parts

    def _send_available(self) -> bool:
        """Sends what is ready, never blocking (call under ``send_lock``); whether it sent."""
        in_q = self.workers.in_q
        sent = False
        while not self.abort:
            if self.pending is None:
                if self._blind():
                    return sent
                self.pending = self._make_batch()
                if self.pending is None:
                    return sent
            seq, count, parts = self.pending
            try:
                in_q.put(seq, self.kind_work, parts, block=False)
            except QueueFull:
                self.in_full = True
                return sent
            self.in_full = False
            leases.after_send()  # input arrays sent by reference become read-only
            if self.dispatched == self.delivered:
                self.last_progress = time.monotonic()
            self.pending = None
            self.dispatched += count
            self.stats.batches += 1
            sent = True
        return sent

    def _input_over(self) -> bool:
        if self.seq_data is not None:
            return self.pos >= len(self.seq_data) and self.pending is None
        return self.reader_done and self._unsent() <= 0 and self.pending is None

    def _ready_to_send(self) -> bool:
        if self.pending is not None or self.in_full or self._blind():
            return False
        if self.seq_data is not None:
            return False  # sliced by the receiver itself: nothing arrives behind its back
        return self._unsent() > 0

    # ----- receiving -----

    def _check_health(self) -> None:
        if self.error is not None:
            raise self.error
        died = self.workers.dead()
        if died is not None:
            raise died

    def _chunks(self) -> Iterator[tuple[int, list, int]]:
        """Sends and receives until every item is delivered; yields ``(first, results,
        count)`` in delivery order, ``count`` the input items the results stand for
        (``len(results)`` unless batches were packed). The caller counts each chunk with
        :meth:`delivered_chunk`."""
        get_many = self.workers.out_q.get_many
        next_health = time.monotonic() + _TICK
        while True:
            with self.send_lock:
                self._send_available()
            if self.send_error is not None:
                raise self.send_error
            if self.input_error is not None:
                raise self.input_error
            if self.delivered >= self.dispatched and self._input_over():
                # A producer that died during the call is reported, even if the others
                # delivered everything: the runner is not what the user made any more.
                self._check_health()
                return
            if time.monotonic() >= next_health:
                # Results may flow without a pause while a producer is dead: look anyway.
                self._check_health()
                next_health = time.monotonic() + _TICK
            if self.abort:
                self._check_health()
                raise RunnerClosedError("the call was aborted")
            if (
                self.reader is None
                and self.it is not None
                and not self.reader_done
                and self._unsent() <= 0
                and self.pending is None
                and self.delivered >= self.dispatched
            ):
                self._read_one()
                continue
            # Sleep on the output queue. While fewer batches are on their way than there are
            # producers, one may run dry: the reader wakes us (or sends) as each item comes.
            # Otherwise the next result wakes us soon, and new input waits for it (every
            # producer has a batch meanwhile), without a check per item read.
            self.receiver_waiting = True
            need = self._producer_idle()
            self.attention.set(need)
            if need:
                self._cut_bulk()  # a run being extended ends after its item
            if (
                self._ready_to_send()
                or self.input_error is not None
                or self.send_error is not None
                or (self.reader_done and self.delivered >= self.dispatched and self._input_over())
            ):
                self.receiver_waiting = False
                self.attention.set(self.abort)
                continue
            idle = self.delivered >= self.dispatched
            wait = _TICK
            if self.timeout is not None and not idle:
                wait = max(0.0, min(wait, self.last_progress + self.timeout - time.monotonic()))
            t = time.perf_counter()
            try:
                msgs = get_many(64, timeout=wait)
            except QueueEmpty:
                msgs = None
            except QueueClosed:
                raise RunnerClosedError("the runner was closed during the call") from None
            finally:
                self.receiver_waiting = False
                self.attention.set(self.abort)
            if idle:
                self.stats.input_wait_s += time.perf_counter() - t
            if msgs is None:
                self._check_health()
                if (
                    self.timeout is not None
                    and self.delivered < self.dispatched
                    and time.monotonic() - self.last_progress >= self.timeout
                ):
                    raise self._timeout_error()
                continue
            yield from self._take(msgs)

    def _take(self, msgs: list) -> list[tuple[int, list, int]]:
        out: list[tuple[int, list, int]] = []
        for seq, kind, parts in msgs:
            t, call = wire.unpack_kind(kind)
            if call != self.call:
                continue  # a result, error or wake-up of an aborted earlier call
            if t == wire.ERROR:
                raise _worker_error(self.codec.loads(parts))
            if t != wire.RESULT:
                continue
            self.last_progress = time.monotonic()
            nb = wire.nbytes(parts)
            self.stats.bytes_out += nb
            first, results, wi, busy, wait = self.codec.loads(parts)
            self.results_in += 1
            del parts
            count = self.packed_counts.pop(seq, None) or len(results)
            r = self.runner
            r._out_bytes_per_item = _ema(r._out_bytes_per_item, nb / max(1, count))
            self._learn(wi, busy, wait, count)
            if self.reorder is None:
                out.append((first, results, count))
            else:
                self.reorder.push(seq, (first, results, count))
                out.extend(self.reorder.pop_ready())
        return out

    def _timeout_error(self) -> RunnerTimeoutError:
        view = self.workers.view
        now = time.monotonic_ns()
        stuck = []
        for i in range(self.n):
            base = _worker.STATE_FIELDS * i
            item = view[base + _worker.ITEM]
            if item >= 0 and view[base + _worker.CALL] == self.call:
                stuck.append((view[base + _worker.SINCE_NS], i, item, view[base + _worker.COUNT]))
        in_flight = self.dispatched - self.delivered
        if stuck:
            since, i, item, count = min(stuck)
            proc = self.workers.procs[i]
            dev = self.runner._devices[i]
            which = f"item {item}" if count <= 1 else f"one of items {item}..{item + count - 1}"
            return RunnerTimeoutError(
                f"no result within timeout={self.timeout} s: producer {i} (device {dev!r}, "
                f"pid {proc.pid}) is stuck in producer_work on {which} (its batch started "
                f"{(now - since) / 1e9:.1f} s ago). The runner was closed (its producers were "
                "stopped); call activate() to restart it",
                timeout=self.timeout or 0.0,
                item=item,
                producer=i,
                device=dev,
                pid=proc.pid,
            )
        return RunnerTimeoutError(
            f"no result within timeout={self.timeout} s ({in_flight} items in flight, none "
            "in producer_work: the producers are slow to take or return work). The runner "
            "was closed; call activate() to restart it",
            timeout=self.timeout or 0.0,
        )

    def _learn(self, wi: int, busy: float, wait: float, count: int) -> None:
        prev = self.busy_seen.get(wi)
        self.busy_seen[wi] = busy
        prev_wait = self.wait_seen.get(wi, wait)
        self.wait_seen[wi] = wait
        if prev is None:
            return  # the first report of a producer only sets its baseline
        delta = busy - prev
        self.stats.producer_busy_s[wi] += delta
        self.stats.producer_wait_s[wi] += wait - prev_wait
        r = self.runner
        # A batch's cost includes a fixed part (unpickling, bookkeeping: microseconds) that a
        # batch of few items charges to each item. Weighted by its share of a full batch, the
        # lone item each call starts with no longer shrinks the next batches tenfold.
        share = min(1.0, count / self._batch_size())
        per = max(delta / max(1, count), 1e-9)  # never 0, which means "not known"
        r._cost_per_item = _ema(r._cost_per_item, per, 0.3 * share)

    def delivered_chunk(self, count: int) -> None:
        self.delivered += count
        if self.bar is not None:
            self.bar.update(count)
        self._wake_reader()

    # ----- the two ways to run a call -----

    def run_with_consumer(self) -> Any:
        runner = self.runner
        self._start()
        cfg = copy.deepcopy(runner._cfg)
        result: list[Any] = []
        try:
            consumer = threading.Thread(
                target=self._consume, args=(cfg, result), name="easycore-consumer", daemon=True
            )
            self.consumer = consumer
            consumer.start()
            while consumer.is_alive():
                consumer.join(_TICK)
        except BaseException as e:
            self._fail(e)
            raise
        if self.error is not None:
            self._fail(self.error)
            raise self.error
        self._finish()
        return result[0]

    def _consume(self, cfg: Any, result: list) -> None:
        # Hooks are looked up on the class, as the producers do: a plain function assigned
        # as a hook then works like a staticmethod.
        self.threads.append(threading.current_thread())
        runner = type(self.runner)
        try:
            _call_hook("consumer_init", runner.consumer_init, cfg)
            work = runner.consumer_work
            busy = 0.0
            for first, results, _count in self._chunks():  # no pack: count == len(results)
                t = time.perf_counter()
                for i, r in enumerate(results):
                    try:
                        work(cfg, r)
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except BaseException as e:
                        raise _hook_error("consumer_work", e, first + i) from e
                busy += time.perf_counter() - t
                self.delivered_chunk(len(results))
            self.stats.consumer_busy_s = busy
            result.append(_call_hook("consumer_end", runner.consumer_end, cfg))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            if self.error is None:
                self.error = e
            self.abort = True
            self.attention.set()
            self._cut_bulk()
            with self.cond:
                self.cond.notify_all()

    def iterate(self) -> Iterator[Any]:
        chunks = self.iterate_chunks()
        try:
            for results in chunks:
                yield from results
        finally:
            chunks.close()

    def iterate_chunks(self) -> Iterator[list]:
        """As :meth:`iterate`, one message's results (a list) at a time: for callers that
        handle results in bulk (the pool routes whole lists to their jobs)."""
        self._start()
        finished = False
        try:
            for _first, results, count in self._chunks():
                self.delivered_chunk(count)
                yield results
            finished = True
        except BaseException as e:
            self._fail(e)
            raise
        finally:
            if finished:
                self._finish()
            elif not self.ended:
                self._fail(None)  # closed early (break, close(), garbage collection)

    def _fail(self, exc: BaseException | None) -> None:
        """Stops the call; closes the runner if a producer died, on Ctrl-C and on timeout."""
        if self.ended:
            return
        self.ended = True
        self.abort = True
        self.attention.set()
        self._cut_bulk()
        with self.cond:
            self.cond.notify_all()
        if self.consumer is not None and self.consumer is not threading.current_thread():
            # It stops within a tick (unless busy in consumer_work); it must not read the
            # output queue while a shutdown collects the producers' goodbyes.
            self.consumer.join(2.0)
        self._record_stats()
        fatal = isinstance(
            exc, WorkerDiedError | KeyboardInterrupt | SystemExit | RunnerTimeoutError
        )
        try:
            if fatal or self.workers.dead():
                try:
                    self.runner._shutdown(interrupt=True)
                except EasycoreError:
                    pass
            elif not self.workers.closed:
                self.workers.drain_input()
        finally:
            self.runner._end(self)

    def _record_stats(self) -> None:
        if self.bar is not None:
            self.bar.close()
        s = self.stats
        s.items = self.delivered
        s.wall_s = time.perf_counter() - self.t0
        if not self.workers.closed:
            s.dispatch_wait_s += self.workers.in_q.wait_seconds - self.in_wait0
            s.consumer_wait_s = self.workers.out_q.wait_seconds - self.out_wait0
        self.runner.stats = s

    def _finish(self) -> None:
        self.ended = True
        self._record_stats()
        self.runner._end(self)


def _hook_error(hook: str, e: BaseException, item: int | None) -> WorkerError:
    """The error for a consumer hook that raised: a WorkerError that is also an instance of
    the original type (the original is chained as ``__cause__``)."""
    import traceback

    try:
        tb = "".join(traceback.format_exception(e))
    except BaseException:  # noqa: BLE001 - a broken exception must not hide the error
        tb = safe_str(e)
    original = type(e) if isinstance(e, Exception) and not isinstance(e, _NOT_TYPED) else None
    try:
        state = dict(vars(e))
    except TypeError:
        state = {}
    return worker_error_as(
        original,
        f"{safe_str(e)} — raised in {hook}" + (f" (item {item})" if item is not None else ""),
        hook=hook,
        device=None,
        item=item,
        remote_traceback=tb,
        state=state,
    )


def _call_hook(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        raise _hook_error(name, e, None) from e


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
