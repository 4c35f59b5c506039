"""Pool scenarios that restart workers under fork, run in a fresh interpreter by
tests/test_pool_forks.py: ``python pool_fork_scenarios.py <scenario>`` prints one JSON line.

Every ``os.fork`` this process makes while it runs more than one OS thread is recorded (an
``os.register_at_fork`` hook reading ``/proc/self/stat``), on every Python version; on
3.12+ so is every ``DeprecationWarning`` about ``fork()`` (the warning CPython gives for
such a fork). The JSON says what each scenario saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings

from easycore.errors import WorkerDiedError
from easycore.parallel import Pool

ME = os.getpid()
FORKS_WITH_THREADS: list[int] = []
WARNINGS: list[str] = []
VALUE = "at creation"


def os_threads() -> int:
    """This process's OS threads (native ones too), as CPython's fork warning counts them."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[17])


def _before_fork() -> None:
    if os.getpid() == ME:  # not in the processes forked from this one
        n = os_threads()
        if n > 1:
            FORKS_WITH_THREADS.append(n)


def _show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
    if "fork()" in str(message):
        WARNINGS.append(str(message))


os.register_at_fork(before=_before_fork)
warnings.simplefilter("always", DeprecationWarning)
warnings.showwarning = _show


def pid(_x: object = None) -> int:
    return os.getpid()


def value(_x: object = None) -> str:
    return VALUE


def square(x: int) -> int:
    return x * x


def descendants() -> set[int]:
    """Every live process under this one (children, theirs, ...), zombies left out."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    out: set[int] = set()
    grew = True
    while grew:
        grew = False
        for p, pp in parents.items():
            if p not in out and (pp == ME or pp in out):
                out.add(p)
                grew = True
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (not zombies)."""
    out = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(p)
        except OSError:
            pass
    return out


def names_of(pids: set[int]) -> set[str]:
    """Shared-memory names (liveness tokens, segments) that carry one of ``pids``."""
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return set()
    prefixes = tuple(f"ec.{p}-" for p in pids)
    return {n for n in names if n.startswith(prefixes)}


def settle(pids: set[int], seconds: float = 10.0) -> list[str]:
    """What is left of ``pids`` after at most ``seconds``: live processes and their names."""
    deadline = time.monotonic() + seconds
    left = sorted(map(str, alive(pids))) + sorted(names_of(pids))
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = sorted(map(str, alive(pids))) + sorted(names_of(pids))
    return left


def kill_a_worker(pool: Pool) -> None:
    workers = pool._stream.runner._workers
    while workers is None or workers.closed:  # stopped (a failure): a call restarts them
        pool.submit(square, 1).result(timeout=60)
        workers = pool._stream.runner._workers
    victim = workers.procs[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)


def restarts(pool: Pool, out: dict[str, object]) -> set[int]:
    """Worker restarts of every kind; returns the pids of every worker seen."""
    seen: set[int] = set(pool.map(pid, range(50), chunksize=1))
    # a worker killed while the pool is idle: the next call restarts the workers
    kill_a_worker(pool)
    out["after_idle_death"] = pool.map(square, range(100)) == [x * x for x in range(100)]
    seen |= set(pool.map(pid, range(20), chunksize=1))
    # a worker killed while a map runs: the call fails, the next one restarts the workers
    it = pool.imap(time.sleep, [0.05] * 400, chunksize=1)
    next(it)
    kill_a_worker(pool)
    try:
        list(it)
        out["mid_map_death"] = "no error"
    except WorkerDiedError:
        out["mid_map_death"] = "WorkerDiedError"
    out["after_mid_map_death"] = pool.submit(square, 7).result(timeout=60) == 49
    seen |= set(pool.map(pid, range(20), chunksize=1))
    return seen


def scenario_restarts() -> dict[str, object]:
    """Deaths, maxtasksperchild (map and submit), and what replacements see."""
    global VALUE
    out: dict[str, object] = {}
    worker_pids: set[int] = set()
    with Pool(2, start_method="fork") as pool:
        VALUE = "changed after creation"
        worker_pids |= restarts(pool, out)
        out["values"] = sorted(set(pool.map(value, range(20), chunksize=1)))
        helpers = descendants() - worker_pids
    with Pool(2, start_method="fork", maxtasksperchild=3) as pool:
        pids = pool.map(pid, range(30), chunksize=1)
        pids += [pool.submit(pid).result(timeout=60) for _ in range(12)]
        out["maxtasksperchild_workers"] = len(set(pids))
        worker_pids |= set(pids)
        helpers |= descendants() - worker_pids
    out["left_behind"] = settle(worker_pids | helpers)
    return out


def scenario_threads_at_creation() -> dict[str, object]:
    """The caller already runs a thread of its own when it makes a fork pool."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    out: dict[str, object] = {}
    with Pool(2, start_method="fork", maxtasksperchild=2) as pool:
        pids = pool.map(pid, range(12), chunksize=1)
        out["maxtasksperchild_workers"] = len(set(pids))
        everything = descendants() | set(pids)
    with Pool(2, start_method="fork") as pool:
        everything |= restarts(pool, out) | descendants()
    stop.set()
    t.join()
    out["left_behind"] = settle(everything)
    return out


def scenario_back_to_back() -> dict[str, object]:
    """Pools made one after the other, some with a ``task_timeout`` (a thread of its own
    watches for stuck tasks): each pool's zygote is forked once the previous pool's threads
    have left."""
    out: dict[str, object] = {}
    pids: set[int] = set()
    ok = True
    for k in range(6):
        with Pool(2, start_method="fork", task_timeout=30 if k % 2 else None) as pool:
            ok = ok and pool.map(square, range(50)) == [x * x for x in range(50)]
            pids |= descendants()
    out["results"] = ok
    out["left_behind"] = settle(pids)
    return out


def scenario_zygote_killed() -> dict[str, object]:
    """The process that forks the replacements is killed: the pool goes on."""
    out: dict[str, object] = {}
    with Pool(2, start_method="fork") as pool:
        zygote = pool._stream.runner._zygote.pid  # type: ignore[union-attr]
        out["zygote_was_a_child"] = zygote in descendants()
        first = {p.pid for p in pool._stream.runner._workers.procs}  # type: ignore[union-attr]
        os.kill(zygote, signal.SIGKILL)
        settle({zygote})
        seen = restarts(pool, out)
        everything = descendants() | seen | first | {zygote}
    out["left_behind"] = settle(everything)
    return out


def scenario_many_fds() -> dict[str, object]:
    """The caller holds descriptors numbered past 1023 (select(2)'s limit) when it makes the
    pool, so the zygote's and the workers' descriptors are numbered past it too."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 <= hard or (soft < 1200 and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    null = os.open(os.devnull, os.O_RDONLY)
    held = [os.dup(null) for _ in range(1100)]
    out: dict[str, object] = {"highest_fd": max(held)}
    with Pool(2, start_method="fork") as pool:
        seen = restarts(pool, out)
        everything = descendants() | seen
    out["left_behind"] = settle(everything)
    for fd in [*held, null]:
        os.close(fd)
    return out


def scenario_caller_killed() -> dict[str, object]:
    """Prints the pids under this process, then waits to be killed (the test kills it)."""
    pool = Pool(2, start_method="fork")
    pool.map(square, range(10))
    kill_a_worker(pool)
    pool.map(square, range(10))  # replacements forked
    print(json.dumps({"pids": sorted(descendants())}), flush=True)
    time.sleep(120)
    return {}


if __name__ == "__main__":
    result = globals()[f"scenario_{sys.argv[1]}"]()
    result["forks_with_threads"] = FORKS_WITH_THREADS
    result["fork_warnings"] = len(WARNINGS)
    print(json.dumps(result), flush=True)
