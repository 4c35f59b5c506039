"""A training loop's loader whose function is a closure over its data set, through the pool.

The function is ``lambda i: augment(data[i])`` over a ``--mib`` MiB numpy array (rows of
4 KiB; ``augment`` flips a row and adds noise, returning float32): a closure that pickles to
megabytes. Two loaders, each ``--batches`` batches of ``--batch`` items:

* ``per-call``: one ``pool.imap`` per batch (``list(pool.imap(f, indices))``), as a loop that
  asks for each batch when it needs it;
* ``stream``: one ``pool.imap`` over every item, taken ``--batch`` at a time.

Then the pool's tiny items: ``sum(pool.imap_unordered(square, range(--tiny)))`` (a
module-level function: nothing of the closure's path), items/s, the median of three calls.

Each figure is batches/s (items/s for tiny) and the bytes sent per message to the workers
(``pool.stats``). ``--modes`` picks what runs, in turn, round after round, each on a fresh pool:
``once`` (the pool as it is: a by-value function of 64 KiB or more is stored once in a
read-only arena and each message names it) and ``each`` (the same pool with that threshold
raised out of reach, so the body travels with every message). Run the script with another
checkout's interpreter to measure that checkout (``--modes once`` there, as it may lack the
switch). Medians are printed at the end, and ``--json`` writes every sample.

Example::

    python benches/closure_loader.py --rounds 5 --modes once,each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROW = 4096  # bytes per row of the data set


def augment(row: np.ndarray) -> np.ndarray:
    """A light augmentation: flip, scale to [0, 1) and add noise (float32)."""
    out = row[::-1].astype(np.float32) * (1.0 / 255.0)
    out += np.random.standard_normal(out.shape).astype(np.float32) * 0.01
    return out


def square(x: int) -> int:
    return x * x


def _switch(mode: str) -> None:
    """``each``: no body is stored once (the threshold out of reach); ``once``: as shipped."""
    try:
        from easycore.parallel import functions
    except ImportError:
        if mode == "each":
            raise SystemExit("this checkout has no closure arena to switch off") from None
        return
    if not hasattr(functions, "_SHARE_MIN"):
        if mode == "each":
            raise SystemExit("this checkout has no closure arena to switch off")
        return
    functions._SHARE_MIN = 1 << 62 if mode == "each" else 64 * 1024


def _loader(args: argparse.Namespace, style: str) -> dict[str, float]:
    from easycore.parallel import Pool

    rows = (args.mib << 20) // ROW
    data = np.random.default_rng(0).integers(0, 256, (rows, ROW), dtype=np.uint8)
    f = lambda i: augment(data[i])  # noqa: E731 - the closure a loader ships
    order = np.random.default_rng(1).permutation(rows)
    n, b = args.batches, args.batch
    indices = [int(order[(k * b + j) % rows]) for k in range(n) for j in range(b)]
    with Pool(args.workers, start_method=args.start_method) as pool:
        pool.map(square, range(4))  # the workers are up
        t0 = time.perf_counter()
        if style == "per-call":
            for k in range(n):
                batch = list(pool.imap(f, indices[k * b : (k + 1) * b]))
                assert len(batch) == b
        else:
            it = pool.imap(f, indices)
            for _ in range(n):
                batch = [next(it) for _ in range(b)]
            assert next(it, None) is None
        dt = time.perf_counter() - t0
        s = pool.stats
        return {"rate": n / dt, "bytes_per_message": s.bytes_in / max(1, s.batches)}


def _tiny(args: argparse.Namespace) -> dict[str, float]:
    from easycore.parallel import Pool

    n = args.tiny
    expected = sum(x * x for x in range(n))
    with Pool(args.workers, start_method=args.start_method) as pool:
        pool.map(square, range(4))
        rates = []
        for _ in range(3):  # the median of three calls
            t0 = time.perf_counter()
            total = sum(pool.imap_unordered(square, range(n)))
            rates.append(n / (time.perf_counter() - t0))
            assert total == expected
        s = pool.stats
        return {
            "rate": statistics.median(rates),
            "bytes_per_message": s.bytes_in / max(1, s.batches),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=4, help="size of the data set (MiB; default 4)")
    ap.add_argument("--batch", type=int, default=64, help="items per batch (default 64)")
    ap.add_argument("--batches", type=int, default=40, help="batches per loader (default 40)")
    ap.add_argument("--tiny", type=int, default=1_000_000, help="tiny items a call (default 1M)")
    ap.add_argument("--workers", type=int, default=2, help="pool workers (default 2)")
    ap.add_argument("--start-method", default="fork", help="fork, spawn or forkserver")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every mode (default 3)")
    ap.add_argument(
        "--modes", default="once,each", help="comma-separated: once, each (default both)"
    )
    ap.add_argument(
        "--workloads",
        default="per-call,stream,tiny",
        help="comma-separated: per-call, stream, tiny (default all)",
    )
    ap.add_argument("--json", help="write every sample to this file")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    workloads = args.workloads.split(",")
    samples: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for mode in modes:
            _switch(mode)
            for w in workloads:
                got = _tiny(args) if w == "tiny" else _loader(args, w)
                samples.setdefault(f"{w} {mode}", []).append(got)
                unit = "items/s" if w == "tiny" else "batches/s"
                print(
                    f"round {r + 1} {w:>8} {mode:>4}: {got['rate']:>10,.0f} {unit}, "
                    f"{got['bytes_per_message']:>12,.0f} bytes/message",
                    flush=True,
                )
    print(f"medians of {args.rounds} (load {os.getloadavg()[0]:.1f}, {sys.executable}):")
    for key, got in samples.items():
        rates = [g["rate"] for g in got]
        per = statistics.median(g["bytes_per_message"] for g in got)
        print(
            f"  {key:>14}: {statistics.median(rates):>10,.0f} "
            f"({min(rates):,.0f}..{max(rates):,.0f}), {per:,.0f} bytes/message"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
