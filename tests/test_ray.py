"""The Ray backend on a local cluster of 2 nodes x 1 CPU (Ray's ray.cluster_utils.Cluster):
the same runners and pool, one argument more; results as the local runner's; errors and
deaths as locally; nothing left running afterwards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs ray (pip install 'easycore[ray]')")

import ray_defs as rd  # noqa: E402
from ctrl_c import ctrl_c_after  # noqa: E402
from easycore.common.parallel import OrderedRunner  # noqa: E402
from easycore.errors import (  # noqa: E402
    RunnerClosedError,
    WorkerDiedError,
    WorkerError,
)
from easycore.parallel import Pool, context  # noqa: E402
from easycore.ray import RayBackend  # noqa: E402
from easycore.ray.testing import local_cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")

pytestmark = pytest.mark.timeout(120)


def _session_processes(session: str) -> list[int]:
    """Processes whose command line names this cluster's session (raylets, GCS, workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if session.encode() in cmd and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One cluster for the module, its workers able to import this folder's helpers; after
    the module, every process of the cluster must be gone."""
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.path.abspath(EXAMPLES), old_path) if p
    )
    session = None
    try:
        try:
            ctx = local_cluster(nodes=2, cpus_per_node=1)
            c = ctx.__enter__()
        except Exception as e:  # noqa: BLE001 - an environment where Ray cannot start
            pytest.skip(f"a local Ray cluster could not start here: {type(e).__name__}: {e}")
        session = os.path.basename(c.head_node.get_session_dir_path())
        assert _session_processes(session), "the leak check below cannot see the cluster"
        try:
            yield c
        finally:
            ctx.__exit__(None, None, None)
    finally:
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    if session is not None:
        deadline = time.monotonic() + 15
        left = _session_processes(session)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _session_processes(session)
        assert not left, f"Ray processes of {session} left running: {left}"


# ----- the one-line switch -----


def test_importing_easycore_never_imports_ray():
    code = (
        "import easycore, easycore.common.parallel, easycore.parallel, sys; "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "script, switch, expected",
    [
        ("sum_of_squares.py", "Runner(devices=3)", "328350"),
        ("power_sum.py", "Runner(devices=3, cfg=cfg)", str(sum(x**3 for x in range(100)))),
    ],
)
def test_manual_examples_with_the_one_line_switch(cluster, script, switch, expected):
    """The manual's scripts, run as scripts (their runner classes live in ``__main__``),
    with one line changed: ``devices=3`` becomes ``devices="all", backend="ray"``."""
    with open(os.path.join(EXAMPLES, script)) as f:
        code = f.read()
    assert switch in code
    new = switch.replace("devices=3", 'devices="all", backend="ray"')
    lines = zip(code.splitlines(), code.replace(switch, new).splitlines(), strict=True)
    assert sum(a != b for a, b in lines) == 1
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # the cluster is on 127.0.0.1
    }
    out = subprocess.run(
        [sys.executable, "-c", code.replace(switch, new)],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == expected


def test_results_match_the_local_runner_exactly():
    data = list(range(-50, 1000))
    with rd.Square(devices=2) as local:
        expected = local(data)
    with rd.Square(devices=2, backend="ray") as runner:
        assert runner.start_method == "ray"
        assert runner(data) == expected
        assert runner(iter(data)) == expected  # a lazy input too
        assert list(runner.imap(data)) == expected
        assert runner.stats.items == len(data)
        assert runner(range(0)) == []  # an empty call


def test_stats_give_each_actors_start_up_and_init_and_the_slowest_items():
    with rd.SlowInit(devices=2, backend="ray") as runner:
        assert runner(range(40)) == [x * x for x in range(40)]
        s = runner.stats
    assert set(s.producer_start_s) == {0, 1} and set(s.producer_init_s) == {0, 1}
    for i in (0, 1):
        assert s.producer_init_s[i] >= 0.3  # producer_init slept that long
        assert s.producer_start_s[i] >= s.producer_init_s[i]
    assert (s.slowest[0].item, s.slowest[0].count) == (7, 1) and s.slowest[0].seconds >= 0.2
    assert "start-up" in s.summary()


def test_ordered_results_stay_ordered_unordered_ones_all_arrive():
    data = list(range(300))
    with rd.Jitter(devices=2, backend="ray") as runner:
        assert list(runner.imap(data)) == data
        assert list(runner.imap(x for x in data)) == data
        busy = runner.stats.producer_busy_s
        assert set(busy) == {0, 1}
    with rd.JitterUnordered(devices=2, backend="ray") as runner:
        assert sorted(runner.imap(data)) == data


def test_input_is_read_lazily_within_the_window():
    read = []

    def source():
        for i in range(200):
            read.append(i)
            yield i

    with rd.Square(devices=2, backend="ray", window=8) as runner:
        seen = 0
        for r in runner.imap(source()):
            seen += 1
            assert len(read) - seen <= 8 + 1, "the input was read past the window"
            assert r == (seen - 1) ** 2
        assert seen == 200


def test_devices_map_to_actors_and_hooks_see_who_they_are():
    cfg = {"k": "v"}
    with rd.Info(devices="all", cfg=cfg, backend="ray") as runner:
        assert runner.devices == ["cpu", "cpu"]  # one actor per CPU of the cluster
        out = list(runner.imap(range(40)))
    assert [r[0] for r in out] == list(range(40))
    assert {r[1] for r in out} == {"cpu"}
    assert {r[2] for r in out} <= {0, 1} and {r[3] for r in out} == {2}
    assert {r[5] for r in out} == {"v"}
    pids = {r[4] for r in out}
    assert os.getpid() not in pids
    # Ray options per device: half a CPU each, and the string the hooks get.
    half = {"num_cpus": 0.5, "device": "cpu"}
    with rd.Info(devices=[half] * 4, backend=RayBackend()) as runner:
        out = list(runner.imap(range(40)))
    assert {r[3] for r in out} == {4}
    with pytest.raises(Exception, match="unknown device"):
        rd.Info(devices=["tpu"], backend="ray")


def test_large_arrays_come_back_equal():
    np = pytest.importorskip("numpy")
    with rd.Arrays(devices=2, backend="ray") as runner:
        got = list(runner.imap(range(40)))
    assert len(got) == 40
    for i, a in enumerate(got):
        assert a.shape == (1 << 18,) and a.dtype == np.float32
        assert float(a[0]) == i and float(a[-1]) == i
    assert runner.stats.bytes_out >= 40 << 20
    # Input arrays "in shared memory" for a Ray runner are ordinary arrays (no local queue).
    from easycore import shm

    with rd.Arrays(devices=1, backend="ray") as runner:
        a = shm.empty(1 << 20, dtype=np.uint8, runner=runner)
        assert not shm.is_shared(a) and a.flags.writeable


# ----- failures -----


def test_a_hook_exception_keeps_its_type_and_remote_traceback():
    with rd.Fails(devices=2, backend="ray") as runner:
        with pytest.raises(rd.BadItem) as info:
            runner(range(20))
        e = info.value
        assert isinstance(e, WorkerError)
        assert e.hook == "producer_work" and e.item == 7
        assert e.item_seen == 7  # the original's attributes are copied
        assert "in producer_work" in e.remote_traceback and "BadItem" in e.remote_traceback
        assert sorted(runner.imap([1, 2, 3])) == [1, 2, 3]  # still usable


def test_producer_init_error_is_raised_at_construction():
    with pytest.raises(KeyError) as info:
        rd.InitFails(devices=2, backend="ray")
    assert isinstance(info.value, WorkerError) and info.value.hook == "producer_init"


def test_producer_end_runs_at_close(tmp_path):
    runner = rd.EndRecords(devices=2, cfg={"dir": str(tmp_path)}, backend="ray")
    assert sorted(runner.imap(range(10))) == list(range(10))
    runner.close()
    assert sorted(os.listdir(tmp_path)) == ["end-0", "end-1"]
    runner.close()  # twice is harmless
    with pytest.raises(RunnerClosedError):
        runner(range(3))


def test_an_actor_killed_mid_call_raises_worker_died_error():
    with rd.Sleepy(devices=2, backend="ray") as runner:
        pids = [p.pid for p in runner._workers.procs]
        assert len(set(pids)) == 2 and os.getpid() not in pids

        def kill_soon():
            time.sleep(1.0)
            os.kill(pids[1], signal.SIGKILL)

        import threading

        threading.Thread(target=kill_soon, daemon=True).start()
        with pytest.raises(WorkerDiedError) as info:  # (a hang hits the test's timeout)
            runner([0.2] * 200)
        e = info.value
        assert e.pid == pids[1] and e.device == "cpu"
        msg = str(e)
        assert "Ray actor" in msg and e.actor_id in msg
        assert "node 127.0.0.1" in msg and "died" in msg
        assert re.search(r"died: .*(worker process has died|killed|exit)", msg), msg
        assert not runner.is_activate
        runner.activate()  # a fresh set of actors
        assert runner([0.0] * 4) is None  # no consumer hooks: consumer_end's None


def test_ctrl_c_cancels_outstanding_work_and_stops_the_actors(cluster):
    body = f"""
        import os, time
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import ray
        ray.init(address={cluster.address!r}, logging_level="ERROR")
        import ray_defs as rd
        runner = rd.Sleepy(devices=2, backend="ray")
        pids = [p.pid for p in runner._workers.procs]
        print("started", flush=True)
        t0 = time.monotonic()
        try:
            runner([30.0] * 10)
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - t0), flush=True)
        print("closed", not runner.is_activate, flush=True)
        for _ in range(100):
            alive = [p for p in pids if os.path.exists(f"/proc/{{p}}")]
            if not alive:
                break
            time.sleep(0.1)
        print("actors alive", alive, flush=True)
    """
    out = ctrl_c_after(textwrap.dedent(body), after="started", limit=60)
    assert "interrupted after" in out, out
    assert "closed True" in out, out
    assert "actors alive []" in out, out


# ----- the pool -----


def test_pool_on_ray():
    with Pool(2, initializer=lambda: {"model": "m"}, backend="ray") as pool:
        assert pool.map(lambda x: x * x, range(100)) == [x * x for x in range(100)]
        assert sorted(pool.imap_unordered(abs, range(-5, 5))) == sorted(map(abs, range(-5, 5)))
        assert pool.submit(pow, 2, 10).result(timeout=60) == 1024
        big = np.arange(1 << 18)  # a task's large buffer travels out of band
        assert pool.submit(np.sum, big).result(timeout=60) == int(big.sum())
        assert set(pool.map(lambda x: context()["model"], range(4))) == {"m"}
        with pytest.raises(ZeroDivisionError):
            pool.map(lambda x: 1 / x, [1, 0, 2])
        assert pool.map(str, [1, 2]) == ["1", "2"]
        # Actors are not processes of this machine: no local handles to list.
        assert pool._processes == 2
        with pytest.raises(NotImplementedError, match="not processes of this machine"):
            pool.worker_processes()
    with Pool(backend="ray") as pool:
        assert len(pool.devices) == 2  # one worker per CPU of the cluster


def test_pool_on_ray_unpicklable_map_result_fails_its_own_call_only():
    # As with local workers (docs/pool.md): one unpicklable map result fails that map only;
    # a future waiting meanwhile, and the calls after it, go on.
    from easycore.errors import SerializationError

    def slow(x):
        import time as t

        t.sleep(0.5)
        return x

    with Pool(2, backend="ray") as pool:
        fut = pool.submit(slow, 7)
        with pytest.raises(SerializationError, match="not picklable") as ei:
            pool.map(lambda x: threading.Lock() if x == 5 else x, range(10))
        assert "_thread.lock" in str(ei.value)
        assert fut.result(timeout=60) == 7
        assert pool.map(abs, range(-3, 3)) == [3, 2, 1, 0, 1, 2]


class Local(OrderedRunner):
    """A class of the test module itself, never importable by the actors."""

    @staticmethod
    def producer_work(device, cfg, data):
        return -data


def test_a_runner_class_the_actors_cannot_import_is_shipped_by_value():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with Local(devices=1, backend="ray") as runner:
            assert list(runner.imap(range(5))) == [0, -1, -2, -3, -4]
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_docs_ray_md_snippets_run(cluster, tmp_path):
    """docs/ray.md's Python snippets, run as tests/test_docs.py runs every doc, on this
    module's cluster (found through RAY_ADDRESS, as a user's script would)."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "test_docs.py"), "docs/ray.md", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    ran, skipped, checked = map(int, proc.stdout.split()[-3:])
    assert ran == 3 and skipped == 0, (ran, skipped)
    assert "[0, 1, 4, 9, 16]\n[0, 1, 4, 9, 16]\n[1, 2, 3]\nNone\n4" in proc.stdout
