"""Tensor-aware pickling for the torch runners.

A strided tensor travels as a numpy view of its memory, so pickle protocol 5 hands that memory
to the shared-memory queue out of band: one copy into shared memory in the producer, none or
one out of it in the consumer (``torch.from_numpy`` wraps what arrives). dtypes numpy lacks
(bfloat16, float8…) travel as same-width integers and are viewed back. CUDA tensors are
copied to the CPU and arrive as CPU tensors (move them back in ``consumer_work`` if you need
them on a GPU); in a producer, a large one is copied straight into the output queue's shared
memory and sent by reference, so the device-to-host copy is the only copy. Sparse, quantized
and other tensors use torch's own pickling.

A CPU tensor already in shared memory (``share_memory_()``, or one that came through
``torch.multiprocessing``) travels by reference, as ``torch.multiprocessing`` sends it: a
handle to its storage (``torch.multiprocessing.reductions``), so that the receiver's tensor
is a view of the same memory and writes on either side are seen by the other. Under the
default ``file_descriptor`` sharing strategy the handle is a file descriptor passed through
``multiprocessing``'s resource sharer, which lives in the sending process: the receiver must
unpickle it while the sender lives, in a process of the same program (the runners' and
pools' producers, processes started with ``multiprocessing``).
"""

from __future__ import annotations

import copyreg
import pickle
from typing import Any

import torch

from easycore._engine.wire import Codec, dumps_with, reduce_array

_VIEW_AS = {
    torch.bfloat16: torch.int16,
    torch.complex32: torch.int32,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _VIEW_AS[getattr(torch, _name)] = torch.uint8


def _rebuild(arr: Any, dtype: str, requires_grad: bool, parameter: bool) -> torch.Tensor:
    t = torch.from_numpy(arr)
    target = getattr(torch, dtype)
    if t.dtype != target:
        t = t.view(target)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """A GPU tensor copied to the host. In a producer, a tensor large enough for the output
    queue's pool is copied straight into a leased shared segment (see
    :mod:`easycore.torch.shm`) and then travels by reference: one copy from the device to
    the consumer's pages instead of two (device to private memory, then into the queue)."""
    from easycore.torch import shm

    host = shm.empty(tuple(x.shape), dtype=x.dtype)
    host.copy_(x)
    return host


def _shared(t: torch.Tensor) -> Any:
    """``torch.multiprocessing``'s reduction of a CPU tensor whose storage is already shared
    (by reference: a handle to the storage), or None for any other tensor."""
    if t.device.type != "cpu" or not t.is_shared() or (t.requires_grad and not t.is_leaf):
        return None
    from torch.multiprocessing import reductions

    try:
        return reductions.reduce_tensor(t)
    except Exception:  # noqa: BLE001 - sent by value instead
        return None


def _reduce_tensor(t: torch.Tensor) -> Any:
    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.device.type == "meta":
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    by_ref = _shared(t)
    if by_ref is not None:
        return by_ref
    x = t.detach()
    if x.device.type != "cpu":
        x = _to_host(x)
    x = x.contiguous()
    dtype = str(x.dtype).removeprefix("torch.")
    if x.dtype in _VIEW_AS:
        x = x.view(_VIEW_AS[x.dtype])
    try:
        arr = x.numpy()
    except (TypeError, RuntimeError):
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return _rebuild, (arr, dtype, t.requires_grad, isinstance(t, torch.nn.Parameter))


def _reduce_storage(storage: Any) -> Any:
    """A storage in shared memory (inside a shared tensor's reduction) travels as
    ``torch.multiprocessing`` sends it, by a handle; any other, by value as usual."""
    typed = isinstance(storage, torch.storage.TypedStorage)
    raw = storage._untyped_storage if typed else storage
    if raw.device.type == "cpu" and raw.is_shared():
        from torch.multiprocessing import reductions

        if typed:
            return reductions.reduce_typed_storage(storage)
        return reductions.reduce_storage(storage)
    return storage.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[torch.Tensor] = _reduce_tensor
_DISPATCH[torch.nn.Parameter] = _reduce_tensor
_DISPATCH[torch.storage.TypedStorage] = _reduce_storage
_DISPATCH[torch.storage.UntypedStorage] = _reduce_storage
try:  # a tensor travels as a numpy view of its memory (_reduce_tensor): as wire's arrays do
    import numpy

    _DISPATCH[numpy.ndarray] = reduce_array
except ImportError:  # no numpy: _reduce_tensor sends tensors by torch's own reduction
    pass
# The table as a class attribute: no per-message assignment to each pickler made.
_TorchPickler = type("TorchPickler", (pickle.Pickler,), {"dispatch_table": _DISPATCH})


class TorchCodec(Codec):
    """:class:`~easycore.common.parallel.wire.Codec` that sends tensor memory out of band."""

    def _dumps(self, obj: Any, callback: Any) -> bytes:
        return dumps_with(_TorchPickler, obj, callback)
