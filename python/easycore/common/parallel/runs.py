"""Kept import path of :mod:`easycore._engine.runs` (this name is that module)."""

import sys

from easycore._engine import runs as _runs

sys.modules[__name__] = _runs
