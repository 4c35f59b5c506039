"""Reading Python literals out of config text: ``(224, 224)`` is a tuple, ``1e-3`` a float."""

from __future__ import annotations

import ast
from typing import Any

_MISSING = object()


def parse_literal(text: str) -> Any:
    """Evaluate ``text`` as a Python literal, safely (:func:`ast.literal_eval`).

    Args:
        text (str): the text, e.g. ``"(224, 224)"``, ``"1e-3"``, ``"None"`` or ``"res3"``.

    Returns:
        Any: the Python value, or the sentinel ``_MISSING`` when ``text`` is not a literal.
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _MISSING


def is_literal(text: str) -> bool:
    """Whether ``text`` reads as a Python literal (so a YAML writer must quote it).

    Args:
        text (str): the text.

    Returns:
        bool: True if :func:`parse_literal` turns it into a value.
    """
    return parse_literal(text) is not _MISSING


def decode_value(text: str) -> Any:
    """``text`` as a Python literal if it is one, else ``text`` itself.

    Args:
        text (str): the text, e.g. a value given on the command line.

    Returns:
        Any: the literal's value, or ``text`` unchanged.
    """
    value = parse_literal(text)
    return text if value is _MISSING else value
