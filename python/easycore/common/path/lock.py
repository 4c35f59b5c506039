"""``file_lock``: an inter-process lock named after the file it guards.

It is easycore's own lock (``easycore._core.FileLock``, on ``flock(2)``), not the ``filelock``
package: see docs/paths.md for why.
"""

from __future__ import annotations

import math
import os

from easycore._core import FileLock
from easycore.errors import InvalidArgument

DEFAULT_LOCK_TIMEOUT: float = 30 * 60.0
"""Seconds ``file_lock`` waits by default before it gives up (30 minutes)."""


def check_lock_timeout(timeout: float | None) -> float | None:
    """Refuse a lock timeout that is not a number of seconds.

    Args:
        timeout (float or None): seconds, ``math.inf`` or None (both wait for ever).

    Returns:
        float or None: ``timeout`` as a float, or None.

    Raises:
        InvalidArgument: ``timeout`` is negative, NaN, or not a number (a ``ValueError``).
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgument(
            f"file_lock timeout must be a number of seconds or None, got {timeout!r}"
        )
    if math.isnan(timeout) or timeout < 0:
        raise InvalidArgument(
            f"file_lock timeout must be a non-negative number of seconds or None (wait for "
            f"ever), got {timeout!r}"
        )
    return float(timeout)


def file_lock(
    path: str | os.PathLike[str], timeout: float | None = DEFAULT_LOCK_TIMEOUT
) -> FileLock:
    """A file lock. Once entered, it is guaranteed that no one else holds the same lock.

    Others trying to enter the lock block for up to ``timeout`` seconds (30 minutes by default)
    and then raise :class:`easycore.errors.EasycoreTimeoutError` (a ``TimeoutError``) that says
    who holds it (a pid, this process, or another thread).

    This is useful to make sure workers don't cache files to the same location. The lock holds
    across processes and across threads: each call makes a new lock object, and threads that
    share one object wait for each other too. A lock held by a process that dies is released by
    the kernel at once. A forked child never releases its parent's lock. The ``.lock`` file is
    left in place.

    Args:
        path (str): a path to be locked. This function will create a lock named
            ``path + ".lock"``, creating its parent folder if needed.
        timeout (float or None): seconds to wait when entered with ``with``; None waits forever.

    Returns:
        FileLock: a lock to use as a context manager (it also has ``acquire``/``release``).
        It is not reentrant: the thread that holds it gets an error if it enters it again.

    Raises:
        InvalidArgument: ``timeout`` is negative or NaN.

    Examples:

    >>> filename = "/path/to/file"
    >>> with file_lock(filename):
    >>>     if not os.path.isfile(filename):
    >>>         do_create_file()
    """
    return FileLock(os.fspath(path) + ".lock", timeout=check_lock_timeout(timeout))


__all__ = ["DEFAULT_LOCK_TIMEOUT", "FileLock", "check_lock_timeout", "file_lock"]
