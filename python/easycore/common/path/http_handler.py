"""``HTTPURLHandler``: http, https and ftp URLs, downloaded once into a local cache."""

from __future__ import annotations

import os
import urllib.error
from typing import IO, Any

from easycore.common.path.cache import LOCK_AREA, cache_file_path, lock_file_path
from easycore.common.path.errors import DownloadError
from easycore.common.path.fetch import DEFAULT_TIMEOUT, download_url, open_url
from easycore.common.path.path_handler import PathHandler
from easycore.common.path.url import parse_url, redact_url

_WRITE_MODES = frozenset("wax+")


class HTTPURLHandler(PathHandler):
    """Download URLs and cache them to disk.

    A remote file is downloaded once into ``get_cache_dir(<protocol>)`` and served from there
    afterwards; the download is atomic (a temporary file renamed under a lock kept in the
    cache's ``.locks`` folder), so processes asking at once download it once and never see a
    partial file; a failed download leaves nothing in the cache. The handler is
    read-only: writing operations raise :class:`UnsupportedPathOperation`.

    Args:
        timeout (float): seconds to wait for a connection, or for the next bytes.
        progress (bool): draw a tqdm progress bar on stderr while downloading.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> None:
        self.timeout = timeout
        self.progress = progress

    def get_supported_prefixes(self) -> list[str]:
        """
        Returns:
            List[str]: ``["http://", "https://", "ftp://"]``.
        """
        return ["http://", "https://", "ftp://"]

    def cache_path(self, path: str) -> str:
        """The file that caches ``path``, inside ``get_cache_dir(<protocol>)``.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            str: the cache file's path (it may not exist yet).
        """
        protocol = parse_url(path).parts.scheme.lower()
        return cache_file_path(self.get_cache_dir(protocol), path)

    def get_local_path(self, path: str, force: bool = False, **kwargs: Any) -> str:
        """Get a file path which is compatible with native Python I/O such as ``open`` and
        ``os.path``, downloading the file into the cache on first use.

        Args:
            path (str): A URI supported by this PathHandler.
            force (bool): download again even if the file is cached.

        Returns:
            local_path (str): a file path which exists on the local file system.

        Raises:
            DownloadError: the download failed (the error names the URL and HTTP status).
        """
        dst = self.cache_path(path)
        protocol = parse_url(path).parts.scheme.lower()
        return download_url(
            path,
            dst,
            progress=self.progress,
            timeout=self.timeout,
            overwrite=force,
            lock_path=lock_file_path(dst, os.path.join(self.get_cache_dir(protocol), LOCK_AREA)),
        )

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:
        """Open a stream to a URI, similar to the built-in ``open``; read modes only.

        Args:
            path (str): A URI supported by this PathHandler.
            mode (str): Specifies the mode in which the file is opened. It defaults to 'r'.
            other: arguments of built-in ``open`` such as ``encoding``.

        Returns:
            IO: a file-like object on the cached file.
        """
        if _WRITE_MODES.intersection(mode):
            self._unsupported(f"open with mode {mode!r}", path)
        return open(self.get_local_path(path), mode, **kwargs)

    def exists(self, path: str) -> bool:
        """Checks if there is a resource at the given URI: it is cached, or the server answers
        a ``HEAD`` request with success.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists; False if the server answers 404 or 410.

        Raises:
            DownloadError: any other HTTP error, or the host cannot be reached.
        """
        if self.is_cached(path):
            return True
        try:
            response, _ = open_url(path, self.timeout, method="HEAD")
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return False
            shown = redact_url(path)
            raise DownloadError(
                f"could not check {shown}: HTTP {e.code} {e.reason}", shown, e.code
            ) from None
        with response:
            return True

    def is_cached(self, path: str) -> bool:
        """Whether ``path`` is already in the cache (no network access).

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the cached file exists.
        """
        return os.path.isfile(self.cache_path(path))

    def isfile(self, path: str) -> bool:
        """Checks if the resource at the given URI is a file: a URL that exists is a file.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: True if the path exists.
        """
        return self.exists(path)

    def isdir(self, path: str) -> bool:
        """Checks if the resource at the given URI is a directory: never, for a URL.

        Args:
            path (str): A URI supported by this PathHandler.

        Returns:
            bool: False.
        """
        return False


__all__ = ["HTTPURLHandler"]
