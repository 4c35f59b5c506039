"""Paired calls: easycore's Pool against a tuned ``multiprocessing.Pool``, in one process.

The bench (``python -m easycore.bench``) measures each system in its own process, in rounds.
On a VM whose speed drifts by tens of percent within minutes, that still leaves a ratio of
two medians taken minutes apart. Here both pools live in one process and take turns, call by
call (which one goes first alternates), so each ratio compares two calls made back to back;
the median of those ratios is what is printed. Workload: the bench's tiny items (``x * x``
over a generator of 200k ints, the bench's consumer per result), 2 workers each,
``multiprocessing.Pool`` given ``chunksize=25000`` and easycore the default (adaptive).

Usage: ``python scripts/bench_pool_pairs.py [--pairs N] [--ordered]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from easycore.bench import systems
from easycore.bench.workloads import SquareHashHooks, SquareSumHooks
from easycore.parallel import Pool

ITEMS = 200_000


def _items() -> Iterator[int]:
    return (x for x in range(ITEMS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=16, help="calls of each pool (default 16)")
    ap.add_argument("--ordered", action="store_true", help="imap instead of imap_unordered")
    args = ap.parse_args()
    hooks = SquareHashHooks if args.ordered else SquareSumHooks
    ctx = mp.get_context()
    ours = Pool(2, initializer=systems._ec_pool_init, initargs=(hooks,))
    theirs = ctx.Pool(
        2,
        initializer=systems._worker_init,
        initargs=(hooks, systems._device_queue(ctx, ["cpu", "cpu"])),
    )
    try:

        def run_ours() -> Any:
            imap = ours.imap if args.ordered else ours.imap_unordered
            return systems.run_consumer(hooks, imap(systems._ec_pool_work, _items()))

        def run_theirs() -> Any:
            imap = theirs.imap if args.ordered else theirs.imap_unordered
            return systems.run_consumer(hooks, imap(systems._worker_work, _items(), 25000))

        assert run_ours() == run_theirs(), "the two pools disagree"  # also a warm-up
        ratios = []
        for i in range(args.pairs):
            turn: list[Callable[[], Any]] = [run_ours, run_theirs]
            if i % 2:
                turn.reverse()
            took = {}
            for f in turn:
                t = time.perf_counter()
                f()
                took[f] = time.perf_counter() - t
            ratios.append(took[run_theirs] / took[run_ours])
        ratios.sort()
        q = len(ratios) // 4
        what = "imap" if args.ordered else "imap_unordered"
        print(
            f"{what}, {ITEMS} tiny items over a generator: easycore Pool speed / "
            f"multiprocessing.Pool (chunksize=25000) speed, median of {args.pairs} pairs: "
            f"{statistics.median(ratios):.3f} (quartiles {ratios[q]:.3f}..{ratios[-1 - q]:.3f})"
        )
    finally:
        ours.close()
        theirs.terminate()


if __name__ == "__main__":
    main()
