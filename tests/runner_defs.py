"""Runner subclasses used by the tests, at module level so spawned producers import them."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

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


def feeding(got: Any, pairs: bool = False) -> type[Collect]:
    """A :class:`Collect` whose ``consumer_work`` also puts each result into ``got`` (a
    queue): a feedback input waits on it for its next item. With ``pairs``, its producers
    take a tuple item as :class:`MarkThenWait` does. Made at run time: for the fork start
    method only."""

    class Feedback(Collect):
        @staticmethod
        def consumer_work(cfg, data):
            cfg.out.append(data)
            got.put(data)

        if pairs:

            @staticmethod
            def producer_work(device, cfg, data):
                if isinstance(data, tuple):
                    return MarkThenWait.producer_work(device, cfg, data)
                return data

    return Feedback


class CollectUnordered(UnorderedRunner):
    consumer_init = Collect.consumer_init
    consumer_work = Collect.consumer_work
    consumer_end = Collect.consumer_end


class Heads(UnorderedRunner):
    """``int(data[0])`` of each item, summed: a cheap function of a large item."""

    @staticmethod
    def producer_work(device, cfg, data):
        return int(data[0])

    consumer_init = SumSquares.consumer_init
    consumer_work = SumSquares.consumer_work
    consumer_end = SumSquares.consumer_end


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
                import faulthandler

                faulthandler.disable()  # a crash on purpose: no traceback in the test log
                ctypes.string_at(0)
            if mode == "unpicklable":
                return lambda: data
            if mode == "exit_at_pickle":
                return ExitAtPickle()
        return data


class ExitAtPickle:
    """A result whose pickling ends the process (``sys.exit``)."""

    def __reduce__(self):
        import sys

        sys.exit(3)


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


class Counted(Collect):
    """Ordered collect whose consumer hooks misbehave as cfg.fail names (one call only:
    the test changes the runner's cfg between calls)."""

    @staticmethod
    def consumer_init(cfg):
        if cfg.get("fail") == "consumer_init":
            raise RuntimeError("consumer_init broke")
        cfg.out = []

    @staticmethod
    def consumer_work(cfg, data):
        if cfg.get("fail") == "consumer_work" and data == 5:
            raise RuntimeError("consumer_work broke")
        cfg.out.append(data)

    @staticmethod
    def consumer_end(cfg):
        if cfg.get("fail") == "consumer_end":
            raise RuntimeError("consumer_end broke")
        return cfg.out

    @staticmethod
    def producer_work(device, cfg, data):
        if data == -1:
            raise RuntimeError("producer_work broke")
        return data


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("__str__ broke")

    def __repr__(self):
        raise RuntimeError("__repr__ broke")


class Unpicklable(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.fn = lambda: None  # pickling this exception fails

    def __reduce__(self):
        raise TypeError("no pickling")


class NeedsArgs(ValueError):
    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.code = code


class NoSubclass(Exception):
    def __init_subclass__(cls, **kw):
        raise TypeError("final")


class Raiser(Collect):
    """producer_work raises the exception named by a str item (other items pass through)."""

    @staticmethod
    def producer_work(device, cfg, data):
        if isinstance(data, str):
            exc = {
                "value": lambda: ValueError("bad value"),
                "badstr": BadStr,
                "unpicklable": lambda: Unpicklable("cannot travel"),
                "needsargs": lambda: NeedsArgs(42, "the detail"),
                "nosubclass": lambda: NoSubclass("no subclass"),
                "keyerror": lambda: KeyError("k"),
                "stopiteration": lambda: StopIteration("stop"),
            }[data]()
            raise exc
        return data


class ConsumerRaiser(Collect):
    @staticmethod
    def consumer_work(cfg, data):
        if data == 2:
            raise BadStr()
        cfg.out.append(data)


class Seeded(UnorderedRunner):
    """Each producer reports its worker_info and its first draws from random and numpy."""

    @staticmethod
    def producer_init(device, cfg):
        import random

        import numpy as np
        from easycore.common.parallel import worker_info

        info = worker_info()
        cfg.draw = (info.index, info.num_producers, info.seed, random.random(), np.random.rand())

    @staticmethod
    def producer_work(device, cfg, data):
        time.sleep(0.01)
        return cfg.draw

    consumer_init = Collect.consumer_init
    consumer_work = Collect.consumer_work
    consumer_end = Collect.consumer_end


class StuckOn3(Collect):
    @staticmethod
    def producer_work(device, cfg, data):
        if data == 3:
            time.sleep(300)
        return data


class ShmFails(Collect):
    """The first result put fails as when /dev/shm is full."""

    @staticmethod
    def producer_init(device, cfg):
        from easycore.common.parallel import wire, worker
        from easycore.errors import SharedMemoryError

        real = worker._put
        failed = []

        def put(out_q, seq, kind, parts, alive):
            if wire.unpack_kind(kind)[0] == wire.RESULT and not failed:
                failed.append(1)
                raise SharedMemoryError(
                    "cannot create a shared-memory segment of 64.0 MiB: /dev/shm has 1.0 MiB free"
                )
            return real(out_q, seq, kind, parts, alive)

        worker._put = put


class MarkThenWait(CollectUnordered):
    """``(mine, theirs)``: creates the file ``mine``, then waits (at most 30 s) until
    ``theirs`` exists; returns whether it does (two items that must run at the same time)."""

    @staticmethod
    def producer_work(device, cfg, data):
        import pool_defs  # the same helper as the pool's test (tests/ is on the path)

        return pool_defs.mark_then_wait(data)


class Augment(Collect):
    """A Dataset-style augmentation: each item draws from the global random and numpy
    generators (and a busy producer draws for whatever it ran before)."""

    @staticmethod
    def producer_work(device, cfg, data):
        import random

        import numpy as np

        if data % 5 == 0:
            time.sleep(0.002)  # uneven work: scheduling differs from run to run
        return (data, random.random(), float(np.random.rand()), np.random.randint(0, 1 << 30))


class EndValue(Collect):
    """producer_end returns what its producer did."""

    @staticmethod
    def producer_init(device, cfg):
        cfg.seen = 0

    @staticmethod
    def producer_work(device, cfg, data):
        cfg.seen += 1
        return data

    @staticmethod
    def producer_end(device, cfg):
        from easycore.common.parallel import worker_info

        return (worker_info().index, device, cfg.seen)


class SlowPair(Collect):
    """Ordered collect whose items 1500 and 1501 take 0.3 s and 0.2 s; the others 20 µs
    (long enough to be timed each: see easycore._engine.insights)."""

    @staticmethod
    def producer_work(device, cfg, data):
        if data in (1500, 1501):
            time.sleep(0.3 if data == 1500 else 0.2)
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-5:
            pass
        return data
