"""Where a request/response round trip's time goes: wall time and CPU time per round trip,
in the caller and in its worker processes, for a runner, the pool and a bare ``Pipe``.

Run::

    .venv/bin/python benches/round_trip_cpu.py                  # 30,000 round trips each
    taskset -c 1 .venv/bin/python benches/round_trip_cpu.py     # every process on one core

Each system runs the bench's ``latency`` workload as a user would write it: item ``i + 1``
of the input exists only once result ``i`` reached the consumer (the input waits on a
queue that the consumer feeds), one worker, ``x * x`` per item. After a warm-up call it
times one call of ``--items`` round trips and reads the CPU time of the caller (all its
threads) and of its children (``/proc/<pid>/stat``) around it. On a machine where the
two sides share a core (pinned, or beside busy processes) a round trip costs about the
sum of both sides' CPU; on an idle machine the wake-ups across cores dominate.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

from easycore.common.parallel import UnorderedRunner
from easycore.parallel import Pool


def _feedback(n: int, fb: queue.SimpleQueue[None]) -> Iterator[int]:
    """``range(n)``, item ``i + 1`` only once result ``i`` was consumed."""
    for i in range(n):
        if i:
            fb.get(timeout=10.0)
        yield i


def _square(x: int) -> int:
    return x * x


class _Loop(UnorderedRunner):
    """The runner form: the consumer hook releases the next item."""

    fb: queue.SimpleQueue[None] = queue.SimpleQueue()

    @staticmethod
    def producer_init(device: str, cfg: Any) -> None:
        pass

    @staticmethod
    def producer_work(device: str, cfg: Any, data: int) -> int:
        return data * data

    @staticmethod
    def producer_end(device: str, cfg: Any) -> None:
        pass

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.total = 0

    @staticmethod
    def consumer_work(cfg: Any, data: int) -> None:
        cfg.total += data
        _Loop.fb.put(None)

    @staticmethod
    def consumer_end(cfg: Any) -> int:
        return int(cfg.total)


def _runner(n: int) -> int:
    return int(_RUNNER(_feedback(n, _Loop.fb)))


def _pool(n: int) -> int:
    fb: queue.SimpleQueue[None] = queue.SimpleQueue()
    total = 0
    for r in _POOL.imap_unordered(_square, _feedback(n, fb)):
        total += r
        fb.put(None)
    return total


def _pipe_worker(conn: Any) -> None:
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x * x)


def _pipe(n: int) -> int:
    fb: queue.SimpleQueue[None] = queue.SimpleQueue()
    total = 0
    for x in _feedback(n, fb):
        _PIPE.send(x)
        total += _PIPE.recv()
        fb.put(None)
    return total


_RUNNER: Any = None
_POOL: Any = None
_PIPE: Any = None


def _children_cpu() -> float:
    """CPU seconds of this process's children so far (live ones, from /proc)."""
    me = os.getpid()
    pids: list[str] = []
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def _measure(name: str, loop: Callable[[int], int], n: int) -> None:
    expected = sum(i * i for i in range(n))
    loop(200)  # warm-up: workers started, costs learned
    k0, c0, t0 = _children_cpu(), os.times(), time.perf_counter()
    got = loop(n)
    t1, c1, k1 = time.perf_counter(), os.times(), _children_cpu()
    if got != expected:
        raise SystemExit(f"{name}: wrong result {got} != {expected}")
    us = 1e6 / n
    caller = (c1.user - c0.user + c1.system - c0.system) * us
    print(
        f"{name:24s} {(t1 - t0) * us:7.1f} µs per round trip; CPU per round trip: caller "
        f"{caller:5.1f} µs (kernel {(c1.system - c0.system) * us:4.1f}), "
        f"workers {(k1 - k0) * us:5.1f} µs"
    )


def main() -> None:
    global _RUNNER, _POOL, _PIPE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=30_000, help="round trips per system")
    n = ap.parse_args().items
    with _Loop(devices=["cpu"]) as runner:
        _RUNNER = runner
        _measure("runner (hooks)", _runner, n)
    with Pool(1) as pool:
        _POOL = pool
        _measure("Pool.imap_unordered", _pool, n)
    here, there = mp.Pipe()
    proc = mp.Process(target=_pipe_worker, args=(there,))
    proc.start()
    _PIPE = here
    try:
        _measure("multiprocessing.Pipe", _pipe, n)
    finally:
        here.send(None)
        proc.join(10)


if __name__ == "__main__":
    main()
