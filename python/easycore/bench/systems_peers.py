"""The peers easycore is measured against: a bare ``multiprocessing`` Pipe per worker
(``pipe``), ``multiprocessing.Pool`` (``pool_imap``, ``pool_imap_tuned``),
``concurrent.futures.ProcessPoolExecutor`` (``ppe``) and torch's ``DataLoader``
(``dataloader``, ``dataloader_per_call``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing as mp
import multiprocessing.util
from collections.abc import Iterable, Iterator
from typing import Any

import easycore.bench.reference as reference
from easycore.bench.system_api import (
    Call,
    HookSet,
    Job,
    System,
    TunableSystem,
    pool_calls,
    run_consumer,
)
from easycore.bench.workloads import torch_available


def _pipe_worker(conn: Any, hooks: type[HookSet], device: str) -> None:
    """One worker on a Pipe: ``producer_work`` on each item received, until None."""
    cfg = reference.make_cfg()
    hooks.producer_init(device, cfg)
    while True:
        item = conn.recv()
        if item is None:
            break
        conn.send(hooks.producer_work(device, cfg, item[0]))
    hooks.producer_end(device, cfg)


class PipeSystem(System):
    """A bare ``multiprocessing.Pipe`` round trip per item to one worker (latency floor)."""

    key = "pipe"

    def label(self, job: Job) -> str:
        return "multiprocessing.Pipe round trip, 1 worker"

    def unavailable(self, job: Job) -> str | None:
        if not getattr(job.hooks, "one_in_flight", False):
            return "only for one-item-in-flight workloads (latency)"
        return None

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        ctx = mp.get_context()
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_pipe_worker, args=(there, job.hooks, job.devices[0]))
        proc.start()

        def results(data: Iterable[Any]) -> Iterator[Any]:
            for x in data:
                here.send((x,))
                yield here.recv()

        try:
            yield lambda data: run_consumer(job.hooks, results(data))
        finally:
            here.send(None)
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


# ---------------------------------------------------------------------------------------
# pools


_WORKER: tuple[type[HookSet], str, Any] | None = None
"""``(hooks, device, cfg)`` of this pool worker process."""


def _worker_init(hooks: type[HookSet], devices: Any) -> None:
    """Pool initializer: takes a device, runs ``producer_init``, schedules ``producer_end``."""
    global _WORKER
    try:
        device = devices.get(timeout=10.0)
    except Exception:
        device = "cpu"
    cfg = reference.make_cfg()
    hooks.producer_init(device, cfg)
    _WORKER = (hooks, device, cfg)
    multiprocessing.util.Finalize(None, hooks.producer_end, args=(device, cfg), exitpriority=10)


def _worker_work(data: Any) -> Any:
    """Pool task: ``producer_work`` on one item."""
    assert _WORKER is not None, "pool worker not initialised"
    hooks, device, cfg = _WORKER
    return hooks.producer_work(device, cfg, data)


def _device_queue(ctx: Any, devices: list[str]) -> Any:
    q = ctx.Queue()
    for d in devices:
        q.put(d)
    return q


class PoolSystem(TunableSystem):
    """``multiprocessing.Pool.imap`` (ordered jobs) or ``imap_unordered``."""

    keys = ("pool_imap", "pool_imap_tuned")
    descriptions = (
        "multiprocessing.Pool.imap / imap_unordered, chunksize 1",
        "multiprocessing.Pool.imap / imap_unordered, chunk size n // (4 * workers)",
    )

    def _chunksize(self, job: Job) -> int:
        return job.chunksize if self.tuned else 1

    def reads_ahead(self, job: Job) -> bool:
        return self._chunksize(job) > 1

    def label(self, job: Job) -> str:
        fn = "imap" if job.ordered else "imap_unordered"
        tuned = ", tuned" if self.tuned else ""
        return f"multiprocessing.Pool.{fn} (chunksize={self._chunksize(job)}{tuned})"

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        ctx = mp.get_context()
        pool = ctx.Pool(
            len(job.devices),
            initializer=_worker_init,
            initargs=(job.hooks, _device_queue(ctx, job.devices)),
        )
        with pool_calls(pool, _worker_work, job, self._chunksize(job)) as call:
            yield call


class ProcessPoolSystem(System):
    """``concurrent.futures.ProcessPoolExecutor.map`` (chunksize 1; always ordered)."""

    key = "ppe"
    title = "concurrent.futures.ProcessPoolExecutor.map"

    def reads_ahead(self, job: Job) -> bool:
        return True  # Executor.map submits every item before it yields a result

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        ctx = mp.get_context()
        ex = concurrent.futures.ProcessPoolExecutor(
            max_workers=len(job.devices),
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(job.hooks, _device_queue(ctx, job.devices)),
        )

        def call(data: Iterable[Any]) -> Any:
            return run_consumer(job.hooks, ex.map(_worker_work, data))

        try:
            yield call
        finally:
            ex.shutdown(wait=True, cancel_futures=True)


def _dl_worker_init(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: the worker's device and ``producer_init``."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    assert info is not None, "worker_init_fn runs in a DataLoader worker"
    ds: _HookDataset = info.dataset  # type: ignore[assignment]
    ds.device = ds.devices[worker_id % len(ds.devices)]
    ds.cfg = reference.make_cfg()
    ds.hooks.producer_init(ds.device, ds.cfg)


class _HookDataset:
    """A map-style dataset whose items are ``producer_work`` of the job's inputs.

    ``key`` is an index into ``items`` or, when ``items`` is None, the input itself (what
    the persistent loader's sampler hands out).
    """

    def __init__(self, hooks: type[HookSet], items: list[Any] | None, devices: list[str]) -> None:
        self.hooks = hooks
        self.items = items
        self.devices = devices
        self.device = devices[0]
        self.cfg: Any = None

    def __len__(self) -> int:
        return len(self.items) if self.items is not None else 0

    def __getitem__(self, key: Any) -> Any:
        data = self.items[key] if self.items is not None else key
        return self.hooks.producer_work(self.device, self.cfg, data)


class _CallInputs:
    """The persistent loader's sampler: each epoch (``iter(loader)``) hands the current
    call's inputs to the workers, as easycore's runners hand theirs to the producers."""

    def __init__(self) -> None:
        self.data: Iterable[Any] = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.data)


class DataLoaderSystem(System):
    """``torch.utils.data.DataLoader(..., persistent_workers=True)``, created once and
    reused by every call (one call = one epoch), as a user running many epochs has it.

    The loader is made once per session: its workers start (and run ``producer_init``) in
    the untimed warm-up call and then stay up. Each call's inputs reach the workers through
    the sampler (an input is the dataset's key) and ``producer_work`` runs in
    ``__getitem__``. Always ordered; numpy results arrive as tensors (shared memory) and are
    viewed back as arrays.
    """

    key = "dataloader"
    description = "torch DataLoader, persistent workers: created once, one epoch per call"

    def reads_ahead(self, job: Job) -> bool:
        return True  # workers prefetch (prefetch_factor items each)

    def label(self, job: Job) -> str:
        return (
            f"torch DataLoader(num_workers={len(job.devices)}, batch_size=None, "
            "persistent_workers=True)"
        )

    def unavailable(self, job: Job) -> str | None:
        return None if torch_available() else "torch is not installed"

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        import torch.utils.data

        inputs = _CallInputs()
        loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
            _HookDataset(job.hooks, None, list(job.devices)),  # type: ignore[arg-type]
            batch_size=None,
            sampler=inputs,
            num_workers=len(job.devices),
            worker_init_fn=_dl_worker_init,
            persistent_workers=True,
        )

        def call(data: Iterable[Any]) -> Any:
            inputs.data = data
            try:
                return run_consumer(job.hooks, loader)
            finally:
                inputs.data = ()

        try:
            yield call
        finally:
            workers = getattr(loader, "_iterator", None)
            if workers is not None:
                workers._shutdown_workers()


class DataLoaderPerCallSystem(DataLoaderSystem):
    """``torch.utils.data.DataLoader(dataset, num_workers=len(devices), batch_size=None)``,
    a new loader per call over the materialised inputs, with its default non-persistent
    workers: worker start-up and ``producer_init`` are inside every call. Always ordered.
    """

    key = "dataloader_per_call"
    description = "torch DataLoader, default workers: a new loader (and workers) per call"
    in_default_run = False  # for information; it adds minutes to a full run

    def label(self, job: Job) -> str:
        return f"torch DataLoader(num_workers={len(job.devices)}, batch_size=None), per call"

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        import torch.utils.data

        def call(data: Iterable[Any]) -> Any:
            ds = _HookDataset(job.hooks, list(data), list(job.devices))
            loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
                ds,  # type: ignore[arg-type]
                batch_size=None,
                num_workers=len(job.devices),
                worker_init_fn=_dl_worker_init,
            )
            return run_consumer(job.hooks, loader)

        yield call
