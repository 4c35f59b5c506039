"""Kept import path of :mod:`easycore._engine.stats` (this name is that module)."""

import sys

from easycore._engine import stats as _stats

sys.modules[__name__] = _stats
