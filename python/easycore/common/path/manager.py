"""``PathManager``: one set of static methods for every kind of path, routed by prefix."""

from __future__ import annotations

import os
import threading
from typing import IO, Any, ClassVar

from easycore.common.path.errors import PrefixTakenError
from easycore.common.path.fsspec_handler import fsspec_fallback
from easycore.common.path.http_handler import HTTPURLHandler
from easycore.common.path.native import NativePathHandler
from easycore.common.path.path_handler import PathHandler
from easycore.errors import InvalidArgument

PathLike = str | os.PathLike[str]


class PathManager:
    """A general path manager for URI.

    A path goes to the handler registered for its longest matching prefix. A path that no
    prefix claims goes to the fsspec handler when its scheme (``memory://``, ``s3://``, ...)
    is an fsspec protocol and fsspec is installed, otherwise to the native handler. Handlers
    for ``http://``, ``https://`` and ``ftp://`` are registered from the start.
    """

    _handlers: ClassVar[dict[str, PathHandler]] = {}
    _order: ClassVar[tuple[str, ...]] = ()  # registered prefixes, longest first
    _native: ClassVar[PathHandler] = NativePathHandler()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @staticmethod
    def register(handler: PathHandler, override: bool = False) -> None:
        """Register a path handler.

        Args:
            handler (PathHandler):
            override (bool): allow overriding existing handler for prefix.

        Raises:
            PrefixTakenError: a prefix of ``handler`` is taken and ``override`` is False
                (nothing is registered then).
        """
        if not isinstance(handler, PathHandler):
            raise InvalidArgument(f"expected a PathHandler, got {type(handler).__name__}")
        prefixes = list(handler.get_supported_prefixes())
        if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
            raise InvalidArgument(
                f"{type(handler).__name__}.get_supported_prefixes() must return non-empty "
                f"strings, got {prefixes!r}"
            )
        with PathManager._lock:
            taken = [p for p in prefixes if p in PathManager._handlers]
            if taken and not override:
                holders = ", ".join(
                    f"{p!r} by {type(PathManager._handlers[p]).__name__}" for p in taken
                )
                raise PrefixTakenError(
                    f"cannot register {type(handler).__name__}: prefix taken ({holders}); "
                    "pass override=True to replace the existing handler"
                )
            handlers = dict(PathManager._handlers)
            handlers.update(dict.fromkeys(prefixes, handler))
            PathManager._set(handlers)

    @staticmethod
    def unregister(prefix: str) -> PathHandler:
        """Remove the handler of one prefix (paths with it go back to the default routing).

        Args:
            prefix (str): a registered prefix.

        Returns:
            PathHandler: the handler that served it.
        """
        with PathManager._lock:
            handlers = dict(PathManager._handlers)
            if prefix not in handlers:
                raise InvalidArgument(
                    f"no handler is registered for {prefix!r}; registered: {sorted(handlers)}"
                )
            handler = handlers.pop(prefix)
            PathManager._set(handlers)
        return handler

    @staticmethod
    def _set(handlers: dict[str, PathHandler]) -> None:
        PathManager._handlers = handlers
        PathManager._order = tuple(sorted(handlers, key=len, reverse=True))

    @staticmethod
    def registered_prefixes() -> list[str]:
        """
        Returns:
            List[str]: the registered prefixes, longest first (the order they are tried in).
        """
        return list(PathManager._order)

    @staticmethod
    def get_handler(path: PathLike) -> PathHandler:
        """The handler that serves ``path``.

        Args:
            path (str): A URI or local path.

        Returns:
            PathHandler: the handler of its longest registered prefix; else the fsspec handler
            for an fsspec protocol (if fsspec is installed); else the native handler.
        """
        path = os.fspath(path)
        handlers = PathManager._handlers
        for prefix in PathManager._order:
            if path.startswith(prefix):
                return handlers[prefix]
        return fsspec_fallback(path) or PathManager._native

    @staticmethod
    def open(path: PathLike, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``.

        Args:
            path (str): A URI supported by registered ``PathHandler``.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.
            other: arguments of built-in open such as encoding are also available.

        Returns:
            IO: a file-like object.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).open(path, mode, **kwargs)

    @staticmethod
    def copy(src_path: PathLike, dst_path: PathLike, overwrite: bool = False) -> bool:
        """Copy a source path to a destination path.

        The source is fetched to a local file (``get_local_path``) and handed to the
        destination's handler (``copy_from_local``), so any two handlers can be combined.

        Args:
            src_path (str): A URI or local path supported by registered PathHandler.
            dst_path (str): A URI or local path supported by registered PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success; False if the destination exists and ``overwrite`` is False.
        """
        local_path = PathManager.get_local_path(src_path)
        return PathManager.copy_from_local(local_path, dst_path, overwrite)

    @staticmethod
    def copy_from_local(local_path: PathLike, dst_path: PathLike, overwrite: bool = False) -> bool:
        """Copy a resource form local path to destination path.

        Note:
            This interface is for custom PathHandler, it is prefered to use ``copy()`` instead.

        Args:
            local_path (str): a local path.
            dst_path (str): A URI supported by registered PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success; False if the destination exists and ``overwrite`` is False.
        """
        dst_path = os.fspath(dst_path)
        handler = PathManager.get_handler(dst_path)
        return handler.copy_from_local(os.fspath(local_path), dst_path, overwrite)

    @staticmethod
    def get_local_path(path: PathLike, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``.

        Note:
            If URI points to a remote resource, this function may download and cache the
            resource to local disk.

        Args:
            path (str): A URI supported by registered PathHandler.
            other: handler options, e.g. ``force=True`` to download a cached URL again.

        Returns:
            str: a file path which exists on the local file system.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).get_local_path(path, **kwargs)

    @staticmethod
    def exists(path: PathLike) -> bool:
        """Checks if there is a resource at the given URI.

        Args:
            path (str): A URI supported by registered PathHandler.

        Returns:
            bool: True if the path exists.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).exists(path)

    @staticmethod
    def isfile(path: PathLike) -> bool:
        """Checks if there the resource at the given URI is a file.

        Args:
            path (str): A URI supported by registered PathHandler.

        Returns:
            bool: True if the path is a file.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).isfile(path)

    @staticmethod
    def isdir(path: PathLike) -> bool:
        """Checks if the resource at the given URI is a directory.

        Args:
            path (str): A URI supported by registered PathHandler.

        Returns:
            bool: True if the path is a directory.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).isdir(path)

    @staticmethod
    def listdir(path: PathLike) -> list[str]:
        """List the contents of the directory at the given URI.

        Args:
            path (str): A URI supported by registered PathHandler.

        Returns:
            List[str]: list of contents in the given path.
        """
        path = os.fspath(path)
        return PathManager.get_handler(path).listdir(path)

    @staticmethod
    def makedirs(path: PathLike) -> None:
        """Recursive directory creation function. Similar to ``os.makedirs()``.

        Args:
            path (str): A URI supported by registered PathHandler.
        """
        path = os.fspath(path)
        PathManager.get_handler(path).makedirs(path)

    @staticmethod
    def remove(path: PathLike) -> None:
        """Remove the file (not directory) at the given URI.

        Args:
            path (str): A URI supported by registered PathHandler.
        """
        path = os.fspath(path)
        PathManager.get_handler(path).remove(path)

    @staticmethod
    def removedirs(path: PathLike) -> None:
        """Remove directories recursively.

        Args:
            path (str): A URI supported by registered PathHandler.
        """
        path = os.fspath(path)
        PathManager.get_handler(path).removedirs(path)


PathManager.register(HTTPURLHandler())

__all__ = ["PathManager"]
