"""What a system under test is: :class:`System` (one small interface), the :class:`Job` it
runs, the six hooks (:class:`HookSet`), and the runner-subclassing helpers every runner system
shares (:func:`rebase`, :class:`RunnerSystem`).

A :class:`System` turns a :class:`Job` (the six hooks, the data, the devices) into a
*session*: a context manager that starts the system's processes, yields ``call(data)`` (which
runs every item through ``producer_work`` into ``consumer_work`` and returns
``consumer_end``'s value), and shuts everything down on exit. Runner systems subclass the
runner with the job's hooks; pool systems run ``producer_init``/``producer_work`` in their
workers and the consumer hooks in the calling process.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import easycore.bench.reference as reference
from easycore.bench.workloads import HOOKS


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


@contextlib.contextmanager
def pool_calls(
    pool: Any, work: Callable[[Any], Any], job: Job, chunksize: int | None
) -> Iterator[Call]:
    """Yields ``call(data)``: ``work`` over ``data`` through ``pool.imap`` (ordered jobs) or
    ``pool.imap_unordered`` with ``chunksize``, the consumer hooks run in the calling
    process; closes and joins ``pool`` after (any pool with the stdlib's ``Pool`` API)."""

    def call(data: Iterable[Any]) -> Any:
        imap = pool.imap if job.ordered else pool.imap_unordered
        return run_consumer(job.hooks, imap(work, data, chunksize))

    try:
        yield call
    finally:
        pool.close()
        pool.join()


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
