"""The systems under test, each behind one small interface, and the bounded measurement.

A :class:`System` turns a :class:`Job` (the six hooks, the data, the devices) into a
*session*: a context manager that starts the system's processes, yields ``call(data)`` (which
runs every item through ``producer_work`` into ``consumer_work`` and returns
``consumer_end``'s value), and shuts everything down on exit. Runner systems subclass the
runner with the job's hooks; pool systems run ``producer_init``/``producer_work`` in their
workers and the consumer hooks in the calling process.

Built-in systems (``--systems``): ``easycore`` (:mod:`easycore.common.parallel`, or
:mod:`easycore.torch.parallel` for torch workloads), ``reference`` (the pure-Python runner
of :mod:`easycore.bench.reference`), ``pool_imap`` (``multiprocessing.Pool.imap`` or
``imap_unordered``, chunksize 1), ``pool_imap_tuned`` (the same with ``Pool.map``'s chunk
size heuristic), ``ppe`` (``concurrent.futures.ProcessPoolExecutor.map``) and ``dataloader``
(``torch.utils.data.DataLoader(num_workers=len(devices), batch_size=None)``).

Tests (or users) add systems with :func:`register_system`.

Each (system, workload) measurement runs in its own forked child process, in its own process
group, so that a hung or crashed system is killed with everything it started
(:func:`run_cell`).
"""

from __future__ import annotations

from easycore.bench.measurement import CellSpec, fingerprint, kill_group, measure, run_cell
from easycore.bench.system_api import (
    Call,
    HookSet,
    Job,
    RunnerSystem,
    System,
    TunableSystem,
    rebase,
    run_consumer,
)
from easycore.bench.systems_easycore import (
    EasycoreImapSystem,
    EasycoreNoReadAheadSystem,
    EasycorePoolSystem,
    EasycoreSystem,
    ReferenceSystem,
)
from easycore.bench.systems_peers import (
    DataLoaderPerCallSystem,
    DataLoaderSystem,
    PipeSystem,
    PoolSystem,
    ProcessPoolSystem,
)

__all__ = [
    "SYSTEMS",
    "Call",
    "CellSpec",
    "DataLoaderPerCallSystem",
    "DataLoaderSystem",
    "EasycoreImapSystem",
    "EasycoreNoReadAheadSystem",
    "EasycorePoolSystem",
    "EasycoreSystem",
    "HookSet",
    "Job",
    "PipeSystem",
    "PoolSystem",
    "ProcessPoolSystem",
    "ReferenceSystem",
    "RunnerSystem",
    "System",
    "TunableSystem",
    "fingerprint",
    "kill_group",
    "measure",
    "rebase",
    "register_system",
    "run_cell",
    "run_consumer",
]

SYSTEMS: dict[str, System] = {}
"""Every system by key, in table order; :func:`register_system` adds one."""


def register_system(system: System) -> System:
    """Adds (or replaces) a system in :data:`SYSTEMS`."""
    SYSTEMS[system.key] = system
    return system


for _s in (
    EasycoreSystem(),
    ReferenceSystem(),
    PoolSystem(tuned=False),
    PoolSystem(tuned=True),
    ProcessPoolSystem(),
    DataLoaderSystem(),
    DataLoaderPerCallSystem(),
):
    register_system(_s)
register_system(EasycoreImapSystem())
register_system(EasycoreNoReadAheadSystem())
register_system(PipeSystem())
register_system(EasycorePoolSystem())
register_system(EasycorePoolSystem(tuned=True))
