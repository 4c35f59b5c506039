"""Reading URLs safely: malformed ones are refused clearly, passwords never reach a message.

A URL may carry credentials (``http://user:pass@host/file``). They are taken out of the URL
before it is requested and sent as an HTTP basic ``Authorization`` header instead (one that
is not carried over to a redirect's target); every message shows the URL with the password
replaced by ``***``.
"""

from __future__ import annotations

import base64
import re
from typing import NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from easycore.common.path.errors import InvalidURLError

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#]*)@")


def _redact(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    # user:password -> user:***; a lone user part may be a token, so it is hidden too
    return f"{match['scheme']}{user}:***@" if colon else f"{match['scheme']}***@"


def redact_url(url: str) -> str:
    """``url`` with its credentials hidden (works on malformed URLs too): the password is
    replaced by ``***``, and so is a user part without a password (it may be a token).

    Args:
        url (str): a URL, e.g. ``http://user:pass@host/file``.

    Returns:
        str: e.g. ``http://user:***@host/file``.
    """
    return _USERINFO.sub(_redact, url, count=1)


class ParsedURL(NamedTuple):
    """A URL split for a request.

    Attributes:
        url (str): the URL without credentials, to request.
        shown (str): the URL to show in messages (password replaced by ``***``).
        parts (SplitResult): ``urlsplit`` of the URL without credentials.
        authorization (str or None): the ``Authorization`` header value for the URL's
            credentials, or None.
    """

    url: str
    shown: str
    parts: SplitResult
    authorization: str | None


def parse_url(url: str, require_host: bool = True) -> ParsedURL:
    """Split ``url`` for a request, taking any credentials out of it.

    Args:
        url (str): an http, https or ftp URL, maybe with ``user:password@``.
        require_host (bool): refuse a URL that names no host.

    Returns:
        ParsedURL:

    Raises:
        InvalidURLError: the URL is not a string, is malformed (a bad IPv6 literal, a port that
            is not a number in 0-65535), or names no host.
    """
    if not isinstance(url, str):
        raise InvalidURLError(f"a URL must be a str, got {type(url).__name__}")
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number, or out of range
    except ValueError as e:
        raise InvalidURLError(f"malformed URL {shown!r}: {e}") from None
    if require_host and not parts.hostname:
        raise InvalidURLError(f"malformed URL {shown!r}: it names no host")
    authorization = None
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        token = f"{unquote(user)}:{unquote(password)}".encode()
        authorization = "Basic " + base64.b64encode(token).decode("ascii")
    clean = parts._replace(netloc=netloc)
    return ParsedURL(urlunsplit(clean), shown, clean, authorization)


__all__ = ["ParsedURL", "parse_url", "redact_url"]
