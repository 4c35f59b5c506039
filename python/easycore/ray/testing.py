"""A Ray cluster of several nodes on this machine, for tests, benchmarks and trying things out.

It uses Ray's own test helper, ``ray.cluster_utils.Cluster``: every node is a separate
raylet with its own object store, so objects really move between nodes (through the local
network stack), as they would between machines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's own addresses are 127.0.0.1


@contextmanager
def local_cluster(
    nodes: int = 2,
    cpus_per_node: int = 1,
    object_store_mib: int = 150,
    **node_args: Any,
) -> Iterator[Any]:
    """Starts ``nodes`` Ray nodes on 127.0.0.1, connects this process, yields the cluster.

    On exit, disconnects (``ray.shutdown()``) and stops every node.

    Args:
        nodes (int): number of nodes (the first one is the head).
        cpus_per_node (int): the CPUs each node offers to Ray.
        object_store_mib (int): each node's object store, in MiB (Ray's minimum is 75).
        **node_args: more arguments for every node (``num_gpus``, ``resources``…).

    Yields:
        ray.cluster_utils.Cluster: the running cluster (``.address`` to connect to it).

    Example::

        with local_cluster(nodes=2) as cluster:
            with Runner(devices=2, backend="ray") as runner:
                print(runner(range(10)))
    """
    import os

    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray resolves 127.0.0.1 to this machine's routable address (so that other machines
    # could reach it); a single-machine cluster stays on the loopback interface instead.
    env = os.environ.get(_LOOPBACK_ENV)
    os.environ[_LOOPBACK_ENV] = "0"
    loopback = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    args = {
        "num_cpus": cpus_per_node,
        "object_store_memory": object_store_mib << 20,
        "node_ip_address": "127.0.0.1",
        **node_args,
    }
    head = {**args, "include_dashboard": False}
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=head)
        for _ in range(nodes - 1):
            cluster.add_node(**args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.WARNING)
        yield cluster
    finally:
        try:
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()  # type: ignore[no-untyped-call]
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = loopback
            if env is None:
                os.environ.pop(_LOOPBACK_ENV, None)
            else:
                os.environ[_LOOPBACK_ENV] = env
