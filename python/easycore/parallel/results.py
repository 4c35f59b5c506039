"""What :meth:`~easycore.parallel.Pool.apply_async` and its kin return: an
:class:`AsyncResult` over a ``concurrent.futures.Future``, as ``multiprocessing.pool`` has."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

from easycore.errors import PoolTimeoutError

_T = TypeVar("_T")


def _async_result(
    fut: Future[_T],
    callback: Callable[[Any], Any] | None,
    error_callback: Callable[[BaseException], Any] | None,
) -> AsyncResult:
    """``fut`` as an :class:`AsyncResult`, calling ``callback`` or ``error_callback`` once
    it is done."""
    if callback is not None or error_callback is not None:

        def done(f: Future[_T]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is None:
                if callback is not None:
                    callback(f.result())
            elif error_callback is not None:
                error_callback(exc)

        fut.add_done_callback(done)
    return AsyncResult(fut)


class AsyncResult:
    """What :meth:`Pool.apply_async` returns, as in ``multiprocessing.pool.AsyncResult``.

    Args:
        future (concurrent.futures.Future): the future of the task.
    """

    def __init__(self, future: Future[Any]) -> None:
        self.future = future

    def get(self, timeout: float | None = None) -> Any:
        """The task's result (or its exception, raised); after ``timeout`` seconds a
        :class:`~easycore.errors.PoolTimeoutError` (both ``multiprocessing.TimeoutError``
        and the builtin ``TimeoutError``)."""
        try:
            return self.future.result(timeout)
        except TimeoutError:
            if self.future.done():
                raise  # the task's own TimeoutError
            raise PoolTimeoutError(f"no result within timeout={timeout} s") from None

    def wait(self, timeout: float | None = None) -> None:
        """Waits until the task is done, or ``timeout`` seconds."""
        try:
            self.future.exception(timeout)
        except (TimeoutError, CancelledError):
            pass

    def ready(self) -> bool:
        """Whether the task is done."""
        return self.future.done()

    def successful(self) -> bool:
        """Whether the task completed without raising (ValueError if not done yet)."""
        if not self.future.done():
            raise ValueError("the task is not done yet")
        return not self.future.cancelled() and self.future.exception() is None
