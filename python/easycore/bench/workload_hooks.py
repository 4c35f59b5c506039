"""The built-in workloads' hooks: module-level classes of the six static runner hooks
(:data:`HOOKS`), so that their functions pickle by reference under spawn, and the constants
their results are built from. :mod:`easycore.bench.workloads` pairs each with its data and
expected result."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from easycore.common.parallel.hooks import HOOK_NAMES, RunnerHooks

HOOKS = HOOK_NAMES
"""The names of the six hooks (re-exported for the systems)."""

PAGE = 4096
HASH_MOD = (1 << 61) - 1
HASH_MUL = 1_000_003


def torch_available() -> bool:
    """Whether torch can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------------------------------------
# hooks (module-level classes, so their functions pickle by reference under spawn)


# The manual's default hooks, shared with the runners (one place for them).
BaseHooks = RunnerHooks


class SquareSumHooks(BaseHooks):
    """``x * x`` in the producers; the consumer counts and sums (order-free)."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        return data * data

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.count = 0
        cfg.total = 0

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.count += 1
        cfg.total += data

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return (cfg.count, cfg.total)


class CollectingConsumer(BaseHooks):
    """Consumer hooks that append every result to ``cfg.data_list`` (the manual's Example 3
    does this); a subclass says what ``consumer_end`` makes of the list."""

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.data_list = []

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.data_list.append(data)


class SquareCollectHooks(CollectingConsumer, SquareSumHooks):
    """``x * x`` in the producers; the consumer appends each result to a list, then counts
    and sums them (order-free)."""

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return (len(cfg.data_list), sum(cfg.data_list))


class SquareHashHooks(SquareSumHooks):
    """``x * x`` in the producers; the consumer folds them into an order-sensitive hash."""

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.count = 0
        cfg.h = 0

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        cfg.count += 1
        cfg.h = (cfg.h * HASH_MUL + data) % HASH_MOD

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return (cfg.count, cfg.h)


def _as_numpy(a: Any) -> np.ndarray:
    """A numpy view of ``a`` (torch tensors arrive from DataLoader; a GPU producer's tensor
    that arrives on the GPU, as DataLoader hands it over, is copied to the host first)."""
    if isinstance(a, np.ndarray):
        return a
    return np.asarray(a.numpy() if a.device.type == "cpu" else a.cpu().numpy())


class ArrayHooks(BaseHooks):
    """Items are ``(index, nbytes)``; producers return a fresh uint8 array, stamped."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        index, nbytes = data
        a = np.full(nbytes, index % 251, dtype=np.uint8)
        a[:8].view(np.uint64)[0] = index
        return a

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        cfg.count = 0
        cfg.index_sum = 0
        cfg.nbytes = 0
        cfg.bad = 0

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        a = _as_numpy(data)
        index = int(a[:8].view(np.uint64)[0])
        fill = index % 251
        pages = a[PAGE::PAGE]  # one byte per page past the first: touches every page
        if (
            a.dtype != np.uint8
            or a.ndim != 1
            or int(a[8]) != fill
            or int(a[-1]) != fill
            or int(pages.sum(dtype=np.uint64)) != fill * len(pages)
        ):
            cfg.bad += 1
        cfg.count += 1
        cfg.index_sum += index
        cfg.nbytes += a.nbytes

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        return (cfg.count, cfg.index_sum, cfg.nbytes, cfg.bad)


class TensorHooks(ArrayHooks):
    """Items are ``(index, nbytes)``; producers return a fresh uint8 torch tensor made on
    their own device (a GPU producer's result is copied to the host on the way), stamped as
    :class:`ArrayHooks` stamps its arrays."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        import torch

        index, nbytes = data
        t = torch.full((nbytes,), index % 251, dtype=torch.uint8, device=device)
        t[:8] = torch.tensor(list(index.to_bytes(8, "little")), dtype=torch.uint8)
        return t


class ShmArrayHooks(ArrayHooks):
    """As :class:`ArrayHooks`, but the producer fills an array from ``easycore.shm.empty``:
    in an easycore producer it is born in the output queue's shared memory and travels by
    reference; elsewhere (other systems) it is an ordinary array."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        import easycore.shm as shm

        index, nbytes = data
        a = shm.empty(nbytes, dtype=np.uint8)
        a.fill(index % 251)
        a[:8].view(np.uint64)[0] = index
        return a


def make_net() -> Any:
    """The manual's network: ``Linear(1, 3)`` then ReLU, seeded so every process agrees."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1, 3), torch.nn.ReLU())


class PredictorHooks(CollectingConsumer):
    """The manual's Example 3: a torch predictor over batches of ints, results in order."""

    @staticmethod
    def producer_init(device: str, cfg: Any) -> None:
        import torch

        torch.set_num_threads(1)
        cfg.model = make_net().to(device)

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        import torch

        with torch.no_grad():
            x = torch.Tensor(data).view(-1, 1).to(device)
            return cfg.model(x).cpu()

    @staticmethod
    def producer_end(device: str, cfg: Any) -> None:
        del cfg.model

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        import torch

        return torch.cat(cfg.data_list, dim=0)
