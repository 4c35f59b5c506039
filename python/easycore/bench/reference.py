"""The pure-Python reference runner: the original easycore design, kept as the baseline.

Producer processes are fed through one bounded :class:`multiprocessing.Queue` and send their
results back through another; the consumer runs in a thread of the calling process and is
driven by tokens (one per item) through a :class:`queue.Queue`, exactly as in the original
library. :class:`OrderedRunner` tags every item with its index and puts early results in a
dict until their turn comes. Every payload is pickled in-band by ``multiprocessing``.

Same six static hooks and the same calls as :mod:`easycore.common.parallel`::

    class Squares(UnorderedRunner):
        @staticmethod
        def producer_work(device, cfg, data):
            return data * data
        ...

    with Squares(devices=2) as runner:
        total = runner(range(100))

Beyond the original, the waits check that the producers are still alive (so a crashed
producer raises instead of hanging) and the runner is a context manager. Nothing else is
tuned: this is the baseline the benchmarks compare against.
"""

from __future__ import annotations

import atexit
import copy
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

_TICK = 1.0
"""Seconds between liveness checks while blocked."""


class AttrDict(dict[str, Any]):
    """A dict with attribute access: the cfg used when ``CfgNode`` is not importable."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError:
            raise AttributeError(key) from None

    def copy(self) -> AttrDict:
        """A shallow copy, still an :class:`AttrDict`."""
        return type(self)(self)


def make_cfg(cfg: Any = None) -> Any:
    """A fresh cfg: ``easycore.common.config.CfgNode`` when importable, else an AttrDict."""
    cfg_type: type[dict[str, Any]]
    try:
        from easycore.common.config import CfgNode

        cfg_type = CfgNode
    except ImportError:
        cfg_type = AttrDict
    if cfg is None:
        return cfg_type()
    return cfg if isinstance(cfg, cfg_type) else cfg_type(cfg)


def _copy_cfg(cfg: Any) -> Any:
    return cfg.clone() if hasattr(cfg, "clone") else copy.copy(cfg)


class _Stop:
    """Tells a producer process or the consumer thread to exit."""


class _Begin:
    """Tells the consumer thread that a call starts (run ``consumer_init``)."""


class _End:
    """Tells the consumer thread that the call's items are all sent (run ``consumer_end``)."""


class _Failed:
    """Carries an exception from the consumer thread or a producer to the caller."""

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc = exc
        self.where = where


def _producer_main(
    in_q: Any,
    out_q: Any,
    device: str,
    cfg: Any,
    init: Callable[..., Any],
    work: Callable[..., Any],
    end: Callable[..., Any],
    ordered: bool,
) -> None:
    """A producer process: ``init``, then ``work`` on every item until told to stop, ``end``."""
    try:
        init(device, cfg)
        while True:
            item = in_q.get()
            if isinstance(item, _Stop):
                break
            if ordered:
                index, data = item
                out_q.put((index, work(device, cfg, data)))
            else:
                out_q.put(work(device, cfg, item))
        end(device, cfg)
    except BaseException as e:  # report, then exit non-zero
        try:
            out_q.put(_Failed(RuntimeError(f"{type(e).__name__}: {e}"), f"producer {device}"))
        finally:
            raise


class BaseRunner:
    """A multi-process runner: one producer process per device, one consumer thread.

    Args:
        devices (int or Iterable[str]): ``n`` CPU producers, or one producer per device.
        cfg: user data for the hooks (a ``CfgNode``, a dict, or None).
        queue_scale (float): both queues hold ``len(devices) * queue_scale`` items.
    """

    _ordered = False

    def __init__(self, devices: int | Iterable[str], cfg: Any = None, queue_scale: float = 3.0):
        if isinstance(devices, int):
            self.devices = ["cpu"] * devices
        else:
            self.devices = list(devices)
        if not self.devices:
            raise ValueError("devices is empty")
        self.cfg = make_cfg(cfg)
        self.queue_scale = queue_scale
        self._active = False
        self.activate()
        atexit.register(self.close)

    # the six hooks (the manual's defaults)
    @staticmethod
    def producer_init(device: str, cfg: Any) -> None:
        """Runs once in each producer process before any item."""

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        """Processes one item in a producer; returns what the consumer gets."""
        return data

    @staticmethod
    def producer_end(device: str, cfg: Any) -> None:
        """Runs once in each producer process at close."""

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        """Runs in the consumer thread at the start of each call."""

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        """Receives one result in the consumer thread."""

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        """Runs after the last result; its value is what the call returns."""
        return None

    @property
    def is_activate(self) -> bool:
        """Whether the producer processes and the consumer thread are running."""
        return self._active

    def activate(self) -> None:
        """Starts the processes and the consumer thread (a no-op while active)."""
        if self._active:
            return
        size = max(1, int(len(self.devices) * self.queue_scale))
        self._in_q: Any = mp.Queue(maxsize=size)
        self._out_q: Any = mp.Queue(maxsize=size)
        self._tokens: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._result: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._put_index = 0
        self._get_index = 0
        self._early: dict[int, Any] = {}
        self._consumer_failed = False
        self._producers = [
            mp.Process(
                target=_producer_main,
                args=(
                    self._in_q,
                    self._out_q,
                    dev,
                    _copy_cfg(self.cfg),
                    self.producer_init,
                    self.producer_work,
                    self.producer_end,
                    self._ordered,
                ),
                daemon=True,
            )
            for dev in self.devices
        ]
        for p in self._producers:
            p.start()
        self._consumer = threading.Thread(target=self._consumer_main, daemon=True)
        self._consumer.start()
        self._active = True

    def close(self) -> None:
        """Stops the producers (after ``producer_end``) and the consumer thread."""
        if not self._active:
            return
        self._active = False
        for p in self._producers:
            if p.is_alive():
                try:
                    self._in_q.put(_Stop(), timeout=1.0)
                except queue.Full:
                    pass
        deadline = time.monotonic() + 10.0
        while any(p.is_alive() for p in self._producers) and time.monotonic() < deadline:
            try:  # results nobody will read (after an error): unblock the producers
                self._out_q.get(timeout=0.05)
            except queue.Empty:
                pass
        for p in self._producers:
            if p.is_alive():
                p.terminate()
            p.join()
        while self._consumer.is_alive():
            try:
                self._tokens.put(_Stop(), timeout=0.1)
                break
            except queue.Full:
                pass
        self._consumer.join(timeout=5.0)
        for q in (self._in_q, self._out_q):
            q.close()
            q.cancel_join_thread()

    def __enter__(self) -> BaseRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, data_iter: Iterable[Any]) -> Any:
        """Runs every item of ``data_iter`` through the producers into the consumer.

        Returns:
            the value of ``consumer_end``.
        """
        if not self._active:
            raise RuntimeError("The runner is closed. Please activate it.")
        try:
            self._tokens.put(_Begin())
            for data in data_iter:
                self._put_checked(self._in_q, self._tag(data))
                self._put_checked(self._tokens, None)
                if self._consumer_failed:
                    break
            else:
                self._put_checked(self._tokens, _End())
            while True:
                try:
                    out = self._result.get(timeout=_TICK)
                    break
                except queue.Empty:
                    self._check_alive()
        except BaseException:
            self.close()  # after an error the runner is clearly closed, never half-alive
            raise
        if isinstance(out, _Failed):
            self.close()
            raise RuntimeError(f"reference runner: {out.where} failed") from out.exc
        return out

    # plumbing

    def _tag(self, data: Any) -> Any:
        return data

    def _check_alive(self) -> None:
        dead = [p for p in self._producers if not p.is_alive()]
        if dead:
            raise RuntimeError(
                f"reference runner: producer pid {dead[0].pid} died (exit code {dead[0].exitcode})"
            )
        if self._consumer_failed or not self._consumer.is_alive():
            try:
                out = self._result.get_nowait()
            except queue.Empty:
                out = None
            if isinstance(out, _Failed):
                raise RuntimeError(f"reference runner: {out.where} failed") from out.exc
            raise RuntimeError("reference runner: consumer thread died")

    def _put_checked(self, q: Any, item: Any) -> None:
        while True:
            try:
                q.put(item, timeout=_TICK)
                return
            except queue.Full:
                self._check_alive()
                if self._consumer_failed:  # it stopped reading; the caller stops sending
                    return

    def _get_result(self) -> Any:
        while True:
            try:
                out = self._out_q.get(timeout=_TICK)
                break
            except queue.Empty:
                self._check_alive()
        if isinstance(out, _Failed):
            raise RuntimeError(f"reference runner: {out.where} failed") from out.exc
        return out

    def _consumer_main(self) -> None:
        cfg: Any = None
        while True:
            token = self._tokens.get()
            if isinstance(token, _Stop):
                return
            try:
                if isinstance(token, _Begin):
                    cfg = _copy_cfg(self.cfg)
                    self.consumer_init(cfg)
                elif isinstance(token, _End):
                    self._result.put(self.consumer_end(cfg))
                    cfg = None
                else:
                    self.consumer_work(cfg, self._get_result())
            except Exception as e:  # hand the error to the caller; it closes the runner
                self._consumer_failed = True
                self._result.put(_Failed(e, "consumer"))
                return


class UnorderedRunner(BaseRunner):
    """The consumer gets results in the order they arrive."""

    _ordered = False


class OrderedRunner(BaseRunner):
    """The consumer gets results in input order (early ones wait in a dict)."""

    _ordered = True

    def _tag(self, data: Any) -> Any:
        index = self._put_index
        self._put_index += 1
        return (index, data)

    def _get_result(self) -> Any:
        want = self._get_index
        while want not in self._early:
            index, data = super()._get_result()
            self._early[index] = data
        self._get_index = want + 1
        return self._early.pop(want)
