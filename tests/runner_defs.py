"""Runner subclasses used by the tests, at module level so spawned producers import them."""

from __future__ import annotations

import ctypes
import os
import signal
import time

from easycore.common.parallel import OrderedRunner, UnorderedRunner


class SumSquares(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        return data * data

    @staticmethod
    def consumer_init(cfg):
        cfg.sum = 0

    @staticmethod
    def consumer_work(cfg, data):
        cfg.sum += data

    @staticmethod
    def consumer_end(cfg):
        return cfg.sum


class Collect(OrderedRunner):
    @staticmethod
    def consumer_init(cfg):
        assert "out" not in cfg, "the consumer must get a fresh cfg on every call"
        cfg.out = []

    @staticmethod
    def consumer_work(cfg, data):
        cfg.out.append(data)

    @staticmethod
    def consumer_end(cfg):
        return cfg.out


class CollectUnordered(UnorderedRunner):
    consumer_init = Collect.consumer_init
    consumer_work = Collect.consumer_work
    consumer_end = Collect.consumer_end


class Jittery(Collect):
    """Ordered, with producers that take uneven time."""

    @staticmethod
    def producer_work(device, cfg, data):
        if data % 7 == 0:
            time.sleep(0.002)
        return data


class PerProducerState(Collect):
    @staticmethod
    def producer_init(device, cfg):
        cfg.count = 0

    @staticmethod
    def producer_work(device, cfg, data):
        cfg.count += 1
        return (os.getpid(), cfg.count, device)


class Faulty(Collect):
    """Misbehaves on the item named by cfg.bad_item in the way named by cfg.mode."""

    @staticmethod
    def producer_work(device, cfg, data):
        if data == cfg.get("bad_item", -1):
            mode = cfg.mode
            if mode == "raise":
                raise ValueError(f"bad item {data}")
            if mode == "exit":
                os._exit(3)
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "segfault":
                ctypes.string_at(0)
            if mode == "unpicklable":
                return lambda: data
        return data


class FailingInit(Collect):
    @staticmethod
    def producer_init(device, cfg):
        raise RuntimeError("no model file")


class FailingConsumer(Collect):
    @staticmethod
    def consumer_work(cfg, data):
        if data == 3:
            raise KeyError("consumer broke")
        cfg.out.append(data)


class Slow(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        time.sleep(cfg.get("sleep", 0.05))
        return data


class StallEvery97(Collect):
    """One producer stalls on every 97th item; results are 10 KB each."""

    @staticmethod
    def producer_work(device, cfg, data):
        if data % 97 == 0:
            time.sleep(0.01)
        return bytes(10_000)

    @staticmethod
    def consumer_init(cfg):
        cfg.n = 0

    @staticmethod
    def consumer_work(cfg, data):
        cfg.n += len(data)

    @staticmethod
    def consumer_end(cfg):
        return cfg.n
