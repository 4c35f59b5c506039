"""``python -m easycore.bench --backend ray``: the Ray backend beside the local runner and a
plain ``ray.util.ActorPool``, on a local cluster of 2 nodes x 1 CPU (or the cluster at
``--address``).

Two workloads, each verified:

* ``tiny``: ints in, ``x + 1`` out (per-item overhead: what batching buys);
* ``1mib``: ints in, 1 MiB float32 arrays out (bandwidth through the object store).

Systems: ``local`` (an ``OrderedRunner`` with local processes), ``ray`` (the same runner
class with ``backend="ray"``) and ``actorpool`` (``ActorPool.map`` over as many actors, one
item per call, as Ray's documentation shows it). Each figure is the best of ``--repeats``
timed calls after one warm-up call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from easycore.common.parallel import OrderedRunner

_ARRAY_FLOATS = 1 << 18  # 1 MiB of float32


class Tiny(OrderedRunner):
    """``x + 1`` for each int."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: int) -> int:
        return data + 1


class Mib(OrderedRunner):
    """A 1 MiB float32 array filled with the item."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: int) -> Any:
        return np.full(_ARRAY_FLOATS, data, dtype=np.float32)


class _Actor:
    """The plain-Ray baseline: the same work as an actor method."""

    def tiny(self, x: int) -> int:
        return x + 1

    def mib(self, x: int) -> Any:
        return np.full(_ARRAY_FLOATS, x, dtype=np.float32)


def _digest(kind: str, results: Any) -> list[Any]:
    """What is kept of each result to verify it: the value, or an array's first element and
    size (keeping 1 MiB results would pin them all in the object store, which then spills)."""
    if kind == "tiny":
        return list(results)
    return [(float(a[0]), a.nbytes) for a in results]


def _check(kind: str, n: int, out: list[Any]) -> None:
    if kind == "tiny":
        ok = out == [x + 1 for x in range(n)]
    else:
        ok = out == [(float(i), 1 << 20) for i in range(n)]
    if not ok:
        raise AssertionError(f"wrong results for {kind}")


def _best(fn: Callable[[], list[Any]], kind: str, n: int, repeats: int) -> float:
    _check(kind, n, fn())  # warm-up (and the learned batch size)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        _check(kind, n, out)
        del out
    return best


def _one(kind: str, cls: type, n: int, workers: int, repeats: int, actor: Any) -> list[float]:
    """Seconds of the best call of each system (local, ray, actorpool) on one workload."""
    import ray
    from ray.util import ActorPool

    data = list(range(n))
    with cls(devices=workers) as local:
        t_local = _best(lambda: _digest(kind, local.imap(data)), kind, n, repeats)
    with cls(devices=workers, backend="ray") as remote:
        t_ray = _best(lambda: _digest(kind, remote.imap(data)), kind, n, repeats)
    actors = [actor.remote() for _ in range(workers)]
    try:
        pool = ActorPool(actors)
        if kind == "tiny":
            t_pool = _best(
                lambda: _digest(kind, pool.map(lambda a, v: a.tiny.remote(v), data)),
                kind,
                n,
                repeats,
            )
        else:
            t_pool = _best(
                lambda: _digest(kind, pool.map(lambda a, v: a.mib.remote(v), data)),
                kind,
                n,
                repeats,
            )
    finally:
        for a in actors:
            ray.kill(a)
    return [t_local, t_ray, t_pool]


def measure(workers: int, sizes: dict[str, int], repeats: int) -> list[dict[str, Any]]:
    """Runs every system on every workload (Ray must be initialised); rows of figures."""
    import ray

    rows: list[dict[str, Any]] = []
    actor = ray.remote(num_cpus=1)(_Actor)
    for kind, cls in (("tiny", Tiny), ("1mib", Mib)):
        n = sizes[kind]
        times = _one(kind, cls, n, workers, repeats, actor)
        for system, t in zip(("local", "ray", "actorpool"), times, strict=True):
            rows.append(
                {
                    "workload": kind,
                    "system": system,
                    "items": n,
                    "seconds": t,
                    "items_per_s": n / t,
                }
            )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table, with each system's rate relative to the plain ActorPool."""
    lines = [f"{'workload':<9} {'system':<10} {'items':>7} {'items/s':>12} {'vs ActorPool':>13}"]
    pool = {r["workload"]: r["items_per_s"] for r in rows if r["system"] == "actorpool"}
    for r in rows:
        ratio = r["items_per_s"] / pool[r["workload"]]
        lines.append(
            f"{r['workload']:<9} {r['system']:<10} {r['items']:>7} {r['items_per_s']:>12,.0f} "
            f"{ratio:>12.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m easycore.bench --backend ray``."""
    ap = argparse.ArgumentParser(prog="easycore-bench --backend ray", description=__doc__)
    ap.add_argument("--backend", choices=["ray"], default="ray")
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--workers", type=int, default=2, help="actors / processes (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (default 3)")
    ap.add_argument("--tiny-items", type=int, default=None, help="items of the tiny workload")
    ap.add_argument("--mib-items", type=int, default=None, help="items of the 1 MiB workload")
    ap.add_argument("--address", help="an existing Ray cluster (default: a local 2-node one)")
    args = ap.parse_args(argv)
    sizes = {
        "tiny": args.tiny_items or (2000 if args.quick else 20000),
        "1mib": args.mib_items or (100 if args.quick else 500),
    }
    repeats = args.repeats or (1 if args.quick else 3)
    try:
        import ray
    except ModuleNotFoundError:
        raise SystemExit("--backend ray needs Ray: pip install 'easycore[ray]'") from None
    if args.address:
        ray.init(address=args.address)
        where = f"the Ray cluster at {args.address}"
        rows = measure(args.workers, sizes, repeats)
    else:
        from easycore.ray.testing import local_cluster

        where = "a local Ray cluster of 2 nodes x 1 CPU (300 MiB object store each)"
        with local_cluster(nodes=2, cpus_per_node=1, object_store_mib=300):
            rows = measure(args.workers, sizes, repeats)
    print(f"easycore Ray backend, {args.workers} actors on {where}; best of {repeats}")
    print(format_rows(rows))
    return 0
