"""The runner benchmark's command line: ``python -m easycore.bench`` / ``easycore-bench``.

Examples::

    python -m easycore.bench --quick
    python -m easycore.bench --workloads tiny_ordered,numpy_16mib --systems easycore,reference
    python -m easycore.bench --devices cpu,cpu,cuda:0 --json out.json --plot out.png
    python -m easycore.bench --sweep          # cost per byte from 4 KiB to 64 MiB results
    python -m easycore.bench --runner mypkg.jobs:MyRunner --data mypkg.jobs:make_data
    python -m easycore.bench --backend ray     # Ray backend vs local runner vs ActorPool

See ``docs/bench.md`` for what every number means.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

try:
    import easycore.bench.report as report
    from easycore.bench.report import Row
    from easycore.bench.systems import SYSTEMS, CellSpec, Job, System, run_cell
    from easycore.bench.workloads import SWEEP, WORKLOADS, Workload, torch_available
except ModuleNotFoundError as e:  # the workloads' arrays need numpy: an extra
    if e.name != "numpy":
        raise
    raise SystemExit(
        "easycore-bench needs numpy, which is not installed: pip install 'easycore[bench]'"
    ) from None

DEFAULT_USER_SYSTEMS = ("easycore", "reference")


class Progress:
    """One status line on stderr (rewritten in place on a terminal, plain lines otherwise)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.what = ""

    def start(self, what: str) -> None:
        """A new (workload, system) measurement begins."""
        self.done += 1
        self.what = what
        if self.enabled and not self.tty:
            print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)
        self.tick(0.0)

    def tick(self, elapsed: float) -> None:
        """Refreshes the line with the time spent on the current measurement."""
        if self.enabled and self.tty:
            line = f"[{self.done}/{self.total}] {self.what}  {elapsed:5.1f} s"
            sys.stderr.write("\r\033[K" + line[:150])
            sys.stderr.flush()

    def clear(self) -> None:
        """Removes the line."""
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def resolve(path: str, option: str = "--runner") -> Any:
    """``"package.module:attr"`` -> the object (the current directory is importable).

    Raises:
        SystemExit: with a one-line message naming ``option`` when the module cannot be
            imported or has no such attribute (errors raised by the module's own code while
            it is imported, other than ImportError, propagate with their traceback).
    """
    mod, sep, attr = path.partition(":")
    if not sep or not mod or not attr:
        raise SystemExit(f"easycore-bench: {option} expects package.module:name, got {path!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as e:
        raise SystemExit(
            f"easycore-bench: {option} {path}: cannot import module {mod!r} ({e}); "
            "it is looked up on sys.path and in the current directory"
        ) from None
    for i, part in enumerate(attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = ".".join([mod, *attr.split(".")[:i]])
            raise SystemExit(
                f"easycore-bench: {option} {path}: {where} has no attribute {part!r}"
            ) from None
    return obj


def runner_flavour(cls: type) -> tuple[bool, bool]:
    """``(ordered, torch)`` of a user's runner class, from its base classes' names."""
    names = [c.__name__ for c in cls.__mro__]
    modules = [c.__module__ for c in cls.__mro__]
    if "OrderedRunner" in names:
        ordered = True
    elif "UnorderedRunner" in names:
        ordered = False
    else:
        raise SystemExit(f"{cls.__name__} must subclass UnorderedRunner or OrderedRunner")
    return ordered, any(m.startswith("easycore.torch") for m in modules)


def user_workload(runner_cls: type, make_data: Callable[[], Iterable[Any]]) -> Workload:
    """A workload running the user's hooks on the user's data.

    There is no expected value: every system's result is compared with the reference
    runner's (by content digest).
    """
    ordered, _ = runner_flavour(runner_cls)

    def data(n: int) -> Iterable[Any]:
        return make_data() if n < 0 else itertools.islice(make_data(), n)

    return Workload(
        name="user",
        title=f"your runner {runner_cls.__module__}.{runner_cls.__qualname__} "
        f"({'ordered' if ordered else 'unordered'})",
        hooks=runner_cls,
        ordered=ordered,
        unit="items/s",
        items=-1,
        quick_items=-1,
        make_data=data,
        expected=None,
        verify_by_fingerprint=True,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(
        prog="easycore-bench",
        description="Benchmark easycore's runners side by side with the pure-Python reference "
        "runner, multiprocessing.Pool, ProcessPoolExecutor and torch's DataLoader; every "
        "result is verified.",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    ap.add_argument("--workers", type=int, default=2, help="CPU producers (default 2)")
    ap.add_argument("--devices", help="comma-separated devices, e.g. cpu,cpu,cuda:0")
    ap.add_argument("--workloads", help=f"comma-separated, from: {', '.join(WORKLOADS)}")
    ap.add_argument("--systems", help=f"comma-separated, from: {', '.join(SYSTEMS)}")
    ap.add_argument("--repeats", type=int, help="timed calls per system (default 3, quick 2)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every system of a workload this many times in turn, each time in a "
        "fresh process, each round starting one system later, and pool the repeats "
        "(default 1); on a machine whose speed drifts, each system then sees the same drift",
    )
    ap.add_argument("--items", type=int, help="items per call for every workload")
    ap.add_argument(
        "--timeout", type=float, help="seconds per system and workload (default 600, quick 60)"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="the size sweep: numpy results from 4 KiB to 64 MiB (easycore unless --systems)",
    )
    ap.add_argument("--memcpy-mib", type=int, help="memcpy reference size (default 256)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG bar chart (needs matplotlib)")
    ap.add_argument("--runner", metavar="MOD:CLASS", help="benchmark your runner subclass")
    ap.add_argument("--data", metavar="MOD:FUNC", help="with --runner: make_data() -> iterable")
    ap.add_argument("--no-progress", action="store_true", help="no progress line")
    ap.add_argument("--list", action="store_true", help="list workloads and systems, then exit")
    args = ap.parse_args(argv)
    if (args.runner is None) != (args.data is None):
        ap.error("--runner and --data go together")
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    return args


def _pick(names: str | None, known: dict[str, Any], default: Iterable[str], what: str) -> list[str]:
    if not names:
        return list(default)
    out = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in out if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return out


def plan(
    args: argparse.Namespace,
) -> tuple[list[Workload], list[str], list[str], type | None]:
    """The workloads, system keys and devices this run covers, and the user's runner."""
    devices = (
        [d.strip() for d in args.devices.split(",") if d.strip()]
        if args.devices
        else ["cpu"] * args.workers
    )
    if args.runner:
        cls = resolve(args.runner)
        if not isinstance(cls, type):
            raise SystemExit(f"--runner {args.runner} is not a class")
        workloads = [user_workload(cls, resolve(args.data, "--data"))]
        systems = _pick(args.systems, SYSTEMS, DEFAULT_USER_SYSTEMS, "systems")
        return workloads, systems, devices, cls
    if args.sweep:
        names = _pick(args.workloads, WORKLOADS, SWEEP, "workloads")
        default = ["easycore"]
    else:
        in_default = [k for k, w in WORKLOADS.items() if w.in_default_run]
        names = _pick(args.workloads, WORKLOADS, in_default, "workloads")
        default = [k for k, s in SYSTEMS.items() if s.in_default_run]
    workloads = [WORKLOADS[n] for n in names]
    systems = _pick(args.systems, SYSTEMS, default, "systems")
    return workloads, systems, devices, None


def make_job(w: Workload, devices: list[str], n: int, user_runner: type | None) -> Job:
    """The job every system runs for workload ``w``."""
    torch_flavour = w.needs_torch
    if user_runner is not None:
        torch_flavour = runner_flavour(user_runner)[1]
    return Job(
        hooks=w.hooks,
        ordered=w.ordered,
        devices=devices,
        make_data=w.make_data,
        chunksize=w.tuned_chunksize(n, len(devices)) if n > 0 else 1,
        torch_flavour=torch_flavour,
        user_runner=user_runner,
    )


def _row(w: Workload, key: str, label: str, status: str, **kw: Any) -> Row:
    return Row(w.name, key, label, w.unit, w.higher_is_better, status, **kw)


def verify_user_rows(rows: list[Row], w: Workload) -> None:
    """Compares each system's result digest with the reference runner's."""
    ref = next((r for r in rows if r.system == "reference" and r.status == "ok"), None)
    for r in rows:
        if r is ref or r.status != "ok":
            continue
        if ref is None:
            r.detail = "unverified (no reference result to compare with)"
        elif r.fingerprint != ref.fingerprint:
            if w.ordered:
                r.status, r.detail = "wrong", "result differs from the reference runner's"
            else:
                r.status = "differs"
                r.detail = (
                    "result differs from the reference runner's (an unordered runner's "
                    "result may depend on arrival order)"
                )


def run(args: argparse.Namespace) -> tuple[list[Row], list[Workload], dict[str, Any], bool]:
    """Runs the plan; returns the rows, the workloads, the settings and whether it was
    interrupted."""
    workloads, system_keys, devices, user_runner = plan(args)
    repeats = args.repeats or (2 if args.quick else 3)
    rounds = args.rounds
    if rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {rounds}")
    timeout = args.timeout or (60.0 if args.quick else 600.0)
    memcpy_mib = args.memcpy_mib or (128 if args.quick else 256)
    settings: dict[str, Any] = {
        "devices": devices,
        "repeats": repeats,
        "rounds": rounds,
        "timeout": timeout,
        "quick": args.quick,
        "workloads": [w.name for w in workloads],
        "systems": system_keys,
        "memcpy_mib": memcpy_mib,
        "memcpy_gbps": report.memcpy_gbps(memcpy_mib << 20),
        "runner": args.runner,
        "data": args.data,
    }
    progress = Progress(rounds * len(workloads) * len(system_keys), enabled=not args.no_progress)
    rows: list[Row] = []
    interrupted = False
    for w in workloads:
        n = args.items if args.items else (w.quick_items if args.quick else w.items)
        if w.startup and args.items:
            n = min(n, 100)
        job = make_job(w, devices, n, user_runner)
        by_key: dict[str, Row] = {}
        for key, rnd in turns(system_keys, rounds):
            try:
                row = _measure(w, key, job, n, repeats, devices, timeout, progress, interrupted)
            except KeyboardInterrupt:  # outside the measurement itself: the rest is skipped
                row = _row(w, key, SYSTEMS[key].label(job), "interrupted")
            if row.status == "interrupted":
                interrupted = True
            if rnd == 0:
                by_key[key] = row
            else:
                _pool_round(by_key[key], row)
        w_rows = list(by_key.values())
        if w.verify_by_fingerprint:
            verify_user_rows(w_rows, w)
        if w.unit == "GB/s":
            mc = settings["memcpy_gbps"]
            w_rows.append(
                _row(w, "memcpy", "memcpy, 1 thread (np.copyto)", "reference", samples=[mc])
            )
        rows.extend(w_rows)
    progress.clear()
    report.add_speedups(rows)
    return rows, workloads, settings, interrupted


def turns(keys: list[str], rounds: int) -> list[tuple[str, int]]:
    """The order of a workload's measurements: ``(system, round)``, every system once a
    round, each round starting one system later (A, B, C, then B, C, A, …), so that over
    ``len(keys)`` rounds each system runs once in each place (the first of a run can find the
    machine otherwise than the last)."""
    k = len(keys)
    return [(keys[(r + i) % k], r) for r in range(rounds) for i in range(k)]


def _pool_round(row: Row, more: Row) -> None:
    """Adds a later round's measurement of the same system to ``row``: its repeats are
    pooled; a failure in any round is the row's status."""
    if row.status == "ok" and more.status != "ok":
        row.status, row.detail = more.status, more.detail
    elif row.status == "ok" and more.fingerprint != row.fingerprint:
        row.status, row.detail = "wrong", "result differs between rounds"
    row.samples += more.samples
    row.seconds += more.seconds
    if more.wall_s is not None:
        row.wall_s = (row.wall_s or 0.0) + more.wall_s


def _measure(
    w: Workload,
    key: str,
    job: Any,
    n: int,
    repeats: int,
    devices: list[str],
    timeout: float,
    progress: Progress,
    interrupted: bool,
) -> Row:
    """One (workload, system) measurement in its own process, as a row."""
    system: System = SYSTEMS[key]
    label = system.label(job)
    progress.start(f"{w.name} / {key}")
    if interrupted:
        return _row(w, key, label, "interrupted")
    if w.needs_torch and not torch_available():
        return _row(w, key, label, "skipped", detail="torch is not installed")
    why = system.cannot_run(job)
    if why is not None:
        return _row(w, key, label, "unavailable", detail=why)
    spec = CellSpec(
        system=system,
        workload=w,
        job=job,
        items=n,
        repeats=repeats,
        warmup_items=_warmup_items(n, len(devices)),
    )
    try:
        out = run_cell(spec, timeout, tick=progress.tick)
    except KeyboardInterrupt:
        return _row(w, key, label, "interrupted")
    return _row(
        w,
        key,
        label,
        out["status"],
        detail=out.get("detail", ""),
        samples=out.get("samples", []),
        seconds=out.get("seconds", []),
        items=out.get("items"),
        fingerprint=out.get("fingerprint"),
        wall_s=out.get("wall_s"),
    )


def _warmup_items(n: int, workers: int) -> int:
    """Items of the untimed first call on a fresh system (0: none)."""
    if n < 0:
        return 4 * workers
    return min(n, max(4 * workers, n // 20, 16))


def workload_info(workloads: list[Workload], rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Per workload: title, unit, direction and items per call, for the report."""
    info: dict[str, dict[str, Any]] = {}
    for w in workloads:
        items = next((r.items for r in rows if r.workload == w.name and r.items), None)
        info[w.name] = {
            "title": w.title,
            "unit": w.unit,
            "higher_is_better": w.higher_is_better,
            "ordered": w.ordered,
            "items": items,
            "item_bytes": w.item_bytes,
        }
    return info


def describe(system: System) -> str:
    """A system's one-line description for ``--list``: its ``description``, else the first
    line of its class docstring without reST markup."""
    if system.description:
        return system.description
    doc = (type(system).__doc__ or "").strip().splitlines()
    line = doc[0] if doc else ""
    return re.sub(r":\w+:`([^`]*)`", r"\1", line).replace("``", "")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _sigterm_as_ctrl_c() -> Any:
    """Makes SIGTERM end the run as Ctrl-C does (the measurement in progress is stopped, the
    table of what was measured printed), where SIGTERM has its default disposition and this
    is the main thread; returns the disposition to restore, or None. A run stopped by
    ``timeout`` or a batch scheduler printed nothing: the tables come at the end."""
    try:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread
        return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m easycore.bench`` and ``easycore-bench``.

    Returns:
        0 when every result was verified, 1 when a system was wrong, failed or timed out,
        130 when interrupted (Ctrl-C, or SIGTERM: ``timeout``, a batch scheduler's notice);
        the table is printed in every case.
    """
    argv = sys.argv[1:] if argv is None else argv
    if "--backend" in argv or any(a.startswith("--backend=") for a in argv):
        import easycore.bench.ray_bench as ray_bench  # the Ray backend's own comparison

        return ray_bench.main(argv)
    args = parse_args(argv)
    if args.list:
        for w in WORKLOADS.values():
            if w.in_default_run:
                note = ""
            elif w.name in SWEEP:
                note = " (only when named, or --sweep)"
            else:
                note = " (only when named)"
            print(f"workload {w.name:<16} {w.unit:<10} {w.title}{note}")
        for key, s in SYSTEMS.items():
            note = "" if s.in_default_run else " (only when named in --systems)"
            print(f"system   {key:<20} {describe(s)}{note}")
        return 0
    t0 = time.perf_counter()
    previous = _sigterm_as_ctrl_c()
    try:
        rows, workloads, settings, interrupted = run(args)
    except KeyboardInterrupt:  # before any measurement started
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    settings["wall_s"] = time.perf_counter() - t0
    machine = report.machine_info()
    info = workload_info(workloads, rows)
    print(report.format_table(rows, info, machine, settings))
    if args.sweep:
        print(report.format_sweep(rows, info, settings))
    if interrupted:
        print("interrupted: the table shows what was measured before Ctrl-C (or SIGTERM)")
    if args.json:
        report.write_json(args.json, report.to_json(rows, info, machine, settings))
    if args.plot:
        why = report.write_plot(args.plot, rows, info)
        if why:
            print(f"--plot: {why}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if any(r.status in report.FAILED for r in rows) else 0
