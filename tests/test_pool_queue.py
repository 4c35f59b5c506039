"""easycore.parallel.Queue: queue.Queue semantics between processes (fork and spawn)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal

import numpy as np
import objqueue_torture
import pool_defs as pd
import pytest
from easycore.errors import InvalidArgument, QueueClosed
from easycore.parallel import Queue

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_objects_between_processes_nothing_lost(method):
    ctx = mp.get_context(method)
    q = Queue(capacity_bytes=1 << 20, max_messages=64)
    out = Queue()
    n_writers, per = 3, 200
    procs = [ctx.Process(target=pd.queue_writer, args=(q, w, per)) for w in range(n_writers)]
    procs.append(ctx.Process(target=pd.queue_reader, args=(q, out, n_writers * per)))
    try:
        for p in procs:
            p.start()
        seen = out.get(timeout=100)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert sorted(seen) == sorted((w, i) for w in range(n_writers) for i in range(per))
    for w in range(n_writers):  # one writer's objects keep their order
        assert [i for ww, i in seen if ww == w] == list(range(per))


def test_queue_semantics_in_one_process():
    q = Queue(capacity_bytes=1 << 16, max_messages=3)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put({"a": 1})
    q.put_nowait([1, 2])
    assert q.qsize() == 2 and not q.empty()
    q.put(np.arange(10))
    assert q.full()
    with pytest.raises(queue.Full):
        q.put(4, timeout=0.05)
    with pytest.raises(queue.Full):
        q.put_nowait(4)
    assert q.get() == {"a": 1}
    rest = q.get_many(10)
    assert len(rest) == 2 and rest[0] == [1, 2] and np.array_equal(rest[1], np.arange(10))
    assert q.empty()
    assert q.put_many(["x", "y"]) == 2
    assert q.get_many(10, timeout=1) == ["x", "y"]
    big = np.random.default_rng(0).random(1 << 20)  # 8 MiB: out of band, side segment
    q.put(big)
    assert np.array_equal(q.get(timeout=10), big)
    q2 = pickle.loads(pickle.dumps(q))
    q2.put("via copy")
    assert q.get(timeout=10) == "via copy"
    q.close()
    assert q.closed
    with pytest.raises(QueueClosed):
        q.put(1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": 100},
        {"capacity_bytes": "16MB"},
        {"capacity_bytes": 2**70},
        {"max_messages": 0},
        {"max_messages": -1},
        {"max_messages": True},
        {"side_budget": -1},
        {"side_budget": 1.5},
    ],
)
def test_bad_sizes_raise_invalid_argument(kwargs):
    # Before, negative and huge ints leaked the core's OverflowError ("can't convert negative
    # int to unsigned") and a str a TypeError from a comparison.
    with pytest.raises(InvalidArgument):
        Queue(**kwargs)


@pytest.mark.parametrize("max_items", [0, -1, 2.0])
def test_get_many_wants_at_least_one_item(max_items):
    # Before, get_many(0) returned one object and get_many(-1) raised OverflowError.
    q = Queue(capacity_bytes=1 << 16)
    q.put("x")
    with pytest.raises(InvalidArgument):
        q.get_many(max_items)
    assert q.get_many(1) == ["x"]
    q.put("y")
    assert q.get_many(2**70) == ["y"]  # before: OverflowError


def test_what_forked_children_leave_in_dev_shm_goes_with_the_next_queue():
    # A child that ends with a bare os._exit runs no exit handler, so nothing removes its
    # liveness token (nor anything of a child that was killed); a program that only uses
    # Queue (no runner, whose start sweeps) piled them up in /dev/shm. (A child that
    # multiprocessing ends removes its own: tests/test_child_exit.py.)
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=4 << 20)  # room for all 12 objects (7 MB): nobody reads yet
    kids = [ctx.Process(target=pd.queue_writer_then_exit, args=(q, w, 4)) for w in range(3)]
    for p in kids:
        p.start()
    for p in kids:
        p.join(30)
        assert p.exitcode == 0

    def left():
        return [
            n for n in os.listdir("/dev/shm") if any(n.startswith(f"ec.{p.pid}-") for p in kids)
        ]

    assert left(), "the children made no tokens: this test tests nothing"
    Queue(capacity_bytes=4096).close()
    assert left() == []
    assert len(q.get_many(100, timeout=10)) == 12


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("method", "rounds", "seed"), [("fork", 30, 1), ("spawn", 6, 2)])
def test_writers_and_readers_killed_at_random_lose_nothing_else(method, rounds, seed):
    # Fault injection (tests/objqueue_torture.py): a writer or reader SIGKILLed (a fifth
    # SIGSTOPped first) at a random point of its stream; every object that arrives is whole
    # and in its writer's order, a surviving writer's objects all arrive, a killed writer's
    # arrive as a prefix, and the queue goes on without the victim.
    out = objqueue_torture.run(rounds, start_method=method, seed=seed)
    assert not out.hung, out.problems
    assert out.problems == []
    assert out.rounds == rounds and out.writers_killed and out.readers_killed


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_death_of_the_process_that_made_the_queue_ends_it_for_the_others(method):
    # The creator's death ends the queue (the next sweep removes its memory). Before, a get
    # with no timeout waited for ever, and one with a timeout said queue.Empty.
    ctx = mp.get_context(method)
    here, there = ctx.Pipe()
    owner = ctx.Process(target=pd.queue_owner, args=(there,))
    owner.start()
    try:
        q = here.recv()
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(30)
        assert q.get(timeout=60) == "left"  # what was queued is still delivered
        with pytest.raises(QueueClosed):
            q.get(timeout=60)
        with pytest.raises(QueueClosed):
            q.put("more", timeout=60)
    finally:
        if owner.is_alive():
            owner.kill()
            owner.join()
