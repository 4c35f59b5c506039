"""Module-level functions for the tests of workers that retire (importable by spawned
workers)."""

from __future__ import annotations

import os
import time


def pid_of(x: int) -> tuple[int, int]:
    """``(x, the worker's pid)``."""
    return x, os.getpid()


def pids_of(*xs: int) -> tuple[tuple[int, ...], int]:
    """``(xs, the worker's pid)`` (a ``starmap`` task)."""
    return xs, os.getpid()


def hold_until(path: str, limit: float) -> int:
    """Runs until ``path`` exists (at most ``limit`` seconds); returns the worker's pid."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.getpid()


def exit_pid() -> int:
    """A ``worker_exit``: the worker's pid."""
    return os.getpid()


def barrier(folder: str, n: int, limit: float) -> int:
    """Says it runs (a file named by its pid in ``folder``), then waits until ``n`` tasks do
    (at most ``limit`` seconds): ``n`` such tasks at once run in ``n`` different workers.
    Returns the worker's pid."""
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + limit
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def stuck_in_c_saying(path: str, seconds: float = 300.0) -> None:
    """Creates ``path``, then blocks in C with SIGALRM blocked (``pool_defs.stuck_in_c``)."""
    import pool_defs

    open(path, "w").close()
    pool_defs.stuck_in_c(0, seconds)
