"""Input items born in shared memory (easycore.shm.empty(..., runner=r)): sent to the producers
by reference, read-only in the caller once sent, pool exhaustion falls back to copying,
closed runners give ordinary arrays, a dead producer frees what it held; no /dev/shm leak
(the autouse fixture checks that)."""

from __future__ import annotations

import numpy as np
import pytest
import shm_defs as sd
from easycore import shm
from easycore.errors import WorkerDiedError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["fork", "spawn"])
def start_method(request):
    return request.param


def _inputs(r, n, shape=(256, 1024)):
    out = []
    for i in range(n):
        a = shm.empty(shape, dtype=np.float32, runner=r)
        a[...] = i
        out.append((i, a))
    return out


def test_input_arrays_travel_by_reference(start_method):
    with sd.SumInputs(devices=2, start_method=start_method) as r:
        items = _inputs(r, 12)
        assert all(shm.is_shared(a) for _, a in items)
        out = r(items)
        assert out == [(i, (256, 1024), i, i, i * 256.0 * 1024) for i in range(12)]
        # Sent by reference: the caller's arrays are read-only now.
        for _, a in items:
            assert not a.flags.writeable
            with pytest.raises(ValueError):
                a[0, 0] = 1
        # A second call with the same (sent) arrays copies them: the same answers.
        assert r(items) == out
        # And new ones reuse the pool.
        assert r(_inputs(r, 12)) == out


def test_a_full_input_pool_gives_private_arrays_and_never_blocks():
    # queue_scale=0.25: an input pool of 8 MiB (two 4 MiB side budgets), filled by 1 MiB arrays.
    with sd.SumInputs(devices=1, queue_scale=0.25, start_method="fork") as r:
        items = []
        for i in range(64):
            a = shm.empty(1 << 20, dtype=np.uint8, runner=r)
            a[...] = i % 251
            items.append((i, a))
            if not shm.is_shared(a):
                break
        shared = sum(shm.is_shared(a) for _, a in items)
        assert 0 < shared < len(items) <= 64
        out = r(items)
    assert out == [(i, (1 << 20,), i % 251, i % 251, (i % 251) * float(1 << 20)) for i, _ in items]


def test_closed_runners_and_small_arrays_give_ordinary_arrays():
    r = sd.SumInputs(devices=1, start_method="fork")
    try:
        small = shm.zeros(16, dtype=np.int8, runner=r)  # below pool_min: private
        big = shm.zeros(1 << 20, dtype=np.uint8, runner=r)
        assert not shm.is_shared(small) and shm.is_shared(big)
    finally:
        r.close()
    assert not shm.is_shared(shm.empty(1 << 20, dtype=np.uint8, runner=r))
    # The array leased from the closed runner stays usable, and travels (copied) elsewhere.
    big[...] = 7
    assert big.sum() == 7 * (1 << 20)
    with sd.SumInputs(devices=1, start_method="fork") as r2:
        assert r2([(0, big)]) == [(0, (1 << 20,), 7.0, 7.0, 7.0 * (1 << 20))]
    del big
    with pytest.raises(TypeError):
        shm.empty(4, runner=object())


def test_pool_map_takes_input_arrays_by_reference():
    from easycore.parallel import Pool

    with Pool(2, start_method="fork") as p:
        items = []
        for i in range(6):
            a = shm.zeros_like(np.empty((512, 512)), runner=p)
            a[...] = i
            items.append((i, a))
        assert all(shm.is_shared(a) for _, a in items)
        out = p.map(sd.sum_input, items)
    assert out == [(i, i * 512.0 * 512) for i in range(6)]
    assert all(not a.flags.writeable for _, a in items)


def test_a_dead_producer_frees_the_inputs_it_held():
    with sd.SumInputs(devices=1, start_method="fork") as r:
        items = _inputs(r, 3)
        bad = shm.empty((256, 1024), dtype=np.float32, runner=r)
        with pytest.raises(WorkerDiedError):
            r([*items, (-1, bad)])
    # The autouse fixture finds no segment left behind.


def test_torch_input_tensors_travel_by_reference():
    torch = pytest.importorskip("torch")
    from easycore.torch import shm as tshm

    with sd.SumInputs(devices=1, start_method="fork") as r:
        t = tshm.zeros(256, 1024, dtype=torch.float32, runner=r)
        t += 2
        out = r([(0, t.numpy())])
    assert out == [(0, (256, 1024), 2.0, 2.0, 2.0 * 256 * 1024)]
