"""The machine's ceiling for the bench's ``numpy_1mib`` / ``numpy_16mib`` workloads.

Run::

    .venv/bin/python benches/copy_limit.py

Two processes (the bench's two producers) run in parallel, each doing per item what a
producer must do at the least: make a fresh ``np.full`` array (what the workload's
``producer_work`` does) and copy it once into a reused buffer (the output queue's pooled
segment). No queue, no consumer, no Python per item beyond those two calls. It prints the
aggregate GB/s (1e9 bytes of arrays per second, as the bench counts them) with one reused
destination (it stays in the caches at 1 MiB) and with destinations taken in turn from
64 MiB per process (as many results in flight as a queue holds: they do not), the same
with the copy only (a premade source array), and the one-thread memcpy the bench prints,
median of five runs each. No runner can deliver arrays made this way faster than the
first figure; one whose results stay in flight in a large queue, not faster than the
second. At 16 MiB it also prints the ceiling for results born in shared memory (the
``numpy_16mib_shm`` workload): each process only fills its destinations in turn, in place.
The copies are numpy's, with the stores glibc's ``memcpy`` chooses for their size: where
glibc uses ordinary stores but the queue streams into segments that left the caches
(``src/copy.rs``), a runner can pass the "destinations in turn" figure.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np

_RUNS = 5


_ROTATE_BYTES = 64 << 20


def _worker(size: int, n: int, fill: bool | None, rotate: bool, out: Any, go: Any) -> None:
    k = max(1, _ROTATE_BYTES // size) if rotate else 1
    dsts = [np.empty(size, np.uint8) for _ in range(k)]
    for d in dsts:
        d[:] = 1  # mapped and touched, as a pooled segment is
    src = np.full(size, 3, np.uint8)
    go.wait()
    for i in range(n):
        if fill is None:  # filled in place (a result born in shared memory): no copy
            dsts[i % k].fill(i % 251)
            continue
        a = np.full(size, i % 251, np.uint8) if fill else src
        np.copyto(dsts[i % k], a)
    out.put(None)


def _run(size: int, n: int, fill: bool | None, rotate: bool) -> float:
    ctx = mp.get_context("fork")
    out, go = ctx.Queue(), ctx.Event()
    args = (size, n, fill, rotate, out, go)
    procs = [ctx.Process(target=_worker, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(0.2)  # both ready
    t = time.perf_counter()
    go.set()
    for _ in procs:
        out.get()
    wall = time.perf_counter() - t
    for p in procs:
        p.join()
    return 2 * n * size / wall / 1e9


def main() -> None:
    """Prints the ceilings (see the module)."""
    for size, n in ((1 << 20, 512), (16 << 20, 64)):
        modes: tuple[bool | None, ...] = (True, False) if size < 16 << 20 else (True, False, None)
        for fill in modes:
            for rotate in (False, True):
                if fill is None and not rotate:
                    continue
                runs = sorted(_run(size, n, fill, rotate) for _ in range(_RUNS))
                what = "filled in place (born in shared memory)"
                if fill is not None:
                    what = "fresh np.full + one copy" if fill else "one copy only"
                where = "destinations in turn" if rotate else "one destination"
                print(
                    f"{size >> 20:>2} MiB, 2 processes, {what}, {where}: median "
                    f"{runs[_RUNS // 2]:.1f} GB/s (min {runs[0]:.1f}, max {runs[-1]:.1f})"
                )
    a = np.empty(256 << 20, np.uint8)
    a[:] = 1
    b = np.empty_like(a)
    b[:] = 2
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    print(f"memcpy, 1 thread (np.copyto 256 MiB, best of 3): {best:.1f} GB/s")


if __name__ == "__main__":
    main()
