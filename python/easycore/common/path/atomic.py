"""Create a file once, atomically, however many processes ask for it at the same time."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
from collections.abc import Callable
from typing import BinaryIO

from easycore.common.path.lock import file_lock


def create_once(
    dst: str | os.PathLike[str],
    write: Callable[[BinaryIO], None],
    overwrite: bool = False,
    lock_timeout: float | None = None,
) -> str:
    """Make sure ``dst`` exists, writing it with ``write`` if it does not.

    The content is written to a hidden temporary file beside ``dst`` and renamed onto it
    under ``file_lock(dst)``, so readers never see a partial file and, of many processes
    asking at once, only the first writes; the others wait and then find the file. If
    ``write`` raises, the temporary file is removed and ``dst`` is left as it was. Temporary
    files left by writers that were killed are swept up by the next writer.

    Args:
        dst (str): the file to create. Its folder is created if needed.
        write (callable): called with a binary file open for writing; fills it.
        overwrite (bool): write again even if ``dst`` exists.
        lock_timeout (float or None): seconds to wait for another writer; None uses
            ``file_lock``'s default (30 minutes).

    Returns:
        str: ``dst``.
    """
    dst = os.fspath(dst)
    if not overwrite and os.path.isfile(dst):
        return dst
    parent, base = os.path.split(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    lock = file_lock(dst) if lock_timeout is None else file_lock(dst, timeout=lock_timeout)
    with lock:
        if not overwrite and os.path.isfile(dst):
            return dst  # another process made it while we waited
        for stale in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(base)}.*.part")):
            with contextlib.suppress(OSError):
                os.remove(stale)  # left by a writer that died; we hold the lock, so it is dead
        tmp = os.path.join(parent, f".{base}.{secrets.token_hex(6)}.part")
        try:
            with open(tmp, "xb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    return dst


__all__ = ["create_once"]
