"""Kept import path of :mod:`easycore._engine.leases` (this name is that module)."""

import sys

from easycore._engine import leases as _leases

sys.modules[__name__] = _leases
