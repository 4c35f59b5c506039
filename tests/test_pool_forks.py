"""Under fork the pool never forks while it runs threads: its replacement workers (after a
death, for ``maxtasksperchild``) come from a zygote forked with the first ones, so CPython
3.12+ gives no ``DeprecationWarning`` about ``fork()`` in a multi-threaded process, and every
worker sees the caller as it was when the pool was made. Each scenario runs in a fresh
interpreter (``pool_fork_scenarios.py``) under a hard time limit; on Python before 3.12 the
forks are counted all the same (by an ``os.register_at_fork`` hook)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /proc")

HERE = Path(__file__).resolve().parent
LIMIT_S = 240


def _run(scenario: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE / "pool_fork_scenarios.py"), scenario],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        cwd=HERE,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(LIMIT_S + 30)
def test_workers_restarted_by_the_pool_are_not_forked_from_its_threads():
    out = _run("restarts")
    assert out["forks_with_threads"] == [], out
    assert out["fork_warnings"] == 0, out
    assert out["after_idle_death"] is True, out
    assert out["mid_map_death"] == "WorkerDiedError", out
    assert out["after_mid_map_death"] is True, out
    assert out["maxtasksperchild_workers"] >= 3, out  # the first two, then replacements
    assert out["left_behind"] == [], out


@pytest.mark.timeout(LIMIT_S + 30)
def test_replacement_workers_see_the_caller_as_it_was_when_the_pool_was_made():
    # A global changed after the pool was made: the first workers never saw the change,
    # and neither do their replacements (they are forks of the same snapshot).
    out = _run("restarts")
    assert out["values"] == ["at creation"], out


@pytest.mark.timeout(LIMIT_S + 30)
def test_a_caller_that_runs_threads_when_it_makes_a_fork_pool_forks_once():
    # The caller's own fork of each pool's zygote is the one fork made with threads (Python
    # 3.12+ warns there, once a pool, as for any fork of a threaded process); workers and
    # replacements come from the zygote. Two pools here.
    out = _run("threads_at_creation")
    assert len(out["forks_with_threads"]) == 2, out
    if sys.version_info >= (3, 12):
        assert out["fork_warnings"] == 2, out
    assert out["maxtasksperchild_workers"] >= 3, out
    assert out["mid_map_death"] == "WorkerDiedError", out
    assert out["after_idle_death"] is True and out["after_mid_map_death"] is True, out
    assert out["left_behind"] == [], out


@pytest.mark.timeout(LIMIT_S + 30)
def test_pools_made_one_after_the_other_fork_from_one_thread():
    # join() returns once the pool's threads have left the OS, so the next pool forks its
    # zygote from a single-threaded caller.
    out = _run("back_to_back")
    assert out["results"] is True, out
    assert out["forks_with_threads"] == [], out
    assert out["left_behind"] == [], out


@pytest.mark.timeout(LIMIT_S + 30)
def test_a_killed_zygote_loses_nothing():
    # Workers are then forked by the caller itself, as without a zygote.
    out = _run("zygote_killed")
    assert out["zygote_was_a_child"] is True, out
    assert out["after_idle_death"] is True, out
    assert out["mid_map_death"] == "WorkerDiedError", out
    assert out["after_mid_map_death"] is True, out
    assert out["left_behind"] == [], out


@pytest.mark.timeout(LIMIT_S + 30)
def test_descriptors_past_1023_are_watched():
    out = _run("many_fds")
    assert out["highest_fd"] > 1023, out
    assert out["after_idle_death"] is True, out
    assert out["mid_map_death"] == "WorkerDiedError", out
    assert out["after_mid_map_death"] is True, out
    assert out["forks_with_threads"] == [], out
    assert out["left_behind"] == [], out


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(p)
        except OSError:
            pass
    return out


@pytest.mark.timeout(90)
def test_the_zygote_and_its_workers_end_with_a_killed_caller():
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "pool_fork_scenarios.py"), "caller_killed"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=HERE,
    )
    try:
        line = proc.stdout.readline()
        pids = json.loads(line)["pids"]
        assert len(pids) == 3, pids  # the zygote and two workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(pids) == []
    finally:
        proc.kill()
        proc.wait(30)
