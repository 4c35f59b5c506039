"""What ``import easycore`` offers, and the pool's figures and errors in the runners' terms."""

from __future__ import annotations

import subprocess
import sys

import pytest
from easycore.errors import RUNNER_CLOSED, WorkerDiedError


def test_import_easycore_is_cheap_and_offers_the_first_names():
    code = (
        "import sys, easycore\n"
        "assert 'easycore._core' not in sys.modules, 'the core was loaded'\n"
        "assert 'numpy' not in sys.modules, 'numpy was loaded'\n"
        "from easycore.common.parallel import OrderedRunner, UnorderedRunner, BaseRunner\n"
        "from easycore.parallel import Pool, PoolExecutor, Queue\n"
        "from easycore.common.config import CfgNode\n"
        "from easycore.common.registry import Registry\n"
        "from easycore.common.path import PathManager, file_lock\n"
        "import easycore.shm\n"
        "assert easycore.OrderedRunner is OrderedRunner and easycore.BaseRunner is BaseRunner\n"
        "assert easycore.UnorderedRunner is UnorderedRunner\n"
        "assert (easycore.Pool, easycore.PoolExecutor) == (Pool, PoolExecutor)\n"
        "assert easycore.Queue is Queue\n"
        "assert (easycore.CfgNode, easycore.Registry) == (CfgNode, Registry)\n"
        "assert (easycore.PathManager, easycore.file_lock) == (PathManager, file_lock)\n"
        "assert easycore.shm is easycore.shm and easycore.WorkerDiedError.__name__\n"
        "assert set(easycore.__all__) <= set(dir(easycore))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_is_an_attribute_error():
    import easycore

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        easycore.Nope  # noqa: B018


def test_the_docstring_names_every_subpackage():
    import easycore

    for sub in (
        "common.parallel",
        "parallel",
        "shm",
        "torch",
        "ray",
        "common.config",
        "common.registry",
        "common.path",
        "common.network",
        "errors",
        "bench",
    ):
        assert f":mod:`easycore.{sub}`" in (easycore.__doc__ or ""), sub


def test_a_death_restated_keeps_what_happened():
    e = WorkerDiedError.of(
        "producer 0 (device 'cpu', pid 7) died: exited with code 3",
        RUNNER_CLOSED,
        pid=7,
        device="cpu",
        exitcode=3,
    )
    assert str(e).endswith(RUNNER_CLOSED)
    e.node_ip = "10.0.0.1"
    e.__cause__ = ValueError("x")
    again = e.then("Every pending call failed")
    assert (
        str(again)
        == "producer 0 (device 'cpu', pid 7) died: exited with code 3. Every pending call failed"
    )
    assert (again.pid, again.device, again.exitcode, again.death) == (7, "cpu", 3, e.death)
    assert again.node_ip == "10.0.0.1" and again.__cause__ is e.__cause__


@pytest.mark.timeout(120)
def test_pool_stats_count_the_stream():
    from easycore.parallel import Pool, PoolExecutor

    with Pool(2, start_method="fork") as pool:
        assert pool.map(abs, range(-500, 500)) == [abs(x) for x in range(-500, 500)]
        s = pool.stats
        assert 0 < s.items <= 1000
        assert s.batches > 0 and s.bytes_out > 0 and s.wall_s > 0
        assert set(s.producer_busy_s) == {0, 1}
        before = s.items
        pool.map(abs, range(100))
        assert pool.stats.items > before  # one stream: the figures grow
    with PoolExecutor(1, start_method="fork") as ex:
        with pytest.raises(ValueError, match="buffersize"):
            ex.map(abs, range(3), buffersize=0)
        assert list(ex.map(abs, range(-2, 1), buffersize=2)) == [2, 1, 0]
