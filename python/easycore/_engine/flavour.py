"""A flavour: what differs between the plain runners and the torch ones, as one object.

A runner class names its flavour (``BaseRunner._flavour``); the engine asks it for

* the codec that pickles items and results (the torch one sends CPU tensors' memory out of
  band);
* the start context of producer processes (``multiprocessing`` or ``torch.multiprocessing``);
* the devices' check and the default start method, at construction (torch: CUDA devices
  must exist; a caller with CUDA initialised starts producers with spawn);
* the device set-up run first in each producer (torch: the CUDA device, thread counts).

The plain flavour is :data:`PLAIN`; ``easycore.torch.parallel`` defines the torch one.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from easycore._engine import wire


class Flavour:
    """The plain flavour (see the module); subclasses override what differs."""

    name = "plain"

    def codec(self) -> wire.Codec:
        """A codec for items and results."""
        return wire.Codec()

    def start_context(self, method: str) -> Any:
        """The multiprocessing context for ``method``."""
        return multiprocessing.get_context(method)

    def check_devices(self, devices: list[str]) -> None:
        """Raises ``InvalidArgument`` for a device this machine lacks (local producers)."""

    def default_start_method(self, requested: str | None) -> str | None:
        """The start method to ask for when the user gave ``requested`` (None: choose)."""
        return requested

    def producer_setup(self, n_producers: int, start_method: str) -> Callable[[str], Any] | None:
        """A picklable ``setup(device)`` run first in each producer, or None."""
        return None

    def __repr__(self) -> str:
        return f"<flavour {self.name}>"


PLAIN = Flavour()
