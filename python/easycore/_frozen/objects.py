"""SharedList, SharedDict and freeze: the objects users hold, over an :class:`Arena`."""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import Any, NoReturn, Self, overload

from easycore._frozen.arena import (
    CLOSED,
    KIND_DICT,
    KIND_LIST,
    Arena,
    attach,
    build,
    decode,
    mloads,
)
from easycore._frozen.keys import NotAKey, key_crc, slot_of, table_for

__all__ = ["SharedDict", "SharedList", "freeze"]


def _reattach(kind: str, name: str, size: int) -> SharedList | SharedDict:
    """Unpickles a frozen object: maps (or reuses) its arena."""
    arena = attach(name, size, kind)
    return SharedList(arena) if kind == "list" else SharedDict(arena)


# ------------------------------------------------------------------------------ the objects


def _read_only(obj: object, what: str) -> NoReturn:
    kind = type(obj).__name__
    copy = "list(x)" if kind == "SharedList" else "dict(x)"
    raise TypeError(
        f"{kind} is read-only: frozen data cannot be changed ({what}); "
        f"make a changeable copy with {copy}"
    )


class _Frozen:
    """What a :class:`SharedList` and a :class:`SharedDict` share: the arena they read, how
    they travel (by reference), copies (the same object), and closing."""

    __slots__ = ()
    _arena: Arena
    _n: int
    _KIND = ""

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (
            f"<{type(self).__name__} of {self._n} items, {self.nbytes} bytes at {self.name}{state}>"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError(f"a closed {type(self).__name__} cannot be sent")
        return (_reattach, (self._KIND, self._arena.name, self._arena.size))

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def name(self) -> str:
        """The arena's name in ``/dev/shm``."""
        return self._arena.name

    @property
    def nbytes(self) -> int:
        """The arena's size in bytes (the records, their index, a dict's hash table, and
        the header)."""
        return self._arena.size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (here, or on another object of this arena)."""
        return self._arena.closed

    def close(self) -> None:
        """Stops using the arena in this process: in the owner, removes its name from
        ``/dev/shm`` (processes that mapped it keep reading). Further reads here raise
        ``ValueError``; numpy arrays read before stay valid. Safe to call twice."""
        self._arena.close()
        self._closed_here()

    def _closed_here(self) -> None:
        """Points this object's fast paths at the closed arena's empty tables."""


class SharedList(_Frozen, Sequence[Any]):
    """A read-only list whose items live once in shared memory (made by :func:`freeze`).

    ``len(x)``, ``x[i]`` (negative ``i`` too), iteration, ``in``, ``x.index(v)``,
    ``x.count(v)`` and ``reversed(x)`` work as for a list; each item read is a new ordinary
    Python object decoded from the arena (changing it changes nothing shared). ``x[a:b:c]``
    returns an ordinary ``list`` of those items. Assigning, deleting, ``append``,
    ``extend``, ``insert``, ``pop``, ``remove``, ``sort``, ``reverse``, ``clear`` and ``+=``
    raise ``TypeError``. Pickled, it is a reference (name, size, kind) of about 130 bytes.
    """

    __slots__ = ("__weakref__", "_arena", "_fast", "_mv", "_n", "_offs")
    _KIND = "list"

    def __init__(self, arena: Arena) -> None:
        if arena.kind != KIND_LIST:
            raise TypeError("use freeze() to make a SharedList")
        self._arena = arena
        self._mv = arena.mv
        self._offs = arena.offsets
        self._n = arena.records
        self._fast = arena.all_marshal

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: Any) -> Any:
        if type(i) is int:
            if i < 0:
                i += self._n
            if 0 <= i < self._n:
                o = self._offs
                if self._fast:
                    return mloads(self._mv[o[i] + 1 : o[i + 1]])
                return decode(self._mv, o[i], o[i + 1])
            raise IndexError("SharedList index out of range")
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        try:
            j = i.__index__()
        except AttributeError:
            raise TypeError(
                f"SharedList indices must be integers or slices, not {type(i).__name__}"
            ) from None
        return self[j]

    def __iter__(self) -> Iterator[Any]:
        mv, o = self._mv, self._offs
        if self._fast:
            for i in range(self._n):
                yield mloads(mv[o[i] + 1 : o[i + 1]])
        else:
            for i in range(self._n):
                yield decode(mv, o[i], o[i + 1])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedList):
            return other._arena is self._arena or list(self) == list(other)
        if isinstance(other, list):
            return len(other) == self._n and list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def _closed_here(self) -> None:
        self._offs = self._arena.offsets

    def __setitem__(self, i: Any, v: Any) -> NoReturn:
        _read_only(self, "item assignment")

    def __delitem__(self, i: Any) -> NoReturn:
        _read_only(self, "item deletion")

    def __iadd__(self, other: Any) -> NoReturn:
        _read_only(self, "+=")

    def __imul__(self, other: Any) -> NoReturn:
        _read_only(self, "*=")

    def append(self, v: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "append")

    def extend(self, v: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "extend")

    def insert(self, i: Any, v: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "insert")

    def pop(self, i: Any = -1) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "pop")

    def remove(self, v: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "remove")

    def clear(self) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "clear")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change (``sorted(x)`` gives a list)."""
        _read_only(self, "sort")

    def reverse(self) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change (``reversed(x)`` iterates)."""
        _read_only(self, "reverse")


class SharedDict(_Frozen, Mapping[Any, Any]):
    """A read-only dict whose keys and values live once in shared memory (made by
    :func:`freeze`).

    The mapping protocol: ``d[k]``, ``k in d``, ``len``, iteration (in the original order),
    ``keys()``, ``values()``, ``items()``, ``get()``, ``==``. Keys are ``str``, ``int``,
    ``float``, ``bool``, ``bytes``, ``None`` and tuples of them; they are found through a
    hash table stored in the arena, hashed the same way in every process (not with Python's
    per-process ``hash()``), with Python's equality (``d[1]``, ``d[1.0]`` and ``d[True]`` are
    the same entry). Values come back as new ordinary objects on each read (changing one
    changes nothing shared). Assigning, deleting, ``pop``, ``popitem``, ``setdefault``,
    ``update``, ``clear`` and ``|=`` raise ``TypeError``. Pickled, it is a reference.
    """

    __slots__ = ("__weakref__", "_arena", "_mask", "_mv", "_n", "_offs", "_shift", "_table")
    _KIND = "dict"

    def __init__(self, arena: Arena) -> None:
        if arena.kind != KIND_DICT:
            raise TypeError("use freeze() to make a SharedDict")
        self._arena = arena
        self._mv = arena.mv
        self._offs = arena.offsets
        self._table = arena.table
        self._n = arena.records // 2
        slots = len(arena.table)
        self._mask = slots - 1
        self._shift = 64 - (slots.bit_length() - 1)

    def _record(self, r: int) -> Any:
        o = self._offs
        return decode(self._mv, o[r], o[r + 1])

    def _find(self, key: Any) -> int:
        """The entry of ``key``, or -1."""
        try:
            crc = key_crc(key)
        except NotAKey:
            hash(key)  # an unhashable key raises TypeError, as for a dict
            return -1
        table, mask = self._table, self._mask
        j = slot_of(crc, self._shift)
        while True:
            v = table[j]
            if not v:
                return -1
            if v >> 32 == crc:
                e: int = (v & 0xFFFFFFFF) - 1
                if self._record(2 * e) == key:
                    return e
            j = (j + 1) & mask

    def __getitem__(self, key: Any) -> Any:
        e = self._find(key)
        if e < 0:
            raise KeyError(key)
        return self._record(2 * e + 1)

    def __contains__(self, key: object) -> bool:
        return self._find(key) >= 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Any]:
        for e in range(self._n):
            yield self._record(2 * e)

    def items(self) -> ItemsView[Any, Any]:
        """The (key, value) pairs, read in order (each pair decoded once)."""
        return _Items(self)

    def values(self) -> ValuesView[Any]:
        """The values, read in order."""
        return _Values(self)

    def _pairs(self) -> Iterator[tuple[Any, Any]]:
        for e in range(self._n):
            yield self._record(2 * e), self._record(2 * e + 1)

    def _closed_here(self) -> None:
        self._offs = self._arena.offsets
        self._table = CLOSED

    def __setitem__(self, k: Any, v: Any) -> NoReturn:
        _read_only(self, "item assignment")

    def __delitem__(self, k: Any) -> NoReturn:
        _read_only(self, "item deletion")

    def __ior__(self, other: Any) -> NoReturn:
        _read_only(self, "|=")

    def pop(self, *args: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "pop")

    def popitem(self) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "popitem")

    def setdefault(self, *args: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "setdefault")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "update")

    def clear(self) -> NoReturn:
        """Raises ``TypeError``: frozen data cannot change."""
        _read_only(self, "clear")


class _Items(ItemsView[Any, Any]):
    _mapping: SharedDict

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping._pairs()


class _Values(ValuesView[Any]):
    _mapping: SharedDict

    def __iter__(self) -> Iterator[Any]:
        m = self._mapping
        for e in range(len(m)):
            yield m._record(2 * e + 1)


# ------------------------------------------------------------------------------ freeze


@overload
def freeze(obj: Mapping[Any, Any]) -> SharedDict: ...  # type: ignore[overload-overlap]


@overload
def freeze(obj: Iterable[Any]) -> SharedList: ...


def freeze(obj: Iterable[Any] | Mapping[Any, Any]) -> SharedList | SharedDict:
    """Stores ``obj`` once in shared memory, read-only, for every process to read.

    Args:
        obj (Mapping or Iterable): a mapping (a dict) gives a :class:`SharedDict`; any other
            iterable (a list, a tuple, a generator) gives a :class:`SharedList` of its items.
            A frozen object is returned as it is.

    Returns:
        SharedList or SharedDict: owned by this process (see the module's rules on
        lifetime); ``with freeze(x) as f:`` closes it at the end of the block.

    Raises:
        SerializationError: an item cannot be pickled (the error names it).
        TypeError: ``obj`` is a str or bytes, or a dict key is of an unsupported type.
        SharedMemoryError: ``/dev/shm`` has no room for it.
    """
    if isinstance(obj, SharedList | SharedDict):
        return obj
    if isinstance(obj, str | bytes | bytearray):
        raise TypeError(f"freeze() takes a sequence or a mapping, not {type(obj).__name__}")
    if isinstance(obj, Mapping):
        keys = list(obj.keys())
        table = table_for(keys)

        def entries() -> Iterator[Any]:
            for k in keys:
                yield k
                yield obj[k]

        def where(r: int) -> str:
            k = keys[r // 2]
            return f"the value of key {k!r:.80}" if r % 2 else f"dict key {k!r:.80}"

        return SharedDict(build(KIND_DICT, entries(), table, where))
    if not isinstance(obj, Iterable):
        raise TypeError(f"freeze() takes a sequence or a mapping, not {type(obj).__name__}")
    return SharedList(build(KIND_LIST, obj, None, lambda r: f"item [{r}]"))
