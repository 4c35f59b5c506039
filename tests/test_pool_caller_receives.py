"""The pool's one call, received in its caller's thread: while a ``map``/``imap`` call is all
the pool has to do and its caller waits for a result, the service thread parks and the
caller receives the stream's results itself (no hand-off through the service thread for each
message), and every pool semantics holds on that path: a task's future still completes in
the service thread, ordered errors keep their place, the input's end and a worker's death
reach a caller that waits on the stream.

Every verdict counts (which thread delivered each message's results, results, errors);
nothing is timed. A regression that loses a wake-up hangs, and the suite's time limit
fails it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import pool_defs as pd
import pytest
from easycore.parallel import Pool
from easycore.parallel import job as job_module
from easycore.parallel import turn as turn_module

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def deliverers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread that delivered each run of results to a call (``_Job.deliver``)."""
    names: list[str] = []
    deliver = job_module._Job.deliver

    def recorded(self: job_module._Job, index: int, ok: bool, value: object) -> None:
        names.append(threading.current_thread().name)
        deliver(self, index, ok, value)

    monkeypatch.setattr(job_module._Job, "deliver", recorded)
    return names


def _slowly(n: int) -> Iterator[int]:
    yield from range(n)


@pytest.mark.parametrize("how", ["imap_unordered", "imap", "map_list"])
def test_the_only_calls_results_are_received_in_its_callers_thread(deliverers, how):
    # Each item takes a few ms: the caller waits for every result, and the service thread,
    # finding it waiting with nothing else to do, leaves the stream to it. Before, the
    # service thread delivered every result.
    nap = functools.partial(pd.nap, seconds=0.002)
    with Pool(2) as p:
        if how == "imap_unordered":
            got = sorted(p.imap_unordered(nap, _slowly(300)))
        elif how == "imap":
            got = list(p.imap(nap, _slowly(300)))
        else:
            got = p.map(nap, list(range(300)), chunksize=1)
        assert got == list(range(300))
        assert threading.current_thread().name in deliverers
        assert set(deliverers) <= {threading.current_thread().name, "easycore-pool"}


def test_a_tasks_future_still_completes_in_the_service_thread(deliverers):
    # A task submitted while the caller receives: its result reaches the caller's receive,
    # which hands it to the service thread, where futures' callbacks always run.
    nap = functools.partial(pd.nap, seconds=0.002)
    ran_in: list[str] = []
    futs = []
    with Pool(2) as p:
        out = []
        for i, r in enumerate(p.imap(nap, _slowly(400))):
            out.append(r)
            if i % 100 == 50:
                fut = p.submit(pd.square, i)
                fut.add_done_callback(lambda f: ran_in.append(threading.current_thread().name))
                futs.append(fut)
        assert out == list(range(400))
        assert [f.result(timeout=60) for f in futs] == [i * i for i in range(50, 400, 100)]
    assert threading.current_thread().name in deliverers
    assert ran_in and set(ran_in) <= {"easycore-pool"}


@pytest.mark.parametrize("ordered", [True, False])
def test_an_error_waits_for_the_results_before_it_on_the_callers_receive(ordered):
    # An ordered call's error is raised only once the results before it were handed out: a
    # caller that receives must not take the error's arrival for a result to hand out (it
    # once spun so, receiving nothing, and the call never ended).
    def f(x: int) -> int:
        if x == 1234:
            raise KeyError(x)
        return x

    with Pool(2) as p:
        for _ in range(3):
            seen: list[int] = []
            with pytest.raises(KeyError):
                it = p.imap(f, iter(range(3000))) if ordered else p.imap_unordered(f, range(3000))
                for r in it:
                    seen.append(r)
            if ordered:
                assert seen == list(range(1234))
            assert p.map(pd.square, iter(range(50))) == [x * x for x in range(50)]


def test_the_inputs_end_and_error_reach_a_caller_that_waits_on_the_stream(monkeypatch):
    # With the receiving loop's tick an hour long, only a wake-up tells a caller that
    # receives that its input ended (or raised) with nothing more on its way: without one,
    # each call would wait out the hour.
    monkeypatch.setattr(turn_module, "TICK", 3600.0)

    def failing(n: int) -> Iterator[int]:
        yield from range(n)
        raise ValueError("the input broke")

    with Pool(2) as p:
        for n in (1, 7, 100, 2000):
            assert sorted(p.imap_unordered(pd.square, _slowly(n))) == [x * x for x in range(n)]
            assert list(p.imap(pd.square, _slowly(n))) == [x * x for x in range(n)]
            with pytest.raises(ValueError, match="the input broke"):
                list(p.imap(pd.square, failing(n)))
        assert list(p.imap(pd.square, _slowly(0))) == []


def test_a_caller_does_not_take_the_turn_while_the_service_thread_is_woken():
    # The feed's new work wakes a parked service thread: it must get the stream back before a
    # caller takes the turn again. Before, a caller that took it again at once after each
    # give-back kept the service thread from ever taking it, and woke it for nothing at every
    # round trip (a request/response loop ran at two thirds of its pace).
    turn = turn_module.Turn(call=None, chunks=None)
    assert turn.park_if(lambda: True)
    assert turn.try_take()
    turn.give_back(None, wake=False)
    turn.wake()
    assert not turn.try_take()
    assert not turn.free()
    assert turn.wait(lambda: True) is None  # it returns at once, woken: the stream is its own
    assert turn.park_if(lambda: True)
    assert turn.try_take()


@pytest.mark.parametrize("ordered", [True, False])
def test_a_worker_that_dies_while_its_caller_receives_fails_the_call_and_the_pool_goes_on(
    ordered,
):
    # The caller holds the stream, waiting on it, when a worker dies: after a tick with
    # nothing come it hands the stream to the service thread, which finds the death and
    # fails the call; nothing hangs, and the next call restarts the workers.
    from easycore.errors import WorkerDiedError

    die = functools.partial(pd.die_on, bad=150)
    with Pool(2) as p:
        assert sorted(p.imap_unordered(pd.square, _slowly(100))) == [x * x for x in range(100)]
        with pytest.raises(WorkerDiedError):
            it = p.imap(die, _slowly(400)) if ordered else p.imap_unordered(die, _slowly(400))
            for _ in it:
                pass
        assert list(p.imap(pd.square, _slowly(50))) == [x * x for x in range(50)]
