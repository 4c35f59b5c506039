"""The runners: the manual's contract, bounded memory, and every failure of DESIGN.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest
import runner_defs as rd
from easycore.common.config import CfgNode
from easycore.common.parallel import OrderedRunner, UnorderedRunner
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    RunnerClosedError,
    SerializationError,
    WorkerDiedError,
    WorkerError,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["fork", "spawn"])
def start_method(request):
    return request.param


def test_sum_of_squares_int_and_list_devices():
    with rd.SumSquares(devices=3) as r:
        assert r.is_activate
        assert r(list(range(100))) == sum(x * x for x in range(100))
        assert r(range(10_000)) == sum(x * x for x in range(10_000))  # called many times
    assert not r.is_activate
    with rd.SumSquares(devices=["cpu", "cpu", "cpu"]) as r:
        assert r(range(100)) == 328350


def test_cfg_exponent_from_outside():
    class Power(rd.SumSquares):
        @staticmethod
        def producer_work(device, cfg, data):
            return data**cfg.exponent

    cfg = CfgNode()
    cfg.exponent = 3
    with Power(devices=3, cfg=cfg, start_method="fork") as r:
        assert r(range(100)) == sum(x**3 for x in range(100))
    with Power(devices=1, cfg={"exponent": 2}, start_method="fork") as r:
        assert r(range(10)) == 285


def test_ordered_keeps_input_order_under_jitter(start_method):
    with rd.Jittery(devices=2, start_method=start_method) as r:
        assert r.start_method == start_method
        assert r(range(3000)) == list(range(3000))
        assert r(iter(range(5))) == list(range(5))
        assert r([]) == []


def test_unordered_delivers_every_item_once():
    with rd.CollectUnordered(devices=3) as r:
        out = r(x % 50 for x in range(20_000))
    assert Counter(out) == Counter(x % 50 for x in range(20_000))


def test_each_producer_keeps_its_own_cfg_and_consumer_gets_a_fresh_one():
    with rd.PerProducerState(devices=2) as r:
        for _ in range(2):  # Collect.consumer_init asserts the consumer cfg is fresh
            out = r(range(2000))
    by_pid: dict[int, list[int]] = {}
    for pid, count, device in out:
        assert device == "cpu"
        by_pid.setdefault(pid, []).append(count)
    for counts in by_pid.values():
        # ordered delivery interleaves producers, but each one's counter only grows
        assert counts == sorted(counts) and len(set(counts)) == len(counts)


def test_input_is_read_lazily_and_in_flight_stays_within_window():
    read = []
    delivered = []

    class Watch(rd.Collect):
        @staticmethod
        def consumer_work(cfg, data):
            delivered.append(data)
            cfg.out.append(data)

    def gen():
        for i in range(5000):
            read.append(i)
            # in flight = read by the dispatcher and not yet handed to consumer_work
            lag.append(len(read) - len(delivered))
            yield i

    lag: list[int] = []
    with Watch(devices=2, window=32, start_method="fork") as r:
        assert r(gen()) == list(range(5000))
    assert max(lag) <= 32 + 1


def test_the_default_window_grows_for_cheap_items_only():
    # By default a runner keeps at least its floor of items in flight (256 per producer per
    # unit of queue_scale: 25 here) and more only once items are known to be cheap, so a
    # slow job does not read its input far ahead while tiny items travel in large batches.
    read: list[int] = []
    delivered: list[int] = []
    lag: list[int] = []

    class Watch(rd.Collect):
        @staticmethod
        def producer_work(device, cfg, data):
            if cfg.get("sleep"):
                time.sleep(cfg.sleep)
            return data

        @staticmethod
        def consumer_work(cfg, data):
            delivered.append(data)
            cfg.out.append(data)

    def gen(n):
        for i in range(n):
            read.append(i)
            lag.append(len(read) - len(delivered))  # in flight, as the test above counts
            yield i

    def run(r, n):
        read.clear(), delivered.clear(), lag.clear()
        assert r(gen(n)) == list(range(n))
        return max(lag)

    with Watch(devices=2, queue_scale=0.05, cfg={"sleep": 0.005}, start_method="fork") as r:
        floor = r._window_floor
        assert floor == 25 and r._window == 65536
        run(r, 40)  # learns that items are slow
        assert run(r, 150) <= floor + 1
    with Watch(devices=2, queue_scale=0.05, start_method="fork") as r:
        run(r, 20_000)  # learns that items are cheap
        assert run(r, 50_000) > 4 * floor
        assert r.stats.items / r.stats.batches > floor  # batches beyond the floor's quarter


def test_an_ordered_runner_reuses_its_reorder_buffer_only_while_it_is_empty():
    with rd.Collect(devices=2, start_method="fork") as r:
        assert r(range(100)) == list(range(100))
        rb = r._reorder
        assert rb is not None and len(rb) == 0
        assert r(iter(range(500))) == list(range(500))
        assert r._reorder is rb  # reused: the call numbered its batches from rb.next_seq
        rb.push(rb.next_seq + 1, "left over")  # as a failed call can leave a result in it
        assert r(range(50)) == list(range(50))
        assert r._reorder is not rb and len(r._reorder) == 0


def test_large_results_bound_items_in_flight_by_bytes():
    import numpy as np

    nbytes = 4 << 20
    read: list[int] = []
    delivered: list[int] = []
    lag: list[int] = []

    class Big(OrderedRunner):
        @staticmethod
        def producer_work(device, cfg, data):
            if data % 13 == 0:
                time.sleep(0.01)  # uneven producers: results wait in the reorder buffer
            return np.full(nbytes, data % 251, dtype=np.uint8)

        @staticmethod
        def consumer_init(cfg):
            cfg.ok = 0

        @staticmethod
        def consumer_work(cfg, data):
            delivered.append(1)
            index = len(delivered) - 1  # ordered: the i-th result delivered is item i
            cfg.ok += int(data.nbytes == nbytes and data[-1] == index % 251)

        @staticmethod
        def consumer_end(cfg):
            return cfg.ok

    def gen(n):
        for i in range(n):
            read.append(i)
            lag.append(len(read) - len(delivered))
            yield i

    # A small result ring (8 MiB): at most about 16 MiB of results in flight, i.e. 4 items,
    # far fewer than the window of 128 items.
    with Big(devices=2, queue_scale=0.25, start_method="fork") as r:
        assert r._window >= 128
        assert r(gen(20)) == 20  # learns the result size
        read.clear(), delivered.clear(), lag.clear()
        assert r(gen(300)) == 300
    ring = 8 << 20
    assert max(lag) <= 2 * ring // nbytes + 2, max(lag)


def test_large_inputs_bound_items_read_ahead_by_bytes():
    # Items read ahead wait in the caller's memory: 4 MiB inputs with a small ring (8 MiB,
    # about 16 MiB in flight) must not be read up to the window (1536 items: all 120 here)
    # ahead, from the first call on (before, the first read took a whole window at once).
    nbytes = 4 << 20
    read: list[int] = []
    delivered: list[int] = []
    lag: list[int] = []

    class Sizes(rd.Collect):
        @staticmethod
        def producer_work(device, cfg, data):
            time.sleep(0.002)
            return len(data)

        @staticmethod
        def consumer_work(cfg, data):
            delivered.append(1)
            cfg.out.append(data)

    def gen(n):
        for _ in range(n):
            read.append(1)
            lag.append(len(read) - len(delivered))
            yield b"x" * nbytes

    with Sizes(devices=2, queue_scale=0.25, window=1536, start_method="fork") as r:
        assert r(gen(120)) == [nbytes] * 120
    ring = 8 << 20
    assert max(lag) <= 2 * ring // nbytes + 12, max(lag)  # before: all 120


def test_an_item_read_while_a_producer_is_idle_goes_to_it_at_once(tmp_path, monkeypatch):
    # A slow input feeding long tasks: the first item's task waits until the second item's
    # task starts. Before the fix, the input thread sent the first item itself and stopped
    # waking the receiver, so the second item waited in the buffer, with a producer idle,
    # until a result or the receiver's tick (100 ms; 60 s here): the first task then gave up
    # after 30 s and returned False.
    from easycore.common.parallel import call

    monkeypatch.setattr(call, "TICK", 60.0)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")

    def source():
        time.sleep(0.5)  # a slow input: the receiver sleeps on the output queue meanwhile
        yield (a, b)
        end = time.monotonic() + 30.0
        while not os.path.exists(a) and time.monotonic() < end:
            time.sleep(0.01)  # the first item's task runs: it was sent, on its own
        yield (b, a)

    with rd.MarkThenWait(devices=2, start_method="fork") as r:
        assert r(source()) == [True, True]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_producers_leave_no_liveness_token_behind(start_method):
    # A forked producer exits by os._exit, which skips the atexit hook that removes its
    # token: before the fix, each one left /dev/shm/ec.<pid>-<nonce>.live behind.
    with rd.SumSquares(devices=2, start_method=start_method) as r:
        assert r(range(10)) == 285
        pids = [p.pid for p in r._workers.procs]
    left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"ec.{p}-") for p in pids)]
    assert left == [], left


def test_memory_stays_flat_when_one_producer_stalls():
    def rss_kib() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    with rd.StallEvery97(devices=2) as r:
        r(range(500))  # warm up allocations
        before = rss_kib()
        total = r(range(20_000))
        after = rss_kib()
    assert total == 20_000 * 10_000
    # 200 MB of results went through; holding them would show. Allow allocator noise.
    assert after - before < 60_000, f"RSS grew by {after - before} KiB"


def test_imap_ordered_unordered_and_early_stop():
    with rd.Collect(devices=2) as r:
        assert list(r.imap(range(1000))) == list(range(1000))
        g = r.imap(range(100_000))
        first = [next(g) for _ in range(10)]
        g.close()
        assert first == list(range(10))
        assert r(range(50)) == list(range(50))  # usable after an abandoned imap
    with rd.CollectUnordered(devices=2) as r:
        assert sorted(r.imap(range(1000))) == list(range(1000))
        for i, _ in enumerate(r.imap(range(10_000))):
            if i == 3:
                break
        assert sorted(r(range(20))) == list(range(20))


def test_progress_bar_and_stats(capsys):
    with rd.SumSquares(devices=2) as r:
        assert r(list(range(1000)), progress=True) == sum(x * x for x in range(1000))
        s = r.stats
    err = capsys.readouterr().err
    assert "1000/1000" in err
    assert s.items == 1000 and s.batches >= 1
    assert set(s.producer_busy_s) == {0, 1}
    assert s.bytes_in > 0 and s.bytes_out > 0 and s.wall_s > 0
    assert isinstance(s.bottleneck(), str)


def test_hook_error_names_hook_device_item_and_runner_stays_usable():
    cfg = {"bad_item": 17, "mode": "raise"}
    with rd.Faulty(devices=2, cfg=cfg) as r:
        with pytest.raises(WorkerError) as ei:
            r(range(100))
        e = ei.value
        assert (e.hook, e.device, e.item) == ("producer_work", "cpu", 17)
        assert "bad item 17" in str(e) and "producer_work" in str(e)
        assert "raise ValueError" in e.remote_traceback
        assert "Faulty" in str(e.__cause__) or "producer_work" in str(e.__cause__)
        assert r.is_activate
        assert r(range(10)) == list(range(10))
        with pytest.raises(WorkerError):
            list(r.imap(range(100)))
        assert list(r.imap(range(5))) == list(range(5))


def test_a_failed_call_leaves_no_input_thread_running():
    # A failed call's input thread, still inside a slow input, outlived the call: the next
    # runner made at once then counted two threads and chose spawn over fork.
    def slow():
        for i in range(1000):
            time.sleep(0.02)
            yield i

    with rd.Faulty(devices=1, cfg={"bad_item": 0, "mode": "raise"}, start_method="fork") as r:
        for _ in range(3):
            with pytest.raises(WorkerError):
                r(slow())
            assert [t for t in threading.enumerate() if t.name == "easycore-input"] == []


def test_consumer_error_is_reported():
    with rd.FailingConsumer(devices=1) as r:
        with pytest.raises(WorkerError) as ei:
            r(range(10))
        assert ei.value.hook == "consumer_work" and ei.value.item == 3
        assert isinstance(ei.value.__cause__, KeyError)
        assert r(range(3)) == [0, 1, 2]


def test_producer_init_error_fails_construction_cleanly():
    with pytest.raises(WorkerError) as ei:
        rd.FailingInit(devices=2)
    assert ei.value.hook == "producer_init"
    assert "no model file" in str(ei.value)


@pytest.mark.parametrize(
    "mode, expect",
    [("exit", "exited with code 3"), ("sigkill", "SIGKILL"), ("segfault", "SIGSEGV")],
)
def test_dead_producer_is_reported_and_runner_closed(mode, expect):
    r = rd.Faulty(devices=2, cfg={"bad_item": 50, "mode": mode})
    try:
        with pytest.raises(WorkerDiedError) as ei:
            r(range(1000))
        e = ei.value
        assert expect in str(e) and "pid" in str(e) and e.device == "cpu" and e.pid > 0
        assert not r.is_activate
        with pytest.raises(RunnerClosedError, match="activate"):
            r(range(3))
        r.activate()
        assert r(range(3)) == [0, 1, 2]
    finally:
        r.close()


def test_unpicklable_item_and_result():
    with rd.Faulty(devices=1, cfg={"bad_item": 2, "mode": "unpicklable"}) as r:
        with pytest.raises(SerializationError, match="function"):
            r([1, lambda: 0, 3])
        with pytest.raises(SerializationError, match="not picklable"):
            r(range(5))
        assert r([7]) == [7]


def test_a_result_that_exits_as_it_is_pickled_fails_the_call_not_the_producer():
    # Describing the culprit pickles it again: a __reduce__ that calls sys.exit must end
    # up in the call's SerializationError, not end the producer.
    with rd.Faulty(devices=1, cfg={"bad_item": 2, "mode": "exit_at_pickle"}) as r:
        for _ in range(2):
            with pytest.raises(SerializationError, match="ExitAtPickle"):
                r(range(5))
            assert r([7]) == [7]  # a dead producer would have closed the runner


def test_input_iterable_error_passes_through():
    def broken():
        yield 1
        yield 2
        raise ValueError("input broke")

    with rd.Collect(devices=2) as r:
        with pytest.raises(ValueError, match="input broke"):
            r(broken())
        assert r(range(4)) == [0, 1, 2, 3]


def test_closed_runner_close_twice_and_activate():
    r = rd.SumSquares(devices=1)
    r.close()
    r.close()
    assert not r.is_activate
    with pytest.raises(RunnerClosedError, match=r"activate\(\)"):
        r(range(3))
    r.activate()
    assert r.is_activate and r(range(3)) == 5
    r.close()


@pytest.mark.parametrize("bad", [0, -1, [], ["gpu0"], ["cpu", 3], "cuda:x", True])
def test_bad_devices(bad):
    with pytest.raises(InvalidArgument):
        rd.SumSquares(devices=bad)


def test_bad_arguments():
    with pytest.raises(InvalidArgument):
        rd.SumSquares(devices=1, queue_scale=0)
    with pytest.raises(InvalidArgument):
        rd.SumSquares(devices=1, start_method="thread")
    with pytest.raises(InvalidArgument):
        rd.SumSquares(devices=["cuda:0"], start_method="fork")
    with pytest.raises(InvalidArgument):
        rd.SumSquares(devices=1, cfg=[1, 2])


def test_errors_share_one_root():
    for cls in (WorkerError, WorkerDiedError, RunnerClosedError, SerializationError):
        assert issubclass(cls, EasycoreError)


def test_ctrl_c_in_the_caller_leaves_no_orphans(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys, time
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            import runner_defs as rd
            r = rd.Slow(devices=2, cfg={{"sleep": 0.2}})
            pids = [p.pid for p in r._workers.procs]
            print("started", flush=True)
            try:
                r(range(10_000))
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            for pid in pids:
                for _ in range(100):
                    if not os.path.exists(f"/proc/{{pid}}") or open(
                        f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
                    time.sleep(0.05)
                else:
                    print("orphan", pid, flush=True)
            print("closed" if not r.is_activate else "active", flush=True)
            """
        )
    )
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert p.stdout.readline().strip() == "started"
        import time

        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the whole group
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert "interrupted" in out
    assert "orphan" not in out
    assert "closed" in out
    assert p.returncode == 0


def test_runner_defined_in_main_module_with_spawn(tmp_path):
    script = tmp_path / "main_runner.py"
    script.write_text(
        textwrap.dedent(
            """
            from easycore.common.parallel import OrderedRunner

            class Double(OrderedRunner):
                @staticmethod
                def producer_work(device, cfg, data):
                    return 2 * data

                @staticmethod
                def consumer_init(cfg):
                    cfg.out = []

                @staticmethod
                def consumer_work(cfg, data):
                    cfg.out.append(data)

                @staticmethod
                def consumer_end(cfg):
                    return cfg.out

            if __name__ == "__main__":
                for method in ("spawn", "forkserver", "fork"):
                    with Double(devices=2, start_method=method) as r:
                        assert r(range(5)) == [0, 2, 4, 6, 8], method
                print("ok")
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100)
    assert out.stdout.strip() == "ok", out.stderr


def test_base_and_flavour_classes_exist():
    from easycore.common.parallel import BaseRunner

    assert issubclass(UnorderedRunner, BaseRunner) and issubclass(OrderedRunner, BaseRunner)
    assert BaseRunner.producer_work("cpu", CfgNode(), 5) == 5
    assert BaseRunner.consumer_end(CfgNode()) is None


def test_a_batch_of_few_items_barely_moves_the_learned_cost():
    # A batch's time includes a fixed part (unpickling, bookkeeping). The lone item each call
    # starts with charged all of it to one item: its cost, 30 times the real one, made the
    # next batches tenfold smaller. Now a sample weighs by its share of a full batch.
    from types import SimpleNamespace

    from easycore.common.parallel.call import Call

    learned = SimpleNamespace(cost_per_item=0.2e-6)
    call = SimpleNamespace(
        reports={0: [0.0, 0.0, 0.0, 0.0]},
        learned=learned,
        input=SimpleNamespace(sizing=SimpleNamespace(batch_size=lambda: 2048, cost=None)),
    )
    Call._learn(call, 0, 6e-6, 0.0, 1)  # one item, 6 µs: the fixed part
    assert learned.cost_per_item < 0.21e-6  # before: 1.9e-6
    # A full batch still teaches at the full rate.
    Call._learn(call, 0, 6e-6 + 2048 * 1e-6, 0.0, 2048)
    assert 0.4e-6 < learned.cost_per_item < 0.5e-6


def test_producer_figures_are_counted_once_across_reads_and_a_replacement():
    # A result message only stores its producer's cumulative busy/wait seconds; the call's
    # figures count the differences when they are read (stats_now, any number of times, or
    # at the end) and when a new producer takes a place (its figures restart at 0).
    from types import SimpleNamespace

    from easycore.common.parallel.call import Call

    stats = SimpleNamespace(producer_busy_s={0: 0.0, 1: 0.0}, producer_wait_s={0: 0.0, 1: 0.0})
    call = SimpleNamespace(
        reports={},
        stats=stats,
        input=SimpleNamespace(sizing=SimpleNamespace(cost=lambda: 1e-6)),
    )
    call._fold = lambda wi, r: Call._fold(call, wi, r)  # type: ignore[attr-defined]

    def pending() -> tuple[float, float]:
        # What stats_now adds to its copy: the reports not counted yet.
        busy = sum(r[2] - r[0] for r in call.reports.values())
        wait = sum(r[3] - r[1] for r in call.reports.values())
        return busy, wait

    def total() -> tuple[float, float]:
        busy, wait = pending()
        busy += sum(stats.producer_busy_s.values())
        return busy, wait + sum(stats.producer_wait_s.values())

    Call._learn(call, 0, 1.0, 0.5, 1)  # baselines: nothing counted
    Call._learn(call, 1, 2.0, 0.0, 1)
    assert total() == (0.0, 0.0)
    Call._learn(call, 0, 1.5, 0.75, 1)
    Call._learn(call, 1, 2.25, 0.0, 1)
    assert total() == (0.75, 0.25)
    Call._fold_reports(call)  # a read at the end: counted once, nothing left pending
    assert pending() == (0.0, 0.0) and total() == (0.75, 0.25)
    Call._fold_reports(call)
    assert total() == (0.75, 0.25)
    # Producer 0 replaced: the new one reports from 0; the old one's figures stay counted.
    Call._learn(call, 0, 0.125, 0.25, 1)
    assert stats.producer_busy_s[0] == 0.5 and total() == (0.875, 0.5)
    Call._learn(call, 0, 0.375, 0.25, 1)
    assert Call.last_report(call, 0) == (0.375, 0.25)
    assert Call.last_report(call, 7) == (0.0, 0.0)
    Call._fold_reports(call)
    assert stats.producer_busy_s == {0: 0.875, 1: 0.25}
    assert stats.producer_wait_s == {0: 0.5, 1: 0.0}


@pytest.mark.timeout(120)
def test_a_queue_let_go_while_fork_producers_run_leaves_no_names():
    # Producers forked by a runner inherited the caller's hold on every queue open then: a
    # queue the caller closed and dropped while they ran stayed held, its names left behind.
    import gc

    from easycore._core import Queue as CoreQueue

    q = CoreQueue(capacity_bytes=1 << 16)
    token = f"/dev/shm/ec.{q.name.lstrip('/').split('.')[1]}.live"
    with rd.SumSquares(devices=2, start_method="fork") as r:
        assert r(range(10)) == sum(x * x for x in range(10))
        q.close()
        del q
        gc.collect()
        assert not os.path.exists(token), "the producers still hold the queue"
        assert r(range(10)) == sum(x * x for x in range(10))
