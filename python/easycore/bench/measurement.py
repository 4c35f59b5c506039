"""The bounded measurement: each (system, workload) cell runs in its own forked child
process, in its own process group, so that a hung or crashed system is killed with everything
it started (:func:`run_cell`); results are compared by value (:func:`fingerprint`)."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing as mp
import multiprocessing.util
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from easycore.bench.system_api import Call, Job, System
from easycore.bench.workloads import Workload


def fingerprint(x: Any) -> str:
    """A digest of a result's value (arrays and tensors by content), to compare results
    of different systems without sending them between processes."""
    h = hashlib.sha256()

    def feed(o: Any) -> None:
        if hasattr(o, "detach") and hasattr(o, "cpu") and hasattr(o, "numpy"):
            o = o.detach().cpu().numpy()
        if hasattr(o, "tobytes") and hasattr(o, "dtype") and hasattr(o, "shape"):
            h.update(f"array{o.dtype}{tuple(o.shape)}".encode())
            h.update(o.tobytes())
        elif isinstance(o, list | tuple):
            h.update(f"{type(o).__name__}{len(o)}(".encode())
            for e in o:
                feed(e)
            h.update(b")")
        elif isinstance(o, dict):
            h.update(f"dict{len(o)}(".encode())
            for k in sorted(o, key=repr):
                feed(k)
                feed(o[k])
            h.update(b")")
        elif isinstance(o, set | frozenset):
            h.update(f"set{sorted(repr(e) for e in o)}".encode())
        elif o is None or isinstance(o, bool | int | float | complex | str | bytes):
            h.update(repr(o).encode())
        else:
            try:
                h.update(pickle.dumps(o, protocol=4))
            except Exception:
                h.update(repr(o).encode())

    feed(x)
    return h.hexdigest()[:16]


class _Counted:
    """Wraps an iterable and counts the items taken from it."""

    def __init__(self, it: Iterable[Any]) -> None:
        self.it = it
        self.n = 0

    def __iter__(self) -> Iterator[Any]:
        for x in self.it:
            self.n += 1
            yield x


@dataclass
class CellSpec:
    """One (system, workload) measurement."""

    system: System
    workload: Workload
    job: Job
    items: int
    repeats: int
    warmup_items: int


def _data(w: Workload, job: Job, n: int) -> Any:
    """A timed call's input: an iterator that counts the items taken, or (a workload
    ``as_sequence``) the sequence itself, whose length counts."""
    data = job.make_data(n)
    return data if w.as_sequence else _Counted(data)


def measure(spec: CellSpec) -> dict[str, Any]:
    """Runs the measurement in this process; returns figures and verification.

    Returns:
        dict with ``status`` (``"ok"`` or ``"wrong"``), ``samples`` (one figure per repeat),
        ``seconds``, ``items`` (items in the last timed call), ``detail`` and, for workloads
        without an expected value, ``fingerprint`` of the last result.
    """
    w, job, n = spec.workload, spec.job, spec.items
    problems: list[str] = []
    samples: list[float] = []
    seconds: list[float] = []
    last: Any = None
    counted_n = n

    def timed(call: Call) -> None:
        nonlocal last, counted_n
        data = _data(w, job, n)
        t0 = time.perf_counter()
        last = call(data)
        dt = time.perf_counter() - t0
        counted_n = data.n if isinstance(data, _Counted) else len(data)
        seconds.append(dt)
        samples.append(w.figure(counted_n, dt))
        if (p := w.check(last, counted_n)) is not None:
            problems.append(p)

    if w.startup:
        for _ in range(spec.repeats):
            t0 = time.perf_counter()
            with spec.system.session(job) as call:
                data = _Counted(job.make_data(n))
                last = call(data)
            dt = time.perf_counter() - t0
            counted_n = data.n
            seconds.append(dt)
            samples.append(dt)
            if (p := w.check(last, counted_n)) is not None:
                problems.append(p)
    else:
        with spec.system.session(job) as call:
            if spec.warmup_items:
                wn = min(spec.warmup_items, n)
                warm = call(job.make_data(wn))
                if (p := w.check(warm, wn)) is not None:
                    problems.append(f"warm-up call: {p}")
            for _ in range(spec.repeats):
                timed(call)
    out: dict[str, Any] = {
        "status": "wrong" if problems else "ok",
        "samples": samples,
        "seconds": seconds,
        "items": counted_n,
        "detail": problems[0] if problems else "",
    }
    if w.verify_by_fingerprint:
        out["fingerprint"] = fingerprint(last)
    return out


def _cell_child(conn: Any, spec: CellSpec) -> None:
    """The measuring child: own process group, killed as a group on timeout."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    # If this process is told to stop, take its whole group (the system's workers) with it;
    # the workers it forks get the default SIGTERM back (systems terminate their workers).
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        out = measure(spec)
    except BaseException as e:
        tb = traceback.format_exc()
        out = {"status": "error", "detail": f"{type(e).__name__}: {e}", "traceback": tb}
    try:
        conn.send(out)
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


def kill_group(proc: Any, grace: float = 2.0) -> None:
    """Stops a cell child and everything in its process group."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    proc.join(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    proc.join()
    _sweep_segments()


def _sweep_segments() -> None:
    """Removes shared-memory segments of dead processes (what a killed system leaves)."""
    with contextlib.suppress(Exception):
        from easycore._core import sweep_stale_segments

        sweep_stale_segments()


def run_cell(
    spec: CellSpec, timeout: float, tick: Callable[[float], None] | None = None
) -> dict[str, Any]:
    """Measures ``spec`` in a forked child with a ``timeout`` (seconds).

    ``tick(elapsed)`` is called about twice a second while waiting (progress display).
    A child that runs past the timeout is killed with its process group and the result is
    ``{"status": "timeout"}``. On KeyboardInterrupt the child is killed and the exception
    propagates.
    """
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_cell_child, args=(send, spec), daemon=False)
    t0 = time.monotonic()
    proc.start()
    send.close()
    try:
        while True:
            elapsed = time.monotonic() - t0
            if tick is not None:
                tick(elapsed)
            if recv.poll(min(0.5, max(0.0, timeout - elapsed))):
                try:
                    out: dict[str, Any] = recv.recv()
                except EOFError:
                    proc.join()
                    return {
                        "status": "error",
                        "detail": f"measuring process died (exit code {proc.exitcode})",
                    }
                out["wall_s"] = time.monotonic() - t0
                proc.join(10.0)
                if proc.is_alive():
                    kill_group(proc)
                else:
                    # workers the system left running in the group are stopped too
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(cast(int, proc.pid), signal.SIGKILL)  # started: has a pid
                    _sweep_segments()  # what such a worker left
                return out
            if time.monotonic() - t0 >= timeout:
                kill_group(proc)
                return {"status": "timeout", "detail": f"no result after {timeout:g} s"}
    except BaseException:
        kill_group(proc)
        raise
    finally:
        recv.close()
