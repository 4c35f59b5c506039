"""A producer's heap keeps the arrays it makes per item: glibc's malloc thresholds are set
where its own adaptation ends (``_engine/heap.py``), so a batch of 256 KiB arrays made and
dropped again is served from memory the heap kept, not mapped and faulted in anew.

Verdicts count minor page faults (``getrusage``), never time."""

from __future__ import annotations

import os
import platform
import resource

import numpy as np
import pytest
import runner_defs as rd
from easycore._engine import heap

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc thresholds are glibc's"),
]

_ARRAY = 256 << 10  # four a batch: 1 MiB freed at once, above glibc's adapted trim threshold


def _batch_faults(rounds: int) -> list[int]:
    """Minor page faults of each round of four fresh 256 KiB arrays, filled and dropped."""
    out = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [np.full(_ARRAY, 7, dtype=np.uint8) for _ in range(4)]
        del arrays
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out


class FaultCounter(rd.CollectUnordered):
    @staticmethod
    def producer_work(device, cfg, data):
        return _batch_faults(data)


def test_a_producer_reuses_the_arrays_it_drops():
    with FaultCounter(devices=1, start_method="fork") as r:
        (faults,) = r([20])
    # The first rounds grow the heap; from then on the same memory serves every round. Left
    # at glibc's start (128 KiB thresholds, adapted on the way), each round faulted all
    # 256 pages of its four arrays in again.
    assert max(faults[5:]) < 64, faults


def test_the_users_own_malloc_settings_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(1 << 20))
    assert heap.settle() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=262144")
    assert heap.settle() is False


def test_a_spawned_producer_settles_its_heap_too():
    with FaultCounter(devices=1, start_method="spawn") as r:
        (faults,) = r([20])
    assert max(faults[5:]) < 64, faults
    assert os.environ.get("MALLOC_TRIM_THRESHOLD_") is None  # nothing leaked into ours
