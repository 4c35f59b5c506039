"""How a command-line override's value fits the key it sets: the type checks and coercions of
:meth:`CfgNode.merge_from_list <easycore.common.config.CfgNode.merge_from_list>`, as yacs
does them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from easycore.common.config.errors import InvalidConfigError
from easycore.common.config.literal import decode_value
from easycore.common.config.node_base import _MISSING

_TRUE_WORDS = frozenset({"true", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "no", "off"})


def _override_value(old: Any, raw: Any, full_key: str) -> Any:
    """The value an override ``raw`` (from a command line) sets over ``old``, coerced to the
    type of ``old`` as yacs does, or :class:`InvalidConfigError` naming ``full_key``.

    ``None`` is accepted for every key and every value is accepted over ``None`` or a new
    key; a str key keeps the text; int widens to float; lists and tuples convert to each
    other; a sub-node can only be replaced by a dict.
    """
    value = decode_value(raw) if isinstance(raw, str) else raw
    if old is _MISSING or old is None or value is None:
        return value
    if isinstance(old, Mapping):
        if isinstance(value, Mapping):
            return value
        example = f"{full_key}.{next(iter(old), 'KEY')}"
        raise InvalidConfigError(
            f"cannot set {full_key!r} to {raw!r}: {full_key!r} is a config node, which only a "
            f"dict can replace; set one of its keys instead, e.g. {example}"
        )
    if isinstance(old, str):
        if isinstance(value, str):
            return value  # "'None'" gives the text None
        return raw if isinstance(raw, str) else _mismatch(old, raw, value, full_key)
    if isinstance(old, bool):
        if isinstance(value, bool):
            return value
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(raw, str):
            try:
                return float(raw)  # "nan", "inf", "-inf"
            except ValueError:
                pass
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, tuple | list):
        if isinstance(value, tuple | list):
            return type(old)(value) if type(old) in (tuple, list) else value
        return _mismatch(old, raw, value, full_key)
    if isinstance(value, type(old)):
        return value
    return _mismatch(old, raw, value, full_key)


def _mismatch(old: Any, raw: Any, value: Any, full_key: str) -> Any:
    shown = repr(old) if len(repr(old)) <= 60 else repr(old)[:57] + "..."
    verb = "reads as" if isinstance(raw, str) else "is"
    want, got = _a(type(old).__name__), _a(type(value).__name__)
    raise InvalidConfigError(
        f"cannot set {full_key!r} to {raw!r}: the key holds {want} ({shown}) and {raw!r} "
        f"{verb} {got}. Give {want} (or None)"
    )


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
