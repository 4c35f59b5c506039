"""Tests of ``easycore.bench`` (the runner benchmark). No timed assertions: only structure,
verification and clean shutdown are checked, with tiny sizes."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from easycore.bench import reference, report, systems, workloads
from easycore.bench.cli import main, turns, verify_user_rows
from easycore.bench.report import Row

try:  # the user's runner subclasses easycore's runner; the reference stands in until it exists
    from easycore.common.parallel import UnorderedRunner as _UserBase
except ImportError:  # pragma: no cover - depends on the checkout
    from easycore.bench.reference import UnorderedRunner as _UserBase

REPO = Path(__file__).resolve().parents[1]
FAST = ["--repeats", "1", "--memcpy-mib", "8", "--no-progress", "--timeout", "120"]
EASYCORE_FINE = ("ok", "unavailable")


# ------------------------------------------------------------------------------------------
# a user's runner, as `--runner test_bench:SquareRunner --data test_bench:make_data` sees it


class SquareRunner(_UserBase):
    """Sum of squares, the manual's Example 1."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        return data * data

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.sum = 0

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.sum += data

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return cfg.sum


def make_data() -> Iterable[int]:
    return range(300)


SquareRunnerOnReference = systems.rebase(SquareRunner, reference.UnorderedRunner)


# ------------------------------------------------------------------------------------------
# systems registered by tests


class WrongSystem(systems.PoolSystem):
    """A pool that returns a plausible but wrong answer (one result dropped)."""

    def __init__(self) -> None:
        super().__init__(tuned=True)
        self.key = "wrong_for_test"

    def label(self, job: systems.Job) -> str:
        return "deliberately wrong system"

    @contextlib.contextmanager
    def session(self, job: systems.Job) -> Iterator[systems.Call]:
        with super().session(job) as call:
            yield lambda data: call(list(data)[1:])


class HangingSystem(systems.PoolSystem):
    """A pool whose call never returns."""

    def __init__(self) -> None:
        super().__init__(tuned=False)
        self.key = "hang_for_test"

    @contextlib.contextmanager
    def session(self, job: systems.Job) -> Iterator[systems.Call]:
        with super().session(job):
            yield lambda data: time.sleep(3600)


@pytest.fixture
def extra_system(request: pytest.FixtureRequest) -> Iterator[systems.System]:
    system = request.param()
    systems.register_system(system)
    try:
        yield system
    finally:
        systems.SYSTEMS.pop(system.key, None)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def row(data: dict[str, Any], workload: str, system: str) -> dict[str, Any]:
    found = [r for r in data["results"] if r["workload"] == workload and r["system"] == system]
    assert len(found) == 1, (workload, system, data["results"])
    return found[0]


def assert_easycore_fine(r: dict[str, Any]) -> None:
    assert r["status"] in EASYCORE_FINE, f"easycore row: {r['status']}: {r['detail']}"


# ------------------------------------------------------------------------------------------
# the command


def test_cli_quick_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    names = ["tiny_unordered", "tiny_ordered", "numpy_1mib", "startup"]
    syss = ["easycore", "reference", "pool_imap", "pool_imap_tuned", "ppe"]
    cmd = [sys.executable, "-m", "easycore.bench", "--quick", "--items", "40"]
    cmd += ["--workloads", ",".join(names), "--systems", ",".join(syss), "--json", str(out)]
    proc = subprocess.run(cmd + FAST, capture_output=True, text=True, timeout=280, cwd=REPO)
    text = proc.stdout
    assert "machine:" in text and "memcpy" in text, text + proc.stderr
    for name in names:
        assert f"[{name}]" in text
    assert "median" in text and "min" in text and "max" in text and "easycore x" in text
    data = load(out)
    assert {"cpus", "python", "numpy", "date"} <= set(data["machine"])
    assert data["settings"]["quick"] is True
    assert set(data["workloads"]) == set(names)
    assert data["workloads"]["startup"]["higher_is_better"] is False
    # one row per (workload, system), plus the memcpy reference under the GB/s workload
    assert len(data["results"]) == len(names) * len(syss) + 1
    assert row(data, "numpy_1mib", "memcpy")["status"] == "reference"
    for name in names:
        for key in syss[1:]:
            r = row(data, name, key)
            assert r["status"] == "ok", r
            assert r["samples"] and r["min"] <= r["median"] <= r["max"]
        assert_easycore_fine(row(data, name, "easycore"))
    assert row(data, "tiny_ordered", "reference")["items"] == 40
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all results verified" in text


def test_rounds_take_systems_in_turn_and_pool_their_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["--workloads", "tiny_unordered", "--items", "30", "--json", str(out)]
    args += ["--systems", "reference,pool_imap", "--rounds", "3"]
    args += [a for a in FAST if a != "--no-progress"]  # progress lines show the order
    assert main(args) == 0
    captured = capsys.readouterr()
    order = [line.split("] ", 1)[1] for line in captured.err.splitlines() if line.startswith("[")]
    a, b = "tiny_unordered / reference", "tiny_unordered / pool_imap"
    assert order == [a, b, b, a, a, b]  # each round starts one system later
    assert "in each of 3 rounds" in captured.out
    data = load(out)
    assert data["settings"]["rounds"] == 3
    for key in ("reference", "pool_imap"):
        r = row(data, "tiny_unordered", key)
        assert r["status"] == "ok" and len(r["samples"]) == 3  # 1 repeat in each round
    with pytest.raises(SystemExit, match="--rounds"):
        main(["--rounds", "0", "--workloads", "tiny_unordered"] + FAST)


def test_a_list_workload_reaches_the_systems_as_a_list(tmp_path: Path) -> None:
    # A pool slices a list into chunks and reads an iterator item by item: the workload
    # that measures the first must hand its list over, not an iterator that counts.
    from easycore.bench.measurement import _Counted, _data

    w = workloads.WORKLOADS["numpy_1mib_list"]
    job = systems.Job(hooks=w.hooks, ordered=False, devices=["cpu"], make_data=w.make_data)
    data = _data(w, job, 5)
    assert type(data) is list and len(data) == 5
    tiny = workloads.WORKLOADS["numpy_1mib"]
    assert isinstance(_data(tiny, job, 5), _Counted)
    out = tmp_path / "bench.json"
    args = ["--workloads", "numpy_1mib_list", "--systems", "easycore_pool,easycore"]
    assert main(args + ["--items", "12", "--json", str(out)] + FAST) == 0
    for key in ("easycore_pool", "easycore"):
        r = row(load(out), "numpy_1mib_list", key)
        assert r["status"] == "ok" and r["items"] == 12, r


def test_each_round_starts_one_system_later() -> None:
    keys = ["a", "b", "c"]
    assert [k for k, _ in turns(keys, 3)] == list("abcbcacab")
    assert [r for _, r in turns(keys, 2)] == [0, 0, 0, 1, 1, 1]
    assert turns(keys, 1) == [("a", 0), ("b", 0), ("c", 0)]
    assert turns(["a"], 2) == [("a", 0), ("a", 1)]


def test_pool_with_the_tuned_chunksize_is_a_system(tmp_path: Path) -> None:
    # easycore's Pool given the chunk size the tuned multiprocessing.Pool gets: results are
    # verified; a feedback input (item i+1 after result i) would deadlock a chunk being filled.
    out = tmp_path / "bench.json"
    args = ["--workloads", "tiny_unordered,tiny_ordered,latency", "--items", "400"]
    args += ["--systems", "easycore_pool,easycore_pool_tuned", "--json", str(out)]
    assert main(args + FAST) == 0
    data = load(out)
    for name in ("tiny_unordered", "tiny_ordered"):
        assert row(data, name, "easycore_pool")["status"] == "ok"
        r = row(data, name, "easycore_pool_tuned")
        assert r["status"] == "ok", r
        assert "chunksize=50" in r["label"], r["label"]  # 400 // (4 * 2 workers)
    assert row(data, "latency", "easycore_pool")["status"] == "ok"
    tuned = row(data, "latency", "easycore_pool_tuned")
    assert tuned["status"] == "unavailable" and "reads its input ahead" in tuned["detail"]


@pytest.mark.parametrize(
    ("ordered", "consumer"), [(False, "hooks"), (True, "hooks"), (False, "sum"), (True, "collect")]
)
def test_paired_pool_script_runs_and_both_pools_agree(ordered: bool, consumer: str) -> None:
    # scripts/bench_pool_pairs.py (the paired figures in docs/performance.md) checks that
    # both pools give the same consumer result before it times them, and prints the median
    # ratio and the calling process's CPU time per item.
    cmd = [sys.executable, str(REPO / "scripts" / "bench_pool_pairs.py"), "--pairs", "1"]
    cmd += ["--consumer", consumer] + (["--ordered"] if ordered else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "median of 1 pairs" in proc.stdout, proc.stdout
    assert ("imap," if ordered else "imap_unordered,") in proc.stdout
    assert f"consumer {consumer}:" in proc.stdout
    assert "calling process CPU per item" in proc.stdout


@pytest.mark.parametrize("extra_system", [WrongSystem], indirect=True)
def test_wrong_system_is_reported(
    tmp_path: Path, extra_system: systems.System, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        ["--workloads", "tiny_unordered,tiny_ordered,numpy_1mib", "--items", "30"]
        + ["--systems", f"reference,{extra_system.key}", "--json", str(out)]
        + FAST
    )
    text = capsys.readouterr().out
    assert rc == 1
    assert "WRONG" in text and "FAILED" in text
    data = load(out)
    for name in ("tiny_unordered", "tiny_ordered", "numpy_1mib"):
        assert row(data, name, "reference")["status"] == "ok"
        bad = row(data, name, extra_system.key)
        assert bad["status"] == "wrong"
        assert "expected" in bad["detail"]
        assert bad["easycore_speedup"] is None
    assert f"{extra_system.key}/tiny_ordered" in data["failed"]


@pytest.mark.parametrize("extra_system", [HangingSystem], indirect=True)
def test_hung_system_times_out_and_is_killed(
    tmp_path: Path, extra_system: systems.System, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["--workloads", "tiny_unordered", "--items", "20", "--json", str(out)]
    args += ["--systems", f"{extra_system.key},reference"] + FAST + ["--timeout", "3"]
    rc = main(args)
    assert rc == 1
    assert "TIMEOUT" in capsys.readouterr().out
    data = load(out)
    assert row(data, "tiny_unordered", extra_system.key)["status"] == "timeout"
    assert row(data, "tiny_unordered", "reference")["status"] == "ok"  # the run went on


@pytest.mark.timeout(200)
def test_sigterm_stops_the_run_and_prints_what_was_measured(tmp_path: Path) -> None:
    # `timeout`, or a batch scheduler's notice, sends SIGTERM: the run died without printing
    # anything (the tables come at the end). It now stops as Ctrl-C does.
    out = tmp_path / "bench.json"
    args = ["--workloads", "tiny_unordered", "--items", "20", "--json", str(out)]
    args += ["--systems", "reference,hang_for_test", "--repeats", "1", "--memcpy-mib", "8"]
    driver = (
        "import sys; sys.path.insert(0, 'tests'); import test_bench as t; "
        "from easycore.bench import cli, systems; "
        "systems.register_system(t.HangingSystem()); "
        f"sys.exit(cli.main({args!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # progress: one line as each measurement starts
            if "[2/2]" in line:
                break
        time.sleep(0.5)  # inside the hanging call
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted: the table shows what was measured" in stdout, stdout + stderr
    data = load(out)
    assert row(data, "tiny_unordered", "reference")["status"] == "ok"
    assert row(data, "tiny_unordered", "hang_for_test")["status"] == "interrupted"


def test_user_runner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        ["--runner", f"{__name__}:SquareRunner", "--data", f"{__name__}:make_data"]
        + ["--json", str(out)]
        + FAST
    )
    text = capsys.readouterr().out
    data = load(out)
    assert list(data["workloads"]) == ["user"]
    assert "SquareRunner" in data["workloads"]["user"]["title"]
    ref = row(data, "user", "reference")
    assert ref["status"] == "ok", ref
    assert ref["items"] == 300 and ref["fingerprint"] == systems.fingerprint(
        sum(x * x for x in range(300))
    )
    ec = row(data, "user", "easycore")
    assert_easycore_fine(ec)
    if ec["status"] == "ok":
        assert ec["fingerprint"] == ref["fingerprint"]
    assert "[user]" in text
    assert rc == 0


def test_user_runner_needs_data() -> None:
    with pytest.raises(SystemExit):
        main(["--runner", f"{__name__}:SquareRunner"])


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    text = capsys.readouterr().out
    for name in list(workloads.WORKLOADS) + list(systems.SYSTEMS):
        assert name in text
    described = [line.split(None, 2)[2] for line in text.splitlines() if line.startswith("system")]
    assert len(described) == len(systems.SYSTEMS)
    assert len(set(described)) == len(described), described  # one description per system
    assert not any("``" in d or ":mod:" in d for d in described)


@pytest.mark.parametrize(
    ("runner", "data", "message"),
    [
        ("nope_no_such_module:X", "nope:Y", "--runner nope_no_such_module:X: cannot import"),
        (f"{__name__}:NoSuchRunner", "nope:Y", f"{__name__} has no attribute 'NoSuchRunner'"),
        (f"{__name__}:SquareRunner", f"{__name__}:no_data", "--data"),
        ("no_colon", "nope:Y", "expects package.module:name"),
    ],
)
def test_bad_runner_or_data_is_one_line(runner: str, data: str, message: str) -> None:
    cmd = [sys.executable, "-m", "easycore.bench", "--runner", runner, "--data", data]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr


def test_bench_without_numpy_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None; import runpy; "
        "runpy.run_module('easycore.bench', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--list"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "pip install 'easycore[bench]'" in proc.stderr


def test_persistent_dataloader_is_reused_across_calls() -> None:
    pytest.importorskip("torch")
    system = systems.SYSTEMS["dataloader"]
    w = workloads.WORKLOADS["tiny_ordered"]
    job = systems.Job(hooks=w.hooks, ordered=True, devices=["cpu", "cpu"], make_data=w.make_data)
    with system.session(job) as call:
        for n in (30, 7, 30):  # a new epoch, with new inputs, on the same workers
            assert w.check(call(w.make_data(n)), n) is None
        loader_workers = {p.pid for p in multiprocessing_children()}
        assert w.check(call(w.make_data(12)), 12) is None
        assert {p.pid for p in multiprocessing_children()} == loader_workers
        assert len(loader_workers) == 2


def multiprocessing_children() -> list[Any]:
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.is_alive()]


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    marker = tmp_path / f"{uuid.uuid4().hex}.json"
    cmd = [sys.executable, "-m", "easycore.bench", "--workloads", "tiny_unordered"]
    cmd += ["--systems", "reference", "--items", "5000000", "--json", str(marker)]
    proc = subprocess.Popen(
        cmd + FAST, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    time.sleep(4.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stdout
    # nothing started by the run survives it (every process of it has the marker in argv)
    deadline = time.monotonic() + 10
    while _processes_with(str(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(str(marker))


def _processes_with(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


# ------------------------------------------------------------------------------------------
# the pieces


def run_hooks_inline(w: workloads.Workload, n: int) -> Any:
    """The workload's hooks in this process, sequentially: the expected-result path."""
    pcfg, ccfg = reference.make_cfg(), reference.make_cfg()
    w.hooks.producer_init("cpu", pcfg)
    w.hooks.consumer_init(ccfg)
    for item in w.make_data(n):
        w.hooks.consumer_work(ccfg, w.hooks.producer_work("cpu", pcfg, item))
    w.hooks.producer_end("cpu", pcfg)
    return w.hooks.consumer_end(ccfg)


@pytest.mark.parametrize(
    "name", ["tiny_unordered", "tiny_ordered", "tiny_collect", "numpy_1mib", "startup"]
)
def test_workload_expectations(name: str) -> None:
    w = workloads.WORKLOADS[name]
    n = 7
    got = run_hooks_inline(w, n)
    assert w.check(got, n) is None
    assert w.check(got, n + 1) is not None  # one item missing
    assert w.check(None, n) is not None


def test_ordered_workload_detects_reordering() -> None:
    w = workloads.WORKLOADS["tiny_ordered"]
    cfg = reference.make_cfg()
    w.hooks.consumer_init(cfg)
    for x in [1, 0, 2, 3]:
        w.hooks.consumer_work(cfg, x * x)
    assert w.check(w.hooks.consumer_end(cfg), 4) is not None


def test_array_consumer_detects_corruption() -> None:
    w = workloads.WORKLOADS["numpy_1mib"]
    a = w.hooks.producer_work("cpu", None, (3, 1 << 20))
    a[5 * workloads.PAGE] ^= 1
    cfg = reference.make_cfg()
    w.hooks.consumer_init(cfg)
    w.hooks.consumer_work(cfg, a)
    assert w.hooks.consumer_end(cfg)[3] == 1


@pytest.mark.skipif(not workloads.torch_available(), reason="torch is not installed")
def test_predictor_expectation() -> None:
    w = workloads.WORKLOADS["predictor"]
    assert w.check(run_hooks_inline(w, 3), 3) is None


class _Ordered(reference.OrderedRunner):
    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        return (device, data * data)

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.out = []

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.out.append(data[1])

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return cfg.out


class _Failing(reference.UnorderedRunner):
    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        if data == 17:
            raise ValueError("boom")
        return data


def test_reference_runner() -> None:
    with SquareRunnerOnReference(devices=2) as r:
        assert r(range(100)) == sum(x * x for x in range(100))
        assert r([]) == 0
    with _Ordered(devices=["cpu", "cpu"]) as r:
        assert r(range(200)) == [x * x for x in range(200)]
        r.close()
        with pytest.raises(RuntimeError, match="closed"):
            r(range(3))
        r.activate()
        assert r(range(3)) == [0, 1, 4]


def test_reference_runner_error_does_not_hang() -> None:
    r = _Failing(devices=2)
    with pytest.raises(RuntimeError, match="failed|died"):
        r(range(1000))
    assert not r.is_activate


def test_rebased_class_pickles_by_name() -> None:
    cls = systems.rebase(workloads.SquareSumHooks, reference.OrderedRunner)
    assert systems.rebase(workloads.SquareSumHooks, reference.OrderedRunner) is cls
    assert pickle.loads(pickle.dumps(cls)) is cls
    assert cls.producer_work("cpu", None, 3) == 9
    code = "import pickle, sys; print(pickle.loads(bytes.fromhex(sys.argv[1])).__mro__[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, pickle.dumps(cls).hex()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "reference.OrderedRunner" in proc.stdout, proc.stderr


def test_fingerprint() -> None:
    fp = systems.fingerprint
    assert fp([1, 2, np.arange(3)]) == fp([1, 2, np.arange(3)])
    assert fp(np.arange(3)) != fp(np.arange(3, dtype=np.int32))
    assert fp({"a": 1, "b": 2}) == fp({"b": 2, "a": 1})
    assert fp((1, 2)) != fp((2, 1))


def _row(system: str, status: str, samples: list[float], unit: str = "items/s") -> Row:
    return Row("w", system, system, unit, unit != "s", status, samples=samples)


def test_speedups_and_table() -> None:
    rows = [
        _row("easycore", "ok", [100.0, 120.0, 110.0]),
        _row("reference", "ok", [10.0, 11.0]),
        _row("bad", "wrong", [1000.0]),
        _row("gone", "unavailable", []),
    ]
    report.add_speedups(rows)
    assert rows[0].easycore_speedup == pytest.approx(1.0)
    assert rows[1].easycore_speedup == pytest.approx(110.0 / 10.5)
    assert rows[2].easycore_speedup is None and rows[3].easycore_speedup is None
    times = [_row("easycore", "ok", [0.5], "s"), _row("reference", "ok", [2.0], "s")]
    report.add_speedups(times)
    assert times[1].easycore_speedup == pytest.approx(4.0)  # easycore starts 4x faster
    info = {"w": {"title": "t", "unit": "items/s", "higher_is_better": True, "items": 5}}
    machine = report.machine_info()
    settings = {"devices": ["cpu"], "repeats": 3, "timeout": 1.0, "memcpy_mib": 8}
    settings["memcpy_gbps"] = 1.0
    text = report.format_table(rows, info, machine, settings)
    assert "WRONG" in text and "FAILED" in text and "unavailable" in text
    assert json.dumps(report.to_json(rows, info, machine, settings))


def test_user_rows_compared_with_reference() -> None:
    w = workloads.Workload(
        "user",
        "t",
        workloads.BaseHooks,
        True,
        "items/s",
        1,
        1,
        range,
        None,
        verify_by_fingerprint=True,
    )
    rows = [_row("reference", "ok", [1.0]), _row("easycore", "ok", [2.0])]
    rows[0].fingerprint, rows[1].fingerprint = "a", "b"
    verify_user_rows(rows, w)
    assert rows[1].status == "wrong"
    w.ordered = False
    rows[1].status = "ok"
    verify_user_rows(rows, w)
    assert rows[1].status == "differs"


def _plot_rows() -> tuple[list[Row], dict[str, dict[str, Any]]]:
    rows = [
        _row("easycore", "ok", [100.0, 120.0, 110.0]),
        _row("reference", "ok", [10.0, 11.0]),
        _row("bad", "wrong", [1000.0]),
        _row("gone", "unavailable", []),
        Row("t", "easycore", "easycore", "s", False, "ok", samples=[0.5, 0.6]),
        Row("t", "reference", "reference", "s", False, "ok", samples=[2.0]),
    ]
    report.add_speedups(rows)
    info = {
        "w": {"title": "throughput", "unit": "items/s", "higher_is_better": True},
        "t": {"title": "start-up", "unit": "s", "higher_is_better": False},
    }
    return rows, info


def test_plot_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows, info = _plot_rows()
    path = tmp_path / "p.png"
    assert report.write_plot(str(path), rows, info) is None
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG")
    assert len(data) > 10_000
    assert report.write_plot(str(path), rows[3:4], info) == "nothing to plot"


def test_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rows, info = _plot_rows()
    why = report.write_plot(str(tmp_path / "p.png"), rows, info)
    assert why is not None and "matplotlib" in why
    assert not (tmp_path / "p.png").exists()


def test_the_sweep_covers_both_paths_and_stays_out_of_the_default_run() -> None:
    sweep = [w for w in workloads.WORKLOADS.values() if w.name.startswith("sweep_")]
    assert {w.item_bytes for w in sweep} == set(workloads.SWEEP_SIZES)
    assert len(sweep) == 2 * len(workloads.SWEEP_SIZES)
    assert not any(w.in_default_run for w in sweep)
    assert workloads.WORKLOADS["numpy_16mib_shm"].in_default_run
