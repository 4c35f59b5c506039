"""Functions across processes: how the pool sends the function of a task or call.

A function that plain pickle sends by name travels so. Others (lambdas, closures, functions
of an interactive or unimportable ``__main__``) travel by value, pickled with cloudpickle
once per call; each producer unpickles a function sent by value once and caches it by digest.

**A large body is sent once.** A closure over a data set (``lambda i: augment(data[i])``)
pickles to megabytes, and every work item names its function. A body of
:data:`_SHARE_MIN` bytes or more is therefore put once in a read-only shared-memory arena
(:func:`easycore.shm.freeze`) and each work item carries only its digest and the arena's name
(about 200 bytes): a worker that has the digest in its cache uses it, any other (a worker
that just started, or restarted after a death or recycling) maps the arena and reads the
body. So no worker can see a key without being able to reach its body: the body lives in
shared memory for as long as the call that sends it (the arena is owned by the caller's
:class:`_ByValue`, which the call holds). A work item of a call that ended may still reach a
worker that never saw its body; the arena is then gone, and the function it gets raises
(that call's results are dropped anyway). Under Ray the body travels by value (actors on
other nodes cannot map the caller's ``/dev/shm``).
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

from easycore._engine import wire
from easycore.errors import (
    InvalidArgument,
    SerializationError,
)

_BY_VALUE_CACHE: dict[bytes, Any] = {}  # in producers: functions sent by value, by digest
_BY_VALUE_CACHE_MAX = 256
# Bodies at least this large are sent once through shared memory (see the module); smaller
# ones travel with each work item (a few KiB cost less than mapping an arena).
_SHARE_MIN = 64 * 1024


def _load_by_value(key: bytes, blob: bytes) -> Any:
    """Unpickles a function sent by value, once per producer (cached by digest)."""
    fn = _BY_VALUE_CACHE.get(key)
    if fn is None:
        fn = pickle.loads(blob)
        if len(_BY_VALUE_CACHE) >= _BY_VALUE_CACHE_MAX:
            _BY_VALUE_CACHE.clear()
        _BY_VALUE_CACHE[key] = fn
    return fn


class Bodies:
    """In the caller, one per pool: the shared arenas of the bodies it sent most recently, by
    digest, newest last. A call holds its own arena (through its :class:`_ByValue`); these
    keep the last few alive between calls, so that calling the pool again with the same
    closure (a loader making one call per batch) does not store its body again. At most
    ``most`` of them and ``most_bytes`` in all; :meth:`clear` when the pool closes."""

    def __init__(self, most: int = 4, most_bytes: int = 256 << 20) -> None:
        self.most = most
        self.most_bytes = most_bytes
        self._recent: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def arena_for(self, key: bytes, blob: bytes) -> Any:
        """A shared arena (a SharedList of one item) holding ``blob``: a recent one of the
        same digest, else a new one; None when ``/dev/shm`` has no room (the body is then
        sent by value)."""
        recent = self._recent
        with self._lock:
            arena = recent.get(key)
            if arena is not None and not arena.closed:
                recent.move_to_end(key)
                return arena
        from easycore._frozen.objects import freeze

        try:
            arena = freeze([blob])
        except Exception:  # noqa: BLE001 - no room in /dev/shm: sent by value
            return None
        with self._lock:
            recent[key] = arena
            total = sum(a.nbytes for a in recent.values())
            while len(recent) > 1 and (len(recent) > self.most or total > self.most_bytes):
                _, old = recent.popitem(last=False)
                total -= old.nbytes  # removed when the last call holding it ends
        return arena

    def clear(self) -> None:
        """Forgets the recent arenas (each is removed once no call holds it)."""
        with self._lock:
            self._recent.clear()


def _load_shared(key: bytes, name: str, size: int) -> Any:
    """Unpickles a function whose body lies in a shared arena: from the cache when this
    producer has it, else read from the arena (then cached)."""
    fn = _BY_VALUE_CACHE.get(key)
    if fn is not None:
        return fn
    from easycore._frozen.objects import _reattach

    try:
        arena = _reattach("list", name, size)
        blob = arena[0]
    except Exception as e:  # noqa: BLE001 - its call ended: the function raises if called
        return _Gone(f"{type(e).__name__}: {e}")
    return _load_by_value(key, blob)


class _Gone:
    """Stands for a function whose call ended before this worker read its body."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the call that sent this function has ended ({self.why})")


class _ByValue:
    """A function pickled by value with cloudpickle, once in the caller; a large body is
    also stored once in a shared arena, and then travels as its digest and the arena's
    name (see the module)."""

    __slots__ = ("blob", "key", "shared")

    def __init__(self, blob: bytes, bodies: Bodies | None = None) -> None:
        self.blob = blob
        self.key = hashlib.blake2b(blob, digest_size=16).digest()
        self.shared: Any = None  # the arena holding the body (a SharedList), owned here
        if bodies is not None and len(blob) >= _SHARE_MIN:
            self.shared = bodies.arena_for(self.key, blob)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        shared = self.shared
        if shared is not None and not shared.closed:
            return (_load_shared, (self.key, shared.name, shared.nbytes))
        return (_load_by_value, (self.key, self.blob))


def _main_importable() -> bool:
    """Whether a spawned child can import ``__main__`` (a script, not a REPL or notebook)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None


def portable(
    fn: Callable[..., Any], start_method: str = "spawn", bodies: Bodies | None = None
) -> Any:
    """``fn`` itself where plain pickle sends it by name, else ``fn`` pickled by value.

    Plain pickle is tried first (fast, and what a module-level function needs). Lambdas,
    closures, functions defined inside functions, and functions of a ``__main__`` that a
    spawned child cannot import (a REPL, a notebook) go by value with cloudpickle.

    Args:
        fn (Callable): the function to send to the workers.
        start_method (str): how the workers start (under fork, ``__main__`` is inherited;
            ``"ray"``: Ray actors, which never can import the caller's ``__main__``).
        bodies (Bodies, optional): where a large body sent by value is stored once (see the
            module; never under Ray); None: it travels with every message.

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
        blob = cloudpickle.dumps(fn, protocol=5)
        return _ByValue(blob, bodies if start_method != "ray" else None)
    except Exception as e:
        raise SerializationError(
            f"the function {fn!r} cannot be sent to the workers, neither by name (pickle) nor "
            f"by value (cloudpickle): {type(e).__name__}: {e}"
        ) from e


def pickle_args(obj: tuple[Any, tuple[Any, ...], dict[str, Any]], apart: bool = False) -> list[Any]:
    """``obj``, a task's ``(function, args, kwargs)``, pickled with plain pickle, or with
    cloudpickle when plain pickle cannot (a lambda or closure among the arguments): the
    pickle, then the buffers of at least ``wire.OUT_OF_BAND_MIN`` bytes that protocol 5 leaves
    out of band (``[pickle]`` when there are none); ``pickle.loads(parts[0],
    buffers=parts[1:])`` reads it back either way. The buffers are the arguments' own memory,
    not copies: they are read when the task is sent.

    With ``apart``, ``bytes`` arguments that large (``args`` and the values of ``kwargs``,
    not ``bytes`` inside other objects) leave the pickle too, and unpickle as ``bytes``:
    pickle copies a ``bytes`` object into the pickle itself (``wire.BytesApart``). A pool
    asks for it once its tasks' pickles were that large (the look costs every task).

    Raises:
        Exception: what cloudpickle raised, when neither can pickle ``obj``.
    """
    if apart:
        f, args, kwargs = obj
        if wire.has_large_bytes(args) or (kwargs and wire.has_large_bytes(kwargs.values())):
            apart_kw = dict(zip(kwargs, wire.bytes_apart(kwargs.values()), strict=True))
            obj = (f, tuple(wire.bytes_apart(args)), apart_kw)
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(b: pickle.PickleBuffer) -> bool:
        try:
            small = b.raw().nbytes < wire.OUT_OF_BAND_MIN
        except BufferError:  # not contiguous: it has no raw bytes to send apart
            return True
        if small:
            return True  # in the pickle
        buffers.append(b)
        return False

    try:
        blob = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except Exception:  # noqa: BLE001 - falls back to cloudpickle below
        import cloudpickle

        buffers.clear()
        blob = cloudpickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    return [blob, *(b.raw() for b in buffers)]


class _Pickled:
    """An object that plain pickle could not send, pickled with cloudpickle (which plain
    ``pickle.loads`` reads back): it unpickles to the object itself."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (pickle.loads, (self.blob,))


def by_cloudpickle(obj: Any) -> Any:
    """``obj`` wrapped to travel by value with cloudpickle (lambdas and closures inside it
    too); it unpickles to ``obj``.

    Raises:
        Exception: what cloudpickle raised, when it cannot pickle ``obj`` either.
    """
    import cloudpickle

    return _Pickled(cloudpickle.dumps(obj, protocol=5))


# In producers: the functions that work items carry pickled (a caller's own round trips, see
# ``_Job.fn_wire``), by their pickle: unpickled once, not once per item.
_PICKLED_CACHE: dict[bytes, Any] = {}
_PICKLED_CACHE_MAX = 64


def pickled_function(blob: bytes) -> Any:
    """In a producer: the function pickled in ``blob`` (unpickled once; a few are kept)."""
    fn = _PICKLED_CACHE.get(blob)
    if fn is None:
        fn = pickle.loads(blob)
        if len(_PICKLED_CACHE) >= _PICKLED_CACHE_MAX:
            _PICKLED_CACHE.clear()
        _PICKLED_CACHE[blob] = fn
    return fn
