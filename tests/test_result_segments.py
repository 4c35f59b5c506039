"""Large results and the output queue's pooled segments: a call keeps no more results in
flight than the pool has segments for, and delivered results are not kept alive by the
runner (their segments go back to the pool as soon as the consumer drops them)."""

from __future__ import annotations

import collections
import time

import pytest
import shm_defs as sd
from easycore._core import Queue
from easycore.common.parallel import leases

pytestmark = pytest.mark.timeout(120)


def test_delivered_results_are_not_held_while_the_next_are_awaited():
    # One item per message (window 4, one producer): the results that piled up while the
    # consumer waited arrive in one read; each must be dropped once delivered, not kept
    # until the next read returns (which held a pooled segment per result).
    with sd.HeldResults(devices=1, window=4) as r:
        count, most_alive = r(range(12))
    assert count == 12
    assert most_alive == 0


@pytest.mark.parametrize("nbytes", [1 << 20, (1 << 20) + (100 << 10)])
def test_a_slow_consumer_never_finds_the_pool_full(nbytes):
    # A small output pool (16 MiB: sixteen segments of 1 MiB, fourteen of 1.1 MiB) and a
    # consumer slower than the producer, which keeps the previous result while it waits for
    # the next (an imap loop's variable): the window fills up. Every result must still be
    # born in a pooled segment (after the first call, which learns the results' size).
    with sd.ShmSized(devices=1, queue_scale=0.5) as r:
        list(r.imap((i, nbytes) for i in range(40)))
        for _ in range(2):
            count = private = 0
            for i, shared, a in r.imap((i, nbytes) for i in range(60)):
                time.sleep(0.003)
                assert a.nbytes == nbytes and a[0] == a[-1] == i % 251
                count += 1
                private += not shared
            assert count == 60
            assert private == 0, f"{private} of 60 results found the pool full"


@pytest.mark.parametrize(
    ("method", "lazy", "nbytes"),
    [
        ("imap_unordered", False, 1 << 20),
        ("imap", True, 1 << 20),
        ("imap_unordered", True, (1 << 20) + (100 << 10)),
    ],
)
def test_a_pools_slow_caller_never_finds_the_pool_full(method, lazy, nbytes):
    # The same for a pool. A job's results count as read ahead of its caller until the
    # caller has each one: results taken from the job but not handed out yet (the rest of
    # their chunk) still hold their segments, and the pool must not read more input for
    # them. A list is sliced into chunks (several results per message); a generator is
    # read item by item.
    from easycore.parallel import Pool

    def items(n):
        pairs = [(i, nbytes) for i in range(n)]
        return iter(pairs) if lazy else pairs

    with Pool(1, queue_scale=0.5) as p:
        call = getattr(p, method)
        list(call(sd.shm_sized, items(40)))
        for _ in range(2):
            count = private = 0
            for i, shared, a in call(sd.shm_sized, items(60)):
                time.sleep(0.003)
                assert a.nbytes == nbytes and a[0] == a[-1] == i % 251
                count += 1
                private += not shared
            assert count == 60
            assert private == 0, f"{private} of 60 results found the pool full"


@pytest.mark.parametrize("nbytes", [300 << 10, 1 << 20, 16 << 20, 64 << 20])
def test_results_in_flight_fit_the_pool(nbytes):
    q = Queue(capacity_bytes=1 << 20, side_budget=96 << 20)
    try:
        cap = q.pool_bytes()[1]
        n = leases.results_in_flight(q, nbytes, 2)
        assert n is not None and n >= 2
        fit = min(cap // leases.slot_bytes(nbytes), leases.POOL_SLOTS)
        # With the two a consumer may still hold, they fit (unless one per producer does not).
        assert n + 2 <= fit or n == 2
        assert leases.results_in_flight(q, 1000, 2) is None  # travels in the ring
        assert leases.results_in_flight(None, nbytes, 2) is None
    finally:
        q.close()
        q.unlink()


@pytest.mark.parametrize(
    ("result_bytes", "expected"),
    [
        (1 << 20, 48),  # 1 MiB: the cache bound (about 48 MiB in flight)
        (16 << 20, 6),  # 16 MiB: three per producer (the pool has segments for nine)
        (64 << 20, 2),  # 64 MiB: one per producer
    ],
)
def test_the_window_holds_what_the_output_pool_has_segments_for(result_bytes, expected):
    from types import SimpleNamespace

    from easycore._engine.batching import Sizing

    q = Queue(capacity_bytes=1 << 20, side_budget=96 << 20)  # a pool of 192 MiB
    try:
        call = SimpleNamespace(
            window=10_000,
            window_floor=10_000,
            n=2,
            bytes_per_item=0.0,
            learned=SimpleNamespace(out_bytes_per_item=float(result_bytes)),
            max_inflight_bytes=192 << 20,
            batch_size=lambda: 1,
            out_q=q,
        )
        assert Sizing.window_now(call) == expected  # type: ignore[arg-type]
    finally:
        q.close()
        q.unlink()


def test_a_pool_reads_its_input_for_large_results_a_quarter_window_at_a_time(monkeypatch):
    # Each 1 MiB result is a batch of its own. The engine's input thread asked the pool's
    # feed for a run each time a result or two had been handed out: the scheduler's lock,
    # a segment, its settling and often a wake-up, for every two results. Once the sizes
    # are known, it waits until a quarter of the window is free and reads that much at once.
    import functools

    from easycore.parallel import Pool
    from easycore.parallel.feed import Feed

    runs = collections.Counter()
    next_run = Feed.next_run

    def counted(self, limit, got):
        run = next_run(self, limit, got)
        runs["runs"] += run is not None
        return run

    monkeypatch.setattr(Feed, "next_run", counted)
    work = functools.partial(sd.stamped, nbytes=1 << 20)
    n = 200
    with Pool(2) as p:
        assert sum(1 for _ in p.imap_unordered(work, iter(range(64)))) == 64  # sizes learned
        runs.clear()
        seen = sorted(int(a[0]) for a in p.imap_unordered(work, iter(range(n))))
    assert seen == sorted(i % 251 for i in range(n))
    # 107 runs before (1.9 items a run), 20 now (a window of 46: runs of 11). A smaller
    # /dev/shm bounds the output pool, so the window: 26 runs with 120 MiB, 51 with 64 MiB.
    assert runs["runs"] <= n // 3, f"{runs['runs']} runs for {n} results"


def test_a_pools_chunks_of_large_results_stay_within_a_batchs_bytes(chunk_sizes):
    # A list is sliced into chunks of about 2 ms of work each; a chunk's results travel in
    # one message, in one pooled segment that stays held until the last of them is dropped.
    # 1 MiB results made in tens of microseconds came in chunks of 30 and more: a few such
    # messages held the whole output pool, and every result after found it full (a one-shot
    # segment each, faulted in on both sides: 2-4 GB/s instead of 20-28 on the 2-core VM).
    # Chunks stop at the engine's batch bound, as its batches of large items do.
    import functools

    from easycore._engine.batching import MAX_BATCH_BYTES
    from easycore.parallel import Pool

    nbytes = 1 << 20
    sizes = chunk_sizes
    work = functools.partial(sd.stamped, nbytes=nbytes)
    n = 300
    with Pool(2) as p:
        assert sum(1 for _ in p.imap_unordered(work, iter(range(64)))) == 64  # sizes learned
        assert not sizes  # an iterator is read item by item
        seen = sorted(int(a[0]) for a in p.imap_unordered(work, list(range(n))))
    assert seen == sorted(i % 251 for i in range(n))
    assert sizes and max(sizes) * nbytes <= MAX_BATCH_BYTES, sizes


def test_a_calls_first_batch_of_large_items_is_one_item():
    # A runner that learned its items cost a microsecond sized a call's first batch by cost
    # alone (its items' size is known only once one is pickled): 256 arguments of 1 MiB went
    # as one message of 256 MiB, which one producer took (1 GB/s, 15-20 once in batches
    # of three). The first batch of a call is one item; the next are bounded by bytes.
    import numpy as np
    import runner_defs as rd

    n, nbytes = 96, 1 << 20
    data = [np.full(nbytes, i % 251, np.uint8) for i in range(n)]
    with rd.Heads(devices=2) as r:
        assert r(iter(data[:16])) == sum(i % 251 for i in range(16))  # the cost is learned
        assert r(iter(data)) == sum(i % 251 for i in range(n))
        assert r.stats.batches >= n // 4, r.stats.batches
        assert r(data) == sum(i % 251 for i in range(n))  # a list: sliced by the sender
        assert r.stats.batches >= n // 4, r.stats.batches
