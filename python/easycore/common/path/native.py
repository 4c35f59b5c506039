"""``NativePathHandler``: paths on the local file system."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from typing import IO, Any

from easycore.common.path.path_handler import PathHandler

logger = logging.getLogger(__name__)


class NativePathHandler(PathHandler):
    """PathHandler for local path.

    It serves every path that no registered prefix claims; each method is the ``os`` /
    ``os.path`` function of the same name.
    """

    def get_supported_prefixes(self) -> list[str]:
        """
        Returns:
            List[str]: no prefix: the native handler is the fallback for every other path.
        """
        return []

    def get_local_path(self, path: str, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            local_path (str): the path itself.
        """
        return os.fspath(path)

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``.

        Args:
            path (str): A URI supported by this PathHandler.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.
            other: arguments of built-in ``open`` such as ``encoding``.

        Returns:
            IO: a file-like object.
        """
        return open(path, mode, **kwargs)

    def exists(self, path: str) -> bool:
        """Checks if there is a resource at the given URI, like ``os.path.exists``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists.
        """
        return os.path.exists(path)

    def isfile(self, path: str) -> bool:
        """Checks if the resource at the given URI is a file, like ``os.path.isfile``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a file.
        """
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        """Checks if the resource at the given URI is a directory, like ``os.path.isdir``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a directory.
        """
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        """List the contents of the directory at the given URI, like ``os.listdir``.

        Args:
            path (str): A URI supported by the PathHandler.

        Returns:
            List[str]: list of contents in given path.
        """
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        """Recursive directory creation function, like ``os.makedirs(path, exist_ok=True)``.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        """Remove the file (not directory) at the given URI, like ``os.remove``.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        os.remove(path)

    def removedirs(self, path: str) -> None:
        """Remove directories recursively, like ``os.removedirs``: the leaf directory must be
        empty; its parents are then removed while they are empty.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        os.removedirs(path)

    def copy_from_local(self, local_path: str, dst_path: str, overwrite: bool = False) -> bool:
        """Copy a local file to the given URI.

        If ``dst_path`` is an existing directory, the file is copied into it under its own
        name. The copy is written beside the destination and renamed onto it, so no reader
        sees a partial file.

        Args:
            local_path (str): a local file path
            dst_path (str): A URI supported by this PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success, False (and a logged warning) if the destination exists and
            ``overwrite`` is False.
        """
        dst = os.fspath(dst_path)
        if os.path.isdir(dst):
            dst = os.path.join(dst, os.path.basename(os.fspath(local_path)))
        if os.path.exists(dst) and not overwrite:
            logger.warning("not copying to %s: it exists (pass overwrite=True)", dst)
            return False
        parent, base = os.path.split(os.path.abspath(dst))
        tmp = os.path.join(parent, f".{base}.{secrets.token_hex(6)}.part")
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return True


__all__ = ["NativePathHandler"]
