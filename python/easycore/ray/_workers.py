"""The Ray transport: the actors of an active runner (:class:`RayWorkers`), started from an
:class:`ActorPlan` (what ``RayBackend.plan`` made of the devices).

The engine's stream (:class:`~easycore._engine.stream.Call`) reads and batches the
input, keeps the window, orders results, runs the consumer hooks, shows progress and keeps
the statistics. It talks to its producers through a
:class:`~easycore._engine.transport.Transport`; :class:`RayWorkers` is the Ray one:

* ``send`` sends one batch as one actor call (``ProducerActor.work``) to the actor with the
  fewest calls in flight, and raises ``QueueFull`` when every actor already has
  ``calls_in_flight`` of them;
* each call's result (a message of the engine's wire format) arrives through a callback on
  its ``ObjectRef`` into the inbox, which ``receive`` reads (the input reader's wake-ups go
  there too);
* an actor call that fails because its actor died records a ``WorkerDiedError`` (actor,
  node, pid, cause), which ``dead()`` returns: the engine then fails the call and closes the
  runner, as for a dead process;
* ``shutdown`` cancels calls not yet started (with ``interrupt``), runs ``producer_end`` in
  every actor (``ProducerActor.stop``), and kills what is left.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from easycore._engine import lifecycle, wire
from easycore._engine import producer as _producer
from easycore._engine.lifecycle import INTERRUPT_GRACE_S, TICK, Stage
from easycore._engine.local import ProducerStart
from easycore._engine.reports import error_report, worker_error
from easycore._engine.transport import Transport
from easycore.errors import (
    RUNNER_CLOSED,
    EasycoreError,
    QueueClosed,
    QueueEmpty,
    QueueFull,
    WorkerDiedError,
)
from easycore.ray._actor import ProducerActor, to_ray_parts


@dataclass
class ActorPlan:
    """The actors of one runner: what ``RayBackend.plan`` returns (the engine's remote
    plan: ``devices``, ``start_method``, ``start``).

    Attributes:
        connect: initialises Ray if needed and returns the ``ray`` module.
        devices: one device name per producer (as the user gave it).
        hook_devices: the device string each producer's hooks get.
        options: Ray actor options per producer.
        calls_in_flight: actor calls sent ahead to each actor.
        start_timeout: seconds to wait for every actor to run ``producer_init``.
    """

    connect: Callable[[], Any]
    devices: list[str]
    hook_devices: list[str]
    options: list[dict[str, Any]]
    calls_in_flight: int
    start_timeout: float
    start_method: tuple[str, str] = ("ray", "producers are Ray actors")

    def start(self, start: ProducerStart) -> RayWorkers:
        """Starts one actor per device and waits until each ran ``producer_init``."""
        return RayWorkers.start(self, start)


@dataclass
class ActorInfo:
    """Where a producer runs (``RayWorkers.procs[i]``).

    Attributes:
        pid (int): the actor's process id on its node.
        node_id (str): the Ray node id.
        node_ip (str): the node's IP address.
        actor_id (str): the Ray actor id.
    """

    pid: int
    node_id: str
    node_ip: str
    actor_id: str


_REMOTE_CLASS: list[Any] = []


def _remote_class(ray: Any) -> Any:
    if not _REMOTE_CLASS:
        _REMOTE_CLASS.append(ray.remote(ProducerActor))
    return _REMOTE_CLASS[0]


def _cause(e: BaseException) -> str:
    """The reason Ray gives for an actor's death, without its generic advice."""
    text = str(e)
    at = text.find("The actor is dead because")
    if at < 0:
        at = text.find("The actor died because")
    cause = text[at:] if at >= 0 else text.strip().splitlines()[-1] if text.strip() else ""
    cut = cause.find(" Some common causes")
    if cut >= 0:
        cause = cause[:cut]
    cause = " ".join(cause.split())
    return cause[:400] or type(e).__name__


class _Inbox:
    """Messages from actor calls' callbacks (Ray's threads) and from the input reader
    (:meth:`RayWorkers.wake`), taken by the stream's receiving thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.msgs: collections.deque[tuple[int, int, list[Any]]] = collections.deque()
        self.closed = False
        self.wait_seconds = 0.0

    def push(self, msg: tuple[int, int, list[Any]]) -> None:
        with self.cond:
            self.msgs.append(msg)
            self.cond.notify()

    def take(
        self, max_messages: int, block: bool = True, timeout: float | None = None
    ) -> list[tuple[int, int, list[Any]]]:
        """Up to ``max_messages`` messages (see :meth:`Transport.receive`)."""
        with self.cond:
            if not self.msgs:
                if self.closed:
                    raise QueueClosed("the runner was closed")
                if not block:
                    raise QueueEmpty("no result")
                t = time.perf_counter()
                self.cond.wait(timeout)
                self.wait_seconds += time.perf_counter() - t
                if not self.msgs:
                    if self.closed:
                        raise QueueClosed("the runner was closed")
                    raise QueueEmpty("no result")
            msgs = self.msgs
            return [msgs.popleft() for _ in range(min(max_messages, len(msgs)))]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class RayWorkers(Transport):
    """The actors of an active runner: the engine's transport over Ray actor calls."""

    def __init__(
        self,
        ray: Any,
        handles: list[Any],
        devices: list[str],
        procs: list[ActorInfo],
        codec: wire.Codec,
        out_budget: int,
        calls_in_flight: int,
    ) -> None:
        self.ray = ray
        self.handles = handles
        self.devices = devices
        self.procs = procs
        self.codec = codec
        self.out_budget = out_budget
        self.calls_in_flight = calls_in_flight
        n = len(handles)
        self.view = [0] * _producer.state_size(n)
        for i in range(n):
            self.view[_producer.STATE_FIELDS * i + _producer.ITEM] = -1
        self.lock = threading.Lock()
        # Per actor, its calls in flight in the order sent (an actor runs them in that
        # order): [ref, call, first item, item count, seq].
        self.inflight: list[collections.deque[list[Any]]] = [collections.deque() for _ in range(n)]
        self.turn = 0
        self.died: WorkerDiedError | None = None
        self.dead_actors: set[int] = set()
        self.closed = False
        self.end_errors: list[dict[str, Any]] = []
        self.exit_results: dict[int, Any] = {}
        self.start_s: dict[int, float] = {}  # per actor: from its creation until ready
        self.init_s: dict[int, float] = {}  # per actor: its set-up and producer_init
        self.owner_pid = os.getpid()
        self.inbox = _Inbox()
        self.receive = self.inbox.take  # type: ignore[method-assign]
        lifecycle.register(Stage.PRODUCERS, self)

    # ----- start -----

    @classmethod
    def start(cls, plan: ActorPlan, start: ProducerStart) -> RayWorkers:
        """Starts the actors of ``plan`` as ``start`` says and waits for ``producer_init``.

        Raises:
            WorkerError: ``producer_init`` raised (its type kept, as locally).
            WorkerDiedError: an actor died while starting.
            EasycoreError: the actors did not start within the backend's ``start_timeout``.
        """
        ray = plan.connect()
        actor_cls = _remote_class(ray)
        n = len(plan.devices)
        codec = start.flavour.codec()
        opts = {
            "n": n,
            "seed": start.seed,
            "seed_per_item": start.seed_per_item,
            "codec": codec,
            "fix_unsendable": start.fix_unsendable,
        }
        handles = []
        times: dict[int, list[float]] = {}  # per actor: [start-up, init] seconds
        try:
            created = time.perf_counter()
            for i, options in enumerate(plan.options):
                handle = actor_cls.options(max_restarts=0, max_task_retries=0, **options).remote(
                    start.hooks, i, plan.hook_devices[i], start.cfg, start.setup, opts
                )
                handles.append(handle)
            starts = [h.start.remote() for h in handles]
            infos = _wait_started(ray, plan, handles, starts, codec, created, times)
        except BaseException:
            for h in handles:
                _kill(ray, h)
            raise
        store = ray.cluster_resources().get("object_store_memory", 0)
        out_budget = int(max(8 << 20, min(256 << 20, store // 8)))
        workers = cls(ray, handles, plan.devices, infos, codec, out_budget, plan.calls_in_flight)
        for i, (start_s, init_s) in times.items():
            workers.start_s[i], workers.init_s[i] = start_s, init_s
        return workers

    # ----- sending and receiving -----

    def send(self, seq: int, kind: int, parts: list[Any]) -> None:
        """Sends one batch to the least busy live actor; ``QueueFull`` if none has room."""
        if self.closed:
            raise QueueClosed("the runner was closed")
        t, call = wire.unpack_kind(kind)
        if t != wire.WORK:
            return
        first, items = self.codec.loads(parts)
        count = len(items)
        del items
        with self.lock:
            best = -1
            least = self.calls_in_flight
            n = len(self.handles)
            for k in range(n):
                i = (self.turn + k) % n
                if i not in self.dead_actors and len(self.inflight[i]) < least:
                    best, least = i, len(self.inflight[i])
            if best < 0:
                raise QueueFull("every actor has its calls in flight")
            self.turn = (best + 1) % n
            ref = self.handles[best].work.remote(seq, kind, to_ray_parts(parts))
            entry = [ref, call, first, count, seq]
            q = self.inflight[best]
            q.append(entry)
            if len(q) == 1:
                self._working_on(best, entry)
        ref.future().add_done_callback(functools.partial(self._done, best, entry))

    def _working_on(self, i: int, entry: list[Any] | None) -> None:
        """Updates the view of what actor ``i`` works on (under ``lock``): its oldest call."""
        base = _producer.STATE_FIELDS * i
        view = self.view
        if entry is None:
            view[base + _producer.ITEM] = -1
            return
        view[base + _producer.CALL] = entry[1]
        view[base + _producer.SINCE_NS] = time.monotonic_ns()
        view[base + _producer.COUNT] = entry[3]
        view[base + _producer.ITEM] = entry[2]

    def _done(self, i: int, entry: list[Any], fut: Any) -> None:
        """An actor call ended (in a Ray thread): its message goes to the output queue."""
        exceptions = self.ray.exceptions
        msg = None
        try:
            msg = fut.result()
        except exceptions.TaskCancelledError:
            pass
        except exceptions.RayActorError as e:
            self._actor_died(i, e)
        except BaseException as e:  # noqa: BLE001 - reported as the batch's error
            report = error_report("producer_work", self.devices[i], entry[2], e, "ray")
            msg = (entry[4], wire.pack_kind(wire.ERROR, entry[1]), self.codec.dumps(report))
        with self.lock:
            q = self.inflight[i]
            was_first = bool(q) and q[0] is entry
            try:
                q.remove(entry)
            except ValueError:
                pass
            if was_first:
                self._working_on(i, q[0] if q else None)
            entry[0] = None
        if msg is not None:
            self.inbox.push(msg)
        elif self.died is not None:
            self.inbox.push((0, wire.pack_kind(wire.WAKE, 0), [b""]))

    def _actor_died(self, i: int, e: BaseException) -> None:
        with self.lock:
            self.dead_actors.add(i)
            if self.died is not None:
                return
            p = self.procs[i]
            self.died = WorkerDiedError.of(
                f"producer {i} (Ray actor {p.actor_id}, device {self.devices[i]!r}, node "
                f"{p.node_ip} {p.node_id[:12]}, pid {p.pid}) died: {_cause(e)}",
                RUNNER_CLOSED,
                pid=p.pid,
                device=self.devices[i],
                exitcode=None,
            )
            self.died.actor_id = p.actor_id  # type: ignore[attr-defined]
            self.died.node_id = p.node_id  # type: ignore[attr-defined]
            self.died.node_ip = p.node_ip  # type: ignore[attr-defined]

    # ----- the rest of the Transport interface -----

    def wake(self, call: int, timeout: float = 1.0) -> None:
        self.inbox.push((0, wire.pack_kind(wire.WAKE, call), [b""]))

    def wait_seconds(self) -> tuple[float, float]:
        return 0.0, self.inbox.wait_seconds

    def dead(self) -> WorkerDiedError | None:
        """The error for the first actor seen dead, if any."""
        return self.died

    def drain_input(self) -> None:
        """Cancels the calls that no actor has started yet (after a failed call)."""
        self._cancel_all()

    def _cancel_all(self) -> None:
        with self.lock:
            refs = [e[0] for q in self.inflight for e in q if e[0] is not None]
        for ref in refs:
            try:
                self.ray.cancel(ref)
            except Exception:  # noqa: BLE001, S110 - already done or its actor is gone
                pass

    def interrupt(self) -> None:
        """Cancels every call in flight (a running call ends when its batch is done)."""
        self._cancel_all()

    def _stop(self, timeout: float, interrupt: bool) -> None:
        """Runs ``producer_end`` in every actor, then kills the actors. With ``interrupt``,
        calls not yet started are cancelled and ``producer_end`` gets a short grace."""
        ray = self.ray
        if interrupt:
            self.interrupt()
            timeout = min(timeout, INTERRUPT_GRACE_S)
        deadline = time.monotonic() + timeout
        stops: dict[Any, int] = {}
        for i, h in enumerate(self.handles):
            if i not in self.dead_actors:
                try:
                    stops[h.stop.remote()] = i
                except Exception:  # noqa: BLE001, S112 - the actor is gone
                    continue
        pending = list(stops)
        while pending and time.monotonic() < deadline:
            left = max(0.0, min(TICK, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=left)
            for ref in ready:
                try:
                    err, value = ray.get(ref)
                except Exception:  # noqa: BLE001, S112 - died in producer_end: nothing to say
                    continue
                if err is not None:
                    self.end_errors.append(err)
                self.exit_results[stops[ref]] = value
        self.inbox.close()
        for h in self.handles:
            _kill(ray, h)

    def kill_now(self) -> None:
        """Kills every actor at once (second Ctrl-C, exit)."""
        if not self.mine():
            return
        self.closed = True
        self.inbox.close()
        for h in self.handles:
            _kill(self.ray, h)
        lifecycle.discard(Stage.PRODUCERS, self)


def _kill(ray: Any, handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001, S110 - already dead, or Ray is shut down (at exit)
        pass


def _wait_started(
    ray: Any,
    plan: ActorPlan,
    handles: list[Any],
    starts: list[Any],
    codec: wire.Codec,
    created: float,
    times: dict[int, list[float]],
) -> list[ActorInfo]:
    """Waits for every actor's ``start`` call; raises the first failure as locally. Puts in
    ``times[i]`` actor ``i``'s seconds from ``created`` (``perf_counter``, when the actors
    were asked for) until its ``start`` returned here, and of its set-up and
    ``producer_init``."""
    infos: list[ActorInfo | None] = [None] * len(handles)
    index = {ref: i for i, ref in enumerate(starts)}
    pending = list(starts)
    deadline = time.monotonic() + plan.start_timeout
    while pending:
        if time.monotonic() > deadline:
            waiting = [index[r] for r in pending]
            asks = "; ".join(f"producer {i}: {plan.options[i]}" for i in waiting)
            raise EasycoreError(
                f"{len(waiting)} Ray actor(s) did not start within start_timeout="
                f"{plan.start_timeout:.0f} s: the cluster may lack the resources they "
                f"ask for ({asks}); see `ray status`"
            )
        ready, pending = ray.wait(pending, num_returns=1, timeout=TICK)
        for ref in ready:
            i = index[ref]
            try:
                pid, node_id, ip, actor_id, kind, parts, init_s = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                raise WorkerDiedError(
                    f"producer {i} (Ray actor, device {plan.devices[i]!r}) died while "
                    f"starting (in producer_init or before): {_cause(e)}",
                    device=plan.devices[i],
                ) from e
            if kind == wire.ERROR:
                raise worker_error(codec.loads(parts))
            infos[i] = ActorInfo(pid, node_id, ip, actor_id)
            times[i] = [time.perf_counter() - created, float(init_s)]
    return [x for x in infos if x is not None]
