"""The input side's sending steps agree: a batch the pool's caller sends itself
(``InputSide.send_direct``, whose common case runs ``encode`` and ``send_pending`` inline,
a frame less each at every round trip of a request/response loop) leaves the call's books
exactly as those two methods leave them, when the producers take it and when they are full.
Nothing here runs a process: the transport records what it is given."""

from __future__ import annotations

from typing import Any

import pytest
from easycore._engine import wire
from easycore._engine.host import Learned, StreamSettings
from easycore._engine.input_side import InputSide
from easycore._engine.stats import RunnerStats
from easycore.errors import QueueFull


class _Transport:
    """What the input side sends through: records each batch; ``full`` refuses them."""

    out_budget = 64 << 20

    def __init__(self, full: bool) -> None:
        self.full = full
        self.sent: list[tuple[int, int, list[Any]]] = []

    def send(self, seq: int, kind: int, parts: list[Any]) -> None:
        if self.full:
            raise QueueFull("the producers have enough")
        self.sent.append((seq, kind, parts))

    def wake(self, call: int) -> None:
        pass


class _FailsOnce(wire.Codec):
    """A codec whose first ``dumps`` fails: ``send_direct`` then takes its common way
    (``encode``, which asks ``keep_sendable`` and pickles again, and ``send_pending``)."""

    failed = False

    def dumps(self, obj: Any) -> list[Any]:
        if not self.failed:
            self.failed = True
            raise TypeError("not this time")
        return super().dumps(obj)


def _side(codec: wire.Codec, full: bool) -> InputSide:
    settings = StreamSettings(
        ordered=False, window=100, window_floor=100, devices=("cpu", "cpu"), codec=wire.Codec
    )
    return InputSide(
        [1, 2, 3],
        _Transport(full),  # type: ignore[arg-type]
        codec,
        7,
        settings,
        Learned(),
        RunnerStats(),
        lambda items, first, e: items,
    )


def _books(side: InputSide) -> dict[str, Any]:
    return {
        "next_batch": side.next_batch,
        "next_item": side.next_item,
        "dispatched": side.dispatched,
        "direct_total": side.direct_total,
        "in_full": side.in_full,
        "pending": side.pending,
        "batches": side.stats.batches,
        "bytes_in": side.stats.bytes_in,
        "bytes_per_item": side.sizing.bytes_per_item,
        "packed_counts": side.packed_counts,
        "sent": side.workers.sent,  # type: ignore[attr-defined]
    }


@pytest.mark.parametrize("full", [False, True])
def test_a_batch_sent_by_the_caller_keeps_the_books_as_encode_and_send_pending_do(full):
    item = (3, 41, b"fn", [5], 0)  # a pool's work item, as a caller reads it
    inline, common = _side(wire.Codec(), full), _side(_FailsOnce(), full)
    for side in (inline, common):
        side.next_item, side.next_batch = 41, 9  # a call under way
        assert side.send_direct([item], now=True)
    assert isinstance(common.codec, _FailsOnce) and common.codec.failed  # the common way
    assert _books(inline) == _books(common)
    assert (inline.pending is not None) == full
    assert len(inline.workers.sent) == (0 if full else 1)  # type: ignore[attr-defined]


def test_large_bytes_items_travel_out_of_band_once_their_size_is_known():
    # Pickle copies a bytes object into the pickle (its C fast path asks no reducer): a
    # batch of 1 MiB bytes items was one fresh 3 MiB allocation, which a runner's input
    # thread mapped and faulted in anew for every batch (2 GB/s). Once a call's items are
    # known to be large, its bytes items leave the pickle and arrive as bytes.
    big = [bytes([i]) * (1 << 20) for i in range(4)]
    settings = StreamSettings(
        ordered=False, window=100, window_floor=100, devices=("cpu", "cpu"), codec=wire.Codec
    )
    side = InputSide(
        big + [b"small", 7],
        _Transport(False),  # type: ignore[arg-type]
        wire.Codec(),
        7,
        settings,
        Learned(cost_per_item=1e-6),
        RunnerStats(),
        lambda items, first, e: items,
    )
    first = side.make_batch()  # a call's first batch: one item, its size not known yet
    assert first is not None and first[1] == 1 and len(first[2]) == 1  # in the pickle
    batches = []
    while (batch := side.make_batch()) is not None:
        batches.append(batch)
    got: list[Any] = []
    for _seq, _count, parts in [first, *batches]:
        got += wire.Codec().loads(parts)[1]
    assert got == [*big, b"small", 7] and all(type(x) is bytes for x in got[:5])
    assert [len(b[2]) for b in batches][:1] == [4]  # three bytes items apart, one pickle
