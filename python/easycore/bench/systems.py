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

import concurrent.futures
import contextlib
import hashlib
import importlib
import multiprocessing as mp
import multiprocessing.util
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from easycore.bench import reference
from easycore.bench.workloads import HOOKS, Workload, torch_available
from easycore.parallel import context as pool_context


class HookSet(Protocol):
    """A class with the six static hooks (:class:`Job`'s ``hooks``), as
    :class:`~easycore.common.parallel.hooks.RunnerHooks` has them; the results of the
    ``*_init``, ``producer_end`` and ``consumer_work`` hooks are not used."""

    @staticmethod
    def producer_init(device: str, cfg: Any) -> object: ...

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any: ...

    @staticmethod
    def producer_end(device: str, cfg: Any) -> object: ...

    @staticmethod
    def consumer_init(cfg: Any) -> object: ...

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> object: ...

    @staticmethod
    def consumer_end(cfg: Any) -> Any: ...


@dataclass
class Job:
    """What a system runs: hooks, data and devices.

    Attributes:
        hooks: a class with the six static hooks (a user's runner subclass works too).
        ordered: results must reach ``consumer_work`` in input order.
        devices: one producer/worker per entry.
        make_data: ``n -> iterable`` of fresh input items.
        chunksize: the tuned chunk size for pools.
        torch_flavour: use :mod:`easycore.torch.parallel` for the easycore runner.
        user_runner: the user's runner class (run as-is by the easycore system when it
            subclasses easycore's runner).
    """

    hooks: type[HookSet]
    ordered: bool
    devices: list[str]
    make_data: Callable[[int], Iterable[Any]]
    chunksize: int = 1
    torch_flavour: bool = False
    user_runner: type | None = None


Call = Callable[[Iterable[Any]], Any]


class System:
    """A system under test."""

    key: str = ""
    title: str = ""
    description: str = ""
    """One line for ``--list`` (default: the first line of the class's docstring)."""
    in_default_run: bool = True
    """Whether a run without ``--systems`` includes it."""

    def label(self, job: Job) -> str:
        """The table's name for this system on this job."""
        return self.title

    def unavailable(self, job: Job) -> str | None:
        """Why this system cannot run this job (e.g. a missing package), or None."""
        return None

    def reads_ahead(self, job: Job) -> bool:
        """Whether the system reads items before earlier results are out (chunks, prefetch):
        then a feedback input (item i+1 released by result i) deadlocks it by design."""
        return False

    def cannot_run(self, job: Job) -> str | None:
        """:meth:`unavailable`, or why a feedback workload cannot run on this system."""
        if getattr(job.hooks, "one_in_flight", False) and self.reads_ahead(job):
            return "reads its input ahead: a feedback loop (item i+1 after result i) deadlocks it"
        return self.unavailable(job)

    def session(self, job: Job) -> contextlib.AbstractContextManager[Call]:
        """Starts the system; yields ``call(data) -> consumer_end's value``; shuts down."""
        raise NotImplementedError


def run_consumer(hooks: type[HookSet], results: Iterable[Any]) -> Any:
    """The consumer hooks over ``results``, in the calling process (pool systems)."""
    cfg = reference.make_cfg()
    hooks.consumer_init(cfg)
    for r in results:
        hooks.consumer_work(cfg, r)
    return hooks.consumer_end(cfg)


# ---------------------------------------------------------------------------------------
# runners


_REBASED: dict[str, type] = {}
_REBASED_PREFIX = "_Rebased_"


def _resolve(path: str) -> Any:
    """``"package.module:Qual.Name"`` -> the object."""
    mod, _, qual = path.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _path(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def rebase(hooks: type[HookSet], base: type) -> type:
    """A subclass of runner class ``base`` with the six hooks of ``hooks``.

    The class is importable by name from this module (so runners that start producers with
    ``spawn`` can pickle it), provided ``hooks`` and ``base`` are importable themselves.
    """
    name = _REBASED_PREFIX + f"{_path(hooks)}|{_path(base)}".encode().hex()
    cls = _REBASED.get(name)
    if cls is None:
        ns: dict[str, Any] = {h: staticmethod(getattr(hooks, h)) for h in HOOKS}
        ns.update(__module__=__name__, __qualname__=name, __doc__=f"{hooks.__name__} hooks")
        cls = type(name, (base,), ns)
        _REBASED[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """Re-creates rebased runner classes by name (what unpickling one in a child does)."""
    if name.startswith(_REBASED_PREFIX):
        hooks, _, base = bytes.fromhex(name[len(_REBASED_PREFIX) :]).decode().partition("|")
        return rebase(_resolve(hooks), _resolve(base))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TunableSystem(System):
    """A system with a default and a ``tuned`` variant (given the job's chunk size): each
    its own key and ``--list`` line, ``(default, tuned)``."""

    keys: tuple[str, str] = ("", "")
    descriptions: tuple[str, str] = ("", "")

    def __init__(self, tuned: bool = False) -> None:
        self.tuned = tuned
        self.key = self.keys[tuned]
        self.description = self.descriptions[tuned]


class RunnerSystem(System):
    """A runner with the manual's API: ``Runner(devices=...)``, ``runner(data)``, ``close()``."""

    def bases(self, job: Job) -> tuple[type, type]:
        """``(UnorderedRunner, OrderedRunner)`` of this system."""
        raise NotImplementedError

    def runner_class(self, job: Job) -> type:
        """The job's hooks on this system's runner (the user's class itself if it fits)."""
        base = self.bases(job)[1 if job.ordered else 0]
        if job.user_runner is not None and issubclass(job.user_runner, base):
            return job.user_runner
        return rebase(job.hooks, base)

    @contextlib.contextmanager
    def session(self, job: Job) -> Iterator[Call]:
        runner = self.runner_class(job)(devices=list(job.devices))
        try:
            yield runner
        finally:
            runner.close()


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


class ReferenceSystem(RunnerSystem):
    """The pure-Python reference runner (the original design on ``multiprocessing.Queue``)."""

    key = "reference"

    def label(self, job: Job) -> str:
        flavour = "OrderedRunner" if job.ordered else "UnorderedRunner"
        return f"pure-Python reference {flavour} (mp.Queue)"

    def bases(self, job: Job) -> tuple[type, type]:
        return reference.UnorderedRunner, reference.OrderedRunner


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
        chunksize = self._chunksize(job)

        def call(data: Iterable[Any]) -> Any:
            imap = pool.imap if job.ordered else pool.imap_unordered
            return run_consumer(job.hooks, imap(_worker_work, data, chunksize))

        try:
            yield call
        finally:
            pool.close()
            pool.join()


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
        chunksize = self._chunksize(job)

        def call(data: Iterable[Any]) -> Any:
            imap = pool.imap if job.ordered else pool.imap_unordered
            return run_consumer(job.hooks, imap(_ec_pool_work, data, chunksize))

        try:
            yield call
        finally:
            pool.close()
            pool.join()


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


# ---------------------------------------------------------------------------------------
# measuring


def fingerprint(x: Any) -> str:
    """A digest of a result's value (arrays and tensors by content), to compare results
    of different systems without sending them between processes."""
    h = hashlib.sha256()

    def feed(o: Any) -> None:
        if hasattr(o, "detach") and hasattr(o, "cpu") and hasattr(o, "numpy"):
            o = o.detach().cpu().numpy()
        if hasattr(o, "tobytes") and hasattr(o, "dtype") and hasattr(o, "shape"):
            h.update(f"array{o.dtype}{tuple(o.shape)}".encode())
            h.update(o.tobytes())
        elif isinstance(o, list | tuple):
            h.update(f"{type(o).__name__}{len(o)}(".encode())
            for e in o:
                feed(e)
            h.update(b")")
        elif isinstance(o, dict):
            h.update(f"dict{len(o)}(".encode())
            for k in sorted(o, key=repr):
                feed(k)
                feed(o[k])
            h.update(b")")
        elif isinstance(o, set | frozenset):
            h.update(f"set{sorted(repr(e) for e in o)}".encode())
        elif o is None or isinstance(o, bool | int | float | complex | str | bytes):
            h.update(repr(o).encode())
        else:
            try:
                h.update(pickle.dumps(o, protocol=4))
            except Exception:
                h.update(repr(o).encode())

    feed(x)
    return h.hexdigest()[:16]


class _Counted:
    """Wraps an iterable and counts the items taken from it."""

    def __init__(self, it: Iterable[Any]) -> None:
        self.it = it
        self.n = 0

    def __iter__(self) -> Iterator[Any]:
        for x in self.it:
            self.n += 1
            yield x


@dataclass
class CellSpec:
    """One (system, workload) measurement."""

    system: System
    workload: Workload
    job: Job
    items: int
    repeats: int
    warmup_items: int


def measure(spec: CellSpec) -> dict[str, Any]:
    """Runs the measurement in this process; returns figures and verification.

    Returns:
        dict with ``status`` (``"ok"`` or ``"wrong"``), ``samples`` (one figure per repeat),
        ``seconds``, ``items`` (items in the last timed call), ``detail`` and, for workloads
        without an expected value, ``fingerprint`` of the last result.
    """
    w, job, n = spec.workload, spec.job, spec.items
    problems: list[str] = []
    samples: list[float] = []
    seconds: list[float] = []
    last: Any = None
    counted_n = n

    def timed(call: Call) -> None:
        nonlocal last, counted_n
        data = _Counted(job.make_data(n))
        t0 = time.perf_counter()
        last = call(data)
        dt = time.perf_counter() - t0
        counted_n = data.n
        seconds.append(dt)
        samples.append(w.figure(counted_n, dt))
        if (p := w.check(last, counted_n)) is not None:
            problems.append(p)

    if w.startup:
        for _ in range(spec.repeats):
            t0 = time.perf_counter()
            with spec.system.session(job) as call:
                data = _Counted(job.make_data(n))
                last = call(data)
            dt = time.perf_counter() - t0
            counted_n = data.n
            seconds.append(dt)
            samples.append(dt)
            if (p := w.check(last, counted_n)) is not None:
                problems.append(p)
    else:
        with spec.system.session(job) as call:
            if spec.warmup_items:
                wn = min(spec.warmup_items, n)
                warm = call(job.make_data(wn))
                if (p := w.check(warm, wn)) is not None:
                    problems.append(f"warm-up call: {p}")
            for _ in range(spec.repeats):
                timed(call)
    out: dict[str, Any] = {
        "status": "wrong" if problems else "ok",
        "samples": samples,
        "seconds": seconds,
        "items": counted_n,
        "detail": problems[0] if problems else "",
    }
    if w.verify_by_fingerprint:
        out["fingerprint"] = fingerprint(last)
    return out


def _cell_child(conn: Any, spec: CellSpec) -> None:
    """The measuring child: own process group, killed as a group on timeout."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    # If this process is told to stop, take its whole group (the system's workers) with it;
    # the workers it forks get the default SIGTERM back (systems terminate their workers).
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        out = measure(spec)
    except BaseException as e:
        tb = traceback.format_exc()
        out = {"status": "error", "detail": f"{type(e).__name__}: {e}", "traceback": tb}
    try:
        conn.send(out)
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


def kill_group(proc: Any, grace: float = 2.0) -> None:
    """Stops a cell child and everything in its process group."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    proc.join(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    proc.join()
    _sweep_segments()


def _sweep_segments() -> None:
    """Removes shared-memory segments of dead processes (what a killed system leaves)."""
    with contextlib.suppress(Exception):
        from easycore._core import sweep_stale_segments

        sweep_stale_segments()


def run_cell(
    spec: CellSpec, timeout: float, tick: Callable[[float], None] | None = None
) -> dict[str, Any]:
    """Measures ``spec`` in a forked child with a ``timeout`` (seconds).

    ``tick(elapsed)`` is called about twice a second while waiting (progress display).
    A child that runs past the timeout is killed with its process group and the result is
    ``{"status": "timeout"}``. On KeyboardInterrupt the child is killed and the exception
    propagates.
    """
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_cell_child, args=(send, spec), daemon=False)
    t0 = time.monotonic()
    proc.start()
    send.close()
    try:
        while True:
            elapsed = time.monotonic() - t0
            if tick is not None:
                tick(elapsed)
            if recv.poll(min(0.5, max(0.0, timeout - elapsed))):
                try:
                    out: dict[str, Any] = recv.recv()
                except EOFError:
                    proc.join()
                    return {
                        "status": "error",
                        "detail": f"measuring process died (exit code {proc.exitcode})",
                    }
                out["wall_s"] = time.monotonic() - t0
                proc.join(10.0)
                if proc.is_alive():
                    kill_group(proc)
                else:
                    # workers the system left running in the group are stopped too
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(cast(int, proc.pid), signal.SIGKILL)  # started: has a pid
                return out
            if time.monotonic() - t0 >= timeout:
                kill_group(proc)
                return {"status": "timeout", "detail": f"no result after {timeout:g} s"}
    except BaseException:
        kill_group(proc)
        raise
    finally:
        recv.close()
