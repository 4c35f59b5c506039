"""Kill torture for the public object queue (:class:`easycore.parallel.Queue`): writer and
reader processes share one small queue (so puts wait for room and large objects travel in
side segments) while one of them, or the process that made the queue, is SIGKILLed (a fifth
SIGSTOPped first) at a random instant. Used by tests/test_pool_queue.py (a short run in CI)
and by ``benches/kill_soak.py objqueue`` (a long soak).

Each round checks, with every wait bounded:

* every object that arrived is whole (its arrays hold the values they were sent with);
* a writer's objects reach each reader in the order they were put;
* when the victim is a writer: each surviving writer's objects all arrived, and the
  victim's are a prefix of what it put (the object being put when it died may be lost,
  nothing before it);
* when the victim is a reader: the objects it took are gone with it, but the queue goes on:
  the writers finish (the room and side memory the victim held come back) and the other
  reader takes the rest;
* when the victim is the process that made the queue (it ends the queue): everyone else
  ends, with what arrived whole and in order (writers and readers see ``QueueClosed`` once
  a wait finds the maker dead);
* nothing hung, no writer or reader raised, and a sweep leaves nothing of the round's
  processes in /dev/shm.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from easycore.errors import QueueClosed, QueueEmpty
from easycore.parallel import Queue

WRITERS, READERS, PER_WRITER = 3, 2, 240
JOIN_S = 60.0  # a process not done this long after the kill counts as hung
_STOP = "stop"


def _payload(w: int, i: int) -> Any:
    """Object ``i`` of writer ``w``: small, a few KB, or MBs (side segment), by ``i``."""
    import numpy as np

    v = w * 100_000 + i
    kind = i % 4
    if kind == 0:
        return (w, i, v)
    if kind == 1:
        return (w, i, {"v": v, "b": bytes([v % 251]) * 300})
    n = 20_000 if kind == 2 else 300_000  # 160 KB, 2.4 MB
    return (w, i, np.full(n, v, dtype=np.int64))


def _whole(obj: Any) -> bool:
    """Whether an object that arrived holds what :func:`_payload` made."""
    import numpy as np

    w, i, body = obj
    v = w * 100_000 + i
    if isinstance(body, np.ndarray):
        n = 20_000 if i % 4 == 2 else 300_000
        return body.shape == (n,) and bool((body == v).all())
    if isinstance(body, dict):
        return body == {"v": v, "b": bytes([v % 251]) * 300}
    return bool(body == v)


def writer(q: Queue, w: int, done: Any) -> None:
    """Puts writer ``w``'s objects, every fourth run of three through ``put_many``; counts
    them in ``done`` (a shared int, so that the kill can land at any point of the stream)."""
    i = 0
    try:
        while i < PER_WRITER:
            if i % 12 == 6:
                batch = [_payload(w, j) for j in range(i, min(i + 3, PER_WRITER))]
                q.put_many(batch, timeout=JOIN_S)
                i += 3
            else:
                q.put(_payload(w, i), timeout=JOIN_S)
                i += 1
            done.value = i
    except QueueClosed:
        pass  # the queue's maker died: the queue is over


def reader(q: Queue, out: Queue, r: int, done: Any) -> None:
    """Takes objects until a stop mark; reports ``(r, [(w, i), ...], [bad ...])`` to ``out``
    every few objects (what a killed reader took and had not reported is lost with it)."""
    seen: list[tuple[int, int]] = []
    bad: list[str] = []
    held = []  # keep some arrays alive a while: views into shared memory a kill leaves
    while True:
        try:
            objs = q.get_many(4, timeout=JOIN_S) if r % 2 else [q.get(timeout=JOIN_S)]
        except QueueClosed:  # the queue's maker died, and what was left is taken
            objs = [_STOP]
        except QueueEmpty:
            out.put((r, seen, [*bad, "nothing came for a whole minute"]), timeout=JOIN_S)
            out.put((r, None, []), timeout=JOIN_S)
            return
        stop = False
        for obj in objs:
            if obj == _STOP:
                stop = True
                continue
            if not _whole(obj):
                bad.append(f"object {obj[:2]} is not whole")
            seen.append((obj[0], obj[1]))
            held.append(obj)
            done.value += 1
        del held[:-8]
        if len(seen) >= 16 or stop:
            out.put((r, seen, bad), timeout=JOIN_S)
            seen, bad = [], []
        if stop:
            out.put((r, None, []), timeout=JOIN_S)  # done
            return


@dataclass
class Outcome:
    """What a torture run saw: rounds done, by victim, and anything wrong (``problems``)."""

    rounds: int = 0
    writers_killed: int = 0
    readers_killed: int = 0
    makers_killed: int = 0
    problems: list[str] = field(default_factory=list)
    hung: bool = False

    def summary(self) -> str:
        """One line for a soak's report."""
        return (
            f"{self.rounds} rounds, {len(self.problems)} problems, killed: "
            f"{self.writers_killed} writers, {self.readers_killed} readers, "
            f"{self.makers_killed} queue makers{' (HUNG)' if self.hung else ''}"
        )


def _make_queue() -> Queue:
    return Queue(capacity_bytes=1 << 16, max_messages=16, side_budget=8 << 20)


def queue_maker(conn: Any) -> None:
    """Makes the round's queue, sends it on ``conn`` and waits to be killed."""
    q = _make_queue()  # kept: the maker's drop would remove it before the others attach
    conn.send(q)
    conn.recv()  # never answered


def _round(ctx: Any, rng: random.Random) -> tuple[str, list[str], bool]:
    """One round; returns (victim kind, problems, hung)."""
    problems: list[str] = []
    roll = rng.random()
    kind = "writer" if roll < 0.5 else "reader" if roll < 0.8 else "maker"
    maker = None
    if kind == "maker":  # the queue is made by a process of its own, the victim
        here, there = ctx.Pipe()
        maker = ctx.Process(target=queue_maker, args=(there,))
        maker.start()
        q = here.recv()
    else:
        q = _make_queue()
    out = Queue(capacity_bytes=1 << 20)
    done = [ctx.Value("i", 0, lock=False) for _ in range(WRITERS + READERS)]
    writers = [ctx.Process(target=writer, args=(q, w, done[w])) for w in range(WRITERS)]
    readers = [
        ctx.Process(target=reader, args=(q, out, r, done[WRITERS + r])) for r in range(READERS)
    ]
    procs = writers + readers
    everyone = procs + ([maker] if maker else [])
    victim = maker or rng.choice(writers if kind == "writer" else readers)
    # The kill lands once the victim has put or taken this many objects, a little later.
    at = rng.randrange(PER_WRITER)
    got: dict[int, list[tuple[int, int]]] = {r: [] for r in range(READERS)}
    try:
        for p in procs:
            p.start()
        # (A reader may never take that many: the other one can take most; then the kill
        # lands once every writer is done, while the victim waits in get.)
        count = done[procs.index(victim) if victim in procs else 0]  # a maker: writer 0's
        until = time.monotonic() + JOIN_S
        while count.value < at and victim.is_alive() and time.monotonic() < until:
            if not any(w.is_alive() for w in writers):
                break
            time.sleep(0.0005)
        time.sleep(rng.random() * 0.002)
        if rng.random() < 0.2:
            os.kill(victim.pid, signal.SIGSTOP)  # type: ignore[arg-type]
            time.sleep(rng.random() * 0.1)
        os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        victim.join(JOIN_S)
        deadline = time.monotonic() + JOIN_S
        for p in writers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                return kind, [f"writer {writers.index(p)} hung"], True
            if p is not victim and p.exitcode != 0:
                problems.append(f"writer {writers.index(p)} exited with {p.exitcode}")
        live = [r for r, p in enumerate(readers) if p is not victim]
        finished: set[int] = set()
        while len(finished) < len(live):
            # One stop mark at a time (get_many could take two). None once the maker is dead:
            # the readers must then end on their own, with QueueClosed, once the queue is
            # drained (before, each waited out its minute).
            if maker is None:
                q.put(_STOP, timeout=JOIN_S)
            while True:
                r, seen, bad = out.get(timeout=JOIN_S)
                problems += [f"reader {r}: {b}" for b in bad]
                if seen is None:
                    finished.add(r)
                    break
                got[r] += seen
        for r in live:
            readers[r].join(JOIN_S)
            if readers[r].exitcode != 0:
                problems.append(f"reader {r} exited with {readers[r].exitcode}")
    except QueueEmpty:
        return kind, [*problems, "a report or a stop mark waited a whole minute"], True
    finally:
        for p in everyone:
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
        out.close()
    # What the children left (the victim's side segments, tokens of killed and forked
    # children, which skip exit handlers) goes with the next queue's sweep.
    Queue(capacity_bytes=4096).close()
    # A pid that a new process (of this machine's other users, say) took since counts as
    # alive: its token is that process's, not a leftover.
    pids = {f"ec.{p.pid}-" for p in everyone if not os.path.exists(f"/proc/{p.pid}")}
    left = [n for n in os.listdir("/dev/shm") if n[: n.find("-") + 1] in pids]
    if left:
        problems.append(f"left in /dev/shm after a sweep: {left}")
    for r, ids in got.items():  # one writer's objects reach a reader in order
        for w in range(WRITERS):
            mine = [i for ww, i in ids if ww == w]
            if mine != sorted(mine) or len(set(mine)) != len(mine):
                problems.append(f"reader {r} got writer {w}'s objects out of order or twice")
    if kind == "writer":
        every = sorted(x for ids in got.values() for x in ids)
        for w, p in enumerate(writers):
            mine = [i for ww, i in every if ww == w]
            if p is not victim and mine != list(range(PER_WRITER)):
                problems.append(f"writer {w} (alive): {PER_WRITER - len(mine)} objects lost")
            if p is victim and mine != list(range(len(mine))):
                problems.append(f"killed writer {w}: what arrived is not a prefix")
    return kind, problems, False


def run(rounds: int, start_method: str = "fork", seed: int = 0) -> Outcome:
    rng = random.Random(seed)
    ctx = mp.get_context(start_method)
    out = Outcome()
    for rnd in range(rounds):
        kind, problems, hung = _round(ctx, rng)
        out.problems += [f"round {rnd} ({kind} killed): {p}" for p in problems]
        if hung:
            out.hung = True
            return out
        out.rounds += 1
        if kind == "writer":
            out.writers_killed += 1
        elif kind == "reader":
            out.readers_killed += 1
        else:
            out.makers_killed += 1
    return out
