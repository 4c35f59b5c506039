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
