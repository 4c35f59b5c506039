"""Where a request/response round trip's time goes: wall time and CPU time per round trip,
in the caller and in its worker processes, for a runner, the pool and a bare ``Pipe``.

Run::

    .venv/bin/python benches/round_trip_cpu.py                  # 30,000 round trips each
    taskset -c 1 .venv/bin/python benches/round_trip_cpu.py     # every process on one core
    .venv/bin/python benches/round_trip_cpu.py --workers 2      # as the bench's default
    .venv/bin/python benches/round_trip_cpu.py --items 100 --calls 300  # short calls

Each system runs the bench's ``latency`` workload through the bench's own systems (its
runner, pool and Pipe sessions): item ``i + 1`` of the input exists only once result
``i`` reached ``consumer_work``, one worker (``--workers``: the runner's and the pool's;
the ``Pipe`` loop has one), ``x * x`` per item. After a warm-up call it
times ``--calls`` calls (one by default) of ``--items`` round trips each, one after the
other (what a loop of short request/response calls pays at each call's start shows with
many short ones), and reads the CPU time of the caller (all its threads) and of its
children (``/proc/<pid>/stat``) around them. On a machine where the
two sides share a core (pinned, or beside busy processes) a round trip costs about the
sum of both sides' CPU; on an idle machine the wake-ups across cores dominate. The context
switches of the caller's threads and of the workers' per round trip follow (``/proc``;
voluntary: a thread slept; involuntary: the scheduler took its CPU, as a wake-up of the
other side on a shared core does).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from easycore.bench import systems as S  # noqa: N812
from easycore.bench import workloads as W  # noqa: N812
from proc_cpu import children_cpu, children_switches, switches

_SYSTEMS = {
    "easycore": "runner (hooks)",
    "easycore_pool": "Pool.imap_unordered",
    "pipe": "multiprocessing.Pipe",
}


def _measure(name: str, call: Callable[[Iterable[int]], Any], n: int, calls: int) -> None:
    call(W.feedback_data(200))  # warm-up: workers started, costs learned
    s0, ks0 = switches(), children_switches()
    k0, c0, t0 = children_cpu(), os.times(), time.perf_counter()
    for _ in range(calls):
        got = call(W.feedback_data(n))
        if got != W.expected_square_sum(n):
            raise SystemExit(f"{name}: wrong result {got}")
    t1, c1, k1 = time.perf_counter(), os.times(), children_cpu()
    s1, ks1 = switches(), children_switches()
    n *= calls
    us = 1e6 / n
    caller = (c1.user - c0.user + c1.system - c0.system) * us
    print(
        f"{name:24s} {(t1 - t0) * us:7.1f} µs per round trip; CPU per round trip: caller "
        f"{caller:5.1f} µs (kernel {(c1.system - c0.system) * us:4.1f}), "
        f"workers {(k1 - k0) * us:5.1f} µs; switches per round trip (voluntary/involuntary): "
        f"caller {(s1[0] - s0[0]) / n:.2f}/{(s1[1] - s0[1]) / n:.2f}, "
        f"workers {(ks1[0] - ks0[0]) / n:.2f}/{(ks1[1] - ks0[1]) / n:.2f}"
    )


def main() -> None:
    """Parses the arguments and prints one line per system (see the module)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=30_000, help="round trips per system")
    ap.add_argument(
        "--workers", type=int, default=1, help="worker processes of the runner and the pool"
    )
    ap.add_argument("--calls", type=int, default=1, help="timed calls of --items each")
    args = ap.parse_args()
    n = args.items
    if n < 1 or args.calls < 1:
        raise SystemExit("--items and --calls must be at least 1")
    w = W.WORKLOADS["latency"]
    job = S.Job(hooks=w.hooks, ordered=False, devices=["cpu"] * args.workers, make_data=w.make_data)
    for key, name in _SYSTEMS.items():
        with S.SYSTEMS[key].session(job) as call:
            _measure(name, call, n, args.calls)


if __name__ == "__main__":
    main()
