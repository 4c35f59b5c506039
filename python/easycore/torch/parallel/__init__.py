"""The runners of :mod:`easycore.common.parallel` on ``torch.multiprocessing``.

Same API and behaviour, plus:

* CPU tensors in items and results travel through shared memory without an in-band copy
  (see :mod:`easycore.torch.parallel.codec`); CUDA tensors arrive as CPU tensors.
* A producer for ``"cuda:N"`` calls ``torch.cuda.set_device(N)`` before ``producer_init``;
  devices are checked against ``torch.cuda.device_count()`` at construction.
* Thread policy: a ``"cpu"`` producer sets ``torch.set_num_threads(max(1, cores // n))``,
  where ``n`` is the number of producers, so producers do not oversubscribe the cores; under
  ``fork`` it uses one thread, as DataLoader's workers do (torch's OpenMP pool does not
  survive a fork: a forked child that used several threads after the caller had used them
  would hang). Ask for ``start_method="spawn"`` for multi-threaded CPU producers.
* Processes start with ``spawn`` when any device is a GPU or CUDA is already initialised in
  the caller; otherwise as in :mod:`easycore.common.parallel`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.multiprocessing

from easycore._engine.flavour import Flavour
from easycore._engine.producer import WorkerInfo, worker_info
from easycore.common.parallel import engine
from easycore.common.parallel.devices import cuda_index
from easycore.errors import InvalidArgument
from easycore.parallel import executor as _executor
from easycore.parallel import pool as _pool
from easycore.parallel import tasks as _tasks
from easycore.torch.parallel.codec import TorchCodec


class _TorchSetup:
    """Run first in each producer: picks the CUDA device or the CPU thread count."""

    def __init__(self, n_producers: int, forked: bool = False) -> None:
        self.n_producers = n_producers
        # Forked: the worker has set one torch thread already (process_main's
        # _one_torch_thread: torch's OpenMP pool does not survive a fork), and it stays so.
        self.forked = forked

    def __call__(self, device: str) -> None:
        if device.startswith("cuda"):
            torch.cuda.set_device(cuda_index(device))
        elif device == "cpu":
            if self.forked:
                return
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            torch.set_num_threads(max(1, cores // self.n_producers))


class TorchFlavour(Flavour):
    """The runners on ``torch.multiprocessing`` (see the module)."""

    name = "torch"

    def codec(self) -> TorchCodec:
        return TorchCodec()

    def start_context(self, method: str) -> Any:
        return torch.multiprocessing.get_context(method)

    def check_devices(self, devices: list[str]) -> None:
        n_cuda = torch.cuda.device_count()
        for d in devices:
            if d.startswith("cuda"):
                if cuda_index(d) >= n_cuda:
                    raise InvalidArgument(
                        f"device {d!r} does not exist: this machine has {n_cuda} CUDA device(s)"
                        + ("" if n_cuda else " (or torch was built without CUDA)")
                    )
            elif d == "mps" and not torch.backends.mps.is_available():
                raise InvalidArgument("device 'mps' is not available on this machine")

    def default_start_method(self, requested: str | None) -> str | None:
        if requested is None and torch.cuda.is_initialized():
            return "spawn"
        return requested

    def producer_setup(self, n_producers: int, start_method: str) -> _TorchSetup:
        return _TorchSetup(n_producers, forked=start_method == "fork")


TORCH = TorchFlavour()


class BaseRunner(engine.BaseRunner):
    __doc__ = engine.BaseRunner.__doc__
    _flavour = TORCH


class UnorderedRunner(BaseRunner):
    """A multi-process runner whose consumer receives data unordered, on
    ``torch.multiprocessing``."""

    _ordered = False


class OrderedRunner(BaseRunner):
    """A multi-process runner whose consumer receives data in input order, on
    ``torch.multiprocessing``."""

    _ordered = True


class _TorchTaskRunner(_tasks.TaskHooks, UnorderedRunner):
    """The runner behind the torch :class:`Pool`."""


class Pool(_pool.Pool):
    __doc__ = (_pool.Pool.__doc__ or "") + (
        "\n    On ``torch.multiprocessing``: CPU tensors travel through shared memory, a "
        '``"cuda:N"`` worker has its device set before ``initializer``.\n'
    )
    _runner_cls = _TorchTaskRunner


class PoolExecutor(_executor.PoolExecutor):
    __doc__ = _executor.PoolExecutor.__doc__
    _pool_cls = Pool


context = _tasks.context

__all__ = [
    "BaseRunner",
    "OrderedRunner",
    "Pool",
    "PoolExecutor",
    "UnorderedRunner",
    "WorkerInfo",
    "context",
    "worker_info",
]
