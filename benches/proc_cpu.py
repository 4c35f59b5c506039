"""CPU time and context switches of a benchmark's processes, read from ``/proc`` (Linux): what
the producers or workers of the runner, pool or pipe it measures spent (``round_trip_cpu.py``,
``thread_cpu.py``), and how often the caller and they were switched out."""

from __future__ import annotations

import os
import resource


def _children() -> list[str]:
    """The pids of this process's children (live ones)."""
    me = os.getpid()
    pids: list[str] = []
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
    return pids


def children_cpu() -> float:
    """CPU seconds of this process's children so far (live ones, from /proc)."""
    ticks = 0
    for pid in _children():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def switches() -> tuple[int, int]:
    """Context switches of this process's threads so far, ended ones too (``getrusage``):
    ``(voluntary, involuntary)`` (a thread slept; the scheduler took its CPU away)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw, usage.ru_nivcsw


def _switches_of(pid: str) -> tuple[int, int]:
    """:func:`switches` of another process, its live threads (``/proc``; zeros if gone)."""
    voluntary = involuntary = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary += int(line.split()[1])
        except OSError:
            pass
    return voluntary, involuntary


def children_switches() -> tuple[int, int]:
    """Context switches of this process's children (live ones, their live threads), summed:
    ``(voluntary, involuntary)``."""
    pairs = [_switches_of(pid) for pid in _children()]
    return sum(v for v, _ in pairs), sum(i for _, i in pairs)
