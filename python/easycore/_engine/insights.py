"""Insights beyond the totals of ``runner.stats``: the slowest items of a call (kept in
each producer, merged in the caller) and a readable summary of a :class:`RunnerStats`.

The slowest are timed per item of ``producer_work``, as mpire times each task: a runner's
input item, or a pool's work item (a submitted task, or a chunk of a call's items as
``multiprocessing.Pool`` counts tasks), at the cost of one clock read and one comparison per
item in the producer (about 0.1 µs). Where that would be a large share of an item's time
(the producer's last batch took under :data:`TIME_EACH_S` an item, and this batch holds more
than a few items), the batch is timed as a whole instead: an entry of ``count`` items. An
item (or batch) that enters the producer's top ``SLOWEST`` of the call is sent with its
batch's results (a few dozen bytes) and merged in the caller.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ``stats``: a ``RunnerStats`` (stats.py imports this module).
RunnerStats = Any

SLOWEST = 5  # how many of the slowest items a call keeps
# Items that took at least this long on average (in the producer's last batch) are timed
# each; cheaper ones in a batch as a whole (a clock read an item would cost them up to 40 %).
TIME_EACH_S = 5e-6


@dataclass(frozen=True)
class SlowTask:
    """One of the slowest items of a call (``RunnerStats.slowest``).

    Attributes:
        seconds: how long ``producer_work`` ran on it.
        producer: the producer that ran it (its position in ``devices``).
        item: its index in the call (the pool: its place in the stream; ``label`` says what
            it was).
        count: 1: an item's own time (a pool's ``label`` names the input items of a
            chunk); more: a batch of that many items that take microseconds each, timed as
            a whole (see the module).
        label: what it was, said by the runner (the pool: ``"call 3, item 17"``,
            ``"call 3, items 16..31"`` for a chunk, ``"task (call 5)"``), or None.
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


# In a producer: the runner's label for one item (see describe_items_with), or None.
_DESCRIBE: list[Callable[[Any], str | None] | None] = [None]


def describe_items_with(describe: Callable[[Any], str | None] | None) -> None:
    """In a producer (its set-up): ``describe(item)`` labels each slow item of this process
    (the pool names the call and items of a chunk, or the task); None: no label."""
    _DESCRIBE[0] = describe


class SlowItems:
    """A producer's slowest items of the call being run. The producer asks :meth:`floor` once
    per batch, times each item, and calls :meth:`note` for an item that took longer than the
    floor; :meth:`take` hands what entered the top ``SLOWEST`` since the last batch to the
    caller (None if nothing)."""

    def __init__(self) -> None:
        self.call = 0
        self.heap: list[float] = []  # the call's slowest durations so far (a min-heap)
        self.pending: list[tuple[float, int, int, str | None]] = []  # sent with the results

    def floor(self, call: int) -> float:
        """The time an item of ``call`` must exceed to enter the top (-1: any item does)."""
        if call != self.call:
            self.call = call
            self.heap.clear()
            self.pending.clear()  # a failed batch's, of an earlier call
        heap = self.heap
        return heap[0] if len(heap) >= SLOWEST else -1.0

    def note(self, seconds: float, index: int, item: Any, count: int = 1) -> float:
        """Item ``index`` (``item``, for its label) took ``seconds``, more than the floor:
        keeps it to send; returns the new floor. ``count`` > 1: a batch of items timed as a
        whole, from ``index`` (``item`` its first)."""
        heap = self.heap
        if len(heap) < SLOWEST:
            heapq.heappush(heap, seconds)
        else:
            heapq.heapreplace(heap, seconds)
        label = None
        describe = _DESCRIBE[0]
        if describe is not None:
            try:
                label = describe(item)
            except Exception:  # noqa: BLE001 - a label is a nicety, never an error
                label = None
            if label is not None and count > 1:
                label += f" and {count - 1} more"
        self.pending.append((seconds, index, count, label))
        return heap[0] if len(heap) >= SLOWEST else -1.0

    def take(self) -> list[tuple[float, int, int, str | None]] | None:
        """What entered the top since the last call of :meth:`take` (None: nothing)."""
        pending = self.pending
        if not pending:
            return None
        self.pending = []
        return pending


def merge_slow(stats: RunnerStats, producer: int, slow: Any) -> None:
    """Adds a producer's slow items (what :meth:`SlowItems.take` returned) to the call's
    ``stats.slowest`` (kept sorted, slowest first, at most ``SLOWEST``)."""
    slowest = stats.slowest
    for seconds, index, count, label in slow:
        entry = SlowTask(float(seconds), producer, int(index), int(count), label)
        if len(slowest) >= SLOWEST and entry.seconds <= slowest[-1].seconds:
            continue
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
    """A table of the figures, per producer, then the slowest items and the bottleneck
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
