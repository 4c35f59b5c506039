"""Runners under producer deaths at random instants: a producer SIGKILLed, or
SIGSTOPped and then killed, in the middle of a call with many tiny items must always end in
WorkerDiedError, never a hang, however often it is tried; the runner then works again (its
consumer thread kept between calls), and closed runners leave no thread behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(600)

HERE = os.path.dirname(__file__)

SCRIPT = """
import json, os, random, signal, sys, threading, time
sys.path.insert(0, {here!r})
from easycore.common.parallel import OrderedRunner, UnorderedRunner
from easycore.errors import WorkerDiedError


class Square(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, x):
        return x * x


class OrderedSquare(OrderedRunner):
    producer_work = Square.producer_work


class Big(UnorderedRunner):
    # Large results: they travel in pooled shared-memory segments (zero-copy views).

    @staticmethod
    def producer_work(device, cfg, x):
        import numpy as np

        return np.full(300_000 + (x % 7) * 100_000, x % 251, np.uint8)

    @staticmethod
    def consumer_init(cfg):
        cfg.kept = []

    @staticmethod
    def consumer_work(cfg, data):
        assert (data == data[0]).all()
        cfg.kept = cfg.kept[-5:] + [data]  # hold a few views, as a user might


def main(trials, seed):
    rnd = random.Random(seed)
    outcomes, latencies, again = [], [], []
    for trial in range(trials):
        cls = rnd.choice([Square, OrderedSquare, Big])
        runner = cls(2, start_method="fork")  # its classes live in this -c script
        victim = rnd.choice([p.pid for p in runner._workers.procs])
        stop_first = rnd.random() < 0.4
        killed_at = []

        def act():
            if stop_first:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(rnd.uniform(0.05, 0.3))  # others block on it meanwhile
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        timer = threading.Timer(rnd.uniform(0.005, 0.15), act)
        timer.start()
        # A range is sliced in place; a generator goes through the input thread, read in
        # runs whose window grows once the items are known to be cheap.
        data = range(10**8) if rnd.random() < 0.5 else (x for x in range(10**8))
        try:
            if rnd.random() < 0.5:
                runner(data)
            else:
                for _ in runner.imap(data):
                    pass
            outcomes.append("finished")
        except WorkerDiedError:
            outcomes.append("died")
            latencies.append(time.monotonic() - killed_at[0])
        except BaseException as e:
            outcomes.append(f"{{type(e).__name__}}: {{e}}")
        timer.join()
        # The runner works again after the death: two calls, the second in the consumer
        # thread kept from the first.
        try:
            runner.activate()
            runner(range(50))
            runner(x for x in range(50))
            again.append("ok")
        except BaseException as e:
            again.append(f"{{type(e).__name__}}: {{e}}")
        runner.close()
    import gc
    from easycore._core import identity
    gc.collect()
    tag = identity()
    names = os.listdir("/dev/shm")
    leaked = [n for n in names if n.startswith("ec." + tag) and not n.endswith(".live")]
    consumers = [t.name for t in threading.enumerate() if t.name == "easycore-consumer"]
    print(json.dumps({{"outcomes": outcomes, "latencies": latencies, "leaked": leaked,
                      "again": again, "consumers": consumers}}))


main(int(sys.argv[1]), int(sys.argv[2]))
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_a_producer_killed_or_stopped_at_random_always_ends_in_worker_died(seed):
    trials = 15
    # A hang anywhere becomes a timeout here: each trial takes well under a second.
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(here=HERE)), str(trials), str(seed)],
        capture_output=True,
        text=True,
        timeout=trials * 20,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["outcomes"] == ["died"] * trials, report["outcomes"]
    assert report["leaked"] == [], "shared memory left behind by closed runners"
    assert report["again"] == ["ok"] * trials, report["again"]
    assert report["consumers"] == [], "consumer threads left behind by closed runners"
    # For the record (not a timed assertion): kill-to-error latencies.
    print("latencies (s):", [round(x, 3) for x in report["latencies"]])
