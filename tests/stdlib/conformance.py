"""CPython's own process-pool test suites, run against easycore's ``Pool`` and ``PoolExecutor``.

The tests come from the running interpreter's own ``test`` package (nothing is vendored):
``test.test_concurrent_futures`` (the ``ProcessPoolExecutor`` test classes) and
``test._test_multiprocessing`` (the ``Pool`` test classes, for the process type). A thin
adapter puts easycore in place of the stdlib pool and maps the constructor's arguments
(``mp_context=`` / ``context=`` to ``start_method=``); nothing else is changed. Each test runs
in a fresh interpreter under a time limit, so a test that hangs is counted as a hang and the
run goes on.

Usage::

    python tests/stdlib/conformance.py                         # both suites, fork
    python tests/stdlib/conformance.py --suite futures --method spawn --stdlib
    python tests/stdlib/conformance.py --json out.json --list-failures

``--stdlib`` runs the same selection against the stdlib's own pools (the reference: they pass
every selected test). The counts per suite, version and start method are in ``docs/pool.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import unittest
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _start_method(ctx: Any) -> str | None:
    return None if ctx is None else ctx.get_start_method()


def _patch_futures() -> None:
    """Puts easycore's PoolExecutor where the futures tests take ProcessPoolExecutor."""
    import concurrent.futures as cf

    from easycore.parallel import PoolExecutor

    class AdaptedExecutor(PoolExecutor):
        def __init__(
            self,
            max_workers: int | None = None,
            mp_context: Any = None,
            initializer: Any = None,
            initargs: tuple[Any, ...] = (),
            **kwargs: Any,
        ) -> None:
            super().__init__(
                max_workers,
                initializer,
                initargs,
                start_method=_start_method(mp_context),
                **kwargs,
            )

    cf.ProcessPoolExecutor = AdaptedExecutor  # type: ignore[misc, assignment]
    from test.test_concurrent_futures import util

    for mixin in (util.ProcessPoolForkMixin, util.ProcessPoolSpawnMixin):
        mixin.executor_type = AdaptedExecutor
    if hasattr(util, "ProcessPoolForkserverMixin"):
        util.ProcessPoolForkserverMixin.executor_type = AdaptedExecutor


def _patch_pool() -> None:
    """Puts easycore's Pool where the multiprocessing tests take ``multiprocessing.Pool``."""
    import multiprocessing

    from easycore.parallel import Pool

    def adapted_pool(
        processes: int | None = None,
        initializer: Any = None,
        initargs: tuple[Any, ...] = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
    ) -> Any:
        kwargs: dict[str, Any] = {}
        if maxtasksperchild is not None:
            kwargs["maxtasksperchild"] = maxtasksperchild
        method = _start_method(context) or multiprocessing.get_start_method(allow_none=True)
        return Pool(processes, initializer, initargs, start_method=method, **kwargs)

    from test import _test_multiprocessing as tm

    tm.ProcessesMixin.Pool = staticmethod(adapted_pool)
    # Some tests call multiprocessing.Pool(...) or a context's Pool(...) directly.
    import multiprocessing.context

    def context_pool(
        self: Any,
        processes: int | None = None,
        initializer: Any = None,
        initargs: tuple[Any, ...] = (),
        maxtasksperchild: int | None = None,
    ) -> Any:
        return adapted_pool(processes, initializer, initargs, maxtasksperchild, self)

    multiprocessing.context.BaseContext.Pool = context_pool  # type: ignore[method-assign]
    multiprocessing.Pool = multiprocessing.context._default_context.Pool  # type: ignore[attr-defined]


FUTURES_MODULES = [
    "test_process_pool",
    "test_shutdown",
    "test_wait",
    "test_as_completed",
    "test_init",
    "test_deadlock",
]
FUTURES_CLASS = {
    "fork": "ProcessPoolFork",
    "spawn": "ProcessPoolSpawn",
    "forkserver": "ProcessPoolForkserver",
}


def _load(suite: str, method: str, stdlib: bool) -> list[unittest.TestCase]:
    """The selected tests, with the adapter in place (unless ``stdlib``)."""
    loader = unittest.TestLoader()
    tests: list[unittest.TestCase] = []
    if suite == "futures":
        if not stdlib:
            _patch_futures()
        import importlib

        for name in FUTURES_MODULES:
            try:
                module = importlib.import_module(f"test.test_concurrent_futures.{name}")
            except ImportError:
                continue
            for attr in sorted(vars(module)):
                cls = getattr(module, attr)
                if (
                    isinstance(cls, type)
                    and issubclass(cls, unittest.TestCase)
                    and attr.startswith(FUTURES_CLASS[method])
                    and not (method == "fork" and attr.startswith(FUTURES_CLASS["forkserver"]))
                ):
                    tests.extend(_flatten(loader.loadTestsFromTestCase(cls)))
    else:
        if not stdlib:
            _patch_pool()
        # A module of its own (a file, which the workers can import: a test may send them a
        # method of its class), as CPython's test_multiprocessing_<method> modules do.
        os.environ["EASYCORE_CONFORMANCE_METHOD"] = method
        import easycore_pool_conformance as module

        for attr in sorted(vars(module)):
            cls = getattr(module, attr)
            if isinstance(cls, type) and issubclass(cls, unittest.TestCase) and "Pool" in attr:
                tests.extend(_flatten(loader.loadTestsFromTestCase(cls)))
    return tests


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            out.extend(_flatten(t))
        else:
            out.append(t)
    return out


def _run_one(suite: str, method: str, stdlib: bool, test_id: str) -> dict[str, Any]:
    """Runs one test in this interpreter (the child's side); returns its outcome."""
    tests = {t.id(): t for t in _load(suite, method, stdlib)}
    result = unittest.TestResult()
    # A suite runs the module's and the class's set-up and tear-down around the test
    # (the start method, the stdlib's dangling-process checks), as unittest would.
    unittest.TestSuite([tests[test_id]]).run(result)
    if result.errors or result.failures:
        (_, text) = (result.errors + result.failures)[0]
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return {"outcome": "fail", "why": lines[-1][:300] if lines else ""}
    if result.skipped:
        return {"outcome": "skip", "why": result.skipped[0][1][:300]}
    if result.testsRun == 0:
        return {"outcome": "skip", "why": "not run"}
    return {"outcome": "pass"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["futures", "pool", "both"], default="both")
    p.add_argument("--method", choices=["fork", "spawn", "forkserver"], default="fork")
    p.add_argument("--stdlib", action="store_true", help="run against the stdlib's own pools")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test (a hang)")
    p.add_argument("--json", help="write every test's outcome here")
    p.add_argument("--list-failures", action="store_true")
    p.add_argument("-k", dest="keyword", help="only test ids containing this")
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run_one:
        out = _run_one(args.suite, args.method, args.stdlib, args.run_one)
        print("\nCONFORMANCE-RESULT " + json.dumps(out), flush=True)
        return 0
    try:
        import test.support  # noqa: F401
    except ImportError:
        print(f"conformance.py: {sys.executable} has no 'test' package; skipped")
        return 0
    suites = ["futures", "pool"] if args.suite == "both" else [args.suite]
    report: dict[str, Any] = {"python": sys.version.split()[0], "method": args.method, "suites": {}}
    for suite in suites:
        try:
            ids = [t.id() for t in _load(suite, args.method, args.stdlib)]
        except ImportError as e:  # some builds ship only part of the test package
            print(f"{suite}: not in this interpreter's test package ({e}); skipped")
            continue
        if args.keyword:
            ids = [i for i in ids if args.keyword in i]
        outcomes: dict[str, dict[str, Any]] = {}
        start = time.monotonic()
        for test_id in ids:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--suite",
                suite,
                "--method",
                args.method,
                "--run-one",
                test_id,
            ] + (["--stdlib"] if args.stdlib else [])
            outcomes[test_id] = _run_child(cmd, args.timeout)
        counts = {
            k: sum(1 for o in outcomes.values() if o["outcome"] == k)
            for k in ("pass", "fail", "hang", "crash", "skip")
        }
        report["suites"][suite] = {
            "counts": counts,
            "tests": outcomes,
            "seconds": round(time.monotonic() - start, 1),
        }
        ran = len(ids) - counts["skip"]
        print(
            f"{suite} ({'stdlib' if args.stdlib else 'easycore'}, Python {report['python']}, "
            f"{args.method}): {counts['pass']} of {ran} passed, {counts['fail']} failed, "
            f"{counts['hang']} hung, {counts['crash']} crashed, {counts['skip']} skipped "
            f"({report['suites'][suite]['seconds']} s)",
            flush=True,
        )
        if args.list_failures:
            for test_id, o in outcomes.items():
                if o["outcome"] not in ("pass", "skip"):
                    print(f"  {o['outcome']:5} {test_id}: {o.get('why', '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _run_child(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Runs one test's interpreter in a session of its own; whatever it leaves running (or
    all of it, if it hangs) is killed with the session."""
    import signal

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"outcome": "hang", "why": f"no end within {timeout:.0f} s"}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    line = [ln for ln in out.splitlines() if ln.startswith("CONFORMANCE-RESULT ")]
    if line:
        result: dict[str, Any] = json.loads(line[-1].split(" ", 1)[1])
        return result
    tail = (err.strip().splitlines() or [""])[-1]
    return {"outcome": "crash", "why": f"rc {proc.returncode}: {tail[:300]}"}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(main())
