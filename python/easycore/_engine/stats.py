"""What a runner's last call moved and where its time went (``runner.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from easycore._engine.insights import SlowTask, summary

LARGE_RESULT_BYTES = 64 << 10
"""Results of at least this many bytes each (on average) are large for
:meth:`RunnerStats.bottleneck`: their transfer, not the runner's cost per item, may set the
pace."""


@dataclass
class RunnerStats:
    """What the last call moved and where the time went (also for a call that stopped
    early: an abandoned ``imap``, an error).

    Attributes:
        items: items delivered.
        batches: messages (batches of items) sent to the producers.
        bytes_in: payload bytes sent to the producers (pickles and buffers).
        bytes_out: payload bytes received from the producers.
        wall_s: duration of the call.
        producer_busy_s: per producer (by position in ``devices``), seconds spent in
            ``producer_work`` during the call.
        producer_wait_s: per producer, seconds blocked on the queues during the call
            (waiting for input or for room for results).
        producer_items: per producer, items it ran during the call (in a pool, a task and
            a chunk of a range, list or tuple count one each; an iterator's items count one
            each).
        dispatch_wait_s: seconds the sender waited for room in the input queue.
        consumer_wait_s: seconds the receiving thread waited for results.
        consumer_busy_s: seconds spent in ``consumer_work`` (0 for ``imap``).
        input_wait_s: seconds nothing was in flight while the receiving thread waited for
            the input iterable to yield (the input was the bottleneck then).
        direct_items: input items read one at a time with nothing in flight by the thread
            that waits for their results (a runner's receiving thread, a pool's caller)
            rather than through the input thread (``read_ahead=False``, or a
            request/response input that the input thread handed over).
        producer_start_s: per producer, seconds from its process's start until it was
            ready (``producer_init`` done), when the producers last started (local processes
            and Ray actors).
        producer_init_s: per producer, seconds of its set-up and ``producer_init`` (the
            pool's ``initializer``), part of ``producer_start_s``.
        slowest: the call's slowest items, slowest first (at most 5): a
            :class:`~easycore._engine.insights.SlowTask` each, with its seconds (that
            item's own time in ``producer_work``), producer and item (a pool's: a
            submitted task or a chunk of a call, named by its label).
    """

    items: int = 0
    batches: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    wall_s: float = 0.0
    producer_busy_s: dict[int, float] = field(default_factory=dict)
    producer_wait_s: dict[int, float] = field(default_factory=dict)
    producer_items: dict[int, int] = field(default_factory=dict)
    dispatch_wait_s: float = 0.0
    consumer_wait_s: float = 0.0
    consumer_busy_s: float = 0.0
    input_wait_s: float = 0.0
    direct_items: int = 0
    producer_start_s: dict[int, float] = field(default_factory=dict)
    producer_init_s: dict[int, float] = field(default_factory=dict)
    slowest: list[SlowTask] = field(default_factory=list)

    def summary(self) -> str:
        """A readable table: per producer, items, start-up, init, time in tasks and
        waiting; then the slowest items and :meth:`bottleneck` (as mpire's insights)."""
        return summary(self)

    def bottleneck(self) -> str:
        """A one-line reading of the figures: who waited on whom."""
        busy = sum(self.producer_busy_s.values())
        n = max(1, len(self.producer_busy_s))
        if self.wall_s <= 0:
            return "nothing ran"
        util = busy / (n * self.wall_s)
        if util > 0.7:
            return f"producers ({util:.0%} busy): add devices or make producer_work cheaper"
        if self.consumer_busy_s > 0.5 * self.wall_s:
            return "the consumer: make consumer_work cheaper"
        if self.input_wait_s > 0.3 * self.wall_s:
            return (
                f"the input: the data iterable yields items slowly (nothing was in flight "
                f"for {self.input_wait_s / self.wall_s:.0%} of the call)"
            )
        if self.items and util < 0.5:
            per_result = self.bytes_out / self.items
            waited = sum(self.producer_wait_s.values()) / (n * self.wall_s)
            # Neither in producer_work nor waiting on the queues: the producers' own part of
            # the transfer. Only where waits are measured (local producers; Ray's actors
            # report none).
            own = 1.0 - util - waited
            if per_result >= LARGE_RESULT_BYTES and waited > 0 and own > max(util, waited):
                return (
                    f"sending the results: each is {per_result / (1 << 20):.2f} MiB, and the "
                    f"producers spend {own:.0%} of the call sending them (pickling, copying "
                    f"into shared memory) against {util:.0%} in producer_work; build them in "
                    "shared memory (easycore.shm.empty, easycore.torch.shm.empty) so that they "
                    "travel by reference, not copied"
                )
            per_item_us = 1e6 * busy / self.items
            return (
                f"per-item overhead: each item takes {per_item_us:.1f} µs of producer_work, "
                f"so the runner's own cost per item (pickling, queues, the receiving thread) "
                f"sets the pace and the producers are {util:.0%} busy; give each item more "
                "work (e.g. pass batches of items) to use them fully"
            )
        return f"balanced (producers {util:.0%} busy)"
