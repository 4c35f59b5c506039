"""Where the caller's CPU goes, thread by thread: the CPU time per result of each thread of
the calling process (its consumer or receiving thread, a pool's service thread, the input
thread) for the bench's systems on one workload, beside the delivered GB/s or items/s.

Run::

    .venv/bin/python benches/thread_cpu.py                                 # numpy_1mib
    .venv/bin/python benches/thread_cpu.py --workload numpy_16mib --calls 2
    .venv/bin/python benches/thread_cpu.py --systems easycore_pool --items 2048

Each system (the bench's own sessions, ``--workers`` CPU producers) runs one warm-up call
of a quarter of ``--items``, then ``--calls`` calls of ``--items``; the CPU time of every
thread alive at the end (``/proc/self/task``, named by ``threading``; ``?``: one it does not
list) and of the whole
process (``os.times``: threads that ended during the calls too) is divided by the results.
The CPU time of the caller's child processes (its producers or workers, from
``/proc``) per result follows. On a machine whose cores are all busy, the CPU per result of
both sides bounds the throughput.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from easycore.bench import systems as S  # noqa: N812
from easycore.bench import workloads as W  # noqa: N812
from proc_cpu import children_cpu


def _threads_cpu() -> dict[tuple[int, str], float]:
    """CPU seconds of each live thread of this process, by (native id, name)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[(int(tid), names.get(int(tid), "?"))] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    """Parses the arguments and prints one line per system (see the module)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="numpy_1mib")
    ap.add_argument("--systems", default="easycore,easycore_imap,easycore_pool")
    ap.add_argument("--workers", type=int, default=2, help="CPU producers or workers")
    ap.add_argument("--items", type=int, default=1024, help="items per timed call")
    ap.add_argument("--calls", type=int, default=3, help="timed calls per system")
    args = ap.parse_args()
    w = W.WORKLOADS[args.workload]
    job = S.Job(hooks=w.hooks, ordered=False, devices=["cpu"] * args.workers, make_data=w.make_data)
    n = args.items * args.calls
    for key in args.systems.split(","):
        with S.SYSTEMS[key].session(job) as call:
            call(w.make_data(max(1, args.items // 4)))
            k0 = children_cpu()
            before, c0, t0 = _threads_cpu(), os.times(), time.perf_counter()
            for _ in range(args.calls):
                call(w.make_data(args.items))
            dt, c1, after = time.perf_counter() - t0, os.times(), _threads_cpu()
            workers = (children_cpu() - k0) / n * 1e6
        per: dict[str, float] = {}
        for k, v in after.items():
            per[k[1]] = per.get(k[1], 0.0) + v - before.get(k, 0.0)
        total = (c1.user + c1.system - c0.user - c0.system) / n * 1e6
        rate = f"{n * w.item_bytes / dt / 1e9:6.2f} GB/s" if w.item_bytes else f"{n / dt:9.0f}/s"
        threads = ", ".join(f"{k} {v / n * 1e6:.1f}" for k, v in sorted(per.items()) if v > 0)
        print(
            f"{key:15s} {rate}; caller CPU {total:6.1f} µs a result ({threads}); "
            f"producers {workers:6.1f} µs"
        )


if __name__ == "__main__":
    main()
