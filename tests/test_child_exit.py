"""A multiprocessing child that used easycore leaves nothing in /dev/shm when it ends.

multiprocessing ends its children with os._exit, which skips the exit hooks: before, such a
child left its liveness token (`ec.<pid>-<nonce>.live`) and the tokens of the queues it made
(`ec.q<tag>.live`) behind until the next sweep, whatever it closed. Each scenario runs in its
own interpreter (tests/child_exit_defs.py), under a hard time limit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(240)
DEFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_exit_defs.py")


def run_child(kind: str, start_method: str, child_method: str, tmp_path, *extra: str) -> None:
    p = subprocess.run(
        [sys.executable, DEFS, kind, start_method, child_method, str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "clean", (p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("kind", ["pool_closed", "pool_open", "runner_open", "queue"])
def test_a_forked_child_leaves_no_names(kind, tmp_path):
    run_child(kind, "fork", "fork", tmp_path)


@pytest.mark.parametrize(
    ("start_method", "child_method"), [("spawn", "fork"), ("fork", "forkserver"), ("fork", "spawn")]
)
def test_children_of_every_start_method_leave_no_names(start_method, child_method, tmp_path):
    run_child("pool_open", start_method, child_method, tmp_path)


def test_an_executor_left_open_in_a_child_finishes_its_work_first(tmp_path):
    # Its pending futures run to the end (as ProcessPoolExecutor's do at exit), then it stops.
    run_child("executor_pending", "fork", "fork", tmp_path)


def test_a_program_that_exits_while_a_dropped_executor_works_leaves_no_names(tmp_path):
    # The executor's pool is held by the thread that waits for its work; the interpreter's
    # end used to find that thread still holding it: its queues' names stayed behind.
    for _ in range(4):
        p = subprocess.run(
            [sys.executable, DEFS, "executor_pending", "fork", "none", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        held = json.loads(p.stdout)
        assert held, "the program held no names"
        deadline = time.monotonic() + 30  # its workers on their way out hold the queues
        left = [n for n in held if os.path.exists(f"/dev/shm/{n}")]
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [n for n in held if os.path.exists(f"/dev/shm/{n}")]
        assert not left, left
        assert sorted(os.listdir(tmp_path)) == ["0", "1", "2", "3"]
        for f in os.listdir(tmp_path):
            os.unlink(tmp_path / f)


def test_a_child_killed_at_any_step_of_its_exit_leaves_nothing_after_the_sweep(tmp_path):
    # Killed between two steps of its exit (its pools stopped, its queues not yet left; its
    # queues left, its token not yet removed), it leaves names that the next sweep removes.
    rng = random.Random(7)
    for _ in range(8):
        run_child("pool_open", "fork", "fork", tmp_path, f"{rng.random() * 0.03:.4f}")
