"""A runner's consumer hooks run in one thread kept between its calls, which is ended before
any fork of the process and before a runner counts threads to choose its start method, and
with the runner (``_engine/consumer_thread.py``)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import runner_defs as rd
from easycore._engine import consumer_thread
from easycore._engine.consumer_thread import ConsumerSlot, retire_parked

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))


class WhereHooksRun(rd.Collect):
    """Records the thread each call's hooks ran in."""

    @staticmethod
    def producer_work(device, cfg, data):
        return data + 1

    @staticmethod
    def consumer_init(cfg):
        rd.Collect.consumer_init(cfg)
        cfg.thread = threading.current_thread()

    @staticmethod
    def consumer_end(cfg):
        return cfg.thread, cfg.out


def consumer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "easycore-consumer"]


def gone_within(limit: float) -> list[threading.Thread]:
    """The consumer threads still running after at most ``limit`` seconds (a hard bound for
    a thread told to end, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while consumer_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return consumer_threads()


def test_a_runners_calls_run_their_hooks_in_one_thread_kept_between_them():
    retire_parked()
    with WhereHooksRun(2) as r:
        first, out1 = r(range(5))
        assert consumer_threads() == [first]  # parked, waiting for the next call
        second, out2 = r(iter(range(3)))
        third, out3 = r([7])
    assert out1 == [1, 2, 3, 4, 5] and out2 == [1, 2, 3] and out3 == [8]
    assert first is second is third
    assert first.name == "easycore-consumer" and first is not threading.current_thread()
    assert not first.is_alive()  # close() ended it
    assert consumer_threads() == []


def test_a_runner_made_after_another_runners_call_still_forks():
    retire_parked()
    with rd.Collect(1) as a:
        assert a(range(3)) == [0, 1, 2]
        assert len(consumer_threads()) == 1
        with rd.Collect(1) as b:
            assert b.start_method == "fork", repr(b)
            assert consumer_threads() == []  # a's parked thread was ended, not counted
            assert b(range(2)) == [0, 1]
        assert a(range(4)) == [0, 1, 2, 3]  # a new thread for a's next call


def test_a_dropped_runner_ends_its_consumer_thread():
    retire_parked()
    r = rd.Collect(1)
    assert r(range(2)) == [0, 1]
    assert len(consumer_threads()) == 1
    del r
    gc.collect()
    assert gone_within(30) == []


def test_no_fork_of_the_process_sees_a_parked_consumer_thread():
    # In a fresh interpreter: the OS threads right after each fork (an after-fork hook reads
    # them before any thread could start), and CPython 3.12+'s fork-with-threads warning.
    code = f"import sys\nsys.path.insert(0, {HERE!r})\n" + textwrap.dedent(
        """
        import json, multiprocessing, os, threading, warnings
        import runner_defs as rd

        def os_threads():
            with open("/proc/self/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[17])

        at_fork = []
        os.register_at_fork(after_in_parent=lambda: at_fork.append(os_threads()))
        seen = []
        warnings.simplefilter("always", DeprecationWarning)
        warnings.showwarning = lambda m, *a, **k: seen.append(str(m))
        out = {}
        with rd.Collect(2) as r:
            at_fork.clear()  # the runner's own forks are the pool tests' business
            out["result"] = r(range(10))
            out["parked"] = threading.active_count()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            p = multiprocessing.get_context("fork").Process(target=print)
            p.start()
            p.join()
            out["again"] = r(range(3))
        out["at_fork"] = at_fork
        out["warnings"] = [w for w in seen if "fork()" in w]
        print(json.dumps(out))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == list(range(10)) and out["again"] == [0, 1, 2], out
    assert out["parked"] == 2, out  # the consumer thread waited for the next call
    assert out["at_fork"] == [1, 1], out
    assert out["warnings"] == [], out


def test_a_busy_consumer_thread_is_not_reused_and_ends_after_its_job():
    slot = ConsumerSlot("easycore-consumer")
    release = threading.Event()
    ran: list[str] = []
    busy, busy_done = slot.run(lambda: (release.wait(60), ran.append("first")))
    other, other_done = slot.run(lambda: ran.append("second"))  # the first is still busy
    assert other is not busy
    assert other_done.wait(30) and ran == ["second"]
    release.set()
    assert busy_done.wait(30) and ran == ["second", "first"]
    busy.join(30)
    assert not busy.is_alive()  # abandoned by its slot: it ended instead of parking
    again, again_done = slot.run(lambda: ran.append("third"))
    assert again is other  # the parked one is reused
    assert again_done.wait(30)
    slot.retire()
    assert not other.is_alive()


def test_a_job_that_raises_ends_its_thread_and_never_leaves_its_caller_waiting():
    slot = ConsumerSlot("easycore-consumer")
    hooks: list[str] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: hooks.append(args.exc_type.__name__)
    try:
        thread, done = slot.run(lambda: 1 / 0)
        assert done.wait(30)
        thread.join(30)
    finally:
        threading.excepthook = old_hook
    assert not thread.is_alive() and hooks == ["ZeroDivisionError"]
    ran: list[int] = []
    after, after_done = slot.run(lambda: ran.append(1))
    assert after is not thread and after_done.wait(30) and ran == [1]
    slot.retire()
    assert not after.is_alive()


def test_parked_threads_can_be_ended_by_the_thread_that_holds_the_lock():
    # A runner's finalizer (garbage collection, at any allocation) or a signal handler may
    # end consumer threads while their thread is inside the module's lock.
    slot = ConsumerSlot("easycore-consumer")
    other = ConsumerSlot("easycore-consumer")
    thread, done = slot.run(lambda: None)
    other_thread, other_done = other.run(lambda: None)
    assert done.wait(30) and other_done.wait(30)  # both parked

    def inside_the_lock() -> None:
        with consumer_thread._LOCK:
            slot.retire()
            retire_parked()

    t = threading.Thread(target=inside_the_lock, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "ending parked threads waited on the lock its own thread held"
    assert not thread.is_alive() and not other_thread.is_alive()
