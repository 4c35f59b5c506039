"""Where remote files are cached: the base folder, and a safe file path for each URL."""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import unquote

from easycore.common.path.url import parse_url, redact_url
from easycore.errors import InvalidArgument

CACHE_ENV = "EASYCORE_CACHE"
"""The environment variable that sets the base cache folder."""

DEFAULT_CACHE = "~/.easycore/cache"
"""The base cache folder when ``$EASYCORE_CACHE`` is not set."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 120


def default_cache_dir(protocol: str | None = None) -> str:
    """Return a cache directory like ``<base-cache-dir>/protocol``.

    The ``<base-cache-dir>`` is

    1) ``$EASYCORE_CACHE``, if set (read at each call)
    2) otherwise ``~/.easycore/cache``

    Args:
        protocol (str or None): protocol such as 'http', 'https'. If None, returns the base
            cache dir.

    Returns:
        str: the cache directory (it may not exist yet).
    """
    cache_dir = os.path.expanduser(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    if protocol is not None:
        cache_dir = os.path.join(cache_dir, protocol)
    return cache_dir


def safe_name(name: str, default: str = "_") -> str:
    """Turn any string into one harmless file name: no separators, no ``.``/``..``, not empty.

    Args:
        name (str): a path component, e.g. from a URL.
        default (str): the name used when nothing usable is left.

    Returns:
        str: ``[A-Za-z0-9._-]`` characters only, at most 120 of them.
    """
    name = _UNSAFE.sub("_", name)[-_MAX_NAME:]
    if name.strip(".") == "":
        return default
    return name


def cache_file_path(cache_dir: str, url: str) -> str:
    """The file under ``cache_dir`` that caches ``url``.

    The path is ``<cache_dir>/<host>/<hash>/<basename>``: the hash (of the whole URL) keeps
    distinct URLs apart, and the basename keeps the file's extension. Every component is
    sanitized, so the result stays inside ``cache_dir`` whatever the URL holds (``..``,
    ``%2F``, odd characters).

    Args:
        cache_dir (str): the folder for the URL's protocol, e.g. ``get_cache_dir("http")``.
        url (str): the remote URL.

    Returns:
        str: an absolute file path inside ``cache_dir``.
    """
    parts = parse_url(
        url, require_host=False
    ).parts  # refuses a malformed URL; no credentials in the folder names
    host = safe_name(parts.netloc, default="nohost")
    basename = safe_name(unquote(parts.path).rstrip("/").rpartition("/")[2], default="index")
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    root = os.path.abspath(cache_dir)
    path = os.path.join(root, host, digest, basename)
    if os.path.commonpath([root, path]) != root:  # cannot happen; checked all the same
        raise InvalidArgument(f"the cache path for {redact_url(url)!r} would leave {root!r}")
    return path


LOCK_AREA = ".locks"
"""The folder, inside the base cache folder, that holds the download locks."""


def lock_area() -> str:
    """The folder that holds the locks of downloads: ``<base-cache-dir>/.locks``.

    Lock files live there, not beside the files they guard, so a download into a folder of
    the user's (:func:`~easycore.common.network.download_file`) never leaves a ``.lock`` file
    in it. Each lock file is removed by its holder before it lets go (safe: see
    ``easycore._core.FileLock``), and the folder once it is empty.

    Returns:
        str: the folder (it may not exist yet).
    """
    return os.path.join(default_cache_dir(), LOCK_AREA)


def lock_file_path(dst: str | os.PathLike[str], area: str | None = None) -> str:
    """The lock file, in a lock area, that guards the creation of ``dst``.

    Args:
        dst (str): the file to be created.
        area (str or None): the lock area; None for :func:`lock_area`.

    Returns:
        str: ``<area>/<hash of dst's absolute real path>.lock``.
    """
    real = os.path.realpath(os.fspath(dst))
    digest = hashlib.sha256(real.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(lock_area() if area is None else area, f"{digest}.lock")


__all__ = [
    "CACHE_ENV",
    "DEFAULT_CACHE",
    "LOCK_AREA",
    "cache_file_path",
    "default_cache_dir",
    "lock_area",
    "lock_file_path",
    "safe_name",
]
