"""How large a call's batches are and how many items it keeps in flight
(:class:`Sizing`), from what its runner learned (producer seconds and result bytes per
item) and what the call saw (input bytes per item)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from easycore._engine import leases
from easycore._engine.host import Learned, StreamSettings

_TARGET_BATCH_S = 0.004  # producer work per message the batching aims at
# Batches of large items stop growing at this many bytes of input or results (3 results of
# 1 MiB, a pickle header each above a third): a message costs the receiving thread and the
# producer tens of microseconds of Python, which 1 MiB results then share (at 1 MiB a batch,
# runner.imap's caller spent 80 µs a result, at 4 MiB 50; slow-wake VM, performance.md).
# Larger messages take as large a pooled segment each, which the whole message holds until
# its last result is dropped: the pool's chunks of results stop here too.
MAX_BATCH_BYTES = 4 << 20


class Sizing:
    """Batch size and window of one call.

    Args:
        settings: the runner's window, window floor and producers.
        learned: the runner's learned figures (read here, written by the stream).
        cost: gives the producers' seconds per item instead of ``learned`` (the pool's
            stream: see :class:`~easycore._engine.stream.Call`), or None.
        max_inflight_bytes: the most bytes of results in flight.
        out_q: the output queue, whose pool of segments large results are written in
            (None: no such pool, as with Ray's transport).
    """

    def __init__(
        self,
        settings: StreamSettings,
        learned: Learned,
        cost: Callable[[], float] | None,
        max_inflight_bytes: int,
        out_q: Any = None,
    ) -> None:
        self.window = settings.window
        self.window_floor = settings.window_floor
        self.n = len(settings.devices)
        self.max_batch = max(1, self.window // (4 * self.n))
        self.learned = learned
        self.cost = cost
        self.max_inflight_bytes = max_inflight_bytes
        self.out_q = out_q
        self.bytes_per_item = 0.0  # pickled input per item (last batch; the sender's)

    def cost_now(self) -> float:
        """Producer seconds per item that batches are sized by (0: not known yet)."""
        return self.learned.cost_per_item if self.cost is None else self.cost()

    def sized(self) -> bool:
        """Whether the sizes of items or results, and their cost, are known: the window
        (:meth:`window_now`) and the batches (:meth:`batch_size`) then count them."""
        known = self.bytes_per_item > 0 or self.learned.out_bytes_per_item > 0
        return known and self.cost_now() > 0

    def batch_size(self) -> int:
        """Items per batch: about 4 ms of producer work, within the byte bound and
        ``max_batch``; 1 while the cost is not known, and for a call's first batch (its
        items' size is known once one is pickled: a runner that had learned that its items
        cost a microsecond sent a call's first 256 arguments of 1 MiB as one batch, one
        message of 256 MiB, which one producer took, at a twentieth of the speed)."""
        # Once per batch and per result message: conditionals, not min/max calls.
        cost = self.learned.cost_per_item if self.cost is None else self.cost()  # (cost_now)
        if cost <= 0:
            return 1
        a, b = self.bytes_per_item, self.learned.out_bytes_per_item
        if a <= 0:
            return 1
        bs = int(_TARGET_BATCH_S / cost)
        largest = a if a > b else b
        if largest > 0:
            by_bytes = int(MAX_BATCH_BYTES / largest)
            if by_bytes < bs:
                bs = by_bytes
        if bs > self.max_batch:
            bs = self.max_batch
        return bs if bs > 1 else 1

    def window_now(self) -> int:
        """Items allowed in flight: ``window``; with the runner's default window, only as
        many as keep four batches per producer in flight (at least the floor: more only once
        items are known to be cheap, so a slow input is not read far ahead); fewer when
        items or results are large (the items read ahead wait in this process's memory)."""
        window = self.window
        if self.window_floor < window:
            window = min(window, max(self.window_floor, 4 * self.n * self.batch_size()))
        largest = max(self.bytes_per_item, self.learned.out_bytes_per_item)
        if largest <= 0:
            return window
        by_bytes = int(self.max_inflight_bytes / largest)
        # Large items: about a cache's worth in flight, not the whole budget (at least a few
        # per producer): the segments they travel in are then written and read while still
        # cached. With the whole budget in flight, 1 MiB results took 191 MiB of segments
        # in turn and came 1.5x slower (2-core VM, 32 MiB L3).
        cached = leases.results_ahead(largest, self.n)
        # And no more than the output pool has segments for: a result that finds the pool
        # full is built in private memory and copied (see leases.results_in_flight).
        pooled = leases.results_in_flight(self.out_q, int(largest), self.n) or window
        return max(1, min(window, by_bytes, cached, pooled))

    def pooled_results(self, nbytes: float) -> int | None:
        """How many results of ``nbytes`` the output pool has segments for, held anywhere
        between their producer and their consumer (None: no bound, see
        :func:`~easycore._engine.leases.results_in_flight`)."""
        return leases.results_in_flight(self.out_q, int(nbytes), self.n)
