"""The input read in runs (easycore.common.parallel.runs): what a runner's input thread and
the pool's feed pull in with one ``list.extend`` each."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from easycore.common.parallel.runs import IteratorRuns, after_first, gated


def test_runs_read_at_most_their_limit_and_end_with_the_input() -> None:
    runs = IteratorRuns(iter(range(10)))
    got: list[int] = []
    sizes = []
    last: int | None = None
    while (run := runs.next_run(4, last)) is not None:
        before = len(got)
        got.extend(run)
        last = len(got) - before
        sizes.append(last)
    assert got == list(range(10))
    assert sizes == [4, 4, 2]
    assert runs.next_run(4, None) is None  # over for good


def test_an_input_of_exactly_whole_runs_ends_with_an_empty_run() -> None:
    runs = IteratorRuns(iter(range(8)))
    assert list(runs.next_run(4, None) or ()) == [0, 1, 2, 3]
    assert list(runs.next_run(4, 4) or ()) == [4, 5, 6, 7]
    last = runs.next_run(4, 4)
    assert last is not None and list(last) == []
    assert runs.next_run(4, 0) is None


def test_a_cut_run_ends_after_the_item_read_and_loses_nothing() -> None:
    runs = IteratorRuns(iter(range(10)))
    run = runs.next_run(6, None)
    assert run is not None
    assert [next(run), next(run)] == [0, 1]
    runs.cut()
    assert list(run) == []  # ends at once: item 2 was never taken from the input
    rest = runs.next_run(6, 2)  # cut, not ended: reading goes on where it stopped
    assert rest is not None and list(rest) == [2, 3, 4, 5, 6, 7]
    tail = runs.next_run(6, 6)
    assert tail is not None and list(tail) == [8, 9]
    assert runs.next_run(6, 2) is None


def test_a_cut_from_another_thread_ends_an_extend_blocked_on_the_input() -> None:
    # A feedback input: the item after 0 exists only once the consumer asked for it. The
    # reader's extend blocks inside the input; a cut (from the receiving thread) then lets
    # it return after the item being read, with every item read so far in the buffer.
    release = threading.Event()
    reading = threading.Event()

    def feedback() -> Iterator[int]:
        yield 0
        reading.set()
        assert release.wait(30), "the test did not release the input"
        yield 1
        yield 2

    runs = IteratorRuns(feedback())
    buf: list[int] = []
    run = runs.next_run(100, None)
    assert run is not None
    reader = threading.Thread(target=buf.extend, args=(run,))
    reader.start()
    assert reading.wait(30)
    runs.cut()  # while the extend waits inside the input for item 1
    release.set()
    reader.join(30)
    assert not reader.is_alive()
    assert buf == [0, 1]  # item 1 (being read at the cut) kept, item 2 not taken
    more = runs.next_run(100, len(buf))
    assert more is not None and list(more) == [2]


def test_gated_never_takes_an_item_past_an_emptied_gate() -> None:
    it = iter(range(5))
    run, gate = gated(it, 5)
    assert next(run) == 0
    del gate[:]
    assert list(run) == []
    assert next(it) == 1  # still in the input


def test_an_input_error_fails_the_call() -> None:
    runs = IteratorRuns(iter(()))
    assert runs.recover(ValueError("bad input"), 0) is None


def test_after_first_says_when_the_first_item_was_read_and_changes_nothing_else():
    calls: list[int] = []
    run, gate = gated(iter(range(10)), 5)
    out: list[int] = []
    wrapped = after_first(run, lambda: calls.append(len(out)))
    out.extend(wrapped)
    assert out == [0, 1, 2, 3, 4] and calls == [0]  # called as the first item came
    run, gate = gated(iter(range(10)), 5)
    wrapped = after_first(run, lambda: calls.append(-1))
    assert next(wrapped) == 0
    del gate[:]  # a cut still ends the run after the item being read
    assert list(wrapped) == [] and calls == [0, -1]
    ended: list[int] = []
    assert list(after_first(iter([]), lambda: ended.append(1))) == [] and ended == []

    def broken():
        raise ValueError("input broke")
        yield  # pragma: no cover

    with pytest.raises(ValueError):
        next(after_first(broken(), lambda: ended.append(1)))
    assert ended == []
