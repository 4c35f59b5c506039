"""Local producers: the two shared-memory queues, one process per device running
``process_main.producer_main``, and the wait until each ran ``producer_init``
(:func:`start_local`, configured by a frozen :class:`ProducerStart`). Start-up failures are
explained here: a runner class or cfg that spawn cannot send, a main script without a
``__main__`` guard, a producer that died while starting."""

from __future__ import annotations

import functools
import mmap
import multiprocessing
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from easycore._core import Queue, identity, leave_queues, shm_space, sweep_stale_segments
from easycore._engine import producer as _producer
from easycore._engine import wire
from easycore._engine.extension import Fixer
from easycore._engine.flavour import Flavour
from easycore._engine.lifecycle import TICK
from easycore._engine.process_main import producer_main
from easycore._engine.reports import worker_error
from easycore._engine.transport import LocalWorkers
from easycore._engine.zygote import Zygote
from easycore.errors import (
    EasycoreError,
    QueueEmpty,
    RunnerTimeoutError,
    StartMethodError,
    WorkerDiedError,
)

_START_TIMEOUT = 600.0  # a producer_init taking longer than this is reported as stuck
_RING_IN = 4 << 20  # ring bytes of the input queue (larger items use side segments)
_RING_OUT = 8 << 20  # ring bytes of the output queue
_UNGUARDED_MAIN_EXIT = 87  # exit code of a spawned child that re-ran an unguarded script


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


@dataclass(frozen=True)
class ProducerStart:
    """How to start a runner's producers: all of it for local ones (:func:`start_local`);
    a remote backend (``easycore.ray``) reads ``hooks``, ``cfg``, ``seed``,
    ``seed_per_item``, ``flavour``, ``setup`` and ``fix_unsendable``.

    Attributes:
        hooks: the runner class (pickled to spawned producers; its hooks run there).
        devices: one device per producer.
        cfg: the runner's cfg (each producer gets its own copy).
        seed: the base seed (producer ``i`` uses ``seed + i``).
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; start_reason: why.
        window: the most items in flight (sizes the queues' message slots).
        queue_scale: scales the queues' byte budgets with the number of producers.
        flavour: the codec and the start context.
        setup: ``setup(device)`` run first in each producer, or None.
        fix_unsendable: run in a producer on a batch whose results do not pickle, or None
            (see ``extension.Extension``).
        seed_per_item: each item's random stream is seeded from the seed, the call and its
            index (see ``producer.seed_for_item``).
        init_timeout: most seconds the producers may take to start and run
            ``producer_init`` (None: 600).
        zygote: under fork, the process that forks the producers (see ``zygote.py``;
            made by :func:`make_zygote`), or None: this process forks them.
        max_tasks: each producer retires after this many work messages, and a new one takes
            its place in the running stream (``retire.py``); 0: no bound.
        replaceable: producers may be replaced in the running stream (``retire.py``): by
            ``max_tasks``, or when the caller gives one up (``LocalWorkers.replace``).
    """

    hooks: Any
    devices: tuple[str, ...]
    cfg: Any
    seed: int
    start_method: str
    start_reason: str
    window: int
    queue_scale: float
    flavour: Flavour
    setup: Callable[[str], Any] | None
    fix_unsendable: Fixer | None = None
    seed_per_item: bool = False
    init_timeout: float | None = None
    zygote: Zygote | None = None
    max_tasks: int = 0
    replaceable: bool = False

    def spawn_hint(self) -> str:
        """What the start method is, and why, for errors."""
        return (
            f"The start method is {self.start_method!r} ({self.start_reason}); "
            "start_method='fork' avoids pickling and re-importing, on Linux with CPU devices"
        )

    def queue_sizes(self) -> tuple[int, int]:
        scale = len(self.devices) * self.queue_scale
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

    def check_spawnable(self) -> None:
        """Under spawn/forkserver, fails early and clearly where starting would fail."""
        if _spawned_child_bootstrapping():
            msg = (
                f"easycore: a {self.hooks.__name__} was created while a {self.start_method} "
                "child process was importing the main script: the script makes runners at "
                'import time. Put that code under `if __name__ == "__main__":`. '
                f"{self.spawn_hint()}\n"
            )
            sys.stderr.write(msg)
            sys.stderr.flush()
            os._exit(_UNGUARDED_MAIN_EXIT)
        if self.start_method == "fork":
            return
        cls = self.hooks
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
                f"or a module). {self.spawn_hint()}. ({type(e).__name__}: {e})"
            ) from None
        try:
            pickle.dumps(self.cfg)
        except Exception as e:  # noqa: BLE001 - explained below
            key = _unpicklable_cfg_key(self.cfg) or "?"
            raise StartMethodError(
                f"cfg cannot be sent to the producer processes: cfg.{key} cannot be pickled. "
                "Keep only picklable values in cfg (build objects such as models or open "
                f"files in producer_init). {self.spawn_hint()}. ({type(e).__name__}: {e})"
            ) from None


def start_local(start: ProducerStart) -> LocalWorkers:
    """Starts the producers and waits until each ran ``producer_init``; on any failure,
    stops what started and raises."""
    start.check_spawnable()
    sweep_stale_segments()
    in_bytes, out_bytes = start.queue_sizes()
    n = len(start.devices)
    max_msgs = max(64, start.window + 4 * n)
    # Large items and results travel zero-copy in pooled segments (at most twice the
    # ring's bytes by default): /dev/shm use stays within 3 * (in_bytes + out_bytes).
    # The rings only hold small messages (larger ones go to side segments within the
    # side budget), and their space is committed at creation (its pages are mapped as
    # they are first touched): small rings start in about a millisecond each where rings
    # of the full budget took ~70 ms.
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
    zygote = start.zygote if start.zygote is not None and start.zygote.alive else None
    state_fd = -1
    if zygote is not None or (start.replaceable and start.start_method == "fork"):
        # Shared with producers that are not this process's children: the zygote's, now
        # or (replacements) later.
        state_fd = _state_memfd(n)
    if state_fd >= 0:
        state: Any = memoryview(mmap.mmap(state_fd, 8 * _producer.state_size(n))).cast("q")
    else:
        state = start.flavour.start_context(start.start_method).RawArray(
            "q", _producer.state_size(n)
        )
    for i in range(n):
        state[_producer.STATE_FIELDS * i + _producer.ITEM] = -1
    lifelines = _producer.lifelines(state, n)
    if lifelines is not None:
        for i in range(n):
            lifelines.init(i)
    procs: list[Any] = []
    workers = LocalWorkers(procs, list(start.devices), in_q, out_q, state, out_bytes)
    starter = Starter(start, in_q, out_q, state, state_fd, zygote)
    try:
        for i in range(n):
            workers.start_s[i] = time.perf_counter()  # until ready: see _await_ready
            procs.append(starter.start(i))
        _await_ready(start, workers)
        workers.trust_lifelines(lifelines)
    except BaseException:
        starter.close()
        workers.shutdown(timeout=2.0, interrupt=True)
        raise
    if start.replaceable:
        # Producers retire and new ones join the running stream (retire.py): the queues keep
        # their names until the stream ends, as their pooled segments and token do.
        workers.replace_with(starter)
    else:
        starter.close()  # each producer mapped its own state
        # Every producer has attached: the names can go, so nothing leaks even on SIGKILL.
        in_q.unlink()
        out_q.unlink()
    return workers


def _state_memfd(n: int) -> int:
    """A memfd sized for the shared state of ``n`` producers."""
    fd = os.memfd_create("easycore-state")
    try:
        os.ftruncate(fd, 8 * _producer.state_size(n))
    except BaseException:
        os.close(fd)
        raise
    return fd


class Starter:
    """Starts producer ``i`` of ``start`` (:meth:`start`): forked by the zygote if there is
    one (and it forks), else by the start method's context; keeps what a producer started
    later needs (the queues, the shared state and its memfd) until :meth:`close`. A
    transport's replacements come from here too (``retire.py``)."""

    def __init__(
        self,
        start: ProducerStart,
        in_q: Queue,
        out_q: Queue,
        state: Any,
        state_fd: int,
        zygote: Zygote | None,
    ) -> None:
        self.start_ = start
        self.in_q = in_q
        self.out_q = out_q
        self.state = state
        self.state_fd = state_fd
        self.zygote = zygote
        self.ctx = start.flavour.start_context(start.start_method)

    def adopt_zygote(self, zygote: Zygote | None) -> None:
        """The zygote made after the first producers were forked (see the engine)."""
        if self.zygote is None and zygote is not None and self.state_fd >= 0:
            self.zygote = zygote

    def start(self, i: int) -> Any:
        """Starts producer ``i``; returns its process (a ``Process`` or ``ZygoteChild``)."""
        start = self.start_
        n = len(start.devices)
        name = f"easycore-producer-{i}-{start.devices[i]}"
        zygote = self.zygote
        if zygote is not None and zygote.alive and self.state_fd >= 0:
            blob = pickle.dumps((i, self.in_q, self.out_q, os.getpid(), n))
            forked = zygote.fork(name, blob, [self.state_fd])
            if forked is not None:
                return forked
        p = self.ctx.Process(
            target=producer_main,
            args=(
                start.hooks,
                i,
                start.devices[i],
                start.cfg,
                self.in_q,
                self.out_q,
                os.getpid(),
                start.setup,
                _producer_options(start, n, self.state),
            ),
            name=name,
            daemon=False,
        )
        try:
            p.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise StartMethodError(
                f"producer {i} could not be started: its arguments cannot be "
                f"pickled ({type(e).__name__}: {e}). {start.spawn_hint()}"
            ) from e
        return p

    def close(self) -> None:
        """No producer starts from here any more: closes the state's memfd."""
        fd, self.state_fd = self.state_fd, -1
        if fd >= 0:
            os.close(fd)


def _producer_options(start: ProducerStart, n: int, state: Any) -> dict[str, Any]:
    """``producer_main``'s options for one of ``start``'s ``n`` producers."""
    return {
        "n": n,
        "seed": start.seed,
        "seed_per_item": start.seed_per_item,
        "start_method": start.start_method,
        "state": state,
        "codec": start.flavour.codec(),
        "fix_unsendable": start.fix_unsendable,
        "max_tasks": start.max_tasks,
    }


def make_zygote(start: ProducerStart) -> Zygote | None:
    """A zygote that forks ``start``'s producers, for starts under fork (None for other start
    methods, or where the shared state cannot be passed to it: no ``memfd_create``). Call it
    while this process runs one thread: the zygote is a fork of it as it is now, and so is
    every producer it forks later."""
    if start.start_method != "fork" or not hasattr(os, "memfd_create"):
        return None
    return Zygote(functools.partial(_zygote_producer, start), identity())


def _zygote_producer(start: ProducerStart, blob: bytes, fds: list[int]) -> None:
    """A producer forked by the zygote: attaches to the queues and the shared state it was
    sent, then runs as any forked producer (``start`` is the zygote's copy: the caller's
    as it was when the zygote was made)."""
    try:
        i, in_q, out_q, parent_pid, n = pickle.loads(blob)  # the queues attach by name
    except BaseException:
        # One queue attached, the other gone (the caller died meanwhile): the process ends
        # with os._exit, so its hold is let go of here, and the names with it if it was last.
        leave_queues()
        raise
    state = memoryview(mmap.mmap(fds[-1], 8 * _producer.state_size(n))).cast("q")
    os.close(fds[-1])
    producer_main(
        start.hooks,
        i,
        start.devices[i],
        start.cfg,
        in_q,
        out_q,
        parent_pid,
        start.setup,
        _producer_options(start, n, state),
    )


def _await_ready(start: ProducerStart, workers: LocalWorkers) -> None:
    codec = start.flavour.codec()
    ready = 0
    limit = start.init_timeout if start.init_timeout is not None else _START_TIMEOUT
    deadline = time.monotonic() + limit
    while ready < len(workers.procs):
        try:
            msgs = workers.receive(64, timeout=TICK)
        except QueueEmpty:
            died = workers.dead()
            if died is not None:
                raise _start_death(start, died) from None
            if time.monotonic() > deadline:
                n = len(workers.procs)
                raise RunnerTimeoutError(
                    f"{n - ready} of {n} producers did not finish starting (producer_init) "
                    f"within {limit:g} s; they were stopped",
                    timeout=limit,
                ) from None
            continue
        for seq, kind, parts in msgs:
            t, _ = wire.unpack_kind(kind)
            if t == wire.READY:
                ready += 1
                workers.start_s[seq] = time.perf_counter() - workers.start_s[seq]
                workers.init_s[seq] = float(bytes(parts[0]) or 0)
            elif t == wire.ERROR:
                raise worker_error(codec.loads(parts))


def _start_death(start: ProducerStart, died: WorkerDiedError) -> EasycoreError:
    """The error for a producer that died before it was ready."""
    if start.start_method != "fork" and died.exitcode == _UNGUARDED_MAIN_EXIT:
        return StartMethodError(
            f"producer processes re-ran the main script and it made a runner again: "
            'the script has no `if __name__ == "__main__":` guard. Put the code that '
            f"makes and calls runners under that guard. {start.spawn_hint()}"
        )
    then = "It died while starting (in producer_init or before)."
    if start.start_method != "fork" and died.exitcode == 1:
        then += (
            " Under spawn this is often the main script failing when the producer "
            "re-imports it (see the producer's traceback above): keep work under "
            f'`if __name__ == "__main__":`. {start.spawn_hint()}'
        )
    return died.then(then)
