"""Who advances the pool's stream (receives its results): the service thread, or a caller in a
request/response loop, or the caller of the pool's one call (:class:`Turn`).

A ``map``/``imap`` call whose input is a request/response loop (item i+1 exists only once
its caller took result i) reads its own input in the caller's thread (``calls.py``). When
nothing else is on its way in the stream, the service thread *parks* (:meth:`Turn.park_if`,
:meth:`Turn.wait`): it leaves the stream's generator (``Call.iterate_chunks``) suspended
between two results, and a caller may take the turn (:meth:`Turn.try_take`), send its item
and receive until its result came (the engine's lean step, ``Call.exchange``, else the
generator itself), with no hand-off through the pool's threads (the caller's thread and the
worker: two wake-ups a round trip, as a bare pipe). ``Pool.apply`` does the same for its
task; after one, the service thread parks while nothing is on its way for a while
(``StreamService._park_ok``). What the callers do is :class:`CallerTurns`, a part of the
stream service.

The service thread parks too, with work on its way, while one ``map``/``imap`` call is all
the pool has to do and its caller waits for a result: that caller then receives until its
call has one (:meth:`CallerTurns.receive_for`), routing what comes as the service thread
would, and the service thread stays parked while it consumes (a runner's ``imap`` receives
in its caller's thread the same way), so each message's results reach it with no hand-off.

The service thread wakes (:meth:`Turn.wake`) when the feed has new work or the stream
ends, when the pool is terminated, and when a caller gives the turn back with something
left for it (:meth:`Turn.give_back`: results of other calls or tasks, which the service
thread routes so that futures' callbacks run where they always do, the generator's error,
or its end, or work still on its way). Every ``TICK`` it looks whether it should still be
parked (a worker died, say).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from easycore._engine.lifecycle import TICK
from easycore._engine.probes import PROBE_INHERITED_S
from easycore._engine.stream import WaitInterrupted
from easycore.errors import RunnerClosedError
from easycore.parallel.feed import _TASK, _TaskBlob, _WorkItem

if TYPE_CHECKING:
    from easycore._engine.stream import Call
    from easycore.parallel.hardstop import StuckWatch
    from easycore.parallel.job import _Job
    from easycore.parallel.schedule import Scheduler
    from easycore.parallel.tasks import _TaskHooks

# How many of a caller's own results (a request/response loop) have their worker seconds
# learned together (``StreamService._learn_cost``) once a first cost is known: the cost is a
# running mean, and a learning costs each round trip about 0.3 µs on a shared core.
OWN_LEARN_EVERY = 16


class Left:
    """What a caller leaves the service thread as it gives the turn back: a message's results
    for other calls (``handed``), the error the stream's generator raised in the caller's
    thread, or its end."""

    __slots__ = ("handed", "error", "ended")

    def __init__(
        self,
        handed: list[Any] | None = None,
        error: BaseException | None = None,
        ended: bool = False,
    ) -> None:
        self.handed = handed
        self.error = error
        self.ended = ended


def _exchange(call: Call, turn: Turn) -> list[list[Any]] | Left:
    """One step of the stream (``Call.exchange``, waiting up to a tick) for a caller that
    holds ``turn``: the results that came, or what to leave the service thread (the stream
    ended or failed). Ctrl-C while it waited raises KeyboardInterrupt (nothing was taken:
    the stream goes on); Ctrl-C inside the receiving loop ended the stream, which the
    service thread is left to say."""
    try:
        return call.exchange(TICK, turn.chunks)
    except StopIteration:
        return Left(ended=True)
    except Exception as e:  # noqa: BLE001 - the stream failed: the service thread says so
        return Left(error=e)
    except WaitInterrupted:
        raise KeyboardInterrupt from None
    except BaseException:
        turn.leave(Left(error=RunnerClosedError("the pool's stream was interrupted")))
        raise


class Turn:
    """The right to advance one stream's generator ``chunks`` of ``call`` (see the module)."""

    def __init__(self, call: Any, chunks: Generator[list[Any], None, None]) -> None:
        self.call = call
        self.chunks = chunks
        # Guards the fields below; a caller's take and give-back hold it directly (a C-level
        # ``with``), the service thread waits on ``cond``.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.parked = False  # the service thread leaves the stream to callers
        self.caller = False  # a caller holds the turn
        self.wakes = 0  # bumped to end the service thread's park
        self.parked_at = 0  # ``wakes`` when it parked
        self.left: Left | None = None
        self.closed = False

    # ----- the service thread -----

    def park_if(self, ok: Callable[[], bool]) -> bool:
        """Parks the service thread if ``ok()`` (asked after the wake count is read, so a
        wake that comes meanwhile is not lost): callers may take the turn from now on.
        Whether it parked; then :meth:`wait` follows."""
        w = self.wakes
        if not ok():
            return False
        with self.lock:
            if self.wakes != w or self.closed:
                return False
            self.parked = True
            self.parked_at = w
        return True

    def wait(self, still: Callable[[], bool]) -> Left | None:
        """The parked service thread waits until it is woken, or a caller left something,
        or (asked every ``TICK`` while no caller holds the turn) ``still()`` is false; never
        while a caller holds the turn. Returns what a caller left, if anything."""
        with self.cond:
            try:
                while True:
                    if not self.caller and (self.left is not None or self.wakes != self.parked_at):
                        break
                    if not self.cond.wait(TICK) and not self.caller and not still():
                        break
            finally:
                self.parked = False
                left, self.left = self.left, None
        return left

    def wake(self) -> None:
        """Ends the service thread's park (any thread): there is work for it."""
        with self.lock:
            self.wakes += 1
            if self.parked:
                self.cond.notify_all()

    def close(self) -> None:
        """The stream is over: no caller takes the turn from now on; waits for one that
        holds it to give it back."""
        with self.lock:
            self.closed = True
            self.parked = False
            while self.caller:
                self.cond.wait(TICK)

    # ----- a caller -----

    def free(self) -> bool:
        """Whether :meth:`try_take` would take the turn now (a guess, without the lock)."""
        return (
            self.parked
            and not self.caller
            and self.left is None
            and self.wakes == self.parked_at
            and not self.closed
        )

    def try_take(self) -> bool:
        """Takes the turn if the service thread is parked, nobody holds it and nothing woke
        the service thread since it parked (it takes the stream back first: a caller that
        took the turn again at once after each give-back kept it from ever doing so, and it
        woke for nothing at every give-back)."""
        with self.lock:
            if (
                not self.parked
                or self.caller
                or self.left is not None
                or self.wakes != self.parked_at
                or self.closed
            ):
                return False
            self.caller = True
        return True

    def leave(self, left: Left) -> None:
        """A caller that holds the turn leaves ``left`` to the service thread (before it gives
        the turn back)."""
        with self.lock:
            self.left = left

    def give_back(self, left: Left | None, wake: bool) -> None:
        """Gives the turn back, leaving ``left`` to the service thread; with ``wake`` (work
        on its way) the service thread takes the stream back. A parked service thread
        with nothing to do is not woken: the next round trip finds it parked still."""
        with self.lock:
            self.caller = False
            if left is not None:
                self.left = left
            if wake:
                self.wakes += 1
            if self.closed or self.left is not None or self.wakes != self.parked_at:
                self.cond.notify_all()


class CallerTurns:
    """The callers' side of the turn, a part of ``StreamService`` (``service.py``): a caller
    that waits for its own work sends it and receives its result in its own thread while
    the service thread is parked (:meth:`round_trip` for an item a call read itself,
    :meth:`call_task` for ``apply``), or sends its task itself while nothing is on its way
    (:meth:`send_task`, for ``submit``)."""

    # What the stream service has, that the callers' side uses.
    turn: Turn | None
    call: Call | None
    scheduler: Scheduler
    runner: _TaskHooks
    watch: StuckWatch | None
    generation: int
    task_wait: float
    item_cost: float  # worker seconds per map item learned so far (0: none yet)
    # A caller's own results not learned yet (see round_trip): their worker seconds, count.
    own_secs: float = 0.0
    own_count: int = 0

    def _route(self, results: list[Any]) -> None: ...

    def _learn_cost(self, seconds: float, count: int) -> None: ...

    def input_coming(self) -> None: ...

    def round_trip(self, item: _WorkItem, job: _Job) -> bool:
        """A caller in a request/response loop read ``item`` of ``job`` itself. If the service
        thread is parked (nothing else on its way), the caller sends it and receives until
        its call has a result, in its own thread, and True is returned (it may then have
        left the rest to the service thread). Its own result is handed straight to it
        (``job.own``). False: nothing was sent (the feed sends it).

        Each step runs at every round trip, where a Python frame costs about 0.1 µs on a
        core shared with the worker: none only forwards a call."""
        turn = self.turn
        if turn is None or not turn.try_take():
            return False
        call = turn.call
        inp = call.input
        left: Left | None = None
        wake = True
        try:
            # Not into a stopping call, nor beside a dead worker (the service thread's to
            # find: a quiet restart).
            if inp.abort or self.runner.producer_died() or not inp.send_direct([item], now=True):
                return False
            # Sent: a probe's feed may read ahead while its result is on its way (as
            # Scheduler.sent_direct says it, without its frame).
            if job.sent_direct():
                self.scheduler.notify()
            jid = job.jid
            index = item[1]
            route = self._route
            # Its result has not come (the job had none when its caller read the item): the
            # first look at the job is after the first receive.
            while True:
                try:
                    # On trial, a wait past its span hands the input back (calls.py).
                    got = call.exchange(PROBE_INHERITED_S if job.trial_until else TICK, turn.chunks)
                except StopIteration:
                    left = Left(ended=True)
                    break
                except Exception as e:  # the stream failed: the service thread says so
                    left = Left(error=e)
                    break
                except BaseException as e:  # Ctrl-C in this caller: it stops the pool
                    left = Left(error=RunnerClosedError("the pool's stream was interrupted"))
                    if isinstance(e, WaitInterrupted):
                        raise KeyboardInterrupt from None
                    raise
                if not got:
                    # Nothing came within a tick, or a wake-up (other work on its way): the
                    # caller leaves the stream to the service thread and waits the common
                    # way, where Ctrl-C and other callers' work find the pool as always.
                    break
                for k, results in enumerate(got):
                    if len(results) == 1 and job.own is None:
                        r = results[0]
                        if r is not None and r[0] == jid and r[2] and r[1] == index:
                            # Its own result: straight to the caller (this thread).
                            out, secs = r[3]
                            job.own = out
                            # Its cost: learned OWN_LEARN_EVERY results at a time.
                            n = self.own_count + len(out)
                            secs += self.own_secs
                            if n < OWN_LEARN_EVERY and self.item_cost > 0:
                                self.own_count, self.own_secs = n, secs
                            else:
                                self.own_count, self.own_secs = 0, 0.0
                                self._learn_cost(secs, n)
                            continue
                    for r in results:
                        if r is None or r[0] != jid:
                            # The service thread routes others' results (from here on).
                            left = Left(handed=[x for rs in got[k:] for x in rs])
                            break
                    else:
                        route(results)
                        continue
                    break
                if left is not None or job.own is not None or job.has_result():
                    break
            wake = left is not None or not inp.drained()
            return True
        finally:
            turn.give_back(left, wake)

    def _take_turn(self) -> Turn | None:
        """The turn, taken, if the service thread is parked and the stream may be used: not
        a stopping call, nor beside a dead worker (the service thread's to find: a quiet
        restart; as ``round_trip`` does inline); None: nothing was done."""
        turn = self.turn
        if turn is None or not turn.try_take():
            return None
        if turn.call.input.abort or self.runner.producer_died():
            turn.give_back(None, wake=True)
            return None
        return turn

    def turn_free(self) -> bool:
        """Whether a caller may take the turn now (a guess: see :meth:`receive_for`)."""
        turn = self.turn
        return turn is not None and turn.free()

    def receive_for(self, job: _Job) -> bool:
        """A caller of ``job`` (a ``map``/``imap`` call) found no result to take. If the
        service thread is parked (it parks for a call that is all the pool has to do while
        its caller waits: :meth:`StreamService._lone_caller`), the caller receives in its
        own thread until ``job`` has a result, routing what comes as the service thread
        would, and True is returned; the service thread stays parked while the caller
        consumes, so the results of such a call reach it with no hand-off through the
        pool's threads (as a runner's ``imap`` receives in its caller's thread). A task's
        result (its future's callbacks run in the service thread), the stream's error or
        end, or a wait of a tick with nothing come give the stream back to the service
        thread. Whether it took the turn (False: nothing was done).
        """
        turn = self._take_turn()
        if turn is None:
            return False
        call = turn.call
        left: Left | None = None
        wake = False
        try:
            route = self._route
            job.receiver = call.wake_receiver
            inp = call.input
            until = time.monotonic() + TICK
            # (Until it has a result or an error, was closed, or its input ended with every
            # result taken.)
            while not (
                job.has_result() or job.closed or (job.input_done and job.consumed >= job.pulled)
            ):
                if inp.abort:
                    wake = True
                    break
                got = _exchange(call, turn)
                if isinstance(got, Left):
                    left = got
                    break
                if not got:
                    # A wake-up (input to send, the job's news: looked at above), or a wait
                    # with nothing: after a tick of those, the service thread looks at the
                    # stream (a worker's death, say).
                    if time.monotonic() >= until:
                        wake = True
                        break
                    continue
                until = time.monotonic() + TICK
                for k, results in enumerate(got):
                    if any(r is not None and r[0] == 0 for r in results):
                        # A task's result: the service thread routes from here on.
                        left = Left(handed=[x for rs in got[k:] for x in rs])
                        break
                    route(results)
                if left is not None:
                    break
            return True
        finally:
            job.receiver = None
            turn.give_back(left, wake)

    def call_task(self, fut: Future[Any], blob: _TaskBlob) -> bool:
        """``Pool.apply``: a caller about to wait for its task. If the service thread is
        parked (nothing else on its way), the caller sends the task and receives until its
        future is done (or it left the rest to the service thread), in its own thread, and
        True is returned; False: nothing was done (the caller queues the task). Either way
        the service thread parks after tasks too for a while, so that the next ``apply`` of
        a loop finds it parked."""
        self.task_wait = time.monotonic()
        turn = self._take_turn()
        if turn is None:
            return False
        call = turn.call
        left: Left | None = None
        wake = True
        try:
            tid = self.scheduler.begin_task(fut)
            if tid is None:
                return False  # closing: the caller's queueing says so
            item: _WorkItem = (0, tid, None, blob, _TASK)
            if not call.input.send_direct([item], now=True):
                self.scheduler.resend([item])  # sent by the feed, ahead of other work
                return True
            route = self._route
            while not fut.done():
                got = _exchange(call, turn)
                if isinstance(got, Left):
                    left = got
                    break
                if not got:
                    break  # the service thread receives it (as in round_trip)
                for k, results in enumerate(got):
                    if all(r is not None and r[0] == 0 and r[1] == tid for r in results):
                        route(results)  # its own future, done in this thread
                        continue
                    # The service thread routes others' results (from here on).
                    left = Left(handed=[x for rs in got[k:] for x in rs])
                    break
                if left is not None:
                    break
            wake = left is not None or not call.drained()
            return True
        finally:
            turn.give_back(left, wake)

    def send_task(self, fut: Future[Any], blob: _TaskBlob) -> bool:
        """``submit`` while nothing is on its way: the calling thread sends the task itself
        (no hand-over to the feed's thread), and the service thread receives its result as
        usual. False: nothing was done (the caller queues the task: the feed sends it)."""
        call = self.call
        scheduler = self.scheduler
        if (
            call is None
            or call.abort
            or self.watch is not None
            or not scheduler.feed_waiting
            or not scheduler.direct_ok
            or not call.drained()
        ):
            return False
        if self.runner.producer_died():
            return False  # the feed finds out before it sends (a quiet restart)
        inp = call.input

        def send(item: _WorkItem) -> bool:  # under the scheduler's lock: the stream stays
            # Not into a call that a new stream replaced since it was read above (an idle
            # stream's end keeps the generation): the feed sends it then.
            return self.call is call and inp.send_direct([item], now=True)

        if not scheduler.send_task(fut, blob, self.generation, send):
            return False
        self.input_coming()  # a parked service thread takes the stream back
        return True
