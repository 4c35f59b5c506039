"""easycore's private engine: what the runners, the pool and the Ray backend share.

Nothing outside easycore imports it. Its modules, each with one job:

* ``wire``: message kinds and the pickle codec (what travels between caller and producers);
* ``leases``: arrays born in a queue's shared-memory pool (``easycore.shm``);
* ``reports``: a producer's error report, and the caller's exception for it;
* ``lifecycle``: live pools, runners and producer groups, stopped in order at exit; ``TICK``;
* ``plugins``: optional extras (Ray, torch) loaded by name when asked for.
"""
