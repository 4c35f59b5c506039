"""Adaptive reading's schedule, for the runners (``input_side.py``, ``reader.py``) and the
pool (``parallel/job.py``) alike: when a caller takes over a request/response input (item
``i + 1`` exists only once result ``i`` arrived), and how often it hands the input back to
the input thread to see whether it runs ahead now (a probe).

* The caller asks for the input after :data:`DIRECT_AFTER` waits in a row with nothing on
  its way, counted once a result came.
* The first probe comes after :data:`PROBE_FIRST` items read by the caller. Each probe that
  finds the input request/response still sets the next interval by :func:`next_probe_at`: it
  aims at :data:`PROBE_SPAN_S` of the loop's own time, growing at most twofold a probe. A
  probe costs a few hand-offs between threads (a fraction of a millisecond where they share
  one core), so a fast loop spends a bounded share of its time on them (about 0.4 % at
  0.4 ms a probe) however long it runs, and an input that turns fast is read ahead again
  within about that span; a slow loop (items of a second) is probed every
  :data:`PROBE_FIRST` items, a cost it does not notice.

An input that slows down within an interval is probed once that interval's items are read
(at its new pace); the interval then shrinks to the span at once.

A call that follows a request/response call of the same runner or pool (its habit:
``input_side.py``, ``parallel/job.py``) starts with its predecessor's interval
(:func:`habit_after`) and with its input in the receiving thread's hands (below; not a
pool's call with a ``timeout``, whose caller never reads its input): a loop that makes many
short calls pays the start and the first probes once, not at every call.
The interval it inherits is at most about :data:`PROBE_INHERITED_S` of its predecessor's
pace (at least :data:`PROBE_INHERITED_MAX` items): an input that runs ahead from such a
call's start is read ahead again within about that long, and a fast loop of calls of a
few thousand items probes once a call, not three times (a probe took 0.2–0.3 ms on one
shared core: 1.5 % of a 3,000-item call of 19 µs round trips).

Such a call's receiving thread (the pool's caller) has its input from the start, on its
predecessor's word alone: it reads the first item itself, before any of it passed through
an input thread (the runner starts its input thread only when it hands the input back;
the pool's first item went through its feed and service threads: 0.1–0.35 ms a call on
one shared core). Until it has evidence of its own it is on trial: its first probe comes
after its inherited interval or about :data:`PROBE_INHERITED_S`, whichever is first (the
clock is read at the 1st, 2nd, 4th, 8th... item), and while the receiving thread waits
that long for the result of an item it read it hands the input back at once; an input
that runs ahead from such a call's start, with items of any cost, is read ahead again
within about that long.
"""

from __future__ import annotations

import time

#: Waits in a row with nothing on its way, once a result came (before, the input may not
#: have been read at all: a fast one would be taken over), before the caller asks.
DIRECT_AFTER = 4
PROBE_FIRST = 16  #: items the caller reads before the first probe, and at least between two
PROBE_SPAN_S = 0.1  #: the time a probe interval aims at (seconds of the loop's own pace)
#: The longest interval a call inherits: an input that runs ahead from the start of a call
#: that followed a request/response one is read ahead again after at most that many items.
PROBE_INHERITED_MAX = 256
#: The longest interval a call inherits, in seconds of its predecessor's pace, where that
#: is more than :data:`PROBE_INHERITED_MAX` items.
PROBE_INHERITED_S = 0.025


def next_probe_at(items: int, seconds: float) -> int:
    """The next probe interval in items, after an interval of ``items`` items that took
    ``seconds`` (from the hand-over to the probe): twice as long while the loop is fast,
    about :data:`PROBE_SPAN_S` of its pace once that is reached, never below
    :data:`PROBE_FIRST`."""
    if seconds * 2 <= PROBE_SPAN_S:
        return 2 * items  # (also a clock that did not move: the common case of a fast loop)
    return max(PROBE_FIRST, min(2 * items, int(items * PROBE_SPAN_S / seconds)))


def after_probe(items: int, seconds: float, keep: int = 0) -> tuple[int, float]:
    """A probe ended an interval of ``items`` items read directly in ``seconds``: the next
    interval (:func:`next_probe_at`, at least ``keep``: an inherited interval that a trial
    cut short stands) and the loop's pace, seconds per item (what :func:`habit_after`
    bounds an inherited interval by)."""
    return max(keep, next_probe_at(items, seconds)), seconds / max(1, items)


def trial_over(reads: int, until: float) -> bool:
    """Whether a call on trial until ``until`` (``time.monotonic``) is past it at its
    ``reads``-th direct read: the clock is read at the 1st, 2nd, 4th, 8th... read only."""
    return not reads & (reads - 1) and time.monotonic() >= until


def habit_after(
    previous: int, handed_over: bool, took_several: bool, probe_at: int, pace: float = 0.0
) -> int:
    """A runner's or pool's habit once a call read adaptively ended (0: none): where the
    input ran ahead (``took_several``, also after its caller read some of it), none: the
    next call starts as the first one did; else, where its caller read the input itself
    (``handed_over``), the first probe interval of the next call (its own next interval, at
    most :data:`PROBE_INHERITED_S` of its ``pace``, the seconds per item of its last probe
    interval (0: not known), and at most :data:`PROBE_INHERITED_MAX` items where that is
    less); else (a call too short to tell) ``previous``. (A request/response input never
    has more than one item on its way: a call on the habit whose input runs ahead, which
    its caller read from the start on trial, leaves none, so the calls after it do not
    each pay a trial.)"""
    if took_several:
        return 0
    if handed_over:
        most = PROBE_INHERITED_MAX
        if pace > 0 and PROBE_INHERITED_S > most * pace:
            most = int(PROBE_INHERITED_S / pace)
        return max(PROBE_FIRST, min(probe_at, most))
    return previous
