"""The benchmark's latency workload and imap form."""

from __future__ import annotations

import json
import queue
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_latency_workload_and_imap_form(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "easycore.bench", "--workloads", "latency,tiny_unordered"]
    cmd += ["--systems", "easycore,easycore_imap,pipe", "--items", "60", "--repeats", "1"]
    cmd += ["--no-progress", "--json", str(out), "--timeout", "120"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    status = {(r["workload"], r["system"]): r["status"] for r in data["results"]}
    assert status[("latency", "easycore")] == "ok"
    assert status[("latency", "easycore_imap")] == "ok"
    assert status[("latency", "pipe")] == "ok"
    assert status[("tiny_unordered", "easycore_imap")] == "ok"
    assert status[("tiny_unordered", "pipe")] == "unavailable"


def test_a_batching_system_fails_the_latency_workload_instead_of_hanging(monkeypatch):
    from easycore.bench import workloads

    monkeypatch.setattr(workloads, "FEEDBACK_TIMEOUT_S", 0.2)
    data = workloads.feedback_data(3)
    assert next(iter(data)) == 0
    with pytest.raises(queue.Empty):
        next(data)  # nobody consumed result 0: the input gives up
