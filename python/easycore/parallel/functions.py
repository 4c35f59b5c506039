"""Functions across processes: how the pool sends the function of a task or call.

A function that plain pickle sends by name travels so. Others (lambdas, closures, functions
of an interactive or unimportable ``__main__``) travel by value, pickled with cloudpickle
once per call; each producer unpickles a function sent by value once and caches it by digest.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections.abc import Callable
from typing import Any

from easycore.errors import (
    InvalidArgument,
    SerializationError,
)

_BY_VALUE_CACHE: dict[bytes, Any] = {}  # in producers: functions sent by value, by digest
_BY_VALUE_CACHE_MAX = 256


def _load_by_value(key: bytes, blob: bytes) -> Any:
    """Unpickles a function sent by value, once per producer (cached by digest)."""
    fn = _BY_VALUE_CACHE.get(key)
    if fn is None:
        fn = pickle.loads(blob)
        if len(_BY_VALUE_CACHE) >= _BY_VALUE_CACHE_MAX:
            _BY_VALUE_CACHE.clear()
        _BY_VALUE_CACHE[key] = fn
    return fn


class _ByValue:
    """A function pickled by value with cloudpickle, once in the caller."""

    __slots__ = ("blob", "key")

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.key = hashlib.blake2b(blob, digest_size=16).digest()

    def __reduce__(self) -> tuple[Any, tuple[bytes, bytes]]:
        return (_load_by_value, (self.key, self.blob))


def _main_importable() -> bool:
    """Whether a spawned child can import ``__main__`` (a script, not a REPL or notebook)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None


def portable(fn: Callable[..., Any], start_method: str = "spawn") -> Any:
    """``fn`` itself where plain pickle sends it by name, else ``fn`` pickled by value.

    Plain pickle is tried first (fast, and what a module-level function needs). Lambdas,
    closures, functions defined inside functions, and functions of a ``__main__`` that a
    spawned child cannot import (a REPL, a notebook) go by value with cloudpickle.

    Args:
        fn (Callable): the function to send to the workers.
        start_method (str): how the workers start (under fork, ``__main__`` is inherited;
            ``"ray"``: Ray actors, which never can import the caller's ``__main__``).

    Returns:
        Any: a picklable object that unpickles to ``fn`` in a worker.

    Raises:
        SerializationError: if neither pickle nor cloudpickle can send ``fn``.
    """
    if not callable(fn):
        raise InvalidArgument(f"expected a callable, got {type(fn).__name__}")
    by_name = not (
        getattr(fn, "__module__", None) == "__main__"
        and start_method != "fork"
        and (start_method == "ray" or not _main_importable())
    )
    if by_name:
        try:
            pickle.dumps(fn, protocol=5)
            return fn
        except Exception:  # noqa: BLE001, S110 - falls back to cloudpickle below
            pass
    import cloudpickle

    try:
        return _ByValue(cloudpickle.dumps(fn, protocol=5))
    except Exception as e:
        raise SerializationError(
            f"the function {fn!r} cannot be sent to the workers, neither by name (pickle) nor "
            f"by value (cloudpickle): {type(e).__name__}: {e}"
        ) from e
