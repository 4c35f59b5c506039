"""Multi-process runners on easycore's Rust shared-memory core.

Subclass :class:`UnorderedRunner` or :class:`OrderedRunner`, override the static hooks, and
call the runner on any iterable. See docs/architecture.md for the data path.
Inside producer hooks, :func:`worker_info` says which producer runs (index, number of
producers, device, seed).
"""

from easycore._engine.producer import WorkerInfo, worker_info
from easycore._engine.stats import RunnerStats
from easycore.common.parallel.engine import BaseRunner, OrderedRunner, UnorderedRunner

__all__ = [
    "BaseRunner",
    "OrderedRunner",
    "RunnerStats",
    "UnorderedRunner",
    "WorkerInfo",
    "worker_info",
]
