"""Kept import path of :mod:`easycore._engine.stream` (this name is that module)."""

import sys

from easycore._engine import stream as _stream

sys.modules[__name__] = _stream
