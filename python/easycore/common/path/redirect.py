"""``RedirectPathHandler``: serve a new prefix from another place, local or remote."""

from __future__ import annotations

from typing import IO, Any

from easycore.common.path.manager import PathManager
from easycore.common.path.path_handler import PathHandler
from easycore.errors import InvalidArgument


class RedirectPathHandler(PathHandler):
    """Redirect a new prefix to existed prefix.

    Every operation on ``new_prefix + rest`` is done by ``PathManager`` on
    ``old_prefix + rest``, so the target may be a local folder or any registered URI.

    Args:
        new_prefix (str): the prefix to serve, e.g. ``"easycore://"``.
        old_prefix (str): what it stands for, e.g. ``"http://xxx.com/download/"``.

    Example:

    ::

        PathManager.register(RedirectPathHandler("easycore://", "http://xxx.com/download/"))
    """

    def __init__(self, new_prefix: str, old_prefix: str) -> None:
        if not isinstance(new_prefix, str) or not new_prefix:
            raise InvalidArgument(f"new_prefix must be a non-empty str, got {new_prefix!r}")
        if not isinstance(old_prefix, str):
            raise InvalidArgument(f"old_prefix must be a str, got {old_prefix!r}")
        self.new_prefix = new_prefix
        self.old_prefix = old_prefix

    def __repr__(self) -> str:
        return f"RedirectPathHandler({self.new_prefix!r}, {self.old_prefix!r})"

    def get_supported_prefixes(self) -> list[str]:
        """
        Returns:
            List[str]: ``[new_prefix]``.
        """
        return [self.new_prefix]

    def redirect(self, path: str) -> str:
        """Redirect path from new_prefix to old_prefix path.

        Args:
            path (str): path of new_prefix.

        Returns:
            str: path of old_prefix.
        """
        if not path.startswith(self.new_prefix):
            raise InvalidArgument(f"{path!r} does not start with {self.new_prefix!r}")
        return self.old_prefix + path[len(self.new_prefix) :]

    def get_local_path(self, path: str, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            local_path (str): a file path which exists on the local file system.
        """
        return PathManager.get_local_path(self.redirect(path), **kwargs)

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``.

        Args:
            path (str): A URI supported by this PathHandler.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.

        Returns:
            IO: a file-like object.
        """
        return PathManager.open(self.redirect(path), mode, **kwargs)

    def exists(self, path: str) -> bool:
        """Checks if there is a resource at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists.
        """
        return PathManager.exists(self.redirect(path))

    def isfile(self, path: str) -> bool:
        """Checks if the resource at the given URI is a file.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a file.
        """
        return PathManager.isfile(self.redirect(path))

    def isdir(self, path: str) -> bool:
        """Checks if the resource at the given URI is a directory.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path is a directory.
        """
        return PathManager.isdir(self.redirect(path))

    def listdir(self, path: str) -> list[str]:
        """List the contents of the directory at the given URI.

        Args:
            path (str): A URI supported by the PathHandler.

        Returns:
            List[str]: list of contents in given path.
        """
        return PathManager.listdir(self.redirect(path))

    def makedirs(self, path: str) -> None:
        """Recursive directory creation function. Similar to ``os.makedirs``.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        PathManager.makedirs(self.redirect(path))

    def remove(self, path: str) -> None:
        """Remove the file (not directory) at the given URI.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        PathManager.remove(self.redirect(path))

    def removedirs(self, path: str) -> None:
        """Remove directories recursively.

        Args:
            path (str): A URI supported by this PathHandler.
        """
        PathManager.removedirs(self.redirect(path))

    def copy_from_local(self, local_path: str, dst_path: str, overwrite: bool = False) -> bool:
        """Copy a local file to the given URI.

        Args:
            local_path (str): a local file path
            dst_path (str): A URI supported by this PathHandler.
            overwrite (bool): forcing overwrite of existing URI.

        Returns:
            bool: True on success.
        """
        return PathManager.copy_from_local(local_path, self.redirect(dst_path), overwrite)


__all__ = ["RedirectPathHandler"]
