"""Big read-only Python data in shared memory, read by every process with no copy.

:func:`freeze` stores a sequence or a mapping once in a shared-memory *arena*, and returns a
:class:`SharedList` or a :class:`SharedDict` over it. Every process that reads it (the caller,
a runner's producers, a pool's workers) maps the same pages read-only: reading an item decodes
a short byte string into a fresh Python object, and neither dirties a page of the arena nor
touches a reference count inside it, so memory does not grow with the number of processes
(see ``docs/memory.md``)::

    from easycore import shm

    index = shm.freeze([{"path": p, "label": l} for p, l in rows])  # a SharedList
    with MyRunner(devices=4, cfg={"index": index}) as r:             # sent by reference
        r(range(len(index)))   # producer_work reads cfg.index[i]

The rules:

* **What it holds.** Items of any picklable type. ``str``, ``int``, ``float``, ``bool``,
  ``None``, ``bytes``, tuples, lists, dicts, sets of them are stored with :mod:`marshal` (the
  fastest to read back); anything else is pickled (protocol 5), and numpy arrays inside an
  item have their data placed in the arena out of band: they come back as zero-copy
  **read-only** views of the shared pages. Pickled classes must be importable where read.
* **Items are copies.** An item read is an ordinary Python object made on each access:
  changing it changes nothing in the frozen data, nor what the next read returns. The
  frozen object itself cannot change: assigning, deleting, appending or updating raises
  ``TypeError``.
* **Travels by reference.** Pickling a frozen object gives about 150 bytes (its name, size
  and kind), never the data; unpickling maps the arena. So it can be a runner's ``cfg``
  value, a hook's closure, a pool initializer's or a task's argument, under ``fork``,
  ``spawn`` and ``forkserver`` alike. A forked child reuses the mapping it inherited.
* **Lifetime.** The process that called :func:`freeze` owns the arena. Its name is removed
  from ``/dev/shm`` when the owner calls :meth:`SharedList.close` (or leaves a ``with``
  block), when the owner's object is garbage collected, when the owner exits, or, if the
  owner is killed, by the stale-segment sweep (``easycore._core.sweep_stale_segments``, run
  by the producers' watchdogs when their caller dies). Processes that mapped it keep reading
  until they drop it; the kernel frees the memory with the last mapping. So keep the owner's
  object referenced while other processes may still *attach* (unpickle) it.
* **Safety.** The arena is created exclusively with mode 0600 under an unguessable name
  tagged with the owner's identity; attaching refuses anything that is not a regular file
  owned by this user with no access for others, of the expected size, with this layout's
  header (a :class:`~easycore.errors.SharedMemoryError` saying why), and maps it read-only.
"""

from __future__ import annotations

import marshal
import mmap
import os
import pickle
import re
import secrets
import stat
import struct
import sys
import weakref
import zlib
from array import array
from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import Any, NoReturn, overload

from easycore.errors import SerializationError, SharedMemoryError

__all__ = ["SharedDict", "SharedList", "freeze"]

SHM_DIR = "/dev/shm"
_MAGIC = b"ECFROZN\x00"
_VERSION = 1
_KIND_LIST = 1
_KIND_DICT = 2
_KINDS = {"list": _KIND_LIST, "dict": _KIND_DICT}
_FLAG_ALL_MARSHAL = 1  # every record is marshal: readers skip the tag byte's test
# magic, version, kind, flags, marshal version, python major.minor, (reserved), records,
# index offset, table offset, table slots, size (native byte order: one machine writes and
# reads it). Records start right after it.
_HEADER = struct.Struct("=8sIIIIIIQQQQQ")
_HEADER_SIZE = 128
_TAG_MARSHAL = 0
_TAG_PICKLE = 1
_TAG_PICKLE_BUFFERS = 2
_U32 = struct.Struct("=I")
_QQ = struct.Struct("=QQ")
_BUFFER_ALIGN = 64
_FLUSH = 1 << 22
_PYVERSION = sys.hexversion >> 16
_NAME_RE = re.compile(r"ec\.[0-9]+-[0-9a-f]{8}\.frozen-[0-9a-f]{32}")
_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTACH = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_mloads = marshal.loads
_ploads = pickle.loads


# --------------------------------------------------------------------------------- the arena


class _Closed:
    """Stands in for a closed arena's index: any read raises."""

    __slots__ = ()

    def __getitem__(self, i: Any) -> NoReturn:
        raise ValueError("this frozen data was closed (close() or the end of its with block)")

    def __len__(self) -> int:
        return 0


_CLOSED: Any = _Closed()


class _Arena:
    """One mapped segment: the read-only mapping, its index and (for a dict) hash table."""

    __slots__ = (
        "__weakref__",
        "_finalizer",
        "all_marshal",
        "kind",
        "mm",
        "mv",
        "name",
        "offsets",
        "owner_pid",
        "records",
        "size",
        "table",
    )
    name: str
    mm: mmap.mmap
    mv: memoryview
    size: int
    kind: int
    records: int  # list: one per item; dict: two per entry (key, value)
    all_marshal: bool
    offsets: Any  # records + 1 offsets (a "Q" memoryview); record r is [offsets[r], offsets[r+1])
    table: Any  # dict: the hash table (a "Q" memoryview, see _table_for); list: None
    owner_pid: int | None  # the creator's pid: only it unlinks the name
    _finalizer: weakref.finalize[Any, Any]

    def __init__(self, name: str, mm: mmap.mmap, size: int, owner_pid: int | None) -> None:
        mv = memoryview(mm)
        head = _HEADER.unpack_from(mv, 0)
        magic, version, kind, flags, mversion, pyversion, _, records = head[:8]
        index_off, table_off, slots, sz = head[8:]
        problem = None
        if magic != _MAGIC:
            problem = "it has no frozen-data header"
        elif version != _VERSION:
            problem = f"its layout version is {version}, this easycore reads {_VERSION}"
        elif mversion != marshal.version or pyversion != _PYVERSION:
            problem = "it was written by another Python version"
        elif sz != size or kind not in (_KIND_LIST, _KIND_DICT):
            problem = "its header does not match its size"
        elif index_off + 8 * (records + 1) > size or table_off + 8 * slots > size:
            problem = "its index lies outside it"
        if problem is not None:
            mv.release()
            mm.close()
            raise SharedMemoryError(f"refusing {SHM_DIR}/{name}: {problem}")
        self.name = name
        self.mm = mm
        self.mv = mv
        self.size = size
        self.kind = kind
        self.records = records
        self.all_marshal = bool(flags & _FLAG_ALL_MARSHAL)
        self.offsets = mv[index_off : index_off + 8 * (records + 1)].cast("Q")
        self.table = mv[table_off : table_off + 8 * slots].cast("Q") if slots else None
        self.owner_pid = owner_pid
        self._finalizer = weakref.finalize(self, _unlink_if_owner, name, owner_pid)
        _OPEN[name] = self

    @property
    def closed(self) -> bool:
        return self.offsets is _CLOSED

    def close(self) -> None:
        """Removes the name (in the owner) and unmaps, unless views of it are still held
        (numpy arrays read from it): then the mapping goes with the last of them."""
        self._finalizer()
        if self.closed:
            return
        self.offsets.release()
        if self.table is not None:
            self.table.release()
        self.offsets = _CLOSED
        self.table = _CLOSED
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:
            pass  # arrays read from it still view it: the mapping lives as long as they do
        if _OPEN.get(self.name) is self:
            del _OPEN[self.name]


def _unlink_if_owner(name: str, owner_pid: int | None) -> None:
    if owner_pid is not None and owner_pid == os.getpid():
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass


# Arenas mapped in this process, by name: unpickling a frozen object here (or in a forked
# child, which inherits this table and the mappings) reuses the mapping instead of attaching.
_OPEN: weakref.WeakValueDictionary[str, _Arena] = weakref.WeakValueDictionary()


def _refuse(path: str, why: str) -> NoReturn:
    raise SharedMemoryError(f"refusing to attach frozen data {path}: {why}")


def _attach(name: str, size: int, kind: str) -> _Arena:
    """The arena ``name``, mapped read-only here after the neighbour checks."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise SharedMemoryError(f"not a frozen-data name: {name!r}")
    arena = _OPEN.get(name)
    if arena is not None and not arena.closed:
        return arena
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, _ATTACH)
    except FileNotFoundError:
        raise SharedMemoryError(
            f"frozen data {path} is gone: its owner closed it or exited before this process "
            "attached it (keep the frozen object open in its owner while others may attach)"
        ) from None
    except OSError as e:
        _refuse(path, f"{e.strerror} (a symbolic link or a file this user cannot read)")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, "it is not a regular file")
        if st.st_uid != os.geteuid():
            _refuse(
                path, f"it is owned by uid {st.st_uid}, not by this process (uid {os.geteuid()})"
            )
        if st.st_mode & 0o077:
            _refuse(path, f"its mode {stat.S_IMODE(st.st_mode):04o} lets other users in")
        if st.st_size != size or size < _HEADER_SIZE:
            _refuse(path, f"it has {st.st_size} bytes, not the {size} expected")
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    arena = _Arena(name, mm, size, None)
    if arena.kind != _KINDS.get(kind):
        arena.close()
        _refuse(path, f"it holds no {kind}")
    return arena


def _reattach(kind: str, name: str, size: int) -> SharedList | SharedDict:
    """Unpickles a frozen object: maps (or reuses) its arena."""
    arena = _attach(name, size, kind)
    return SharedList(arena) if kind == "list" else SharedDict(arena)


# ------------------------------------------------------------------------------- writing


class _Writer:
    """Streams an arena into a fresh descriptor (no second copy of the data in memory)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.pos = 0
        self.buf = bytearray()

    def write(self, data: Any) -> int:
        at = self.pos
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n >= _FLUSH:  # a large buffer goes straight to the file, never into self.buf
            self.flush()
            self._put(data)
        else:
            self.buf += data
            if len(self.buf) >= _FLUSH:
                self.flush()
        self.pos += n
        return at

    def align(self, to: int) -> None:
        pad = -self.pos % to
        if pad:
            self.write(bytes(pad))

    def flush(self) -> None:
        self._put(self.buf)
        self.buf.clear()

    def _put(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as e:
            raise SharedMemoryError(
                f"cannot write frozen data to {self.path} ({self.pos} bytes so far): "
                f"{e.strerror}; /dev/shm may be too small"
            ) from e
        finally:
            view.release()


_ATOMS = frozenset({str, int, float, bool, type(None), bytes, complex})
_BOXES = frozenset({tuple, list, set, frozenset})


def _plain(x: Any, depth: int = 0) -> bool:
    """Whether :mod:`marshal` gives ``x`` back as it is: builtin types only (marshal would
    also take any object with a buffer, a numpy array say, and give back ``bytes``)."""
    t = type(x)
    if t in _ATOMS:
        return True
    if depth > 100:
        return False
    if t in _BOXES:
        return all(type(v) in _ATOMS or _plain(v, depth + 1) for v in x)
    if t is dict:
        return all(
            (type(k) in _ATOMS or _plain(k, depth + 1))
            and (type(v) in _ATOMS or _plain(v, depth + 1))
            for k, v in x.items()
        )
    return False


def _encode(item: Any, out: _Writer, where: str) -> tuple[int, bool]:
    """Writes one record (its out-of-band buffers first); returns (offset, is marshal)."""
    if _plain(item):
        try:
            return out.write(b"\x00" + marshal.dumps(item)), True
        except (ValueError, TypeError):
            pass
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = pickle.dumps(item, protocol=5, buffer_callback=buffers.append)
    except Exception as e:
        raise SerializationError(
            f"freeze: {where} ({type(item).__name__}) cannot be stored: {e}"
        ) from e
    if not buffers:
        return out.write(b"\x01" + data), False
    places = []
    for b in buffers:
        raw = b.raw()
        out.align(_BUFFER_ALIGN)
        places.append(_QQ.pack(out.write(raw), raw.nbytes))
        raw.release()
    head = bytes([_TAG_PICKLE_BUFFERS]) + _U32.pack(len(places)) + b"".join(places)
    return out.write(head + data), False


def _decode(mv: memoryview, a: int, b: int) -> Any:
    """The record at ``mv[a:b]`` as a new object."""
    tag = mv[a]
    if tag == _TAG_MARSHAL:
        return _mloads(mv[a + 1 : b])
    if tag == _TAG_PICKLE:
        return _ploads(mv[a + 1 : b])
    (count,) = _U32.unpack_from(mv, a + 1)
    p = a + 5
    bufs = []
    for _ in range(count):
        off, n = _QQ.unpack_from(mv, p)
        bufs.append(mv[off : off + n])
        p += 16
    return _ploads(mv[p:b], buffers=bufs)


def _build(kind: int, records: Iterable[tuple[Any, str]], table: array[int] | None) -> _Arena:
    """Writes ``records`` (item, description) and ``table`` into a new arena and maps it."""
    me = _identity()
    for _ in range(8):
        name = f"ec.{me}.frozen-{secrets.token_hex(16)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, _CREATE, 0o600)
            break
        except FileExistsError:
            continue  # someone holds this name: take another
        except OSError as e:
            raise SharedMemoryError(f"cannot create {path}: {e.strerror}") from e
    else:
        raise SharedMemoryError(f"cannot create a fresh name in {SHM_DIR}")
    try:
        out = _Writer(fd, path)
        out.write(bytes(_HEADER_SIZE))
        offsets = array("Q")
        all_marshal = True
        for item, where in records:
            at, is_marshal = _encode(item, out, where)
            offsets.append(at)
            all_marshal = all_marshal and is_marshal
        offsets.append(out.pos)
        n = len(offsets) - 1
        out.align(8)
        index_off = out.write(memoryview(offsets).cast("B"))
        table_off, slots = 0, 0
        if table is not None:
            table_off, slots = out.write(memoryview(table).cast("B")), len(table)
        size = out.pos
        out.flush()
        flags = _FLAG_ALL_MARSHAL if all_marshal else 0
        header = _HEADER.pack(
            _MAGIC, _VERSION, kind, flags, marshal.version, _PYVERSION, 0, n, index_off,
            table_off, slots, size,
        )  # fmt: skip
        os.pwrite(fd, header, 0)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return _Arena(name, mm, size, os.getpid())


def _identity() -> str:
    from easycore import _core

    return _core.identity()


# ------------------------------------------------------------------------------ dict keys


class _NotAKey(Exception):
    pass


_C_STR = zlib.crc32(b"s")
_C_INT = zlib.crc32(b"i")


def _canon(key: Any) -> bytes:
    """A process-independent byte form of a key: equal keys (``1 == 1.0 == True``) give the
    same bytes, keys of different kinds never do."""
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, int):
        return b"i%x" % int(key)
    if isinstance(key, float):
        if key != key:
            raise _NotAKey("a NaN key can never be looked up")
        if key.is_integer():
            return b"i%x" % int(key)
        return b"f" + struct.pack("<d", key)
    if isinstance(key, bytes):
        return b"b" + key
    if key is None:
        return b"n"
    if isinstance(key, tuple):
        parts = [b"t%d:" % len(key)]
        for k in key:
            c = _canon(k)
            parts.append(b"%d:" % len(c))
            parts.append(c)
        return b"".join(parts)
    raise _NotAKey(f"keys of type {type(key).__name__} are not supported")


def _key_crc(key: Any) -> int:
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"), _C_STR)
    if t is int:
        return zlib.crc32(b"%x" % key, _C_INT)
    return zlib.crc32(_canon(key))


def _slot_of(crc: int, shift: int) -> int:
    return ((crc * _MIX) & _M64) >> shift


def _table_for(keys: list[Any]) -> array[int]:
    """Open addressing, linear probing, load at most 1/2: each slot is
    ``crc32 << 32 | entry + 1`` (0: empty)."""
    if len(keys) >= 0xFFFFFFFF:
        raise ValueError("freeze: a dict of 2**32 - 1 keys or more cannot be frozen")
    bits = max(3, (2 * len(keys) - 1).bit_length())
    slots, shift, mask = 1 << bits, 64 - bits, (1 << bits) - 1
    table = array("Q", bytes(8 * slots))
    for e, key in enumerate(keys):
        try:
            crc = _key_crc(key)
        except _NotAKey as err:
            raise TypeError(f"freeze: dict key {key!r} cannot be frozen: {err}") from None
        j = _slot_of(crc, shift)
        while table[j]:
            j = (j + 1) & mask
        table[j] = (crc << 32) | (e + 1)
    return table


# ------------------------------------------------------------------------------ the objects


def _read_only(obj: object, what: str) -> NoReturn:
    kind = type(obj).__name__
    copy = "list(x)" if kind == "SharedList" else "dict(x)"
    raise TypeError(
        f"{kind} is read-only: frozen data cannot be changed ({what}); "
        f"make a changeable copy with {copy}"
    )


class SharedList(Sequence[Any]):
    """A read-only list whose items live once in shared memory (made by :func:`freeze`).

    ``len(x)``, ``x[i]`` (negative ``i`` too), iteration, ``in``, ``x.index(v)``,
    ``x.count(v)`` and ``reversed(x)`` work as for a list; each item read is a new ordinary
    Python object decoded from the arena (changing it changes nothing shared). ``x[a:b:c]``
    returns an ordinary ``list`` of those items. Assigning, deleting, ``append``,
    ``extend``, ``insert``, ``pop``, ``remove``, ``sort``, ``reverse``, ``clear`` and ``+=``
    raise ``TypeError``. Pickled, it is a reference (name, size, kind) of about 150 bytes.
    """

    __slots__ = ("__weakref__", "_arena", "_fast", "_mv", "_n", "_offs")

    def __init__(self, arena: _Arena) -> None:
        if arena.kind != _KIND_LIST:
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
                    return _mloads(self._mv[o[i] + 1 : o[i + 1]])
                return _decode(self._mv, o[i], o[i + 1])
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
                yield _mloads(mv[o[i] + 1 : o[i + 1]])
        else:
            for i in range(self._n):
                yield _decode(mv, o[i], o[i + 1])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedList):
            return other._arena is self._arena or list(self) == list(other)
        if isinstance(other, list):
            return len(other) == self._n and list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<SharedList of {self._n} items, {self.nbytes} bytes at {self.name}{state}>"

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError("a closed SharedList cannot be sent")
        return (_reattach, ("list", self._arena.name, self._arena.size))

    def __copy__(self) -> SharedList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedList:
        return self

    def __enter__(self) -> SharedList:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def name(self) -> str:
        """The arena's name in ``/dev/shm``."""
        return self._arena.name

    @property
    def nbytes(self) -> int:
        """The arena's size in bytes (items, index and header)."""
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


class SharedDict(Mapping[Any, Any]):
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

    def __init__(self, arena: _Arena) -> None:
        if arena.kind != _KIND_DICT:
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
        return _decode(self._mv, o[r], o[r + 1])

    def _find(self, key: Any) -> int:
        """The entry of ``key``, or -1."""
        try:
            crc = _key_crc(key)
        except _NotAKey:
            hash(key)  # an unhashable key raises TypeError, as for a dict
            return -1
        table, mask = self._table, self._mask
        j = _slot_of(crc, self._shift)
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

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<SharedDict of {self._n} items, {self.nbytes} bytes at {self.name}{state}>"

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError("a closed SharedDict cannot be sent")
        return (_reattach, ("dict", self._arena.name, self._arena.size))

    def __copy__(self) -> SharedDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedDict:
        return self

    def __enter__(self) -> SharedDict:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def name(self) -> str:
        """The arena's name in ``/dev/shm``."""
        return self._arena.name

    @property
    def nbytes(self) -> int:
        """The arena's size in bytes (keys, values, index, hash table and header)."""
        return self._arena.size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (here, or on another object of this arena)."""
        return self._arena.closed

    def close(self) -> None:
        """As :meth:`SharedList.close`."""
        self._arena.close()
        self._offs = self._arena.offsets
        self._table = _CLOSED

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
        table = _table_for(keys)

        def entries() -> Iterator[tuple[Any, str]]:
            for k in keys:
                yield k, f"dict key {k!r:.80}"
                yield obj[k], f"the value of key {k!r:.80}"

        return SharedDict(_build(_KIND_DICT, entries(), table))
    if not isinstance(obj, Iterable):
        raise TypeError(f"freeze() takes a sequence or a mapping, not {type(obj).__name__}")
    items = ((x, f"item [{i}]") for i, x in enumerate(obj))
    return SharedList(_build(_KIND_LIST, items, None))
