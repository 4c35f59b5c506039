"""The heap of a producer process: glibc's malloc thresholds set where its own adaptation
ends (32 MiB mmap threshold, 64 MiB trim threshold; see ``src/heap.rs``), so that arrays a
producer makes per item and drops once sent are reused from its heap, not mapped and
faulted in anew each time. Left alone where the user chose them (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``) and where the
C library is not glibc."""

from __future__ import annotations

import os

from easycore._core import set_malloc_thresholds

MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # where glibc's adaptation puts it beside that

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def settle() -> bool:
    """Sets this process's malloc thresholds (a producer, as it starts); whether they were
    set (False: the user chose them, or the C library is not glibc)."""
    env = os.environ
    tunables = env.get("GLIBC_TUNABLES", "")
    if any(k in env for k in _USER_SETTINGS) or any(t in tunables for t in _USER_TUNABLES):
        return False
    return set_malloc_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD)
