"""``python -m easycore.bench``: runs the benchmark's command line,
:func:`easycore.bench.cli.main` (also the ``easycore-bench`` script)."""

from __future__ import annotations

import sys

from easycore.bench.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
