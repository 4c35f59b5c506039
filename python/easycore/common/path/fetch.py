"""Fetch a URL (http, https, ftp) into a local file, atomically and checked for truncation.

This is the one download routine: ``HTTPURLHandler``'s cache and
:func:`easycore.common.network.download_file` both go through :func:`download_url`.
"""

from __future__ import annotations

import http.client
import os
import sys
import urllib.error
import urllib.request
from typing import BinaryIO

from tqdm import tqdm

from easycore.common.path.atomic import create_once
from easycore.common.path.errors import DownloadError

DEFAULT_TIMEOUT: float = 60.0
"""Seconds to wait for a connection, or for the next bytes of a response."""

_CHUNK = 1 << 20
USER_AGENT = "easycore"
"""The ``User-Agent`` header of easycore's requests."""


def stream_url(
    url: str, out: BinaryIO, progress: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> int:
    """Write the body of ``url`` into ``out``.

    Args:
        url (str): an http, https or ftp URL.
        out (BinaryIO): where the bytes go.
        progress (bool): draw a tqdm progress bar on stderr (with the total size when the
            server sends it).
        timeout (float): seconds to wait for a connection or for the next bytes.

    Returns:
        int: the number of bytes written.

    Raises:
        DownloadError: an HTTP error status, an unreachable host, a broken connection, or
            fewer bytes than the ``Content-Length`` the server announced.
    """
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        raise DownloadError(
            f"could not download {url}: HTTP {e.code} {e.reason}", url, e.code
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"could not reach {url}: {reason}", url) from e

    with response:
        status: int | None = getattr(response, "status", None)
        length = response.headers.get("Content-Length")
        total = int(length) if length is not None and length.strip().isdigit() else None
        received = 0
        name = url.rstrip("/").rpartition("/")[2] or url
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=name[-40:],
            disable=not progress,
            file=sys.stderr,
            leave=True,
        ) as bar:
            try:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as e:
                of_total = f" of {total}" if total is not None else ""
                raise DownloadError(
                    f"download of {url} broke after {received}{of_total} bytes"
                    f" (HTTP {status}): {e}",
                    url,
                    status,
                ) from e
    if total is not None and received != total:
        raise DownloadError(
            f"download of {url} was truncated: got {received} of {total} bytes (HTTP {status})",
            url,
            status,
        )
    return received


def download_url(
    url: str,
    dst: str | os.PathLike[str],
    progress: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    overwrite: bool = False,
) -> str:
    """Download ``url`` to the file ``dst`` once, atomically (see :func:`create_once`).

    Concurrent callers, threads or processes, download it only once; none sees a partial
    file; a failed download leaves no file behind and raises :class:`DownloadError`.

    Args:
        url (str): an http, https or ftp URL.
        dst (str): the file to create; its folder is created if needed.
        progress (bool): draw a tqdm progress bar on stderr.
        timeout (float): seconds to wait for a connection or for the next bytes.
        overwrite (bool): download again even if ``dst`` exists.

    Returns:
        str: ``dst``.
    """
    return create_once(
        dst, lambda f: stream_url(url, f, progress=progress, timeout=timeout), overwrite=overwrite
    )


__all__ = ["DEFAULT_TIMEOUT", "USER_AGENT", "download_url", "stream_url"]
