"""Registry: a name -> object mapping that classes and functions register into."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from easycore.errors import EasycoreError, InvalidArgument

_T = TypeVar("_T")
# What ``@registry.register`` without parentheses receives: a class or a function (a str is
# not callable, so this form never overlaps ``register("name")``).
_F = TypeVar("_F", bound=Callable[..., Any])


class RegistryKeyError(EasycoreError, KeyError):
    """No object is registered under the name; the message lists the registered names and
    the closest match."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class AlreadyRegisteredError(InvalidArgument):
    """The name is already taken in the registry (pass ``override=True`` to replace it)."""


class Registry:
    """The registry that provides name -> object mapping.

    To create a registry::

        MODEL_REGISTRY = Registry("MODEL")

    To register an object with its ``__name__``::

        @MODEL_REGISTRY.register()
        class ResNet50:
            pass

        # or

        MODEL_REGISTRY.register(obj=ResNet50)

    To register an object with a given name::

        @MODEL_REGISTRY.register("resnet")
        class ResNet50:
            pass

        # or

        MODEL_REGISTRY.register("resnet", ResNet50)

    To get a registered object from registry::

        model_class = MODEL_REGISTRY.get("ResNet50")

        # or

        model_class = MODEL_REGISTRY.get("resnet")

    ``name in MODEL_REGISTRY``, ``len(MODEL_REGISTRY)``, ``MODEL_REGISTRY[name]`` and iteration
    over the registered names work as for a dict.
    """

    def __init__(self, name: str) -> None:
        """
        Args:
            name (str): name of this registry
        """
        self._name = name
        self._obj_map: dict[str, Any] = {}
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        """str: name of this registry."""
        return self._name

    # One overload per documented form, so that type checkers know what each returns: the
    # decorators return the decorated class or function with its own type, the direct calls
    # return None.
    @overload
    def register(self, name: _F, /) -> _F: ...  # @registry.register (no parentheses)

    @overload
    def register(
        self, name: str | None = None, obj: None = None, *, override: bool = False
    ) -> Callable[[_T], _T]: ...  # @registry.register() / @registry.register("name")

    @overload
    def register(
        self, name: str | None, obj: object, *, override: bool = False
    ) -> None: ...  # registry.register("name", obj)

    @overload
    def register(
        self, name: str | None = None, *, obj: object, override: bool = False
    ) -> None: ...  # registry.register(obj=obj)

    def register(
        self, name: Any = None, obj: Any = None, *, override: bool = False
    ) -> Callable[[Any], Any] | Any | None:
        """Register the given object with given name. If the object is not given, it will act
        as a decorator.

        Registering a name that is taken raises :class:`AlreadyRegisteredError`, unless it is
        the same object again or ``override=True``. ``@registry.register`` without parentheses
        works too.

        Args:
            name (str, optional): if not given, it will use ``obj.__name__`` as the name.
            obj (object, optional): if not given, this method will return a decorator.
            override (bool): replace an object already registered under the name.

        Returns:
            Optional[object]: None or a decorator (the decorator returns the object itself).
        """
        if obj is None and name is not None and not isinstance(name, str):
            # @registry.register without parentheses: ``name`` is the object.
            self._add(None, name, override)
            return name
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(
                f"registry {self._name!r}: the name must be a str, got {type(name).__name__}"
            )
        if obj is None:

            def decorator(func_or_class: Any) -> Any:
                self._add(name, func_or_class, override)
                return func_or_class

            return decorator
        self._add(name, obj, override)
        return None

    def _add(self, name: str | None, obj: Any, override: bool) -> None:
        if name is None:
            name = getattr(obj, "__name__", None)
            if not isinstance(name, str):
                raise InvalidArgument(
                    f"registry {self._name!r}: {obj!r} has no __name__; give a name: "
                    f"register(name, obj)"
                )
        if not name:
            raise InvalidArgument(f"registry {self._name!r}: the name must not be empty")
        with self._lock:
            taken = self._obj_map.get(name, _MISSING)
            if taken is not _MISSING and taken is not obj and not override:
                raise AlreadyRegisteredError(
                    f"an object named {name!r} is already registered in registry "
                    f"{self._name!r} ({taken!r}); unregister it first or pass override=True"
                )
            self._obj_map[name] = obj

    def unregister(self, name: str) -> None:
        """Remove registered object.

        Args:
            name (str): registered name

        Raises:
            RegistryKeyError: nothing is registered under ``name``.
        """
        with self._lock:
            if name not in self._obj_map:
                raise self._missing(name)
            del self._obj_map[name]

    def is_registered(self, name: str) -> bool:
        """Get whether the given name has been registered.

        Args:
            name (str):

        Returns:
            bool: whether the name has been registered.
        """
        return name in self._obj_map

    def get(self, name: str) -> Any:
        """Get a registered object from registry by its name.

        Args:
            name (str): registered name.

        Returns:
            object: registered object.

        Raises:
            RegistryKeyError: nothing is registered under ``name``; the message lists the
                registered names and the closest one.
        """
        try:
            return self._obj_map[name]
        except (KeyError, TypeError):
            raise self._missing(name) from None

    def registered_names(self) -> list[str]:
        """Get all registered names.

        Returns:
            list[str]: list of registered names, in registration order.
        """
        return list(self._obj_map)

    def items(self) -> list[tuple[str, Any]]:
        """Returns:
        list[tuple[str, object]]: the ``(name, object)`` pairs, in registration order.
        """
        return list(self._obj_map.items())

    def _missing(self, name: Any) -> RegistryKeyError:
        names = self.registered_names()
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listed = ", ".join(repr(n) for n in names) if names else "none"
        return RegistryKeyError(
            f"no object named {name!r} in registry {self._name!r}.{hint} "
            f"Registered names: {listed}."
        )

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._obj_map

    def __len__(self) -> int:
        return len(self._obj_map)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._obj_map))

    def __repr__(self) -> str:
        names = ", ".join(self._obj_map)
        return f"Registry(name={self._name!r}, registered=[{names}])"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


_MISSING = object()
