"""A function-style process pool and an inter-process object queue on easycore's core.

For users of ``multiprocessing.Pool``, ``concurrent.futures``, mpire or machin (see
``docs/pool.md``)::

    from easycore.parallel import Pool

    with Pool(4) as pool:
        squares = pool.map(lambda x: x * x, range(1000))
        future = pool.submit(pow, 2, 10)

:class:`Pool` runs on the same engine as the runners of :mod:`easycore.common.parallel`
(Rust shared-memory queues, adaptive batching, devices, seeds, typed remote errors).
"""

from easycore._engine.producer import WorkerInfo, worker_info
from easycore.parallel.executor import PoolExecutor
from easycore.parallel.objqueue import Queue
from easycore.parallel.pool import Pool
from easycore.parallel.results import AsyncResult
from easycore.parallel.tasks import context

__all__ = [
    "AsyncResult",
    "Pool",
    "PoolExecutor",
    "Queue",
    "WorkerInfo",
    "context",
    "worker_info",
]
