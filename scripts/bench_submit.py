"""Round trip of one task, one task in flight: ``submit(fn, x).result()`` and ``apply(fn, (x,))``
in a loop, beside a bare ``multiprocessing.Pipe`` round trip in the same run.

Compares easycore.parallel.Pool (``submit``, ``apply``) with
concurrent.futures.ProcessPoolExecutor, multiprocessing.Pool.apply and loky (when installed).
Each repeat measures every system in turn; a row gives the median round trip of each repeat's
calls, as min / median over the repeats, and the median of its ratios to the Pipe round trip
of the same repeat. Usage:
``python scripts/bench_submit.py [--tasks N] [--workers N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any


def echo(x: Any) -> Any:
    return x


def _median_us(call: Callable[[int], Any], n: int) -> float:
    """Median round trip in µs over ``n`` sequential calls (after a warm-up)."""
    for i in range(50):
        call(i)
    times = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def _pipe_worker(conn: Any) -> None:
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from easycore.parallel import Pool, PoolExecutor

    fork = mp.get_context("fork")
    a, b = fork.Pipe()
    pipe_proc = fork.Process(target=_pipe_worker, args=(b,), daemon=True)
    pipe_proc.start()

    def pipe_call(x: int) -> Any:
        a.send(x)
        return a.recv()

    pool = Pool(args.workers)
    executor = PoolExecutor(args.workers)
    ppe = concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=fork)
    mp_pool = fork.Pool(args.workers)
    systems: dict[str, Callable[[int], Any]] = {
        "multiprocessing.Pipe round trip (reference)": pipe_call,
        "easycore Pool.apply": lambda x: pool.apply(echo, (x,)),
        "easycore Pool.submit().result()": lambda x: pool.submit(echo, x).result(),
        "easycore PoolExecutor.submit().result()": lambda x: executor.submit(echo, x).result(),
        "ProcessPoolExecutor.submit().result()": lambda x: ppe.submit(echo, x).result(),
        "multiprocessing.Pool.apply": lambda x: mp_pool.apply(echo, (x,)),
    }
    closers: list[Callable[[], Any]] = [
        pool.terminate,
        executor.shutdown,
        ppe.shutdown,
        mp_pool.terminate,
    ]
    try:
        import loky
    except ImportError:
        try:  # joblib vendors loky
            from joblib.externals import loky
        except ImportError:
            loky = None
    if loky is not None:
        lk = loky.get_reusable_executor(args.workers)
        systems[f"loky {loky.__version__} submit().result()"] = lambda x: lk.submit(
            echo, x
        ).result()
        closers.append(lk.shutdown)
    else:
        print("(loky is not installed, nor joblib: skipped)")
    got: dict[str, list[float]] = {name: [] for name in systems}
    try:
        for _ in range(args.repeats):
            for name, call in systems.items():
                got[name].append(_median_us(call, args.tasks))
    finally:
        a.send(None)
        pipe_proc.join(10)
        for close in closers:
            close()
    pipe = got["multiprocessing.Pipe round trip (reference)"]
    print(f"{'system':45s} {'min':>7s} {'median':>7s}  µs per round trip   ÷ Pipe (median)")
    for name, us in got.items():
        ratio = statistics.median(x / p for x, p in zip(us, pipe, strict=True))
        print(f"{name:45s} {min(us):7.1f} {statistics.median(us):7.1f}  {ratio:17.2f}")


if __name__ == "__main__":
    main()
