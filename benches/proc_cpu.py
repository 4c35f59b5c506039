"""CPU time of a benchmark's child processes, read from ``/proc`` (Linux): what the producers
or workers of the runner, pool or pipe it measures spent (``round_trip_cpu.py``,
``thread_cpu.py``)."""

from __future__ import annotations

import os


def children_cpu() -> float:
    """CPU seconds of this process's children so far (live ones, from /proc)."""
    me = os.getpid()
    pids: list[str] = []
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks / os.sysconf("SC_CLK_TCK")
