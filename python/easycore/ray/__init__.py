"""Runners and pools on a Ray cluster (install with ``pip install 'easycore[ray]'``).

The same runner subclass, the same six hooks, one more argument::

    with Runner(devices=4, backend="ray") as runner:        # 4 CPU actors on the cluster
        print(runner(range(100)))
    with Pool(["cuda", "cuda"], backend="ray") as pool:      # 2 GPU actors
        print(pool.map(abs, range(-3, 3)))

Each producer is a Ray actor placed by Ray's scheduler (see :class:`RayBackend` for how
devices map to resources); the caller keeps the batching, the window, the order, the
consumer hooks, progress, statistics and the errors of the local runners. See docs/ray.md.
"""

try:
    import ray as _ray  # noqa: F401  (checked here so the message names the extra)
except ModuleNotFoundError as e:
    if e.name != "ray":
        raise
    raise ModuleNotFoundError(
        "easycore.ray and backend='ray' need Ray, which is not installed: "
        "pip install 'easycore[ray]'",
        name="ray",
    ) from None

from easycore.ray._backend import RayBackend
from easycore.ray._workers import ActorInfo

__all__ = ["ActorInfo", "RayBackend"]
