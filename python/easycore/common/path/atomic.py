"""Create a file once, atomically, however many processes ask for it at the same time."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
from collections.abc import Callable
from typing import BinaryIO

from easycore._core import FileLock
from easycore.common.path.lock import DEFAULT_LOCK_TIMEOUT, check_lock_timeout, file_lock

_TRIES = 8


def _missing_dirs(folder: str) -> list[str]:
    """The folders ``os.makedirs(folder)`` would create, deepest first."""
    missing: list[str] = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def _remove_empty(folders: list[str]) -> None:
    """Remove each folder in ``folders`` (deepest first) that is empty; leave the rest."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _open_part(parent: str, base: str) -> tuple[str, BinaryIO]:
    """Create and open a new hidden temporary file for ``base`` in ``parent``, making
    ``parent`` first; again if another process removed an emptied folder in between."""
    for attempt in range(_TRIES):
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{base}.{secrets.token_hex(6)}.part")
        try:
            return tmp, open(tmp, "xb")  # noqa: SIM115 (closed by the caller)
        except FileNotFoundError:
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


def create_once(
    dst: str | os.PathLike[str],
    write: Callable[[BinaryIO], object],
    overwrite: bool = False,
    lock_timeout: float | None = None,
    lock_path: str | os.PathLike[str] | None = None,
) -> str:
    """Make sure ``dst`` exists, writing it with ``write`` if it does not.

    The content is written to a hidden temporary file beside ``dst`` and renamed onto it
    under a lock, so readers never see a partial file and, of many processes asking at once,
    only the first writes; the others wait and then find the file. If ``write`` raises, the
    temporary file is removed, so are the folders this call made for ``dst`` (when empty), and
    ``dst`` is left as it was. Temporary files left by writers that were killed are swept up by
    the next writer.

    Args:
        dst (str): the file to create. Its folder is created if needed.
        write (callable): called with a binary file open for writing; fills it.
        overwrite (bool): write again even if ``dst`` exists.
        lock_timeout (float or None): seconds to wait for another writer; None uses
            ``file_lock``'s default (30 minutes).
        lock_path (str or None): the lock file to use, e.g. one in the cache's lock area
            (:func:`~easycore.common.path.cache.lock_file_path`); it is removed before the lock
            is let go, and its folder too once empty. None uses ``file_lock(dst)``, whose
            ``dst + ".lock"`` stays.

    Returns:
        str: ``dst``.
    """
    dst = os.fspath(dst)
    if not overwrite and os.path.isfile(dst):
        return dst
    parent, base = os.path.split(os.path.abspath(dst))
    made = _missing_dirs(parent)
    timeout = DEFAULT_LOCK_TIMEOUT if lock_timeout is None else check_lock_timeout(lock_timeout)
    if lock_path is None:
        lock = file_lock(dst, timeout=timeout)
        lock_dir = None
    else:
        lock_path = os.fspath(lock_path)
        lock = FileLock(lock_path, timeout=timeout)
        lock_dir = os.path.dirname(lock_path)
    lock_made = [] if lock_dir is None else _missing_dirs(lock_dir)
    done = False
    try:
        with lock:
            try:
                if not overwrite and os.path.isfile(dst):
                    done = True
                    return dst  # another process made it while we waited
                _write_atomically(dst, parent, base, write)
                done = True
            finally:
                if not done:
                    _remove_empty(made)
                if lock_path is not None:
                    # Safe while we hold it: a waiter that then locks the removed file sees
                    # that the path no longer names it, and tries again (see FileLock).
                    with contextlib.suppress(OSError):
                        os.remove(lock_path)
    finally:
        _remove_empty(lock_made)
        if not done:
            _remove_empty(made)  # a folder that held the lock area is empty now
    return dst


def _write_atomically(
    dst: str, parent: str, base: str, write: Callable[[BinaryIO], object]
) -> None:
    """Write ``dst`` through a temporary file in ``parent``; the caller holds the lock."""
    if os.path.isdir(parent):
        pattern = os.path.join(glob.escape(parent), f".{glob.escape(base)}.*.part")
        for stale in glob.glob(pattern):
            with contextlib.suppress(OSError):
                os.remove(stale)  # left by a writer that died; we hold the lock, so it is dead
    tmp, f = _open_part(parent, base)
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


__all__ = ["create_once"]
