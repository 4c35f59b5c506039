"""Runners and pool functions for the frozen-data tests (importable by spawned workers)."""

from __future__ import annotations

import os
import signal

import numpy as np
from easycore.parallel import context
from runner_defs import CollectUnordered


def describe(x):
    """A comparable summary of an item read from frozen data (arrays as lists + flag)."""
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.tolist(), bool(x.flags.writeable))
    if isinstance(x, dict):
        return {k: describe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [describe(v) for v in x]
    if isinstance(x, tuple):
        return tuple(describe(v) for v in x)
    return x


def how_mapped(frozen):
    """'inherited' when the arena is the one the owner created (a forked copy of its
    mapping), 'attached' when this process mapped it by name, 'owner' in the owner."""
    arena = frozen._arena
    if arena.owner_pid is None:
        return "attached"
    return "owner" if arena.owner_pid == os.getpid() else "inherited"


class ReadIndex(CollectUnordered):
    """Each item is an index into cfg.index (a SharedList); returns what it read there and
    how this producer mapped it. cfg.table (a SharedDict) is read by key too."""

    @staticmethod
    def producer_work(device, cfg, i):
        item = cfg.index[i]
        return i, describe(item), cfg.table[f"k{i}"], how_mapped(cfg.index)

    @staticmethod
    def consumer_end(cfg):
        return {i: (item, by_key, how) for i, item, by_key, how in cfg.out}


class DieWhileReading(CollectUnordered):
    """Item ``cfg.bad`` makes its producer SIGKILL itself halfway through reading the whole
    index (a kill in the middle of reading frozen data); the others sum a field (the consumer
    collects the sums in a list)."""

    @staticmethod
    def producer_work(device, cfg, i):
        total = 0
        for n, item in enumerate(cfg.index):
            if i == cfg.bad and n == len(cfg.index) // 2:
                os.kill(os.getpid(), signal.SIGKILL)
            total += item["label"]
        return total


def init_with(frozen):
    """A pool initializer: the frozen object becomes the worker's context."""
    return frozen


def read_task(frozen, i):
    """A task whose argument is the frozen object."""
    return describe(frozen[i]), how_mapped(frozen)


def read_context(i):
    """A task reading the frozen object the initializer stored as the context."""
    frozen = context()
    return describe(frozen[i]), how_mapped(frozen)
