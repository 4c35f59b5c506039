"""Type stubs for the Rust extension module ``easycore._core``.

Checked against the built module by ``python -m mypy.stubtest easycore._core`` (run by
``scripts/test.sh``). PyO3 classes take their arguments in ``__new__`` and cannot be
subclassed (``@final``). ``Buffer`` comes from ``typing_extensions`` because
``collections.abc.Buffer`` is new in Python 3.12; type checkers ship its stub, so nothing is
imported at run time.
"""

from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Self, final

from typing_extensions import Buffer

__all__ = [
    "Queue",
    "ShmBuffer",
    "ShmLease",
    "ReorderBuffer",
    "FileLock",
    "sweep_stale_segments",
    "sweep_dead_pids",
    "drop_inherited_holds",
    "leave_queues",
    "shm_space",
    "owner_alive",
    "identity",
    "exit_when_dead",
    "retire_identity",
    "_prepare_exit",
    "SHM_PREFIX",
]

SHM_PREFIX: str

_Parts = Buffer | Sequence[Buffer]

@final
class Queue:
    """A bounded multi-process message queue in shared memory.

    Messages are ``(seq, kind, parts)``: a sequence number (u64), a kind tag (u32) and a list
    of byte parts. ``get`` returns part 0 as ``bytes`` and later parts as writable buffers:
    a ``bytearray`` (copied out of the ring), or a zero-copy :class:`ShmBuffer` for messages
    that travelled in a side segment. Messages with a body of at least ``pool_min`` bytes
    (default 256 KiB) lease a segment from the queue's pool (at most ``pool_bytes`` bytes,
    default twice ``side_budget``) when one is free, and go inline otherwise; messages larger
    than ``max_inline`` that find no free pooled segment get a one-shot segment. A pooled
    segment returns to the pool when every view of its message is gone. Blocking calls
    release the GIL and check for signals every 100 ms. Pickling a Queue attaches to the same
    queue in the receiving process.
    """

    def __new__(
        cls,
        capacity_bytes: int = ...,  # 64 MiB
        max_messages: int = 65536,
        max_inline: int | None = None,
        side_budget: int | None = None,
        spin_us: int = 20,
        pool_bytes: int | None = None,
        pool_min: int | None = None,
    ) -> Self: ...
    @staticmethod
    def attach(name: str, spin_us: int = 20) -> Queue: ...
    @property
    def name(self) -> str: ...
    @property
    def ring_size(self) -> int: ...
    @property
    def max_inline(self) -> int: ...
    @property
    def max_messages(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def wait_seconds(self) -> float: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def pool_min(self) -> int: ...
    def lease(self, nbytes: int, timeout: float = 10.0) -> ShmLease | None:
        """Leases ``nbytes`` of a pooled segment to build a message part in: a part of a later
        ``put`` that lies inside it travels by reference (no copy). None when the pool has no
        room now (never waits for room)."""
    def audit(self, timeout: float = 10.0) -> None: ...
    def pool_bytes(self) -> tuple[int, int]: ...
    def grow_pool(self, cap: int) -> int:
        """Raises the pool's cap to ``cap`` bytes if it is lower (it never shrinks); returns
        the cap now."""
    def totals(self) -> tuple[int, int]: ...
    def qsize(self) -> int: ...
    def __len__(self) -> int: ...
    def empty(self) -> bool: ...
    def close(self) -> None: ...
    def unlink(self) -> None: ...
    def recover(self) -> int: ...
    def put(
        self, seq: int, kind: int, parts: _Parts, block: bool = True, timeout: float | None = None
    ) -> None: ...
    def put_many(
        self,
        messages: Iterable[tuple[int, int, _Parts]],
        block: bool = True,
        timeout: float | None = None,
    ) -> int: ...
    def get(
        self, block: bool = True, timeout: float | None = None
    ) -> tuple[int, int, list[Buffer]]: ...
    def get_many(
        self, max_messages: int = 64, block: bool = True, timeout: float | None = None
    ) -> list[tuple[int, int, list[Buffer]]]: ...

@final
class ShmBuffer:
    """A writable zero-copy view of shared memory; the mapping lives while any view does."""

    def __len__(self) -> int: ...
    # The buffer protocol (PyO3's ``__getbuffer__``): Python 3.12+ shows it as
    # ``__buffer__``; 3.11 has only the C slot, hence the stubtest allowlist entry.
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class ShmLease:
    """Memory leased from a queue's pool: writable until a ``put`` sends it by reference;
    dropped unsent, it goes back to the pool."""

    def __len__(self) -> int: ...
    @property
    def sent(self) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class ReorderBuffer:
    """Hands out items in sequence order, holding at most ``window`` early arrivals."""

    def __new__(cls, window: int, start: int = 0) -> Self: ...
    @property
    def window(self) -> int: ...
    @property
    def next_seq(self) -> int: ...
    def __len__(self) -> int: ...
    def admits(self, seq: int) -> bool: ...
    def push(self, seq: int, item: object) -> None: ...
    def pop_ready(self) -> list[object]: ...
    def skip(self) -> object | None: ...
    def reset(self, start: int = 0) -> None: ...

@final
class FileLock:
    """An exclusive inter-process file lock (flock), released if its holder dies."""

    def __new__(cls, path: str | PathLike[str], timeout: float | None = None) -> Self: ...
    @property
    def path(self) -> str: ...
    @property
    def locked(self) -> bool: ...
    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> FileLock: ...
    def __exit__(self, *args: object) -> bool: ...

def sweep_stale_segments() -> int: ...
def sweep_dead_pids(pids: Sequence[int]) -> int: ...
def drop_inherited_holds(keep: Sequence[str] = ...) -> int: ...
def leave_queues() -> int: ...
def shm_space() -> tuple[int, int] | None: ...
def owner_alive(tag: str) -> bool: ...
def identity() -> str: ...
def exit_when_dead(owner_tag: str, exit_code: int = 70) -> None: ...
def retire_identity() -> None: ...
def _prepare_exit() -> None:
    """The ``atexit`` hook this module registers when first imported: from then on, threads
    other than the main thread that come back from a wait in easycore park instead of taking
    the GIL back, so that the interpreter's finalization cannot end them inside Rust (which
    aborts the process). Not for direct use."""
