"""The input thread of a call (``easycore-input``): reads an iterator input into the
:class:`~easycore._engine.input_side.InputSide`'s buffer, run by run (``runs.py``) or item
by item while the receiving thread waits on each, within the window (:func:`read_runs`);
hands a request/response input over to the receiving thread and waits to get it back."""

from __future__ import annotations

import time
from typing import Any

from easycore._engine.input_side import InputSide
from easycore._engine.lifecycle import TICK
from easycore._engine.runs import after_first


def _room(side: InputSide, ahead: int) -> tuple[int, int]:
    """Items the reader may read now (``ahead``: read and not yet delivered), and the least
    room worth waking it for. Within the window, a few batches at a time, so that the room
    is weighed again as the sizes of items and results become known (large items are held
    to a few). (Holding the reader to two batches beyond what the sender took was tried:
    under the GIL it then waits for the GIL to refill, and the runners lost a third of
    their speed on tiny items.)

    From a source whose runs are costly (the pool's feed), once those sizes and the cost per
    item are known, a window of many small batches (large results: one item each) is read a
    quarter at a time, and only once a quarter is free while anything is in flight, as a
    pool's job is (``job.has_room``): reading two items each time two results were handed
    out cost the feed a wake-up, a segment and a run for every two 1 MiB results (about
    20 µs of its thread's CPU a result, 2-core VM). A runner's own runs are cheap, and its
    window is kept full (in quarters, 1 MiB results came about 10 % slower)."""
    sizing = side.sizing
    window = sizing.window_now()
    room = window - ahead
    run = 2 * sizing.batch_size()
    quarter = window >> 2
    runs = side.runs
    if run >= quarter or runs is None or not runs.costly or not sizing.sized():
        return (room if room < run else run), 1
    return (room if room < quarter else quarter), (quarter if ahead > 0 else 1)


def _wait_for_room(side: InputSide, read: int) -> int:
    """:func:`_room` (``read``: items read so far), waiting until there is enough: the
    receiving thread wakes the reader once ``reader_wake_at`` results were delivered. 0 once
    the call is aborted."""
    room, need = _room(side, read - side.delivered - side.dropped)
    if room >= need:
        return room
    with side.cond:
        side.reader_waiting = True
        while not side.abort:
            delivered = side.delivered
            room, need = _room(side, read - delivered - side.dropped)
            if room >= need:
                break
            side.reader_wake_at = delivered + need - room
            # Delivered meanwhile (before the receiver could see the mark): look again.
            if side.delivered < side.reader_wake_at:
                side.cond.wait(TICK)
        side.reader_waiting = False
    return 0 if side.abort else room


def _hand_over(side: InputSide) -> bool:
    """The input thread, adaptive reading: the receiving thread asked for the input (it
    behaved as a request/response loop: see ``InputSide.note_starved``), so it reads it from
    now on, whenever nothing is in flight (no hand-off through this thread for each
    item: a thread switch or two per round trip). This thread waits until the
    receiving thread hands it back (see ``InputSide.read_and_send``); False: the call or the
    input is over meanwhile."""
    with side.cond:
        side.direct = side.handed_over = True
        side.direct_reads = 0
        side.direct_since = time.monotonic()
        if side.receiver_waiting:
            side.workers.wake(side.call)  # it may sleep with nothing in flight
        while side.direct and not side.abort and not side.reader_done:
            side.cond.wait(TICK)
    return not (side.abort or side.reader_done)


def read_runs(side: InputSide) -> None:
    """The input thread (an iterator input, ``read_ahead``): the ``RunSource``
    (the pool's feed, or :class:`~easycore._engine.runs.IteratorRuns` over a
    runner's input) a run at a time, each pulled in by one ``list.extend`` (no Python
    frame per item) while the receiving thread does not wait on each item; while it
    does, item by item, waking the receiver as each comes. If it starts to wait
    during an extend, it cuts the run (``RunSource.cut``): the extend ends after
    the item being read, and the receiver is woken. Race-free: the reader announces
    ``bulk`` before it looks at ``attention``; the receiver sets ``attention`` before
    it looks at ``bulk``. A run's items are counted by how much ``len(buf)`` grew: only
    this thread removes the sent prefix of ``buf`` (``InputSide.compact``), between runs."""
    src = side.runs
    assert src is not None
    buf = side.buf
    append, extend = buf.append, buf.extend
    attention = side.attention
    read = 0
    got: int | None = None  # items the last run gave (None: no run to report)
    run: Any = None
    items: Any = None
    x: Any = None
    try:
        while not side.abort:
            room = _wait_for_room(side, read + side.direct_total + side.injected)
            if room <= 0:
                continue  # aborted
            side.compact()
            # Nothing of the last run is held while the next is awaited: a finished call's
            # arguments are freed (the stdlib's pools keep none).
            run = items = x = None
            run = src.next_run(room, got)
            got = None
            if run is None:
                break  # the input is over
            if side.awaiting_reader:  # handed back (a probe): the receiver asks again once
                run = after_first(iter(run), side.reader_read)  # an item of it was read
            items = iter(run)
            start = len(buf)
            try:
                while not side.want_direct:  # (it then asks for the input)
                    side.bulk = True
                    if not attention:
                        extend(items)  # to the run's end, or until the receiver cuts it
                        side.bulk = False
                        if attention:
                            side.input_arrived()  # the run was cut for it (or ended)
                        break
                    side.bulk = False
                    # The receiver waits on each item (a producer may be idle): each one
                    # goes to it as it comes, until it no longer waits (every producer
                    # has a batch); then the rest of the run in bulk.
                    for x in items:
                        append(x)
                        if not attention:
                            break
                        if side.abort:
                            return
                        side.input_arrived()
                        if side.want_direct:
                            break  # the receiving thread asks for the input
                    else:
                        break  # the run is over
            except BaseException as e:
                side.bulk = False
                n = len(buf) - start
                read += n
                if src.recover(e, n) is None:
                    raise
                continue
            got = len(buf) - start
            read += got
            if side.want_direct:
                if not _hand_over(side):
                    break
                got = None  # the receiving thread read meanwhile
    except BaseException as e:  # noqa: BLE001 - raised in the receiving thread
        side.input_error = e
    finally:
        side.reader_done = True
        side.input_arrived()
