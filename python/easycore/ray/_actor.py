"""The producer as a Ray actor: the producer core that a local producer process runs
(``easycore._engine.producer``), one batch per actor call instead of a loop over a
shared-memory queue.

Each call takes and returns a message of the engine's wire format, ``(seq, kind, parts)``,
so the caller's :class:`~easycore._engine.stream.Call` reads results and error
reports exactly as it reads them from the local producers. Out-of-band buffers (numpy arrays,
tensors' memory) travel as numpy ``uint8`` arrays, which Ray keeps out of band too: a large
result is written once into the object store of the actor's node, and read there by the
caller without a copy when it runs on the same node.

This module does not import Ray: the backend wraps :class:`ProducerActor` with
``ray.remote`` (so importing it stays cheap in the actor's process too).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from easycore._engine import wire
from easycore._engine.producer import ProducerCore


def to_ray_parts(parts: Sequence[Any]) -> list[Any]:
    """The codec's parts in a form Ray can serialise: the pickle, then each out-of-band
    buffer as a numpy ``uint8`` view (no copy here; Ray writes it out of band)."""
    if len(parts) == 1:
        return [parts[0]]
    import numpy as np  # a dependency of Ray itself

    out: list[Any] = [parts[0]]
    for p in parts[1:]:
        out.append(np.frombuffer(p, dtype=np.uint8))
    return out


def _node() -> tuple[str, str, str]:
    """This process's Ray node id, IP address and actor id ("?" where Ray does not say)."""
    try:
        import ray

        context = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return str(context.get_node_id()), str(ip), str(context.get_actor_id())
    except Exception:  # noqa: BLE001 - only used to name the actor in messages
        return "?", "?", "?"


class ProducerActor:
    """One producer in a Ray actor: the engine's producer core
    (:class:`~easycore._engine.producer.ProducerCore`), one batch per actor call.

    Args:
        runner_cls (type): the user's runner class (its static hooks are called).
        index (int): this producer's position in the runner's ``devices``.
        device (str): the device string passed to every hook.
        cfg (CfgNode): this producer's copy of the runner's cfg.
        setup (Callable, optional): ``setup(device)`` run first (the pool's initializer
            keeper, a flavour's device setup).
        options (dict): ``n`` (number of producers), ``seed`` (the runner's base seed),
            ``seed_per_item``, ``codec`` (the flavour's) and ``fix_unsendable`` (see
            ``easycore._engine.extension``).
    """

    def __init__(
        self,
        runner_cls: Any,
        index: int,
        device: str,
        cfg: Any,
        setup: Any,
        options: dict[str, Any],
    ) -> None:
        n = int(options.get("n", 1))
        seed = int(options.get("seed", 0))
        per_item = bool(options.get("seed_per_item", False))
        self.core = ProducerCore(
            runner_cls,
            index,
            n,
            device,
            cfg,
            seed,
            setup,
            seed_per_item=per_item,
            codec=options.get("codec"),
            fix=options.get("fix_unsendable"),
        )

    def start(self) -> tuple[int, str, str, str, int, list[Any], float]:
        """Runs ``setup`` and ``producer_init``.

        Returns:
            tuple: ``(pid, node_id, node_ip, actor_id, kind, parts, init_s)`` where ``kind``
            is ``READY`` (and ``parts`` empty) or ``ERROR`` with the error report's parts,
            and ``init_s`` the seconds of ``setup`` and ``producer_init``.
        """
        pid = os.getpid()
        node_id, ip, actor_id = _node()
        self.core.begin(pid)
        report = self.core.init()
        if report is not None:
            parts = to_ray_parts(self.core.codec.dumps(report))
            return pid, node_id, ip, actor_id, wire.ERROR, parts, 0.0
        return pid, node_id, ip, actor_id, wire.READY, [], self.core.init_s

    def work(self, seq: int, kind: int, parts: list[Any]) -> tuple[int, int, list[Any]]:
        """Runs ``producer_work`` on one batch.

        Args:
            seq (int): the batch's number in its call.
            kind (int): ``WORK`` packed with the call number.
            parts (list): the batch ``(first_item_index, items)`` in the codec's parts.

        Returns:
            tuple: ``(seq, kind, parts)``: a ``RESULT`` message ``(first, results, index,
            busy_s, wait_s)``, or an ``ERROR`` message with the error report.
        """
        _, call = wire.unpack_kind(kind)
        t, out, _first = self.core.run(call, parts, 0.0)
        if t == wire.ERROR:
            out = self.core.codec.dumps(out)
        return seq, wire.pack_kind(t, call), to_ray_parts(out)

    def stop(self) -> tuple[dict[str, Any] | None, Any]:
        """Runs ``producer_end`` (and closes runners the hooks left open).

        Returns:
            tuple: the error report of ``producer_end`` (None unless it raised), and its
            return value.
        """
        return self.core.goodbye()
