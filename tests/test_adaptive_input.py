"""Adaptive input reading: a request/response input (item i+1 exists only after result i)
is read by the receiving thread itself, while inputs that run ahead keep their batching.

Every verdict counts (``runner.stats.direct_items``, ``runner.stats.batches``); nothing is
timed. Each feedback input waits on its results with a timeout of its own, so a regression
fails instead of hanging.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest
import runner_defs as rd

pytestmark = pytest.mark.timeout(120)

N = 400


def _feedback(n: int, got: queue.Queue[int]) -> Iterator[int]:
    """Yields item i+1 only after result i came back."""
    x = 0
    for _ in range(n):
        yield x
        x = got.get(timeout=20) + 1  # raises queue.Empty instead of hanging


@pytest.mark.parametrize("runner_cls", [rd.Collect, rd.CollectUnordered])
def test_feedback_input_through_imap_is_read_directly(runner_cls):
    got: queue.Queue[int] = queue.Queue()
    with runner_cls(devices=2, start_method="fork") as r:
        out = []
        for y in r.imap(_feedback(N, got)):
            out.append(y)
            got.put(y)
        assert out == list(range(N))
        # Handed over after a few items; taken back now and then (a probe), so not all.
        assert r.stats.direct_items > 0
        assert r.stats.items == N


def test_feedback_input_through_hooks_is_read_directly():
    got: queue.Queue[int] = queue.Queue()
    names: list[str] = []

    Feedback = rd.feeding(got)

    def gen() -> Iterator[int]:
        for x in _feedback(N, got):
            names.append(threading.current_thread().name)
            yield x

    with Feedback(devices=2, start_method="fork") as r:
        assert r(gen()) == list(range(N))
        assert r.stats.direct_items > 0
        assert r.stats.direct_items == names.count("easycore-consumer")
        assert "easycore-input" in names  # it began in the input thread


def test_a_result_already_there_after_a_direct_read_is_taken_without_a_sleep(
    sleeps_after_results_came,
):
    # Where the producer shares the receiving thread's core, it runs while that thread sends
    # a direct read's item, and the result waits when the thread looks: it took it only
    # after saying it would sleep (receiver_sleeps, a few tenths of a microsecond of a
    # round trip).
    slept = sleeps_after_results_came("read_and_send")
    got: queue.Queue[int] = queue.Queue()
    with rd.Collect(devices=2, start_method="fork") as r:
        out = []
        for y in r.imap(_feedback(N // 4, got)):
            out.append(y)
            got.put(y)
        assert out == list(range(N // 4))
        assert r.stats.direct_items > 0
        assert slept[0] == 0  # one each before


@pytest.mark.parametrize("read_ahead", [None, True])
def test_inputs_that_run_ahead_keep_their_batching(read_ahead):
    n = 20_000
    with rd.CollectUnordered(devices=2, start_method="fork") as r:
        assert len(r(range(n))) == n  # learn that items are cheap
        assert r.stats.batches < n // 10  # a range is sliced in batches
        assert sorted(r(iter(range(n)), read_ahead=read_ahead)) == list(range(n))
        # Mostly batched: a loaded machine may still let the receiving thread take the input
        # for a probe interval now and then, hence the room (all direct would be n of each).
        assert r.stats.batches < n // 4
        assert r.stats.direct_items < n // 4


def test_read_ahead_true_never_reads_directly():
    got: queue.Queue[int] = queue.Queue()
    with rd.Collect(devices=2, start_method="fork") as r:
        out = []
        for y in r.imap(_feedback(N, got), read_ahead=True):
            out.append(y)
            got.put(y)
        assert out == list(range(N))
        assert r.stats.direct_items == 0


def test_read_ahead_false_reads_every_item_directly():
    got: queue.Queue[int] = queue.Queue()
    with rd.Collect(devices=2, start_method="fork") as r:
        out = []
        for y in r.imap(_feedback(N, got), read_ahead=False):
            out.append(y)
            got.put(y)
        assert out == list(range(N))
        assert r.stats.direct_items == N


def test_an_input_that_turns_from_feedback_to_fast_is_taken_back():
    """The first items come one per result, then the input runs ahead: the input thread takes
    it back (its probe) and batches the rest."""
    got: queue.Queue[int] = queue.Queue()
    slow, fast = 100, 50_000

    def gen() -> Iterator[int]:
        yield from _feedback(slow, got)
        yield from range(slow, slow + fast)

    with rd.CollectUnordered(devices=2, start_method="fork") as r:
        assert len(r(range(20_000))) == 20_000  # learn that items are cheap
        out = []
        for y in r.imap(gen()):
            out.append(y)
            if y < slow:
                got.put(y)
        assert sorted(out) == list(range(slow + fast))
        # Once the input runs ahead, the input thread takes it back and most of the fast part
        # travels in batches. How many items go one at a time before that depends on the
        # scheduling (on a loaded machine the receiving thread may take the input again for
        # a probe interval or a few), so the bounds leave room for it: without the hand-back
        # every one of the 50,100 items would be a direct read and a batch of its own.
        assert r.stats.direct_items < fast // 2
        assert r.stats.batches < fast // 2


def test_probe_intervals_grow_while_fast_and_aim_at_their_span():
    """A probe interval doubles while the loop is fast, past any count (a fast loop is probed
    a bounded share of its time however long it runs), settles at the span's items, and
    shrinks to them at once when the loop slowed, never below the first interval."""
    from easycore._engine.probes import PROBE_FIRST, PROBE_SPAN_S, next_probe_at

    assert next_probe_at(PROBE_FIRST, 0.0) == 2 * PROBE_FIRST
    assert next_probe_at(1 << 20, PROBE_SPAN_S / 10) == 1 << 21  # no cap in items
    assert next_probe_at(1000, PROBE_SPAN_S) == 1000  # at the span: kept
    assert next_probe_at(1000, 0.75 * PROBE_SPAN_S) == 1333  # near it: grows to it
    assert next_probe_at(4000, 4 * PROBE_SPAN_S) == 1000  # slowed: shrinks to the span
    assert next_probe_at(4000, 1000.0) == PROBE_FIRST  # items of seconds: the first interval


@pytest.mark.parametrize("form", ["hooks", "imap"])
def test_each_probe_comes_after_the_interval_the_schedule_gives(probes_asked, form):
    """The receiving thread hands the input back after exactly the interval the schedule
    (``probes.next_probe_at``) gave, with that interval's items and its time: a schedule that
    keeps the first interval (as for a slow loop) gets a probe every ``PROBE_FIRST`` items."""
    from easycore._engine.probes import PROBE_FIRST

    asked = probes_asked
    got: queue.Queue[int] = queue.Queue()

    Feedback = rd.feeding(got)

    with Feedback(devices=2, start_method="fork") as r:
        if form == "hooks":
            assert r(_feedback(N, got)) == list(range(N))
        else:
            out = []
            for y in r.imap(_feedback(N, got)):
                out.append(y)
                got.put(y)
            assert out == list(range(N))
        # Each probe ends an interval of PROBE_FIRST direct reads (the first one's too), and
        # the input goes back and forth: several probes in N items (one in 16 + a few).
        assert len(asked) >= 3
        assert all(items == PROBE_FIRST and seconds >= 0 for items, seconds in asked)
        assert r.stats.direct_items >= PROBE_FIRST * len(asked)


def test_a_call_that_follows_a_request_response_call_starts_with_its_input(monkeypatch):
    """The runner's habit: a call that follows one whose receiving thread read its input
    starts with its own in the receiving thread's hands, with its predecessor's probe
    interval (at most PROBE_INHERITED_MAX, the time bound aside); a list call leaves the
    habit as it is."""
    import easycore._engine.input_side as input_side
    import easycore._engine.probes as probes
    from easycore._engine.probes import PROBE_FIRST, PROBE_INHERITED_MAX

    starts: list[tuple[bool, bool, int]] = []  # (adaptive, direct, probe_at) of each call
    init = input_side.InputSide.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        starts.append((self.adaptive, self.direct, self.probe_at))

    monkeypatch.setattr(input_side.InputSide, "__init__", recording)
    monkeypatch.setattr(probes, "PROBE_INHERITED_S", 0.0)  # (its count bound alone)
    got: queue.Queue[int] = queue.Queue()

    Feedback = rd.feeding(got)

    with Feedback(devices=2, start_method="fork") as r:
        assert r(_feedback(N, got)) == list(range(N))
        assert r.stats.direct_items > 0
        assert r(list(range(10))) == list(range(10))
        while not got.empty():
            got.get()  # (that call's results: not feedback)
        assert r(_feedback(N, got)) == list(range(N))
    assert starts[0] == (True, False, PROBE_FIRST)
    assert starts[1][0] is False  # a list: not read adaptively
    adaptive, direct, probe_at = starts[2]
    assert adaptive and direct
    assert PROBE_FIRST <= probe_at <= PROBE_INHERITED_MAX


def test_a_call_on_the_habit_starts_in_the_receiving_thread(tmp_path):
    """The runner's habit: after a request/response call, the next call's receiving thread
    reads its input from its first item (its input thread starts only if it hands the input
    back); an input that then runs ahead with slow items is handed back while the receiving
    thread waits on one (its trial), and its items run side by side (each waits for the
    other: one at a time, the first would wait in vain)."""
    got: queue.Queue[int] = queue.Queue()
    names: list[str] = []

    def gen(n: int) -> Iterator[int]:
        for x in _feedback(n, got):
            names.append(threading.current_thread().name)
            yield x

    def drain() -> None:
        while not got.empty():
            got.get()  # (the last result of a call: its input never asks for it)

    with rd.feeding(got, pairs=True)(devices=2, start_method="fork") as r:
        assert r(gen(N)) == list(range(N))
        assert r.stats.direct_items > 0  # (the habit: the input was handed over)
        assert names[0] == "easycore-input"
        for _ in range(3):
            drain()
            names.clear()
            assert r(gen(50)) == list(range(50))
            assert names[0] == "easycore-consumer"
        drain()
        a, b = str(tmp_path / "a"), str(tmp_path / "b")
        assert r(iter([(a, b), (b, a)])) == [True, True]
        # An input that runs ahead from the start of a call on the habit ends the habit:
        # the next call's input is read by the input thread from its first item.
        for _ in range(2):
            drain()
            assert r(_feedback(N, got)) == list(range(N))  # (the habit again)
            drain()
            assert r(iter(range(3000))) == list(range(3000))
            assert r.stats.direct_items > 0  # (that call's: it started in the receiving thread)
            drain()
            names.clear()
            assert r(gen(50)) == list(range(50))
            assert names[0] == "easycore-input"


def test_a_call_whose_input_ran_ahead_ends_the_habit():
    """How a call leaves the runner's habit (``InputSide.leave_habit``): its next interval
    where its receiving thread read the input, none where the input ran ahead, untouched
    where it could not tell (or the call was not read adaptively)."""
    from types import SimpleNamespace

    from easycore._engine.input_side import InputSide
    from easycore._engine.probes import PROBE_INHERITED_MAX, PROBE_INHERITED_S

    def left(habit: int, **kw) -> int:
        fields = {
            "adaptive": True,
            "handed_over": False,
            "took_several": False,
            "probe_at": 64,
            "probe_pace": 0.0,
        }
        side = SimpleNamespace(**{**fields, **kw})
        side.learned = SimpleNamespace(probe_habit=habit)
        InputSide.leave_habit(side)  # type: ignore[arg-type]
        return side.learned.probe_habit

    assert left(0, handed_over=True) == 64
    assert left(32, handed_over=True, took_several=True) == 0  # (it ran ahead at the end)
    assert left(32, took_several=True) == 0
    assert left(32) == 32  # too short to tell
    assert left(0, handed_over=True, probe_at=1 << 20) == PROBE_INHERITED_MAX
    assert left(32, adaptive=False, handed_over=True) == 32
    # A fast loop inherits up to PROBE_INHERITED_S of its pace (a loop of 20 µs round trips:
    # 1,250 items, where 256 made calls of 3,000 items probe three times each); a slow one
    # at most PROBE_INHERITED_MAX items still.
    fast = 20e-6
    assert left(0, handed_over=True, probe_at=1 << 20, probe_pace=fast) == int(
        PROBE_INHERITED_S / fast
    )
    assert left(0, handed_over=True, probe_at=1000, probe_pace=fast) == 1000
    assert left(0, handed_over=True, probe_at=1 << 20, probe_pace=1e-3) == PROBE_INHERITED_MAX


def test_no_wait_counts_before_a_result_came():
    """At a call's start (nothing delivered yet) the receiving thread's waits do not count
    towards asking for the input, even one wait from asking (as after a probe): the input
    may not have been read at all, and a fast one would be taken over. The first wait with
    nothing in flight after a result does."""
    from types import SimpleNamespace

    from easycore._engine.input_side import InputSide
    from easycore._engine.probes import DIRECT_AFTER

    side = SimpleNamespace(
        dispatched=0,
        delivered=0,
        reader_done=False,
        awaiting_reader=False,
        pending=None,
        urgent=False,
        unsent=lambda: 0,
        starved=DIRECT_AFTER - 1,
        took_several=False,
        want_direct=False,
        cut_bulk=lambda: None,
    )
    for _ in range(9):
        InputSide.note_starved(side)  # type: ignore[arg-type]
    assert side.starved == DIRECT_AFTER - 1 and not side.want_direct
    side.dispatched = side.delivered = 1
    InputSide.note_starved(side)  # type: ignore[arg-type]
    assert side.want_direct


def test_input_errors_and_ends_in_the_direct_path():
    got: queue.Queue[int] = queue.Queue()

    def bad() -> Iterator[int]:
        yield from _feedback(50, got)
        raise ValueError("input broke")

    with rd.Collect(devices=2, start_method="fork") as r:
        with pytest.raises(ValueError, match="input broke"):
            for y in r.imap(bad()):
                got.put(y)
        while not got.empty():
            got.get()
        out = []
        for y in r.imap(_feedback(30, got)):  # the runner stays usable
            out.append(y)
            got.put(y)
        assert out == list(range(30))
        assert r(iter([])) == []


def test_consumer_error_names_its_item_inside_a_large_batch():
    """The consumer loop keeps no per-item index: the failing item is still named exactly
    when it sits deep inside a batch of many results."""
    from easycore.errors import WorkerError

    class FailsLate(rd.Collect):
        @staticmethod
        def consumer_work(cfg, data):
            if data == 15_003:
                raise KeyError("consumer broke")
            cfg.out.append(data)

    with FailsLate(devices=1, start_method="fork") as r:
        assert len(r(range(10_000))) == 10_000  # learn that items are cheap: big batches
        with pytest.raises(WorkerError) as ei:
            r(range(20_000))
        assert ei.value.hook == "consumer_work" and ei.value.item == 15_003
        assert r.stats.batches < 20_000 // 10  # it was inside a batch of many


class Payload:
    """An input item whose lifetime the test follows (weak references)."""

    def __init__(self, i: int) -> None:
        self.i = i


class PayloadIndex(rd.Collect):
    @staticmethod
    def producer_work(device, cfg, data):
        return data.i


def test_items_read_directly_are_not_kept_alive():
    """Items sent are dropped from the call's buffer as the receiving thread reads on: a
    long request/response loop does not hold every input it sent (large inputs would
    pile up until the input thread takes the input back)."""
    import gc
    import weakref

    got: queue.Queue[int] = queue.Queue()
    alive: weakref.WeakSet[Payload] = weakref.WeakSet()
    most = 0

    def gen() -> Iterator[Payload]:
        nonlocal most
        for i in _feedback(N, got):
            gc.collect()
            most = max(most, len(alive)) if i > 100 else most
            p = Payload(i)
            alive.add(p)
            yield p

    with PayloadIndex(devices=1, start_method="fork") as r:
        out = []
        for y in r.imap(gen()):
            out.append(y)
            got.put(y)
        assert out == list(range(N))
        assert r.stats.direct_items > 100
        assert most <= 8  # the item in flight and a few on their way, not hundreds


@pytest.mark.parametrize(
    ("result_bytes", "expected"),
    [
        (8, 10_000),  # tiny results: the window as set
        (1 << 20, 48),  # 1 MiB: about 48 MiB in flight, not the whole 192 MiB budget
        (16 << 20, 6),  # 16 MiB: three per producer (the budget would allow 12)
        (64 << 20, 3),  # 64 MiB: the budget again
    ],
)
def test_large_results_keep_about_a_cache_in_flight(result_bytes, expected):
    from types import SimpleNamespace

    from easycore._engine.batching import Sizing

    call = SimpleNamespace(
        window=10_000,
        window_floor=10_000,
        n=2,
        bytes_per_item=0.0,
        learned=SimpleNamespace(out_bytes_per_item=float(result_bytes)),
        max_inflight_bytes=192 << 20,
        batch_size=lambda: 1,
        out_q=None,  # no output pool here: test_result_segments.py has one
    )
    assert Sizing.window_now(call) == expected  # type: ignore[arg-type]


def test_consumer_error_while_the_input_is_handed_over():
    """consumer_work fails while the receiving thread reads the input: the call fails with
    the hook's error, the parked input thread ends, and the runner stays usable."""
    from easycore.errors import WorkerError

    got: queue.Queue[int] = queue.Queue()

    class FailsInLoop(rd.Collect):
        @staticmethod
        def consumer_work(cfg, data):
            if data == 200:
                raise KeyError("consumer broke")
            cfg.out.append(data)
            got.put(data)

    with FailsInLoop(devices=2, start_method="fork") as r:
        with pytest.raises(WorkerError) as ei:
            r(_feedback(N, got))
        assert ei.value.hook == "consumer_work" and ei.value.item == 200
        assert r.stats.direct_items > 0  # it failed on the direct path
        for t in threading.enumerate():
            if t.name == "easycore-input":
                t.join(10)  # a hard bound, not a timing assertion
        assert [t for t in threading.enumerate() if t.name == "easycore-input"] == []
        while not got.empty():
            got.get()
        assert r(_feedback(50, got)) == list(range(50))
