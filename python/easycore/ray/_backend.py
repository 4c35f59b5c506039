"""The Ray backend: where a runner's producers run as Ray actors (:class:`RayBackend`),
and how its devices map to actors and their resources (:meth:`RayBackend.plan`). The actors
are started and talked to by ``_workers.py``'s transport.
"""

from __future__ import annotations

import re
from typing import Any

from easycore.common.parallel.devices import device_entries
from easycore.errors import InvalidArgument
from easycore.ray._workers import ActorPlan

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class RayBackend:
    """Where a runner's (or a pool's) producers run: Ray actors on a Ray cluster.

    Pass it as ``backend=`` to a runner or a :class:`~easycore.parallel.Pool`;
    ``backend="ray"`` is ``RayBackend()``. Devices map to actors and their resources:

    * an int ``n``, or ``"cpu"`` entries: one actor per producer with ``num_cpus=1``;
    * ``"all"``: one such CPU actor per CPU of the cluster (counted when the runner is made);
    * ``"cuda"`` / ``"cuda:N"``: an actor with ``num_gpus=1``, anywhere in the cluster. Ray
      makes the actor's own GPU its only visible one, so the hooks get ``"cuda:0"``;
    * a dict: Ray actor options for that producer (``num_cpus``, ``num_gpus``,
      ``resources``, ``memory``, ``scheduling_strategy``, ``label_selector``…), plus an
      optional ``"device"`` key, the string the hooks get (default ``"cuda:0"`` if the
      dict asks for a GPU, else ``"cpu"``).

    Args:
        address (str, optional): the cluster to join if Ray is not initialised yet, as for
            ``ray.init`` (``"auto"``: the cluster this machine belongs to; None: the
            ``RAY_ADDRESS`` environment variable, else a new single-machine Ray).
        actor_options (dict, optional): Ray options applied to every actor before the
            device's own (e.g. ``{"scheduling_strategy": "SPREAD"}``, a ``runtime_env``).
        calls_in_flight (int): actor calls (batches) sent ahead to each actor, so that it
            never waits for the network between two batches.
        start_timeout (float): seconds to wait for every actor to be placed and to finish
            ``producer_init`` (an actor asking for resources the cluster lacks waits).
        **init_kwargs: more arguments for ``ray.init`` (only used when Ray is not
            initialised yet).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        actor_options: dict[str, Any] | None = None,
        calls_in_flight: int = 3,
        start_timeout: float = 300.0,
        **init_kwargs: Any,
    ) -> None:
        if calls_in_flight < 1:
            raise InvalidArgument(f"calls_in_flight must be at least 1, got {calls_in_flight}")
        self.address = address
        self.actor_options = dict(actor_options or {})
        self.calls_in_flight = int(calls_in_flight)
        self.start_timeout = float(start_timeout)
        self.init_kwargs = init_kwargs

    def __repr__(self) -> str:
        return f"RayBackend(address={self.address!r})"

    def connect(self) -> Any:
        """Initialises Ray if needed (joining ``address``) and returns the ``ray`` module."""
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_kwargs)
        return ray

    def plan(self, devices: Any) -> ActorPlan:
        """The actors for ``devices`` (see the class's docstring).

        Raises:
            InvalidArgument: for a count below 1, an empty list or an unknown device.
        """
        entries = device_entries(devices, "an int or an iterable", single=(str, dict))
        names: list[str] = []
        hook_devices: list[str] = []
        options: list[dict[str, Any]] = []
        for d in entries:
            if d == "all":
                n = int(self.connect().cluster_resources().get("CPU", 0))
                if n < 1:
                    raise InvalidArgument("devices='all': the Ray cluster has no CPUs")
                for _ in range(n):
                    names.append("cpu")
                    hook_devices.append("cpu")
                    options.append({**self.actor_options, "num_cpus": 1})
            elif isinstance(d, str) and _DEVICE.match(d):
                gpu = d.startswith("cuda")
                names.append(d)
                hook_devices.append("cuda:0" if gpu else "cpu")
                res = {"num_gpus": 1} if gpu else {"num_cpus": 1}
                options.append({**self.actor_options, **res})
            elif isinstance(d, dict):
                opts = dict(d)
                dev = opts.pop("device", None)
                if dev is None:
                    dev = "cuda:0" if opts.get("num_gpus") else "cpu"
                if not isinstance(dev, str):
                    raise InvalidArgument(f"'device' must be a str, got {dev!r}")
                names.append(dev)
                hook_devices.append(dev)
                options.append({**self.actor_options, **opts})
            else:
                raise InvalidArgument(
                    f"unknown device {d!r} for the Ray backend: use an int, 'cpu', 'cuda', "
                    "'cuda:N', 'all', or a dict of Ray actor options"
                )
        return ActorPlan(
            self.connect, names, hook_devices, options, self.calls_in_flight, self.start_timeout
        )
