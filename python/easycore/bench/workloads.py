"""The built-in workloads: what runs, how much of it, and what the right answer is.

A workload is a class of the six static runner hooks (:data:`HOOKS`) plus the data it runs
on and an *independently computed* expected result. Every system under test runs the same
hooks on the same data; :meth:`Workload.check` compares what ``consumer_end`` returned with
the expectation, so a fast wrong answer shows as ``WRONG``.

Built-in workloads (``--workloads``):

* ``tiny_unordered`` / ``tiny_ordered``: ``x * x`` over ``range(n)`` ints, summed (unordered)
  or folded into an order-sensitive hash (ordered). Unit: items/s.
* ``tiny_collect``: ``x * x`` over ints, each result appended to a list (what
  ``list(pool.imap_unordered(...))`` does). Its consumer costs about a fifth of
  ``tiny_unordered``'s (one ``CfgNode`` attribute read an item, not two reads and two
  writes), so what the systems themselves spend per item shows. Unit: items/s.
* ``numpy_1mib`` / ``numpy_16mib``: each producer returns a fresh ``np.full`` uint8 array
  stamped with the item's index; the consumer reads the stamp and one byte per 4 KiB page
  (so every page is really delivered). Unit: GB/s (1e9 bytes/s) delivered to
  ``consumer_work``.
* ``tensor_16mib``: as ``numpy_16mib`` with torch tensors made on each producer's device
  (``--devices cuda:0`` measures a GPU producer, its device-to-host copy included). Needs
  torch.
* ``numpy_1mib_list``: as ``numpy_1mib``, its arguments a list (``pool.map(f, items)``'s
  usual input), which a pool slices into chunks where it reads a generator item by item.
  Run only when named.
* ``numpy_16mib_shm``: as ``numpy_16mib``, but the producer fills an array from
  ``easycore.shm.empty``, which easycore's producers place in shared memory and send by
  reference (no copy at all); the other systems get an ordinary array.
* ``predictor``: the manual's torch example (``Linear(1, 3)`` + ReLU, batches of 10 ints),
  results concatenated in order. Unit: batches/s. Needs torch.
* ``startup``: runner start-up, one call on 100 tiny items, and close. Unit: seconds.
"""

from __future__ import annotations

import functools
import itertools
import queue
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from easycore.bench.workload_hooks import (
    HASH_MOD,
    HASH_MUL,
    HOOKS,
    PAGE,
    ArrayHooks,
    BaseHooks,
    CollectingConsumer,
    PredictorHooks,
    ShmArrayHooks,
    SquareCollectHooks,
    SquareHashHooks,
    SquareSumHooks,
    TensorHooks,
    make_net,
    torch_available,
)

__all__ = [
    "FEEDBACK_TIMEOUT_S",
    "HASH_MOD",
    "HASH_MUL",
    "HOOKS",
    "MIB",
    "PAGE",
    "SWEEP",
    "SWEEP_SIZES",
    "WORKLOADS",
    "ArrayHooks",
    "BaseHooks",
    "CollectingConsumer",
    "LatencyHooks",
    "PredictorHooks",
    "ShmArrayHooks",
    "SquareCollectHooks",
    "SquareHashHooks",
    "SquareSumHooks",
    "TensorHooks",
    "Workload",
    "array_data",
    "batches",
    "compare_predictions",
    "expected_arrays",
    "expected_predictions",
    "expected_square_hash",
    "expected_square_sum",
    "feedback_data",
    "make_net",
    "register_workload",
    "size_name",
    "sweep_workload",
    "torch_available",
]


# ---------------------------------------------------------------------------------------
# the latency workload: its hooks and its input share the feedback queue

_FEEDBACK: queue.SimpleQueue[Any] = queue.SimpleQueue()
"""Results reached ``consumer_work`` (latency workload): the input waits on it."""
FEEDBACK_TIMEOUT_S = 5.0


class LatencyHooks(SquareSumHooks):
    """``x * x``, one item in flight: each result reaching ``consumer_work`` releases the
    next input item (a request/response loop; see :func:`feedback_data`)."""

    one_in_flight = True  # systems that only make sense for this workload check this

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.count += 1
        cfg.total += data
        _FEEDBACK.put(None)


def feedback_data(n: int) -> Iterable[int]:
    """``range(n)``, where item ``i + 1`` is released only once result ``i`` reached
    ``consumer_work``. A system that waits to fill a batch before sending never gets it:
    after ``FEEDBACK_TIMEOUT_S`` the input raises ``queue.Empty`` and the system fails."""
    global _FEEDBACK
    fb = _FEEDBACK = queue.SimpleQueue()

    def gen() -> Iterable[int]:
        for i in range(n):
            if i:
                fb.get(timeout=FEEDBACK_TIMEOUT_S)
            yield i

    return gen()


# ---------------------------------------------------------------------------------------
# workloads


@dataclass
class Workload:
    """One benchmark workload.

    Attributes:
        name: the ``--workloads`` key.
        title: one line for the table.
        hooks: class with the six static hooks.
        ordered: whether results must reach ``consumer_work`` in input order.
        unit: ``"items/s"``, ``"GB/s"``, ``"batches/s"`` or ``"s"``.
        items: items per timed call (full run), ``quick_items`` in ``--quick``.
        item_bytes: bytes per result (0 for tiny results), for GB/s and chunk sizes.
        startup: time start-up + one call + close instead of a call on a live runner.
        needs_torch: skipped (with a note) when torch is not installed.
    """

    name: str
    title: str
    hooks: type
    ordered: bool
    unit: str
    items: int
    quick_items: int
    make_data: Callable[[int], Iterable[Any]]
    expected: Callable[[int], Any] | None
    item_bytes: int = 0
    startup: bool = False
    needs_torch: bool = False
    compare: Callable[[Any, Any], bool] = field(default=lambda a, b: a == b)
    verify_by_fingerprint: bool = False
    """No expected value: systems' results are compared with each other's (by digest)."""
    in_default_run: bool = True
    """False: run only when named in ``--workloads`` (or by ``--sweep``)."""
    as_sequence: bool = False
    """The systems get the sequence ``make_data`` returns (a pool slices a list into chunks);
    else an iterator over it, which counts the items taken."""

    @property
    def higher_is_better(self) -> bool:
        """False for times (``s``), True for rates."""
        return self.unit != "s"

    def amount(self, n: int) -> float:
        """What one call of ``n`` items moves, in the unit's numerator (items, GB, batches)."""
        if self.unit == "GB/s":
            return n * self.item_bytes / 1e9
        return float(n)

    def figure(self, n: int, seconds: float) -> float:
        """The table's figure for a call of ``n`` items that took ``seconds``."""
        return seconds if self.unit == "s" else self.amount(n) / seconds

    def check(self, result: Any, n: int) -> str | None:
        """None when ``result`` is right for ``n`` items, else what is wrong."""
        if self.expected is None:
            return None
        want = self.expected(n)
        try:
            ok = bool(self.compare(result, want))
        except Exception as e:  # a malformed result is a wrong result
            return f"result {_short(result)} cannot be compared: {type(e).__name__}: {e}"
        return None if ok else f"got {_short(result)}, expected {_short(want)}"

    def tuned_chunksize(self, n: int, workers: int) -> int:
        """The chunk size ``Pool.map`` would pick; 1 for large results (chunks don't help)."""
        if self.item_bytes >= 64 << 10:
            return 1
        return max(1, n // (4 * workers))


def _short(x: Any, limit: int = 80) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"<{type(x).__name__} shape={tuple(x.shape)} dtype={x.dtype}>"
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def expected_square_sum(n: int) -> tuple[int, int]:
    """``(n, sum of x*x for x < n)`` in closed form."""
    return (n, (n - 1) * n * (2 * n - 1) // 6 if n > 0 else 0)


@functools.lru_cache(maxsize=8)
def expected_square_hash(n: int) -> tuple[int, int]:
    """``(n, hash)`` of ``x*x`` folded in order, computed directly."""
    h = 0
    for x in range(n):
        h = (h * HASH_MUL + x * x) % HASH_MOD
    return (n, h)


def array_data(nbytes: int) -> Callable[[int], Iterable[tuple[int, int]]]:
    """Items ``(index, nbytes)`` for ``n`` arrays."""

    def make(n: int) -> Iterable[tuple[int, int]]:
        return zip(range(n), itertools.repeat(nbytes))

    return make


def array_list(nbytes: int) -> Callable[[int], Iterable[tuple[int, int]]]:
    """Items ``(index, nbytes)`` for ``n`` arrays, as a list (a pool slices it into chunks)."""

    def make(n: int) -> Iterable[tuple[int, int]]:
        return list(zip(range(n), itertools.repeat(nbytes)))

    return make


def expected_arrays(nbytes: int) -> Callable[[int], tuple[int, int, int, int]]:
    """``(count, sum of indexes, bytes, bad arrays)`` for ``n`` arrays of ``nbytes``."""

    def expect(n: int) -> tuple[int, int, int, int]:
        return (n, n * (n - 1) // 2, n * nbytes, 0)

    return expect


def batches(n_batches: int, batch_size: int = 10) -> Iterable[list[int]]:
    """The manual's ``batch_generator`` over ``range(n_batches * batch_size)``."""
    data = list(range(n_batches * batch_size))
    for i in range(0, len(data), batch_size):
        yield data[i : i + batch_size]


def expected_predictions(n_batches: int) -> Any:
    """The network applied to all inputs at once, in the caller's process."""
    import torch

    with torch.no_grad():
        x = torch.arange(n_batches * 10, dtype=torch.float32).view(-1, 1)
        return make_net()(x)


def compare_predictions(got: Any, want: Any) -> bool:
    """Same shape and values (to float tolerance)."""
    import torch

    return (
        isinstance(got, torch.Tensor)
        and tuple(got.shape) == tuple(want.shape)
        and bool(torch.allclose(got, want, atol=1e-6))
    )


MIB = 1 << 20

WORKLOADS: dict[str, Workload] = {}
"""Every workload by name; ``register_workload`` adds one."""


def register_workload(w: Workload) -> Workload:
    """Adds (or replaces) a workload in :data:`WORKLOADS`."""
    WORKLOADS[w.name] = w
    return w


for _w in (
    Workload(
        "tiny_unordered",
        "tiny items, unordered: x*x over ints, summed",
        SquareSumHooks,
        ordered=False,
        unit="items/s",
        items=200_000,
        quick_items=10_000,
        make_data=range,
        expected=expected_square_sum,
    ),
    Workload(
        "tiny_ordered",
        "tiny items, ordered: x*x over ints, order-sensitive hash",
        SquareHashHooks,
        ordered=True,
        unit="items/s",
        items=200_000,
        quick_items=10_000,
        make_data=range,
        expected=expected_square_hash,
    ),
    Workload(
        "tiny_collect",
        "tiny items, unordered: x*x over ints, collected into a list (a light consumer)",
        SquareCollectHooks,
        ordered=False,
        unit="items/s",
        items=200_000,
        quick_items=10_000,
        make_data=range,
        expected=expected_square_sum,
    ),
    Workload(
        "numpy_1mib",
        "1 MiB numpy results (fresh array per item), delivered to consumer_work",
        ArrayHooks,
        ordered=False,
        unit="GB/s",
        items=512,
        quick_items=64,
        make_data=array_data(MIB),
        expected=expected_arrays(MIB),
        item_bytes=MIB,
    ),
    Workload(
        "numpy_1mib_list",
        "1 MiB numpy results, as numpy_1mib, of a list of arguments (a pool slices it)",
        ArrayHooks,
        ordered=False,
        unit="GB/s",
        items=512,
        quick_items=64,
        make_data=array_list(MIB),
        expected=expected_arrays(MIB),
        item_bytes=MIB,
        in_default_run=False,
        as_sequence=True,
    ),
    Workload(
        "numpy_16mib",
        "16 MiB numpy results (fresh array per item), delivered to consumer_work",
        ArrayHooks,
        ordered=False,
        unit="GB/s",
        items=64,
        quick_items=8,
        make_data=array_data(16 * MIB),
        expected=expected_arrays(16 * MIB),
        item_bytes=16 * MIB,
    ),
    Workload(
        "numpy_16mib_shm",
        "16 MiB numpy results filled in place from easycore.shm.empty (sent by reference)",
        ShmArrayHooks,
        ordered=False,
        unit="GB/s",
        items=64,
        quick_items=8,
        make_data=array_data(16 * MIB),
        expected=expected_arrays(16 * MIB),
        item_bytes=16 * MIB,
    ),
    Workload(
        "tensor_16mib",
        "16 MiB torch tensors made on the producer's device (GPU results copied to the "
        "host), delivered to consumer_work",
        TensorHooks,
        ordered=False,
        unit="GB/s",
        items=64,
        quick_items=8,
        make_data=array_data(16 * MIB),
        expected=expected_arrays(16 * MIB),
        item_bytes=16 * MIB,
        needs_torch=True,
    ),
    Workload(
        "predictor",
        "the manual's torch predictor: Linear(1,3)+ReLU, batches of 10, ordered",
        PredictorHooks,
        ordered=True,
        unit="batches/s",
        items=2000,
        quick_items=200,
        make_data=batches,
        expected=expected_predictions,
        needs_torch=True,
        compare=compare_predictions,
    ),
    Workload(
        "latency",
        "latency: one item in flight, item i+1 released when result i reached "
        "consumer_work (round trips/s; 1e6 / figure = µs per round trip)",
        LatencyHooks,
        ordered=False,
        unit="items/s",
        items=3000,
        quick_items=500,
        make_data=feedback_data,
        expected=expected_square_sum,
    ),
    Workload(
        "startup",
        "start-up + one call (100 tiny items) + close",
        SquareSumHooks,
        ordered=False,
        unit="s",
        items=100,
        quick_items=100,
        make_data=range,
        expected=expected_square_sum,
        startup=True,
    ),
):
    register_workload(_w)


SWEEP_SIZES = (
    4 << 10,
    16 << 10,
    64 << 10,
    200 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
)
"""Result sizes of the ``--sweep`` curve (both sides of the pool's threshold, 256 KiB)."""


def size_name(nbytes: int) -> str:
    """``4kib``, ``1mib``…: a size as it appears in workload names."""
    if nbytes % MIB == 0:
        return f"{nbytes // MIB}mib"
    return f"{nbytes >> 10}kib"


def sweep_workload(nbytes: int, shm: bool = False) -> Workload:
    """The sweep's workload for results of ``nbytes``: about 256 MiB per call (at least 16
    items, at most 20,000), an eighth of it in ``--quick``. ``shm``: the producer fills an
    array from ``easycore.shm.empty`` (sent by reference) instead of a fresh private one."""
    items = max(16, min(20_000, (256 * MIB) // nbytes))
    how = "filled in place from easycore.shm.empty" if shm else "fresh array per item"
    return Workload(
        f"sweep_{size_name(nbytes)}" + ("_shm" if shm else ""),
        f"size sweep: {size_name(nbytes)} numpy results ({how})",
        ShmArrayHooks if shm else ArrayHooks,
        ordered=False,
        unit="GB/s",
        items=items,
        quick_items=max(8, items // 8),
        make_data=array_data(nbytes),
        expected=expected_arrays(nbytes),
        item_bytes=nbytes,
        in_default_run=False,
    )


SWEEP = [register_workload(sweep_workload(n)).name for n in SWEEP_SIZES] + [
    register_workload(sweep_workload(n, shm=True)).name for n in SWEEP_SIZES
]
"""The sweep's workload names: today's path, smallest first, then the same sizes sent by
reference (``_shm``)."""
