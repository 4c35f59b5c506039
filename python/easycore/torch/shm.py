"""CPU tensors born in shared memory (the torch flavour of :mod:`easycore.shm`).

In a producer of a torch runner, :func:`empty` and :func:`zeros` hand out CPU tensors over a
segment leased from the output queue: returned from ``producer_work``, they travel by
reference, with no copy. The rules are :mod:`easycore.shm`'s, except that a tensor cannot be
marked read-only: after returning it, the producer must not write into it. In the caller,
``runner=`` leases from a runner's input queue, for input items sent by reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from easycore._engine import leases

__all__ = ["empty", "empty_like", "zeros", "zeros_like"]


def empty(*size: Any, dtype: torch.dtype | None = None, runner: Any = None) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor, in shared memory when it can be, else an
    ordinary ``torch.empty``. ``size`` as ``torch.empty`` takes it. ``runner``: in the
    caller, a runner or Pool whose input items the tensor is for (see
    :func:`easycore.shm.empty`)."""
    shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
    shp = tuple(int(s) for s in shape)
    dt = dtype if dtype is not None else torch.get_default_dtype()
    itemsize = torch.empty((), dtype=dt).element_size()
    nbytes = math.prod(shp) * itemsize
    held = None
    if nbytes:
        held = leases.lease(nbytes, runner)
    if held is None:
        return torch.empty(shp, dtype=dt)
    raw = np.frombuffer(memoryview(held), dtype=np.uint8, count=nbytes)
    return torch.from_numpy(raw).view(dt).view(shp)


def zeros(*size: Any, dtype: torch.dtype | None = None, runner: Any = None) -> torch.Tensor:
    """As :func:`empty`, filled with zeros."""
    t = empty(*size, dtype=dtype, runner=runner)
    t.zero_()
    return t


def empty_like(
    t: torch.Tensor, dtype: torch.dtype | None = None, runner: Any = None
) -> torch.Tensor:
    """As :func:`empty`, with the shape (and dtype, unless given) of ``t``."""
    return empty(tuple(t.shape), dtype=t.dtype if dtype is None else dtype, runner=runner)


def zeros_like(
    t: torch.Tensor, dtype: torch.dtype | None = None, runner: Any = None
) -> torch.Tensor:
    """As :func:`zeros`, with the shape (and dtype, unless given) of ``t``."""
    return zeros(tuple(t.shape), dtype=t.dtype if dtype is None else dtype, runner=runner)
