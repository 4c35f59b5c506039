"""The pool's own cost per item over a generator, without consumer work: a plain loop over
``imap_unordered`` of ``x*x``, easycore's ``Pool`` (default chunking) beside
``multiprocessing.Pool`` with ``chunksize=25000``, side by side in one run.

    .venv/bin/python scripts/bench_pool_loop.py [--items 400000] [--workers 2] [--repeats 3]

Prints items/s and the caller's CPU time per item (all its threads) for each repeat.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator

from easycore.parallel import Pool


def square(x: int) -> int:
    return x * x


def numbers(n: int) -> Iterator[int]:
    yield from range(n)


def measure(name: str, run: Callable[[Iterator[int]], int], n: int, repeats: int) -> None:
    run(numbers(1000))  # warm up: workers started, costs learned
    expected = sum(i * i for i in range(n))
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        total = run(numbers(n))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert total == expected, (name, total, expected)
        print(f"{name:44s} {n / wall / 1e6:6.2f}M items/s   caller {cpu / n * 1e6:5.2f} µs/item")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=400_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with Pool(a.workers) as pool:
        measure(
            "easycore Pool.imap_unordered",
            lambda d: sum(pool.imap_unordered(square, d)),
            a.items,
            a.repeats,
        )
    with mp.Pool(a.workers) as mpp:
        measure(
            "multiprocessing.Pool.imap_unordered (25000)",
            lambda d: sum(mpp.imap_unordered(square, d, chunksize=25000)),
            a.items,
            a.repeats,
        )


if __name__ == "__main__":
    main()
