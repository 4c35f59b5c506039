"""Module-level functions for the pool tests (importable by spawned workers)."""

from __future__ import annotations

import os
import signal
import time

from easycore.parallel import context, worker_info


class CustomError(Exception):
    """An exception type of the user's, with an attribute."""

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.code = code


def square(x):
    return x * x


def first(x):
    """``x[0]`` as an int: a cheap function of a large argument (an array or bytes)."""
    return int(x[0])


def nap(x, seconds):
    time.sleep(seconds)
    return x


def add(a, b):
    return a + b


def kwargs_fn(a, b=0, *, c=0):
    return a + b + c


def raise_on(x, bad, kind):
    if x == bad:
        if kind == "value":
            raise ValueError(f"bad value {x}")
        if kind == "key":
            raise KeyError(x)
        if kind == "custom":
            raise CustomError(f"custom {x}", code=x)
    return x


def die_on(x, bad):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def wait_for(path, value=None, limit=60.0):
    """Waits (at most ``limit`` s) until ``path`` exists; returns ``value``."""
    end = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)
    return value


def mark(path, value):
    """Creates ``path`` (proof that the task ran); returns ``value``."""
    with open(path, "w") as f:
        f.write("ran")
    return value


def who(_=None):
    info = worker_info()
    return info.index, info.device, info.pid, context()


def make_ctx(tag):
    return {"tag": tag, "index": worker_info().index, "pid": os.getpid()}


def fail_init():
    raise CustomError("initializer failed", code=7)


def queue_writer(q, w, n):
    """Puts ``(w, i, array)`` for i < n, some with numpy payloads, half through put_many."""
    import numpy as np

    items = [(w, i, np.full(1 + (i % 5) * 50_000, i, dtype=np.int64)) for i in range(n)]
    half = n // 2
    for it in items[:half]:
        q.put(it)
    q.put_many(items[half:])


def queue_writer_then_exit(q, w, n):
    """:func:`queue_writer`, then a bare ``os._exit(0)``: no exit handler of any kind runs."""
    queue_writer(q, w, n)
    os._exit(0)


def queue_reader(q, out, n):
    """Gets until ``n`` objects arrived (get and get_many), then reports what it saw to ``out``."""
    seen = []
    while len(seen) < n:
        for w, i, arr in q.get_many(16, timeout=60):
            assert int(arr[0]) == i and int(arr[-1]) == i
            seen.append((w, i))
    out.put(seen)


def mark_then_wait(args):
    """``(mine, theirs)``: creates ``mine``, then waits (at most 30 s) until ``theirs``
    exists; returns whether it does."""
    mine, theirs = args
    mark(mine, None)
    wait_for(theirs, limit=30.0)
    return os.path.exists(theirs)


def queue_owner(conn):
    """Makes a Queue, puts "left" in it, sends it on ``conn``, then waits to be killed."""
    from easycore.parallel import Queue

    q = Queue(capacity_bytes=1 << 16, max_messages=4)
    q.put("left")
    conn.send(q)
    conn.recv()  # never answered: the test kills this process


def keep_counter(counter):
    """Initializer: the worker's context is a shared counter of items run."""
    return counter


def count_and_sleep(x):
    """Counts the item in the context's shared counter, then takes a little time."""
    counter = context()
    with counter.get_lock():
        counter.value += 1
    time.sleep(0.005)
    return x


def call_it(f, *args):
    """Calls ``f`` (an argument that may be a lambda) with ``args``."""
    return f(*args)


def kinds(*args, **kwargs):
    """What arrived: each argument's type name and CRC-32 (positional, then by keyword)."""
    import zlib

    return [(type(a).__name__, zlib.crc32(a)) for a in args], {
        k: (type(v).__name__, zlib.crc32(v)) for k, v in kwargs.items()
    }


def augment(i):
    """Draws from the global random and numpy generators, as a Dataset's augmentation does."""
    import random

    import numpy as np

    if i % 5 == 0:
        time.sleep(0.002)  # uneven work: scheduling differs from run to run
    return (i, random.random(), float(np.random.rand()), int(np.random.randint(0, 1 << 30)))


def fill_(t, value):
    """Fills the tensor ``t`` in place; returns its sum."""
    t.fill_(value)
    return float(t.sum())


def same(x):
    return x


def count_init():
    return {"tasks": 0, "pid": os.getpid()}


def counted(x):
    from easycore.parallel import context

    context()["tasks"] += 1
    return x


def count_exit():
    from easycore.parallel import context

    return dict(context())


def stuck_in_c(x, seconds=300.0):
    """Returns ``x`` after ``seconds`` in C (``libc.pause``, called again when a signal wakes
    it) with SIGALRM blocked: the pool's ``task_timeout`` timer cannot interrupt it."""
    import ctypes

    libc = ctypes.CDLL(None)
    end = time.monotonic() + seconds
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        while time.monotonic() < end:
            libc.pause()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    return x


def cleans_up(x, seconds):
    """Waits for the pool's ``task_timeout``, then cleans up for ``seconds`` (in Python, the
    timer already spent) and returns ``("cleaned", x)``."""
    try:
        time.sleep(300)
    except TimeoutError:
        time.sleep(seconds)
        return ("cleaned", x)
    return ("not stopped", x)


class ExitAtPickle:
    """A result whose pickling ends the process (``sys.exit``), as CPython's executor tests
    make one."""

    def __reduce__(self):
        import sys

        sys.exit(3)


def exit_at_pickle(_: object = None) -> ExitAtPickle:
    return ExitAtPickle()


def exit_at_pickle_at_2(i: int) -> object:
    """Item 2's result exits as it is pickled; the others are themselves."""
    return ExitAtPickle() if i == 2 else i


def exit_at_pickle_then_raise(i: int) -> object:
    """Item 0's result exits as it is pickled, item 1 raises, the others are themselves: a
    chunk of them fails with item 0's result among its partial results."""
    if i == 0:
        return ExitAtPickle()
    if i == 1:
        raise ValueError("item 1 failed")
    return i
