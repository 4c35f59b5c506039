"""Suite-wide guards: no test may leave a child process or an easycore shared-memory segment
behind (DESIGN.md: nothing leaks, also after errors and kills)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # helper modules importable in spawned children

SHM = "/dev/shm"

# The threads beside a fork: CPython 3.12+ warns ("multi-threaded, use of fork()") without
# naming them; the report below does. Each fork that saw another thread, Python's or the
# OS's, just before it or just after it in the parent (the warning counts the OS threads
# between the two), leaves a line; the warning prints the lines since the last one (a test
# forks many times: the fork that warned need not be the last).
_FORKED_WITH: list[str] = []


def _os_threads() -> list[str]:
    """Each OS thread as ``name/tid/state/start``: its state letter and start time (clock
    ticks since boot) tell an exiting thread that Python already joined from a native one
    that has run since an import (a BLAS helper)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        out.append(f"{head.split('(', 1)[1]}/{tid}/{fields[0]}/{fields[19]}")
    return out


def _note_threads(when: str) -> None:
    python = [f"{t.name}/{t.native_id}" for t in threading.enumerate()]
    native = _os_threads() if os.path.isdir("/proc/self/task") else []
    if len(python) > 1 or len(native) > 1:
        del _FORKED_WITH[:-20]  # bounded: the latest forks are the ones to name
        _FORKED_WITH.append(f"{when}: python {python}, os {native}")


os.register_at_fork(
    before=lambda: _note_threads("before"), after_in_parent=lambda: _note_threads("after")
)


_FORK_REPORTS: list[str] = []  # for the terminal summary (a test's own output is captured)


def pytest_warning_recorded(warning_message, when, nodeid, location) -> None:
    """Names the threads behind a fork-with-threads warning (in the terminal summary)."""
    if "use of fork()" in str(warning_message.message):
        seen = _FORKED_WITH or ["no fork of this process saw another thread"]
        _FORK_REPORTS.append(f"{nodeid}: forked beside other threads: {seen}")
        _FORKED_WITH.clear()


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _FORK_REPORTS:
        terminalreporter.write_line(line)


def _segments() -> set[str]:
    """Segments owned by this process (names carry the owner's identity tag, `<pid>-<nonce>`;
    queues and their side segments are owned by the process that created the queue). The
    process's own liveness token (`.live`) lives as long as the process and is not a leak."""
    prefix = f"ec.{os.getpid()}-"
    try:
        names = os.listdir(SHM)
    except FileNotFoundError:
        return set()
    own = {n for n in names if n.startswith(prefix) and not n.endswith((".live", ".tmp"))}
    # A queue's names carry the queue's tag (`ec.q<hex>.…`) and live while any process holds
    # the queue's token; the token says who made the queue. Names of a queue this process made
    # that nobody holds any more are left behind.
    for tok in (n for n in names if n.startswith("ec.q") and n.endswith(".live")):
        if _unheld_queue_of(tok, prefix):
            qtag = tok[: -len("live")]
            own |= {n for n in names if n.startswith(qtag)}
    return own


def _unheld_queue_of(token: str, prefix: str) -> bool:
    """Whether the queue token `token` was made by this process and nobody holds it."""
    import fcntl

    try:
        fd = os.open(f"{SHM}/{token}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not os.read(fd, 64).decode(errors="replace").startswith(prefix[len("ec.") :]):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: the queue is in use
        return True
    finally:
        os.close(fd)


def _children() -> set[int]:
    me = str(os.getpid())
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[1] the parent pid; zombies are reaped by their owner
        if fields[1] == me and fields[0] != "Z" and not _mp_service(entry):
            kids.add(int(entry))
    return kids


def _mp_service(pid: str) -> bool:
    """multiprocessing's own long-lived helpers (resource tracker, forkserver) started once
    per interpreter by spawn/forkserver: not ours to stop."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"resource_tracker" in cmd or b"forkserver" in cmd


def _settle(check, timeout: float = 30.0):
    """Waits for processes and segments that are on their way out (returns as soon as none
    is left; the bound is generous so that a loaded machine's slow exits are not leaks)."""
    deadline = time.monotonic() + timeout
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = check()
    return left


@pytest.fixture(autouse=True)
def no_leaks():
    """Fails a test that leaves child processes or shared-memory segments of ours."""
    before_kids = _children()
    before_segs = _segments()
    yield
    import gc
    import multiprocessing

    def leftover_segments() -> set[str]:
        multiprocessing.active_children()  # reaps finished children (and drops their args)
        gc.collect()  # queues caught in reference cycles (e.g. a kept traceback) are freed
        return _segments() - before_segs

    kids = _settle(lambda: _children() - before_kids)
    segs = _settle(leftover_segments)
    assert not kids, f"child processes left behind: {sorted(kids)}"
    assert not segs, f"shared-memory segments left behind: {sorted(segs)}"


@pytest.fixture
def probes_asked(monkeypatch):
    """Adaptive reading's schedule (``probes.after_probe``), where the runners and the pool
    use it, replaced by one that keeps the first interval (as for a slow loop); the list of
    each ended interval's ``(items, seconds)``."""
    import easycore._engine.input_side as input_side
    import easycore.parallel.job as job
    from easycore._engine.probes import PROBE_FIRST

    asked: list[tuple[int, float]] = []

    def schedule(items: int, seconds: float, keep: int = 0) -> tuple[int, float]:
        asked.append((items, seconds))
        return max(keep, PROBE_FIRST), seconds / max(1, items)

    for module in (input_side, job):
        monkeypatch.setattr(module, "after_probe", schedule)
    return asked


@pytest.fixture
def chunk_sizes(monkeypatch):
    """The sizes the pools of this process ask for as they slice a sequence into chunks
    (``_Job.take_chunk``), in order: a list."""
    from easycore.parallel.job import _Job

    sizes: list[int] = []
    take_chunk = _Job.take_chunk

    def recorded(self, size):
        sizes.append(size)
        return take_chunk(self, size)

    monkeypatch.setattr(_Job, "take_chunk", recorded)
    return sizes


@pytest.fixture
def sleeps_after_results_came(monkeypatch):
    """``patch(name)``: each send by ``InputSide.<name>`` (a direct read's or a caller's)
    waits until its result is there, as on a core shared with the producer, which runs
    while the sender sends. Returns a list whose one number counts the sleeps announced
    (``receiver_sleeps``) between such a send and the next results taken."""
    from easycore._engine.input_side import InputSide
    from easycore._engine.stream import Call

    take, sleeps = Call._take, InputSide.receiver_sleeps
    after_send = [False]
    slept = [0]

    def takes(self, msgs):
        after_send[0] = False
        return take(self, msgs)

    def receiver_sleeps(self):
        slept[0] += after_send[0]
        return sleeps(self)

    def patch(name: str) -> list[int]:
        send = getattr(InputSide, name)

        def sends(self, *args, **kwargs):
            sent = send(self, *args, **kwargs)
            deadline = time.monotonic() + 60
            while sent and not self.workers.results_waiting() and time.monotonic() < deadline:
                time.sleep(0.0002)
            after_send[0] = sent
            return sent

        monkeypatch.setattr(InputSide, name, sends)
        monkeypatch.setattr(Call, "_take", takes)
        monkeypatch.setattr(InputSide, "receiver_sleeps", receiver_sleeps)
        return slept

    return patch
