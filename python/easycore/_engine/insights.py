"""Insights beyond the totals of ``runner.stats``: the slowest batches of a call (kept in
each producer, merged in the caller) and a readable summary of a :class:`RunnerStats`.

Cost: one comparison per batch in the producer (its duration is already measured for
``producer_busy_s``); a batch that enters the producer's top ``SLOWEST`` of the call is sent
with its results (a few dozen bytes) and merged in the caller. Nothing per item.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ``stats``: a ``RunnerStats`` (stats.py imports this module).
RunnerStats = Any

SLOWEST = 5  # how many of the slowest batches a call keeps


@dataclass(frozen=True)
class SlowTask:
    """One of the slowest batches of a call (``RunnerStats.slowest``).

    Attributes:
        seconds: how long ``producer_work`` ran on it.
        producer: the producer that ran it (its position in ``devices``).
        item: the index of its first item in the call.
        count: its number of items (1: ``seconds`` is that item's own time).
        label: what it was, said by the runner (the pool: ``"call 3, item 17"``,
            ``"task (call 5)"``), or None.
    """

    seconds: float
    producer: int
    item: int
    count: int = 1
    label: str | None = None

    def __str__(self) -> str:
        what = self.label
        if what is None and self.count <= 1:
            what = f"item {self.item}"
        elif what is None:
            what = f"items {self.item}..{self.item + self.count - 1}"
        return f"{_secs(self.seconds)}  {what} (producer {self.producer})"


# In a producer: the runner's label for a batch's items (see describe_batches_with), or None.
_DESCRIBE: list[Callable[[list[Any]], str | None] | None] = [None]


def describe_batches_with(describe: Callable[[list[Any]], str | None] | None) -> None:
    """In a producer (its set-up): ``describe(items)`` labels each slow batch of this process
    (the pool names the call and items, or the task); None: no label."""
    _DESCRIBE[0] = describe


class SlowBatches:
    """A producer's slowest batches of the call being run: :meth:`note` is called once per
    batch, and returns what to send to the caller (a batch that entered the top
    ``SLOWEST``), else None."""

    def __init__(self) -> None:
        self.call = 0
        self.heap: list[float] = []  # the call's slowest durations so far (a min-heap)

    def note(
        self, call: int, seconds: float, first: int, items: list[Any]
    ) -> tuple[float, int, int, str | None] | None:
        """``(seconds, first, count, label)`` if this batch is among the call's slowest."""
        heap = self.heap
        if call != self.call:
            self.call = call
            heap.clear()
        if len(heap) < SLOWEST:
            heapq.heappush(heap, seconds)
        elif seconds > heap[0]:
            heapq.heapreplace(heap, seconds)
        else:
            return None
        label = None
        describe = _DESCRIBE[0]
        if describe is not None:
            try:
                label = describe(items)
            except Exception:  # noqa: BLE001 - a label is a nicety, never an error
                label = None
        return seconds, first, len(items), label


def merge_slow(stats: RunnerStats, producer: int, slow: Any) -> None:
    """Adds a producer's slow batch (what :meth:`SlowBatches.note` returned) to the call's
    ``stats.slowest`` (kept sorted, slowest first, at most ``SLOWEST``)."""
    seconds, first, count, label = slow
    entry = SlowTask(float(seconds), producer, int(first), int(count), label)
    slowest = stats.slowest
    if len(slowest) >= SLOWEST and entry.seconds <= slowest[-1].seconds:
        return
    slowest.append(entry)
    slowest.sort(key=lambda e: -e.seconds)
    del slowest[SLOWEST:]


def _secs(s: float) -> str:
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def summary(stats: RunnerStats) -> str:
    """A table of the figures, per producer, then the slowest batches and the bottleneck
    (what mpire's ``print_insights`` shows)."""
    s = stats
    lines = [
        f"{s.items} items in {s.batches} batches, {_secs(s.wall_s)}; "
        f"{s.bytes_in:,} bytes sent, {s.bytes_out:,} received",
        f"{'producer':>8} {'items':>9} {'start-up':>9} {'init':>9} {'in tasks':>9} "
        f"{'waiting':>9} {'busy':>5}",
    ]
    producers = sorted(set(s.producer_items) | set(s.producer_busy_s) | set(s.producer_start_s))
    for i in producers:
        busy = s.producer_busy_s.get(i, 0.0)
        share = f"{busy / s.wall_s:.0%}" if s.wall_s > 0 else "-"
        start = s.producer_start_s.get(i)
        init = s.producer_init_s.get(i)
        lines.append(
            f"{i:>8} {s.producer_items.get(i, 0):>9} "
            f"{'-' if start is None else _secs(start):>9} "
            f"{'-' if init is None else _secs(init):>9} "
            f"{_secs(busy):>9} {_secs(s.producer_wait_s.get(i, 0.0)):>9} {share:>5}"
        )
    if s.slowest:
        lines.append("slowest:")
        lines.extend(f"  {k}. {e}" for k, e in enumerate(s.slowest, 1))
    lines.append(f"bottleneck: {s.bottleneck()}")
    return "\n".join(lines)


def started(workers: Any, which: str) -> dict[int, float]:
    """A transport's start-up figures by producer: ``"start_s"``, seconds from its process's
    start until ready, or ``"init_s"``, of its ``producer_init``; empty where the transport
    does not measure them."""
    return dict(getattr(workers, which, {}))
