"""Results born in shared memory (easycore.shm): sent by reference, views that outlive the
runner, pool exhaustion, dead holders, no /dev/shm leak (the autouse fixture checks that)."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest
import shm_defs as sd
from easycore import shm
from easycore._core import Queue
from easycore.common.parallel import leases

pytestmark = pytest.mark.timeout(120)

SHM = "/dev/shm"


@pytest.fixture(params=["fork", "spawn"])
def start_method(request):
    return request.param


def test_results_from_shm_empty_arrive_by_reference(start_method):
    with sd.ShmResults(devices=2, start_method=start_method) as r:
        out = r(range(24))
    assert sorted(o[0] for o in out) == list(range(24))
    for i, a, shared, prev_ro in out:
        assert a.shape == (256, 1024) and a.dtype == np.float32
        assert a[0, 0] == i and a[-1, -1] == i and (a == i).all()
        assert shared, "the producer's array was not in shared memory"
        # The producer's previous array was sent by reference: it is read-only now.
        assert prev_ro in (None, True)
    assert sum(o[3] is True for o in out) >= 24 - 2


def test_views_outlive_the_runner(start_method):
    r = sd.ShmResults(devices=1, start_method=start_method)
    out = r(range(6))
    r.close()
    del r
    for i, a, _, _ in out:
        assert (a == i).all()
        a += 1  # the consumer's view is writable and its own
        assert (a == i + 1).all()


def test_slices_strides_and_a_second_send_keep_their_values():
    with sd.ShmViews(devices=1, start_method="fork") as r:
        out = r(range(4))
    for i, a, strided, tail, again in out:
        want = np.arange(1 << 18, dtype=np.int32) + i
        assert (a == want).all()
        assert (strided == want[::3]).all()
        assert (tail == want[5:]).all()
        assert (again == want).all()


def test_a_full_pool_gives_private_arrays_and_never_blocks():
    # queue_scale=0.25: an output pool of 16 MiB, which the producer fills with 4 MiB arrays.
    with sd.ShmHoarder(devices=1, queue_scale=0.25, start_method="fork") as r:
        out = r(range(3))
    for i, shared, last_shared, a in out:
        assert 0 < shared < 64
        assert not last_shared
        assert (a == i % 251).all()


def test_outside_a_producer_arrays_are_ordinary():
    a = shm.zeros((3, 4), dtype=np.int16)
    assert not shm.is_shared(a) and a.sum() == 0 and a.shape == (3, 4)
    assert shm.empty_like(a).dtype == np.int16


def test_small_arrays_stay_private_and_large_ones_are_leased():
    q = Queue(capacity_bytes=1 << 20, pool_bytes=8 << 20)
    leases.set_target(q)
    try:
        assert not shm.is_shared(shm.empty(1000, dtype=np.uint8))
        a = shm.zeros((512, 1024), dtype=np.uint8)
        assert shm.is_shared(a) and a.sum() == 0
        a[:] = 5
        q.put(1, 0, [b"h", a])
        assert a.flags.writeable
        leases.after_send()  # what the worker does after each send
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0, 0] = 1
        _, _, parts = q.get()
        got = np.frombuffer(parts[1], dtype=np.uint8)
        assert got.ctypes.data == a.ctypes.data, "the reader's view is not the same pages"
        assert (got == 5).all()
        del got, parts
        # An array dropped unsent gives its slot back: the pool does not grow.
        before = q.pool_bytes()[0]
        for _ in range(20):
            b = shm.empty((512, 1024), dtype=np.uint8)
            assert shm.is_shared(b)
            del b
        assert q.pool_bytes()[0] == before
        q.audit()
    finally:
        leases.set_target(None)


def test_the_first_large_array_makes_the_pools_segments_at_once():
    """A producer's first array of a size larger than any before makes the segments the pool
    has room for (three per producer and two the consumer holds), not one a call as results
    in flight first need them (each made in a later call cut its speed by half)."""
    q = Queue(capacity_bytes=1 << 20, side_budget=32 << 20)  # a pool of 64 MiB
    leases.set_target(q, producers=2)
    try:
        a = shm.empty(1 << 20, dtype=np.uint8)
        assert shm.is_shared(a)
        made = q.pool_bytes()[0]
        assert made >= (3 * 2 + 2) << 20
        b = shm.empty(1 << 20, dtype=np.uint8)  # the same size again: nothing more is made
        assert shm.is_shared(b)
        assert q.pool_bytes()[0] == made
        del a, b
        q.audit()
    finally:
        leases.set_target(None)


def test_no_more_segments_are_made_than_results_can_be_in_flight():
    """A side budget of 4 MiB (a stream keeps at most twice that of results in flight): for
    2 MiB arrays the producers make four in flight and the two a consumer holds, not the
    eight their room (3 * producers + 2) would allow."""
    q = Queue(capacity_bytes=1 << 20, side_budget=4 << 20)
    leases.set_target(q, producers=2)
    try:
        a = shm.empty(2 << 20, dtype=np.uint8)
        assert shm.is_shared(a)
        assert (2 << 20) <= q.pool_bytes()[0] <= (4 + 2) * (2 << 20)
        del a
        q.audit()
    finally:
        leases.set_target(None)


def _slot_files(q: Queue) -> list[str]:
    return [n for n in os.listdir(SHM) if n.startswith(q.name.lstrip("/") + ".")]


def test_a_dead_producer_frees_its_leases():
    q = Queue(capacity_bytes=1 << 20, pool_bytes=16 << 20)
    pid = os.fork()
    if pid == 0:  # the producer: leases two slots, writes, dies holding them
        try:
            leases.set_target(q)
            a = shm.empty(3 << 20, dtype=np.uint8)
            b = shm.empty(2 << 20, dtype=np.uint8)
            a[:] = 1
            b[:] = 2
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert q.pool_bytes()[0] >= 5 << 20, "the child's leases should exist before repair"
    # The two it held, and the free ones it made with its first array (see leases.lease).
    files = _slot_files(q)
    assert len(files) >= 2
    assert q.recover() >= 2
    left = _slot_files(q)
    assert len(left) == len(files) - 2  # the two it held are gone; the free ones stay
    assert q.pool_bytes()[0] == len(left) * (3 << 20)
    q.audit()
    # The queue goes on: a lease and a round trip work.
    leases.set_target(q)
    try:
        a = shm.empty(1 << 20, dtype=np.uint8)
        a[:] = 3
        q.put(2, 0, [b"h", a])
        _, _, parts = q.get()
        assert (np.frombuffer(parts[1], np.uint8) == 3).all()
    finally:
        leases.set_target(None)


@pytest.mark.timeout(300)
def test_a_producer_killed_at_any_instant_while_making_the_pools_segments():
    """SIGKILL at random instants while a producer makes its share of a fresh pool's segments
    (inside a lease, between a slot taken and its segment made, between two leases): the
    queue's repair takes back all that the dead one held, the pool's bytes are its segments'
    and nothing else, and the pool serves the next producer. Whatever the instant."""
    rng = random.Random(20261126)
    seg = 4 << 20  # the pool's segments for 4 MiB arrays are 4 MiB each
    for _ in range(16):
        q = Queue(capacity_bytes=1 << 20, side_budget=32 << 20)
        try:
            pid = os.fork()
            if pid == 0:  # a producer: its first 4 MiB array makes the pool's segments
                try:
                    leases.set_target(q, producers=2)
                    a = shm.empty(seg, dtype=np.uint8)
                    a[:] = 1
                    os.kill(os.getpid(), signal.SIGKILL)
                finally:
                    os._exit(1)
            time.sleep(rng.uniform(0.0, 0.03))
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status)
            q.recover()
            q.audit()
            assert q.pool_bytes()[0] == len(_slot_files(q)) * seg
            leases.set_target(q, producers=2)
            a = shm.empty(seg, dtype=np.uint8)
            assert shm.is_shared(a)
            a[:] = 3
            q.put(1, 0, [b"h", a])
            _, _, parts = q.get()
            assert (np.frombuffer(parts[1], np.uint8) == 3).all()
            del a, parts
            q.audit()
        finally:
            leases.set_target(None)
            q.close()
            q.unlink()


def test_torch_tensors_from_shm_arrive_whole(start_method):
    pytest.importorskip("torch")
    import shm_torch_defs as td
    import torch

    with td.TensorResults(devices=2, start_method=start_method) as r:
        out = r(range(6))
    assert sorted(o[0] for o in out) == list(range(6))
    for i, t, z in out:
        assert isinstance(t, torch.Tensor) and t.shape == (512, 256)
        assert t.dtype == (torch.bfloat16 if i % 2 else torch.float32)
        assert bool((t == i).all()) and bool((z == 0).all())


def test_a_torch_tensor_from_shm_is_the_readers_memory():
    pytest.importorskip("torch")
    import torch
    from easycore.torch import shm as tshm
    from easycore.torch.parallel.codec import TorchCodec

    q = Queue(capacity_bytes=1 << 20, pool_bytes=8 << 20)
    codec = TorchCodec()
    leases.set_target(q)
    try:
        for dt in (torch.float32, torch.bfloat16):
            t = tshm.empty(512, 256, dtype=dt)
            t.fill_(3)
            q.put(0, 0, codec.dumps((1, t)))
            _, _, parts = q.get()
            _, u = codec.loads(parts)
            assert u.dtype == dt and bool((u == 3).all())
            assert u.data_ptr() == t.data_ptr(), "the tensor was copied"
            del u, parts
    finally:
        leases.set_target(None)


def test_the_pool_grows_to_hold_the_largest_results():
    # queue_scale=0.25: a 16 MiB output pool, which holds one 12 MiB segment; leasing one
    # grows it to hold 3 * producers + 2 of them (a quarter of /dev/shm's free space at most).
    with sd.ShmLarge(devices=1, queue_scale=0.25, start_method="fork") as r:
        out = r(range(6))
    assert sorted(o[0] for o in out) == list(range(6))
    for i, _shared, cap, first, last in out:
        assert first == last == i % 251
        free = (os.statvfs(SHM).f_bavail * os.statvfs(SHM).f_frsize) // 4
        assert cap >= min(4 * (12 << 20), free)
    assert any(o[1] for o in out)
