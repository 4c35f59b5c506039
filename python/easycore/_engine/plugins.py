"""Optional extras the engine loads by name, at run time, only when asked for.

The engine and the layers above it never import their optional extras (``easycore.ray``
needs Ray, ``easycore.torch`` needs torch), so ``backend="ray"`` or ``Queue(torch=True)`` find
them here: :func:`load` imports the extra's module (which raises a clear
``ModuleNotFoundError`` naming the extra if it is missing) and returns the object it offers.
This table is the only place where a lower layer names a higher one, and it names them as
data, not as imports: the import graph stays acyclic and layered (``tests/test_layers.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> (module, attribute)
PLUGINS: dict[str, tuple[str, str]] = {
    "backend:ray": ("easycore.ray", "RayBackend"),
    "codec:torch": ("easycore.torch.parallel.codec", "TorchCodec"),
}


def load(name: str) -> Any:
    """The object registered as ``name`` in :data:`PLUGINS`, its module imported."""
    module, attr = PLUGINS[name]
    return getattr(importlib.import_module(module), attr)
