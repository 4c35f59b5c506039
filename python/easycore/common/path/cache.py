"""Where remote files are cached: the base folder, and a safe file path for each URL."""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import unquote, urlsplit

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
    parts = urlsplit(url)
    host = safe_name(parts.netloc.rpartition("@")[2], default="nohost")
    basename = safe_name(unquote(parts.path).rstrip("/").rpartition("/")[2], default="index")
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    root = os.path.abspath(cache_dir)
    path = os.path.join(root, host, digest, basename)
    if os.path.commonpath([root, path]) != root:  # cannot happen; checked all the same
        raise InvalidArgument(f"the cache path for {url!r} would leave {root!r}")
    return path


__all__ = ["CACHE_ENV", "DEFAULT_CACHE", "cache_file_path", "default_cache_dir", "safe_name"]
