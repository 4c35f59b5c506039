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
import pickle
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from easycore._core import Queue, exit_when_dead, owner_alive, retire_identity
from easycore.common.parallel import leases, wire
from easycore.errors import QueueClosed, QueueEmpty, QueueFull, SharedMemoryError

if TYPE_CHECKING:
    from easycore.common.parallel.engine import BaseRunner

_PARENT_CHECK_S = 0.5

# Layout of the shared state array: ``STATE_FIELDS`` int64 words per producer, then globals.
STATE_FIELDS = 4
# Per producer: the call and item being worked on (ITEM -1: idle), when its batch started, and
# COUNT: 1 when ITEM is tracked item by item, else the batch's size (ITEM is then its first
# item: large batches are only made of cheap items, which are not worth a store each).
CALL, ITEM, SINCE_NS, COUNT = 0, 1, 2, 3
_TRACK_ITEMS = 8  # batches of at most this many items are tracked item by item


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


def state_size(n_producers: int) -> int:
    """Number of int64 words of the shared state array for ``n_producers``."""
    return STATE_FIELDS * n_producers + 1  # the last word: abort_below


@dataclass(frozen=True)
class WorkerInfo:
    """Who the current producer is (see :func:`worker_info`).

    Attributes:
        index (int): this producer's position in the runner's ``devices`` (0-based).
        num_producers (int): how many producers the runner has.
        device (str): this producer's device.
        seed (int): the seed given to ``random``, numpy and torch in this producer
            (the runner's ``seed`` plus ``index``).
        pid (int): this producer's process id.
    """

    index: int
    num_producers: int
    device: str
    seed: int
    pid: int


_INFO: WorkerInfo | None = None


def worker_info() -> WorkerInfo | None:
    """Which producer runs the current hook: a :class:`WorkerInfo` inside a producer process
    (in ``producer_init``, ``producer_work`` and ``producer_end``), None elsewhere (in the
    caller and in the consumer hooks).

    Example::

        @staticmethod
        def producer_work(device, cfg, data):
            info = worker_info()
            return data, info.index, info.num_producers
    """
    return _INFO


class _Interrupted(BaseException):
    """Raised in a producer by the caller's interrupt signal: drop the current batch."""


def _dumps_fixed(work: Any, codec: Any, payload: tuple[Any, ...], device: str) -> list[Any] | None:
    """The batch's results did not pickle: if ``producer_work`` carries a
    ``fix_unsendable(results, device)`` function (the pool's does), the results it returns
    (the culprits replaced by error reports) are pickled instead; else None."""
    fix = getattr(work, "fix_unsendable", None)
    if fix is None:
        return None
    first, results, *rest = payload
    try:
        return codec.dumps((first, fix(results, device), *rest))  # type: ignore[no-any-return]
    except BaseException:  # noqa: BLE001 - reported as the batch's error
        return None


def _seed_all(seed: int, done: set[str]) -> None:
    """Seeds ``random`` and, where they are imported, numpy and torch (each once)."""
    if "random" not in done:
        random.seed(seed)
        done.add("random")
    np = sys.modules.get("numpy")
    if np is not None and "numpy" not in done:
        try:
            np.random.seed(seed % (1 << 32))
        except Exception:  # noqa: BLE001 - a broken numpy must not stop the producer
            pass
        done.add("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and "torch" not in done and hasattr(torch, "manual_seed"):
        try:
            torch.manual_seed(seed)
        except Exception:  # noqa: BLE001
            pass
        done.add("torch")


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


class _SeedOnImport:
    """A ``sys.meta_path`` finder that seeds numpy or torch right after a hook first imports
    them in a producer (importing them up front would slow every producer's start)."""

    def __init__(self, seed: int, done: set[str]) -> None:
        self.seed = seed
        self.done = done

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in ("numpy", "torch") or name in self.done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        real_exec = getattr(loader, "exec_module", None)
        if loader is None or real_exec is None:
            return None
        seed, done = self.seed, self.done

        def exec_module(module: Any) -> None:
            real_exec(module)
            sys.modules[name] = module
            _seed_all(seed, done)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this loader only
        return spec


def safe_str(exc: BaseException) -> str:
    """``"Type: message"`` for an exception, whatever its ``__str__`` does."""
    name = getattr(type(exc), "__qualname__", "exception")
    try:
        text = str(exc)
    except BaseException as e:  # noqa: BLE001 - a broken __str__ must not hide the error
        text = f"<str() of the exception failed: {type(e).__qualname__}>"
    return f"{name}: {text}" if text else name


def _pickled(obj: Any) -> bytes | None:
    try:
        return pickle.dumps(obj, protocol=5)
    except BaseException:  # noqa: BLE001 - not picklable: the caller falls back
        return None


def error_report(
    hook: str, device: str | None, item: int | None, exc: BaseException, kind: str
) -> dict[str, Any]:
    """The picklable description of a hook's exception sent to the caller.

    Never raises, whatever the exception's ``__str__``, ``__repr__`` or pickling do. The
    exception's type and attributes travel pickled (each None if that fails), so the caller
    can raise an error of the same type.
    """
    try:
        tb = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001
        tb = f"{safe_str(exc)}\n(the traceback could not be formatted)"
    try:
        state = dict(vars(exc))
    except TypeError:
        state = {}
    return {
        "hook": hook,
        "device": device,
        "item": item,
        "message": safe_str(exc),
        "traceback": tb,
        "kind": kind,
        "type": _pickled(type(exc)),
        "state": _pickled(state) if state else None,
    }


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
    runner_cls: type[BaseRunner],
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
        options: ``n`` (number of producers), ``seed`` (this producer's seed),
            ``start_method`` and ``state``
            (the shared state array: what each producer works on, and ``abort_below``).
    """
    global _INFO
    opts = options or {}
    ignore_signal(signal.SIGINT)
    ignore_signal(INTERRUPT_SIGNAL)
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the caller's handler came with fork
    owner = in_q.owner  # the caller: it created the queues
    if owner is not None:
        # Returns at once; if the caller dies, removes its names and ends this process.
        exit_when_dead(owner)
    alive = _parent_check(owner, parent_pid)
    if not alive():
        return
    seed = int(opts.get("seed", 0)) + index
    _INFO = WorkerInfo(index, int(opts.get("n", 1)), device, seed, os.getpid())
    seeded: set[str] = set()
    _seed_all(seed, seeded)
    if opts.get("start_method") == "fork":
        _one_torch_thread()
    if not {"numpy", "torch"} <= seeded:
        sys.meta_path.insert(0, _SeedOnImport(seed, seeded))
    raw_state = opts.get("state")
    state = memoryview(raw_state).cast("B").cast("q") if raw_state is not None else None
    me = STATE_FIELDS * index
    abort_word = STATE_FIELDS * int(opts.get("n", 1))

    codec: wire.Codec = runner_cls._codec()
    # easycore.shm's allocators lease from the output queue's pool in this process.
    leases.set_target(out_q, producers=int(opts.get("n", 1)))
    if setup is not None:
        setup(device)
    try:
        runner_cls.producer_init(device, cfg)
    except BaseException as e:  # noqa: BLE001 - reported to the caller, then exit
        report = error_report("producer_init", device, None, e, "hook")
        _send(out_q, codec, index, wire.ERROR, report, alive)
        return
    _send(out_q, codec, index, wire.READY, (index, os.getpid()), alive)

    working_call = [0]

    def on_interrupt(signum: int, frame: Any) -> None:
        call = working_call[0]
        if call and state is not None and call < state[abort_word]:
            raise _Interrupted

    signal.signal(INTERRUPT_SIGNAL, on_interrupt)
    busy = 0.0
    work = runner_cls.producer_work
    while True:
        try:
            seq, kind, parts = in_q.get(timeout=_PARENT_CHECK_S)
        except QueueEmpty:
            if not alive():
                return  # orphaned: the caller died without closing us
            continue
        except QueueClosed:
            break
        except _Interrupted:
            continue
        msg_type, call = wire.unpack_kind(kind)
        if msg_type == wire.STOP:
            break
        if msg_type != wire.WORK:
            continue
        t0 = time.perf_counter()
        try:
            try:
                first, items = codec.loads(parts)
            except BaseException as e:  # noqa: BLE001
                err = error_report("producer_work", device, None, e, "unpickle_item")
                _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, alive)
                continue
            del parts
            if state is not None:
                state[me + SINCE_NS] = time.monotonic_ns()
                state[me + CALL] = call
            working_call[0] = call
            results: list[Any] = []
            append = results.append
            failed = None
            try:
                if state is None:
                    for item in items:
                        append(work(device, cfg, item))
                elif len(items) > _TRACK_ITEMS:
                    state[me + COUNT] = len(items)
                    state[me + ITEM] = first
                    for item in items:
                        append(work(device, cfg, item))
                else:
                    state[me + COUNT] = 1
                    for item in items:
                        state[me + ITEM] = first + len(results)
                        append(work(device, cfg, item))
            except _Interrupted:
                raise
            except BaseException as e:  # noqa: BLE001
                item_index = first + len(results)
                failed = error_report("producer_work", device, item_index, e, "hook")
            working_call[0] = 0
            if state is not None:
                state[me + ITEM] = -1
            busy += time.perf_counter() - t0
            if failed is not None:
                _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), failed, alive)
                continue
            payload = (first, results, index, busy, in_q.wait_seconds + out_q.wait_seconds)
            pickle_error: BaseException | None = None
            out_parts: list[Any] | None
            try:
                out_parts = codec.dumps(payload)
            except BaseException as e:  # noqa: BLE001
                pickle_error = e
                out_parts = _dumps_fixed(work, codec, payload, device)
            if out_parts is None:
                assert pickle_error is not None
                what = wire.describe_unpicklable(results)
                err = error_report("producer_work", device, first, pickle_error, "pickle_result")
                err["message"] = f"the result is not picklable: {what}"
                _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, alive)
                continue
            del results, payload
            try:
                sent = _put(out_q, seq, wire.pack_kind(wire.RESULT, call), out_parts, alive)
            except (SharedMemoryError, OSError) as e:
                # /dev/shm full or mmap refused: tell the caller how much was asked and
                # what is free (the queue's message says it) instead of dying.
                err = error_report("producer_work", device, first, e, "shared_memory")
                _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, alive)
                continue
            del out_parts
            leases.after_send()  # arrays sent by reference become read-only
            if not sent or not alive():
                return
        except _Interrupted:
            # The caller gave up on this call: drop the batch, wait for what comes next.
            working_call[0] = 0
            busy += time.perf_counter() - t0
            if state is not None:
                state[me + ITEM] = -1
            continue

    ignore_signal(INTERRUPT_SIGNAL)  # an interrupt for work already done may arrive now
    end_error = None
    try:
        runner_cls.producer_end(device, cfg)
    except BaseException as e:  # noqa: BLE001
        end_error = error_report("producer_end", device, None, e, "hook")
    _close_nested_runners()
    _send(out_q, codec, index, wire.BYE, (index, end_error), alive)
    if opts.get("start_method") == "fork":
        # A forked multiprocessing child leaves by os._exit, which skips the C atexit hook
        # that removes this process's liveness token (/dev/shm/ec.<pid>-<nonce>.live): every
        # forked producer left one behind until the next sweep. Its work is done and said
        # (BYE), and the caller judges its exit by the process, not the token: retire it now.
        retire_identity()


def _close_nested_runners() -> None:
    """Closes runners the hooks made in this producer and left open. A multiprocessing child
    skips atexit and joins its children on the way out: without this, their producers (which
    wait for their parent, us) would hold us until the caller's close_timeout ran out."""
    engine = sys.modules.get("easycore.common.parallel.engine")
    if engine is not None:
        engine._close_all_at_exit()
