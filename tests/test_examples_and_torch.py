"""The manual's examples run unchanged, and the torch flavour moves tensors correctly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import runner_defs as rd  # noqa: E402
from easycore.common.parallel import UnorderedRunner as CommonUnorderedRunner  # noqa: E402
from easycore.errors import InvalidArgument  # noqa: E402
from easycore.torch.parallel import OrderedRunner, UnorderedRunner  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    "script, expected",
    [
        ("sum_of_squares.py", "328350"),
        ("power_sum.py", str(sum(x**3 for x in range(100)))),
        ("predictor.py", "torch.Size([100, 3])"),
        ("batch_predictor.py", "torch.Size([100, 3])"),
    ],
)
def test_manual_examples(script, expected):
    out = subprocess.run(
        [sys.executable, script], cwd=EXAMPLES, capture_output=True, text=True, timeout=170
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected


class TensorEcho(OrderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        return {"t": data, "sum": float(data.float().sum()), "threads": torch.get_num_threads()}

    consumer_init = rd.Collect.consumer_init
    consumer_work = rd.Collect.consumer_work
    consumer_end = rd.Collect.consumer_end


def test_tensors_of_many_kinds_round_trip():
    items = [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
        torch.ones(5, dtype=torch.bfloat16) * 1.5,
        torch.nn.Parameter(torch.full((2,), 3.0)),
        torch.zeros(()),
        torch.randint(0, 100, (1 << 20,), dtype=torch.int64),  # 8 MiB
    ]
    with TensorEcho(devices=2) as r:
        out = r(items)
        assert r.devices == ["cpu", "cpu"]
        forked = r.start_method == "fork"
    assert len(out) == len(items)
    for got, want in zip(out, items, strict=True):
        t = got["t"]
        assert isinstance(t, torch.Tensor) and t.dtype == want.dtype and t.shape == want.shape
        assert torch.equal(t, want.detach())
        assert got["sum"] == pytest.approx(float(want.detach().float().sum()))
        # CPU producers share the cores instead of each taking all of them (one thread
        # each when forked: torch's OpenMP pool does not survive a fork).
        assert got["threads"] == (1 if forked else max(1, len(os.sched_getaffinity(0)) // 2))
    assert isinstance(out[3]["t"], torch.nn.Parameter)


class Square(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        return torch.tensor([data * data])


def test_imap_and_unordered_flavour():
    # Module level: the default start method is spawn when other threads run.
    with Square(devices=2) as r:
        got = sorted(int(t) for t in r.imap(range(200)))
    assert got == [x * x for x in range(200)]


def test_missing_gpu_is_a_clear_error():
    n = torch.cuda.device_count()
    with pytest.raises(InvalidArgument, match="does not exist"):
        TensorEcho(devices=[f"cuda:{n}"])
    with pytest.raises(InvalidArgument):
        TensorEcho(devices=["tpu"])


class MatMul(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, n):
        a = torch.ones(n, n)
        return float((a @ a).sum()), torch.get_num_threads()


def test_forked_producers_after_the_caller_used_torch_threads_do_not_hang():
    # The caller uses torch's thread pool first; a forked child that then used several
    # threads waited forever for the parent's pool threads (seen on 16 cores).
    torch.set_num_threads(max(2, len(os.sched_getaffinity(0))))
    a = torch.randn(1500, 1500)
    assert float((a @ a).abs().sum()) > 0
    with MatMul(devices=1, start_method="fork") as r:
        out = list(r.imap([300, 400], timeout=60))
    assert sorted(v for v, _ in out) == [300.0**3, 400.0**3]
    assert {t for _, t in out} == {1}


class CommonMatMul(CommonUnorderedRunner):
    producer_work = MatMul.producer_work


def _matmul(n):
    return MatMul.producer_work("cpu", None, n)


def test_common_runner_and_pool_forked_after_torch_threads_do_not_hang():
    from easycore.parallel import Pool

    torch.set_num_threads(max(2, len(os.sched_getaffinity(0))))
    a = torch.randn(1500, 1500)
    assert float((a @ a).abs().sum()) > 0
    with CommonMatMul(devices=1, start_method="fork") as r:
        out = list(r.imap([300, 400], timeout=60))
    with Pool(1, start_method="fork") as p:
        out_pool = p.map(_matmul, [300, 400], timeout=60)
    for got in (out, out_pool):
        assert sorted(v for v, _ in got) == [300.0**3, 400.0**3]
        assert {t for _, t in got} == {1}
