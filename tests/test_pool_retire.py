"""``maxtasksperchild``: each worker retires after exactly its own ``maxtasksperchild`` tasks
and a new one takes its place in the running stream, while the other workers go on
(``_engine/retire.py``): every result arrives once, under fork, forkserver and spawn; a
worker's pid serves at most ``maxtasksperchild`` tasks; a worker busy with a long task keeps
its pid while the others are replaced; and a producer killed at each step of the hand-over
loses nothing or fails cleanly as a worker's death. A task stuck in C code past
``task_timeout`` has its worker replaced alone, the others keep their pids and their tasks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import retire_defs as rd
from easycore._core import sweep_stale_segments
from easycore.errors import PoolTimeoutError, WorkerDiedError
from easycore.parallel import Pool

METHODS = ["fork", "forkserver", "spawn"]


def _per_pid(pids: list[int]) -> Counter[int]:
    return Counter(pids)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("method", METHODS)
def test_every_result_arrives_exactly_once(method: str, k: int) -> None:
    n = 8 if method == "fork" else 6  # spawn starts a process per k tasks: keep it short
    with Pool(2, maxtasksperchild=k, start_method=method) as pool:
        futs = [pool.submit(rd.pid_of, -x) for x in range(1, n + 1)]
        unordered = list(pool.imap_unordered(rd.pid_of, iter(range(n))))
        ordered = pool.map(rd.pid_of, range(2 * n), chunksize=2)
        starred = pool.starmap(rd.pids_of, [(x, x) for x in range(n)], chunksize=1)
        tasks = [f.result(timeout=300) for f in futs]
        pool.close()
        pool.join()
    assert sorted(x for x, _ in tasks) == list(range(-n, 0))
    assert sorted(x for x, _ in unordered) == list(range(n))
    assert [x for x, _ in ordered] == list(range(2 * n))
    assert [xs for xs, _ in starred] == [(x, x) for x in range(n)]
    # Tasks per pid: a submitted task, an imap item, a map chunk (2 items), a starmap item.
    served = _per_pid(
        [p for _, p in tasks]
        + [p for _, p in unordered]
        + [p for _, p in ordered[::2]]  # one per chunk: chunk i is items 2i, 2i+1
        + [p for _, p in starred]
    )
    assert max(served.values()) <= k, served
    for i in range(0, 2 * n, 2):  # a chunk runs in one worker
        assert ordered[i][1] == ordered[i + 1][1]
    total = n + n + n + n
    assert len(served) >= -(-total // k)  # at least ceil(tasks / k) workers served


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_retires_alone_while_another_runs_a_long_task(method: str, tmp_path) -> None:
    release = str(tmp_path / "release")
    k = 3
    with Pool(2, maxtasksperchild=k, start_method=method) as pool:
        long = pool.submit(rd.hold_until, release, 240.0)
        quick = [pool.submit(rd.pid_of, x) for x in range(4 * k)]
        # Every quick task is done while the long one still runs: its worker was not
        # waited for, the other worker (and its replacements) retired one by one.
        got = [f.result(timeout=200) for f in quick]
        assert not long.done()
        open(release, "w").close()
        long_pid = long.result(timeout=60)
    served = _per_pid([p for _, p in got])
    assert sorted(x for x, _ in got) == list(range(4 * k))
    assert long_pid not in served  # the long task's worker kept to it, unreplaced
    assert max(served.values()) <= k, served
    assert len(served) >= 4, served  # the other place saw at least 4 workers


@pytest.mark.timeout(120)
def test_exit_results_and_stats_stay_per_worker() -> None:
    with Pool(2, maxtasksperchild=2, start_method="fork", worker_exit=rd.exit_pid) as pool:
        out = pool.map(rd.pid_of, range(12), chunksize=1)
        stats = pool.stats
        pool.close()
        pool.join()
        exits = pool.exit_results
    pids = {p for _, p in out}
    assert len(pids) == 6  # 12 tasks, 2 each
    # The last worker of each place said goodbye (its replacements' predecessors did too).
    assert len(exits) == 2 and all(isinstance(p, int) for p in exits) and len(set(exits)) == 2
    assert sum(stats.producer_items.values()) == 12
    assert set(stats.producer_items) == {0, 1}


# ----- killed at each step of the hand-over (see _engine/retire.py) -----

# Steps after which a retiring worker's results are all on their way: nothing fails.
LOSSLESS = ["retire_end", "retire_say", "retire_exit"]
# A worker's death: the calls with work in flight may fail with WorkerDiedError, never
# with a result lost or delivered twice; the pool goes on.
DEATHS = ["retire_mark", "start", "ready", "first_task"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("step", LOSSLESS + DEATHS)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_killed_at_each_step_of_the_hand_over(
    step: str, method: str, tmp_path, monkeypatch
) -> None:
    if method == "spawn" and step not in ("retire_say", "ready"):
        pytest.skip("spawn: one step of each side (each spawn is slow)")
    monkeypatch.setenv("EASYCORE_TEST_FAULT", f"{step}:{tmp_path}")
    with Pool(2, maxtasksperchild=2, start_method=method) as pool:
        assert pool.submit(rd.pid_of, 0).result(timeout=120)[0] == 0  # the first workers run
        (tmp_path / "armed").touch()  # from now on, the first to reach the step is killed
        try:
            out = pool.map(rd.pid_of, range(12), chunksize=1)
        except WorkerDiedError:
            assert step in DEATHS, step
            out = None
        if out is not None:
            assert [x for x, _ in out] == list(range(12))  # each once, in order
            assert max(_per_pid([p for _, p in out]).values()) <= 2
        after = pool.map(rd.pid_of, range(6), chunksize=1)
        assert [x for x, _ in after] == list(range(6))
        pool.close()
        pool.join()
    assert (tmp_path / "fired").exists()  # the fault did happen
    assert os.environ.get("EASYCORE_TEST_FAULT")  # (monkeypatch removes it after)


# ----- a task stuck in C past task_timeout: only its worker is replaced -----


def _barrier_round(pool: Pool, folder: str, n: int) -> set[int]:
    """The pids of the pool's ``n`` workers: ``n`` tasks that wait for each other."""
    futs = [pool.submit(rd.barrier, folder, n, 8.0) for _ in range(n)]
    return {f.result(timeout=120) for f in futs}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_stuck_task_replaces_its_worker_alone(method: str, tmp_path) -> None:
    limit = 10.0  # the stuck task is given up 11 s after it began
    with Pool(3, task_timeout=limit, start_method=method) as pool:
        first = _barrier_round(pool, str(tmp_path / "r1"), 3)
        assert len(first) == 3
        began = tmp_path / "began"
        stuck = pool.submit(rd.stuck_in_c_saying, str(began))
        while not began.exists():
            time.sleep(0.01)
        # Tasks that start well after the stuck one (their own timeout ends 5 s after its
        # end) and run until it was given up: in flight on the two other workers meanwhile.
        time.sleep(5.0)
        release = str(tmp_path / "release")
        # (They hold at most 3 s less than their own timeout: a stalled machine makes them
        # end on their own before it, never fail by it.)
        held = [pool.submit(rd.hold_until, release, limit - 3.0) for _ in range(2)]
        with pytest.raises(PoolTimeoutError) as info:
            stuck.result(timeout=120)
        open(release, "w").close()
        killed = int(re.search(r"pid (\d+)", str(info.value))[1])
        assert killed in first
        # The two tasks in flight on the other workers ran to their end, undisturbed.
        assert {f.result(timeout=60) for f in held} == first - {killed}
        after = _barrier_round(pool, str(tmp_path / "r2"), 3)
        assert after >= first - {killed}  # the other workers kept their pids
        assert killed not in after and len(after) == 3  # and a new one took its place
        assert not os.path.exists(f"/proc/{killed}")  # killed and reaped


# ----- the caller SIGKILLed while its workers retire: no name is left -----

RETIRING_FOR_EVER = """
import sys
sys.path.insert(0, {here!r})
import retire_defs as rd
from easycore.parallel import Pool

if __name__ == "__main__":
    with Pool(2, maxtasksperchild=1, start_method={method!r}) as pool:
        pool.map(rd.pid_of, range(4), chunksize=1)
        print("running", flush=True)
        while True:
            pool.map(rd.pid_of, range(4), chunksize=1)
"""


def _queue_tags_of(pid: int) -> set[str]:
    """The tags (``ec.q<hex>.``) of the queues that process ``pid`` made."""
    tags = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith("ec.q") and name.endswith(".live"):
            try:
                with open(f"/dev/shm/{name}", "rb") as f:
                    owner = f.read(64).decode(errors="replace")
            except OSError:
                continue
            if owner.startswith(f"{pid}-"):
                tags.add(name[: -len("live")])
    return tags


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_caller_leaves_no_queue_names_while_workers_retire(method: str) -> None:
    code = RETIRING_FOR_EVER.format(here=os.path.dirname(os.path.abspath(__file__)), method=method)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "running"
        tags = _queue_tags_of(p.pid)
        assert len(tags) == 2  # its input and output queues, named while workers retire
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        # Its workers and zygote end, and remove the names of its queues and its own (its
        # liveness token), whichever of them learns of the death first; what one of them
        # could not take at that moment (another held it for an instant) goes with the next
        # sweep, which every easycore process makes: nothing is held by anyone any more.
        mine = (*tags, f"ec.{p.pid}-")
        deadline = time.monotonic() + 60
        left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
            if left and time.monotonic() > deadline - 50:
                sweep_stale_segments()
        assert left == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


TWO_ASKERS = """
import os, sys, threading
from multiprocessing.connection import wait
from easycore._core import identity
from easycore._engine.zygote import Zygote

def leave(blob, fds):
    for fd in fds:
        os.close(fd)
    os._exit(3)

if __name__ == "__main__":
    z = Zygote(leave, identity())
    child = z.fork("child", b"", [])
    wait([child.sentinel], 30)  # exited; its code not asked yet
    barrier = threading.Barrier(2)
    codes = []

    def ask():
        barrier.wait()
        codes.append(child.exitcode)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    z.close()
    print(codes)
"""


@pytest.mark.timeout(60)
def test_a_zygote_child_exit_code_asked_by_two_threads_at_once() -> None:
    # The pool's threads (its feed's and receiver's health checks, the retirements) may ask
    # at the same moment: each gets the code the zygote reported once.
    out = subprocess.run(
        [sys.executable, "-c", TWO_ASKERS], capture_output=True, text=True, timeout=50
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[3, 3]"


@pytest.mark.timeout(120)
def test_a_map_is_cut_into_tasks_as_the_stdlib_cuts_it() -> None:
    # multiprocessing.Pool.map reads its input into a list and sends ceil(len / (4 * workers))
    # items per task: 2,000 items over 2 workers are 8 tasks, so with maxtasksperchild=5 at
    # most one or two workers retire. One item per task made a worker retire every 5 items
    # (about 400 workers for one call).
    with Pool(2, maxtasksperchild=5) as pool:
        for call in (
            lambda: [p for _, p in pool.map(rd.pid_of, (x for x in range(2000)))],
            lambda: [p for _, p in pool.starmap(rd.pids_of, ((x, x) for x in range(2000)))],
            lambda: [p for _, p in pool.map_async(rd.pid_of, list(range(2000))).get(60)],
        ):
            pids = call()
            assert len(pids) == 2000
            assert len(set(pids)) <= 4, f"{len(set(pids))} workers for 2,000 items"
