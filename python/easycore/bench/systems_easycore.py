"""easycore's own systems: its runners (``easycore``, ``easycore_imap``,
``easycore_no_read_ahead``), its process pool (``easycore_pool``) and the pure-Python
reference runner of :mod:`easycore.bench.reference` (``reference``)."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing.util
from collections.abc import Iterator
from typing import Any

import easycore.bench.reference as reference
from easycore.bench.system_api import (
    Call,
    HookSet,
    Job,
    RunnerSystem,
    TunableSystem,
    pool_calls,
    run_consumer,
)
from easycore.bench.workloads import torch_available
from easycore.parallel import context as pool_context


class EasycoreSystem(RunnerSystem):
    """easycore's runners (:mod:`easycore.common.parallel` / :mod:`easycore.torch.parallel`)."""

    key = "easycore"

    def _module(self, job: Job) -> str:
        return "easycore.torch.parallel" if job.torch_flavour else "easycore.common.parallel"

    def label(self, job: Job) -> str:
        flavour = "OrderedRunner" if job.ordered else "UnorderedRunner"
        return f"easycore {self._module(job)}.{flavour}"

    def unavailable(self, job: Job) -> str | None:
        if job.torch_flavour and not torch_available():
            return "torch is not installed"
        try:
            self.bases(job)
        except Exception as e:
            return f"{self._module(job)} not importable ({type(e).__name__}: {e})"
        return None

    def bases(self, job: Job) -> tuple[type, type]:
        mod = importlib.import_module(self._module(job))
        return mod.UnorderedRunner, mod.OrderedRunner


class EasycoreImapSystem(EasycoreSystem):
    """easycore's ``runner.imap`` with the consumer hooks in the caller's thread."""

    key = "easycore_imap"

    def label(self, job: Job) -> str:
        return super().label(job) + ".imap"

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        runner = self.runner_class(job)(devices=list(job.devices))
        try:
            yield lambda data: run_consumer(job.hooks, runner.imap(data))
        finally:
            runner.close()


class EasycoreNoReadAheadSystem(EasycoreImapSystem):
    """``runner.imap(data, read_ahead=False)``: the input read in the caller's thread, one
    item when none is in flight (request/response loops; latency workload only)."""

    key = "easycore_imap_noahead"

    def label(self, job: Job) -> str:
        return super().label(job) + "(read_ahead=False)"

    def unavailable(self, job: Job) -> str | None:
        if not getattr(job.hooks, "one_in_flight", False):
            return "only for one-item-in-flight workloads (latency)"
        return super().unavailable(job)

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        runner = self.runner_class(job)(devices=list(job.devices))
        try:
            yield lambda data: run_consumer(job.hooks, runner.imap(data, read_ahead=False))
        finally:
            runner.close()


class ReferenceSystem(RunnerSystem):
    """The pure-Python reference runner (the original design on ``multiprocessing.Queue``)."""

    key = "reference"

    def label(self, job: Job) -> str:
        flavour = "OrderedRunner" if job.ordered else "UnorderedRunner"
        return f"pure-Python reference {flavour} (mp.Queue)"

    def bases(self, job: Job) -> tuple[type, type]:
        return reference.UnorderedRunner, reference.OrderedRunner


def _ec_pool_init(hooks: type[HookSet]) -> tuple[type[HookSet], str, Any]:
    """easycore Pool initializer: ``producer_init`` on this worker's device; the worker's
    context is ``(hooks, device, cfg)``."""
    from easycore.parallel import worker_info

    info = worker_info()
    device = info.device if info is not None else "cpu"
    cfg = reference.make_cfg()
    hooks.producer_init(device, cfg)
    multiprocessing.util.Finalize(None, hooks.producer_end, args=(device, cfg), exitpriority=10)
    return hooks, device, cfg


def _ec_pool_work(data: Any) -> Any:
    """easycore Pool task: ``producer_work`` on one item, with the worker's context (as
    ``_worker_work`` does for multiprocessing.Pool: no import statement per item)."""
    hooks, device, cfg = pool_context()
    return hooks.producer_work(device, cfg, data)


class EasycorePoolSystem(TunableSystem):
    """easycore's function-style pool: ``Pool.imap`` (ordered jobs) or ``imap_unordered``,
    default (adaptive) batching, or (``tuned``) the chunk size ``pool_imap_tuned`` gets."""

    keys = ("easycore_pool", "easycore_pool_tuned")
    descriptions = (
        "easycore's function-style Pool.imap / imap_unordered, default chunking",
        "easycore's Pool.imap / imap_unordered with pool_imap_tuned's chunk size",
    )

    def _module(self, job: Job) -> str:
        return "easycore.torch.parallel" if job.torch_flavour else "easycore.parallel"

    def _chunksize(self, job: Job) -> int | None:
        return job.chunksize if self.tuned else None

    def reads_ahead(self, job: Job) -> bool:
        return (self._chunksize(job) or 1) > 1  # filling a chunk waits for later items

    def label(self, job: Job) -> str:
        fn = "imap" if job.ordered else "imap_unordered"
        chunk = f" (chunksize={self._chunksize(job)}, tuned)" if self.tuned else ""
        return f"easycore {self._module(job)}.Pool.{fn}{chunk}"

    def unavailable(self, job: Job) -> str | None:
        if job.torch_flavour and not torch_available():
            return "torch is not installed"
        return None

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        pool_cls = importlib.import_module(self._module(job)).Pool
        pool = pool_cls(list(job.devices), initializer=_ec_pool_init, initargs=(job.hooks,))
        with pool_calls(pool, _ec_pool_work, job, self._chunksize(job)) as call:
            yield call
