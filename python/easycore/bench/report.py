"""Machine information, the memcpy reference, and the report: table, JSON, PNG chart."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FAILED = ("wrong", "error", "timeout")
"""Statuses that make the run fail (exit status 1)."""


@dataclass
class Row:
    """One (workload, system) line of the report.

    ``status`` is one of ``ok``, ``wrong`` (the result failed verification), ``differs``
    (user runner, unordered: the result differs from the reference runner's), ``error``,
    ``timeout``, ``unavailable``, ``skipped``, ``interrupted`` or ``reference`` (the memcpy
    line).
    """

    workload: str
    system: str
    label: str
    unit: str
    higher_is_better: bool
    status: str
    detail: str = ""
    samples: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    items: int | None = None
    fingerprint: str | None = None
    wall_s: float | None = None
    """Seconds the whole measurement took (start-up, warm-up, repeats, shutdown)."""
    easycore_speedup: float | None = None
    """How many times better easycore's median is than this row's (>1: easycore is faster)."""

    @property
    def median(self) -> float | None:
        """Median figure over repeats."""
        return statistics.median(self.samples) if self.samples else None

    @property
    def min(self) -> float | None:
        """Smallest figure over repeats."""
        return min(self.samples) if self.samples else None

    @property
    def max(self) -> float | None:
        """Largest figure over repeats."""
        return max(self.samples) if self.samples else None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-able dict (with median, min and max)."""
        d = asdict(self)
        d.update(median=self.median, min=self.min, max=self.max)
        return d


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Cores, Python, numpy/torch/easycore versions, /dev/shm size and the date."""
    shm = None
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": _version("torch"),
        "matplotlib": _version("matplotlib"),
        "easycore": _version("easycore"),
        "dev_shm_bytes": shm,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 3) -> float:
    """One thread's memcpy bandwidth in GB/s: best of ``repeats`` ``np.copyto`` of ``nbytes``.

    The physical reference for the GB/s workloads: delivering an array from one process to
    another cannot beat copying it once.
    """
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)  # fault both in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def add_speedups(rows: list[Row]) -> None:
    """Fills ``easycore_speedup`` of every ok row of a workload where easycore's is ok."""
    by_workload: dict[str, list[Row]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, []).append(r)
    for group in by_workload.values():
        ec = next((r for r in group if r.system == "easycore" and r.status == "ok"), None)
        for r in group:
            r.easycore_speedup = None
            if ec is None or r.status not in ("ok", "reference", "differs"):
                continue
            ours, theirs = ec.median, r.median
            if not ours or not theirs:
                continue
            r.easycore_speedup = ours / theirs if r.higher_is_better else theirs / ours


def fmt_value(v: float | None, unit: str) -> str:
    """A figure for the table."""
    if v is None:
        return "-"
    if unit == "GB/s":
        return f"{v:.3f}"
    if unit == "s":
        return f"{v:.3f}"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def fmt_status(r: Row, width: int = 70) -> str:
    """The status cell: ``ok``, ``WRONG: ...``, ``TIMEOUT``, ``ERROR: ...``, etc."""
    shown = {
        "ok": "ok",
        "wrong": "WRONG",
        "differs": "DIFFERS",
        "error": "ERROR",
        "timeout": "TIMEOUT",
        "reference": "physical reference",
    }.get(r.status, r.status)
    s = f"{shown}: {r.detail}" if r.detail and r.status != "reference" else shown
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 3] + "..."


def format_table(
    rows: list[Row],
    workloads: dict[str, dict[str, Any]],
    machine: dict[str, Any],
    settings: dict[str, Any],
) -> str:
    """The printed report: a header with the machine, then one block per workload."""
    m = machine
    torch_v = m.get("torch") or "not installed"
    lines = [
        "easycore-bench: runners side by side",
        f"machine: {m['cpus']} CPUs ({m['cpus_usable']} usable), {m['machine']}, "
        f"Python {m['python']}, numpy {m['numpy']}, torch {torch_v}, "
        f"easycore {m['easycore']}, load {_load(m)}, {m['date']}",
        f"devices: {','.join(settings['devices'])}; repeats: {settings['repeats']}"
        + (
            f" in each of {settings['rounds']} rounds (systems in turn)"
            if settings.get("rounds", 1) > 1
            else ""
        )
        + f"; timeout per system: {settings['timeout']:g} s"
        + ("; --quick" if settings.get("quick") else ""),
        f"memcpy (1 thread, np.copyto {settings['memcpy_mib']} MiB, best): "
        f"{settings['memcpy_gbps']:.2f} GB/s",
        "figures: median / min / max over repeats; 'easycore x' = how many times better "
        "easycore's median is (>1: easycore faster)",
    ]
    label_w = max([len(r.label) for r in rows] + [24])
    for name, wl in workloads.items():
        group = [r for r in rows if r.workload == name]
        if not group:
            continue
        unit = wl["unit"]
        better = "higher is better" if wl["higher_is_better"] else "lower is better"
        n = wl.get("items")
        lines += [
            "",
            f"[{name}] {wl['title']}"
            + (f"; {n:,} {_what(unit)} per call" if isinstance(n, int) and n > 0 else ""),
            f"  {'system':<{label_w}} {unit + ' median':>14} {'min':>12} {'max':>12} "
            f"{'easycore x':>10}  status   ({better})",
        ]
        for r in group:
            sp = f"{r.easycore_speedup:.2f}" if r.easycore_speedup is not None else "-"
            lines.append(
                f"  {r.label:<{label_w}} {fmt_value(r.median, unit):>14} "
                f"{fmt_value(r.min, unit):>12} {fmt_value(r.max, unit):>12} {sp:>10}  "
                f"{fmt_status(r)}"
            )
    failed = [r for r in rows if r.status in FAILED]
    lines.append("")
    if failed:
        lines.append(
            f"FAILED: {len(failed)} measurement(s): "
            + ", ".join(f"{r.system} on {r.workload} ({r.status})" for r in failed)
        )
    else:
        lines.append("all results verified")
    if settings.get("wall_s") is not None:
        lines[-1] += f" (wall time {settings['wall_s']:.1f} s)"
    return "\n".join(lines)


def format_sweep(
    rows: list[Row], workloads: dict[str, dict[str, Any]], settings: dict[str, Any]
) -> str:
    """The size sweep as a curve: per result size and system, the median GB/s and its ratio
    to the memcpy reference measured in the same run."""
    mc = settings["memcpy_gbps"]
    lines = ["", f"size sweep (median GB/s and x memcpy at {mc:.2f} GB/s)"]
    for name, wl in workloads.items():
        size = wl.get("item_bytes") or 0
        for r in rows:
            if r.workload != name or r.status == "reference":
                continue
            med = r.median
            if med is None:
                lines.append(f"  {size >> 10:>8} KiB  {r.system:<12} {name}: {r.status}")
                continue
            how = "by reference" if name.endswith("_shm") else "copied once"
            lines.append(
                f"  {size >> 10:>8} KiB  {r.system:<12} {how:<13} {med:7.2f} GB/s  "
                f"{med / mc:5.2f}x memcpy"
            )
    return "\n".join(lines)


def _what(unit: str) -> str:
    return "batches" if unit == "batches/s" else "items"


def _load(m: dict[str, Any]) -> str:
    la = m.get("loadavg")
    return "/".join(f"{x:.2f}" for x in la) if la else "?"


def to_json(
    rows: list[Row],
    workloads: dict[str, dict[str, Any]],
    machine: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The whole report as a JSON-able dict."""
    return {
        "machine": machine,
        "settings": settings,
        "workloads": workloads,
        "results": [r.to_json() for r in rows],
        "failed": [f"{r.system}/{r.workload}" for r in rows if r.status in FAILED],
    }


def write_json(path: str, report: dict[str, Any]) -> None:
    """Writes the report as indented JSON."""
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")


def write_plot(path: str, rows: list[Row], workloads: dict[str, dict[str, Any]]) -> str | None:
    """A PNG bar chart: one panel per workload, one bar per system.

    Each bar is the median with min-max whiskers, labelled with its value and, for the other
    systems, the ``easycore x`` ratio (how many times better easycore's median is). Green:
    easycore, blue: the others, gray: the memcpy reference, red: a failed result.

    Returns:
        None on success, else why no chart was written (matplotlib missing, nothing to plot).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no chart written"
    names = [n for n in workloads if any(r.workload == n and r.samples for r in rows)]
    if not names:
        return "nothing to plot"
    n_bars = sum(1 for r in rows if r.samples and r.workload in names)
    height = 0.8 + 1.1 * len(names) + 0.35 * n_bars
    fig, axes = plt.subplots(len(names), 1, figsize=(11, height), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        wl = workloads[name]
        unit = wl["unit"]
        group = [r for r in rows if r.workload == name and r.samples]
        ys = list(range(len(group)))
        med = [r.median or 0.0 for r in group]
        lo = [m - (r.min if r.min is not None else m) for m, r in zip(med, group, strict=True)]
        hi = [(r.max if r.max is not None else m) - m for m, r in zip(med, group, strict=True)]
        ax.barh(ys, med, xerr=[lo, hi], color=[_bar_color(r) for r in group], capsize=3)
        ax.set_yticks(ys)
        ax.set_yticklabels(
            [r.label + (f" ({r.status.upper()})" if r.status in FAILED else "") for r in group],
            fontsize=8,
        )
        ax.invert_yaxis()
        for y, m, h, r in zip(ys, med, hi, group, strict=True):
            text = f"{fmt_value(m, unit)} {unit}"
            if r.easycore_speedup is not None and r.system != "easycore":
                text += f"  (easycore {r.easycore_speedup:.2f}x)"
            ax.annotate(
                text,
                (m + h, y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        right = max(m + h for m, h in zip(med, hi, strict=True)) or 1.0
        ax.set_xlim(0, right * 1.45)  # room for the value labels
        ax.xaxis.set_major_formatter(FuncFormatter(_tick))
        better = "higher is better" if wl["higher_is_better"] else "lower is better"
        ax.set_xlabel(f"{unit} ({better})", fontsize=9)
        title = f"[{name}] {wl['title']}"
        ax.set_title(title if len(title) <= 100 else title[:97] + "...", fontsize=10, loc="left")
    fig.suptitle(
        "easycore-bench: median over repeats (whiskers: min-max); "
        "'easycore Nx' = how many times better easycore's median is",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _bar_color(r: Row) -> str:
    if r.status in FAILED:
        return "tab:red"
    if r.status == "reference":
        return "tab:gray"
    return "tab:green" if r.system == "easycore" else "tab:blue"


def _tick(v: float, _pos: int) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
