"""The runners: producer processes fed through the Rust shared-memory queues, a consumer
thread, and the dispatcher in the caller's thread.

Data path of one call (``runner(data)``)::

    caller thread: data ─▶ batches ─▶ pickle ─▶ [input Queue] ─▶ producers: producer_work
    consumer thread: consumer_work ◀─ [ReorderBuffer] ◀─ unpickle ◀─ [output Queue] ◀─┘

* The dispatcher reads the input lazily and never has more than ``window`` items in flight
  (dispatched and not yet handed to ``consumer_work``), so memory stays bounded whatever the
  input's length and however slow one producer is.
* Items travel in batches whose size adapts to the producers' measured time per item (about
  4 ms of work per batch), so tiny items cost little per item and slow items still spread
  evenly over the producers.
* Every message carries the call number: results of an aborted call are dropped by later
  ones, so a runner stays usable after an error in a hook, an interrupted call, or an
  abandoned ``imap``. A dead producer closes the runner (``activate()`` restarts it).
"""

from __future__ import annotations

import atexit
import copy
import itertools
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from easycore._core import Queue, ReorderBuffer, shm_space, sweep_stale_segments
from easycore.common.parallel import wire
from easycore.common.parallel.devices import choose_start_method, parse_devices
from easycore.common.parallel.hooks import RunnerHooks
from easycore.common.parallel.worker import producer_main
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    RemoteTraceback,
    RunnerClosedError,
    SerializationError,
    WorkerDiedError,
    WorkerError,
)

_TICK = 0.1  # seconds between health checks while blocked
_TARGET_BATCH_S = 0.004  # producer work per message the batching aims at
_MAX_BATCH_BYTES = 1 << 20  # do not grow batches of large items past this
_START_TIMEOUT = 600.0  # a producer_init taking longer than this is reported as stuck


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
    """What the last call moved and where the time went.

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
        dispatch_wait_s: seconds the caller's thread waited for room (window or queue).
        consumer_wait_s: seconds the consumer waited for results.
        consumer_busy_s: seconds spent in ``consumer_work`` (0 for ``imap``).
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
        if self.dispatch_wait_s < 0.1 * self.wall_s and util < 0.5:
            return "the input: the data iterable (or pickling items) is slow"
        return f"balanced (producers {util:.0%} busy)"


class _Workers:
    """The processes and queues of an active runner; closes them without a runner reference
    (so it can run from a finalizer or at exit)."""

    def __init__(self, procs: list, devices: list[str], in_q: Queue, out_q: Queue) -> None:
        self.procs = procs
        self.devices = devices
        self.in_q = in_q
        self.out_q = out_q
        self.closed = False
        self.end_errors: list[dict] = []

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

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the producers (``producer_end`` runs), then kills what does not stop."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != getattr(self, "_owner_pid", os.getpid()):
            return
        codec = wire.Codec()
        self.drain_input()
        alive = [p for p in self.procs if p.is_alive()]
        for _ in alive:
            try:
                self.in_q.put(0, wire.STOP, [b""], timeout=1.0)
            except (QueueFull, QueueClosed):
                break
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
        self.in_q.close()
        self.out_q.close()
        # Normally already unlinked once the producers attached; not after a failed start.
        self.in_q.unlink()
        self.out_q.unlink()
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
    # stopped before multiprocessing joins its children.
    for r in list(_LIVE):
        try:
            r.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at exit
            pass


class BaseRunner(RunnerHooks):
    """A multi-process runner: one producer process per device, one consumer thread.

    Subclass :class:`UnorderedRunner` or :class:`OrderedRunner` and override the six static
    hooks. The runner is active (its processes started) after construction.

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
            ``"spawn"``; GPU devices always use ``"spawn"``. Under spawn and forkserver the
            runner class must be importable (define it at module level; create the runner
            under ``if __name__ == "__main__":``).
        window (int, optional): most items in flight at once; default
            ``max(16, int(256 * len(devices) * queue_scale))``.
        close_timeout (float): seconds ``close()`` waits for ``producer_end`` before it
            terminates a producer.
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
    ) -> None:
        self._devices = parse_devices(devices)
        self._cfg = _to_cfg(cfg)
        if not queue_scale > 0:
            raise InvalidArgument(f"queue_scale must be positive, got {queue_scale!r}")
        self._queue_scale = float(queue_scale)
        self._start_method = choose_start_method(start_method, self._devices)
        n = len(self._devices)
        self._window = int(window) if window else max(16, int(256 * n * self._queue_scale))
        if self._window < 1:
            raise InvalidArgument(f"window must be at least 1, got {window!r}")
        self._close_timeout = close_timeout
        self._workers: _Workers | None = None
        self._finalizer: weakref.finalize | None = None
        self._calls = itertools.count(1)
        self._cost_per_item = 0.0  # producer seconds per item, learned across calls
        self._out_bytes_per_item = 0.0  # pickled result bytes per item, likewise
        self._lock = threading.Lock()
        self.stats = RunnerStats()
        self.activate()

    # ----- hooks of the flavours -----

    @classmethod
    def _codec(cls) -> wire.Codec:
        """How items and results are pickled (the torch flavour sends tensors out of band)."""
        return wire.Codec()

    @classmethod
    def _producer_setup(cls, n_producers: int) -> Any:
        """A picklable callable ``setup(device)`` run first in each producer, or None."""
        return None

    # ----- life cycle -----

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

    def activate(self) -> None:
        """Restart all processes if this runner is closed (a no-op while active)."""
        with self._lock:
            if self.is_activate:
                return
            sweep_stale_segments()
            in_bytes, out_bytes = self._queue_sizes()
            max_msgs = max(64, self._window + 4 * len(self._devices))
            # Large items and results travel zero-copy in pooled segments (at most twice the
            # ring's bytes by default): /dev/shm use stays within 3 * (in_bytes + out_bytes).
            in_q = Queue(capacity_bytes=in_bytes, max_messages=max_msgs)
            out_q = Queue(capacity_bytes=out_bytes, max_messages=max_msgs)
            ctx = self._start_context(self._start_method)
            setup = self._producer_setup(len(self._devices))
            procs = []
            workers = _Workers(procs, self._devices, in_q, out_q)
            workers._owner_pid = os.getpid()
            try:
                for i, dev in enumerate(self._devices):
                    p = ctx.Process(
                        target=producer_main,
                        args=(type(self), i, dev, self._cfg, in_q, out_q, os.getpid(), setup),
                        name=f"easycore-producer-{i}-{dev}",
                        daemon=False,
                    )
                    p.start()
                    procs.append(p)
                self._await_ready(workers)
            except BaseException:
                workers.shutdown(timeout=2.0)
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
                    raise WorkerDiedError(
                        str(died).replace(
                            "The runner was closed; call activate() to restart it",
                            "It died while starting (in producer_init or before).",
                        ),
                        pid=died.pid,
                        device=died.device,
                        exitcode=died.exitcode,
                    ) from None
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

    def close(self) -> None:
        """Shutdown all processes if this runner is alive (``producer_end`` runs in each).

        Closing twice is harmless. Errors raised by ``producer_end`` are reported as a
        :class:`~easycore.errors.WorkerError` after every process has stopped.
        """
        with self._lock:
            workers, self._workers = self._workers, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            _LIVE.discard(self)
        if workers is None or workers.closed:
            return
        workers.shutdown(self._close_timeout)
        if workers.end_errors:
            raise _worker_error(workers.end_errors[0])

    def __enter__(self) -> BaseRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "active" if self.is_activate else "closed"
        return (
            f"<{type(self).__name__} devices={self._devices} start_method="
            f"{self._start_method!r} {state}>"
        )

    def __getstate__(self) -> None:
        raise TypeError(
            "a runner cannot be pickled or sent to another process; create it in the process "
            "that calls it"
        )

    def _active_workers(self) -> _Workers:
        w = self._workers
        if w is None or w.closed:
            raise RunnerClosedError(
                f"this {type(self).__name__} is closed; call activate() to restart it"
            )
        return w

    # ----- calls -----

    def __call__(self, data_iter: Iterable[Any], progress: bool = False) -> Any:
        """Runs every item of ``data_iter`` through the producers and the consumer.

        Args:
            data_iter (Iterable): iterator of data; read lazily, item by item.
            progress (bool): show a tqdm progress bar (with a total when ``data_iter`` has a
                length).

        Returns:
            Any: result (the value ``consumer_end`` returns)
        """
        call = _Call(self, data_iter, progress)
        return call.run_with_consumer()

    def imap(self, data_iter: Iterable[Any], progress: bool = False) -> Iterator[Any]:
        """Yields the producers' results in the caller's thread, without the consumer hooks.

        ``OrderedRunner`` yields in input order, ``UnorderedRunner`` as results arrive. The
        input is read lazily and at most ``window`` items are in flight. Stopping early
        (``break``, or closing the generator) leaves the runner usable.

        Args:
            data_iter (Iterable): iterator of data.
            progress (bool): show a tqdm progress bar.

        Yields:
            Any: what ``producer_work`` returned for each item.
        """
        call = _Call(self, data_iter, progress)
        return call.iterate()


def _ema(prev: float, x: float) -> float:
    """Running average of a figure the runner learns across calls (0: none learned yet)."""
    return x if prev <= 0 else 0.7 * prev + 0.3 * x


def _worker_error(err: dict) -> EasycoreError:
    """The exception for an error report sent by a producer."""
    where = f"in {err['hook']} on device {err['device']!r}"
    if err.get("item") is not None:
        where += f" (item {err['item']})"
    if err.get("kind") == "pickle_result":
        exc: EasycoreError = SerializationError(f"{err['message']} ({where})")
    elif err.get("kind") == "unpickle_item":
        exc = SerializationError(f"an item could not be unpickled {where}: {err['message']}")
    else:
        exc = WorkerError(
            f"{err['message']} — raised {where}",
            hook=err["hook"],
            device=err["device"],
            item=err.get("item"),
            remote_traceback=err.get("traceback", ""),
        )
    exc.__cause__ = RemoteTraceback(err.get("traceback", ""))
    return exc


class _Call:
    """The state of one call: dispatching, receiving, ordering, accounting, clean-up."""

    def __init__(self, runner: BaseRunner, data_iter: Iterable[Any], progress: bool) -> None:
        self.runner = runner
        self.workers = runner._active_workers()
        self.codec = runner._codec()
        self.call = next(runner._calls)
        self.kind_work = wire.pack_kind(wire.WORK, self.call)
        try:
            self.total = len(data_iter)  # type: ignore[arg-type]
        except TypeError:
            self.total = None
        self.it = iter(data_iter)
        self.window = runner._window
        self.n = len(runner._devices)
        self.max_batch = max(1, self.window // (4 * self.n))
        self.reorder = ReorderBuffer(self.window) if runner._ordered else None
        self.next_item = 0  # index of the next item to read
        self.next_batch = 0
        self.pending: tuple[int, int, list] | None = None  # (seq, n_items, parts) unsent
        self.exhausted = False
        self.dispatched = 0  # items sent (written by the dispatching thread only)
        self.delivered = 0  # items handed out (written by the receiving thread only)
        self.bytes_per_item = 0.0  # pickled input per item (last batch)
        # Results in flight (queued, being consumed, or waiting in the reorder buffer) stay
        # within about twice the result queue's ring, however large each result is.
        self.max_inflight_bytes = 2 * self.workers.out_q.ring_size
        self.busy_seen: dict[int, float] = {}
        self.wait_seen: dict[int, float] = {}
        self.error: BaseException | None = None
        self.abort = False
        self.end_seen = False
        self.cond = threading.Condition()
        self.dispatcher_waiting = False
        self.stats = RunnerStats(
            producer_busy_s={i: 0.0 for i in range(self.n)},
            producer_wait_s={i: 0.0 for i in range(self.n)},
        )
        self.t0 = time.perf_counter()
        self.in_wait0 = self.workers.in_q.wait_seconds
        self.out_wait0 = self.workers.out_q.wait_seconds
        self.bar = None
        if progress:
            import tqdm

            tqdm.tqdm.monitor_interval = 0  # no monitor thread (it would make fork unsafe)
            self.bar = tqdm.tqdm(total=self.total, unit="item", desc=type(runner).__name__)

    # ----- dispatching -----

    def _batch_size(self) -> int:
        cost = self.runner._cost_per_item
        if cost <= 0:
            return 1
        bs = int(_TARGET_BATCH_S / cost)
        largest = max(self.bytes_per_item, self.runner._out_bytes_per_item)
        if largest > 0:
            bs = min(bs, int(_MAX_BATCH_BYTES / largest))
        return max(1, min(bs, self.max_batch))

    def _window_now(self) -> int:
        """Items allowed in flight: ``window``, fewer when results are large."""
        out_bytes = self.runner._out_bytes_per_item
        if out_bytes <= 0:
            return self.window
        by_bytes = int(self.max_inflight_bytes / out_bytes)
        return max(1, min(self.window, by_bytes))

    def _make_batch(self) -> tuple[int, int, list] | None:
        room = self._window_now() - (self.dispatched - self.delivered)
        size = max(1, min(self._batch_size(), room))
        items = list(itertools.islice(self.it, size))
        if not items:
            return None
        first = self.next_item
        try:
            parts = self.codec.dumps((first, items))
        except Exception as e:
            what = wire.describe_unpicklable(items)
            raise SerializationError(
                f"input item {first}..{first + len(items) - 1} cannot be sent to the producers: "
                f"{what} is not picklable"
            ) from e
        nb = wire.nbytes(parts)
        self.bytes_per_item = nb / len(items)
        self.stats.bytes_in += nb
        seq = self.next_batch
        self.next_batch += 1
        self.next_item += len(items)
        return seq, len(items), parts

    def dispatch(self, block: bool) -> None:
        """Sends batches while the window allows; with ``block``, until the input ends."""
        in_q = self.workers.in_q
        while not self.abort:
            if self.pending is None:
                if self.exhausted:
                    return
                self.pending = self._make_batch()
                if self.pending is None:
                    self.exhausted = True
                    return
            seq, count, parts = self.pending
            in_flight = self.dispatched - self.delivered
            if in_flight > 0 and in_flight + count > self._window_now():
                if not block:
                    return
                self._wait_for_room()
                continue
            try:
                in_q.put(seq, self.kind_work, parts, block=block, timeout=_TICK)
            except QueueFull:
                if not block:
                    return
                self._check_health()
                continue
            self.pending = None
            self.dispatched += count
            self.stats.batches += 1

    def _wait_for_room(self) -> None:
        t = time.perf_counter()
        with self.cond:
            self.dispatcher_waiting = True
            in_flight = self.dispatched - self.delivered
            window = self._window_now()
            if in_flight > 0 and not self.abort and in_flight + self.pending[1] > window:
                self.cond.wait(_TICK)
            self.dispatcher_waiting = False
        self.stats.dispatch_wait_s += time.perf_counter() - t
        self._check_health()

    def _check_health(self) -> None:
        if self.error is not None:
            raise self.error
        died = self.workers.dead()
        if died is not None:
            raise died

    # ----- receiving -----

    def receive(self, timeout: float) -> list[tuple[int, list]]:
        """Chunks ``(first_index, results)`` ready for delivery, in delivery order."""
        try:
            msgs = self.workers.out_q.get_many(64, timeout=timeout)
        except QueueEmpty:
            self._check_health()
            return []
        except QueueClosed:
            raise RunnerClosedError("the runner was closed during the call") from None
        out: list[tuple[int, list]] = []
        for seq, kind, parts in msgs:
            t, call = wire.unpack_kind(kind)
            if t == wire.END:
                self.end_seen = True
                continue
            if call != self.call:
                continue  # a result of an aborted earlier call
            if t == wire.ERROR:
                raise _worker_error(self.codec.loads(parts))
            if t != wire.RESULT:
                continue
            nb = wire.nbytes(parts)
            self.stats.bytes_out += nb
            first, results, wi, busy, wait = self.codec.loads(parts)
            del parts
            r = self.runner
            r._out_bytes_per_item = _ema(r._out_bytes_per_item, nb / max(1, len(results)))
            self._learn(wi, busy, wait, len(results))
            if self.reorder is None:
                out.append((first, results))
            else:
                self.reorder.push(seq, (first, results))
                out.extend(self.reorder.pop_ready())
        return out

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
        r._cost_per_item = _ema(r._cost_per_item, delta / max(1, count))

    def delivered_chunk(self, count: int) -> None:
        self.delivered += count
        if self.bar is not None:
            self.bar.update(count)
        if self.dispatcher_waiting:
            with self.cond:
                self.cond.notify()

    def done(self) -> bool:
        return self.exhausted and self.pending is None and self.delivered >= self.dispatched

    # ----- the two ways to run a call -----

    def run_with_consumer(self) -> Any:
        runner = self.runner
        cfg = copy.deepcopy(runner._cfg)
        result: list[Any] = []
        consumer = threading.Thread(
            target=self._consume, args=(cfg, result), name="easycore-consumer", daemon=True
        )
        consumer.start()
        try:
            self.dispatch(block=True)
            # Wake the consumer: the input is over (it may be asleep on the output queue).
            self.workers.out_q.put(0, wire.pack_kind(wire.END, self.call), [b""])
            while consumer.is_alive():
                consumer.join(_TICK)
                if self.error is None and consumer.is_alive():
                    self._check_health()
        except BaseException as e:
            self._fail(e, consumer)
            raise
        if self.error is not None:
            self._fail(self.error, consumer)
            raise self.error
        self._finish()
        return result[0]

    def _consume(self, cfg: Any, result: list) -> None:
        # Hooks are looked up on the class, as the producers do: a plain function assigned
        # as a hook then works like a staticmethod.
        runner = type(self.runner)
        try:
            _call_hook("consumer_init", runner.consumer_init, cfg)
            work = runner.consumer_work
            busy = 0.0
            while not self.abort:
                if self.end_seen and self.delivered >= self.dispatched:
                    break
                for first, results in self.receive(_TICK):
                    t = time.perf_counter()
                    for i, r in enumerate(results):
                        try:
                            work(cfg, r)
                        except BaseException as e:
                            raise _hook_error("consumer_work", e, first + i) from e
                    busy += time.perf_counter() - t
                    self.delivered_chunk(len(results))
            self.stats.consumer_busy_s = busy
            if not self.abort:
                result.append(_call_hook("consumer_end", runner.consumer_end, cfg))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self.error = e
            self.abort = True
            with self.cond:
                self.cond.notify_all()

    def iterate(self) -> Iterator[Any]:
        finished = False
        try:
            while True:
                self.dispatch(block=False)
                if self.done():
                    break
                for _first, results in self.receive(_TICK):
                    self.delivered_chunk(len(results))
                    yield from results
            finished = True
        finally:
            if finished:
                self._finish()
            else:
                self._fail(None, None)

    def _fail(self, exc: BaseException | None, consumer: threading.Thread | None) -> None:
        """Stops the call; closes the runner if a producer died."""
        self.abort = True
        with self.cond:
            self.cond.notify_all()
        if consumer is not None:
            consumer.join(5.0)
        if self.bar is not None:
            self.bar.close()
        if isinstance(exc, WorkerDiedError | KeyboardInterrupt) or self.workers.dead():
            try:
                self.runner.close()
            except EasycoreError:
                pass
        elif not self.workers.closed:
            self.workers.drain_input()

    def _finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
        s = self.stats
        s.items = self.delivered
        s.wall_s = time.perf_counter() - self.t0
        s.dispatch_wait_s += self.workers.in_q.wait_seconds - self.in_wait0
        s.consumer_wait_s = self.workers.out_q.wait_seconds - self.out_wait0
        self.runner.stats = s


def _hook_error(hook: str, e: BaseException, item: int | None) -> WorkerError:
    import traceback

    tb = "".join(traceback.format_exception(e))
    return WorkerError(
        f"{type(e).__qualname__}: {e} — raised in {hook}"
        + (f" (item {item})" if item is not None else ""),
        hook=hook,
        device=None,
        item=item,
        remote_traceback=tb,
    )


def _call_hook(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
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
