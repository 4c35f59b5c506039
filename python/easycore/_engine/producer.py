"""One producer core: what a producer does wherever it runs, a local process
(``easycore._engine.process_main``) or a Ray actor (``easycore.ray._actor``).

:class:`ProducerCore` seeds the random generators and says who it is (:func:`worker_info`),
runs the flavour's device set-up and ``producer_init`` (:meth:`~ProducerCore.init`), one
batch of ``producer_work`` at a time (:meth:`~ProducerCore.run`), and ``producer_end``
(:meth:`~ProducerCore.end`). Every failure becomes an error report (``reports.py``) for the
caller, never an exception of the core: a hook that raised, an item that cannot be
unpickled, a result that cannot be pickled. Its host moves the messages (``(seq, kind,
parts)``, see ``wire.py``) and watches its caller.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from easycore._core import Lifelines
from easycore._engine import lifecycle, wire
from easycore._engine.insights import TIME_EACH_S, SlowItems
from easycore._engine.reports import error_report, not_picklable_report

# Layout of the shared state array of local producers: ``STATE_FIELDS`` int64 words per
# producer, then one global word (``abort_below``), then one lifeline per producer
# (``LIFELINE_WORDS`` words each: see :func:`lifelines`). Per producer: the call and item being
# worked on (ITEM -1: idle), when its batch started, COUNT: 1 when ITEM is tracked item by
# item, else the batch's size (ITEM is then its first item: large batches are only made of
# cheap items, which are not worth a store each), and RETIRED: the pid of a producer that ran
# its ``max_tasks`` and leaves (written after its last result was put; 0 otherwise).
STATE_FIELDS = 5
CALL, ITEM, SINCE_NS, COUNT, RETIRED = 0, 1, 2, 3, 4
_TRACK_ITEMS = 8  # batches of at most this many items are tracked item by item


LIFELINE_WORDS = Lifelines.slot_bytes // 8


def state_size(n_producers: int) -> int:
    """Number of int64 words of the shared state array for ``n_producers``."""
    return (STATE_FIELDS + LIFELINE_WORDS) * n_producers + 1


def lifelines(state: Any, n_producers: int) -> Lifelines | None:
    """The producers' lifelines in their shared ``state`` (None where lifelines do not work):
    producer ``i`` holds lifeline ``i`` from its start on, and the kernel marks it when the
    producer ends, so that the caller sees all alive without a system call."""
    if not Lifelines.supported():
        return None
    return Lifelines(state, 8 * (STATE_FIELDS * n_producers + 1), n_producers)


@dataclass(frozen=True)
class WorkerInfo:
    """Who the current producer is (see :func:`worker_info`).

    Attributes:
        index (int): this producer's position in the runner's ``devices`` (0-based).
        num_producers (int): how many producers the runner has.
        device (str): this producer's device.
        seed (int): the seed given to ``random``, numpy and torch in this producer
            (the runner's ``seed`` plus ``index``).
        pid (int): this producer's process id.
    """

    index: int
    num_producers: int
    device: str
    seed: int
    pid: int


_INFO: WorkerInfo | None = None


def worker_info() -> WorkerInfo | None:
    """Which producer runs the current hook: a :class:`WorkerInfo` inside a producer process
    (in ``producer_init``, ``producer_work`` and ``producer_end``), None elsewhere (in the
    caller and in the consumer hooks).

    Example::

        @staticmethod
        def producer_work(device, cfg, data):
            info = worker_info()
            return data, info.index, info.num_producers
    """
    return _INFO


class Interrupted(BaseException):
    """Raised in a producer by its caller's interrupt: drop the current batch."""


class ProducerHooks(Protocol):
    """What a producer uses of the runner class: the three producer hooks."""

    @staticmethod
    def producer_init(device: str, cfg: Any) -> None: ...
    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any: ...
    @staticmethod
    def producer_end(device: str, cfg: Any) -> Any: ...


def seed_all(seed: int, done: set[str]) -> None:
    """Seeds ``random`` and, where they are imported, numpy and torch (each once)."""
    if "random" not in done:
        random.seed(seed)
        done.add("random")
    np = sys.modules.get("numpy")
    if np is not None and "numpy" not in done:
        try:
            np.random.seed(seed % (1 << 32))
        except Exception:  # noqa: BLE001 - a broken numpy must not stop the producer
            pass
        done.add("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and "torch" not in done and hasattr(torch, "manual_seed"):
        try:
            torch.manual_seed(seed)
        except Exception:  # noqa: BLE001
            pass
        done.add("torch")


_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit value of ``z``."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def item_seed(seed: int, call: int, index: int) -> int:
    """The seed of one item's random stream (``seed_per_item``): a 64-bit value of the base
    seed, the call's number and the item's index in its call, the same in every process."""
    return _mix64(_mix64(_mix64(seed & _MASK64) ^ call) ^ (index & _MASK64))


def seed_for_item(seed: int, call: int, index: int) -> None:
    """Seeds ``random`` and, where they are imported, numpy's global generator and torch's
    CPU generator with :func:`item_seed` (``seed_per_item``: whichever process runs the
    item, whatever ran there before, the item draws the same numbers)."""
    s = item_seed(seed, call, index)
    _ITEM_SEED[0] = s  # an item that imports numpy or torch first: see SeedOnImport
    random.seed(s)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(s & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        gen = getattr(torch, "default_generator", None)
        if gen is not None:
            # The CPU generator only: torch.manual_seed also seeds every accelerator's,
            # at about 75 µs a call.
            gen.manual_seed(s)


# The seed of the item running now (seed_per_item), for numpy or torch imported by the item.
_ITEM_SEED: list[int | None] = [None]


def _seed_module(name: str, module: Any) -> None:
    """Seeds numpy or torch, just imported by an item, with that item's seed."""
    s = _ITEM_SEED[0]
    if s is None:
        return
    try:
        if name == "numpy":
            module.random.seed(s & 0xFFFFFFFF)
        elif hasattr(module, "default_generator"):
            module.default_generator.manual_seed(s)
    except Exception:  # noqa: BLE001, S110 - a broken module must not stop the producer
        pass


class SeedOnImport:
    """A ``sys.meta_path`` finder that seeds numpy or torch right after a hook first imports
    them in a producer (importing them up front would slow every producer's start)."""

    def __init__(self, seed: int, done: set[str]) -> None:
        self.seed = seed
        self.done = done

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in ("numpy", "torch") or name in self.done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        real_exec = getattr(loader, "exec_module", None)
        if loader is None or real_exec is None:
            return None
        seed, done = self.seed, self.done

        def exec_module(module: Any) -> None:
            real_exec(module)
            sys.modules[name] = module
            seed_all(seed, done)
            _seed_module(name, module)  # imported by an item with its own stream

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this loader only
        return spec


class ProducerCore:
    """One producer's hooks and bookkeeping (see the module).

    Args:
        hooks: the runner class (its static producer hooks are called).
        index: this producer's position in the runner's ``devices``.
        n_producers: how many producers the runner has.
        device: the device string passed to every hook.
        cfg: this producer's own copy of the runner's cfg.
        seed: the runner's base seed (this producer uses ``seed + index``).
        setup: ``setup(device)``, the flavour's device set-up (and the pool's initializer
            keeper), run before ``producer_init``; or None.
        state: the shared state array of local producers (what each works on), or None.
        seed_per_item: seed ``random``, numpy and torch before each item from the base seed,
            the call and the item's index (:func:`seed_for_item`), so that what an item
            draws does not depend on which producer runs it.
        codec: the flavour's codec (None: the plain one).
        fix: ``fix(results, device)``, run on a batch whose results do not pickle: the
            results with the culprits replaced by error reports (the pool's, so that one bad
            result fails only its own call), or None; None: the batch's call fails.
    """

    def __init__(
        self,
        hooks: ProducerHooks,
        index: int,
        n_producers: int,
        device: str,
        cfg: Any,
        seed: int,
        setup: Callable[[str], Any] | None = None,
        state: Any = None,
        seed_per_item: bool = False,
        codec: wire.Codec | None = None,
        fix: Callable[[list[Any], str], list[Any] | None] | None = None,
    ) -> None:
        self.hooks = hooks
        self.index = index
        self.n = n_producers
        self.device = device
        self.cfg = cfg
        self.seed = seed + index
        self.base_seed = seed
        self.seed_per_item = seed_per_item
        self.setup = setup
        self.codec: wire.Codec = codec if codec is not None else wire.Codec()
        self.work = hooks.producer_work
        self.fix = fix
        self.state = memoryview(state).cast("B").cast("q") if state is not None else None
        self.me = STATE_FIELDS * index
        self.abort_word = STATE_FIELDS * n_producers
        self.busy = 0.0  # seconds in producer_work (and unpickling), reported with results
        self.working_call = 0  # the call of the batch being run (0: none)
        self.exit_value: Any = None  # what producer_end returned
        self.init_s = 0.0  # seconds of the set-up and producer_init
        self.slow = SlowItems()  # the call's slowest items
        # Seconds an item took in the last batch (TIME_EACH_S); unknown (inf) before the
        # first: a first batch is timed item by item, whatever its items cost.
        self.item_s = float("inf")

    # ----- start and end -----

    def begin(self, pid: int) -> None:
        """Says who this producer is (:func:`worker_info`) and seeds ``random``, numpy and
        torch (those imported now; the others as soon as a hook imports them)."""
        global _INFO
        _INFO = WorkerInfo(self.index, self.n, self.device, self.seed, pid)
        seeded: set[str] = set()
        seed_all(self.seed, seeded)
        if not {"numpy", "torch"} <= seeded:
            sys.meta_path.insert(0, SeedOnImport(self.seed, seeded))

    def init(self) -> dict[str, Any] | None:
        """Runs the set-up and ``producer_init``: None, or the error report if one raised."""
        t0 = time.perf_counter()
        try:
            if self.setup is not None:
                self.setup(self.device)
            self.hooks.producer_init(self.device, self.cfg)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            return error_report("producer_init", self.device, None, e, "hook")
        self.init_s = time.perf_counter() - t0
        return None

    def end(self) -> dict[str, Any] | None:
        """Runs ``producer_end`` (its return value is kept in :attr:`exit_value`), then stops
        the pools and runners the hooks made here and left open: None, or the error report
        if ``producer_end`` raised."""
        report = None
        try:
            self.exit_value = self.hooks.producer_end(self.device, self.cfg)
        except BaseException as e:  # noqa: BLE001
            report = error_report("producer_end", self.device, None, e, "hook")
        lifecycle.stop_all()
        return report

    def goodbye(self) -> tuple[dict[str, Any] | None, Any]:
        """Runs :meth:`end`; returns what the caller is told: ``(error report or None,
        producer_end's return value)``, the value replaced by an error report if it cannot be
        pickled (it is the caller's ``exit_results``)."""
        report = self.end()
        value = self.exit_value
        if value is not None:
            try:
                self.codec.dumps(value)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - reported to the caller (a
                # __reduce__ that calls sys.exit too: the value is what failed, not the process)
                if report is None:
                    report = not_picklable_report("producer_end", self.device, None, e, value)
                value = None
        return report, value

    def mark_retired(self, pid: int) -> None:
        """Says in the shared state that this producer (``pid``) ran its ``max_tasks`` and
        leaves: every result it made was put before (see ``transport.LocalWorkers``)."""
        if self.state is not None:
            self.state[self.me + RETIRED] = pid

    def interrupted(self) -> bool:
        """Whether the caller gave up on the call being run (local producers)."""
        call, state = self.working_call, self.state
        return bool(call) and state is not None and call < state[self.abort_word]

    # ----- one batch -----

    def run(self, call: int, parts: list[Any], wait_s: float) -> tuple[int, Any, int | None]:
        """Runs ``producer_work`` on one batch (``(first, items)`` in the codec's parts).

        Returns:
            ``(wire.RESULT, parts, first)``, the parts of ``(first, results, index, busy_s,
            wait_s, slow)`` (``slow``: its items that entered the call's slowest, see
            ``insights.SlowItems``, or None), or ``(wire.ERROR, report, first)`` (the report a
            dict, for the host to send); ``first`` is the batch's first item (None if the
            batch did not unpickle).

        Raises:
            Interrupted: the caller's interrupt (the batch is dropped).
        """
        t0 = time.perf_counter()
        try:
            return self._run(call, parts, wait_s, t0)
        except Interrupted:
            self._idle(t0)
            raise

    def _idle(self, t0: float, now: float | None = None) -> float:
        """The batch begun at ``t0`` is over (at ``now``, a clock reading just taken, if
        given): nothing is being worked on. Returns its seconds."""
        self.working_call = 0
        if self.state is not None:
            self.state[self.me + ITEM] = -1
        took = (time.perf_counter() if now is None else now) - t0
        self.busy += took
        return took

    def _run(
        self, call: int, parts: list[Any], wait_s: float, t0: float
    ) -> tuple[int, Any, int | None]:
        device, codec = self.device, self.codec
        try:
            first, items = codec.loads(parts)
        except BaseException as e:  # noqa: BLE001
            report = error_report("producer_work", device, None, e, "unpickle_item")
            return wire.ERROR, report, None
        del parts
        state, me = self.state, self.me
        if state is not None:
            state[me + SINCE_NS] = time.monotonic_ns()
            state[me + CALL] = call
        self.working_call = call
        work, cfg = self.work, self.cfg
        results: list[Any] = []
        append = results.append
        failed = None
        # Each item is timed for stats.slowest (insights.py): one clock read an item, unless
        # the items are known to take microseconds (then the batch is timed as a whole).
        slow, perf = self.slow, time.perf_counter
        floor = slow.floor(call)
        each = self.item_s >= TIME_EACH_S or len(items) <= _TRACK_ITEMS
        t = start = perf()
        try:
            if self.seed_per_item or (state is not None and len(items) <= _TRACK_ITEMS):
                per_item, base = self.seed_per_item, self.base_seed
                if state is not None:
                    state[me + COUNT] = 1
                for k, item in enumerate(items):
                    if state is not None:
                        state[me + ITEM] = first + k
                    if per_item:
                        seed_for_item(base, call, first + k)
                    append(work(device, cfg, item))
                    if each:
                        now = perf()
                        if now - t > floor:
                            floor = slow.note(now - t, first + k, item)
                        t = now
            else:
                if state is not None:
                    state[me + COUNT] = len(items)
                    state[me + ITEM] = first
                if each:
                    for item in items:
                        append(work(device, cfg, item))
                        now = perf()
                        if now - t > floor:
                            floor = slow.note(now - t, first + len(results) - 1, item)
                        t = now
                else:
                    for item in items:
                        append(work(device, cfg, item))
            # (Timed each: the last item's end was just read; a clock read costs a
            # request/response loop at every round trip.)
            end = t if each else perf()
            took = end - start
            self.item_s = took / len(items) if items else took
            if not each and took > floor and items:
                slow.note(took, first, items[0], len(items))
        except Interrupted:
            raise
        except BaseException as e:  # noqa: BLE001
            failed = error_report("producer_work", device, first + len(results), e, "hook")
            end = perf()
        self._idle(t0, end)  # pickling the results is not producer_work's time
        if failed is not None:
            return wire.ERROR, failed, first
        payload = (first, results, self.index, self.busy, wait_s, slow.take())
        try:
            return wire.RESULT, codec.dumps(payload), first
        except BaseException as e:  # noqa: BLE001
            fixed = self._dumps_fixed(payload)
            if fixed is not None:
                return wire.RESULT, fixed, first
            report = not_picklable_report("producer_work", device, first, e, results)
            return wire.ERROR, report, first

    def _dumps_fixed(self, payload: tuple[Any, ...]) -> list[Any] | None:
        """The batch's results did not pickle: if the hooks have a fixer (the pool's), the
        results it returns (the culprits replaced by error reports) are pickled instead."""
        first, results, *rest = payload
        if self.fix is None:
            return None
        try:
            fixed = self.fix(results, self.device)
            return None if fixed is None else self.codec.dumps((first, fixed, *rest))
        except Interrupted:
            raise
        except BaseException:  # noqa: BLE001 - reported as the batch's error
            return None
