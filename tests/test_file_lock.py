"""file_lock: mutual exclusion across processes and threads, timeouts, release on SIGKILL."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading

import pytest
from _http_server import children
from easycore.common.path import file_lock
from easycore.errors import EasycoreTimeoutError, InvalidArgument

HOLD_SCRIPT = """
import sys
from easycore.common.path import file_lock
with file_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()  # hold until told (or killed)
print("released", flush=True)
"""

COUNT_SCRIPT = """
import sys, time
from easycore.common.path import file_lock
path, times = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()  # all start together
for _ in range(times):
    with file_lock(path, timeout=60):
        with open(path) as f:
            value = int(f.read())
        time.sleep(0.0005)  # widen the window a missing lock would let others in
        with open(path, "w") as f:
            f.write(str(value + 1))
"""


def test_manual_example(tmp_path):
    filename = str(tmp_path / "file")
    with file_lock(filename):
        if not os.path.isfile(filename):
            with open(filename, "w") as f:
                f.write("created")
    assert os.path.isfile(filename + ".lock")
    with open(filename) as f:
        assert f.read() == "created"


def test_creates_parent_folder(tmp_path):
    path = tmp_path / "a" / "b" / "c"
    with file_lock(path) as lock:
        assert lock.locked
        assert os.fspath(lock.path) == str(path) + ".lock"
    assert (tmp_path / "a" / "b" / "c.lock").is_file()
    assert not (tmp_path / "a" / "b" / "c").exists()


def test_default_timeout_is_30_minutes():
    assert inspect.signature(file_lock).parameters["timeout"].default == 30 * 60


def test_times_out_with_clear_error(tmp_path):
    path = str(tmp_path / "f")
    with file_lock(path):
        with pytest.raises(EasycoreTimeoutError, match="f.lock") as info:
            with file_lock(path, timeout=0.2):
                pytest.fail("entered a held lock")
    assert isinstance(info.value, TimeoutError)
    with file_lock(path, timeout=0.2):  # free again
        pass


def test_threads_exclude_each_other(tmp_path):
    path = str(tmp_path / "counter")
    inside = []
    overlaps = []

    def work() -> None:
        for _ in range(50):
            with file_lock(path, timeout=60):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert overlaps == []


@pytest.mark.timeout(120)
def test_processes_exclude_each_other(tmp_path):
    path = str(tmp_path / "counter")
    with open(path, "w") as f:
        f.write("0")
    n, times = 3, 30
    with children(COUNT_SCRIPT, n, path, str(times)) as procs:
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        codes = [p.wait(timeout=90) for p in procs]
    assert codes == [0] * n
    with open(path) as f:
        assert int(f.read()) == n * times


@pytest.mark.timeout(60)
def test_held_by_another_process(tmp_path):
    path = str(tmp_path / "f")
    with children(HOLD_SCRIPT, 1, path) as (proc,):
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(EasycoreTimeoutError):
            with file_lock(path, timeout=0.2):
                pytest.fail("entered a lock another process holds")
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert proc.wait(timeout=30) == 0
    with file_lock(path, timeout=10) as lock:
        assert lock.locked


@pytest.mark.timeout(60)
def test_released_when_holder_is_killed(tmp_path):
    path = str(tmp_path / "f")
    with children(HOLD_SCRIPT, 1, path) as (proc,):
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(EasycoreTimeoutError):
            with file_lock(path, timeout=0.2):
                pytest.fail("entered a lock another process holds")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    with file_lock(path, timeout=10) as lock:  # the kernel dropped the dead holder's lock
        assert lock.locked


# ---------------------------------------------------------------- bad input, threads


def test_one_object_shared_by_threads_waits(tmp_path):
    lock = file_lock(str(tmp_path / "shared"), timeout=60)
    inside: list[int] = []
    overlaps: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(30):
                with lock:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(len(inside))
                    inside.pop()
        except BaseException as e:  # "not reentrant" before the fix
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and overlaps == []
    assert not lock.locked


def test_same_thread_entering_twice_is_refused_not_deadlocked(tmp_path):
    lock = file_lock(str(tmp_path / "f"), timeout=60)
    with lock:
        with pytest.raises(InvalidArgument, match="not reentrant"):
            with lock:
                pytest.fail("entered twice")
        assert lock.locked
    assert not lock.locked


def _timeout_message(path: str, timeout: float = 0.2) -> str:
    with pytest.raises(EasycoreTimeoutError) as info:
        with file_lock(path, timeout=timeout):
            pytest.fail("entered a held lock")
    return str(info.value)


def test_timeout_message_when_this_process_holds_it(tmp_path):
    path = str(tmp_path / "f")
    with file_lock(path):
        message = _timeout_message(path)
    assert "this process" in message and path + ".lock" in message
    assert "another process" not in message
    assert "delete" not in message.lower()  # deleting it would let two holders in


def test_timeout_message_when_another_thread_holds_the_same_object(tmp_path):
    lock = file_lock(str(tmp_path / "f"), timeout=0.2)
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            entered.set()
            leave.wait(timeout=60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(timeout=60)
        with pytest.raises(EasycoreTimeoutError) as info:
            with lock:
                pytest.fail("entered a lock another thread holds")
    finally:
        leave.set()
        t.join(timeout=60)
    message = str(info.value)
    assert "another thread" in message and "another process" not in message
    assert "delete" not in message.lower()


@pytest.mark.timeout(60)
def test_timeout_message_names_the_holding_process(tmp_path):
    path = str(tmp_path / "f")
    with children(HOLD_SCRIPT, 1, path) as (proc,):
        assert proc.stdout.readline().strip() == "locked"
        message = _timeout_message(path)
    assert f"process {proc.pid}" in message
    assert "delete" not in message.lower()


@pytest.mark.parametrize("timeout", [-1, -0.5, float("nan"), "5", True])
def test_bad_timeout_is_refused(tmp_path, timeout):
    with pytest.raises(InvalidArgument, match="timeout"):
        file_lock(str(tmp_path / "f"), timeout=timeout)
    assert not (tmp_path / "f.lock").exists()


def test_bad_acquire_timeout_is_refused(tmp_path):
    lock = file_lock(str(tmp_path / "f"))
    for bad in (-1, float("nan")):
        with pytest.raises(InvalidArgument, match="timeout"):
            lock.acquire(timeout=bad)
    assert not lock.locked


def test_infinite_timeout_is_allowed(tmp_path):
    with file_lock(str(tmp_path / "f"), timeout=float("inf")) as lock:
        assert lock.locked
    with file_lock(str(tmp_path / "f"), timeout=None) as lock:
        assert lock.locked


FORK_ACTIONS = ["release", "exit", "drop"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("action", FORK_ACTIONS)
def test_forked_child_never_releases_the_parents_lock(tmp_path, action):
    path = str(tmp_path / "f")
    lock = file_lock(path, timeout=5)
    lock.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, let go of its copy of the lock, and leave at once
        try:
            os.write(write, b"1" if lock.locked else b"0")
            if action == "release":
                lock.release()
            elif action == "exit":
                lock.__exit__(None, None, None)
            else:
                del lock
                import gc

                gc.collect()
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"0", "a forked child does not hold its parent's lock"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(read)
    assert lock.locked
    other = file_lock(path)
    assert not other.acquire(blocking=False), "the child released the parent's lock"
    lock.release()
    assert other.acquire(blocking=False)
    other.release()


FORKING_HOLDER = """
import os, sys
from easycore.common.path import file_lock
lock = file_lock(sys.argv[1])
lock.acquire()
child = os.fork()
if child == 0:  # the child lives on after its parent dies, holding an inherited descriptor
    sys.stdin.readline()
    os._exit(0)
print(child, flush=True)
sys.stdin.readline()  # hold until killed
"""


@pytest.mark.timeout(60)
def test_lock_is_released_when_its_holder_dies_even_if_a_forked_child_lives(tmp_path):
    path = str(tmp_path / "f")
    grandchild = None
    try:
        with children(FORKING_HOLDER, 1, path) as (proc,):
            grandchild = int(proc.stdout.readline())
            assert not file_lock(path).acquire(blocking=False)  # the parent holds it
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
            os.kill(grandchild, 0)  # still alive, with its copy of the descriptor
            with file_lock(path, timeout=10) as lock:  # released: the child let go at fork
                assert lock.locked
    finally:
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
