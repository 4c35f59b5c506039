"""The transport: how a stream reaches the producers of an active runner (:class:`Transport`),
with the shutdown sequence every transport shares; its local implementation over two
shared-memory queues and producer processes (:class:`LocalWorkers`). The Ray backend's
actors are the other implementation (``easycore.ray._workers.RayWorkers``).

A transport sends batches (:meth:`~Transport.send`, never blocking: ``QueueFull`` when the
producers have enough), receives results and error reports (:meth:`~Transport.receive`),
lets the caller's input reader wake the receiver (:meth:`~Transport.wake`), detects and
describes a producer's death (:meth:`~Transport.dead`, :meth:`~Transport.exited`), and stops
(:meth:`~Transport.shutdown`: goodbyes collected, then terminate, then kill). Messages are
``(seq, kind, parts)`` (``wire.py``) both ways."""

from __future__ import annotations

import functools
import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from easycore._core import Lifelines, Queue, sweep_dead_pids
from easycore._engine import lifecycle, wire
from easycore._engine import process_main as _worker
from easycore._engine import producer as _producer
from easycore._engine.lifecycle import INTERRUPT_GRACE_S, Stage
from easycore._engine.reports import worker_error
from easycore._engine.retire import Retirements, Starter
from easycore.errors import (
    RUNNER_CLOSED,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    RunnerTimeoutError,
    WorkerDiedError,
)

_STOP_POLL_S = 0.1  # seconds between looks at the producers while they stop


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


class Transport:
    """What a stream needs of an active runner's producers, and the shutdown sequence every
    transport shares. Implementations set the attributes below, register with
    ``lifecycle`` (``Stage.PRODUCERS``) and implement the methods that raise here."""

    closed: bool
    owner_pid: int
    procs: Sequence[Any]  # per producer, something with a ``pid``
    #: what each producer works on: ``producer.STATE_FIELDS`` words each (see producer.py)
    view: Any
    out_budget: int  # bytes of results the way back holds: a stream keeps twice that in flight
    end_errors: list[dict[str, Any]]  # producer_end's error reports, after shutdown
    exit_results: dict[int, Any]  # producer_end's return values by producer, after shutdown

    def send(self, seq: int, kind: int, parts: list[Any]) -> None:
        """Sends one batch without blocking; ``QueueFull`` if the producers have enough."""
        raise NotImplementedError

    def receive(
        self, max_messages: int, block: bool = True, timeout: float | None = None
    ) -> list[tuple[int, int, list[Any]]]:
        """Up to ``max_messages`` messages from the producers (or :meth:`wake`), waiting at most
        ``timeout``: ``QueueEmpty`` if none came, ``QueueClosed`` once stopped."""
        raise NotImplementedError

    def results_waiting(self) -> int:
        """How many messages :meth:`receive` would return without waiting, as far as a quick
        look tells (0: unknown, or none): a receiving thread that finds one takes it at once,
        without first saying it is about to sleep."""
        return 0

    def wake(self, call: int, timeout: float = 1.0) -> None:
        """Wakes the thread blocked in :meth:`receive` (a ``WAKE`` message of ``call``),
        waiting up to ``timeout`` seconds for room (none: the receiver has messages to take,
        or wakes on its tick anyway)."""
        raise NotImplementedError

    def wait_seconds(self) -> tuple[float, float]:
        """Seconds spent so far waiting to send and waiting to receive."""
        return 0.0, 0.0

    def input_queue(self) -> Queue | None:
        """The shared-memory queue batches travel on (``easycore.shm``'s ``runner=``)."""
        return None

    def drain_input(self) -> None:
        """Discards the work no producer has taken yet (after a failed call)."""
        raise NotImplementedError

    def mine(self) -> bool:
        """Whether this process made the producers (a forked child must not touch them)."""
        return os.getpid() == self.owner_pid

    def dead(self) -> WorkerDiedError | None:
        """An error describing the first producer that died, if any."""
        raise NotImplementedError

    def exited(self) -> bool:
        """Whether a producer has died (a quick look, for a hot path)."""
        return self.dead() is not None

    def kill_now(self) -> None:
        """Kills every producer at once (second Ctrl-C, exit)."""
        raise NotImplementedError

    def control(self, seq: int, kind: int, parts: list[Any]) -> None:
        """A producer's message of no call (``wire.RETIRE``, ``wire.READY``, an ``ERROR`` of
        a replacement's start) that a call received: see ``retire.py``. Ignored here."""

    def adopt_zygote(self, zygote: Any) -> None:
        """The zygote that forks this transport's replacement producers (``retire.py``), made
        after its first producers started. Ignored here."""

    def replace(self, i: int, proc: Any) -> bool:
        """Kills producer ``i`` (``proc``, stopped by the caller, which gave up on it) and
        starts a new one in its place in the running stream (``retire.py``); False if not
        done (then the caller kills it). Here: never done."""
        return False

    def stall_error(
        self, devices: Sequence[str], call: int, timeout: float, in_flight: int
    ) -> RunnerTimeoutError:
        """The error for call ``call`` that got no result within ``timeout`` seconds with
        ``in_flight`` items in flight: names the producer stuck longest in one of its
        batches (from :attr:`view`), if any."""
        view = self.view
        now = time.monotonic_ns()
        stuck = []
        for i in range(len(devices)):
            base = _producer.STATE_FIELDS * i
            item = view[base + _producer.ITEM]
            if item >= 0 and view[base + _producer.CALL] == call:
                stuck.append(
                    (view[base + _producer.SINCE_NS], i, item, view[base + _producer.COUNT])
                )
        if stuck:
            since, i, item, count = min(stuck)
            pid = self.procs[i].pid
            dev = devices[i]
            which = f"item {item}" if count <= 1 else f"one of items {item}..{item + count - 1}"
            return RunnerTimeoutError(
                f"no result within timeout={timeout} s: producer {i} (device {dev!r}, "
                f"pid {pid}) is stuck in producer_work on {which} (its batch started "
                f"{(now - since) / 1e9:.1f} s ago). The runner was closed (its producers were "
                "stopped); call activate() to restart it",
                timeout=timeout,
                item=item,
                producer=i,
                device=dev,
                pid=pid,
            )
        return RunnerTimeoutError(
            f"no result within timeout={timeout} s ({in_flight} items in flight, none "
            "in producer_work: the producers are slow to take or return work). The runner "
            "was closed; call activate() to restart it",
            timeout=timeout,
        )

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
        lifecycle.discard(Stage.PRODUCERS, self)


def _forget_dead(procs: Sequence[Any]) -> None:
    """Removes the names (liveness tokens) that reaped producers left: a producer killed, or
    ended by ``os._exit``, skips the exit handlers that would have removed them."""
    sweep_dead_pids([p.pid for p in procs if p.pid and p.exitcode is not None])


class LocalWorkers(Transport):
    """The processes and queues of an active runner; closes them without a runner reference
    (so it can run from a finalizer, at exit or from a signal handler)."""

    def __init__(
        self,
        procs: list[Any],
        devices: list[str],
        in_q: Queue,
        out_q: Queue,
        state: Any,
        out_budget: int,
    ) -> None:
        self.procs: list[Any] = procs
        self.devices = devices
        self.in_q = in_q
        self.out_q = out_q
        self.state = state
        self.view = memoryview(state).cast("B").cast("q")
        self.closed = False
        self.end_errors: list[dict[str, Any]] = []
        self.exit_results: dict[int, Any] = {}
        self.start_s: dict[int, float] = {}  # per producer: process start until ready
        self.init_s: dict[int, float] = {}  # per producer: its set-up and producer_init
        self.owner_pid = os.getpid()
        self.out_budget = out_budget
        self.receive = out_q.get_many  # type: ignore[method-assign]  # no frame
        self.results_waiting = out_q.__len__  # type: ignore[method-assign]  # no frame
        self.send = functools.partial(in_q.put, block=False)  # type: ignore[method-assign]
        self._exit_poll: select.poll | None = None  # on the sentinels of the first _polled
        self._polled = 0
        # One poll at a time (a poll object refuses concurrent polls): the pool's feed, its
        # service thread and its callers ask from their threads.
        self._poll_lock = threading.Lock()
        # Every producer's lifeline, each held by its producer (see trust_lifelines); None
        # before that, where lifelines do not work, and once a producer was replaced.
        self._lifelines: Lifelines | None = None
        self.retire: Retirements | None = None  # producers that retire (retire.py)
        self.start_errors: dict[int, dict[str, Any]] = {}  # a replacement's failed start
        lifecycle.register(Stage.PRODUCERS, self)

    def replace_with(self, starter: Starter) -> None:
        """Producers retire after their ``max_tasks`` and ``starter`` starts their
        replacements (``retire.py``)."""
        self.retire = Retirements(
            self.procs, self.view, starter, wire.Codec().loads, self._procs_changed
        )

    def adopt_zygote(self, zygote: Any) -> None:
        if self.retire is not None:
            self.retire.starter.adopt_zygote(zygote)

    def control(self, seq: int, kind: int, parts: list[Any]) -> None:
        t = wire.unpack_kind(kind)[0]
        retire = self.retire
        if retire is None or seq < 0 or seq >= len(self.procs):
            return
        if t == wire.ERROR:  # a replacement's producer_init raised: it exits
            self.start_errors[seq] = wire.Codec().loads(parts)
        elif t == wire.READY:
            self.init_s[seq] = float(bytes(parts[0]) or 0)
        else:
            retire.message(seq, t, parts)

    def replace(self, i: int, proc: Any) -> bool:
        retire = self.retire
        return retire is not None and self.mine() and retire.give_up(i, proc)

    @property
    def replaced(self) -> int:
        """int: producers that retired and were replaced while the stream ran."""
        return 0 if self.retire is None else self.retire.replaced

    def trust_lifelines(self, lifelines: Lifelines | None) -> None:
        """Every producer said it is ready: from now on :meth:`exited` reads their
        ``lifelines`` first, if each producer holds its own."""
        if lifelines is not None and lifelines.all_held():
            self._lifelines = lifelines

    def exited(self) -> bool:
        """Whether a producer has exited (any thread): while every producer's lifeline is
        held, no (no system call: a request/response loop asks at every round trip); else one
        poll(2) on their sentinels, which become readable when they exit (about 0.5 µs;
        :meth:`dead` asks each process twice, 3.5 µs for two), the only word on a death: a
        lifeline is marked a moment before its producer's sentinel."""
        lifelines = self._lifelines
        if lifelines is not None and lifelines.all_held():
            return False
        with self._poll_lock:
            poll = self._exit_poll  # (set to None by another thread when a producer is replaced)
            if poll is None or self._polled != len(self.procs):
                poll = select.poll()
                for p in self.procs:
                    poll.register(p.sentinel, select.POLLIN)
                self._exit_poll, self._polled = poll, len(self.procs)
            if not poll.poll(0):
                return False
        if self.retire is None or self.dead() is not None:
            return True
        # One that retired (or was given up on) was replaced, and is no death: the next
        # look polls the producers there are now.
        self._exit_poll = None
        return False

    def _procs_changed(self) -> None:
        """A producer was replaced: the poll of sentinels is made again, and lifelines are
        read no more (a replacement's lifeline is its predecessor's until that one exits)."""
        self._exit_poll = None
        self._lifelines = None

    def dead(self) -> WorkerDiedError | None:
        """An error describing the first producer that died, if any (one that retired is
        replaced here, if not yet: see ``retire.py``)."""
        retire = self.retire
        for i, p in enumerate(self.procs):
            if p.exitcode is not None or not p.is_alive():
                if retire is not None and retire.gone(i, p):
                    continue
                code = p.exitcode
                how = (
                    f"killed by {_signal_name(-code)}"
                    if code is not None and code < 0
                    else f"exited with code {code}"
                )
                hint = " (out of memory?)" if code == -signal.SIGKILL else ""
                if i in self.start_errors:
                    hint += f"; it failed to start: {worker_error(self.start_errors[i])}"
                elif retire is not None and i in retire.start_failed:
                    hint += f"; its replacement could not start: {retire.start_failed[i]}"
                return WorkerDiedError.of(
                    f"producer {i} (device {self.devices[i]!r}, pid {p.pid}) died: {how}{hint}",
                    RUNNER_CLOSED,
                    pid=p.pid or 0,
                    device=self.devices[i],
                    exitcode=code,
                )
        return None

    def wake(self, call: int, timeout: float = 1.0) -> None:
        try:
            self.out_q.put(0, wire.pack_kind(wire.WAKE, call), [b""], timeout=timeout)
        except (QueueFull, QueueClosed):
            pass  # the receiver wakes on its tick anyway

    def wait_seconds(self) -> tuple[float, float]:
        return self.in_q.wait_seconds, self.out_q.wait_seconds

    def input_queue(self) -> Queue | None:
        return self.in_q

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
        procs = list(self.procs) + ([] if self.retire is None else self.retire.stop())
        for p in procs:
            if p.exitcode is None:
                try:
                    p.kill()
                except (OSError, AttributeError):
                    pass
        self._release()
        for p in procs:
            try:
                p.join(2.0)
            except AssertionError:
                pass
        _forget_dead(procs)
        lifecycle.discard(Stage.PRODUCERS, self)

    def _release(self) -> None:
        self.in_q.close()
        self.out_q.close()
        # Normally already unlinked once the producers attached; not after a failed start.
        self.in_q.unlink()
        self.out_q.unlink()

    def _stop(self, timeout: float, interrupt: bool) -> None:
        codec = wire.Codec()
        retire = self.retire
        retired = [] if retire is None else retire.stop()
        self.drain_input()
        alive = [
            p
            for i, p in enumerate(self.procs)
            if p.is_alive() and (retire is None or not retire.retiring(i, p))
        ]
        alive_pids = {p.pid for p in alive}
        for _ in alive:
            try:
                self.in_q.put(0, wire.STOP, [b""], timeout=1.0)
            except (QueueFull, QueueClosed):
                break
        if interrupt:
            self.interrupt()
            timeout = min(timeout, INTERRUPT_GRACE_S)
        deadline = time.monotonic() + timeout
        byes = 0
        while byes < len(alive) and time.monotonic() < deadline:
            try:
                msgs = self.out_q.get_many(256, timeout=_STOP_POLL_S)
            except QueueEmpty:
                if not any(p.is_alive() for p in self.procs):
                    break
                continue
            except QueueClosed:
                break
            for seq, kind, parts in msgs:
                t = wire.unpack_kind(kind)[0]
                if t == wire.BYE:
                    byes += 1
                    err, value = codec.loads(parts)
                    if err is not None:
                        self.end_errors.append(err)
                    self.exit_results[seq] = value
                elif t == wire.RETIRE and retire is not None:
                    # One that retired as the stream ended: it takes no STOP.
                    err, value, pid = codec.loads(parts)
                    retire.note_exit(seq, err, value)
                    byes += pid in alive_pids
        if retire is not None:
            self.end_errors[:0] = retire.end_errors
            for i, value in retire.exit_results.items():
                self.exit_results.setdefault(i, value)  # the last producer's value wins
        self._release()
        for p in retired:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(2.0)
        _forget_dead(retired)
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        _forget_dead(self.procs)
