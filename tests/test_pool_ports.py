"""What code ported from DataLoader, mpire and torch.multiprocessing relies on: a large
closure sent once (not with every batch), lambdas inside arguments. Every test closes its
pools; nothing here asserts a duration."""

from __future__ import annotations

import os

import pool_defs as pd
import pytest
from easycore.errors import SerializationError, WorkerDiedError
from easycore.parallel import Pool

METHODS = ["fork", "spawn"]


def _bytes_per_batch(method: str, size: int) -> float:
    data = bytes(range(256)) * (size // 256)
    with Pool(2, start_method=method) as pool:
        for _ in range(3):
            got = list(pool.imap(lambda i: data[i % len(data)], range(300), chunksize=1))
            assert got == [data[i % len(data)] for i in range(300)]
        s = pool.stats
        return s.bytes_in / max(1, s.batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_a_large_closure_is_not_sent_with_every_batch(method):
    # A closure over 4 MiB and one over 4 KiB cost the same bytes per batch on the wire.
    small = _bytes_per_batch(method, 4096)
    large = _bytes_per_batch(method, 4 << 20)
    assert large < 16 * 1024, (small, large)
    assert large < small + 4096, (small, large)


@pytest.mark.timeout(120)
def test_a_restarted_worker_gets_the_body_of_a_closure_it_never_saw():
    data = bytes(range(256)) * 4096  # 1 MiB: sent once, through shared memory
    f = lambda i: data[i] + i  # noqa: E731
    with Pool(2, start_method="spawn") as pool:
        assert pool.map(f, range(100)) == [data[i] + i for i in range(100)]
        with pytest.raises(WorkerDiedError):
            pool.submit(pd.die_on, 1, 1).result(timeout=60)
        # Fresh workers (no cache) read the body of the same closure.
        assert pool.map(f, range(100)) == [data[i] + i for i in range(100)]
        assert pool.submit(f, 7).result(timeout=60) == data[7] + 7


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_lambdas_inside_arguments_travel_by_value(method):
    k = 5
    with Pool(2, start_method=method) as pool:
        fns = [lambda x, i=i: x * i + k for i in range(20)]
        thunks = [lambda i=i: i + k for i in range(20)]
        assert pool.map(pd.call_it, thunks, chunksize=3) == [i + k for i in range(20)]
        assert pool.starmap(pd.call_it, [(f, 2) for f in fns]) == [2 * i + k for i in range(20)]
        assert list(pool.imap(pd.call_it, iter([lambda: 1, lambda: 2]))) == [1, 2]
        assert pool.submit(pd.call_it, lambda y: y + k, 1).result(timeout=60) == 6
        assert pool.apply(pd.call_it, (lambda: k,)) == 5
        # Plain arguments still take plain pickle (and still work next to the others).
        assert pool.map(pd.square, range(10)) == [x * x for x in range(10)]


def _augmented(processes: int, method: str, **kw):
    with Pool(processes, start_method=method, seed=1234, seed_per_item=True, **kw) as pool:
        first = pool.map(pd.augment, range(64), chunksize=3)
        second = sorted(pool.imap_unordered(pd.augment, iter(range(64))))
        task = pool.submit(pd.augment, 7).result(timeout=60)
        return first, second, task


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_seed_per_item_gives_the_same_draws_with_any_number_of_workers(method):
    one = _augmented(1, method)
    three = _augmented(3, method)
    assert one == three
    first, second, task = one
    # Each item draws its own numbers: different items (and calls) differ.
    assert len({r[1] for r in first}) == 64
    assert {r[1] for r in first}.isdisjoint(r[1] for r in second)
    # Without seed_per_item, items draw from the worker's stream: not the same per item.
    with Pool(3, start_method=method, seed=1234) as pool:
        plain = pool.map(pd.augment, range(64), chunksize=3)
    assert plain != first


@pytest.mark.timeout(180)
def test_a_runner_with_seed_per_item_gives_the_same_draws_with_any_number_of_producers():
    import runner_defs as rd

    def run(n):
        with rd.Augment(devices=n, seed=99, seed_per_item=True) as r:
            return r(range(50)), r(range(50))

    one, three = run(1), run(3)
    assert one == three
    assert one[0] != one[1]  # the second call draws other numbers
    assert len({x[1] for x in one[0]}) == 50


@pytest.mark.timeout(120)
def test_progress_takes_tqdm_options_and_shows_the_total_of_a_sized_input():
    import io

    with Pool(2, start_method="fork") as pool:
        out = io.StringIO()
        got = pool.map(pd.square, set(range(30)), progress={"desc": "epoch 3", "file": out})
        assert sorted(got) == [x * x for x in range(30)]
        text = out.getvalue()
        assert "epoch 3" in text and "30/30" in text, text
        out = io.StringIO()
        gen = (x for x in range(12))
        got = list(pool.imap(pd.square, gen, progress={"total": 12, "file": out, "ascii": True}))
        assert got == [x * x for x in range(12)]
        assert "12/12" in out.getvalue(), out.getvalue()


@pytest.mark.timeout(120)
def test_a_runner_takes_tqdm_options_too():
    import io

    import runner_defs as rd

    out = io.StringIO()
    with rd.Jittery(devices=1) as r:
        assert r(range(20), progress={"desc": "val", "file": out}) == list(range(20))
    assert "val" in out.getvalue() and "20/20" in out.getvalue(), out.getvalue()


@pytest.mark.timeout(120)
def test_a_runners_producer_end_values_are_collected():
    import runner_defs as rd

    r = rd.EndValue(devices=["cpu", "cpu"])
    assert r.exit_results == []
    assert r(range(40)) == list(range(40))
    r.close()
    assert [e[:2] for e in r.exit_results] == [(0, "cpu"), (1, "cpu")]
    assert sum(e[2] for e in r.exit_results) == 40


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_a_pools_worker_exit_results_are_collected(method):
    with Pool(2, initializer=pd.count_init, worker_exit=pd.count_exit, start_method=method) as p:
        assert p.map(pd.counted, range(100), chunksize=5) == list(range(100))
        pids = {p.submit(os.getpid).result(timeout=60) for _ in range(4)}
    results = p.exit_results
    assert len(results) == 2
    assert sum(r["tasks"] for r in results) == 100
    assert pids <= {r["pid"] for r in results}
    k = 7
    with Pool(1, worker_exit=lambda: k * 6, start_method=method) as p:
        p.map(pd.square, range(3))
    assert p.exit_results == [42]


@pytest.mark.timeout(120)
def test_a_worker_exit_value_that_exits_as_it_is_pickled_is_reported_at_join():
    # As an unpicklable value is: the join raises SerializationError naming it (it used to
    # end the worker with code 3 as it pickled the value, and the join said nothing).
    p = Pool(1, worker_exit=pd.exit_at_pickle)
    assert p.map(pd.square, range(3)) == [0, 1, 4]
    p.close()
    with pytest.raises(SerializationError, match="ExitAtPickle"):
        p.join()


@pytest.mark.timeout(120)
def test_stats_count_the_items_each_worker_ran():
    import runner_defs as rd

    with Pool(2, start_method="fork") as pool:
        pool.map(pd.square, range(500), chunksize=10)
        pool.submit(pd.square, 3).result(timeout=60)
        s = pool.stats
        assert sorted(s.producer_items) == [0, 1]
        assert sum(s.producer_items.values()) == 50 + 1  # chunks and the task
    with rd.Jittery(devices=2) as r:
        r(range(300))
        assert sum(r.stats.producer_items.values()) == 300


@pytest.mark.timeout(120)
def test_an_initializer_that_takes_too_long_fails_the_pool_within_init_timeout():
    from easycore.errors import InvalidArgument, RunnerTimeoutError

    with pytest.raises(RunnerTimeoutError) as info:
        Pool(2, initializer=pd.nap, initargs=(None, 300), init_timeout=2, start_method="fork")
    assert isinstance(info.value, TimeoutError) and info.value.timeout == 2
    with Pool(1, initializer=pd.nap, initargs=(None, 0.01), init_timeout=100) as pool:
        assert pool.map(pd.square, range(5)) == [0, 1, 4, 9, 16]
    with pytest.raises(InvalidArgument):
        Pool(1, init_timeout=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_task_timeout_stops_the_task_and_fails_only_its_call(method):
    with Pool(2, task_timeout=1.0, start_method=method) as pool:
        slow = pool.submit(pd.nap, 1, 300)
        fast = pool.submit(pd.nap, 2, 0.01)
        with pytest.raises(TimeoutError):
            slow.result(timeout=100)
        assert fast.result(timeout=100) == 2
        with pytest.raises(TimeoutError):
            pool.starmap(pd.nap, [(1, 0.0), (2, 300), (3, 0.0)], chunksize=1)
        # The workers went on: nothing died, later calls work.
        assert pool.map(pd.square, range(20)) == [x * x for x in range(20)]
        assert pool.starmap(pd.nap, [(i, 0.001) for i in range(10)]) == list(range(10))


def test_a_body_whose_arena_is_gone_gives_a_function_that_raises():
    # A work item of a call that ended can reach a worker that never saw its body: the
    # arena is gone, and the function it gets raises (that call's results are dropped).
    from easycore.parallel import functions

    fn = functions._load_shared(b"k" * 16, "ec.no-such-arena", 4096)
    with pytest.raises(RuntimeError, match="has ended"):
        fn(1)
    # A body that is present loads, and is then found by its digest alone.
    bodies = functions.Bodies()
    data = bytes(100_000)
    by_value = functions.portable(lambda: len(data), "spawn", bodies)
    assert by_value.shared is not None
    name, size = by_value.shared.name, by_value.shared.nbytes
    functions._BY_VALUE_CACHE.pop(by_value.key, None)
    assert functions._load_shared(by_value.key, name, size)() == 100_000
    assert functions._load_shared(by_value.key, "ec.no-such-arena", size)() == 100_000
    del by_value
    bodies.clear()


@pytest.mark.timeout(120)
def test_a_worker_exit_that_outlasts_close_timeout_is_terminated():
    # worker_exit naps 300 s: join() returns after close_timeout, the worker terminated.
    pool = Pool(1, worker_exit=lambda: pd.nap(1, 300), close_timeout=1, start_method="fork")
    pid = pool.submit(os.getpid).result(timeout=60)
    pool.close()
    pool.join()
    assert pool.exit_results == [None]  # it never returned
    assert not os.path.exists(f"/proc/{pid}")  # terminated and reaped


@pytest.mark.timeout(180)
def test_the_closure_loader_bench_runs_both_modes(tmp_path):
    # benches/closure_loader.py (docs/performance.md): its switch still reaches the pool.
    import json
    import subprocess
    import sys

    bench = os.path.join(os.path.dirname(__file__), "..", "benches", "closure_loader.py")
    out = tmp_path / "samples.json"
    args = ["--rounds", "1", "--batches", "3", "--batch", "8", "--mib", "1", "--tiny", "1000"]
    subprocess.run([sys.executable, bench, *args, "--json", str(out)], check=True, timeout=150)
    samples = json.loads(out.read_text())["samples"]
    once, each = samples["per-call once"][0], samples["per-call each"][0]
    assert once["bytes_per_message"] < 16 * 1024 < (256 << 10) < each["bytes_per_message"]
