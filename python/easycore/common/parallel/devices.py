"""Parsing of the ``devices`` argument and the choice of a start method."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

from easycore.errors import InvalidArgument

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")
START_METHODS = ("fork", "spawn", "forkserver")


def parse_devices(devices: int | Iterable[str]) -> list[str]:
    """Turns ``devices`` into a list of device strings.

    Args:
        devices (int or Iterable[str]): a count of ``"cpu"`` producers, or device strings
            such as ``["cpu", "cuda:0", "cuda:1"]``.

    Returns:
        list[str]: one device per producer process.

    Raises:
        InvalidArgument: for a count below 1, an empty list, or an unknown device string.
    """
    out = device_entries(devices, "an int or an iterable of str")
    for d in out:
        if not isinstance(d, str) or not _DEVICE.match(d):
            raise InvalidArgument(
                f"unknown device {d!r}: use 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu:N'"
            )
    return out


def cuda_index(device: str) -> int:
    """The index of a ``"cuda"`` or ``"cuda:N"`` device (``"cuda"`` is device 0)."""
    return int(device.split(":", 1)[1]) if ":" in device else 0


def device_entries(devices: Any, what: str, single: tuple[type, ...] = (str,)) -> list[Any]:
    """The entries of a ``devices`` argument, before each is checked: an int ``n`` is ``n``
    ``"cpu"`` entries, one entry of a ``single`` type is a list of it, an iterable is
    listed. ``what`` says what is accepted, for the errors.

    Raises:
        InvalidArgument: for a bool, a count below 1, a non-iterable or an empty list.
    """
    if isinstance(devices, bool):
        raise InvalidArgument(f"devices must be {what}, got {devices!r}")
    if isinstance(devices, int):
        if devices < 1:
            raise InvalidArgument(f"devices must be at least 1, got {devices}")
        return ["cpu"] * devices
    if isinstance(devices, single):
        devices = [devices]
    try:
        out = list(devices)
    except TypeError:
        raise InvalidArgument(f"devices must be {what}, got {type(devices).__name__}") from None
    if not out:
        raise InvalidArgument("devices is empty: give at least one device, e.g. ['cpu']")
    return out


def uses_gpu(devices: list[str]) -> bool:
    """Whether any device is an accelerator (which must not be used in a forked child)."""
    return any(d != "cpu" for d in devices)


def choose_start_method(requested: str | None, devices: list[str]) -> str:
    """The start method for producer processes.

    The default is ``"fork"`` (fastest start, and hooks defined anywhere work) when it is
    safe: on Linux, with CPU devices only, and while the calling process runs a single
    thread. Otherwise ``"spawn"``: forking a process that holds CUDA state or other threads
    can deadlock or crash the child. Accelerator devices always use ``"spawn"``.

    Raises:
        InvalidArgument: for an unknown method, or ``"fork"`` with an accelerator device.
    """
    if requested is not None:
        if requested not in START_METHODS:
            raise InvalidArgument(
                f"start_method must be one of {START_METHODS} or None, got {requested!r}"
            )
        if requested == "fork" and uses_gpu(devices):
            raise InvalidArgument(
                "start_method='fork' cannot be used with GPU devices (CUDA does not survive "
                "fork); use 'spawn' or leave start_method=None"
            )
        return requested
    if uses_gpu(devices) or not sys.platform.startswith("linux"):
        return "spawn"
    if threading.active_count() > 1:
        return "spawn"
    return "fork"


def start_method_reason(requested: str | None, devices: list[str], method: str) -> str:
    """Why ``method`` was chosen, in words (shown in the runner's repr and in errors)."""
    if requested is not None:
        return "asked for with start_method="
    if uses_gpu(devices):
        return "a GPU device is used (CUDA does not survive fork)"
    if not sys.platform.startswith("linux"):
        return f"fork is not the safe default on {sys.platform}"
    if method == "spawn":
        return (
            f"{threading.active_count()} threads were running when the runner was made "
            "(forking a process with threads can deadlock the child)"
        )
    return "the default on Linux for CPU-only runners made while one thread runs"
