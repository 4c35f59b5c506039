"""Kept import path of :mod:`easycore._engine.process_main` (this name is that module)."""

import sys

from easycore._engine import process_main as _process_main

sys.modules[__name__] = _process_main
