"""Lifelines (``easycore._core.Lifelines``): robust process-shared mutexes in the producers'
shared state that the kernel marks when their holder ends, read by the caller as its "are all
producers alive" look without a system call. Held while the holder lives or is stopped, dead
once it is killed (before it is reaped), refused where they do not fit; a pool's workers hold
theirs from their start, a killed one reads dead and the next call restarts the workers
quietly; once a producer is replaced, lifelines are no longer read."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import signal
import time
from typing import Any

import pool_defs as pd
import pytest
import retire_defs as rd
from easycore._core import Lifelines
from easycore.parallel import Pool

pytestmark = [
    pytest.mark.skipif(not Lifelines.supported(), reason="lifelines are Linux only"),
    pytest.mark.timeout(300),
]


def _shared(nbytes: int) -> memoryview:
    """Shared anonymous memory that forked children share."""
    return memoryview(mmap.mmap(-1, nbytes))


def _hold_and_wait(buf: Any, i: int, conn: Any) -> None:
    """A child: holds lifeline ``i`` of ``buf``, says whether it could, then waits."""
    conn.send(Lifelines(buf, 0, 2).hold(i))
    while True:
        time.sleep(60)


def _holder(ctx: Any, buf: Any, i: int) -> tuple[Any, bool]:
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_hold_and_wait, args=(buf, i, child), daemon=True)
    p.start()
    assert parent.poll(60), "the child did not start"
    return p, parent.recv()


def test_lifelines_refuse_a_place_that_does_not_fit() -> None:
    buf = _shared(4096)
    with pytest.raises(ValueError, match="do not fit"):
        Lifelines(buf, 4096 - Lifelines.slot_bytes + 8, 1)
    with pytest.raises(ValueError, match="8-aligned"):
        Lifelines(buf, 4, 1)
    with pytest.raises(BufferError):
        Lifelines(b"\0" * 4096, 0, 1)  # not writable
    lines = Lifelines(buf, 64, 2)
    with pytest.raises(IndexError):
        lines.init(2)
    assert len(lines) == 2


def test_a_lifeline_says_held_while_its_holder_lives_or_is_stopped_and_dead_once_killed() -> None:
    ctx = multiprocessing.get_context("fork")
    buf = _shared(2 * Lifelines.slot_bytes)
    lines = Lifelines(buf, 0, 2)
    lines.init(0)
    lines.init(1)
    assert lines.look(0) == "free" and not lines.all_held()
    a, took = _holder(ctx, buf, 0)
    b = None
    try:
        assert took
        b, took = _holder(ctx, buf, 1)
        assert took
        assert lines.all_held()
        c, took = _holder(ctx, buf, 0)
        c.kill()
        c.join(60)
        assert not took, "a lifeline held by a live process is not taken"
        assert lines.look(0) == "held", "a process that could not take it does not release it"
        os.kill(a.pid, signal.SIGSTOP)
        assert lines.look(0) == "held", "a stopped process is alive"
        os.kill(a.pid, signal.SIGKILL)
        # Dead as soon as the kernel ends it: a zombie (not reaped yet) is dead.
        seen = "held"
        for _ in range(6000):
            seen = lines.look(0)
            if seen != "held":
                break
            time.sleep(0.01)
        assert seen == "dead"
        assert lines.look(0) == "free", "the look that saw it dead freed it"
        assert not lines.all_held()
        assert lines.look(1) == "held"
    finally:
        for p in (a, b):
            if p is not None:
                p.kill()
                p.join(60)
    assert lines.look(1) == "dead"


def _lifelines(p: Pool) -> Any:
    return p._stream.runner._workers._lifelines


def test_a_pools_workers_hold_their_lifelines_and_a_killed_one_reads_dead() -> None:
    with Pool(2) as p:
        assert p.map(pd.square, range(10)) == [x * x for x in range(10)]
        lines = _lifelines(p)
        assert lines is not None and len(lines) == 2 and lines.all_held()
        workers = p._stream.runner._workers
        assert not workers.exited()
        victim = workers.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(60)
        assert workers.exited()  # the lifeline says so (and is freed), then the sentinel
        assert lines.look(1) == "free" and lines.look(0) == "held"
        # Nothing was on its way: the next call restarts the workers quietly.
        assert p.map(pd.square, range(10)) == [x * x for x in range(10)]
        fresh = _lifelines(p)
        assert fresh is not None and fresh is not lines and fresh.all_held()


def test_lifelines_are_no_longer_read_once_a_worker_was_replaced() -> None:
    with Pool(1, maxtasksperchild=3) as p:
        # One task of three: the worker has not retired yet.
        assert [x for x, _ in p.imap(rd.pid_of, range(1), chunksize=1)] == [0]
        workers = p._stream.runner._workers
        before = _lifelines(p)
        assert before is not None
        out = list(p.imap(rd.pid_of, range(6), chunksize=1))
        assert [x for x, _ in out] == list(range(6))
        assert len({pid for _, pid in out}) >= 2  # replaced
        assert workers._lifelines is None
        assert not workers.exited()  # the sentinels answer: all alive
