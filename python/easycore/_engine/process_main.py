"""The producer process: runs ``producer_init``, then ``producer_work`` on every item it
gets from the input queue, and ``producer_end`` when told to stop.

It never outlives its caller, and it cleans up after a caller that was killed:

* first thing, it starts a watchdog thread (in Rust, ``easycore._core.exit_when_dead``) that
  blocks on the caller's liveness token, which the kernel releases the instant the caller dies
  (whatever kills it, whichever thread made the runner, under every start method). The
  watchdog then removes every shared-memory name the caller owned (the queues' pooled
  segments) and ends the producer at once. Nothing is polled, and ``kill(pid, 0)`` is never
  trusted;
* it also checks the caller's token between batches and while idle, and exits if it is gone.

It ignores SIGINT, so Ctrl-C in a terminal reaches only the caller, which then stops the
producers itself: SIGUSR1 makes a producer drop the batch it is working on (an exception
raised in ``producer_work``), when the caller's shared ``abort_below`` word says so. SIGTERM
keeps its default action (the caller's own SIGTERM handler is not inherited).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from easycore._core import (
    Queue,
    drop_inherited_holds,
    exit_when_dead,
    leave_queues,
    owner_alive,
    retire_identity,
    sweep_dead_pids,
)
from easycore._engine import heap, leases, wire
from easycore._engine.producer import Interrupted, ProducerCore
from easycore._engine.producer import lifelines as producer_lifelines
from easycore._engine.reports import error_report
from easycore.errors import QueueClosed, QueueEmpty, QueueFull, SharedMemoryError

_PARENT_CHECK_S = 0.5
_ALIVE_AFTER_SEND_S = 0.05
"""While results flow, the caller's liveness is asked at most this often (a probe of its token
is a few system calls: per result, it was a tenth of a request/response round trip)."""


def ignore_signal(signum: int) -> None:
    """Sets ``signum`` to SIG_IGN without CPython's "Signal N ignored due to race condition".

    ``signal.signal`` runs the pending handlers, then changes the disposition. A signal that
    arrives in between is caught by the C handler but finds SIG_IGN as its Python handler,
    and CPython prints that message on stderr (measured: 11 in 200,000 changes under a
    stream of signals). Blocked while the disposition changes, such a signal stays with the
    kernel, which discards it once SIG_IGN is set (POSIX). (easycore's own threads in this
    process block every signal, so none can take it meanwhile.)"""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        signal.signal(signum, signal.SIG_IGN)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})


INTERRUPT_SIGNAL = signal.SIGUSR1


def _one_torch_thread() -> None:
    """In a forked producer whose caller had imported torch: one torch thread, as
    DataLoader's forked workers use. torch's OpenMP thread pool does not survive a fork: if
    the caller had used it, the child's copy refers to threads that do not exist there, and
    the child's first operation on several threads waits for them forever. (A torch first
    imported in the producer starts clean; ``producer_init`` may raise the count, at that
    risk.)"""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        try:
            torch.set_num_threads(1)
        except Exception:  # noqa: BLE001 - a broken torch must not stop the producer
            pass


FAULT_ENV = "EASYCORE_TEST_FAULT"


def fault(step: str) -> None:
    """Fault injection for the tests of the hand-over (``_engine/retire.py``): with
    ``EASYCORE_TEST_FAULT=<step>:<folder>`` in the environment, once ``<folder>/armed``
    exists, the first producer to reach ``step`` and create ``<folder>/fired`` (exclusively)
    is SIGKILLed there. Unset (always, outside those tests): one look-up per step."""
    spec = os.environ.get(FAULT_ENV)
    if spec is None or not spec.startswith(step + ":"):
        return
    folder = spec[len(step) + 1 :]
    if not os.path.exists(os.path.join(folder, "armed")):
        return
    try:
        fired = os.open(os.path.join(folder, "fired"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return  # another producer took it
    os.close(fired)
    os.kill(os.getpid(), signal.SIGKILL)


def _put(out_q: Queue, seq: int, kind: int, parts: list[Any], parent_alive: Any) -> bool:
    """Puts a message, giving up (False) if the caller disappears while the queue is full."""
    while True:
        try:
            out_q.put(seq, kind, parts, timeout=_PARENT_CHECK_S)
            return True
        except QueueFull:
            if not parent_alive():
                return False
        except QueueClosed:
            return False


def _send(out_q: Queue, codec: wire.Codec, seq: int, kind: int, obj: Any, alive: Any) -> bool:
    return _put(out_q, seq, kind, codec.dumps(obj), alive)


def _parent_check(owner: str | None, parent_pid: int) -> Any:
    """An ``alive()`` test of the caller: its liveness token (the queues' owner), which the
    kernel vouches for whatever the start method (under forkserver the parent process is the
    fork server, not the caller). Falls back to the parent pid without a token."""
    if owner is None:
        return lambda: os.getppid() == parent_pid
    return lambda: owner_alive(owner)


def producer_main(
    runner_cls: Any,
    index: int,
    device: str,
    cfg: Any,
    in_q: Queue,
    out_q: Queue,
    parent_pid: int,
    setup: Any = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Entry point of a producer process.

    Args:
        runner_cls: the user's runner class (its static hooks are called).
        index: this producer's position in ``devices``.
        device: the device string, passed to every hook.
        cfg: this producer's own copy of the runner's cfg.
        in_q, out_q: the shared-memory queues (attached on unpickling under spawn).
        parent_pid: the caller's pid; the producer exits when it is gone.
        setup: optional callable ``setup(device)`` run first (torch flavour: CUDA device,
            thread counts).
        options: ``n`` (number of producers), ``seed`` (the base seed), ``seed_per_item``,
            ``start_method``, ``state`` (the shared state array: what each producer works
            on, and ``abort_below``), ``codec`` (the flavour's) and ``fix_unsendable`` (see
            ``extension.Extension``).
    """
    try:
        opts = options or {}
        fault("start")
        ignore_signal(signal.SIGINT)
        ignore_signal(INTERRUPT_SIGNAL)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the caller's handler came with fork
        heap.settle()  # arrays made per item are reused from the heap (heap.py)
        if opts.get("start_method") == "fork":
            # A fork holds every queue the caller held: let go of all but this producer's own,
            # or a queue the caller drops while this producer runs keeps its names after it.
            drop_inherited_holds([in_q.name, out_q.name])
        owner = in_q.owner  # the caller: it created the queues
        if owner is not None:
            # Returns at once; if the caller dies, removes its names and ends this process.
            exit_when_dead(owner)
        alive = _parent_check(owner, parent_pid)
        if not alive():
            if owner is not None:  # its names go with it (its other children may be ending too)
                sweep_dead_pids([int(owner.split("-", 1)[0])])
            return
        n = int(opts.get("n", 1))
        state = opts.get("state")
        lifelines = None if state is None else producer_lifelines(state, n)
        if lifelines is not None:
            # Held by this (main) thread for good: the kernel marks it when this process ends.
            # A replacement finds its predecessor's still held: then it holds none (the caller
            # reads no lifelines once a producer was replaced).
            lifelines.hold(index)
        core = ProducerCore(
            runner_cls,
            index,
            n,
            device,
            cfg,
            int(opts.get("seed", 0)),
            setup,
            opts.get("state"),
            seed_per_item=bool(opts.get("seed_per_item", False)),
            codec=opts.get("codec"),
            fix=opts.get("fix_unsendable"),
        )
        core.begin(os.getpid())
        if opts.get("start_method") == "fork":
            _one_torch_thread()
        codec = core.codec
        # easycore.shm's allocators lease from the output queue's pool in this process.
        leases.set_target(out_q, producers=n)
        report = core.init()
        if report is not None:
            _send(out_q, codec, index, wire.ERROR, report, alive)
            return
        fault("ready")
        _put(out_q, index, wire.READY, [repr(core.init_s).encode()], alive)
        fault("first_task")

        def on_interrupt(signum: int, frame: Any) -> None:
            if core.interrupted():
                raise Interrupted

        signal.signal(INTERRUPT_SIGNAL, on_interrupt)
        max_tasks = int(opts.get("max_tasks", 0))  # 0: no bound
        done = 0  # work messages taken (a pool's: one task each, see _engine/retire.py)
        next_alive_check = 0.0
        while True:
            if max_tasks and done >= max_tasks:
                break  # retires: takes no more work
            try:
                seq, kind, parts = in_q.get(timeout=_PARENT_CHECK_S)
            except QueueEmpty:
                if not alive():
                    return  # orphaned: the caller died without closing us
                continue
            except QueueClosed:
                break
            except Interrupted:
                continue
            msg_type, call = kind & 0xFF, kind >> 8  # wire.unpack_kind, inline: per message
            if msg_type == wire.STOP:
                break
            if msg_type != wire.WORK:
                continue
            done += 1
            try:
                t, out, first = core.run(call, parts, in_q.wait_seconds + out_q.wait_seconds)
                del parts
                if t == wire.ERROR:
                    _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), out, alive)
                    continue
                try:
                    kind = (call & 0xFFFFFF) << 8 | wire.RESULT  # wire.pack_kind, inline
                    sent = _put(out_q, seq, kind, out, alive)
                except (SharedMemoryError, OSError) as e:
                    # /dev/shm full or mmap refused: tell the caller how much was asked and
                    # what is free (the queue's message says it) instead of dying.
                    err = error_report("producer_work", device, first, e, "shared_memory")
                    _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, alive)
                    continue
                del out
                leases.after_send()  # arrays sent by reference become read-only
                if not sent:
                    return
                if time.monotonic() >= next_alive_check:
                    if not alive():
                        return
                    next_alive_check = time.monotonic() + _ALIVE_AFTER_SEND_S
            except Interrupted:
                continue  # the caller gave up on this call: drop the batch, wait for the next

        ignore_signal(INTERRUPT_SIGNAL)  # an interrupt for work already done may arrive now
        if max_tasks and done >= max_tasks:
            # Every result of this producer was put: the caller may replace it from now on.
            fault("retire_mark")
            core.mark_retired(os.getpid())
            fault("retire_end")
            said = core.goodbye()
            fault("retire_say")
            _send(out_q, codec, index, wire.RETIRE, (*said, os.getpid()), alive)
            fault("retire_exit")
        else:
            _send(out_q, codec, index, wire.BYE, core.goodbye(), alive)
        if opts.get("start_method") == "fork":
            # A forked multiprocessing child leaves by os._exit, which skips the C atexit hook
            # that removes this process's liveness token (/dev/shm/ec.<pid>-<nonce>.live): every
            # forked producer left one behind until the next sweep. Its work is done and said
            # (BYE), and the caller judges its exit by the process, not the token: retire it now.
            retire_identity()
    finally:
        # Whatever ended it (its caller gone, a retirement, a stop): it lets go of its
        # queues, and removes the names of those it was the last to use (the process ends
        # with os._exit, which drops no handle).
        leave_queues()
