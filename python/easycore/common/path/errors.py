"""The exceptions raised by :mod:`easycore.common.path` and :mod:`easycore.common.network`."""

from __future__ import annotations

import io
from typing import Any

from easycore.errors import EasycoreError, InvalidArgument


class PrefixTakenError(InvalidArgument):
    """A handler was registered for a prefix that another handler holds, without ``override``."""


class UnsupportedPathOperation(EasycoreError, io.UnsupportedOperation):
    """The path handler cannot do this operation, e.g. write to an ``http://`` URL.

    It is an ``OSError`` (and a ``ValueError``), like :class:`io.UnsupportedOperation`.
    """


class InvalidURLError(InvalidArgument):
    """A URL cannot be read: a bad IPv6 literal (``http://[::1/x``), a port that is not a
    number, no host. A ``ValueError``; the message shows the URL without its password."""


class DownloadError(EasycoreError, OSError):
    """A remote file could not be fetched: an HTTP error, an unreachable host, a cut download.

    Nothing is left in the destination when it is raised.

    Attributes:
        url (str): the URL that failed, with any password replaced by ``***``.
        status (int | None): the HTTP status code, None when no response came
            (unreachable host, timeout) or the protocol has none (ftp).
    """

    def __init__(self, message: str, url: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes when pickled across processes
        return (type(self), (self.args[0], self.url, self.status))


__all__ = ["DownloadError", "InvalidURLError", "PrefixTakenError", "UnsupportedPathOperation"]
