"""``FsspecPathHandler``: every fsspec protocol (``s3://``, ``gs://``, ``memory://``, ...).

fsspec is an optional dependency (``pip install 'easycore[fsspec]'``): this module imports
without it, and :class:`FsspecPathHandler` raises ``ImportError`` only when it is built.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import posixpath
import re
import shutil
from collections.abc import Sequence
from types import ModuleType
from typing import IO, Any, cast

from easycore.common.path.atomic import create_once
from easycore.common.path.cache import LOCK_AREA, cache_file_path, lock_file_path
from easycore.common.path.path_handler import PathHandler
from easycore.errors import InvalidArgument

logger = logging.getLogger(__name__)

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_PROTOCOLS = frozenset({"file", "local"})


@functools.cache
def _fsspec() -> ModuleType | None:
    try:
        import fsspec
    except ImportError:
        return None
    return cast(ModuleType, fsspec)  # untyped (ignore_missing_imports): Any to mypy


class FsspecPathHandler(PathHandler):
    """PathHandler for the file systems of `fsspec <https://filesystem-spec.readthedocs.io>`_.

    ``PathManager`` builds one lazily for any path whose scheme fsspec knows and that no
    registered prefix claims. Register one yourself to pass options to the file system::

        PathManager.register(FsspecPathHandler("s3", anon=True))

    Args:
        protocols (str or List[str]): fsspec protocol names, such as ``"s3"`` or
            ``["gs", "gcs"]``; the handler serves ``<protocol>://``.
        storage_options: keyword arguments for the file system (credentials, endpoints).
    """

    def __init__(self, protocols: str | Sequence[str], **storage_options: Any) -> None:
        fsspec = _fsspec()
        if fsspec is None:
            raise ImportError(
                "FsspecPathHandler needs fsspec: pip install 'easycore[fsspec]' (or fsspec)"
            )
        names = [protocols] if isinstance(protocols, str) else list(protocols)
        if not names or not all(isinstance(p, str) and p and "://" not in p for p in names):
            raise InvalidArgument(f"protocols must be names such as 's3', got {protocols!r}")
        self.protocols = names
        self.storage_options = storage_options

    def __repr__(self) -> str:
        return f"FsspecPathHandler({self.protocols!r})"

    def get_supported_prefixes(self) -> list[str]:
        """
        Returns:
            List[str]: ``<protocol>://`` for each protocol.
        """
        return [f"{p}://" for p in self.protocols]

    def _resolve(self, path: str) -> tuple[Any, str]:
        """The file system of ``path`` and the path within it."""
        fs, inner = _fsspec().core.url_to_fs(path, **self.storage_options)  # type: ignore[union-attr]
        return fs, inner

    def get_local_path(self, path: str, force: bool = False, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``: the remote file is copied once into ``get_cache_dir(<protocol>)``.

        Args:
            path (str): A URI supported by this PathHandler.
            force (bool): copy it again even if it is cached.

        Returns:
            local_path (str): a file path which exists on the local file system.
        """
        protocol = path.split("://", 1)[0]
        fs, inner = self._resolve(path)
        if protocol in _LOCAL_PROTOCOLS:
            return inner

        def write(out: IO[bytes]) -> None:
            with fs.open(inner, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)

        dst = cache_file_path(self.get_cache_dir(protocol), path)
        area = os.path.join(self.get_cache_dir(protocol), LOCK_AREA)
        return create_once(dst, write, overwrite=force, lock_path=lock_file_path(dst, area))

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``.

        Args:
            path (str): A URI supported by this PathHandler.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.
            other: ``encoding``, ``errors``, ``newline`` for text modes, and the file
                system's own options.

        Returns:
            IO: a file-like object.
        """
        fs, inner = self._resolve(path)
        return cast(IO[Any], fs.open(inner, mode, **kwargs))

    def exists(self, path: str) -> bool:
        """Checks if there is a resource at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists.
        """
        fs, inner = self._resolve(path)
        return bool(fs.exists(inner))

    def isfile(self, path: str) -> bool:
        """Checks if the resource at the given URI is a file.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a file.
        """
        fs, inner = self._resolve(path)
        return bool(fs.isfile(inner))

    def isdir(self, path: str) -> bool:
        """Checks if the resource at the given URI is a directory.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a directory.
        """
        fs, inner = self._resolve(path)
        return bool(fs.isdir(inner))

    def listdir(self, path: str) -> list[str]:
        """List the contents of the directory at the given URI, names only (like
        ``os.listdir``).

        Args:
            path (str): A URI supported by the PathHandler.

        Returns:
            List[str]: list of contents in given path.
        """
        fs, inner = self._resolve(path)
        if not fs.isdir(inner):
            if fs.exists(inner):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return sorted(posixpath.basename(e.rstrip("/")) for e in fs.ls(inner, detail=False))

    def makedirs(self, path: str) -> None:
        """Recursive directory creation function. Similar to ``os.makedirs``.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        fs, inner = self._resolve(path)
        fs.makedirs(inner, exist_ok=True)

    def remove(self, path: str) -> None:
        """Remove the file (not directory) at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        fs, inner = self._resolve(path)
        if fs.isdir(inner):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not fs.exists(inner):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        fs.rm_file(inner)

    def removedirs(self, path: str) -> None:
        """Remove directories recursively, like ``os.removedirs``: the leaf directory must be
        empty; its parents are then removed while they are empty. The top-level component
        (a bucket, say) is never removed.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        fs, inner = self._resolve(path)
        if fs.ls(inner, detail=False):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
        fs.rmdir(inner)
        parent = posixpath.dirname(inner.rstrip("/"))
        while parent.strip("/").count("/") >= 1:
            try:
                if fs.ls(parent, detail=False):
                    break
                fs.rmdir(parent)
            except OSError:
                break
            parent = posixpath.dirname(parent)

    def copy_from_local(self, local_path: str, dst_path: str, overwrite: bool = False) -> bool:
        """Copy a local file to the given URI (into it, if it is a directory).

        Args:
            local_path (str): a local file path
            dst_path (str): A URI supported by this PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success, False (and a logged warning) if the destination exists and
            ``overwrite`` is False.
        """
        fs, inner = self._resolve(dst_path)
        if fs.isdir(inner):
            inner = posixpath.join(inner, os.path.basename(local_path))
        if fs.exists(inner) and not overwrite:
            logger.warning("not copying to %s: it exists (pass overwrite=True)", dst_path)
            return False
        fs.put_file(local_path, inner)
        return True


_fallbacks: dict[str, FsspecPathHandler] = {}


def fsspec_fallback(path: str) -> FsspecPathHandler | None:
    """The fsspec handler for ``path`` if fsspec is installed and knows its scheme, else None.

    Used by ``PathManager`` for paths that no registered prefix claims; one handler per
    protocol is built on first use.
    """
    match = _SCHEME.match(path)
    if match is None:
        return None
    protocol = match.group(1)
    handler = _fallbacks.get(protocol)
    if handler is None:
        fsspec = _fsspec()
        if fsspec is None or protocol not in fsspec.available_protocols():
            return None
        handler = _fallbacks.setdefault(protocol, FsspecPathHandler(protocol))
    return handler


__all__ = ["FsspecPathHandler", "fsspec_fallback"]
