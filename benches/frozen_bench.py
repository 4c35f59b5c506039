"""Memory and speed of a big read-only index in producers: a plain list vs ``shm.freeze``.

Run::

    .venv/bin/python benches/frozen_bench.py                      # 1M items, 2 producers
    .venv/bin/python benches/frozen_bench.py --items 1000000 --producers 2 4
    .venv/bin/python benches/frozen_bench.py --items 10000000 --producers 2 8   # big machines
    .venv/bin/python benches/frozen_bench.py --json out.json --no-spawn

The index is ``items`` small dicts ``{"path": str, "label": int, "box": (4 floats)}``, the
shape of a detection data set's index. Every measurement runs in a fresh Python process:

* **tree PSS** (fork): the caller builds the index (the plain list as a module global, as
  a data set object holds it; the frozen one with ``shm.freeze`` from a generator, so the
  caller never holds the plain list, and then reads every item of it once, so that its
  pages count in the caller's size), then a runner starts ``P`` forked producers whose
  ``producer_init`` reads every item (three fields of each). The proportional set size of
  the caller and of every process under it (``/proc/<pid>/smaps_rollup``; shared pages are
  divided among the processes mapping them) is summed before the producers start and after
  they have read everything. ``none`` is the same runner with an empty index: what the
  producers and the runner's queues cost whatever the index.
* **random reads per producer** (fork, the same runner): each producer reads ``--reads``
  items at random indices (one field of each) and reports reads per second.
* **start-up under spawn**: from the runner's construction with the index in ``cfg`` (as
  users write ``cfg={"index": index}``) to the end of a first one-item-per-producer call.
  The plain list is deep-copied into the runner's config and pickled into every producer;
  the frozen one is a reference of about 130 bytes. The time to freeze is shown apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from easycore.common.parallel import UnorderedRunner

INDEX: Any = None  # the plain list, inherited by forked producers


def make_item(i: int) -> dict[str, Any]:
    f = (i % 997) / 997.0
    return {
        "path": f"/data/images/train/{i // 1000:05d}/{i:09d}.jpg",
        "label": i % 1000,
        "box": (f, f + 0.01, f + 0.5, f + 0.51),
    }


def index_of(cfg: Any) -> Any:
    return cfg["index"] if "index" in cfg else INDEX


class ReadAll(UnorderedRunner):
    """producer_init reads every item; producer_work(k) times k random reads."""

    @staticmethod
    def producer_init(device: Any, cfg: Any) -> None:
        idx = index_of(cfg)
        total = 0
        for i in range(len(idx)):
            x = idx[i]
            total += x["label"] + len(x["path"]) + len(x["box"])
        cfg.total = total

    @staticmethod
    def producer_work(device: Any, cfg: Any, k: int) -> Any:
        idx = index_of(cfg)
        if not len(idx):
            return os.getpid(), 0.0, cfg.total
        picks = random.Random(k).choices(range(len(idx)), k=k)
        t = time.perf_counter()
        s = 0
        for i in picks:
            s += idx[i]["label"]
        dt = time.perf_counter() - t
        return os.getpid(), k / dt, cfg.total

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.out = []

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.out.append(data)

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return cfg.out


class Touch(UnorderedRunner):
    """For start-up: each producer reads one item."""

    @staticmethod
    def producer_work(device: Any, cfg: Any, i: int) -> Any:
        return cfg.index[i]["label"]


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    parent: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parent.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parent.get(p, []))
    return out


def tree_pss_mib() -> tuple[float, int]:
    pids = tree(os.getpid())
    return sum(pss_kib(p) for p in pids) / 1024, len(pids)


def build(kind: str, n: int) -> tuple[Any, float]:
    from easycore import shm

    t = time.perf_counter()
    if kind == "none":
        idx: Any = []
    elif kind == "plain":
        idx = [make_item(i) for i in range(n)]
    else:
        idx = shm.freeze(make_item(i) for i in range(n))
    return idx, time.perf_counter() - t


def run_pss(kind: str, n: int, producers: int, reads: int) -> dict[str, Any]:
    global INDEX
    from easycore.common.config import CfgNode

    idx, built = build(kind, n)
    cfg = CfgNode()
    if kind == "frozen":
        cfg = CfgNode({"index": idx})
        for _x in idx:  # the caller reads it too: its pages count in the caller's size
            pass
    else:
        INDEX = idx
    gc.collect()
    before, _ = tree_pss_mib()
    with ReadAll(devices=producers, cfg=cfg, start_method="fork") as r:
        r([10] * producers)  # producer_init has read everything in every producer
        after_read, nproc = tree_pss_mib()
        rates = r([reads] * (2 * producers))
    return {
        "kind": kind,
        "items": n,
        "producers": producers,
        "build_s": built,
        "arena_mib": getattr(idx, "nbytes", 0) / 2**20,
        "caller_pss_mib": before,
        "tree_pss_mib": after_read,
        "processes": nproc,
        "ratio": after_read / before,
        "reads_per_s": sorted(rate for _, rate, _ in rates)[len(rates) // 2],
    }


def run_spawn(kind: str, n: int, producers: int) -> dict[str, Any]:
    idx, built = build(kind, n)
    gc.collect()
    t = time.perf_counter()
    with Touch(devices=producers, cfg={"index": idx}, start_method="spawn") as r:
        r(range(producers))
        startup = time.perf_counter() - t
    return {
        "kind": kind,
        "items": n,
        "producers": producers,
        "build_s": built,
        "startup_s": startup,
    }


def child(args: argparse.Namespace) -> None:
    if args.scenario == "pss":
        out = run_pss(args.kind, args.items[0], args.producers[0], args.reads)
    else:
        out = run_spawn(args.kind, args.items[0], args.producers[0])
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--producers", type=int, nargs="+", default=[2])
    ap.add_argument("--reads", type=int, default=200_000, help="random reads per measurement")
    ap.add_argument("--no-spawn", action="store_true", help="skip the spawn start-up runs")
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=["none", "plain", "frozen"],
        default=["none", "plain", "frozen"],
        help="which indexes to measure (a plain 10M-item index needs about (producers + 1) "
        "x 5 GB of memory; '--kinds none frozen' measures the frozen one alone)",
    )
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scenario:
        child(args)
        return
    results = []

    def sub(*extra: str) -> dict[str, Any]:
        cmd = [sys.executable, os.path.abspath(__file__), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
        res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        results.append(res)
        return res

    print(f"{'index':>10} {'P':>2} {'kind':>6} | {'caller MiB':>10} {'tree MiB':>9} "
          f"{'ratio':>6} {'arena MiB':>9} | {'reads/s/producer':>16} | {'build s':>7}")  # fmt: skip
    for n in args.items:
        for p in args.producers:
            for kind in args.kinds:
                o = sub("--scenario", "pss", "--kind", kind, "--items", str(n),
                        "--producers", str(p), "--reads", str(args.reads))  # fmt: skip
                print(f"{n:>10} {p:>2} {kind:>6} | {o['caller_pss_mib']:>10.0f} "
                      f"{o['tree_pss_mib']:>9.0f} {o['ratio']:>5.2f}x {o['arena_mib']:>9.0f} | "
                      f"{o['reads_per_s']:>16,.0f} | {o['build_s']:>7.1f}", flush=True)  # fmt: skip
    if not args.no_spawn:
        print(f"\n{'index':>10} {'P':>2} {'kind':>6} | spawn start-up s (build s apart)")
        for n in args.items:
            p = args.producers[0]
            for kind in [k for k in args.kinds if k != "none"]:
                o = sub("--scenario", "spawn", "--kind", kind, "--items", str(n),
                        "--producers", str(p))  # fmt: skip
                print(f"{n:>10} {p:>2} {kind:>6} | {o['startup_s']:>8.2f} "
                      f"({o['build_s']:.1f})", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
