"""Targets for tests/test_child_exit.py: a multiprocessing child that uses easycore, and the
check, run in a fresh interpreter, that it leaves nothing in /dev/shm."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time

SHM = "/dev/shm"


def square(x: int) -> int:
    return x * x


def touch(path: str) -> None:
    time.sleep(0.2)
    with open(path, "w"):
        pass


def own_names() -> list[str]:
    """This process's token and the tokens of the queues it made (a queue token's content is
    its maker's `<pid>-<nonce>` tag)."""
    mine = f"{os.getpid()}-"
    names = []
    for n in os.listdir(SHM):
        if n.startswith(f"ec.{mine}"):
            names.append(n)
        elif n.startswith("ec.q") and n.endswith(".live"):
            try:
                with open(f"{SHM}/{n}") as f:
                    if f.read(64).startswith(mine):
                        names.append(n)
            except OSError:
                pass
    return names


def child(kind: str, start_method: str, out: str, conn) -> None:
    """Uses easycore as ``kind`` says, tells the parent which names it holds, and returns
    (multiprocessing then ends the process with os._exit)."""
    from easycore.common.parallel import UnorderedRunner
    from easycore.parallel import Pool, PoolExecutor, Queue

    class Squares(UnorderedRunner):
        @staticmethod
        def producer_work(device, cfg, data):
            return data * data

    keep = []
    if kind == "pool_closed":
        with Pool(2, start_method=start_method) as p:
            assert sum(p.imap_unordered(square, range(100))) == 328350
            p.close()
            p.join()
    elif kind == "pool_open":
        p = Pool(2, start_method=start_method)
        assert sum(p.map(square, range(100))) == 328350
        keep.append(p)
    elif kind == "runner_open":
        r = Squares(devices=["cpu", "cpu"], start_method=start_method)
        assert sum(r.imap(range(100))) == 328350
        keep.append(r)
    elif kind == "executor_pending":
        e = PoolExecutor(2, start_method=start_method)
        keep += [e.submit(touch, os.path.join(out, str(i))) for i in range(4)]
        keep.append(e)
    elif kind == "queue":
        q = Queue()
        q.put("x")
        keep.append(q)
    conn.send(own_names())
    conn.close()


def main(
    kind: str, start_method: str, child_method: str, out: str, kill_after: str | None = None
) -> None:
    """Runs :func:`child` in a ``child_method`` child; prints what it left (nothing: "clean").
    With ``kill_after`` (seconds), the child is SIGKILLed that long after it said what it
    holds: at some step of its exit."""
    ctx = multiprocessing.get_context(child_method)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(kind, start_method, out, send))
    proc.start()
    send.close()
    held = recv.recv()
    killed = kill_after is not None
    if killed:
        time.sleep(float(kill_after))  # somewhere in its exit (or before, or after it)
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode in ((0, -signal.SIGKILL) if killed else (0,)), proc.exitcode
    assert any(n.startswith(f"ec.{proc.pid}-") for n in held), held  # it had a token
    deadline = time.monotonic() + 30  # producers on their way out still hold the queues
    left = [n for n in held if os.path.exists(f"{SHM}/{n}")]
    while left and time.monotonic() < deadline:
        if killed:  # a death between two steps of its exit leaves the rest to a sweep
            from easycore.parallel import Queue

            Queue(capacity_bytes=4096).close()
        time.sleep(0.05)
        left = [n for n in held if os.path.exists(f"{SHM}/{n}")]
    if kind == "executor_pending":
        assert sorted(os.listdir(out)) == ["0", "1", "2", "3"], os.listdir(out)
    print("clean" if not left else f"left: {left}")


class _Printed:
    """A stand-in for the pipe: prints what it is sent, as JSON."""

    def send(self, obj: object) -> None:
        print(json.dumps(obj), flush=True)

    def close(self) -> None:
        pass


if __name__ == "__main__":
    if sys.argv[3] == "none":  # the main process uses easycore and exits as it is
        child(sys.argv[1], sys.argv[2], sys.argv[4], _Printed())
    else:
        main(*sys.argv[1:])
