"""The producer's own cost per item: ``ProducerCore.run`` (unpickling a batch, the loop over
``producer_work``, the timing of ``stats.slowest``, pickling the results) on batches of tiny
items (``x * x`` on ints), in this process, no queue. Prints ns per item, the median of
``--repeats``.

Example::

    python benches/producer_loop.py --batch 4096 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from easycore._engine.producer import ProducerCore
from easycore.common.config import CfgNode
from easycore.common.parallel import UnorderedRunner


class Square(UnorderedRunner):
    @staticmethod
    def producer_work(device: str, cfg: Any, data: int) -> int:
        return data * data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=4096, help="items per batch (default 4096)")
    ap.add_argument("--batches", type=int, default=200, help="batches a repeat (default 200)")
    ap.add_argument("--repeats", type=int, default=7, help="repeats (default 7)")
    args = ap.parse_args(argv)
    core = ProducerCore(Square, 0, 1, "cpu", CfgNode(), 0, None)
    parts = core.codec.dumps((0, list(range(args.batch))))
    core.run(1, parts, 0.0)  # learns the cost per item
    per_item = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.batches):
            core.run(1, parts, 0.0)
        per_item.append((time.perf_counter() - t0) / (args.batches * args.batch) * 1e9)
    print(
        f"{statistics.median(per_item):.1f} ns an item ({min(per_item):.1f}..{max(per_item):.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
