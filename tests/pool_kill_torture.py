"""Kill torture for the pool: several threads use one :class:`~easycore.parallel.Pool` at
once (``map`` over a generator, ``imap_unordered`` over a list, ``submit``) while one of its
workers is SIGKILLed (a fifth SIGSTOPped first) at a random instant, optionally while the
workers are recycled (``maxtasksperchild``). Used by
tests/test_pool_crash.py (a short run in CI) and by ``benches/kill_soak.py pool`` (a long
soak).

Each round checks that every call returned the right results or raised
:class:`~easycore.errors.WorkerDiedError` (nothing wrong, nothing else), that nothing hung,
and that a call made once the victim is dead succeeds: a worker that died while nothing was
on its way must fail no later call.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pool_defs as pd
from easycore.errors import WorkerDiedError
from easycore.parallel import Pool

JOIN_S = 90.0  # a call not done this long after the kill counts as hung
_AFTER = 300_000
_AFTER_SQUARES = [x * x for x in range(_AFTER)]


def _after() -> Iterator[int]:
    return (x for x in range(_AFTER))


@dataclass
class Outcome:
    """What a torture run saw: rounds done, calls that returned the right results (``ok``)
    or raised WorkerDiedError (``died``), and anything else (``problems``)."""

    rounds: int = 0
    ok: int = 0
    died: int = 0
    problems: list[str] = field(default_factory=list)
    hung: bool = False

    def summary(self) -> str:
        """One line for a soak's report."""
        return (
            f"{self.rounds} rounds, {len(self.problems)} problems, {self.ok} calls ok, "
            f"{self.died} failed with WorkerDiedError{' (HUNG)' if self.hung else ''}"
        )


def _call(outcome: dict[int, str], k: int, fn: Callable[[], bool]) -> None:
    try:
        outcome[k] = "ok" if fn() else "wrong results"
    except WorkerDiedError:
        outcome[k] = "died"
    except BaseException as e:  # noqa: BLE001 - reported as a problem
        outcome[k] = f"{type(e).__name__}: {e}"


def run(
    rounds: int, start_method: str = "fork", seed: int = 0, maxtasksperchild: int | None = None
) -> Outcome:
    """``rounds`` rounds on one pool of two workers (recycled after ``maxtasksperchild``
    tasks, if given: the victim may then be a worker on its way out, or its replacement)."""
    rng = random.Random(seed)
    out = Outcome()
    with Pool(2, start_method=start_method, maxtasksperchild=maxtasksperchild) as pool:
        for rnd in range(rounds):
            outcome: dict[int, str] = {}
            n_map, n_imap, n_tasks = (
                rng.randrange(1000, 200_000),
                rng.randrange(1000, 200_000),
                rng.randrange(1, 300),
            )

            def do_map(n: int = n_map) -> bool:
                return pool.map(pd.square, (x for x in range(n))) == [x * x for x in range(n)]

            def do_imap(n: int = n_imap) -> bool:
                got = sorted(pool.imap_unordered(pd.square, list(range(n))))
                return got == [x * x for x in range(n)]

            def do_submit(n: int = n_tasks) -> bool:
                futures = [pool.submit(pd.square, i) for i in range(n)]
                return [f.result(timeout=JOIN_S) for f in futures] == [i * i for i in range(n)]

            threads = [
                threading.Thread(target=_call, args=(outcome, k, fn))
                for k, fn in enumerate((do_map, do_imap, do_submit))
            ]
            for t in threads:
                t.start()
            time.sleep(rng.random() * 0.2)
            workers = pool._stream.runner._workers
            victim = rng.choice(workers.procs) if workers is not None else None
            if victim is not None and victim.pid is not None:
                try:
                    if rng.random() < 0.2:
                        os.kill(victim.pid, signal.SIGSTOP)
                        time.sleep(rng.random() * 0.2)
                    os.kill(victim.pid, signal.SIGKILL)
                except OSError:
                    victim = None  # already gone (the pool restarted meanwhile)
            for t in threads:
                t.join(JOIN_S)
            if any(t.is_alive() for t in threads):
                out.hung = True
                out.problems.append(f"round {rnd}: a call hung; outcomes so far {outcome}")
                return out
            if victim is not None:
                victim.join(JOIN_S)
            # The victim is dead: nothing of this call can be lost with it.
            # Long enough (~0.1-0.3 s) to span the stream's health checks (every 0.1 s).
            _call(outcome, 3, lambda: pool.map(pd.square, _after()) == _AFTER_SQUARES)
            for k, v in sorted(outcome.items()):
                if v == "ok":
                    out.ok += 1
                elif v == "died" and k != 3:
                    out.died += 1
                else:
                    out.problems.append(f"round {rnd}, call {k}: {v}")
            out.rounds += 1
    return out
