"""How fast a queue's writer copies large messages into pooled segments, by how long ago
the segment it gets was last filled.

Run::

    .venv/bin/python benches/segment_reuse.py              # 1 MiB messages, reader holds 2, 12, 40
    .venv/bin/python benches/segment_reuse.py --mib 4 --held 2 8

A forked writer puts ``--count`` numpy arrays (cycling through four ready ones: the source
is cached) to ``easycore._core.Queue``; the reader (this process) takes each, reads one byte
per 4 KiB page, and keeps the last ``--held`` of them alive, so a segment comes back to the
pool only ``--held`` messages after it was filled: the more held, the longer the segment
has been out of the caches when the writer fills it again. It prints, per ``--held``, the
writer's median and 90th percentile time per ``put`` (mostly the copy) and the reader's
GB/s. The queue copies with streaming stores into segments it last filled 16 MiB of
messages ago, and with ordinary stores into ones reused sooner (``src/copy.rs``): run it
against two builds to compare their copies.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np
from easycore import _core


def _writer(q: _core.Queue, count: int, nbytes: int, fd: int) -> None:
    srcs = [np.full(nbytes, i, np.uint8) for i in range(4)]
    times = []
    for i in range(count):
        t = time.perf_counter()
        q.put(i, 0, [b"h", srcs[i % 4]])
        times.append(time.perf_counter() - t)
    warm = sorted(times[count // 10 :])
    med, p90 = warm[len(warm) // 2], warm[9 * len(warm) // 10]
    os.write(fd, f"{med * 1e6:.0f} {p90 * 1e6:.0f}".encode())


def measure(held: int, nbytes: int, count: int) -> tuple[str, float]:
    """One run: the writer's put times (text) and the reader's GB/s."""
    q = _core.Queue(side_budget=256 << 20, pool_bytes=512 << 20)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        try:
            os.close(r)
            _writer(q, count, nbytes, w)
        finally:
            os._exit(0)
    os.close(w)
    kept: collections.deque = collections.deque()
    t0 = time.perf_counter()
    for _ in range(count):
        _, _, parts = q.get(timeout=60)
        a = np.frombuffer(parts[1], np.uint8)
        int(a[::4096].sum())
        kept.append(parts)
        if len(kept) > held:
            kept.popleft()
        del a, parts
    dt = time.perf_counter() - t0
    kept.clear()
    os.waitpid(pid, 0)
    puts = os.read(r, 100).decode().split()
    os.close(r)
    q.close()
    return f"put median {puts[0]} µs, p90 {puts[1]} µs", count * nbytes / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=1.0, help="message size in MiB")
    ap.add_argument("--held", type=int, nargs="+", default=[2, 12, 40])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    nbytes = int(args.mib * (1 << 20))
    for held in args.held:
        for _ in range(args.repeats):
            puts, gbs = measure(held, nbytes, args.count)
            print(f"{args.mib:g} MiB, reader holds {held:3d}: {puts}; reader {gbs:5.2f} GB/s")


if __name__ == "__main__":
    main()
