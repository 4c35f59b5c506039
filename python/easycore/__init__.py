"""easycore: spread work over CPU and GPU processes, plus the small tools ML pipelines need.

The names users reach for first are here (``from easycore import OrderedRunner, Pool``);
each is imported on first use, so ``import easycore`` stays cheap.

Subpackages and modules:

* :mod:`easycore.common.parallel` — ``UnorderedRunner`` / ``OrderedRunner`` (the manual's
  runners) on a Rust shared-memory core.
* :mod:`easycore.parallel` — ``Pool`` / ``PoolExecutor`` (``multiprocessing.Pool`` and
  ``concurrent.futures`` on the same engine) and an inter-process object ``Queue``.
* :mod:`easycore.shm` — numpy arrays born in shared memory (results with no copy).
* :mod:`easycore.torch` — the runners and the pool on ``torch.multiprocessing``, and
  ``easycore.torch.shm`` (needs torch).
* :mod:`easycore.ray` — runners and pools on a Ray cluster (``pip install 'easycore[ray]'``).
* :mod:`easycore.common.config` — ``CfgNode`` and ``HierarchicalCfgNode``.
* :mod:`easycore.common.registry` — ``Registry``.
* :mod:`easycore.common.path` — ``PathManager`` and path handlers, ``file_lock``.
* :mod:`easycore.common.network` — ``download_file``.
* :mod:`easycore.errors` — every exception easycore raises, under ``EasycoreError``.
* :mod:`easycore.bench` — the side-by-side benchmark (``python -m easycore.bench``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from easycore import errors
from easycore.errors import (
    EasycoreError,
    InvalidArgument,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    RunnerBusyError,
    RunnerClosedError,
    RunnerTimeoutError,
    SerializationError,
    SharedMemoryError,
    StartMethodError,
    WorkerDiedError,
    WorkerError,
)

if TYPE_CHECKING:
    from easycore import shm
    from easycore.common.config import CfgNode
    from easycore.common.parallel import BaseRunner, OrderedRunner, UnorderedRunner
    from easycore.common.path import PathManager, file_lock
    from easycore.common.registry import Registry
    from easycore.parallel import Pool, PoolExecutor, Queue

__version__ = "0.1.0"

# name -> the module that defines it (imported on first use: the runners and the pool load
# the Rust core, easycore.shm loads numpy)
_LAZY = {
    "BaseRunner": "easycore.common.parallel",
    "OrderedRunner": "easycore.common.parallel",
    "UnorderedRunner": "easycore.common.parallel",
    "Pool": "easycore.parallel",
    "PoolExecutor": "easycore.parallel",
    "Queue": "easycore.parallel",
    "CfgNode": "easycore.common.config",
    "Registry": "easycore.common.registry",
    "PathManager": "easycore.common.path",
    "file_lock": "easycore.common.path",
}
_LAZY_MODULES = {"shm": "easycore.shm"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(_LAZY_MODULES[name])
    else:
        raise AttributeError(f"module 'easycore' has no attribute {name!r}")
    globals()[name] = value  # found here from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


__all__ = [
    "BaseRunner",
    "CfgNode",
    "EasycoreError",
    "InvalidArgument",
    "OrderedRunner",
    "PathManager",
    "Pool",
    "PoolExecutor",
    "Queue",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "Registry",
    "RunnerBusyError",
    "RunnerClosedError",
    "RunnerTimeoutError",
    "SerializationError",
    "SharedMemoryError",
    "StartMethodError",
    "UnorderedRunner",
    "WorkerDiedError",
    "WorkerError",
    "__version__",
    "errors",
    "file_lock",
    "shm",
]
