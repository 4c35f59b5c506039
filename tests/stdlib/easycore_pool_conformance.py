"""CPython's ``Pool`` test classes for the process type, under the start method that
``conformance.py`` names in ``EASYCORE_CONFORMANCE_METHOD`` (CPython's own
``test_multiprocessing_<method>`` modules do the same, which some builds do not ship).

A real module, so that a spawned or forkserver worker can import what a test sends it by
reference (a method of a test class), as it can under CPython's own test runner.
"""

from __future__ import annotations

import os

from test import _test_multiprocessing as _tm

_tm.install_tests_in_module_dict(
    globals(), os.environ.get("EASYCORE_CONFORMANCE_METHOD", "fork"), only_type="processes"
)
