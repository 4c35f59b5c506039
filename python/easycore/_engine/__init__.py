"""easycore's private engine: the one package that moves work between a caller and its
producers. The runners (``easycore.common.parallel``), the pool (``easycore.parallel``) and
the Ray backend (``easycore.ray``) are its three users; nothing outside easycore imports it.

Its interfaces, each written down in its module:

* **Transport** (``transport.py``): how a stream reaches its producers. ``send`` a batch
  (never blocking: ``QueueFull`` when the producers have enough), ``receive`` results and
  error reports, ``wake`` the receiver, ``dead``/``exited`` (a producer's death, described),
  ``shutdown`` (``producer_end``, then terminate, then kill). Two implementations: local
  processes on two shared-memory queues (``LocalWorkers``, started by ``local.py``) and Ray
  actors (``easycore.ray._backend.RayWorkers``).
* **ProducerCore** (``producer.py``): what a producer does wherever it runs. ``begin``
  (worker info, seeds), ``init`` (device set-up, ``producer_init``), ``run`` (one batch of
  ``producer_work``: a result message or an error report), ``end`` (``producer_end``).
  Hosted by the local producer process (``process_main.py``) and the Ray actor
  (``easycore.ray._actor``).
* **Stream** (``stream.py``, class ``Call``): one call. Reads the input (``runs.py``),
  batches it by measured cost within a window of items and of bytes, sends, receives,
  orders (an ordered runner's reorder buffer), runs the consumer hooks or yields, keeps
  ``stats`` (``stats.py``). It uses its runner only through ``RunnerLike``.
* **Flavour** (``flavour.py``): what differs between the plain runners and the torch ones:
  the codec, the start context, the device check, the default start method and the
  producers' device set-up.

And the pieces they share, one job each: ``wire`` (message kinds, the codec), ``reports``
(error reports both ways, the one wording of "not picklable"), ``lifecycle`` (live pools,
runners and producer groups, stopped in order at exit; ``TICK``), ``sigterm`` (SIGTERM to
the caller), ``leases`` (arrays born in a queue's shared-memory pool), ``plugins`` (optional
extras loaded by name).

Layers (``tests/test_layers.py`` checks them): ``errors`` and the Rust core, then this
package, then ``common``, ``shm``, ``parallel``, then ``ray`` and ``torch``, then ``bench``.
No import runs up, and no two modules import each other, directly or around a loop.
"""
