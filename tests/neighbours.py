"""Hostile-neighbour scenarios: another local user squats, plants, locks and fills names in
/dev/shm while easycore works. Run by tests/test_neighbours.py, one scenario per process, as
root inside a private mount namespace with a fresh tmpfs on /dev/shm (``unshare -m``), so
nothing here touches the machine's real /dev/shm. The other user is uid 65534 (``setpriv``).

Usage: ``python tests/neighbours.py SCENARIO MARKER`` where MARKER is a path that no code may
ever create: the other user's payloads create it if they ever run. Prints ``ok`` at the end;
any failure is an AssertionError (exit status 1).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from easycore._core import identity, owner_alive, retire_identity, sweep_stale_segments
from easycore.errors import EasycoreError, QueueEmpty
from easycore.parallel import Queue

SHM = "/dev/shm"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
MARKER = ""  # set from argv
BIG = 1 << 20  # large enough for a pooled slot


class Evil:
    """Unpickling it creates MARKER (as whoever unpickles it)."""

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (MARKER, "w"))


def as_nobody(*argv: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Runs a command as the other user."""
    return subprocess.run([*NOBODY, *argv], input=data, capture_output=True, timeout=30)


def plant(name: str, how: str, data: bytes = b"") -> bool:
    """The other user puts something under ``name`` in /dev/shm; True if it got there."""
    path = f"{SHM}/{name}"
    if how == "file":
        r = as_nobody("sh", "-c", 'umask 0; cat > "$1"', "sh", path, data=data)
    elif how == "fifo":
        r = as_nobody("mkfifo", "-m", "666", path)
    elif how == "link":
        r = as_nobody("ln", "-s", "/dev/zero", path)
    elif how == "dir":
        r = as_nobody("mkdir", "-m", "777", path)
    else:
        raise ValueError(how)
    return r.returncode == 0


def ec_names() -> list[str]:
    return sorted(n for n in os.listdir(SHM) if n.startswith("ec."))


def within(seconds: float, what: str, check: Callable[[], bool]) -> None:
    """Waits until ``check()`` holds, at most ``seconds``."""
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, f"not within {seconds} s: {what}"
        time.sleep(0.02)


def genuine() -> tuple[str, bytes]:
    return ("genuine " * 64, b"g" * BIG)


# --- a consumer draining a queue whose maker is gone: slot names re-created by the other user


def _maker(conn: Any, mode: str) -> None:
    q = Queue(capacity_bytes=1 << 16, side_budget=8 << 20)
    q.put(genuine())
    conn.send(q)
    conn.recv()  # the consumer attached
    if mode == "exited":  # the maker's drop removes the slot names
        del q
        gc.collect()
        conn.send("dropped")
    conn.recv()  # never answered: killed


def evil_body() -> bytes:
    """The bytes of a pooled slot holding a pickle that creates MARKER, laid out as easycore
    lays out a message like ``genuine()`` (made by easycore itself, then read back)."""
    q2 = Queue(capacity_bytes=1 << 16, side_budget=8 << 20)
    base = q2._q.name.lstrip("/")
    q2.put((Evil(), b"e" * BIG))
    slots = [n for n in ec_names() if n.startswith(base + ".")]
    assert slots, f"no pooled slot for the evil message: {ec_names()}"
    with open(f"{SHM}/{slots[0]}", "rb") as f:
        data = f.read()
    return data


def slot_swap(mode: str) -> None:
    body = evil_body()
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    maker = ctx.Process(target=_maker, args=(there, mode), daemon=True)
    maker.start()
    q = here.recv()
    base = q._q.name.lstrip("/")
    slots = [n for n in ec_names() if n.startswith(base + ".")]
    assert slots, f"the message is not in a pooled slot: {ec_names()}"
    here.send("attached")
    if mode == "exited":
        assert here.recv() == "dropped"
    os.kill(maker.pid, signal.SIGKILL)  # type: ignore[arg-type]
    maker.join(30)
    sweep_stale_segments()  # as any new Queue() or Runner.activate() does
    planted = [plant(n, "file", body) for n in slots]
    err: Exception | None = None
    got = None
    try:
        got = q.get(timeout=20)
    except Exception as e:  # noqa: BLE001 - any clear error is a right answer here
        err = e
    assert not os.path.exists(MARKER), "the other user's pickle ran in the consumer"
    if mode == "killed":
        # The maker died: its pooled message stays readable (the names live while a party
        # holds the queue), so the other user could not even re-create the name.
        assert not any(planted), "a live queue's slot name was free for the other user"
        assert got == genuine(), f"the drained message is wrong: {err!r}"
    else:
        # The maker removed its names; what the other user put there is refused.
        assert got is None and isinstance(err, EasycoreError), repr(err)
        assert "refusing" in str(err) or "gone" in str(err), str(err)


# --- FIFOs, links and directories under token names: nothing hangs, repair goes on


def _party_then_exit(q: Any, conn: Any) -> None:
    conn.send(identity())
    q.put("from a party that then exits")
    retire_identity()  # as its exit handlers would: its token name is free again


def planted_tokens() -> None:
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 16)
    here, there = ctx.Pipe()
    p = ctx.Process(target=_party_then_exit, args=(q, there), daemon=True)
    p.start()
    tag = here.recv()
    p.join(30)
    assert p.exitcode == 0
    assert plant(f"ec.{tag}.live", "fifo"), "the other user could not plant the FIFO"
    # Made-up tokens and queue tokens: a FIFO, a link to a device, a directory.
    assert plant(f"ec.{os.getpid() + 7}-0badf00d.live", "fifo")
    assert plant(f"ec.{os.getpid() + 8}-0badf00d.live", "link")
    assert plant(f"ec.{os.getpid() + 9}-0badf00d.live", "dir")
    assert plant("ec.q0123456789abcdef.live", "fifo")
    assert plant("ec.q0123456789abcdee.0000000000000000", "fifo")
    sweep_stale_segments()
    Queue(capacity_bytes=4096).close()
    assert owner_alive(tag) is False, "a planted FIFO kept a dead party alive"
    # Repair inside the queue's lock probes the dead party's token (the FIFO): it goes on.
    assert q.get(timeout=10) == "from a party that then exits"
    try:
        q.get(timeout=0.5)  # waits, so repair runs
    except QueueEmpty:
        pass
    for i in range(50):
        q.put(i, timeout=10)
    assert [q.get(timeout=10) for _ in range(50)] == list(range(50))


# --- the other user flocks a token: it cannot, and a death is seen


def _wait_forever(conn: Any) -> None:
    conn.send(identity())
    conn.recv()


def flocked_token() -> None:
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 16)
    qtoken = next(n for n in ec_names() if n.startswith("ec.q") and n.endswith(".live"))
    here, there = ctx.Pipe()
    p = ctx.Process(target=_wait_forever, args=(there,), daemon=True)
    p.start()
    tag = here.recv()
    lockers = [
        subprocess.Popen([*NOBODY, "flock", "-s", f"{SHM}/{name}", "sleep", "60"])
        for name in (f"ec.{tag}.live", qtoken)
    ]
    try:
        time.sleep(0.5)
        assert owner_alive(tag)
        os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
        p.join(30)
        within(
            10,
            "the death of a process whose token the other user locked",
            lambda: not owner_alive(tag),
        )
        q.put("still works")
        assert q.get(timeout=10) == "still works"
    finally:
        for lk in lockers:
            lk.kill()
            lk.wait()


# --- the other user squats every name pattern a queue's slots used to have


def squatted_slot_names() -> None:
    q = Queue(capacity_bytes=1 << 16, side_budget=8 << 20)
    base = q._q.name.lstrip("/")
    evil = evil_body()
    n = 0
    for idx in range(4):
        for gen in range(1, 40):
            how = ("file", "fifo", "link", "dir")[(idx + gen) % 4]
            n += plant(f"{base}.{idx:x}.{gen:x}", how, evil)
    assert n > 100, "the other user could not squat"
    for i in range(30):
        q.put((i, b"s" * BIG), timeout=20)
        got = q.get(timeout=20)
        assert got == (i, b"s" * BIG)
    assert not os.path.exists(MARKER)


# --- a live process's token deleted: it is not judged dead, and nothing it sends is lost


def _writer(q: Any, conn: Any, n: int) -> None:
    conn.send(identity())
    conn.recv()  # its token is gone now
    for i in range(n):
        q.put((i, b"w" * (1000 + 300 * (i % 7))), timeout=30)
        if i % 50 == 0:
            time.sleep(0.01)
    conn.send("done")
    conn.recv()


def deleted_token() -> None:
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 15, max_messages=32)  # small: the writer waits for room
    here, there = ctx.Pipe()
    n = 2000
    w = ctx.Process(target=_writer, args=(q, there, n), daemon=True)
    w.start()
    tag = here.recv()
    os.unlink(f"{SHM}/ec.{tag}.live")  # by hand, or RemoveIPC
    assert owner_alive(tag), "a live process was judged dead: its token alone was missing"
    here.send("go")
    got = [q.get(timeout=30)[0] for _ in range(n)]
    assert got == list(range(n)), "messages of a live writer were lost or reordered"
    assert here.recv() == "done"
    assert owner_alive(tag)
    here.send("bye")
    w.join(30)
    assert not owner_alive(tag)


# --- names of killed processes do not pile up


def _reader(q: Any) -> None:
    identity()
    try:
        q.get(timeout=60)
    except EasycoreError:
        pass


def killed_parties_leave_no_tokens() -> None:
    from easycore._core import sweep_dead_pids

    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 16)

    def start_and_kill(k: int) -> list[int]:
        kids = [ctx.Process(target=_reader, args=(q,), daemon=True) for _ in range(k)]
        for p in kids:
            p.start()
        pids = [p.pid for p in kids]
        within(20, "the readers made their tokens", lambda: all(left(pid) for pid in pids))
        time.sleep(0.2)  # they are waiting in get (registered as parties of the queue)
        for p in kids:
            os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
        for p in kids:
            p.join(30)
        return pids  # type: ignore[return-value]

    def left(pid: int) -> list[str]:
        return [n for n in os.listdir(SHM) if n.startswith(f"ec.{pid}-")]

    # The party that repairs after the dead removes their tokens.
    pids = start_and_kill(12)
    try:
        q.get(timeout=1.0)  # a wait without progress repairs
    except QueueEmpty:
        pass
    stale = [n for pid in pids for n in left(pid)]
    assert stale == [], f"repair left the dead parties' tokens: {stale}"
    # The parent that reaps them removes theirs.
    pids = start_and_kill(12)
    sweep_dead_pids(pids)
    stale = [n for pid in pids for n in left(pid)]
    assert stale == [], f"the reaping parent left the dead children's tokens: {stale}"
    q.put("x")
    assert q.get(timeout=10) == "x"


def killed_producers_leave_no_tokens() -> None:
    import runner_defs as rd
    from easycore.errors import WorkerDiedError

    all_pids: list[int] = []
    for _ in range(3):
        r = rd.SumSquares(devices=3, start_method="fork")
        try:
            assert r(range(10)) == 285
            pids = [p.pid for p in r._workers.procs]  # type: ignore[union-attr]
            all_pids += pids
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            try:
                r(range(10))
            except WorkerDiedError:
                pass
        finally:
            r.close()
    stale = [n for n in os.listdir(SHM) if any(n.startswith(f"ec.{p}-") for p in all_pids)]
    assert stale == [], f"killed producers' names piled up: {stale}"


# --- /dev/shm filled by the other user: a clear error, at once


def filled_shm() -> None:
    q = Queue(capacity_bytes=1 << 16)
    as_nobody("dd", "if=/dev/zero", f"of={SHM}/fill", "bs=1M")
    try:
        Queue(capacity_bytes=32 << 20)
    except EasycoreError as e:
        assert "/dev/shm" in str(e) or "space" in str(e), str(e)
    else:
        raise AssertionError("a queue was made in a full /dev/shm")
    try:
        q.put(b"x" * (4 << 20), timeout=5)
    except EasycoreError as e:
        assert "/dev/shm" in str(e) or "space" in str(e) or "full" in str(e), str(e)
    q.put("small", timeout=5)
    assert q.get(timeout=5) == "small"


SCENARIOS: dict[str, Callable[[], None]] = {
    "slot_swap_killed": lambda: slot_swap("killed"),
    "slot_swap_exited": lambda: slot_swap("exited"),
    "planted_tokens": planted_tokens,
    "flocked_token": flocked_token,
    "squatted_slot_names": squatted_slot_names,
    "deleted_token": deleted_token,
    "killed_parties_leave_no_tokens": killed_parties_leave_no_tokens,
    "killed_producers_leave_no_tokens": killed_producers_leave_no_tokens,
    "filled_shm": filled_shm,
}


def main() -> None:
    global MARKER
    name, MARKER = sys.argv[1], sys.argv[2]
    assert os.geteuid() == 0, "run as root (the victim), with uid 65534 as the other user"
    # The wrapper mounts a fresh tmpfs in a private mount namespace, then leaves this mark.
    assert os.path.exists(f"{SHM}/.private-for-neighbour-tests"), "not the private tmpfs"
    SCENARIOS[name]()
    assert not os.path.exists(MARKER), "the other user's code ran"
    print("ok", flush=True)


if __name__ == "__main__":
    main()
