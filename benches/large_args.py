"""Large arguments into a runner and a pool: easycore's runner (``runner.imap``), its
``Pool`` and ``multiprocessing.Pool`` (2 producers or workers each), a cheap function
(``x[0]``) of 1 MiB arguments, given as a list (which a pool slices into chunks) and as an
iterator (read item by item).

Run::

    .venv/bin/python benches/large_args.py                   # numpy arrays
    .venv/bin/python benches/large_args.py --kind bytes      # bytes objects
    .venv/bin/python benches/large_args.py --items 512 --calls 5

Each system makes one untimed call, then ``--calls`` timed calls of ``imap_unordered`` (the
runner: ``imap``, or a call of its consumer hooks; ``tasks`` and ``mp_tasks``: one
``apply_async`` per argument) over ``--items`` arguments for each input in turn; it prints
the median GB/s (1e9 bytes of arguments a second), min and max. The arguments are made once,
before the systems start; ``--systems`` picks and orders them.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from easycore.common.parallel import UnorderedRunner
from easycore.parallel import Pool


def first(x: Any) -> int:
    """A cheap function of a large argument."""
    return int(x[0])


class _Heads(UnorderedRunner):
    """``x[0]`` of each argument, summed by the consumer hooks (or by ``imap``'s caller)."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> int:
        return int(data[0])

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.total = 0

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.total += data

    @staticmethod
    def consumer_end(cfg: Any) -> int:
        return cfg.total


class _RunnerAsPool:
    """A runner with the two calls this script makes of a pool: ``imap``, or (``hooks``)
    a call of the consumer hooks, whose sum stands for the results."""

    def __init__(self, hooks: bool = False) -> None:
        self.runner = _Heads(devices=2)
        self.hooks = hooks

    def imap_unordered(self, fn: Callable[[Any], int], data: Iterable[Any]) -> Iterable[int]:
        return [self.runner(data)] if self.hooks else self.runner.imap(data)

    def __enter__(self) -> _RunnerAsPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.close()


def _timed(
    imap: Callable[[Callable[[Any], int], Iterable[Any]], Iterable[int]],
    data: list[Any],
    as_list: bool,
    calls: int,
) -> list[float]:
    want = sum(int(x[0]) for x in data)
    nbytes = sum(len(x) for x in data)
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        got = sum(imap(first, data if as_list else iter(data)))
        dt = time.perf_counter() - t0
        if got != want:
            raise SystemExit(f"wrong result: {got} != {want}")
        out.append(nbytes / dt / 1e9)
    return out


class _Submits:
    """A pool whose ``imap_unordered`` submits one task per argument (``apply_async``) and
    waits for them all."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def imap_unordered(self, fn: Callable[[Any], int], data: Iterable[Any]) -> Iterable[int]:
        return [r.get() for r in [self.pool.apply_async(fn, (x,)) for x in data]]

    def __enter__(self) -> _Submits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.terminate()
        self.pool.join()


_SYSTEMS: dict[str, tuple[str, Callable[[], Any]]] = {
    "imap": ("easycore runner.imap", _RunnerAsPool),
    "hooks": ("easycore runner, hooks", lambda: _RunnerAsPool(hooks=True)),
    "pool": ("easycore Pool", lambda: Pool(2)),
    "mp": ("multiprocessing.Pool", lambda: mp.get_context("fork").Pool(2)),
    "tasks": ("easycore Pool.apply_async", lambda: _Submits(Pool(2))),
    "mp_tasks": ("mp.Pool.apply_async", lambda: _Submits(mp.get_context("fork").Pool(2))),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("array", "bytes"), default="array")
    ap.add_argument("--items", type=int, default=256, help="arguments per call")
    ap.add_argument("--calls", type=int, default=3, help="timed calls per pool and input")
    ap.add_argument(
        "--systems", default=",".join(_SYSTEMS), help=f"from {', '.join(_SYSTEMS)}, in order"
    )
    args = ap.parse_args()
    size = 1 << 20
    if args.kind == "array":
        data: list[Any] = [np.full(size, i % 251, np.uint8) for i in range(args.items)]
    else:
        data = [bytes([i % 251]) * size for i in range(args.items)]
    for key in args.systems.split(","):
        name, make = _SYSTEMS[key]
        with make() as pool:
            list(pool.imap_unordered(first, iter(data[:16])))  # untimed: start, learn
            for as_list in (True, False):
                rates = _timed(pool.imap_unordered, data, as_list, args.calls)
                how = "a list" if as_list else "an iterator"
                print(
                    f"{name:<22} {args.kind} arguments, {how:<12} "
                    f"{statistics.median(rates):6.2f} GB/s (min {min(rates):.2f}, "
                    f"max {max(rates):.2f})"
                )


if __name__ == "__main__":
    main()
