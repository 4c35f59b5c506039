"""The producer process: runs ``producer_init``, then ``producer_work`` on every item it
gets from the input queue, and ``producer_end`` when told to stop.

It never hangs on a dead caller: every blocking get wakes at least twice a second to check
that its parent still exists, and it exits if not. It ignores SIGINT, so Ctrl-C in a terminal
reaches only the caller, which then shuts the producers down in order.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any

from easycore._core import Queue
from easycore.common.parallel import wire
from easycore.errors import QueueClosed, QueueEmpty, QueueFull

_PARENT_CHECK_S = 0.5


def _error(hook: str, device: str, item: int | None, exc: BaseException, kind: str) -> dict:
    return {
        "hook": hook,
        "device": device,
        "item": item,
        "message": f"{type(exc).__qualname__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
        "kind": kind,
    }


def _put(out_q: Queue, seq: int, kind: int, parts: list, parent_pid: int) -> bool:
    """Puts a message, giving up (False) if the caller disappears while the queue is full."""
    while True:
        try:
            out_q.put(seq, kind, parts, timeout=_PARENT_CHECK_S)
            return True
        except QueueFull:
            if os.getppid() != parent_pid:
                return False
        except QueueClosed:
            return False


def _send(out_q: Queue, codec: wire.Codec, seq: int, kind: int, obj: Any, parent: int) -> bool:
    return _put(out_q, seq, kind, codec.dumps(obj), parent)


def producer_main(
    runner_cls: type,
    index: int,
    device: str,
    cfg: Any,
    in_q: Queue,
    out_q: Queue,
    parent_pid: int,
    setup: Any = None,
) -> None:
    """Entry point of a producer process.

    Args:
        runner_cls: the user's runner class (its static hooks are called).
        index: this producer's position in ``devices``.
        device: the device string, passed to every hook.
        cfg: this producer's own copy of the runner's cfg.
        in_q, out_q: the shared-memory queues (attached on unpickling under spawn).
        parent_pid: the caller's pid; the producer exits when it is gone.
        setup: optional callable ``setup(device, n_producers)`` run first (torch flavour:
            CUDA device, thread counts).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    codec: wire.Codec = runner_cls._codec()
    if setup is not None:
        setup(device)
    try:
        runner_cls.producer_init(device, cfg)
    except BaseException as e:  # noqa: BLE001 - reported to the caller, then exit
        _send(
            out_q,
            codec,
            index,
            wire.ERROR,
            _error("producer_init", device, None, e, "hook"),
            parent_pid,
        )
        return
    _send(out_q, codec, index, wire.READY, (index, os.getpid()), parent_pid)

    busy = 0.0
    while True:
        try:
            seq, kind, parts = in_q.get(timeout=_PARENT_CHECK_S)
        except QueueEmpty:
            if os.getppid() != parent_pid:
                return  # orphaned: the caller died without closing us
            continue
        except QueueClosed:
            break
        msg_type, call = wire.unpack_kind(kind)
        if msg_type == wire.STOP:
            break
        if msg_type != wire.WORK:
            continue
        try:
            first, items = codec.loads(parts)
        except BaseException as e:  # noqa: BLE001
            err = _error("producer_work", device, None, e, "unpickle_item")
            _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, parent_pid)
            continue
        del parts
        t0 = time.perf_counter()
        results = []
        failed = None
        for i, item in enumerate(items):
            try:
                results.append(runner_cls.producer_work(device, cfg, item))
            except BaseException as e:  # noqa: BLE001
                failed = _error("producer_work", device, first + i, e, "hook")
                break
        busy += time.perf_counter() - t0
        if failed is not None:
            _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), failed, parent_pid)
            continue
        payload = (first, results, index, busy, in_q.wait_seconds + out_q.wait_seconds)
        try:
            out_parts = codec.dumps(payload)
        except BaseException as e:  # noqa: BLE001
            what = wire.describe_unpicklable(results)
            err = _error("producer_work", device, first, e, "pickle_result")
            err["message"] = f"the result is not picklable: {what}"
            _send(out_q, codec, seq, wire.pack_kind(wire.ERROR, call), err, parent_pid)
            continue
        if not _put(out_q, seq, wire.pack_kind(wire.RESULT, call), out_parts, parent_pid):
            return
        del out_parts, results, payload

    end_error = None
    try:
        runner_cls.producer_end(device, cfg)
    except BaseException as e:  # noqa: BLE001
        end_error = _error("producer_end", device, None, e, "hook")
    _send(out_q, codec, index, wire.BYE, (index, end_error), parent_pid)
