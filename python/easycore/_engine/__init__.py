"""easycore's private engine: the one package that moves work between a caller and its
producers. The runners (``easycore.common.parallel``), the pool (``easycore.parallel``) and
the Ray backend (``easycore.ray``) are its three users; nothing outside easycore imports it.

Its interfaces, each written down in its module:

* **Transport** (``transport.py``): how a stream reaches its producers. ``send`` a batch
  (never blocking: ``QueueFull`` when the producers have enough), ``receive`` results and
  error reports, ``wake`` the receiver, ``dead``/``exited`` (a producer's death, described),
  ``stall_error`` (a call's timeout, naming the stuck producer), ``shutdown``
  (``producer_end``, then terminate, then kill). Two implementations: local processes on
  two shared-memory queues (``LocalWorkers``, started by ``local.py`` from a
  ``ProducerStart``) and Ray actors (``easycore.ray._workers.RayWorkers``, from the same
  ``ProducerStart``).
* **ProducerCore** (``producer.py``): what a producer does wherever it runs. ``begin``
  (worker info, seeds), ``init`` (device set-up, ``producer_init``), ``run`` (one batch of
  ``producer_work``: a result message or an error report), ``end`` (``producer_end``).
  Hosted by the local producer process (``process_main.py``) and the Ray actor
  (``easycore.ray._actor``).
* **Stream** (``stream.py``, class ``Call``): one call. Receives, orders (an ordered
  runner's reorder buffer), runs the consumer hooks or yields, keeps ``stats``
  (``stats.py``). It gets everything of its runner from the **StreamHost** (``host.py``)
  the runner makes for each call: frozen ``StreamSettings``, the ``Learned`` figures, the
  ``CallGate`` (one call at a time), the transport, the hooks and cfg, and callables to keep
  its statistics, close the runner and filter input that does not pickle. The runner's
  hooks run in its consumer thread, kept between calls (``consumer_thread.py``).
* **InputSide** (``input_side.py``): the input side a ``Call`` holds, used through a few
  documented methods: reads the input (``runs.py``; the input thread is ``reader.py``),
  batches it by measured cost within a window of items and of bytes (``batching.py``),
  pickles and sends.
* **Extension** (``extension.py``): the one extension point of a runner built on the
  engine (the pool's): the producers' set-up, input and results that do not pickle.
* **Flavour** (``flavour.py``): what differs between the plain runners and the torch ones:
  the codec, the start context, the device check, the default start method and the
  producers' device set-up.

One call, in the order the modules are passed: ``BaseRunner.__call__``
(``easycore.common.parallel.engine``) makes a ``StreamHost`` (``host.py``) and a ``Call``
(``stream.py``); the call takes the runner (``CallGate.begin``) and starts its input side
(``input_side.py``, ``reader.py``, ``runs.py``) and hands the consumer hooks to the
runner's consumer thread (``consumer_thread.py``); the input side sizes batches (``batching.py``),
pickles them (``wire.py``) and sends them on the transport (``transport.py``); a producer
process (``process_main.py``) runs each batch in its ``ProducerCore`` (``producer.py``) and
sends back results or an error report (``reports.py``); the call unpickles, orders, runs
``consumer_work`` and returns what ``consumer_end`` returns, handing its ``stats`` to the
runner and the gate to the next call.

And the pieces they share, one job each: ``wire`` (message kinds, the codec), ``reports``
(error reports both ways, the one wording of "not picklable"), ``lifecycle`` (live pools,
runners and producer groups, stopped in order at exit; ``TICK``), ``sigterm`` (SIGTERM to
the caller), ``leases`` (arrays born in a queue's shared-memory pool), ``plugins`` (optional
extras loaded by name).

No module here, in ``easycore.common.parallel`` or in ``easycore.ray`` reads, writes or
calls a private member of another object (``tests/test_engine_interfaces.py``).

Layers (``tests/test_layers.py`` checks them): ``errors`` and the Rust core, then this
package, then ``common``, ``shm``, ``parallel``, then ``ray`` and ``torch``, then ``bench``.
No import runs up, and no two modules import each other, directly or around a loop.
"""
