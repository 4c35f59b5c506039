"""What the pool's slowest tasks were (``Pool.stats.slowest``): a label naming the submitted
task, or the call and items of a chunk (the pool's work item, a task as
``multiprocessing.Pool`` counts them), made in the worker only for a work item that is among
the stream's slowest (see ``easycore._engine.insights``)."""

from __future__ import annotations

from typing import Any

from easycore.parallel.feed import _TASK


def describe_item(item: Any) -> str | None:
    """``"call 3, item 17"``, ``"call 3, items 16..31"`` (a chunk: their time together),
    ``"task (call 5)"``; None for a work item that did not travel."""
    if item is None:
        return None
    job, index, _fn, arg, mode = item
    if mode == _TASK:
        return f"task (call {index})"
    n = len(arg)
    return f"call {job}, item {index}" if n == 1 else f"call {job}, items {index}..{index + n - 1}"
