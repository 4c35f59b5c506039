"""easycore.parallel.Queue: queue.Queue semantics between processes (fork and spawn)."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue

import numpy as np
import pool_defs as pd
import pytest
from easycore.errors import QueueClosed
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
