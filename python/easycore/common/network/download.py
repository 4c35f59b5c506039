"""``download_file``: fetch a URL into a folder, once."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote

from easycore.common.path.fetch import DEFAULT_TIMEOUT, download_url
from easycore.common.path.url import parse_url
from easycore.errors import InvalidArgument


def download_file(
    url: str,
    dir: str | os.PathLike[str],
    filename: str | None = None,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> str:
    """Download a file from a given URL to a directory. If the file exists, will not overwrite
    the existing file.

    The download goes to a temporary file that is renamed into place under a lock, so
    processes downloading the same file at once fetch it once and none sees a partial file; a
    failed or truncated download leaves nothing behind (no file, no folder it made). The lock
    file lives in the cache's lock area, never in ``dir``.

    Args:
        url (str): an http, https or ftp URL. Credentials in it (``http://user:pass@host/..``)
            are sent as HTTP basic authentication; messages never show the password.
        dir (str): the directory to store the file (created if needed).
        filename (str or None): the basename to save the file. Use the name in the URL if not
            given. It must be a plain name: no folder part, not ``..``.
        progress (bool): whether to use tqdm to draw a progress bar (on stderr, with the total
            size when the server sends it).
        timeout (float): seconds to wait for a connection, or for the next bytes.

    Returns:
        str: the path to the downloaded file or the existing one.

    Raises:
        InvalidArgument: ``filename`` is not a plain file name, or none can be taken from the
            URL; :class:`~easycore.common.path.errors.InvalidURLError` (a subclass) for a
            malformed URL.
        DownloadError: an HTTP error (its status is in the message and in ``.status``), an
            unreachable host, or a download cut short.
    """
    parsed = parse_url(url)  # refuses a malformed URL, whatever filename says
    if filename is None:
        filename = posixpath.basename(unquote(parsed.parts.path))
        if filename in ("", ".", ".."):
            raise InvalidArgument(f"cannot take a file name from {parsed.shown!r}: pass filename=")
    _check_filename(filename)
    dst = os.path.join(os.fspath(dir), filename)
    return download_url(url, dst, progress=progress, timeout=timeout)


def _check_filename(filename: str) -> None:
    """Refuse a ``filename`` that is not one plain name inside the target folder."""
    if not isinstance(filename, str):
        raise InvalidArgument(f"filename must be a str, got {type(filename).__name__}")
    separators = [sep for sep in (os.sep, os.altsep, "/") if sep]
    if (
        filename in ("", ".", "..")
        or any(sep in filename for sep in separators)
        or "\0" in filename
        or os.path.isabs(filename)
    ):
        raise InvalidArgument(
            f"filename {filename!r} must be a plain file name (no folder, no '..'): "
            "download_file never writes outside dir"
        )


__all__ = ["download_file"]
