"""Big read-only Python data in shared memory, read by every process with no copy.

:func:`freeze` stores a sequence or a mapping once in a shared-memory *arena*, and returns a
:class:`SharedList` or a :class:`SharedDict` over it. Every process that reads it (the caller,
a runner's producers, a pool's workers) maps the same pages read-only: reading an item decodes
a short byte string into a fresh Python object, and neither dirties a page of the arena nor
touches a reference count inside it, so memory does not grow with the number of processes
(see ``docs/memory.md``)::

    from easycore import shm

    index = shm.freeze([{"path": p, "label": l} for p, l in rows])  # a SharedList
    with MyRunner(devices=4, cfg={"index": index}) as r:             # sent by reference
        r(range(len(index)))   # producer_work reads cfg.index[i]

The rules:

* **What it holds.** Items of any picklable type. ``str``, ``int``, ``float``, ``bool``,
  ``None``, ``bytes``, tuples, lists, dicts, sets of them are stored with :mod:`marshal` (the
  fastest to read back); anything else is pickled (protocol 5), and numpy arrays inside an
  item have their data placed in the arena out of band: they come back as zero-copy
  **read-only** views of the shared pages. Pickled classes must be importable where read.
* **Items are copies.** An item read is an ordinary Python object made on each access:
  changing it changes nothing in the frozen data, nor what the next read returns. The
  frozen object itself cannot change: assigning, deleting, appending or updating raises
  ``TypeError``.
* **Travels by reference.** Pickling a frozen object gives about 130 bytes (its name, size
  and kind), never the data; unpickling maps the arena. So it can be a runner's ``cfg``
  value, a hook's closure, a pool initializer's or a task's argument, under ``fork``,
  ``spawn`` and ``forkserver`` alike. A forked child reuses the mapping it inherited.
* **Lifetime.** The process that called :func:`freeze` owns the arena. Its name is removed
  from ``/dev/shm`` when the owner calls :meth:`SharedList.close` (or leaves a ``with``
  block), when the owner's object is garbage collected, when the owner exits, or, if the
  owner is killed, by the stale-segment sweep (``easycore._core.sweep_stale_segments``, run
  by the producers' watchdogs when their caller dies). Processes that mapped it keep reading
  until they drop it; the kernel frees the memory with the last mapping. So keep the owner's
  object referenced while other processes may still *attach* (unpickle) it.
* **Safety.** The arena is created exclusively with mode 0600 under an unguessable name
  tagged with the owner's identity; attaching refuses anything that is not a regular file
  owned by this user with no access for others, of the expected size, with this layout's
  header (a :class:`~easycore.errors.SharedMemoryError` saying why), and maps it read-only.
"""

from easycore._frozen.objects import SharedDict, SharedList, freeze

__all__ = ["SharedDict", "SharedList", "freeze"]
