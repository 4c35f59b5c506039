"""Crash torture for the shared-memory queue: writers and readers in real (forked) processes,
SIGKILLed (or SIGSTOPped, then killed) at random instants, many times over. Used by
tests/test_queue_crash.py (a short run in CI) and by benches/crash_soak.py (a long soak).

Every message's content is derived from its sequence number, so a reader detects a message
that was half-written or mixed up. Writers log a message's number only after ``put`` returned
(acknowledged); readers log what they got, after checking it. Logs are append-only files
(one ``write`` of 8 bytes per entry is atomic), so a kill loses at most the entry in flight.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import tempfile
import time
from dataclasses import dataclass, field

from easycore._core import Queue
from easycore.errors import QueueClosed, QueueEmpty, QueueFull, SharedMemoryError

SHM = "/dev/shm"

#: sizes of message bodies: inline, pooled slots (>= pool_min) and one-shot segments
SIZES = (0, 8, 40, 1000, 9000, 70_000, 150_000, 400_000)
READ_BATCH = 8
CORRUPT = 1 << 63
_POOL = random.Random(1234).randbytes(1 << 20)


def body(seq: int) -> memoryview:
    """The body of message ``seq`` (a slice of a fixed random pool)."""
    size = SIZES[(seq * 2654435761 >> 7) % len(SIZES)]
    off = (seq * 40503) % (len(_POOL) - size)
    return memoryview(_POOL)[off : off + size]


def _log(fd: int, value: int) -> None:
    os.write(fd, struct.pack("<Q", value))


def _part(q: Queue, seq: int, byref: bool) -> memoryview:
    """Message ``seq``'s body: with ``byref``, built in a slot leased from the queue's pool
    (sent by reference) when the pool has one and the body is large enough."""
    b = body(seq)
    if byref and len(b) >= 4096:
        lease = q.lease(len(b), timeout=2.0)
        if lease is not None:
            mv = memoryview(lease)
            mv[:] = b
            return mv
    return b


def _writer(q: Queue, wid: int, log: int, byref: bool = False) -> None:
    i = 0
    while True:
        seq = (wid << 24) | i
        try:
            q.put(seq, wid & 0xFFFF, [struct.pack("<Q", seq), _part(q, seq, byref)], timeout=2.0)
        except QueueFull:
            continue
        except SharedMemoryError as e:
            # Judged dead while writing (a false death): the message was not put; put it
            # again. Anything else is a failure of the run.
            if "judged this process dead" not in str(e):
                raise
            continue
        except QueueClosed:
            return
        _log(log, seq)
        i += 1


def _reader(q: Queue, log: int) -> None:
    while True:
        try:
            msgs = q.get_many(READ_BATCH, timeout=1.0)
        except QueueEmpty:
            continue
        except QueueClosed:
            return
        for seq, _kind, parts in msgs:
            ok = (
                len(parts) == 2
                and bytes(parts[0]) == struct.pack("<Q", seq)
                and memoryview(parts[1]).cast("B") == body(seq)
            )
            _log(log, seq if ok else seq | CORRUPT)
        del msgs, parts


@dataclass
class Outcome:
    """What a torture run saw."""

    kills: int = 0
    stops: int = 0
    false_deaths: int = 0
    """Live processes whose liveness token was deleted (they go on running)."""
    reader_kills: int = 0
    acked: set[int] = field(default_factory=set)
    received: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)
    dead_pids: list[int] = field(default_factory=list)
    hung: list[int] = field(default_factory=list)
    audit_error: str | None = None
    pool_left: int | None = None
    """Bytes of pooled segments left once everyone is gone and the queue is repaired and
    closed (0: no slot leaked)."""

    @property
    def missing(self) -> set[int]:
        return self.acked - set(self.received)

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(set(self.received))


def _spawn(target, *args) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            target(*args)
        except BaseException:  # noqa: BLE001 - reported by the exit code
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    return pid


def _read_log(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    n = len(data) // 8
    return list(struct.unpack(f"<{n}Q", data[: n * 8]))


def run(
    kills: int,
    writers: int = 2,
    readers: int = 2,
    seed: int = 0,
    victims: str = "any",
    byref: bool = False,
    false_deaths: float = 0.0,
) -> Outcome:
    """Runs the queue under ``kills`` random kills (a fifth of them SIGSTOP first) of
    ``victims`` (``"any"``, ``"writers"`` or ``"readers"``) and returns what happened.
    With ``false_deaths`` (a probability per kill), a live victim's liveness token is
    deleted first, and it is stopped for a while (the others judge it dead meanwhile: it
    may have been reserving, writing, claiming), then resumed for a while before it is
    killed.
    With ``byref``, writers build their large bodies in leased slots (sent by reference).
    Processes killed are replaced at once; the parent reaps them only now and then, so
    survivors also meet dead-but-unreaped (zombie) lock holders."""
    rnd = random.Random(seed)
    out = Outcome()
    q = Queue(capacity_bytes=256 << 10, max_messages=64, pool_bytes=1 << 20)
    tmp = tempfile.mkdtemp(prefix="ec-torture-")
    logs: list[tuple[str, str]] = []  # (role, path)
    procs: dict[int, str] = {}  # pid -> role
    next_wid = 1

    def start(role: str) -> None:
        nonlocal next_wid
        path = os.path.join(tmp, f"{role}-{len(logs)}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if role == "w":
            pid = _spawn(_writer, q, next_wid, fd, byref)
            next_wid += 1
        else:
            pid = _spawn(_reader, q, fd)
        os.close(fd)
        logs.append((role, path))
        procs[pid] = role

    try:
        for _ in range(writers):
            start("w")
        for _ in range(readers):
            start("r")
        zombies: list[int] = []
        for k in range(kills):
            time.sleep(rnd.random() * 0.004)
            pool = sorted(p for p, r in procs.items() if victims == "any" or r == victims[0])
            victim = rnd.choice(pool)
            role = procs.pop(victim)
            if rnd.random() < false_deaths:
                for name in os.listdir(SHM):
                    if name.startswith(f"ec.{victim}-") and name.endswith(".live"):
                        try:
                            os.unlink(os.path.join(SHM, name))
                            out.false_deaths += 1
                        except FileNotFoundError:
                            pass
                # Stopped a while (wherever it was: copying, committing, inside the lock)
                # while the others judge it dead, then resumed, "dead" to the others.
                os.kill(victim, signal.SIGSTOP)
                time.sleep(0.03 + rnd.random() * 0.05)
                os.kill(victim, signal.SIGCONT)
                time.sleep(0.01 + rnd.random() * 0.03)
            if rnd.random() < 0.2:
                os.kill(victim, signal.SIGSTOP)
                out.stops += 1
                time.sleep(rnd.random() * 0.03)  # the others must go on (or wait bounded)
            os.kill(victim, signal.SIGKILL)
            out.kills += 1
            out.reader_kills += role == "r"
            out.dead_pids.append(victim)
            zombies.append(victim)
            start(role)
            if k % 7 == 6:  # reap late: until then the dead stay zombies
                for z in zombies:
                    os.waitpid(z, 0)
                zombies.clear()
        for z in zombies:
            os.waitpid(z, 0)
        time.sleep(0.2)  # let the survivors get some work done after the last kill
        q.close()
        deadline = time.monotonic() + 60
        for pid in list(procs):
            while time.monotonic() < deadline:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    procs.pop(pid)
                    break
                time.sleep(0.01)
        out.hung = sorted(procs)
        try:
            q.audit()
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.audit_error = str(e)
        if not out.hung:
            q.recover()  # the dead's leases
            q.close()  # unlinks the free slots
            out.pool_left = q.pool_bytes()[0]
        for role, path in logs:
            entries = _read_log(path)
            if role == "w":
                out.acked.update(entries)
            else:
                for e in entries:
                    if e & CORRUPT:
                        out.corrupt.append(e & ~CORRUPT)
                    else:
                        out.received.append(e)
    finally:
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for _, path in logs:
            os.unlink(path)
        os.rmdir(tmp)
    return out
