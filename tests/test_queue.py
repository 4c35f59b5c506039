"""The shared-memory queue across real processes (fork and spawn)."""

from __future__ import annotations

import contextlib
import gc
import glob
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import queue_procs as qp
from easycore._core import Queue, ShmBuffer, retire_identity, shm_space, sweep_stale_segments
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    SharedMemoryError,
)

pytestmark = pytest.mark.timeout(240)


@contextlib.contextmanager
def _started(p: mp.process.BaseProcess) -> Iterator[None]:
    """Starts process ``p``; on the way out, kills it if it still runs."""
    p.start()
    try:
        yield
    finally:
        if p.is_alive():
            p.kill()
            p.join()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_writers_and_readers_exchange_100k_messages_with_checksums(method):
    ctx = mp.get_context(method)
    n_writers, n_readers, per_writer = 3, 2, 34_000
    q = Queue(capacity_bytes=16 << 20, max_messages=4096)
    results = ctx.Queue()
    writers = [ctx.Process(target=qp.writer, args=(q, w, per_writer, results)) for w in range(3)]
    readers = [ctx.Process(target=qp.reader, args=(q, results)) for _ in range(n_readers)]
    procs = writers + readers
    try:
        for p in procs:
            p.start()
        for p in writers:
            p.join(200)
            assert p.exitcode == 0
        q.close()  # readers drain what is left, then get QueueClosed
        got = [results.get(timeout=200) for _ in procs]
        for p in readers:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    w_hash = 0
    for r in got:
        if r[0] == "w":
            w_hash ^= r[3]
    r_hash = 0
    count = 0
    seqs: list[int] = []
    for r in got:
        if r[0] == "r":
            count += r[2]
            r_hash ^= r[3]
            seqs.extend(r[4])
    assert count == n_writers * per_writer >= 100_000
    assert len(set(seqs)) == len(seqs), "a message was delivered twice"
    assert r_hash == w_hash, "content differs between what was put and what was got"
    total, nbytes = q.totals()
    assert total == count
    assert nbytes > 200 << 20  # a few hundred MiB went through, the large ones included


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_close_wakes_blocked_readers_and_writers_in_other_processes(method):
    ctx = mp.get_context(method)
    empty = Queue(capacity_bytes=1 << 20)
    full = Queue(capacity_bytes=1 << 16, max_messages=4)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=qp.blocked_get, args=(empty, results)),
        ctx.Process(target=qp.blocked_put, args=(full, results)),
    ]
    try:
        for p in procs:
            p.start()
        time.sleep(1.0)
        assert all(p.is_alive() for p in procs), "they should be blocked"
        empty.close()
        full.close()
        assert sorted(results.get(timeout=30) for _ in procs) == ["closed", "closed"]
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def test_killed_writer_does_not_block_readers():
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 20, max_messages=64)
    ready = ctx.Queue()
    p = ctx.Process(target=qp.hog_writer, args=(q, ready))
    p.start()
    try:
        ready.get(timeout=30)
        time.sleep(0.3)  # it is now writing (likely mid-copy) or waiting for room
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        # Drain everything it committed; then the queue must be usable and not stuck.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                q.get_many(64, timeout=0.3)
            except QueueEmpty:
                break
        q.put(1, 1, b"after")
        seq, kind, parts = q.get(timeout=10)
        assert (seq, kind, bytes(parts[0])) == (1, 1, b"after")
    finally:
        if p.is_alive():
            p.kill()
            p.join()


def test_killed_reader_does_not_block_writers():
    ctx = mp.get_context("fork")
    q = Queue(capacity_bytes=1 << 18, max_messages=64)
    ready = ctx.Queue()
    p = ctx.Process(target=qp.hog_reader, args=(q, ready))
    p.start()
    try:
        ready.get(timeout=30)
        big = b"y" * (40 << 10)
        for i in range(200):  # keep it busy reading
            q.put(i, 0, big, timeout=10)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        # What was committed and not yet read is read here (whether the writer or the dead
        # reader was ahead when it died depends on the machine's load): then only a claim
        # the dead reader held can take room in the ring, and recovery must free it.
        while True:
            try:
                q.get(timeout=0.5)
            except QueueEmpty:
                break
        n = 0
        while True:
            try:
                q.put(n, 0, big, timeout=0.5)
                n += 1
            except QueueFull:
                break
        assert n >= 1
        seqs: list[int] = []
        while len(seqs) < n:
            seqs += [seq for seq, _, _ in q.get_many(1000, timeout=5)]
        assert seqs == list(range(n))
        q.put(9, 9, b"ok", timeout=10)
    finally:
        if p.is_alive():
            p.kill()
            p.join()


def test_numpy_round_trip_with_pickle_protocol_5():
    q = Queue(capacity_bytes=64 << 20)
    small = np.arange(1000, dtype=np.float32)
    large = np.arange(4 << 20, dtype=np.int64)  # 32 MiB: larger than max_inline
    for arr in (small, large, np.asfortranarray(np.ones((300, 200)))):
        bufs: list[pickle.PickleBuffer] = []
        data = pickle.dumps(arr, protocol=5, buffer_callback=bufs.append)
        q.put(0, 0, [data, *(b.raw() for b in bufs)])
        _, _, parts = q.get()
        back = pickle.loads(parts[0], buffers=parts[1:])
        np.testing.assert_array_equal(back, arr)
        assert back.flags.writeable
    assert large.nbytes > q.max_inline
    # The large one arrived as a zero-copy view of its own segment.
    bufs = []
    data = pickle.dumps(large, protocol=5, buffer_callback=bufs.append)
    q.put(0, 0, [data, *(b.raw() for b in bufs)])
    _, _, parts = q.get()
    assert isinstance(parts[1], ShmBuffer) and len(parts[1]) == large.nbytes


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_large_messages_reuse_pooled_segments_and_held_views_stay_intact(method):
    nbytes, n = 3 << 20, 60
    q = Queue(capacity_bytes=8 << 20, max_messages=64)
    cap = q.pool_bytes()[1]
    p = mp.get_context(method).Process(target=qp.array_writer, args=(q, n, nbytes))
    held = {}
    names = set()
    with _started(p):
        for i in range(n):
            seq, _, parts = q.get(timeout=60)
            assert seq == i
            assert isinstance(parts[1], ShmBuffer)
            a = pickle.loads(parts[0], buffers=parts[1:])
            assert a.nbytes == nbytes and int(a[::4096].min()) == int(a[::4096].max()) == i % 251
            if i % 10 == 0:
                held[i] = a  # keeps its segment busy: later messages must not land in it
            del a, parts
            assert q.pool_bytes()[0] <= cap
            names |= {f for f in os.listdir("/dev/shm") if f.startswith(q.name[1:] + ".")}
        p.join(30)
        assert p.exitcode == 0
    for i, a in held.items():
        assert (a == i % 251).all(), f"held array {i} was written over"
    # 60 messages went through a handful of reused segments, not one segment each.
    assert 0 < len(names) <= len(held) + 6, names
    del held
    name = q.name
    del q, p  # the Process object holds the queue among its arguments
    gc.collect()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(name[1:])]


def test_bodies_too_large_for_the_caches_arrive_whole_in_another_process():
    # Bodies of 16 MiB or more are copied with streaming stores, which the writer fences
    # before it commits: the reader, in another process, must see every byte of each.
    nbytes, n = (16 << 20) + 5, 5
    q = Queue(capacity_bytes=8 << 20, max_messages=64)
    p = mp.get_context("fork").Process(target=qp.pattern_writer, args=(q, n, nbytes))
    with _started(p):
        for i in range(n):
            seq, _, parts = q.get(timeout=60)
            assert seq == i and bytes(parts[0]) == b"h" * 1001
            assert bytes(parts[1]) == qp.pattern(i, nbytes), f"message {i} differs"
            del parts
        p.join(30)
        assert p.exitcode == 0


def test_wait_seconds_count_waits_not_copies():
    # A producer's stats split its time into its work and its waits on the queues (for work,
    # for room): a large put that finds room at once waited for nothing, however long its
    # copy took, and a get that finds its message at once neither.
    q = Queue(capacity_bytes=1 << 20, max_messages=8)
    q.put(1, 0, [np.ones(32 << 20, np.uint8)])
    assert q.wait_seconds == 0.0
    seq, _, parts = q.get(timeout=10)
    assert seq == 1 and len(parts[0]) == 32 << 20
    del parts
    assert q.wait_seconds == 0.0
    with pytest.raises(QueueEmpty):
        q.get(timeout=0.05)
    assert q.wait_seconds > 0.0  # a wait: counted


def test_nonblocking_calls_timeouts_and_stdlib_exceptions():
    import queue

    q = Queue(capacity_bytes=1 << 16, max_messages=2)
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(QueueEmpty):
        q.get(timeout=0.05)
    q.put(1, 0, b"a")
    q.put(2, 0, [b"b", b"c"])
    assert q.qsize() == 2 and len(q) == 2 and not q.empty()
    with pytest.raises(queue.Full):
        q.put(3, 0, b"d", block=False)
    with pytest.raises(QueueFull, match="0 of 2"):
        q.put_many([(3, 0, b"d"), (4, 0, b"e")], timeout=0.05)
    assert [m[0] for m in q.get_many(10)] == [1, 2]
    assert q.put_many([(5, 1, b"x"), (6, 1, (b"y", b"z"))]) == 2
    assert [(s, k, [bytes(p) for p in ps]) for s, k, ps in q.get_many(10)] == [
        (5, 1, [b"x"]),
        (6, 1, [b"y", b"z"]),
    ]
    with pytest.raises(InvalidArgument):
        q.get(timeout=-1)
    with pytest.raises(InvalidArgument):
        q.put(7, 0, b"a", timeout=float("nan"))
    assert q.empty()  # the bad call put nothing
    with pytest.raises(BufferError, match="bytes-like"):
        q.put(0, 0, [object()])


@pytest.mark.parametrize(
    "parts",
    [
        [b"head"],  # small: copied and released under one lock hold
        [b"head", b"b" * 100, bytearray(b"c")],
        [b"head"] + [b"x"] * 5,  # many parts: claimed, then copied
        [b"head", b"big" * 5000],  # a body over the small limit
    ],
)
def test_get_gives_bytes_then_bytearrays_whatever_the_path(parts):
    q = Queue(capacity_bytes=1 << 20)
    for seq in range(3):
        q.put(seq, 2, parts)
    for seq in range(3):
        s, k, got = q.get(timeout=10)
        assert (s, k) == (seq, 2)
        assert type(got[0]) is bytes and all(type(p) is bytearray for p in got[1:])
        assert [bytes(p) for p in got] == [bytes(p) for p in parts]
    assert q.empty() and q.totals() == (3, 3 * sum(len(p) for p in parts))


def test_close_in_another_thread_wakes_a_blocked_get():
    q = Queue(capacity_bytes=1 << 16)
    out = []

    def getter():
        try:
            q.get()
        except QueueClosed as e:
            out.append(e)

    t = threading.Thread(target=getter)
    t.start()
    time.sleep(0.2)
    q.close()
    t.join(10)
    assert not t.is_alive() and isinstance(out[0], EasycoreError)
    with pytest.raises(QueueClosed):
        q.put(0, 0, b"")


def test_pickled_queue_attaches_to_the_same_segment():
    q = Queue(capacity_bytes=1 << 16)
    q2 = pickle.loads(pickle.dumps(q))
    assert q2.name == q.name
    q2.put(4, 2, b"hello")
    assert q.get()[0] == 4
    q.unlink()
    with pytest.raises(EasycoreError, match="gone"):
        pickle.loads(pickle.dumps(q))


def test_shared_memory_errors_are_clear():
    space = shm_space()
    assert space is not None and space[1] > 0
    with pytest.raises(SharedMemoryError, match="/dev/shm"):
        Queue(capacity_bytes=1 << 39)
    assert sweep_stale_segments() >= 0


@pytest.mark.timeout(300)
def test_two_hundred_live_processes_share_one_queue():
    # The party table held 64 live processes: the 65th was refused ("more than 64 live
    # processes use queue"). 200 forked children each put one message and stay alive until
    # the parent has read them all.
    n = 200
    q = Queue(capacity_bytes=1 << 20, max_messages=1024)
    r, w = os.pipe()
    pids = []
    try:
        for i in range(n):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(w)
                    q.put(i, 0, b"from %d" % i, timeout=60)
                    os.read(r, 1)  # returns once the parent closes its end: all alive at once
                    code = 0
                finally:
                    # os._exit skips the exit hook that removes the child's liveness token
                    # (easycore's own forked children retire it so, too).
                    retire_identity()
                    os._exit(code)
            pids.append(pid)
        got = []
        for _ in range(n):
            try:
                got.append(q.get(timeout=30))
            except QueueEmpty:
                break
    finally:
        os.close(w)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        os.close(r)
    assert codes == [0] * n, f"{codes.count(1)} children failed to put"
    assert sorted(seq for seq, _, _ in got) == list(range(n))
    assert all(parts[0] == b"from %d" % seq for seq, _, parts in got)
    q.audit()
    left = [t for p in pids for t in glob.glob(f"/dev/shm/ec.{p}-*.live")]
    assert not left, f"{len(left)} children left their liveness token, e.g. {left[0]}"


@pytest.mark.timeout(120)
def test_a_forked_child_keeps_its_leased_slot_when_the_parent_reuses_it():
    # A leased slot stayed shared with a forked child: once the parent let it go and the
    # slot carried the next message, the child's array changed under it, and the child's
    # writes corrupted that message.
    n = 1 << 20
    q = Queue(capacity_bytes=1 << 20, pool_bytes=8 << 20)
    lease = q.lease(n)
    assert lease is not None
    mv = memoryview(lease).cast("B")
    mv[:] = b"\x01" * n
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.read(go_r, 1)  # the parent has reused the slot
            kept = bytes(mv) == b"\x01" * n
            mv[:] = b"\x07" * n  # must not reach the parent's message
            code = 0 if kept else 3
        finally:
            os.write(done_w, b"x")
            os._exit(code)
    mv.release()
    del mv, lease  # the slot is free for the next large message
    data = b"\x02" * (n - 8192)
    q.put(1, 0, [b"hdr", data])
    os.write(go_w, b"x")
    os.read(done_r, 1)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _, _, parts = q.get(timeout=10)
    assert bytes(parts[1]) == data, "the child's writes reached the parent's message"
    assert code == 0, "the child's leased array changed when the parent reused its slot"
    for fd in (go_r, go_w, done_r, done_w):
        os.close(fd)


def test_a_get_that_runs_out_of_memory_loses_no_message():
    # Building the Python objects of a message that was already taken from the queue can
    # fail (MemoryError); the message must then stay with the handle for the next get, in
    # order. Before, get_many released its claims anyway and a small get's message was gone
    # (or the call panicked).
    testcapi = pytest.importorskip("_testcapi")
    n = 40
    q = Queue(capacity_bytes=1 << 20)
    for i in range(n):
        q.put(i, 0, [b"head%d" % i, b"x" * 100])
    got: list[int] = []
    failures = 0
    for k in range(n):
        try:
            testcapi.set_nomemory(k % 12, k % 12 + 1)  # the (k % 12)th allocation fails
            try:
                m = q.get_many(3, timeout=1) if k % 2 else q.get(timeout=1)
            finally:
                testcapi.remove_mem_hooks()
        except MemoryError:
            failures += 1
            continue
        if k % 2:
            got.extend(seq for seq, _, _ in m)
        else:
            got.append(m[0])
    while len(got) < n:
        got.extend(seq for seq, _, _ in q.get_many(8, timeout=5))
    assert failures > 5, "no allocation failed: the test tested nothing"
    assert got == list(range(n))
    q.audit()


# ----- a queue dropped while another thread forks (the hold's copy in the child) -----


def _queue_tokens() -> set[str]:
    """Queue tokens this process made (their content is the maker's identity tag)."""
    out = set()
    for path in glob.glob("/dev/shm/ec.q*.live"):
        try:
            with open(path) as f:
                if f.read().startswith(f"{os.getpid()}-"):
                    out.add(path)
        except OSError:
            pass
    return out


def test_a_queue_dropped_while_its_hold_is_copied_goes_with_the_next_queue():
    before = _queue_tokens()
    q = Queue(capacity_bytes=1 << 16, max_messages=64)
    [token] = _queue_tokens() - before
    # The descriptor a child being forked copies until it execs: the same open file
    # description as the queue's own, so the same shared lock.
    fd = next(
        int(e)
        for e in os.listdir("/proc/self/fd")
        if os.readlink(f"/proc/self/fd/{e}") == token  # (a link that went: skipped)
        if os.path.exists(f"/proc/self/fd/{e}")
    )
    copy = os.dup(fd)
    del q
    assert os.path.exists(token)  # held by the copy: not the last party, it seems
    os.close(copy)  # the child execs
    other = Queue(capacity_bytes=1 << 16, max_messages=64)  # retries the leave
    assert not os.path.exists(token)
    del other
    assert _queue_tokens() == before


def test_queues_dropped_beside_a_thread_running_subprocesses_leave_no_names():
    before = _queue_tokens()
    stop = threading.Event()

    def spawner() -> None:
        while not stop.is_set():
            subprocess.run(["/bin/true"], check=True)

    t = threading.Thread(target=spawner)
    t.start()
    try:
        for _ in range(400):
            q = Queue(capacity_bytes=1 << 16, max_messages=64)
            del q
    finally:
        stop.set()
        t.join(60)
    # One more queue operation retries every leave a fork's copy kept from being the last.
    last = Queue(capacity_bytes=1 << 16, max_messages=64)
    del last
    assert _queue_tokens() == before


def test_a_queue_dropped_while_its_other_party_is_dying_goes_with_the_next_queue():
    # The other party holds the token until the kernel ends it (SIGKILLed processes release
    # their lock without removing anything): a drop meanwhile cannot be the last.
    before = _queue_tokens()
    ctx = mp.get_context("spawn")
    q = Queue(capacity_bytes=1 << 16, max_messages=64)
    ready = ctx.Queue()
    p = ctx.Process(target=qp.hold_and_wait, args=(q, ready))
    with _started(p):
        assert ready.get(timeout=120) == q.name
        [token] = _queue_tokens() - before
        os.kill(p.pid, signal.SIGSTOP)  # dying, not yet dead
        del q
        assert os.path.exists(token)  # held by the stopped party
        p.kill()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
    other = Queue(capacity_bytes=1 << 16, max_messages=64)  # retries the leave
    assert not os.path.exists(token)
    del other
    assert _queue_tokens() == before
