"""Where arrays born in shared memory come from: in a producer, the output queue's pool; in
the caller, a runner's input queue's pool (``runner=``).

The worker names its output queue here (:func:`set_target`); the allocators
(:mod:`easycore.shm`, :mod:`easycore.torch.shm`) lease pooled segments of it
(:func:`lease`), and a result that lies in one travels by reference: the queue's ``put``
hands the segment to the consumer instead of copying it. Given a runner
(:func:`runner_queue`), they lease from its input queue instead, and the caller's input items
travel to the producers the same way. After each send the worker (and the caller's engine)
calls :func:`after_send`, which marks the arrays that were sent read-only, so that writing
into a sent array raises instead of changing what the other side reads.

No numpy here: the worker imports this module whether or not numpy is installed.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from easycore._core import Queue, ShmLease, shm_space

_target: Queue | None = None
# Pooled segments of the largest size asked for that the target's pool should have room for
# (set with the target: a few per producer).
_depth = 0
_producers = 1  # the processes that share the target (set with it)
# The largest array this process leased from the target so far: a larger one makes its
# share of the pool's segments at once (see _make_share).
_largest = 0
# (the array handed out, its lease), weakly: an array dropped unsent frees its lease.
_live: list[tuple[weakref.ref[Any], weakref.ref[ShmLease]]] = []
# The caller's engine calls after_send from its sending thread while the caller allocates.
_live_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork taken while another thread held the lock would leave it held forever.
    global _live_lock
    _live_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def set_target(q: Queue | None, producers: int = 1) -> None:
    """The queue whose pool the allocators lease from in this process (None: none), shared
    by ``producers`` processes: its pool grows to hold as many of the largest arrays asked
    for as a stream keeps in flight and its consumer holds (see :func:`make_room`), and
    this process makes its share of them with the first such array (see :func:`lease`)."""
    global _target, _depth, _producers, _largest
    _target = q
    _producers = max(1, producers)
    _depth = AHEAD_PER_PRODUCER * _producers + _HELD_AFTER_DELIVERY
    _largest = 0
    _live.clear()


# The pool's slot count (``SLOTS`` in src/slots.rs): at most this many pooled segments at once.
POOL_SLOTS = 64
# Results a consumer may still hold after their delivery (the one ``consumer_work`` has, the
# last one a loop variable keeps): their segments are not back in the pool yet.
_HELD_AFTER_DELIVERY = 2
# Large results a stream keeps in flight: about a cache's worth of bytes (the segments are
# then written and read while still cached; see ``Sizing.window_now``), and at least this
# many per producer (one it builds, two waiting to be received).
CACHED_AHEAD_BYTES = 48 << 20
AHEAD_PER_PRODUCER = 3


def max_inflight_bytes(side_budget: int) -> int:
    """The most bytes of results a stream keeps in flight: twice its output queue's side
    budget (one budget's worth queued, one being built and received)."""
    return 2 * side_budget


def results_ahead(nbytes: float, producers: int) -> int:
    """How many results of ``nbytes`` a stream keeps in flight for their size (before the
    bounds of its window, its bytes and its output pool)."""
    return max(int(CACHED_AHEAD_BYTES / nbytes), AHEAD_PER_PRODUCER * producers)


def slot_bytes(nbytes: int) -> int:
    """At least the size of the pooled segment a body of ``nbytes`` takes (the pool rounds
    sizes up by at most a sixteenth plus a page)."""
    return nbytes + nbytes // 16 + 4096


def results_in_flight(q: Queue | None, nbytes: int, producers: int) -> int | None:
    """How many results of ``nbytes`` may be in flight (sent to a producer and not yet
    delivered) so that each still finds a pooled segment of ``q`` (the output queue) when its
    producer writes it: the segments the pool's cap and slot count allow, less those the
    consumer still holds after delivery; at least one per producer. None: no bound (no queue,
    or results small enough to travel in the ring).

    A stream bounded by bytes alone keeps more large results in flight than the pool holds
    (the byte bound counts neither the pool's rounding nor the results the consumer still
    holds), and each result that finds the pool full is built in private memory, copied
    into a one-shot segment and faulted in on both sides: 16 MiB results from
    ``easycore.shm.empty`` ran at a third of their speed in the calls where that happened."""
    if q is None or nbytes < q.pool_min:
        return None
    cap = q.pool_bytes()[1]
    fit = min(cap // slot_bytes(nbytes), POOL_SLOTS) - _HELD_AFTER_DELIVERY
    return max(producers, fit)


def make_room(q: Queue, nbytes: int, depth: int) -> None:
    """Grows ``q``'s pool cap (it never shrinks) so that ``depth`` segments of ``nbytes`` fit
    beside what it holds: each producer building one, one in flight, and a few the consumer
    holds. Bounded by a quarter of /dev/shm's free space (plus what the pool holds now), so
    that large results do not find the pool full for want of a cap sized for small ones."""
    slot = slot_bytes(nbytes)  # a segment's size, rounded up as the pool does
    used, cap = q.pool_bytes()
    want = depth * slot
    if want <= cap:
        return
    space = shm_space()
    if space is not None:
        want = min(want, used + space[0] // 4)
    if want > cap:
        q.grow_pool(want)


def runner_queue(runner: Any) -> tuple[Queue | None, int]:
    """The input queue of ``runner`` (a runner or a :class:`~easycore.parallel.Pool`), whose
    pool the caller's input arrays are leased from (None when it is closed), and how many of
    the largest arrays its pool should hold (a few per producer)."""
    r = getattr(runner, "_runner", runner)  # a Pool wraps a runner
    get = getattr(r, "_input_queue", None)
    if get is None:
        raise TypeError(f"runner= takes an easycore runner or Pool, not {type(runner).__name__}")
    q: Queue | None = get()
    return q, 2 * len(r.devices) + 2


def lease(nbytes: int, runner: Any = None) -> ShmLease | None:
    """A lease of ``nbytes`` from the target queue's pool (given ``runner``: from its input
    queue's), or None when there is no queue, ``nbytes`` is below the pool's threshold
    (copying is cheaper), or the pool has no room (never waits for room)."""
    if runner is None:
        q, depth = _target, _depth
    else:
        q, depth = runner_queue(runner)
    if q is None or nbytes < q.pool_min or q.closed:
        return None
    try:
        make_room(q, nbytes, depth)
        if runner is None and nbytes > _largest:
            _make_share(q, nbytes, max_inflight_bytes(q.side_budget))
        return q.lease(nbytes, timeout=1.0)
    except Exception:  # noqa: BLE001 - any failure: the caller uses private memory
        return None


def _make_share(q: Queue, nbytes: int, base: int) -> None:
    """The first array of ``nbytes`` this producer leases, larger than any before: it makes
    the ``_depth`` segments the pool has room for at once, with the other producers, but no
    more than fit ``base`` bytes (no more bytes of results are ever in flight) and the two
    a consumer holds. Each producer holds what it leased, free segments or new ones, until
    the pool holds that many bytes, then gives them back unused: each stays in the pool,
    made. Made one at a time as a stream first needs
    them, each new segment (about 10 ms for 16 MiB: its pages are allocated, zeroed and
    mapped) would fall in whichever later call first has more results in flight and held
    than before, and cut that call's speed by half or more."""
    global _largest
    _largest = nbytes
    want = min(_depth, base // nbytes + _HELD_AFTER_DELIVERY) * nbytes  # each holds >= nbytes
    made: list[ShmLease] = []
    while len(made) < _depth and q.pool_bytes()[0] < want:
        held = q.lease(nbytes, timeout=1.0)
        if held is None:
            break  # no room: the rest are made as they are needed
        made.append(held)


def track(obj: Any, held: ShmLease) -> None:
    """Remembers that ``obj`` (an array or tensor) was built on ``held``, so that
    :func:`after_send` can mark it read-only once the lease is sent."""
    with _live_lock:
        _live.append((weakref.ref(obj), weakref.ref(held)))


def after_send() -> None:
    """Marks the arrays whose leases were sent read-only, and forgets dropped ones."""
    if not _live:
        return
    with _live_lock:
        _mark_sent()


def _mark_sent() -> None:
    keep = []
    for obj_ref, lease_ref in _live:
        held = lease_ref()
        if held is None:
            continue
        if not held.sent:
            keep.append((obj_ref, lease_ref))
            continue
        obj = obj_ref()
        flags = getattr(obj, "flags", None)
        if flags is not None:
            try:
                flags.writeable = False
            except (ValueError, AttributeError):
                pass
    _live[:] = keep
