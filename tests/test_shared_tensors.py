"""Tensors already in shared memory (``share_memory_()``) travel by reference through the
torch pool's arguments and results and through ``Queue(torch=True)``, as torch.multiprocessing
sends them; other tensors are still copied."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pool_defs as pd  # noqa: E402
from easycore.parallel import Queue  # noqa: E402
from easycore.torch.parallel import Pool  # noqa: E402


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_shared_tensor_is_passed_by_reference_and_a_plain_one_copied(method):
    shared = torch.zeros(1000).share_memory_()
    plain = torch.zeros(1000)
    with Pool(2, start_method=method) as pool:
        # The worker's write reaches the caller's tensor.
        assert pool.starmap(pd.fill_, [(shared, 3.0)]) == [3000.0]
        assert float(shared.sum()) == 3000.0
        assert pool.starmap(pd.fill_, [(plain, 5.0)]) == [5000.0]
        assert float(plain.sum()) == 0.0  # copied: the caller's tensor is unchanged
        # A shared tensor returned by a worker is the same memory too: the caller's write is
        # seen through it.
        back = pool.map(pd.same, [shared])[0]
        shared[0] = 42.0
        assert float(back[0]) == 42.0
        copy = pool.map(pd.same, [plain])[0]
        plain[0] = 42.0
        assert float(copy[0]) == 0.0


@pytest.mark.timeout(120)
def test_queue_torch_passes_a_shared_tensor_by_reference():
    q = Queue(torch=True)
    try:
        shared = torch.arange(10, dtype=torch.float32).share_memory_()
        q.put(shared)
        plain = torch.arange(10, dtype=torch.float32)
        q.put(plain)
        got = q.get(timeout=30)
        copied = q.get(timeout=30)
        got[1] = -1.0
        assert float(shared[1]) == -1.0
        assert got.is_shared()
        copied[1] = -1.0
        assert float(plain[1]) == 1.0 and not copied.is_shared()
    finally:
        q.close()
