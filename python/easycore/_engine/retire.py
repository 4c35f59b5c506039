"""Producers that retire one by one while the stream runs (``max_tasks``, the pool's
``maxtasksperchild``), and the new producers that take their place in the same stream.

The stream does not stop, and no other producer notices. What makes it possible:

* **The queues keep their names while the producers may be replaced.** A new producer
  attaches to the running stream's two queues by name, as every producer does. A runner
  whose producers never retire unlinks the names once all attached; one with ``max_tasks``
  keeps them linked until its producers stop (``transport.LocalWorkers._release``). That
  adds nothing a neighbour or a crash can use: the queues' pooled segments and their token
  are named for the whole stream anyway; every name is created exclusively, mode 0600, with
  64 random bits, and opened refusing links and foreign files (``docs/safety.md``); and
  every process using the queues holds the queue's token, so when the caller is SIGKILLed,
  the last producer to leave (each one's watchdog sees the caller's liveness token go)
  removes every name of the queues, the rings' included, and if everyone was killed at
  once, the next sweep does (nobody holds the token).
* **Work is not assigned to a producer.** Batches wait in one shared queue that every
  producer takes from; while a place is empty the others take its share, and the stream's
  accounting (items in flight, results, order) never counts producers.
* **A task is one work message.** A producer counts the work messages it took and, after
  ``max_tasks``, takes no more. The pool sends one work item (a submitted task, a ``map``
  chunk, one ``imap`` item) per message when it has a ``maxtasksperchild``, so a producer
  runs exactly ``maxtasksperchild`` tasks, as ``multiprocessing.Pool``'s workers do.
* **Replacements start from where the first producers did.** Under fork from the runner's
  zygote (``zygote.py``, a fork of the caller while it ran one thread): the new producer
  gets the shared state's memfd with its fork request, and attaches to the queues by
  name. Under spawn and forkserver: a new process, as at the start.

The hand-over, in order (R: the retiring producer, C: the caller, N: the replacement):

1. R puts the result of its last task, and takes no more work.
2. R writes its pid in its word of the shared state (``producer.RETIRED``): from here
   every result it made is in the output queue, so whatever happens to R, nothing is lost.
3. R runs ``producer_end`` (the pool's ``worker_exit``).
4. R puts ``RETIRE`` (``producer_end``'s error and value, and its pid), then exits.
5. C replaces R as soon as it sees either R's ``RETIRE`` or R's exit with its pid in the
   word (whichever comes first; the other then changes nothing): it clears the word,
   starts N in R's place (same index and device) and keeps R to reap it.
6. N attaches, runs the set-up and ``producer_init``, puts ``READY``, then takes work.

If one of them dies (any signal, at any point):

* R before step 2: a producer's death, as any other (``WorkerDiedError`` for the calls
  with work on its way, and the pool restarts its producers; see ``docs/pool.md``).
* R after step 2 (before, during or after 3 and 4): nothing is lost and nothing fails; C
  replaces R when it sees R gone (step 5). ``producer_end``'s value (and error) are lost
  unless R put its ``RETIRE``.
* C between 4 and 5, or while N starts: the caller died; R (if still there), N (once its
  watchdog runs) and the zygote see its liveness token go and leave, and the last to leave
  removes the queues' names, as for any producer. An N that comes to attach after the
  last one left finds the queues gone and exits (a spawned one prints that error).
* N before 6, or after: a producer's death, as any other: it died where a producer of the
  stream is expected to be. (No work is lost by N before 6; calls with work in flight still
  fail, so that a replacement that always dies does not loop for ever.)
* C cannot start N (the zygote is gone: N is forked by the caller itself, as a pool does
  after its zygote died; the start fails): reported as R's death.

**Given up on.** The same replacement serves a producer that the caller gives up on: the
pool's worker stuck in C code past its ``task_timeout`` (``parallel/hardstop.py``). The
caller has stopped it (SIGSTOP) inside that task, so it holds no queue record and no lock of
the queues' (it is in user code); :meth:`Retirements.give_up` kills it and starts N in its
place as in step 5, while the stream and the other producers go on. If N dies: as above.
If the caller dies meanwhile: the killed producer is gone, N leaves with the others.

The tests kill producers at each of these steps (``process_main.fault``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from easycore._core import sweep_dead_pids
from easycore._engine import producer as _producer
from easycore._engine import wire


class Starter(Protocol):
    """Starts one producer again (``local.Starter``)."""

    def start(self, i: int) -> Any:
        """Starts producer ``i``; returns its process."""

    def adopt_zygote(self, zygote: Any) -> None:
        """The zygote that forks replacements from now on."""

    def close(self) -> None:
        """No producer starts any more."""


class Retirements:
    """A transport's retired producers and their replacements (see the module).

    Args:
        procs: the transport's list of current producers (replaced in place).
        view: the shared state (int64 words, ``producer.STATE_FIELDS`` per producer).
        starter: starts producer ``i`` again.
        loads: the codec's ``loads`` (for ``RETIRE``'s payload).
        changed: called (under the lock) when a producer was replaced.
    """

    def __init__(
        self,
        procs: list[Any],
        view: Any,
        starter: Starter,
        loads: Callable[[Any], Any],
        changed: Callable[[], None],
    ) -> None:
        self.procs = procs
        self.changed = changed
        self.view = view
        self.starter = starter
        self.loads = loads
        self.lock = threading.Lock()  # the feed's, the receiver's and a caller's looks
        self.retired: list[Any] = []  # replaced, not yet reaped
        self.stopping = False  # the transport stops: nothing is started any more
        self.replaced = 0  # producers that retired and were replaced
        self.start_failed: dict[int, str] = {}  # by index: why a replacement did not start
        self.exit_results: dict[int, Any] = {}  # by index: the last retiree's value
        self.end_errors: list[dict[str, Any]] = []

    def _word(self, i: int) -> int:
        return _producer.STATE_FIELDS * i + _producer.RETIRED

    def retiring(self, i: int, proc: Any) -> bool:
        """Whether ``proc`` (producer ``i``, or one it replaced) retires or retired: its
        pid is in its word (step 2), or it was already replaced."""
        return proc is not self.procs[i] or self.view[self._word(i)] == proc.pid

    def gone(self, i: int, proc: Any) -> bool:
        """``proc``, producer ``i``, has exited: True if it retired (it is replaced now, if
        not already), False if it died."""
        with self.lock:
            if proc is not self.procs[i]:
                return True  # replaced meanwhile
            if self.view[self._word(i)] != proc.pid:
                return False
            self._replace(i)
            return True

    def message(self, seq: int, kind: int, parts: list[Any]) -> bool:
        """A producer's message outside any call: ``RETIRE`` (step 4) replaces producer
        ``seq`` if not yet done; ``READY`` is a replacement's (step 6). Whether it was one
        of those."""
        if kind != wire.RETIRE:
            return kind == wire.READY
        err, value, pid = self.loads(parts)
        with self.lock:
            self.note_exit(seq, err, value)
            proc = self.procs[seq]
            if proc.pid == pid and self.view[self._word(seq)] == pid:
                self._replace(seq)
            self._reap()
        return True

    def note_exit(self, i: int, err: dict[str, Any] | None, value: Any) -> None:
        """A retiree's ``producer_end`` report and value."""
        if err is not None:
            self.end_errors.append(err)
        self.exit_results[i] = value

    def give_up(self, i: int, proc: Any) -> bool:
        """The caller gave up on ``proc``, producer ``i`` (stopped in a task that does not
        end: the pool's ``hardstop.py``): kills it and starts a new one in its place. False
        if nothing was done (the transport stops, or ``proc`` was replaced meanwhile): then
        it is the caller's to kill."""
        with self.lock:
            if proc is not self.procs[i] or self.stopping:
                return False
            try:
                proc.kill()
            except (OSError, AttributeError):
                pass
            proc.join(2.0)  # stopped, then killed: reaped at once (_replace forgets it)
            self.view[self._word(i)] = proc.pid  # replaced, not dead (see _replace)
            self._replace(i)
            return True

    def _replace(self, i: int) -> None:
        """Step 5 (under the lock): producer ``i`` retired; a new one takes its place."""
        if self.stopping:
            return
        old = self.procs[i]
        # Cleared before the new one starts: it may retire (and write its pid) before
        # start() returns here. From now on the old one is judged dead, unless replaced.
        self.view[self._word(i)] = 0
        self.view[_producer.STATE_FIELDS * i + _producer.ITEM] = -1
        try:
            new = self.starter.start(i)
        except Exception as e:  # noqa: BLE001 - reported as the old one's death
            self.start_failed[i] = f"{type(e).__name__}: {e}"
            return
        self.retired.append(old)
        self.procs[i] = new
        self.changed()
        self.replaced += 1
        self._reap()

    def _reap(self) -> None:
        """Forgets the retirees that exited (reaped; their liveness tokens removed)."""
        left = [p for p in self.retired if p.exitcode is None]
        if len(left) != len(self.retired):
            sweep_dead_pids([p.pid for p in self.retired if p.exitcode is not None and p.pid])
            self.retired = left

    def stop(self) -> list[Any]:
        """The transport stops: no replacement starts any more; returns the retirees not
        yet reaped (to join)."""
        with self.lock:
            self.stopping = True
            retired, self.retired = self.retired, []
        self.starter.close()
        return retired
