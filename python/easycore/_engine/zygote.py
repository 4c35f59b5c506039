"""A zygote: a process forked while its caller still runs one thread, which forks producers
on request, so that producers started later (a pool's replacements, after a death or for
``maxtasksperchild``) come from a single-threaded process and see the same snapshot of the
caller (its globals, closures and ``__main__`` as they were) as the first ones.

Forking a process that runs several threads is unsafe (a lock another thread held stays
locked in the child; CPython 3.12+ warns with a ``DeprecationWarning``), and a pool always
runs threads (its service thread) by the time it restarts a worker. The zygote is forked
when the pool's runner first starts its producers, before the pool starts any thread; it
never starts a thread itself.

How it talks (one ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair, one pickled message a packet):

* caller → zygote: ``("fork", rid, name, blob)`` with file descriptors (the child's end of
  its sentinel pipe, and whatever else the child needs, such as its shared state), or
  ``("stop",)``;
* zygote → caller: ``("pid", rid, pid)`` once forked (``("error", rid, text)`` if the fork
  failed), and ``("exit", rid, exitcode)`` when it reaped that child.

The child runs ``target(blob, fds)`` in a ``multiprocessing`` process of the fork context (so
``current_process()``, after-fork hooks and exit codes are the stdlib's). The caller sees it
through a :class:`ZygoteChild`, which has what the engine asks of a ``Process``: ``pid``,
``sentinel`` (the read end of a pipe only the child holds: readable once it exited, whatever
happened to the zygote), ``exitcode``, ``is_alive``, ``join``, ``terminate`` and ``kill``.

The zygote ends when told (``stop``), when its socket closes, or when the caller's liveness
token is gone (the caller died): it checks that every :data:`_OWNER_CHECK_S`. A zygote that
died (killed) forks nothing more: :meth:`Zygote.fork` returns None and the caller forks its
producers itself. Children that outlive their zygote keep running (they watch the caller, not
the zygote); their exit codes are then unknown (:data:`UNKNOWN_EXIT`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from easycore._core import drop_inherited_holds, owner_alive, sweep_dead_pids

_OWNER_CHECK_S = 0.5  # seconds between the zygote's looks at its caller's liveness token
_REPLY_S = 60.0  # most seconds the caller waits for the zygote to answer a fork request
_EXIT_REPORT_S = 5.0  # most seconds the caller waits for a child's exit code once it exited
_MAX_PACKET = 1 << 16
UNKNOWN_EXIT = 255  #: exit code of a child whose zygote died before it could report it


def _leave(owner: str | None) -> None:
    """Ends the zygote. If its caller died, removes the caller's names first (its liveness
    token above all): the caller's other children may be ending at that moment themselves,
    and a token nobody buries stays until the next sweep."""
    if owner is not None:
        # Its end of the socket closes as the caller dies, a moment before the kernel lets
        # go of its liveness token: a caller that is ending is given a second to be seen so.
        deadline = time.monotonic() + 1.0
        alive = owner_alive(owner)
        while alive and time.monotonic() < deadline:
            time.sleep(0.01)
            alive = owner_alive(owner)
        if not alive:
            sweep_dead_pids([int(owner.split("-", 1)[0])])
    os._exit(0)


def _zygote_main(sock: socket.socket, owner: str | None, target: Callable[..., Any]) -> None:
    """The zygote's loop (see the module); ends with ``os._exit``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the caller, which stops us
    ctx = multiprocessing.get_context("fork")
    kids: dict[int, tuple[int, Any]] = {}  # sentinel -> (request id, process)

    def send(msg: tuple[Any, ...]) -> None:
        try:
            sock.send(pickle.dumps(msg))
        except OSError:
            _leave(owner)  # the caller is gone

    sfd = sock.fileno()
    next_check = time.monotonic() + _OWNER_CHECK_S
    while True:
        # poll(2), not select(2): descriptors above 1023 are fine
        ready = multiprocessing.connection.wait([sfd, *kids], _OWNER_CHECK_S)
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + _OWNER_CHECK_S
            if owner is not None and not owner_alive(owner):
                _leave(owner)  # the caller died (its children watch it themselves)
        for fd in ready:
            if fd in kids:
                rid, proc = kids.pop(fd)
                proc.join()
                send(("exit", rid, proc.exitcode))
                proc.close()
        if sfd not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_PACKET, 8)
        except OSError:
            _leave(owner)
        if not data:
            _leave(owner)  # the caller closed its end (or died)
        msg = pickle.loads(data)
        if msg[0] != "fork":
            os._exit(0)  # "stop"
        _, rid, name, blob = msg
        try:
            proc = ctx.Process(target=_child_main, args=(sock, target, blob, fds), name=name)
            proc.start()
        except BaseException as e:  # noqa: BLE001 - told to the caller
            send(("error", rid, f"{type(e).__name__}: {e}"))
        else:
            kids[proc.sentinel] = (rid, proc)
            send(("pid", rid, proc.pid))
        finally:
            for fd in fds:
                os.close(fd)


def _child_main(
    sock: socket.socket, target: Callable[..., Any], blob: bytes, fds: list[int]
) -> Any:
    """A child of the zygote: drops the zygote's socket, then runs ``target``."""
    sock.close()
    return target(blob, fds)


def await_gone(threads: list[threading.Thread], timeout: float = 1.0) -> None:
    """Joins ``threads`` (ending ones: at most ``timeout`` in all), then waits (as long) until
    they have left the process.

    ``Thread.join()`` returns as the thread's Python state goes, a moment before the OS
    thread ends; a fork made meanwhile (the next pool's zygote) would fork a process that
    still runs two threads. Linux only (elsewhere it only joins)."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if not os.path.isdir("/proc/self/task"):
        return
    deadline = time.monotonic() + timeout
    for thread in threads:
        tid = thread.native_id
        while (
            tid is not None
            and os.path.exists(f"/proc/self/task/{tid}")
            and time.monotonic() < deadline
        ):
            time.sleep(0.001)


def _await_exit(pid: int, timeout: float) -> None:
    """Waits at most ``timeout`` seconds for child ``pid`` to exit (without reaping it), woken
    by the kernel where a pidfd can be had; else returns at once (the caller polls)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return
    try:
        multiprocessing.connection.wait([fd], timeout)
    finally:
        os.close(fd)


class ZygoteChild:
    """A process forked by a zygote, as the engine sees a ``multiprocessing.Process``."""

    def __init__(self, zygote: Zygote, rid: int, pid: int, sentinel: int, name: str) -> None:
        self._zygote = zygote
        self._rid = rid
        self.pid = pid
        self.sentinel = sentinel
        self.name = name
        self._code: int | None = None
        # One asker at a time: the zygote reports an exit code once (a second asker would
        # wait for a report that never comes, then take UNKNOWN_EXIT).
        self._code_lock = threading.Lock()
        weakref.finalize(self, os.close, sentinel)

    def _exited(self, timeout: float | None = 0.0) -> bool:
        return bool(multiprocessing.connection.wait([self.sentinel], timeout))

    @property
    def exitcode(self) -> int | None:
        """None while it runs, else its exit code (negative: the signal that ended it)."""
        if self._code is None and self._exited():
            with self._code_lock:
                if self._code is None:
                    self._code = self._zygote.exitcode_of(self._rid)
        return self._code

    def is_alive(self) -> bool:
        """Whether it still runs."""
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        """Waits at most ``timeout`` seconds for it to exit, and then for the zygote to have
        reaped it: the sentinel closes while the child's other descriptors may still be
        open (its holds on the queues' tokens among them), and a caller that lets go of a
        queue right after a join must find itself the last to hold it."""
        if self._exited(timeout):
            self.exitcode  # noqa: B018 - waits for the zygote's report of the reaped child

    def _signal(self, signum: int) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except OSError:
                pass

    def terminate(self) -> None:
        """SIGTERM, unless it exited."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, unless it exited."""
        self._signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<ZygoteChild {self.name} pid={self.pid} exitcode={self.exitcode}>"


class Zygote:
    """The caller's handle on a zygote process (see the module). Thread-safe."""

    def __init__(self, target: Callable[[bytes, list[int]], Any], owner: str | None) -> None:
        """Forks the zygote now (call it while this process runs one thread).

        Args:
            target: run in each child as ``target(blob, fds)``.
            owner: the caller's liveness token (the zygote ends once it is gone), or None.
        """
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = mine
        self._lock = threading.Lock()
        self._rids = 0
        self._codes: dict[int, int] = {}  # exit codes reported, by request id
        self._replies: dict[int, tuple[Any, ...]] = {}
        self._down = False
        self._owner_pid = os.getpid()
        self._exit: int | None = None  # the zygote's own exit code, once reaped
        # A plain fork, not a multiprocessing.Process: multiprocessing would list it among
        # this process's children, join it at exit and terminate it from a child that this
        # process forks by hand and that exits normally (as it does its daemons).
        pid = os.fork()
        if pid == 0:  # the zygote: never returns to the caller's code
            code = 1
            try:
                mine.close()  # neither the zygote nor its children hold the caller's end
                # Nor the caller's queues: the producers attach to theirs by name, and a
                # queue the caller lets go of must not stay held by the zygote's family.
                drop_inherited_holds()
                _zygote_main(theirs, owner, target)
            finally:
                os._exit(code)
        self.pid = pid
        theirs.close()

    def _reaped(self, block: bool = False) -> bool:
        """Whether the zygote has exited (reaping it; call under the lock)."""
        if self._exit is None and os.getpid() == self._owner_pid:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:  # reaped by someone else
                self._exit = UNKNOWN_EXIT
            else:
                if pid:
                    self._exit = os.waitstatus_to_exitcode(status)
        return self._exit is not None

    @property
    def alive(self) -> bool:
        """Whether the zygote can still fork."""
        with self._lock:
            return not self._down and not self._reaped()

    def _read(self, timeout: float) -> bool:
        """Reads what the zygote sent, waiting at most ``timeout`` for the first message
        (call under the lock); False once the zygote is gone."""
        if self._down:
            return False
        wait: float | None = timeout
        while True:
            if not multiprocessing.connection.wait([self._sock], wait):
                return True
            try:
                data = self._sock.recv(_MAX_PACKET)
            except OSError:
                data = b""
            if not data:
                self._down = True
                return False
            msg = pickle.loads(data)
            if msg[0] == "exit":
                self._codes[msg[1]] = msg[2]
            else:
                self._replies[msg[1]] = msg
            wait = 0.0

    def fork(self, name: str, blob: bytes, fds: list[int]) -> ZygoteChild | None:
        """Forks a child that runs ``target(blob, fds)`` (``fds`` are passed to it; the caller
        keeps its own copies). Returns None if the zygote is gone (then the caller forks
        itself); raises ``OSError`` if the zygote could not fork."""
        r, w = os.pipe()  # the sentinel: only the child holds w
        reply: tuple[Any, ...] | None = None
        try:
            with self._lock:
                if self._down:
                    return None
                self._rids += 1
                rid = self._rids
                try:
                    socket.send_fds(
                        self._sock, [pickle.dumps(("fork", rid, name, blob))], [w, *fds]
                    )
                except OSError:
                    self._down = True
                    return None
                deadline = time.monotonic() + _REPLY_S
                while rid not in self._replies:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._read(left):
                        self._down = True
                        if not self._reaped():
                            os.kill(self.pid, signal.SIGKILL)  # stuck: it forks nothing more
                        return None
                reply = self._replies.pop(rid)
        finally:
            os.close(w)
            if reply is None or reply[0] != "pid":
                os.close(r)
        if reply is None:
            return None
        if reply[0] == "error":
            raise OSError(f"the zygote could not fork a producer: {reply[2]}")
        return ZygoteChild(self, rid, reply[2], r, name)

    def exitcode_of(self, rid: int) -> int:
        """The exit code of child ``rid``, which exited: as the zygote reports it (waiting a
        little for the report), or :data:`UNKNOWN_EXIT` if the zygote is gone."""
        deadline = time.monotonic() + _EXIT_REPORT_S
        with self._lock:
            while rid not in self._codes:
                left = deadline - time.monotonic()
                if left <= 0 or not self._read(left):
                    return UNKNOWN_EXIT
            return self._codes.pop(rid)

    def close(self, timeout: float = 5.0) -> None:
        """Stops the zygote (children it forked are not touched) and reaps it."""
        if os.getpid() != self._owner_pid:
            return  # a forked child of the caller: the zygote is not its to stop
        with self._lock:
            if not self._down:
                self._down = True
                try:
                    self._sock.send(pickle.dumps(("stop",)))
                except OSError:
                    pass
            self._sock.close()
            deadline = time.monotonic() + timeout
            _await_exit(self.pid, timeout)
            while not self._reaped() and time.monotonic() < deadline:
                time.sleep(0.001)
            if not self._reaped():
                os.kill(self.pid, signal.SIGKILL)
                self._reaped(block=True)
