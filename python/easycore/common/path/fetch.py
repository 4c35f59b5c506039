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
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from tqdm import tqdm

from easycore.common.path.atomic import create_once
from easycore.common.path.cache import lock_file_path
from easycore.common.path.errors import DownloadError, InvalidURLError
from easycore.common.path.url import parse_url, redact_url

DEFAULT_TIMEOUT: float = 60.0
"""Seconds to wait for a connection, or for the next bytes of a response."""

_CHUNK = 1 << 20
USER_AGENT = "easycore"
"""The ``User-Agent`` header of easycore's requests."""


def make_request(url: str, method: str | None = None) -> tuple[urllib.request.Request, str]:
    """A request for ``url``, with its credentials (if any) moved into an HTTP basic
    ``Authorization`` header that is not carried over to a redirect's target.

    Args:
        url (str): an http, https or ftp URL, maybe with ``user:password@``.
        method (str or None): e.g. ``"HEAD"``; None for GET.

    Returns:
        tuple: the request, and the URL to show in messages (password hidden).

    Raises:
        InvalidURLError: the URL is malformed (a ``ValueError``).
    """
    parsed = parse_url(url)
    request = urllib.request.Request(parsed.url, method=method, headers={"User-Agent": USER_AGENT})
    if parsed.authorization is not None:
        if parsed.parts.scheme.lower() not in ("http", "https"):
            raise InvalidURLError(
                f"credentials in a {parsed.parts.scheme}:// URL are not supported: {parsed.shown}"
            )
        request.add_unredirected_header("Authorization", parsed.authorization)
    return request, parsed.shown


def open_url(url: str, timeout: float, method: str | None = None) -> tuple[Any, str]:
    """Send a request for ``url`` and return the response.

    Args:
        url (str): an http, https or ftp URL, maybe with ``user:password@``.
        timeout (float): seconds to wait for a connection.
        method (str or None): e.g. ``"HEAD"``; None for GET.

    Returns:
        tuple: the response (a context manager), and the URL to show in messages.

    Raises:
        InvalidURLError: the URL is malformed.
        urllib.error.HTTPError: the server answered with an error status (closed).
        DownloadError: no answer: an unreachable host, a timeout, a broken connection.
    """
    request, shown = make_request(url, method)
    try:
        return urllib.request.urlopen(request, timeout=timeout), shown
    except urllib.error.HTTPError as e:
        e.close()
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"could not reach {shown}: {reason}", shown) from None


def stream_url(
    url: str, out: BinaryIO, progress: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> int:
    """Write the body of ``url`` into ``out``.

    Args:
        url (str): an http, https or ftp URL. Credentials in it (``user:pass@``) are sent as
            HTTP basic authentication and never shown in messages.
        out (BinaryIO): where the bytes go.
        progress (bool): draw a tqdm progress bar on stderr (with the total size when the
            server sends it).
        timeout (float): seconds to wait for a connection or for the next bytes.

    Returns:
        int: the number of bytes written.

    Raises:
        InvalidURLError: the URL is malformed (a ``ValueError``).
        DownloadError: an HTTP error status, an unreachable host, a broken or stalled
            connection, or fewer bytes than the ``Content-Length`` the server announced.
    """
    try:
        response, shown = open_url(url, timeout)
    except urllib.error.HTTPError as e:
        shown = redact_url(url)
        raise DownloadError(
            f"could not download {shown}: HTTP {e.code} {e.reason}", shown, e.code
        ) from None

    with response:
        status: int | None = getattr(response, "status", None)
        length = response.headers.get("Content-Length")
        total = int(length) if length is not None and length.strip().isdigit() else None
        received = 0
        name = urlsplit(shown).path.rstrip("/").rpartition("/")[2] or shown
        # read1 returns what has arrived, so a stall or a cut is reported with the exact count
        read = getattr(response, "read1", response.read)
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
                while chunk := read(_CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as e:
                of_total = f" of {total}" if total is not None else ""
                why = f"stalled (no data for {timeout:g} s)" if isinstance(e, TimeoutError) else e
                raise DownloadError(
                    f"download of {shown} broke after {received}{of_total} bytes"
                    f" (HTTP {status}): {why}",
                    shown,
                    status,
                ) from None
    if total is not None and received != total:
        raise DownloadError(
            f"download of {shown} was truncated: got {received} of {total} bytes (HTTP {status})",
            shown,
            status,
        )
    return received


def download_url(
    url: str,
    dst: str | os.PathLike[str],
    progress: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    overwrite: bool = False,
    lock_path: str | None = None,
) -> str:
    """Download ``url`` to the file ``dst`` once, atomically (see :func:`create_once`).

    Concurrent callers, threads or processes, download it only once; none sees a partial
    file; a failed download leaves nothing behind (no file, no folder it made, no lock file)
    and raises :class:`DownloadError`. The lock is taken in a lock area
    (:func:`~easycore.common.path.cache.lock_file_path`), never beside ``dst``.

    Args:
        url (str): an http, https or ftp URL.
        dst (str): the file to create; its folder is created if needed.
        progress (bool): draw a tqdm progress bar on stderr.
        timeout (float): seconds to wait for a connection or for the next bytes.
        overwrite (bool): download again even if ``dst`` exists.
        lock_path (str or None): the lock file; None for ``lock_file_path(dst)``, in the
            base cache folder's lock area.

    Returns:
        str: ``dst``.
    """
    parse_url(url)  # a malformed URL fails before anything is created
    return create_once(
        dst,
        lambda f: stream_url(url, f, progress=progress, timeout=timeout),
        overwrite=overwrite,
        lock_path=lock_file_path(dst) if lock_path is None else lock_path,
    )


__all__ = [
    "DEFAULT_TIMEOUT",
    "USER_AGENT",
    "download_url",
    "make_request",
    "open_url",
    "stream_url",
]
