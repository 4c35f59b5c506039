"""``file_lock``: an inter-process lock named after the file it guards."""

from __future__ import annotations

import os

from easycore._core import FileLock

DEFAULT_LOCK_TIMEOUT: float = 30 * 60.0
"""Seconds ``file_lock`` waits by default before it gives up (30 minutes)."""


def file_lock(
    path: str | os.PathLike[str], timeout: float | None = DEFAULT_LOCK_TIMEOUT
) -> FileLock:
    """A file lock. Once entered, it is guaranteed that no one else holds the same lock.

    Others trying to enter the lock block for up to ``timeout`` seconds (30 minutes by default)
    and then raise :class:`easycore.errors.EasycoreTimeoutError` (a ``TimeoutError``).

    This is useful to make sure workers don't cache files to the same location. The lock holds
    across processes and across threads (each call makes a new lock object); a lock held by a
    process that dies is released by the kernel at once. The ``.lock`` file is left in place:
    deleting it while others may wait on it would let two holders in.

    Args:
        path (str): a path to be locked. This function will create a lock named
            ``path + ".lock"``, creating its parent folder if needed.
        timeout (float or None): seconds to wait when entered with ``with``; None waits forever.

    Returns:
        FileLock: a lock to use as a context manager (it also has ``acquire``/``release``).
        It is not reentrant: do not enter the same object twice.

    Examples:

    >>> filename = "/path/to/file"
    >>> with file_lock(filename):
    >>>     if not os.path.isfile(filename):
    >>>         do_create_file()
    """
    return FileLock(os.fspath(path) + ".lock", timeout=timeout)


__all__ = ["DEFAULT_LOCK_TIMEOUT", "FileLock", "file_lock"]
