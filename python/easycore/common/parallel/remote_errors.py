"""Errors that happened elsewhere, as exceptions in the caller: a producer's error report
(a dict sent on the output queue, see ``worker.error_report``) and a consumer hook that
raised. Each is a :class:`~easycore.errors.WorkerError` that is also an instance of the
original exception's type where that type can be rebuilt here, with the remote traceback
chained as ``__cause__``."""

from __future__ import annotations

import pickle
from typing import Any

from easycore.common.parallel.worker import safe_str
from easycore.errors import (
    EasycoreError,
    RemoteTraceback,
    SerializationError,
    SharedMemoryError,
    WorkerError,
    worker_error_as,
)

_NOT_TYPED = (StopIteration, StopAsyncIteration, GeneratorExit)  # never re-raised as such


def _loads_or_none(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - the type or state is not importable here
        return None


def worker_error(err: dict[str, Any]) -> EasycoreError:
    """The exception for an error report sent by a producer: a WorkerError that is also an
    instance of the original exception's type where that type can be rebuilt here."""
    where = f"in {err['hook']} on device {err['device']!r}"
    if err.get("item") is not None:
        where += f" (item {err['item']})"
    kind = err.get("kind")
    if kind == "pickle_result":
        exc: EasycoreError = SerializationError(f"{err['message']} ({where})")
    elif kind == "unpickle_item":
        exc = SerializationError(f"an item could not be unpickled {where}: {err['message']}")
    elif kind == "shared_memory":
        exc = SharedMemoryError(
            f"a result could not be put in shared memory {where}: {err['message']}. "
            "The runner stays usable; make results smaller, lower queue_scale, or free "
            "/dev/shm"
        )
    else:
        original = _loads_or_none(err.get("type"))
        if not isinstance(original, type) or issubclass(original, _NOT_TYPED):
            original = None
        exc = worker_error_as(
            original,
            f"{err['message']} — raised {where}",
            hook=err["hook"],
            device=err["device"],
            item=err.get("item"),
            remote_traceback=err.get("traceback", ""),
            state=_loads_or_none(err.get("state")),
        )
    exc.__cause__ = RemoteTraceback(err.get("traceback", ""))
    return exc


def hook_error(hook: str, e: BaseException, item: int | None) -> WorkerError:
    """The error for a consumer hook that raised: a WorkerError that is also an instance of
    the original type (the original is chained as ``__cause__``)."""
    import traceback

    try:
        tb = "".join(traceback.format_exception(e))
    except BaseException:  # noqa: BLE001 - a broken exception must not hide the error
        tb = safe_str(e)
    original = type(e) if isinstance(e, Exception) and not isinstance(e, _NOT_TYPED) else None
    try:
        state = dict(vars(e))
    except TypeError:
        state = {}
    return worker_error_as(
        original,
        f"{safe_str(e)} — raised in {hook}" + (f" (item {item})" if item is not None else ""),
        hook=hook,
        device=None,
        item=item,
        remote_traceback=tb,
        state=state,
    )


def call_hook(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        raise hook_error(name, e, None) from e
