"""Process bodies for test_queue.py (module level, so spawned children can import them)."""

from __future__ import annotations

import hashlib
import os
import signal
import time

from easycore._core import Queue
from easycore.errors import QueueClosed, QueueEmpty

BIG_EVERY = 997  # one message in this many is large


def payload(writer: int, i: int) -> bytes:
    """Deterministic content: mostly small, a spread of large ones up to 32 MiB."""
    if i % BIG_EVERY == 0:
        size = (1 << 20) * (1 + (i // BIG_EVERY) % 32)  # 1..32 MiB
        return bytes([(writer * 31 + i) % 251]) * size
    size = (writer * 7 + i * 13) % 200
    return bytes((k + i + writer) % 256 for k in range(size))


def digest(seq: int, kind: int, parts) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(seq.to_bytes(8, "little"))
    h.update(kind.to_bytes(4, "little"))
    for p in parts:
        h.update(memoryview(p).cast("B"))
    return h.hexdigest()


def writer(q: Queue, w: int, n: int, results) -> None:
    h = 0
    for i in range(n):
        data = payload(w, i)
        parts = [data[:16], data[16:]]
        seq = (w << 32) | i
        q.put(seq, w, parts)
        h ^= int(digest(seq, w, parts), 16)
    results.put(("w", w, n, h))


def reader(q: Queue, results) -> None:
    h = 0
    count = 0
    seqs = []
    while True:
        try:
            msgs = q.get_many(32)
        except QueueClosed:
            break
        for seq, kind, parts in msgs:
            h ^= int(digest(seq, kind, parts), 16)
            count += 1
            seqs.append(seq)
    results.put(("r", os.getpid(), count, h, seqs))


def blocked_get(q: Queue, results) -> None:
    try:
        q.get()
        results.put("got")
    except QueueClosed:
        results.put("closed")


def blocked_put(q: Queue, results) -> None:
    try:
        while True:
            q.put(0, 0, b"x" * 100)
    except QueueClosed:
        results.put("closed")


def hog_writer(q: Queue, ready) -> None:
    """Keeps writing large messages until killed."""
    ready.put(os.getpid())
    big = b"z" * (200 << 10)
    i = 0
    while True:
        q.put(i, 7, [big])
        i += 1


def hog_reader(q: Queue, ready) -> None:
    ready.put(os.getpid())
    while True:
        try:
            q.get(timeout=0.5)
        except QueueEmpty:
            pass


def sleep_then_kill_self(delay: float) -> None:
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGKILL)


def pattern(i: int, nbytes: int) -> bytes:
    """``nbytes`` bytes that differ from message to message and from line to line."""
    import numpy as np

    return (
        ((np.arange(nbytes, dtype=np.uint64) * 2654435761 + i * 40503) >> 11)
        .astype(np.uint8)
        .tobytes()
    )


def pattern_writer(q: Queue, n: int, nbytes: int) -> None:
    """Sends ``n`` messages ``[header, pattern(i, nbytes)]`` with an odd-length header."""
    for i in range(n):
        q.put(i, 0, [b"h" * 1001, pattern(i, nbytes)])


def array_writer(q: Queue, n: int, nbytes: int) -> None:
    """Sends ``n`` numpy arrays of ``nbytes`` whose every byte is ``i % 251`` (pickle 5)."""
    import pickle

    import numpy as np

    for i in range(n):
        a = np.full(nbytes, i % 251, dtype=np.uint8)
        bufs: list = []
        head = pickle.dumps(a, protocol=5, buffer_callback=bufs.append)
        q.put(i, 0, [head, *(b.raw() for b in bufs)])


def hold_and_wait(q: Queue, ready) -> None:
    """Holds ``q`` (attached through its pickle) and says so, then waits to be killed."""
    ready.put(q.name)
    time.sleep(600)
