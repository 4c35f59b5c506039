"""The arena: one read-only shared-memory segment of encoded items and its index.

Layout (native byte order: one machine writes and reads it)::

    header (128 bytes)   magic, layout version, kind (list/dict), flags, marshal and Python
                         versions, record count, offsets of the index and the hash table, size
    records              record r: one tag byte (0 marshal, 1 pickle, 2 pickle with
                         out-of-band buffers) then its bytes; a tag-2 record lists its buffers
                         (offset, length), which lie before it, 64-byte aligned
    index                records + 1 offsets (u64): record r is [index[r], index[r + 1])
    hash table           a dict's only (see keys.py)

A list has one record per item, a dict two per entry (key, value). Written once by its owner
through a descriptor (streamed: no second copy in memory), then mapped ``PROT_READ`` by every
process, the owner included.
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
from array import array
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from easycore.errors import SerializationError, SharedMemoryError

SHM_DIR = "/dev/shm"
_MAGIC = b"ECFROZN\x00"
_VERSION = 1
KIND_LIST = 1
KIND_DICT = 2
_KINDS = {"list": KIND_LIST, "dict": KIND_DICT}
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
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTACH = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
mloads = marshal.loads
ploads = pickle.loads


# --------------------------------------------------------------------------------- the arena


class _Closed:
    """Stands in for a closed arena's index: any read raises."""

    __slots__ = ()

    def __getitem__(self, i: Any) -> NoReturn:
        raise ValueError("this frozen data was closed (close() or the end of its with block)")

    def __len__(self) -> int:
        return 0


CLOSED: Any = _Closed()


class Arena:
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
        elif sz != size or kind not in (KIND_LIST, KIND_DICT):
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
        return self.offsets is CLOSED

    def close(self) -> None:
        """Removes the name (in the owner) and unmaps, unless views of it are still held
        (numpy arrays read from it): then the mapping goes with the last of them."""
        self._finalizer()
        if self.closed:
            return
        self.offsets.release()
        if self.table is not None:
            self.table.release()
        self.offsets = CLOSED
        self.table = CLOSED
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
_OPEN: weakref.WeakValueDictionary[str, Arena] = weakref.WeakValueDictionary()


def _refuse(path: str, why: str) -> NoReturn:
    raise SharedMemoryError(f"refusing to attach frozen data {path}: {why}")


def attach(name: str, size: int, kind: str) -> Arena:
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
    arena = Arena(name, mm, size, None)
    if arena.kind != _KINDS.get(kind):
        arena.close()
        _refuse(path, f"it holds no {kind}")
    return arena


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


def _encode(item: Any, out: _Writer, r: int, where: Callable[[int], str]) -> tuple[int, bool]:
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
            f"freeze: {where(r)} ({type(item).__name__}) cannot be stored: {e}"
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


def decode(mv: memoryview, a: int, b: int) -> Any:
    """The record at ``mv[a:b]`` as a new object."""
    tag = mv[a]
    if tag == _TAG_MARSHAL:
        return mloads(mv[a + 1 : b])
    if tag == _TAG_PICKLE:
        return ploads(mv[a + 1 : b])
    (count,) = _U32.unpack_from(mv, a + 1)
    p = a + 5
    bufs = []
    for _ in range(count):
        off, n = _QQ.unpack_from(mv, p)
        bufs.append(mv[off : off + n])
        p += 16
    return ploads(mv[p:b], buffers=bufs)


def build(
    kind: int, records: Iterable[Any], table: array[int] | None, where: Callable[[int], str]
) -> Arena:
    """Writes ``records`` and ``table`` into a new arena and maps it; ``where(r)`` names
    record ``r`` in an error."""
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
        for r, item in enumerate(records):
            at, is_marshal = _encode(item, out, r, where)
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
    return Arena(name, mm, size, os.getpid())


def _identity() -> str:
    from easycore._core import identity  # the extension itself, not the package's face

    return identity()
