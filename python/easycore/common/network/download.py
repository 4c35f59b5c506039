"""``download_file``: fetch a URL into a folder, once."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlsplit

from easycore.common.path.fetch import DEFAULT_TIMEOUT, download_url
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

    The download goes to a temporary file that is renamed into place under
    ``file_lock``, so processes downloading the same file at once fetch it once and none sees
    a partial file; a failed or truncated download leaves nothing behind.

    Args:
        url (str): an http, https or ftp URL.
        dir (str): the directory to store the file (created if needed).
        filename (str or None): the basename to save the file. Use the name in the URL if not
            given.
        progress (bool): whether to use tqdm to draw a progress bar (on stderr, with the total
            size when the server sends it).
        timeout (float): seconds to wait for a connection, or for the next bytes.

    Returns:
        str: the path to the downloaded file or the existing one.

    Raises:
        DownloadError: an HTTP error (its status is in the message and in ``.status``), an
            unreachable host, or a download cut short.
    """
    if filename is None:
        filename = posixpath.basename(unquote(urlsplit(url).path))
        if filename in ("", ".", ".."):
            raise InvalidArgument(f"cannot take a file name from {url!r}: pass filename=")
    dst = os.path.join(os.fspath(dir), filename)
    return download_url(url, dst, progress=progress, timeout=timeout)


__all__ = ["download_file"]
