"""file_lock: mutual exclusion across processes and threads, timeouts, release on SIGKILL."""

from __future__ import annotations

import inspect
import os
import signal
import threading

import pytest
from _http_server import children
from easycore.common.path import file_lock
from easycore.errors import EasycoreTimeoutError

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
