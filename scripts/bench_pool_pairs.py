"""Paired calls: easycore's Pool against a tuned ``multiprocessing.Pool``, in one process.

The bench (``python -m easycore.bench``) measures each system in its own process, in rounds.
On a VM whose speed drifts by tens of percent within minutes, that still leaves a ratio of
two medians taken minutes apart. Here both pools live in one process and take turns, call by
call (which one goes first alternates), so each ratio compares two calls made back to back;
the median of those ratios is what is printed. Workload: the bench's tiny items (``x * x``
over a generator of 200k ints), 2 workers each, ``multiprocessing.Pool`` given
``chunksize=25000`` and easycore the default (adaptive).

``--consumer`` says what the calling process does with each result:

* ``hooks`` (default): the bench's consumer hooks, as in ``tiny_unordered``/``tiny_ordered``
  (``cfg.count += 1; cfg.total += x`` on a ``CfgNode``, about 1.2 µs an item on a 2-core VM);
* ``collect``: the bench's ``tiny_collect`` consumer hooks (``cfg.data_list.append(x)``);
* ``sum``: ``sum(results)`` (unordered) or ``tuple(results)`` (ordered), a few ns an item, so
  that what is left in the calling process is the pool's own per-item work.

It also prints the calling process's CPU time per item (``time.process_time``, all its
threads, median over the calls): when that is close to the wall time per item, the calling
process is the bound.

Usage: ``python scripts/bench_pool_pairs.py [--pairs N] [--ordered] [--consumer KIND]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from easycore.bench import systems, systems_easycore, systems_peers
from easycore.bench.workloads import SquareCollectHooks, SquareHashHooks, SquareSumHooks
from easycore.parallel import Pool

ITEMS = 200_000


def _items() -> Iterator[int]:
    return (x for x in range(ITEMS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=16, help="calls of each pool (default 16)")
    ap.add_argument("--ordered", action="store_true", help="imap instead of imap_unordered")
    ap.add_argument(
        "--consumer",
        choices=("hooks", "collect", "sum"),
        default="hooks",
        help="what the caller does per result (default: the bench's consumer hooks)",
    )
    args = ap.parse_args()
    hooks: type = SquareHashHooks if args.ordered else SquareSumHooks
    if args.consumer == "collect":
        hooks = SquareCollectHooks
    consume: Callable[[Iterable[Any]], Any]
    if args.consumer != "sum":

        def consume(results: Iterable[Any]) -> Any:
            return systems.run_consumer(hooks, results)

    else:
        consume = tuple if args.ordered else sum
    ctx = mp.get_context()
    ours = Pool(2, initializer=systems_easycore._ec_pool_init, initargs=(hooks,))
    theirs = ctx.Pool(
        2,
        initializer=systems_peers._worker_init,
        initargs=(hooks, systems_peers._device_queue(ctx, ["cpu", "cpu"])),
    )
    try:

        def run_ours() -> Any:
            imap = ours.imap if args.ordered else ours.imap_unordered
            return consume(imap(systems_easycore._ec_pool_work, _items()))

        def run_theirs() -> Any:
            imap = theirs.imap if args.ordered else theirs.imap_unordered
            return consume(imap(systems_peers._worker_work, _items(), 25000))

        assert run_ours() == run_theirs(), "the two pools disagree"  # also a warm-up
        ratios = []
        cpu: dict[Callable[[], Any], list[float]] = {run_ours: [], run_theirs: []}
        for i in range(args.pairs):
            turn: list[Callable[[], Any]] = [run_ours, run_theirs]
            if i % 2:
                turn.reverse()
            took = {}
            for f in turn:
                c = time.process_time()
                t = time.perf_counter()
                f()
                took[f] = time.perf_counter() - t
                cpu[f].append(time.process_time() - c)
            ratios.append(took[run_theirs] / took[run_ours])
        ratios.sort()
        q = len(ratios) // 4
        what = "imap" if args.ordered else "imap_unordered"
        print(
            f"{what}, {ITEMS} tiny items over a generator, consumer {args.consumer}: "
            f"easycore Pool speed / multiprocessing.Pool (chunksize=25000) speed, median of "
            f"{args.pairs} pairs: {statistics.median(ratios):.3f} "
            f"(quartiles {ratios[q]:.3f}..{ratios[-1 - q]:.3f})"
        )
        print(
            "calling process CPU per item (median): easycore "
            f"{statistics.median(cpu[run_ours]) / ITEMS * 1e9:.0f} ns, multiprocessing "
            f"{statistics.median(cpu[run_theirs]) / ITEMS * 1e9:.0f} ns"
        )
    finally:
        ours.close()
        theirs.terminate()


if __name__ == "__main__":
    main()
