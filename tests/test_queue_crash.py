"""The queue's crash model, tested by killing processes: random SIGKILL/SIGSTOP
torture, zombies and stopped lock holders, owners that die, other PID namespaces, and bad
arguments or corrupt segments that must be clear errors, never a crash."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import crash_torture
import pytest
from easycore._core import Queue, ReorderBuffer, owner_alive, sweep_stale_segments
from easycore.errors import (
    EasycoreTimeoutError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    SharedMemoryError,
)

pytestmark = pytest.mark.timeout(300)

SHM = "/dev/shm"
PY = sys.executable
HERE = os.path.dirname(__file__)


def _check(out: crash_torture.Outcome) -> None:
    assert out.hung == [], f"processes still blocked after close: {out.hung}"
    assert out.corrupt == [], f"half-written or mixed-up messages: {out.corrupt[:5]}"
    assert out.duplicates == 0, "a message was delivered twice"
    assert out.audit_error is None, out.audit_error
    assert len(out.received) > out.kills, "the survivors made no progress"


def test_writers_killed_at_random_lose_no_acknowledged_message():
    out = crash_torture.run(kills=500, victims="writers", seed=11)
    _check(out)
    assert out.missing == set(), f"{len(out.missing)} acknowledged messages were lost"
    assert out.stops > 50 and out.kills == 500


def test_anyone_killed_at_random_no_hang_no_duplicate_no_corruption():
    out = crash_torture.run(kills=1000, victims="any", seed=12)
    _check(out)
    # A reader killed between getting a batch and logging it takes that batch with it;
    # nothing else may be missing.
    assert len(out.missing) <= crash_torture.READ_BATCH * out.reader_kills
    assert out.reader_kills > 100


def test_readers_killed_at_random_leave_the_queue_consistent():
    out = crash_torture.run(kills=400, victims="readers", seed=13, writers=3, readers=2)
    _check(out)
    assert len(out.missing) <= crash_torture.READ_BATCH * out.reader_kills


def test_live_writers_judged_dead_lose_nothing_acknowledged_and_wedge_nothing():
    # A live writer's liveness token is deleted mid-stream (by hand, by systemd-logind's
    # RemoveIPC, by a sweep), and it is stopped a while wherever it was (copying a body,
    # committing) while the others may judge it dead, then resumed before it is killed. Its
    # late commits must be refused (its put raises, so nothing was acknowledged), never
    # land behind `read`: before, such a commit lost an acknowledged message and pinned the
    # tail for good (audit passed).
    out = crash_torture.run(kills=160, victims="writers", seed=21, false_deaths=0.6)
    _check(out)
    assert out.false_deaths > 50
    assert out.missing == set(), f"{len(out.missing)} acknowledged messages were lost"


def test_writers_sending_by_reference_killed_at_random_leak_no_slot():
    # Writers lease slots, fill them and send them by reference; kills land between any two
    # steps (holding a lease, mid hand-over, mid commit).
    out = crash_torture.run(kills=300, victims="writers", seed=15, byref=True)
    _check(out)
    assert out.missing == set(), f"{len(out.missing)} acknowledged messages were lost"
    assert out.pool_left == 0, f"{out.pool_left} bytes of pooled segments leaked"


def test_anyone_killed_while_sending_by_reference_no_hang_no_leak():
    out = crash_torture.run(kills=300, victims="any", seed=16, byref=True)
    _check(out)
    assert len(out.missing) <= crash_torture.READ_BATCH * out.reader_kills
    assert out.pool_left == 0, f"{out.pool_left} bytes of pooled segments leaked"


def test_the_dead_leave_nothing_named_after_a_sweep():
    out = crash_torture.run(kills=60, victims="any", seed=14)
    _check(out)
    sweep_stale_segments()
    left = [n for n in os.listdir(SHM) for pid in out.dead_pids if n.startswith(f"ec.{pid}-")]
    assert left == [], f"names of dead processes left in /dev/shm: {left[:5]}"


def _run_py(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE,
    )


def test_a_timeout_is_honoured_whatever_the_spin():
    # spin_us is a minute: a get with a 0.2 s timeout must still return (the old spin loop
    # ignored the deadline). The hard limit below turns a hang into a failure.
    r = _run_py(
        """
        from easycore._core import Queue
        from easycore.errors import QueueEmpty, QueueFull
        q = Queue(capacity_bytes=1 << 16, max_messages=1, spin_us=60_000_000)
        try:
            q.get(timeout=0.2)
        except QueueEmpty:
            print("empty")
        q.put(1, 0, b"x")
        try:
            q.put(2, 0, b"y", timeout=0.2)
        except QueueFull:
            print("full")
        """,
        timeout=30,
    )
    assert r.stdout.split() == ["empty", "full"], r.stderr


def test_put_many_says_how_many_went_in():
    q = Queue(capacity_bytes=1 << 16, max_messages=4)
    with pytest.raises(QueueFull) as e:
        q.put_many([(i, 0, b"m") for i in range(10)], timeout=0.05)
    assert e.value.count == 4
    assert len(q.get_many(10)) == 4
    q.close()
    with pytest.raises(QueueClosed) as e:
        q.put_many([(i, 0, b"m") for i in range(3)])
    assert e.value.count == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": 2**64 - 1},
        {"capacity_bytes": 1 << 41},
        {"max_messages": 0},
        {"max_messages": 1 << 40},
    ],
)
def test_bad_queue_arguments_are_clear_errors(kwargs):
    with pytest.raises(InvalidArgument):
        Queue(**kwargs)


def test_bad_reorder_windows_are_clear_errors():
    for window in (0, 10**12, 1 << 30):
        with pytest.raises(InvalidArgument, match="window"):
            ReorderBuffer(window)


def _shm_file(q: Queue) -> str:
    return os.path.join(SHM, q.name.lstrip("/"))


def test_a_corrupt_header_is_refused_at_attach():
    q = Queue(capacity_bytes=1 << 16)
    with open(_shm_file(q), "r+b") as f:
        f.seek(24)  # the ring size
        f.write((12345).to_bytes(8, "little"))
    with pytest.raises(SharedMemoryError, match="ring size"):
        Queue.attach(q.name)
    with open(_shm_file(q), "r+b") as f:
        f.seek(0)
        f.write(b"notaqueue")
    with pytest.raises(SharedMemoryError, match="not an easycore queue"):
        Queue.attach(q.name)


@pytest.mark.parametrize("where", ["part_length", "part_count", "record_size"])
def test_a_corrupt_record_is_an_error_not_a_crash(where):
    q = Queue(capacity_bytes=1 << 16)
    q.put(1, 0, [b"abc", b"defgh"])
    ring = 6 * 4096  # the first record starts the ring; its body follows its 64-byte header
    with open(_shm_file(q), "r+b") as f:
        if where == "part_length":
            f.seek(ring + 64 + 8)
            f.write((1 << 40).to_bytes(8, "little"))
        elif where == "part_count":
            f.seek(ring + 16)  # the record's part count
            f.write((1 << 20).to_bytes(4, "little"))
        else:
            f.seek(ring + 32)  # the record's size
            f.write((7).to_bytes(8, "little"))
    with pytest.raises(SharedMemoryError, match="corrupt"):
        q.get(timeout=1)


def test_a_stopped_lock_holder_makes_others_wait_bounded_then_a_kill_frees_them():
    # A child puts and gets in a loop; it is stopped at random instants (often inside the
    # lock). The parent's calls must each return within their timeouts while it is stopped,
    # and the queue must work normally once it is killed.
    q = Queue(capacity_bytes=1 << 16, max_messages=16)
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                q.put(0, 0, b"spin", timeout=1)
                q.get(timeout=1)
        finally:
            os._exit(0)
    try:
        for _ in range(40):
            time.sleep(0.002)
            os.kill(pid, signal.SIGSTOP)
            try:
                q.put(1, 1, b"mine", timeout=0.05)
                q.get(timeout=0.05)
            except (QueueFull, QueueEmpty):
                pass  # the stopped child may hold the lock: waiting is bounded
            os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGKILL)
        # Not reaped yet: a zombie that may hold the lock must read as dead. (A call with
        # block=False never waits, so it cannot take a dead holder's lock over: it may say
        # Empty until a call with a timeout has; hence timeouts here.)
        time.sleep(0.05)
        q.put(7, 7, b"after", timeout=5)
        seqs = []
        while not seqs or seqs[-1] != 7:
            seqs.append(q.get(timeout=5)[0])
            assert len(seqs) <= 16, seqs  # at most the queue's 16 messages came first
        with pytest.raises(QueueEmpty):
            q.get(timeout=0.2)
        q.audit()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def test_an_owner_killed_leaves_nothing_named_once_a_survivor_notices():
    # The caller creates a queue whose large messages live in pooled segments, forks a
    # consumer that watches the caller, and is SIGKILLed: the consumer removes every name the
    # caller owned, then exits.
    script = f"""
        import os, sys, time
        sys.path.insert(0, {HERE!r})
        from easycore._core import Queue, exit_when_dead
        q = Queue(capacity_bytes=1 << 20, pool_bytes=8 << 20)
        kid = os.fork()
        if kid == 0:
            exit_when_dead(q.owner)
            while True:
                try:
                    q.get(timeout=0.5)
                except Exception:
                    pass
        for i in range(6):
            q.put(i, 0, [b"h", bytes(1 << 20)])
        time.sleep(0.3)
        print(q.owner, kid, q.name.split(".")[1], flush=True)
        time.sleep(600)
    """
    p = subprocess.Popen(
        [PY, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True, cwd=HERE
    )
    try:
        tag, kid, qtag = p.stdout.readline().split()
        assert any(n.startswith(f"ec.{tag}.") for n in os.listdir(SHM))
        # The queue's names carry the queue's tag: they go with the last process using it.
        assert any(n.startswith(f"ec.{qtag}.") and n != f"ec.{qtag}.live" for n in os.listdir(SHM))
        p.kill()
        p.wait(30)
        deadline = time.monotonic() + 20
        left = None
        while time.monotonic() < deadline:
            left = [n for n in os.listdir(SHM) if n.startswith((f"ec.{tag}", f"ec.{qtag}."))]
            gone = not os.path.exists(f"/proc/{kid}") or _state(int(kid)) == "Z"
            if not left and gone:
                break
            time.sleep(0.05)
        assert left == [], f"left in /dev/shm after the owner died: {left}"
        assert not owner_alive(tag)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _free_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    for pid in range(min(pid_max - 1, 4_000_000), 1000, -7919):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise RuntimeError("no free pid")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
    )
    return r.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (PID namespaces)")
def test_a_queue_in_another_pid_namespace_survives_sweeps_outside():
    # Inside a new PID namespace (sharing /dev/shm, as `docker --ipc=host` does), a process
    # with a pid that does not exist outside creates a queue; a sweep outside must leave it.
    pid = _free_pid()
    inner = f"""
        import os, sys
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str({pid} - 1))
        kid = os.fork()
        if kid == 0:
            assert os.getpid() == {pid}, os.getpid()
            from easycore._core import Queue
            q = Queue(capacity_bytes=1 << 16)
            q.put(1, 2, b"inside")
            print(q.name, flush=True)
            sys.stdin.readline()
            print("ok" if bytes(q.get(timeout=5)[2][0]) == b"inside" else "bad", flush=True)
            os._exit(0)
        os.waitpid(kid, 0)
    """
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", textwrap.dedent(inner)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        name = p.stdout.readline().strip()
        assert name.startswith("/ec.q"), name  # a queue's names carry the queue's tag
        assert not os.path.exists(f"/proc/{pid}"), "that pid exists outside too"
        tokens = [n for n in os.listdir(SHM) if n.startswith(f"ec.{pid}-")]
        assert tokens, "the inner process made no liveness token"
        sweep_stale_segments()
        assert os.path.exists(SHM + name), "a live queue in another namespace was swept"
        for t in tokens:
            assert os.path.exists(SHM + "/" + t), "a live process's token was swept"
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "ok"
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_zombie_lock_holder_is_taken_over_while_the_caller_holds_the_gil():
    # A child is stopped until it is caught inside the queue's lock (the lock word, at
    # offset 128 of the segment, is non-zero), then SIGKILLed and left unreaped: a zombie
    # holding the lock. The parent, holding the GIL, must take the lock over. Before, the
    # liveness check said "alive" for the zombie and put() waited forever with the GIL held.
    # Parent and child share one CPU, so the child is stopped where the parent's wake-up
    # preempted it, at any instruction. On CPUs of its own it was never caught on a 16-core
    # VM (Firecracker): there the stop seemed to land only outside the lock.
    code = """
        import os, random, signal, time
        from easycore._core import Queue
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        q = Queue(capacity_bytes=1 << 16, max_messages=8)
        path = "/dev/shm" + q.name
        kid = os.fork()
        if kid == 0:
            while True:
                q.put(0, 0, b"spin")
                q.get()
        caught = False
        fd = os.open(path, os.O_RDONLY)
        for _ in range(20000):
            time.sleep(random.uniform(0, 0.0005))  # the child runs; waking preempts it
            os.kill(kid, signal.SIGSTOP)
            time.sleep(0.0005)
            if int.from_bytes(os.pread(fd, 4, 128), "little") != 0:
                caught = True
                break
            os.kill(kid, signal.SIGCONT)
        os.close(fd)
        os.kill(kid, signal.SIGKILL)
        time.sleep(0.1)  # dead, not reaped
        q.put(1, 1, b"after the zombie", timeout=10)
        while True:
            seq, _, parts = q.get(timeout=10)
            if seq == 1:
                break
        print("caught" if caught else "missed", bytes(parts[0]).decode())
        os.waitpid(kid, 0)
    """
    r = _run_py(code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "caught", "the child was never stopped inside the lock"
    assert "after the zombie" in r.stdout


def test_a_forked_child_keeps_the_zero_copy_array_it_inherited():
    # The parent holds a zero-copy view of a pooled large message, forks, then drops its
    # view and sends more large messages, which reuse the slot. The child's inherited array
    # must still hold the first message (before, it changed under the child).
    import numpy as np

    q = Queue(capacity_bytes=1 << 20, pool_bytes=4 << 20)
    n = 1 << 20
    q.put(1, 0, [b"h", np.full(n, 1, np.uint8)])
    view = np.frombuffer(q.get()[2][1], np.uint8)
    assert view[0] == 1
    r, w = os.pipe()
    kid = os.fork()
    if kid == 0:
        code = 3
        try:
            os.read(r, 1)  # wait until the parent reused the slot
            code = 0 if (view == 1).all() else 1
        finally:
            os._exit(code)
    try:
        del view
        for v in range(2, 6):
            q.put(v, 0, [b"h", np.full(n, v, np.uint8)])
            got = q.get()[2][1]
            assert np.frombuffer(got, np.uint8)[0] == v
            del got
        os.write(w, b"x")
        _, status = os.waitpid(kid, 0)
        assert os.WEXITSTATUS(status) == 0, "the child's inherited array changed"
    finally:
        os.close(r)
        os.close(w)


def test_a_stopped_lock_holder_bounds_every_call_and_a_kill_frees_the_lock():
    # The lock is held by a live process that is stopped (SIGSTOP): a get or put with a
    # timeout, and a recovery, must each come back (an error or a result), never hang; once
    # the holder is killed, the next call takes the lock over.
    q = Queue(capacity_bytes=1 << 16, max_messages=4)
    q.put(1, 0, b"mine")  # this process: party 1, first registration
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            q.put(2, 0, b"child")  # the child: party 2, first registration
            code = 0
        finally:
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(code)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        # The lock word (offset 128) names the child's registration: party 2, generation 1.
        with open(_shm_file(q), "r+b") as f:
            f.seek(128)
            f.write((2 | 1 << 11).to_bytes(4, "little"))
        for _ in range(2):
            with pytest.raises(QueueEmpty):
                q.get(timeout=2)
            with pytest.raises(QueueFull):
                q.put(3, 0, [b"x"] * 2, timeout=2)
            assert q.recover() == 0
            with pytest.raises(EasycoreTimeoutError):
                q.audit(timeout=1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert [q.get(timeout=10)[0] for _ in range(2)] == [1, 2]
        q.audit()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_readers_killed_while_they_spin_keep_no_message_from_a_sleeping_reader():
    # A reader that spins says so in the queue's header, and the next commit, which it
    # would take, wakes no sleeping reader. Spinners killed at various depths of their wait
    # (before, during or after their spin; their claim may be left behind in force) must
    # not keep the message committed next from the reader that sleeps: it gets each one,
    # woken or at the end of its own sleep's tick. The hard limits turn a hang into a failure.
    rounds = 40
    q = Queue(capacity_bytes=1 << 16, max_messages=16)
    rfd, wfd = os.pipe()
    sleeper = os.fork()
    if sleeper == 0:
        try:
            os.close(rfd)
            mine = Queue.attach(q.name, spin_us=0)  # sleeps at once
            for _ in range(rounds):
                os.write(wfd, b"%d\n" % mine.get(timeout=60)[0])
        finally:
            os._exit(0)
    os.close(wfd)
    got: list[int] = []
    try:
        with os.fdopen(rfd) as lines:
            for i in range(rounds):
                spinner = os.fork()
                if spinner == 0:
                    try:
                        Queue.attach(q.name, spin_us=60_000_000).get(timeout=60)
                    finally:
                        os._exit(0)
                time.sleep(0.0005 * (i % 8))
                os.kill(spinner, signal.SIGKILL)
                os.waitpid(spinner, 0)
                q.put(i, 0, b"x", timeout=5)
                got.append(int(lines.readline()))  # before the next spinner could take it
        assert got == list(range(rounds))
        assert os.waitpid(sleeper, 0)[1] == 0
        sleeper = 0
        q.audit()
    finally:
        if sleeper:
            os.kill(sleeper, signal.SIGKILL)
            os.waitpid(sleeper, 0)
