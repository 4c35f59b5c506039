"""Large results through a runner, ``runner.imap`` and the ``Pool``, call by call in turn.

Run::

    .venv/bin/python benches/large_results.py numpy_16mib_shm --calls 8

One runner (2 CPU producers) and one easycore ``Pool`` stay up; each timed call of a bench
workload (``numpy_1mib``, ``numpy_16mib``, ``numpy_16mib_shm``, ...) goes to each system in
turn, after one untimed call each, so that a machine whose speed drifts slows them alike.
It prints, per system, the median GB/s, min and max, the median as a fraction of the
one-thread memcpy measured between the calls, and the minor page faults per call of the
caller and its producers together. Faults are the load-independent sign of results that
found the output pool full: such a result is built in private memory and copied into a
one-shot segment (about 8,000 faults for 16 MiB). To compare two builds, run it from each
checkout alternately.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from easycore.bench import systems as S  # noqa: N812
from easycore.bench import workloads as W  # noqa: N812
from easycore.bench.systems_easycore import _ec_pool_init, _ec_pool_work
from easycore.common.parallel import UnorderedRunner
from easycore.parallel import Pool


def _children_faults() -> int:
    """Minor faults of this process's live children (the producers)."""
    me, total = os.getpid(), 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            total += int(fields[7])
    return total


def _faults() -> int:
    return _children_faults() + resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    """Parses the arguments and prints the table (see the module)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default="numpy_16mib_shm")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--systems", default="runner,imap,pool")
    args = ap.parse_args()
    w = W.WORKLOADS[args.workload]
    hooks: Any = w.hooks
    n = w.items
    gb = w.amount(n)
    which = args.systems.split(",")
    runner = S.rebase(hooks, UnorderedRunner)(devices=["cpu", "cpu"])
    pool = Pool(["cpu", "cpu"], initializer=_ec_pool_init, initargs=(hooks,))
    calls: dict[str, Callable[[], Any]] = {
        "runner": lambda: runner(w.make_data(n)),
        "imap": lambda: S.run_consumer(hooks, runner.imap(w.make_data(n))),
        "pool": lambda: S.run_consumer(hooks, pool.imap_unordered(_ec_pool_work, w.make_data(n))),
    }
    src = np.ones(256 << 20, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)

    def memcpy() -> float:
        best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(3))
        return src.nbytes / 1e9 / best

    try:
        for k in which:
            calls[k]()  # warm-up: the pool makes its segments
        rates: dict[str, list[float]] = {k: [] for k in which}
        faults = dict.fromkeys(which, 0)
        mc = []
        for _ in range(args.calls):
            mc.append(memcpy())
            for k in which:
                f0 = _faults()
                rates[k].append(gb / _timed(calls[k]))
                faults[k] += _faults() - f0
    finally:
        runner.close()
        pool.close()
        pool.join()
    m = statistics.median(mc)
    print(f"{args.workload}: load {os.getloadavg()[0]:.1f}, memcpy {m:.1f} GB/s (median)")
    for k in which:
        v = rates[k]
        med = statistics.median(v)
        print(
            f"  {k:7s} {med:6.2f} GB/s (min {min(v):.2f}, max {max(v):.2f}) = "
            f"{med / m:.2f}x memcpy; minor faults per call {faults[k] // args.calls}"
        )


def _timed(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
