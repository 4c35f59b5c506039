"""``PathHandler``: the base class of every path handler."""

from __future__ import annotations

from typing import IO, Any, NoReturn

from easycore.common.path.cache import default_cache_dir
from easycore.common.path.errors import UnsupportedPathOperation
from easycore.common.path.url import redact_url


class PathHandler:
    """Base Path handler class for a URI. It routes I/O for a generic URI which may look like
    "protocol://path/to/file".

    A subclass says which prefixes it serves with :meth:`get_supported_prefixes` and
    implements the operations it supports; the others raise
    :class:`~easycore.common.path.UnsupportedPathOperation`. Register an instance with
    :meth:`PathManager.register`.
    """

    def get_cache_dir(self, protocol: str | None = None) -> str:
        """Return a cache directory like ``<base-cache-dir>/protocol``.

        The ``<base-cache-dir>`` is

        1) ``$EASYCORE_CACHE``, if set
        2) otherwise ``~/.easycore/cache``

        Args:
            protocol (str or None): protocol such as 'http', 'https'. If None, returns the
                base cache dir.

        Returns:
            str: the cache directory.
        """
        return default_cache_dir(protocol)

    def get_supported_prefixes(self) -> list[str]:
        """
        Returns:
            List[str]: the list of URI prefixes the PathHandler can support.
        """
        raise NotImplementedError(f"{type(self).__name__} must define get_supported_prefixes()")

    def get_support_prefixes(self) -> list[str]:
        """Alias of :meth:`get_supported_prefixes`, the spelling of the manual's example.

        A subclass may override either spelling; both then answer the same.
        """
        return self.get_supported_prefixes()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The manual's custom-handler example overrides ``get_support_prefixes``: make
        # ``get_supported_prefixes`` of such a class answer the same.
        super().__init_subclass__(**kwargs)
        if "get_support_prefixes" in cls.__dict__ and "get_supported_prefixes" not in cls.__dict__:
            cls.get_supported_prefixes = cls.__dict__["get_support_prefixes"]  # type: ignore[method-assign]

    def _unsupported(self, operation: str, path: str) -> NoReturn:
        raise UnsupportedPathOperation(
            f"{type(self).__name__} does not support {operation}() (path {redact_url(path)!r})"
        )

    def get_local_path(self, path: str, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            local_path (str): a file path which exists on the local file system.
        """
        self._unsupported("get_local_path", path)

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``.

        Args:
            path (str): A URI supported by this PathHandler.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.

        Returns:
            IO: a file-like object.
        """
        self._unsupported("open", path)

    def exists(self, path: str) -> bool:
        """Checks if there is a resource at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists.
        """
        self._unsupported("exists", path)

    def isfile(self, path: str) -> bool:
        """Checks if the resource at the given URI is a file.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a file.
        """
        self._unsupported("isfile", path)

    def isdir(self, path: str) -> bool:
        """Checks if the resource at the given URI is a directory.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a directory.
        """
        self._unsupported("isdir", path)

    def listdir(self, path: str) -> list[str]:
        """List the contents of the directory at the given URI.

        Args:
            path (str): A URI supported by the PathHandler.

        Returns:
            List[str]: list of contents in given path.
        """
        self._unsupported("listdir", path)

    def makedirs(self, path: str) -> None:
        """Recursive directory creation function. Similar to ``os.makedirs``.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        self._unsupported("makedirs", path)

    def remove(self, path: str) -> None:
        """Remove the file (not directory) at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        self._unsupported("remove", path)

    def removedirs(self, path: str) -> None:
        """Remove directories recursively.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        self._unsupported("removedirs", path)

    def copy_from_local(self, local_path: str, dst_path: str, overwrite: bool = False) -> bool:
        """Copy a local file to the given URI.

        Args:
            local_path (str): a local file path
            dst_path (str): A URI supported by this PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success, False if ``dst_path`` exists and ``overwrite`` is False.
        """
        self._unsupported("copy_from_local", dst_path)


__all__ = ["PathHandler"]
