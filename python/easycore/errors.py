"""The exceptions easycore raises, in one tree rooted at :class:`EasycoreError`.

Where a stdlib exception already says the same thing, ours subclasses it too, so code that
catches ``queue.Empty``, ``queue.Full``, ``TimeoutError``, ``OSError`` or ``ValueError`` keeps
working.
"""

from __future__ import annotations

import queue


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

    def __reduce__(self):  # keep the attributes when pickled across processes
        return (
            type(self),
            (self.args[0], self.hook, self.device, self.item, self.remote_traceback),
        )


class WorkerDiedError(EasycoreError):
    """A producer process died (crash, ``os._exit``, SIGKILL, out of memory).

    Attributes:
        pid (int): the process id.
        device (str): the producer's device.
        exitcode (int | None): its exit code; negative ``-N`` means killed by signal ``N``.
    """

    def __init__(self, message: str, pid: int = 0, device: str = "", exitcode: int | None = None):
        super().__init__(message)
        self.pid = pid
        self.device = device
        self.exitcode = exitcode


class SerializationError(EasycoreError, TypeError):
    """An item or result could not be pickled or unpickled on its way between processes."""


class RemoteTraceback(Exception):
    """Carries a traceback formatted in another process; chained as ``__cause__``."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


__all__ = [
    "EasycoreError",
    "EasycoreOSError",
    "EasycoreTimeoutError",
    "InvalidArgument",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "RemoteTraceback",
    "RunnerClosedError",
    "SerializationError",
    "SharedMemoryError",
    "WorkerDiedError",
    "WorkerError",
]
