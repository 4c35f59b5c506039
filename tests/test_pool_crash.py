"""Fault injection for the pool: workers SIGKILLed (or stopped, then killed) at random
instants while several threads use the pool (see tests/pool_kill_torture.py)."""

from __future__ import annotations

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
