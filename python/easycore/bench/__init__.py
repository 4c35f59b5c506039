"""Side-by-side benchmark of easycore's runners: ``python -m easycore.bench``.

Runs built-in workloads (tiny items ordered and unordered, 1 MiB and 16 MiB numpy results,
the manual's torch predictor, start-up) on easycore's runners, the pure-Python reference
runner (:mod:`easycore.bench.reference`, the original design on ``multiprocessing.Queue``),
``multiprocessing.Pool``, ``concurrent.futures.ProcessPoolExecutor`` and torch's
``DataLoader``, verifies every result and prints a table (see ``docs/bench.md``).

Modules:

* :mod:`easycore.bench.cli` — the command line (``python -m easycore.bench``).
* :mod:`easycore.bench.workloads` — the workloads and their expected results (their hooks in
  :mod:`easycore.bench.workload_hooks`).
* :mod:`easycore.bench.systems` — every system under test by key: the interface
  (:mod:`easycore.bench.system_api`), easycore's (:mod:`easycore.bench.systems_easycore`) and
  its peers (:mod:`easycore.bench.systems_peers`).
* :mod:`easycore.bench.measurement` — the bounded measurement, one forked child a cell.
* :mod:`easycore.bench.reference` — the pure-Python reference runner.
* :mod:`easycore.bench.report` — table, JSON and PNG output.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Runs the command line (see :func:`easycore.bench.cli.main`)."""
    from easycore.bench.cli import main as _main

    return _main(argv)
