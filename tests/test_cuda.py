"""GPU producers: ``"cuda:N"`` devices in the torch flavour (runners and pool).

Skipped where torch sees no CUDA device (CI has none); run on a GPU machine with
``python -m pytest tests/test_cuda.py``.
"""

from __future__ import annotations

import os
import signal

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import runner_defs as rd  # noqa: E402
from easycore.errors import WorkerDiedError, WorkerError  # noqa: E402
from easycore.torch.parallel import (  # noqa: E402
    OrderedRunner,
    Pool,
    UnorderedRunner,
    worker_info,
)

pytestmark = pytest.mark.timeout(240)


class GpuSquares(OrderedRunner):
    """Squares computed on the producer's GPU; the result is a CUDA tensor."""

    @staticmethod
    def producer_init(device, cfg):
        cfg.where = (device, torch.cuda.current_device() if device != "cpu" else -1)

    @staticmethod
    def producer_work(device, cfg, data):
        x = torch.arange(data, dtype=torch.float32, device=device)
        info = worker_info()
        return {
            "t": x * x,
            "device": device,
            "current": cfg.where[1],
            "index": info.index if info else None,
            "on": str((x * x).device),
        }

    consumer_init = rd.Collect.consumer_init
    consumer_work = rd.Collect.consumer_work
    consumer_end = rd.Collect.consumer_end


def test_cuda_producer_returns_tensors_that_arrive_on_the_cpu():
    sizes = [1, 7, 1000, 1 << 20, 3]
    with GpuSquares(devices=["cuda:0"]) as r:
        assert r.start_method == "spawn"
        out = r(sizes)
    assert [o["device"] for o in out] == ["cuda:0"] * len(sizes)
    assert all(o["current"] == 0 and o["on"] == "cuda:0" for o in out)
    for n, o in zip(sizes, out, strict=True):
        t = o["t"]
        assert t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == (n,)
        assert torch.equal(t, torch.arange(n, dtype=torch.float32) ** 2)


def test_gpu_and_cpu_producers_together_keep_order():
    devices = ["cuda:0", "cuda:0", "cpu"]
    with GpuSquares(devices=devices) as r:
        out = r([5 + i % 11 for i in range(300)])
    assert [int(o["t"].numel()) for o in out] == [5 + i % 11 for i in range(300)]
    used = {(o["device"], o["index"]) for o in out}
    assert {d for d, _ in used} <= set(devices)
    assert {i for _, i in used} <= {0, 1, 2}
    for o in out:
        n = o["t"].numel()
        assert torch.equal(o["t"], torch.arange(n, dtype=torch.float32) ** 2)


class GpuDtypes(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        dtype = getattr(torch, data)
        return data, torch.arange(64, device=device).to(dtype).reshape(8, 8).t()


def test_cuda_tensors_of_several_dtypes_and_layouts():
    names = ["float16", "bfloat16", "int8", "bool", "float64", "complex64"]
    with GpuDtypes(devices=["cuda:0"]) as r:
        out = dict(r.imap(names))
    assert sorted(out) == sorted(names)
    for name, t in out.items():
        want = torch.arange(64).to(getattr(torch, name)).reshape(8, 8).t()
        assert t.device.type == "cpu" and t.dtype == want.dtype
        assert torch.equal(t, want)


class GpuFails(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        if data == 3:
            raise ValueError(f"bad item on {device}")
        return torch.ones(2, device=device) * data


def test_cuda_producer_error_keeps_its_type_and_the_runner_stays_usable():
    with GpuFails(devices=["cuda:0"]) as r:
        with pytest.raises(ValueError, match="bad item on cuda:0") as ei:
            r(range(10))
        assert isinstance(ei.value, WorkerError)
        got = sorted(float(t[0]) for t in r.imap([1, 2, 4]))
    assert got == [1.0, 2.0, 4.0]


class GpuSuicide(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        if data == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((4,), float(data), device=device)


def test_killed_cuda_producer_is_reported_not_hung():
    r = GpuSuicide(devices=["cuda:0"])
    try:
        with pytest.raises(WorkerDiedError):
            r(range(20))
    finally:
        r.close()


def _pool_init():
    info = worker_info()
    assert info is not None
    return torch.full((3,), float(info.index), device=info.device)


def test_pool_on_cuda_with_lambdas_and_context():
    from easycore.torch.parallel import context

    with Pool(devices=["cuda:0", "cuda:0"], initializer=_pool_init) as pool:
        got = pool.map(lambda x: (context() + x).sum(), range(50))
        fut = pool.submit(lambda: str(torch.zeros(1, device="cuda").device))
        assert fut.result(timeout=60) == "cuda:0"
    assert len(got) == 50
    for x, t in zip(range(50), got, strict=True):
        assert t.device.type == "cpu"
        assert float(t) in (3.0 * x, 3.0 * (x + 1))


def test_caller_with_cuda_initialised_starts_cpu_producers_with_spawn():
    torch.zeros(1, device="cuda")  # initialises CUDA in this process
    assert torch.cuda.is_initialized()
    with GpuSquares(devices=["cpu", "cpu"]) as r:
        assert r.start_method == "spawn"
        out = r([4, 5])
    assert [o["t"].numel() for o in out] == [4, 5]
