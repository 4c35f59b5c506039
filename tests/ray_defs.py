"""Runner subclasses of the Ray backend's tests, at module level: the test cluster's workers
import this module by name (the cluster is started with this folder on PYTHONPATH)."""

from __future__ import annotations

import os
import time

import numpy as np
import runner_defs as rd
from easycore.common.parallel import OrderedRunner, UnorderedRunner, worker_info


class Square(OrderedRunner):
    """Collects ``data * data`` in the consumer (a list, in input order)."""

    @staticmethod
    def producer_work(device, cfg, data):
        return data * data

    consumer_init = rd.Collect.consumer_init
    consumer_work = rd.Collect.consumer_work
    consumer_end = rd.Collect.consumer_end


class Jitter(OrderedRunner):
    """Items take uneven times, so results arrive out of order from two actors."""

    @staticmethod
    def producer_work(device, cfg, data):
        time.sleep(0.002 * ((data * 7) % 5))
        return data


class JitterUnordered(UnorderedRunner):
    producer_work = Jitter.producer_work


class Info(OrderedRunner):
    """What each producer knows about itself, and the cfg it got."""

    @staticmethod
    def producer_init(device, cfg):
        cfg.started = os.getpid()

    @staticmethod
    def producer_work(device, cfg, data):
        info = worker_info()
        assert info is not None
        return (data, device, info.index, info.num_producers, cfg.started, cfg.get("k"))


class Arrays(OrderedRunner):
    """1 MiB float32 arrays, filled with the item."""

    @staticmethod
    def producer_work(device, cfg, data):
        return np.full(1 << 18, data, dtype=np.float32)


class Sleepy(UnorderedRunner):
    """Reports its pid, then works for ``data`` seconds."""

    @staticmethod
    def producer_work(device, cfg, data):
        time.sleep(data)
        return os.getpid()


class PidOf(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        return os.getpid()


class BadItem(ValueError):
    def __init__(self, item):
        super().__init__(f"bad item {item}")
        self.item_seen = item


class Fails(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        if data == 7:
            raise BadItem(data)
        return data


class InitFails(UnorderedRunner):
    @staticmethod
    def producer_init(device, cfg):
        raise KeyError("no model here")


class EndRecords(UnorderedRunner):
    """producer_end writes a file named after the producer (proof that it ran at close)."""

    @staticmethod
    def producer_work(device, cfg, data):
        return data

    @staticmethod
    def producer_end(device, cfg):
        info = worker_info()
        with open(os.path.join(cfg.dir, f"end-{info.index}"), "w") as f:
            f.write(str(os.getpid()))


class SlowInit(Square):
    """``producer_init`` takes 0.3 s; item 7 takes 0.2 s."""

    @staticmethod
    def producer_init(device, cfg):
        time.sleep(0.3)

    @staticmethod
    def producer_work(device, cfg, data):
        if data == 7:
            time.sleep(0.2)
        return data * data
