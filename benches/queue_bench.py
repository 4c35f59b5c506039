"""Side-by-side benchmark of ``easycore._core.Queue`` between two processes.

Run::

    .venv/bin/python benches/queue_bench.py            # full run (about a minute or two)
    .venv/bin/python benches/queue_bench.py --quick    # well under a minute
    .venv/bin/python benches/queue_bench.py --json out.json

Every measurement runs between two processes on this machine: a *writer* child process and
the *reader*, which is this (parent) process and holds the clock. Each measurement forks a
fresh writer, waits until it is ready, starts the clock, tells it to go, and stops the clock
when the reader holds the last message. Every message is checked: the count, a checksum of
the sequence numbers carried *inside the payload*, and the payload's length (small messages);
a header, one byte per 4 KiB page and the full content of the first and last array (large
messages). A wrong result aborts the run with exit status 1.

What is measured:

* small messages (8 B, 1 KiB bytes): messages/s. ``easycore`` per message (``put``/``get``),
  ``easycore`` batched (``put_many``/``get_many``, 64 per call), ``multiprocessing.Queue``
  (``put``/``get``) and ``multiprocessing.Pipe`` (``send_bytes``/``recv_bytes``, its fastest
  form). The writer builds each payload (``i.to_bytes(8, "little")`` plus padding) in every
  system alike.
* large messages (1 MiB, 16 MiB numpy uint8 arrays): GB/s from the writer's existing array to
  a numpy array in the reader (the array's creation is not timed; the writer cycles through a
  few preallocated arrays and stamps each with its sequence number). ``easycore`` pickles with
  protocol 5 and sends ``[pickle bytes, *PickleBuffer.raw()]`` as parts; the reader calls
  ``pickle.loads(parts[0], buffers=parts[1:])``. ``multiprocessing.Queue`` pickles the array
  (in-band). Both are bounded to the same 64 MiB in flight, and both first pass a few
  untimed warm-up arrays (steady state: easycore's pooled segments exist, multiprocessing's
  feeder thread runs). The physical reference is one
  thread's memcpy bandwidth (``np.copyto`` of 256 MiB, best of a few) measured in the same run.
* latency: one 8-byte item's round trip between two processes (ping-pong over two queues),
  median and p99 in microseconds, vs ``multiprocessing.Pipe`` (and ``multiprocessing.Queue``
  for information).

Figures on a busy machine are noisy; each figure is the median over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import multiprocessing as mp
import os
import pickle
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from easycore import _core
from easycore.bench.report import memcpy_gbps

KIB = 1 << 10
MIB = 1 << 20
BATCH = 64
RING_BYTES = 64 * MIB
BIG_RING_BYTES = 256 * MIB
"""Ring of the informational variant in which 16 MiB messages still go inline."""
PAGE = 4096
RECV_TIMEOUT = 60.0
"""Seconds the reader waits for any one message before declaring the writer hung."""

TARGETS = {
    "small_vs_mpqueue": 10.0,
    "small_vs_pipe": 3.0,
    "large_vs_mpqueue": 4.0,
    "large_vs_memcpy": 0.5,
}


class BenchFailure(RuntimeError):
    """A measurement produced a wrong result, or a process misbehaved."""


# --------------------------------------------------------------------------------------------
# payloads and checks shared by all systems


def small_payload(i: int, size: int, pad: bytes) -> bytes:
    """The ``i``-th small message: ``i`` as 8 little-endian bytes, padded to ``size``."""
    return i.to_bytes(8, "little") + pad if size > 8 else i.to_bytes(8, "little")


def base_pattern(size: int) -> np.ndarray:
    """The content of every large array (before its 8-byte sequence stamp)."""
    return (np.arange(size, dtype=np.uint32) % 251).astype(np.uint8)


def page_sample_sum(a: np.ndarray) -> int:
    """Sum of one byte per 4 KiB page, past the stamp: touches every page of ``a``."""
    return int(a[64::PAGE].sum(dtype=np.uint64))


# --------------------------------------------------------------------------------------------
# writer processes (children)


def _child_setup() -> None:
    """Children ignore Ctrl-C: the parent stops them (a terminal sends SIGINT to all)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _writer_small(system: str, chan: Any, n: int, size: int, ready: Any, go: Any) -> None:
    """Sends ``n`` small messages over ``chan`` with ``system``'s API."""
    _child_setup()
    pad = b"\xab" * (size - 8)
    ready.set()
    go.wait()
    if system == "ec_single":
        for i in range(n):
            chan.put(i, 0, small_payload(i, size, pad))
    elif system == "ec_batch":
        for j in range(0, n, BATCH):
            chan.put_many(
                [(i, 0, small_payload(i, size, pad)) for i in range(j, min(j + BATCH, n))]
            )
    elif system == "mp_queue":
        for i in range(n):
            chan.put(small_payload(i, size, pad))
        chan.close()
        chan.join_thread()
    elif system == "mp_pipe":
        for i in range(n):
            chan.send_bytes(small_payload(i, size, pad))
        chan.close()
    else:  # pragma: no cover - programming error
        raise ValueError(system)


def _writer_large(
    system: str, chan: Any, n: int, size: int, in_flight: int, ready: Any, go: Any
) -> None:
    """Sends ``n`` arrays of ``size`` bytes, cycling through ``in_flight + 1`` buffers."""
    _child_setup()
    base = base_pattern(size)
    arrays = [base.copy() for _ in range(in_flight + 1)]
    ready.set()
    go.wait()
    for i in range(n):
        a = arrays[i % len(arrays)]
        a[:8].view(np.uint64)[0] = i
        if system != "mp_queue":
            bufs: list[pickle.PickleBuffer] = []
            head = pickle.dumps(a, protocol=5, buffer_callback=bufs.append)
            chan.put(i, 0, [head, *[b.raw() for b in bufs]])
        else:
            chan.put(a)
    if system == "mp_queue":
        chan.close()
        chan.join_thread()


def _echo(system: str, chan: Any, ready: Any) -> None:
    """Echoes every message back until told to stop (the other end of the ping-pong)."""
    _child_setup()
    ready.set()
    if system == "ec":
        q_in, q_out = chan
        while True:
            seq, kind, parts = q_in.get()
            if kind == 1:
                return
            q_out.put(seq, 0, parts[0])
    elif system == "mp_pipe":
        while True:
            msg = chan.recv_bytes()
            if not msg:
                return
            chan.send_bytes(msg)
    elif system == "mp_queue":
        q_in, q_out = chan
        while True:
            msg = q_in.get()
            if msg is None:
                return
            q_out.put(msg)


# --------------------------------------------------------------------------------------------
# process handling


@dataclass
class Ctx:
    """Run-wide settings and bookkeeping."""

    mpctx: Any
    repeats: int
    target_s: float
    child_pids: set[int] = field(default_factory=set)
    queues: list[Any] = field(default_factory=list)

    def spawn(self, target: Callable[..., None], *args: Any) -> Any:
        """Starts a daemon child running ``target(*args)``."""
        p = self.mpctx.Process(target=target, args=args, daemon=True)
        p.start()
        self.child_pids.add(p.pid)
        return p

    def new_queue(self, **kw: Any) -> Any:
        """An easycore queue, remembered so that it is closed and unlinked at the end."""
        q = _core.Queue(**kw)
        self.queues.append(q)
        return q

    def release(self, q: Any) -> None:
        """Closes and unlinks an easycore queue now."""
        q.close()
        q.unlink()
        if q in self.queues:
            self.queues.remove(q)


def _finish(p: Any, what: str) -> None:
    """Joins a child; a non-zero exit or a hang is a failure (the child is killed first)."""
    p.join(timeout=RECV_TIMEOUT)
    if p.is_alive():
        p.kill()
        p.join()
        raise BenchFailure(f"{what}: writer process {p.pid} did not exit")
    if p.exitcode != 0:
        raise BenchFailure(f"{what}: writer process {p.pid} exited with {p.exitcode}")


def _wait_ready(p: Any, ready: Any, what: str) -> None:
    if not ready.wait(RECV_TIMEOUT):
        p.kill()
        raise BenchFailure(f"{what}: child process did not start")


# --------------------------------------------------------------------------------------------
# small messages


def run_small_once(ctx: Ctx, system: str, size: int, n: int) -> float:
    """One measurement; returns messages per second after checking every message."""
    what = f"small {system} {size} B x {n}"
    ready, go = ctx.mpctx.Event(), ctx.mpctx.Event()
    q: Any = None
    if system in ("ec_single", "ec_batch"):
        q = ctx.new_queue(capacity_bytes=RING_BYTES)
        chan_w = chan_r = q
    elif system == "mp_queue":
        chan_w = chan_r = ctx.mpctx.Queue()
    else:
        chan_r, chan_w = ctx.mpctx.Pipe(duplex=False)
    p = ctx.spawn(_writer_small, system, chan_w, n, size, ready, go)
    try:
        if system == "mp_pipe":
            chan_w.close()  # the reader's copy of the write end
        _wait_ready(p, ready, what)
        total = bad_len = count = 0
        t0 = time.perf_counter()
        go.set()
        if system == "ec_single":
            while count < n:
                _seq, _kind, parts = q.get(timeout=RECV_TIMEOUT)
                m = parts[0]
                total += int.from_bytes(m[:8], "little")
                bad_len += len(m) != size
                count += 1
        elif system == "ec_batch":
            while count < n:
                for _seq, _kind, parts in q.get_many(BATCH, timeout=RECV_TIMEOUT):
                    m = parts[0]
                    total += int.from_bytes(m[:8], "little")
                    bad_len += len(m) != size
                    count += 1
        elif system == "mp_queue":
            while count < n:
                m = chan_r.get(timeout=RECV_TIMEOUT)
                total += int.from_bytes(m[:8], "little")
                bad_len += len(m) != size
                count += 1
        else:
            while count < n:
                if not chan_r.poll(RECV_TIMEOUT):
                    raise BenchFailure(f"{what}: timed out waiting for a message")
                m = chan_r.recv_bytes()
                total += int.from_bytes(m[:8], "little")
                bad_len += len(m) != size
                count += 1
        elapsed = time.perf_counter() - t0
        _finish(p, what)
    finally:
        if p.is_alive():
            p.kill()
            p.join()
        if q is not None:
            ctx.release(q)
        if system == "mp_pipe":
            chan_r.close()
    if count != n or total != n * (n - 1) // 2 or bad_len:
        raise BenchFailure(
            f"{what}: WRONG: got {count} messages (expected {n}), checksum {total} "
            f"(expected {n * (n - 1) // 2}), {bad_len} of wrong length"
        )
    return n / elapsed


# --------------------------------------------------------------------------------------------
# large messages


@dataclass
class LargeResult:
    """One large-message measurement."""

    gbps: float
    path: str


def run_large_once(ctx: Ctx, system: str, size: int, n: int) -> LargeResult:
    """One measurement; returns GB/s (1e9 bytes/s) after checking every array."""
    what = f"large {system} {size >> 20} MiB x {n}"
    ready, go = ctx.mpctx.Event(), ctx.mpctx.Event()
    in_flight = max(2, RING_BYTES // size)
    # Untimed warm-up messages first: steady-state throughput, not the first messages' set-up
    # (easycore makes its pooled segments then; multiprocessing starts its feeder thread).
    warm = in_flight + 4
    q: Any = None
    if system == "ec":
        q = ctx.new_queue(capacity_bytes=RING_BYTES)
        chan = q
    elif system == "ec_inline":
        # Pooling off and a ring large enough: every array inline, copied out by the reader.
        q = ctx.new_queue(capacity_bytes=BIG_RING_BYTES, pool_min=1 << 62)
        chan = q
    else:
        chan = ctx.mpctx.Queue(maxsize=in_flight)
    base = base_pattern(size)
    expected_sample = page_sample_sum(base)
    p = ctx.spawn(_writer_large, system, chan, warm + n, size, in_flight, ready, go)
    paths: set[str] = set()
    first = last = None
    bad = 0
    try:
        _wait_ready(p, ready, what)
        t0 = time.perf_counter()
        go.set()
        for i in range(warm + n):
            if i == warm:
                t0 = time.perf_counter()
            if q is not None:
                _seq, _kind, parts = q.get(timeout=RECV_TIMEOUT)
                if i == 0 or i == warm + n - 1:
                    paths.update(type(b).__name__ for b in parts[1:])
                a = pickle.loads(parts[0], buffers=parts[1:])
            else:
                a = chan.get(timeout=RECV_TIMEOUT)
            if (
                not isinstance(a, np.ndarray)
                or a.size != size
                or int(a[:8].view(np.uint64)[0]) != i
                or page_sample_sum(a) != expected_sample
            ):
                bad += 1
            if i == 0:
                first = a
            last = a
        elapsed = time.perf_counter() - t0
        _finish(p, what)
    finally:
        if p.is_alive():
            p.kill()
            p.join()
        if q is not None:
            ctx.release(q)
    for a in (first, last):
        if a is None or not np.array_equal(a[8:], base[8:]):
            bad += 1
    if bad:
        raise BenchFailure(f"{what}: WRONG: {bad} arrays with wrong content")
    if q is not None:
        path = ", ".join(sorted(paths)) or "?"
        path = {
            "bytearray": "inline ring, 1 copy out",
            "ShmBuffer": "pooled segment, zero-copy",
        }.get(path, path)
    else:
        path = "pickled in-band"
    return LargeResult(n * size / elapsed / 1e9, path)


# --------------------------------------------------------------------------------------------
# latency


def run_latency(ctx: Ctx, system: str, n: int, warmup: int) -> list[float]:
    """Round-trip times (µs) of ``n`` ping-pongs of an 8-byte item, after ``warmup`` ones."""
    what = f"latency {system}"
    ready = ctx.mpctx.Event()
    qs: list[Any] = []
    if system == "ec":
        qs = [ctx.new_queue(capacity_bytes=MIB, max_messages=64) for _ in range(2)]
        ping, pong = qs
        p = ctx.spawn(_echo, system, (ping, pong), ready)
    elif system == "mp_queue":
        ping, pong = ctx.mpctx.Queue(), ctx.mpctx.Queue()
        p = ctx.spawn(_echo, system, (ping, pong), ready)
    else:
        mine, theirs = ctx.mpctx.Pipe(duplex=True)
        p = ctx.spawn(_echo, system, theirs, ready)
        theirs.close()
    times: list[float] = []
    bad = 0
    clock = time.perf_counter_ns
    try:
        _wait_ready(p, ready, what)
        for k in range(warmup + n):
            msg = k.to_bytes(8, "little")
            t0 = clock()
            if system == "ec":
                ping.put(k, 0, msg)
                _seq, _kind, parts = pong.get(timeout=RECV_TIMEOUT)
                back = parts[0]
            elif system == "mp_queue":
                ping.put(msg)
                back = pong.get(timeout=RECV_TIMEOUT)
            else:
                mine.send_bytes(msg)
                if not mine.poll(RECV_TIMEOUT):
                    raise BenchFailure(f"{what}: no reply")
                back = mine.recv_bytes()
            t1 = clock()
            bad += back != msg
            if k >= warmup:
                times.append((t1 - t0) / 1e3)
        if system == "ec":
            ping.put(0, 1, b"")
        elif system == "mp_queue":
            ping.put(None)
        else:
            mine.send_bytes(b"")
        _finish(p, what)
    finally:
        if p.is_alive():
            p.kill()
            p.join()
        for q in qs:
            ctx.release(q)
        if system == "mp_pipe":
            mine.close()
    if bad or len(times) != n:
        raise BenchFailure(f"{what}: WRONG: {bad} replies differ from what was sent")
    return times


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


# --------------------------------------------------------------------------------------------
# the run


SMALL_SYSTEMS = {
    "ec_single": "easycore Queue put/get (1 msg per call)",
    "ec_batch": f"easycore Queue put_many/get_many ({BATCH} per call)",
    "mp_queue": "multiprocessing.Queue put/get",
    "mp_pipe": "multiprocessing.Pipe send_bytes/recv_bytes",
}
LARGE_SYSTEMS = {
    "ec": "easycore Queue (pickle 5, out-of-band parts)",
    "mp_queue": "multiprocessing.Queue (pickle)",
    "ec_inline": "easycore Queue, no pooling (info: 256 MiB ring)",
}
LAT_SYSTEMS = {
    "ec": "easycore Queue ping-pong (2 queues)",
    "mp_pipe": "multiprocessing.Pipe ping-pong",
    "mp_queue": "multiprocessing.Queue ping-pong (info)",
}


def calibrated(ctx: Ctx, once: Callable[[int], float], probe: int, cap: int) -> list[float]:
    """Runs a probe of ``probe`` items, sizes the run to about ``ctx.target_s`` seconds, then
    measures ``ctx.repeats`` times; returns the rates."""
    rate = once(probe)
    n = int(min(cap, max(probe, rate * ctx.target_s)))
    return [once(n) for _ in range(ctx.repeats)]


def machine_info() -> dict[str, Any]:
    """Cores, Python, numpy and the date, for the report."""
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def progress(msg: str) -> None:
    """One progress line on stderr, overwritten by the next."""
    sys.stderr.write(f"\r\033[K  {msg}")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs every measurement and returns the results as a JSON-able dict."""
    ctx = Ctx(
        mpctx=mp.get_context(args.start_method),
        repeats=args.repeats,
        target_s=0.15 if args.quick else 0.6,
    )
    out: dict[str, Any] = {
        "machine": machine_info(),
        "start_method": args.start_method,
        "repeats": args.repeats,
        "small": {},
        "large": {},
        "latency": {},
    }
    try:
        for size in (8, KIB):
            for sysname in SMALL_SYSTEMS:
                progress(f"small messages {size} B: {sysname}")
                cap = 2_000_000 if sysname.startswith("ec") else 400_000
                rates = calibrated(
                    ctx, lambda n, s=sysname, z=size: run_small_once(ctx, s, z, n), 5000, cap
                )
                out["small"].setdefault(str(size), {})[sysname] = {
                    "msgs_per_s": statistics.median(rates),
                    "samples": rates,
                }
        progress("memcpy")
        out["memcpy_gbps"] = memcpy_gbps(repeats=3 if args.quick else 5)
        for size in (MIB, 16 * MIB):
            for sysname in LARGE_SYSTEMS:
                progress(f"large messages {size >> 20} MiB: {sysname}")
                info: dict[str, str] = {}

                def once(n: int, s: str = sysname, z: int = size, info: dict = info) -> float:
                    r = run_large_once(ctx, s, z, n)
                    info["path"] = r.path
                    return r.gbps * 1e9 / z  # arrays per second, for calibration

                probe = 8 if size > MIB else 32
                gbps = [r * size / 1e9 for r in calibrated(ctx, once, probe, 4000)]
                out["large"].setdefault(str(size), {})[sysname] = {
                    "gbps": statistics.median(gbps),
                    "samples": gbps,
                    "path": info["path"],
                }
        n_lat = 500 if args.quick else 2000
        for sysname in LAT_SYSTEMS:
            progress(f"round-trip latency: {sysname}")
            times = run_latency(ctx, sysname, n_lat, warmup=200)
            out["latency"][sysname] = {
                "n": n_lat,
                "median_us": statistics.median(times),
                "p99_us": percentile(times, 99),
                "min_us": min(times),
            }
    finally:
        progress("")
        sys.stderr.write("\r\033[K")
        for q in list(ctx.queues):
            ctx.release(q)
        out["leaked_segments"] = leaked_segments(ctx.child_pids | {os.getpid()})
    return out


def leaked_segments(pids: set[int]) -> list[str]:
    """``/dev/shm/ec.<pid>-<nonce>.*`` segments left by this run (they are removed, and
    reported). Liveness tokens (``.live``) are not segments: those of exited children are
    removed by the sweep."""
    prefix = _core.SHM_PREFIX
    _core.sweep_stale_segments()
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    mine = tuple(f"{prefix}{pid}{sep}" for pid in pids for sep in ".-")
    leaked = [n for n in names if n.startswith(mine) and not n.endswith((".live", ".tmp"))]
    for n in leaked:
        try:
            os.unlink(os.path.join("/dev/shm", n))
        except OSError:
            pass
    return leaked


# --------------------------------------------------------------------------------------------
# report


def _ratio_line(name: str, ours: float, theirs: float, target: float, unit: str = "x") -> str:
    r = ours / theirs if theirs else float("inf")
    ok = "MET" if r >= target else "NOT MET"
    return f"  {name:<58} {r:7.2f}{unit}  (target >= {target:g}{unit})  {ok}"


def report(out: dict[str, Any]) -> tuple[str, bool]:
    """The printed table, and whether every target was met."""
    m = out["machine"]
    lines = [
        "easycore queue benchmark: writer child process -> reader (this) process",
        f"machine: {m['cpus']} CPUs ({m['cpus_usable']} usable), Python {m['python']}, "
        f"numpy {m['numpy']}, {m['platform']}, {m['date']}, load {m['loadavg']}",
        f"start method {out['start_method']}; each figure is the median of {out['repeats']} run(s)",
        "",
        f"{'small messages (messages/s)':<52} {'8 B':>12} {'1 KiB':>12}",
    ]
    small = out["small"]
    for key, label in SMALL_SYSTEMS.items():
        vals = [small[str(s)][key]["msgs_per_s"] for s in (8, KIB)]
        lines.append(f"  {label:<50} {vals[0]:>12,.0f} {vals[1]:>12,.0f}")
    lines += ["", f"{'large numpy arrays (GB/s)':<52} {'1 MiB':>12} {'16 MiB':>12}  path"]
    large = out["large"]
    for key, label in LARGE_SYSTEMS.items():
        cells = [large[str(s)].get(key) for s in (MIB, 16 * MIB)]
        vals = "".join(f" {c['gbps']:>12.2f}" if c else f" {'-':>12}" for c in cells)
        paths = " / ".join(c["path"] for c in cells if c)
        lines.append(f"  {label:<50}{vals}  {paths}")
    lines.append(
        f"  {'memcpy, 1 thread (np.copyto 256 MiB, best)':<50} "
        f"{out['memcpy_gbps']:>12.2f} {out['memcpy_gbps']:>12.2f}"
    )
    lat = out["latency"]
    lines += ["", f"{'round-trip latency, 8 B (microseconds)':<52} {'median':>12} {'p99':>12}"]
    for key, label in LAT_SYSTEMS.items():
        lines.append(f"  {label:<50} {lat[key]['median_us']:>12.1f} {lat[key]['p99_us']:>12.1f}")

    lines += ["", "targets:"]
    checks: list[tuple[str, bool]] = []

    def check(name: str, ours: float, theirs: float, target: float) -> None:
        line = _ratio_line(name, ours, theirs, target)
        checks.append((name, ours / theirs >= target))
        lines.append(line)

    for s in (8, KIB):
        d = small[str(s)]
        tag = "8 B" if s == 8 else "1 KiB"
        for key, how in (("ec_single", "per message"), ("ec_batch", f"batched {BATCH}")):
            ours = d[key]["msgs_per_s"]
            check(
                f"small {tag}, {how} vs multiprocessing.Queue",
                ours,
                d["mp_queue"]["msgs_per_s"],
                TARGETS["small_vs_mpqueue"],
            )
            check(
                f"small {tag}, {how} vs Pipe",
                ours,
                d["mp_pipe"]["msgs_per_s"],
                TARGETS["small_vs_pipe"],
            )
    for s in (MIB, 16 * MIB):
        d = large[str(s)]
        tag = f"{s >> 20} MiB"
        check(
            f"large {tag} vs multiprocessing.Queue",
            d["ec"]["gbps"],
            d["mp_queue"]["gbps"],
            TARGETS["large_vs_mpqueue"],
        )
        check(
            f"large {tag} vs memcpy",
            d["ec"]["gbps"],
            out["memcpy_gbps"],
            TARGETS["large_vs_memcpy"],
        )
    ours, pipe = lat["ec"]["median_us"], lat["mp_pipe"]["median_us"]
    ok = ours <= pipe
    checks.append(("latency median <= Pipe", ok))
    lines.append(
        f"  {'latency median vs Pipe (lower is better)':<58} {ours / pipe:7.2f}x  "
        f"(target <= 1x)  {'MET' if ok else 'NOT MET'}"
    )
    out["targets"] = {name: ok for name, ok in checks}
    if out["leaked_segments"]:
        lines.append(f"\nLEAKED shared-memory segments (removed): {out['leaked_segments']}")
    else:
        lines.append("\nno process or /dev/shm segment left behind")
    return "\n".join(lines), all(ok for _, ok in checks)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (1 on a wrong result or a leak)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (well under a minute)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--repeats", type=int, default=None, help="runs per figure (median shown)")
    ap.add_argument(
        "--start-method",
        default="fork" if sys.platform.startswith("linux") else "spawn",
        choices=mp.get_all_start_methods(),
    )
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    t0 = time.perf_counter()
    try:
        out = run(args)
    except BenchFailure as e:
        print(f"\nFAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    text, all_met = report(out)
    out["wall_s"] = time.perf_counter() - t0
    print(text)
    print(f"all targets met: {all_met}   (wall time {out['wall_s']:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    leftover = [c for c in mp.active_children()]
    if leftover:
        print(f"LEFTOVER child processes: {[c.pid for c in leftover]}", file=sys.stderr)
    return 1 if out["leaked_segments"] or leftover else 0


if __name__ == "__main__":
    sys.exit(main())
