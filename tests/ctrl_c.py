"""Runs a script in its own process group and presses Ctrl-C on it (tests of prompt
interrupts, shared by the runner and pool suites)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(__file__)


def ctrl_c_after(body: str, after: str, limit: float) -> str:
    """Runs ``body`` (with this folder importable) until it prints the line ``after``, sends
    SIGINT to its whole process group, as a terminal's Ctrl-C does, and returns everything it
    printed. ``limit`` bounds the wait after the interrupt: a hang fails the test."""
    code = f"import sys\nsys.path.insert(0, {HERE!r})\n" + textwrap.dedent(body)
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        lines = []
        while True:
            line = p.stdout.readline()
            assert line, "the script ended early"
            lines.append(line)
            if line.strip() == after:
                break
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        rest, _ = p.communicate(timeout=limit)
        return "".join(lines) + rest
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (no such process, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def assert_workers_and_names_gone(out: str, limit: float = 10.0) -> None:
    """``out`` (what an interrupted script printed) holds a line ``pids <pid> ...`` with its
    workers and a line ``me <pid>`` with its own pid: every worker ends within ``limit``
    seconds and no shared-memory name of the script's is left in ``/dev/shm``."""
    pids = [int(x) for x in out.split("pids", 1)[1].split("\n", 1)[0].split()]
    me = out.split("me ", 1)[1].split()[0]
    deadline = time.monotonic() + limit
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"ec.{me}-")]
