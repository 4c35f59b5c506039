"""Kept import path of :mod:`easycore._engine.wire` (this name is that module)."""

import sys

from easycore._engine import wire as _wire

sys.modules[__name__] = _wire
