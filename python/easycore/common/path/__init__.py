"""Manage local paths and remote URIs in the same way.

* :class:`PathManager` — ``open``, ``exists``, ``copy``, ``get_local_path``, ... for any path,
  routed to the handler registered for its prefix.
* :class:`PathHandler` — the base class of handlers; :class:`NativePathHandler` (local
  files), :class:`HTTPURLHandler` (http/https/ftp, cached), :class:`RedirectPathHandler`,
  :class:`FsspecPathHandler` (every fsspec protocol, with the optional ``fsspec``).
* :func:`file_lock` — an inter-process lock named ``path + ".lock"``.
"""

from easycore.common.path.errors import DownloadError, PrefixTakenError, UnsupportedPathOperation
from easycore.common.path.fsspec_handler import FsspecPathHandler
from easycore.common.path.http_handler import HTTPURLHandler
from easycore.common.path.lock import file_lock
from easycore.common.path.manager import PathManager
from easycore.common.path.native import NativePathHandler
from easycore.common.path.path_handler import PathHandler
from easycore.common.path.redirect import RedirectPathHandler

__all__ = [
    "DownloadError",
    "FsspecPathHandler",
    "HTTPURLHandler",
    "NativePathHandler",
    "PathHandler",
    "PathManager",
    "PrefixTakenError",
    "RedirectPathHandler",
    "UnsupportedPathOperation",
    "file_lock",
]
