"""Fault injection for the pool: workers SIGKILLed (or stopped, then killed) at random
instants while several threads use the pool (see tests/pool_kill_torture.py)."""

from __future__ import annotations

import time

import pool_kill_torture
import pytest


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("method", "rounds", "seed"), [("fork", 20, 1), ("spawn", 6, 2)])
def test_workers_killed_at_random_fail_calls_cleanly_and_the_pool_goes_on(method, rounds, seed):
    out = pool_kill_torture.run(rounds, start_method=method, seed=seed)
    assert not out.hung, out.problems
    assert out.problems == []
    assert out.rounds == rounds
    # For the record: how many calls a kill failed (a kill can miss every call's work).
    print(f"{method}: ok {out.ok}, died {out.died}")


@pytest.mark.timeout(240)
def test_workers_killed_at_random_while_they_are_recycled():
    # maxtasksperchild: workers retire and are replaced while the calls run; the victim
    # may be one on its way out, or its replacement starting.
    out = pool_kill_torture.run(8, start_method="fork", seed=3, maxtasksperchild=40)
    assert not out.hung, out.problems
    assert out.problems == []
    assert out.rounds == 8
    print(f"recycled: ok {out.ok}, died {out.died}")


@pytest.mark.timeout(300)
def test_a_worker_killed_while_large_results_stream_fails_the_call_cleanly():
    # 1 MiB results: the stream's input thread reads the generator a quarter window at a
    # time and waits, between reads, for that much room. A worker SIGKILLed at a random
    # instant of such a call must leave every call either whole or failed with
    # WorkerDiedError (nothing hung, wrong, lost or duplicated), and the next call whole.
    import functools
    import os
    import random
    import signal
    import threading

    import shm_defs as sd
    from easycore.errors import WorkerDiedError
    from easycore.parallel import Pool

    rng = random.Random(7)
    work = functools.partial(sd.stamped, nbytes=1 << 20)
    n = 240
    want = sorted(i % 251 for i in range(n))
    outcomes = []
    for _ in range(8):
        with Pool(2) as p:
            list(p.imap_unordered(work, iter(range(64))))  # sizes learned: quarter reads
            victim = rng.choice(p.worker_processes())
            got: list = []

            def call(p=p, got=got):
                try:
                    got.append(sorted(int(a[0]) for a in p.imap_unordered(work, iter(range(n)))))
                except WorkerDiedError:
                    got.append("died")

            t = threading.Thread(target=call, daemon=True)
            t.start()
            time.sleep(rng.uniform(0.0, 0.06))
            os.kill(victim.pid, signal.SIGKILL)
            t.join(120)
            assert not t.is_alive(), "the call hung after its worker was killed"
            # Once the victim is dead, no later call can lose work with it (a call made while
            # it is still dying may fail with it, as documented).
            victim.join(60)
            assert not victim.is_alive()
            assert got and got[0] in ("died", want), got[:1]
            outcomes.append(got[0] == "died")
            again = sorted(int(a[0]) for a in p.imap_unordered(work, iter(range(50))))
            assert again == sorted(i % 251 for i in range(50))
    print(f"large results: ok {outcomes.count(False)}, died {outcomes.count(True)}")
