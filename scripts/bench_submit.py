"""Round trip of one task: ``submit(fn, x).result()`` in a loop, one task in flight.

Compares easycore.parallel.Pool with concurrent.futures.ProcessPoolExecutor (and loky when
installed). Usage: ``python scripts/bench_submit.py [--tasks N] [--workers N]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing as mp
import statistics
import time


def echo(x):
    return x


def measure(ex, n: int) -> float:
    """Median round trip in µs over ``n`` sequential submits (after a warm-up)."""
    for i in range(50):
        ex.submit(echo, i).result()
    times = []
    for i in range(n):
        t = time.perf_counter()
        ex.submit(echo, i).result()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from easycore.parallel import PoolExecutor

    systems = {
        "easycore.parallel.PoolExecutor": lambda: PoolExecutor(args.workers),
        "concurrent.futures.ProcessPoolExecutor": lambda: concurrent.futures.ProcessPoolExecutor(
            args.workers, mp_context=mp.get_context("fork")
        ),
    }
    try:
        import loky
    except ImportError:
        try:  # joblib vendors loky
            from joblib.externals import loky
        except ImportError:
            loky = None
    if loky is not None:
        systems[f"loky {loky.__version__}"] = lambda: loky.get_reusable_executor(args.workers)
    else:
        print("(loky is not installed, nor joblib: skipped)")
    for name, make in systems.items():
        ex = make()
        try:
            us = measure(ex, args.tasks)
        finally:
            ex.shutdown(wait=True)
        print(f"{name:45s} {us:8.1f} µs per submit().result() round trip (median)")


if __name__ == "__main__":
    main()
