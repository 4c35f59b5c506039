"""The exceptions easycore raises, in one tree rooted at :class:`EasycoreError`.

Where a stdlib exception already says the same thing, ours subclasses it too, so code that
catches ``queue.Empty``, ``queue.Full``, ``TimeoutError``, ``OSError`` or ``ValueError`` keeps
working.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.pool import MaybeEncodingError  # type: ignore[attr-defined]
from typing import Any, cast


class EasycoreError(Exception):
    """Root of every exception raised by easycore."""


class InvalidArgument(EasycoreError, ValueError):
    """An argument is out of range or of the wrong kind."""


class QueueClosed(EasycoreError):
    """The queue was closed: nothing more can be put, and it has been drained."""


class QueueEmpty(EasycoreError, queue.Empty):
    """Nothing could be got before the timeout (or at once, when not blocking)."""


class QueueFull(EasycoreError, queue.Full):
    """Nothing more could be put before the timeout (or at once, when not blocking)."""


class EasycoreTimeoutError(EasycoreError, TimeoutError):
    """A wait (for a lock, a worker, a result) ran past its timeout."""


class EasycoreOSError(EasycoreError, OSError):
    """An operating-system call failed; ``errno`` and the failed operation are given."""


class SharedMemoryError(EasycoreOSError):
    """Shared memory could not be had: ``/dev/shm`` too small, a limit, or a bad segment."""


class RunnerClosedError(EasycoreError):
    """A runner was used after ``close()``; call ``activate()`` to restart it."""


class PoolClosedError(RunnerClosedError, ValueError):
    """A pool was used after ``close()`` or ``terminate()`` (a ``ValueError``, as
    ``multiprocessing.Pool`` raises)."""


class PoolTimeoutError(EasycoreTimeoutError, multiprocessing.TimeoutError):
    """A pool's result did not arrive within its timeout: both the builtin ``TimeoutError``
    and ``multiprocessing.TimeoutError``, which ``AsyncResult.get`` raises in the stdlib."""


class RunnerBusyError(EasycoreError, RuntimeError):
    """A call was made on a runner that cannot take it now: another call of the same runner
    is open in this thread (an unfinished ``imap``, or a call from inside a consumer hook),
    or the runner belongs to another process (a runner made before ``fork`` is the parent's).
    """


class RunnerTimeoutError(EasycoreTimeoutError):
    """No result arrived within a call's ``timeout``.

    Attributes:
        timeout (float): the timeout that ran out, in seconds.
        item (int | None): the input index of the item a producer was stuck on, if known.
        producer (int | None): the index (position in ``devices``) of that producer.
        device (str | None): its device.
        pid (int | None): its process id.
    """

    def __init__(
        self,
        message: str,
        timeout: float = 0.0,
        item: int | None = None,
        producer: int | None = None,
        device: str | None = None,
        pid: int | None = None,
    ) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.item = item
        self.producer = producer
        self.device = device
        self.pid = pid


class StartMethodError(EasycoreError):
    """Producer processes could not be started with the chosen start method (typically
    ``spawn``: the runner class or ``cfg`` cannot be pickled, or the main script lacks
    ``if __name__ == "__main__":``). The message says what to change."""


class WorkerError(EasycoreError):
    """A hook raised in a producer or in the consumer.

    Attributes:
        hook (str): the hook that raised, e.g. ``"producer_work"``.
        device (str | None): the producer's device, None for consumer hooks.
        item (int | None): the input index of the item being processed, if any.
        remote_traceback (str): the traceback as formatted where the error happened.
    """

    def __init__(
        self,
        message: str,
        hook: str = "",
        device: str | None = None,
        item: int | None = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.hook = hook
        self.device = device
        self.item = item
        self.remote_traceback = remote_traceback

    # Keep the attributes when pickled across processes.
    def __reduce__(self) -> tuple[type[WorkerError], tuple[Any, str, str | None, int | None, str]]:
        return (
            type(self),
            (self.args[0], self.hook, self.device, self.item, self.remote_traceback),
        )


_AS_TYPE: dict[type, type[WorkerError] | None] = {}


def _rebuild_worker_error(
    original: type,
    message: str,
    fields: tuple[str, str | None, int | None, str],
    state: dict[str, Any] | None,
) -> WorkerError:
    """Unpickles a :func:`worker_error_as` instance (its class is made again on the fly)."""
    hook, device, item, remote_traceback = fields
    return worker_error_as(original, message, hook, device, item, remote_traceback, state=state)


def _typed_str(self: BaseException) -> str:
    return str(self.args[0]) if self.args else ""


def _typed_reduce(self: WorkerError) -> tuple[Any, ...]:
    fields = (self.hook, self.device, self.item, self.remote_traceback)
    state = {k: v for k, v in vars(self).items() if k not in _WORKER_FIELDS}
    original = getattr(self, "original_type", None)
    return (_rebuild_worker_error, (original, _typed_str(self), fields, state))


_WORKER_FIELDS = ("hook", "device", "item", "remote_traceback", "original_type")


def worker_error_class(original: type) -> type[WorkerError] | None:
    """The class ``WorkerError[original]``: a :class:`WorkerError` that is also an instance
    of ``original``, so ``except ValueError`` catches a ``ValueError`` raised in a hook.

    Classes are made once per original type and cached. Returns None where no such class
    can be made (a type that refuses subclasses, or whose instance layout clashes).
    """
    if original in _AS_TYPE:
        return _AS_TYPE[original]
    cls: type[WorkerError] | None = None
    if (
        isinstance(original, type)
        and issubclass(original, Exception)
        and not issubclass(original, WorkerError)
    ):
        try:
            made = type(
                f"WorkerError[{original.__qualname__}]",
                (WorkerError, original),
                {
                    "__module__": __name__,
                    "__str__": _typed_str,
                    "__reduce__": _typed_reduce,
                    "__doc__": f"A WorkerError that is also a {original.__qualname__}.",
                },
            )
            cls = cast("type[WorkerError]", made)
            # Instances are made without the user's __init__ (its arguments are unknown).
            cls.__new__(cls)
        except Exception:  # noqa: BLE001 - any refusal means: no typed class
            cls = None
    _AS_TYPE[original] = cls
    return cls


def worker_error_as(
    original: type | None,
    message: str,
    hook: str = "",
    device: str | None = None,
    item: int | None = None,
    remote_traceback: str = "",
    state: dict[str, Any] | None = None,
) -> WorkerError:
    """A :class:`WorkerError` with ``message`` that is also an instance of ``original`` where
    possible (see :func:`worker_error_class`), else a plain :class:`WorkerError`.

    ``state`` (the original exception's attributes) is copied onto the new object, so
    ``e.errno`` or a custom ``e.code`` still read as they did where the error was raised.
    """
    cls = worker_error_class(original) if original is not None else None
    if cls is None:
        return WorkerError(message, hook, device, item, remote_traceback)
    exc: WorkerError = cls.__new__(cls)
    exc.args = (message,)
    for k, v in (state or {}).items():
        try:
            setattr(exc, k, v)
        except Exception:  # noqa: BLE001 - a read-only attribute: skip it
            pass
    exc.hook = hook
    exc.device = device
    exc.item = item
    exc.remote_traceback = remote_traceback
    exc.original_type = original  # type: ignore[attr-defined]
    return exc


class WorkerDiedError(EasycoreError, BrokenProcessPool):
    """A producer process died (crash, ``os._exit``, SIGKILL, out of memory).

    Also a ``concurrent.futures.process.BrokenProcessPool`` (so a ``BrokenExecutor`` and a
    ``RuntimeError``), which is what the stdlib's pools raise for a dead worker.

    Attributes:
        pid (int): the process id.
        device (str): the producer's device.
        exitcode (int | None): its exit code; negative ``-N`` means killed by signal ``N``.
        death (str): what happened, without what it did to the runner or pool (the message
            is ``death`` followed by that).
    """

    def __init__(
        self,
        message: str,
        pid: int = 0,
        device: str = "",
        exitcode: int | None = None,
        *,
        death: str = "",
    ):
        super().__init__(message)
        self.pid = pid
        self.device = device
        self.exitcode = exitcode
        self.death = death or message

    @classmethod
    def of(
        cls, death: str, then: str, pid: int = 0, device: str = "", exitcode: int | None = None
    ) -> WorkerDiedError:
        """The error for ``death`` (``"producer 0 (…) died: …"``), followed by ``then``, what
        it did (``"The runner was closed; …"``)."""
        return cls(f"{death}. {then}", pid, device, exitcode, death=death)

    def then(self, then: str) -> WorkerDiedError:
        """The same death followed by another consequence: the pool's, or at start-up."""
        new = WorkerDiedError.of(self.death, then, self.pid, self.device, self.exitcode)
        new.__dict__.update({k: v for k, v in vars(self).items() if k not in vars(new)})
        new.__cause__ = self.__cause__
        return new


#: what a producer's death does to its runner (the end of a WorkerDiedError's message)
RUNNER_CLOSED = "The runner was closed; call activate() to restart it"


class BrokenInitializer(EasycoreError, BrokenProcessPool):
    """A :class:`~easycore.parallel.PoolExecutor` whose ``initializer`` raised in a worker is
    broken, as a ``ProcessPoolExecutor`` is: ``submit`` and ``map`` raise this
    ``BrokenProcessPool``, with the initializer's own error (the original type, the remote
    traceback as its ``__cause__``) as ``__cause__``."""


class SerializationError(EasycoreError, TypeError, pickle.PicklingError, MaybeEncodingError):  # type: ignore[misc]
    """An item or result could not be pickled or unpickled on its way between processes.

    Also a ``pickle.PicklingError`` and a ``multiprocessing.pool.MaybeEncodingError`` (what
    the stdlib's pools raise for a result that cannot be sent back); ``exc`` and ``value``
    are those of ``MaybeEncodingError`` (the cause, and a description of the value).
    """

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, *args)
        self.exc = repr(self.__cause__) if self.__cause__ is not None else ""
        self.value = args[0] if args else ""

    __str__ = BaseException.__str__
    __repr__ = BaseException.__repr__


class RemoteTraceback(Exception):
    """Carries a traceback formatted in another process; chained as ``__cause__``."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


__all__ = [
    "BrokenInitializer",
    "EasycoreError",
    "EasycoreOSError",
    "EasycoreTimeoutError",
    "InvalidArgument",
    "PoolClosedError",
    "PoolTimeoutError",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "RemoteTraceback",
    "RunnerBusyError",
    "RunnerClosedError",
    "RunnerTimeoutError",
    "SerializationError",
    "SharedMemoryError",
    "StartMethodError",
    "WorkerDiedError",
    "WorkerError",
]
