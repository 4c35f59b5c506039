"""Runners whose producers build their results with easycore.shm (module level, so spawned
producers import them)."""

from __future__ import annotations

import numpy as np
import runner_defs as rd
from easycore import shm
from easycore.common.parallel import UnorderedRunner

_prev: list = []  # per producer: the array returned last time
_held: list = []  # leases a producer keeps on purpose (pool exhaustion)


class ShmResults(UnorderedRunner):
    """Returns a 1 MiB float32 array from shm.empty filled with the item, and whether the
    array it returned last time was made read-only (sent by reference). Each item takes 5 ms,
    so that each travels in a batch of its own (batches hold about 4 ms of work): the array
    of the previous item was sent before this one ran."""

    @staticmethod
    def producer_work(device, cfg, i):
        import time

        time.sleep(0.005)
        prev_ro = None
        if _prev:
            prev_ro = not _prev[0].flags.writeable
            _prev.clear()
        a = shm.empty((256, 1024), dtype=np.float32)
        a[...] = i
        _prev.append(a)
        return i, a, shm.is_shared(a), prev_ro

    consumer_init = rd.Collect.consumer_init
    consumer_work = rd.Collect.consumer_work
    consumer_end = rd.Collect.consumer_end


class ShmViews(ShmResults):
    """Returns the array, a strided view, a contiguous slice and the array again."""

    @staticmethod
    def producer_work(device, cfg, i):
        a = shm.empty(1 << 18, dtype=np.int32)
        a[:] = np.arange(a.size, dtype=np.int32) + i
        return i, a, a[::3], a[5:], a


class ShmHoarder(ShmResults):
    """Keeps every 4 MiB array it allocates until one comes back private (the pool is full),
    then returns how many were shared and the private array, filled."""

    @staticmethod
    def producer_work(device, cfg, i):
        shared = 0
        for _ in range(64):
            a = shm.empty(4 << 20, dtype=np.uint8)
            if not shm.is_shared(a):
                break
            _held.append(a)
            shared += 1
        a[:] = i % 251
        _held.clear()
        return i, shared, shm.is_shared(a), a


class SumInputs(UnorderedRunner):
    """Items are ``(i, array)``; returns ``(i, shape, first, last, sum)`` of the array it got,
    and exits the process (without a word) on an item whose ``i`` is negative."""

    @staticmethod
    def producer_work(device, cfg, item):
        import os

        i, a = item
        if i < 0:
            os._exit(3)
        return i, a.shape, float(a.flat[0]), float(a.flat[-1]), float(a.sum(dtype=np.float64))

    @staticmethod
    def consumer_init(cfg):
        cfg.out = []

    @staticmethod
    def consumer_work(cfg, data):
        cfg.out.append(data)

    @staticmethod
    def consumer_end(cfg):
        return sorted(cfg.out)


def sum_input(item):
    """For Pool.map: ``(i, array)`` -> ``(i, sum)``."""
    i, a = item
    return i, float(a.sum(dtype=np.float64))


class ShmLarge(ShmResults):
    """Returns whether its 12 MiB shm array was shared, the output pool's cap after leasing
    it, and the array's first byte (the consumer keeps no array)."""

    @staticmethod
    def producer_work(device, cfg, i):
        from easycore.common.parallel import leases

        a = shm.empty(12 << 20, dtype=np.uint8)
        a[...] = i % 251
        return i, shm.is_shared(a), leases._target.pool_bytes()[1], a

    @staticmethod
    def consumer_work(cfg, data):
        i, shared, cap, a = data
        cfg.out.append((i, shared, cap, int(a[0]), int(a[-1])))


class ShmSized(UnorderedRunner):
    """Items are ``(i, nbytes)``; returns ``(i, shared, array)``: an array of ``nbytes`` from
    shm.empty filled with ``i % 251``, and whether it was in shared memory (not: the output
    pool was full)."""

    @staticmethod
    def producer_work(device, cfg, item):
        i, nbytes = item
        a = shm.empty(nbytes, dtype=np.uint8)
        a[:] = i % 251
        return i, shm.is_shared(a), a


class HeldResults(UnorderedRunner):
    """Returns a small array per item; the consumer waits on its first item (the others pile
    up in the output queue and arrive in one read) and returns the most results delivered
    before the previous one that were still alive when a later one was delivered."""

    @staticmethod
    def producer_work(device, cfg, i):
        return np.full(4, i)

    @staticmethod
    def consumer_init(cfg):
        cfg.refs = []
        cfg.most_alive = 0

    @staticmethod
    def consumer_work(cfg, data):
        import time
        import weakref

        if not cfg.refs:
            time.sleep(0.5)
        alive = sum(r() is not None for r in cfg.refs[:-1])
        cfg.most_alive = max(cfg.most_alive, alive)
        cfg.refs.append(weakref.ref(data))

    @staticmethod
    def consumer_end(cfg):
        return len(cfg.refs), cfg.most_alive


def shm_sized(item):
    """``ShmSized.producer_work`` as a function, for a pool."""
    return ShmSized.producer_work("cpu", None, item)


def stamped(i, nbytes):
    """A fresh (private) array of ``nbytes`` stamped with ``i``: a large result copied once."""
    return np.full(nbytes, i % 251, np.uint8)
