"""What the pool's slowest batches were (``Pool.stats.slowest``): a label naming the call and
items (or the submitted task) of a batch of the pool's work items, made in the worker only
for a batch that is among the stream's slowest (see ``easycore._engine.insights``)."""

from __future__ import annotations

from typing import Any

from easycore.parallel.feed import _TASK

_MOST = 3  # work items named in a label; the rest are counted


def describe_batch(items: list[Any]) -> str | None:
    """``"call 3, item 17"``, ``"call 3, items 16..31"``, ``"task (call 5)"``; the work items
    of a batch joined by ``"; "`` (consecutive items of one call as one range)."""
    runs: list[list[int]] = []  # [job, first, end] (job 0: a task, first its call)
    for w in items:
        if w is None:
            continue
        job, index, _fn, arg, mode = w
        if mode == _TASK:
            runs.append([0, index, index + 1])
        elif runs and runs[-1][0] == job and runs[-1][2] == index:
            runs[-1][2] = index + len(arg)
        else:
            runs.append([job, index, index + len(arg)])
    parts = [
        f"task (call {first})"
        if job == 0
        else f"call {job}, item {first}"
        if end - first == 1
        else f"call {job}, items {first}..{end - 1}"
        for job, first, end in runs[:_MOST]
    ]
    if len(runs) > _MOST:
        parts.append(f"and {len(runs) - _MOST} more")
    return "; ".join(parts) or None
