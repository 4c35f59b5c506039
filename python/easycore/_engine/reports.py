"""Errors that happen in a producer or a hook, both ways: the picklable *error report* a
producer sends (:func:`error_report`, :func:`not_picklable_report`), and the exception the
caller raises for it (:func:`worker_error`) or for a consumer hook that raised
(:func:`hook_error`). Each raised error is a :class:`~easycore.errors.WorkerError` that is
also an instance of the original exception's type where that type can be rebuilt here, with
the remote traceback chained as ``__cause__``. The one place where "not picklable" is
worded (:func:`not_picklable_report`, :func:`not_picklable_error`)."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

from easycore._engine.wire import describe_unpicklable
from easycore.errors import (
    EasycoreError,
    RemoteTraceback,
    SerializationError,
    SharedMemoryError,
    WorkerError,
    worker_error_as,
)

_NOT_TYPED = (StopIteration, StopAsyncIteration, GeneratorExit)  # never re-raised as such


def safe_str(exc: BaseException) -> str:
    """``"Type: message"`` for an exception, whatever its ``__str__`` does."""
    name = getattr(type(exc), "__qualname__", "exception")
    try:
        text = str(exc)
    except BaseException as e:  # noqa: BLE001 - a broken __str__ must not hide the error
        text = f"<str() of the exception failed: {type(e).__qualname__}>"
    return f"{name}: {text}" if text else name


def _pickled(obj: Any) -> bytes | None:
    try:
        return pickle.dumps(obj, protocol=5)
    except BaseException:  # noqa: BLE001 - not picklable: the caller falls back
        return None


def error_report(
    hook: str, device: str | None, item: int | None, exc: BaseException, kind: str
) -> dict[str, Any]:
    """The picklable description of a hook's exception sent to the caller.

    Never raises, whatever the exception's ``__str__``, ``__repr__`` or pickling do. The
    exception's type and attributes travel pickled (each None if that fails), so the caller
    can raise an error of the same type. ``kind``: ``"hook"`` (the hook raised),
    ``"unpickle_item"``, ``"pickle_result"``, ``"shared_memory"`` or ``"ray"``.
    """
    try:
        tb = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001
        tb = f"{safe_str(exc)}\n(the traceback could not be formatted)"
    try:
        state = dict(vars(exc))
    except TypeError:
        state = {}
    return {
        "hook": hook,
        "device": device,
        "item": item,
        "message": safe_str(exc),
        "traceback": tb,
        "kind": kind,
        "type": _pickled(type(exc)),
        "state": _pickled(state) if state else None,
        # the exception itself (None if it does not pickle), for callers that re-raise the
        # original object, as the stdlib's pools do
        "exc": _pickled(exc),
    }


def not_picklable_report(
    hook: str, device: str | None, item: int | None, exc: BaseException, results: Any
) -> dict[str, Any]:
    """The error report for results that could not be pickled, naming the culprit (the
    first element of ``results`` that fails to pickle)."""
    report = error_report(hook, device, item, exc, "pickle_result")
    report["message"] = f"the result is not picklable: {describe_unpicklable(results)}"
    return report


def not_picklable_error(
    what: str, items: Any, error: BaseException, to: str = "the producers"
) -> SerializationError:
    """The caller's error for input that cannot be sent: ``what`` names the input (``"input
    item 3..5"``), ``items`` holds the culprit, ``to`` says where it was going."""
    err = SerializationError(
        f"{what} cannot be sent to {to}: {describe_unpicklable(items)} is not picklable"
    )
    err.__cause__ = error
    return err


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
