"""A program exits cleanly while its daemon threads wait in easycore (src/python/detach.rs).

Before, a thread that came back from a wait in Rust while the interpreter finalized was ended
by CPython with pthread_exit, and the process aborted with "FATAL: exception not rethrown"
(exit status 134): 30 of 30 runs of the first script below did. Each scenario runs several
times in its own interpreter, under a hard time limit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)
HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = 6


def run_exits_cleanly(body: str) -> None:
    code = f"import sys\nsys.path.insert(0, {HERE!r})\n" + textwrap.dedent(body)
    for _ in range(RUNS):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "FATAL" not in p.stderr, (p.returncode, p.stderr[-2000:])
        assert p.stdout.strip() == "main done", p.stdout


def test_daemon_threads_polling_an_object_queue_at_exit():
    run_exits_cleanly(
        """
        import queue, threading, time
        from easycore.parallel import Queue

        q = Queue()

        def poll():
            while True:
                try:
                    q.get(timeout=0.001)
                except queue.Empty:
                    pass

        for _ in range(4):
            threading.Thread(target=poll, daemon=True).start()
        time.sleep(0.05)
        print("main done")
        """
    )


def test_daemon_threads_blocked_in_get_and_put_at_exit():
    # get() without a timeout and put() on a full queue still come back every signal tick.
    run_exits_cleanly(
        """
        import threading, time
        from easycore.parallel import Queue

        empty, full = Queue(), Queue(max_messages=1)
        full.put(0)
        for target in (empty.get, lambda: full.put(1)):
            for _ in range(2):
                threading.Thread(target=target, daemon=True).start()
        time.sleep(0.25)
        print("main done")
        """
    )


def test_daemon_thread_iterating_a_runner_at_exit():
    run_exits_cleanly(
        """
        import itertools, threading, time
        import runner_defs as rd

        r = rd.Collect(devices=1, start_method="fork")

        def stream():
            try:
                for _ in r.imap(itertools.count()):
                    pass
            except Exception:
                pass  # the runner is closed at exit

        threading.Thread(target=stream, daemon=True).start()
        time.sleep(0.3)
        print("main done")
        """
    )
