"""The core of :class:`~easycore.common.config.CfgNode`: a dict whose keys are attributes,
with key checks, key paths for messages, freezing and strict mode."""

from __future__ import annotations

import builtins
import copy as _copy
import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self, cast

from easycore.common.config.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    FrozenConfigError,
    InvalidConfigError,
)
from easycore.errors import InvalidArgument

# A node's own state lives in its __dict__ under these names, which are therefore not valid keys.
_FROZEN = "__frozen__"
_STRICT = "__strict__"
_PATH = "__keypath__"
_RESERVED = frozenset({_FROZEN, _STRICT, _PATH})
_MISSING = object()

# Attribute access is on the hot path of runner hooks (``cfg.count += 1`` per item), so keys
# are looked up before the class's attributes, but a key never shadows a class attribute.
_generic_getattribute = object.__getattribute__
_dict_contains = dict.__contains__
_dict_get = dict.get
_dict_getitem = dict.__getitem__
_dict_setitem = dict.__setitem__
_class_names_cache: dict[type, frozenset[str]] = {}
# The union of every CfgNode class's names (filled as each class is made): a key outside it
# is no class attribute of any node, so reading or writing it skips the per-class check.
# Kept in step by ``CfgNode.__init_subclass__``.
_any_class_names: set[str] = set()


def _class_names(cls: type) -> frozenset[str]:
    """Every attribute name of ``cls`` (and of its metaclass), which keys cannot shadow."""
    names = _class_names_cache.get(cls)
    if names is None:
        names = _class_names_cache[cls] = frozenset(dir(cls)) | frozenset(dir(type(cls)))
        _any_class_names.update(names)
    return names


def _did_you_mean(key: Any, candidates: Iterable[Any]) -> str:
    """`` Did you mean 'X'?`` for the closest candidate, or an empty string."""
    names = [c for c in candidates if isinstance(c, str)]
    matches = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    return f" Did you mean {matches[0]!r}?" if matches else ""


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


class NodeBase(dict[str, Any]):
    """The dict-and-attributes core that :class:`~easycore.common.config.CfgNode` builds on:
    keys, attribute access, freezing and strict mode (see CfgNode for the whole story)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _class_names(cls)  # its names join _any_class_names before any of its nodes exists

    def __init__(self, init_dict: Mapping[str, Any] | None = None, copy: bool = True) -> None:
        """Config Node.

        Args:
            init_dict (dict): a possibly-nested dictionary to initialize the CfgNode.
            copy (bool): if this option is set to False, the CfgNode instance will share the
                values with the ``init_dict``: every value that is not a dict (a list, a
                tuple, a model object, a CfgNode) is the same object in both. Nested plain
                dicts cannot be shared, since each becomes a CfgNode: they are new nodes whose
                own values are shared in the same way, so changing a value inside one of those
                objects shows on both sides while adding or removing a key does not.
                Otherwise (True) the contents of ``init_dict`` will be deepcopied.
        """
        super().__init__()
        self._init_state()
        if init_dict is None:
            return
        if not isinstance(init_dict, Mapping):
            raise InvalidArgument(
                f"CfgNode(init_dict) needs a dict, got {type(init_dict).__name__}"
            )
        self._fill(init_dict, copy, {})

    # ------------------------------------------------------------------ internal state

    def _init_state(self, path: str = "") -> None:
        state = self.__dict__
        state[_FROZEN] = False
        state[_STRICT] = False
        state[_PATH] = path

    def _path(self) -> str:
        return cast(str, self.__dict__.get(_PATH, ""))

    def _full(self, key: Any) -> str:
        return _join(self._path(), key)

    def _nodes(self) -> Iterator[NodeBase]:
        """This node and every CfgNode below it, once each."""
        seen: set[int] = set()
        stack: list[NodeBase] = [self]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            yield node
            stack.extend(v for v in dict.values(node) if isinstance(v, NodeBase))

    def _set_path(self, path: str, seen: set[int] | None = None) -> None:
        seen = set() if seen is None else seen
        if id(self) in seen:
            return
        seen.add(id(self))
        self.__dict__[_PATH] = path
        for key, value in dict.items(self):
            if isinstance(value, NodeBase):
                value._set_path(_join(path, key), seen)

    def _check_key(self, key: Any) -> None:
        if not isinstance(key, str):
            where = f" in {self._path()!r}" if self._path() else ""
            raise InvalidConfigError(
                f"config keys must be str, got {key!r} ({type(key).__name__}){where}"
            )
        if not key.isidentifier():
            raise InvalidConfigError(
                f"invalid config key {self._full(key)!r}: keys must be valid Python identifiers "
                "(letters, digits and '_', not starting with a digit)"
            )
        if key in _RESERVED:
            raise InvalidConfigError(
                f"invalid config key {self._full(key)!r}: the name is reserved for CfgNode's "
                "own state"
            )

    def _check_mutable(self, key: Any, action: str) -> None:
        if self.__dict__.get(_FROZEN, False):
            target = self._full(key) if key is not None else (self._path() or "the config")
            raise FrozenConfigError(
                f"cannot {action} {target!r}: the config is frozen "
                "(call .freeze(False) to allow changes)"
            )

    def _check_new_key(self, key: str, strict: bool) -> None:
        if strict and not dict.__contains__(self, key):
            raise ConfigKeyError(
                f"cannot add the new key {self._full(key)!r}: the config is in strict mode and "
                f"has no such key.{_did_you_mean(key, self)}"
            )

    def _new_child(self, key: str) -> Self:
        """An empty node to hold at ``key``; it inherits this node's strict mode."""
        cls = type(self)
        child = cls.__new__(cls)
        child._init_state()
        child.__dict__[_PATH] = self._full(key)
        child.__dict__[_STRICT] = self.__dict__.get(_STRICT, False)
        return child

    def _attach(self, key: str, value: Any) -> None:
        if isinstance(value, NodeBase):
            value._set_path(self._full(key))
        dict.__setitem__(self, key, value)

    def _fill(self, mapping: Mapping[Any, Any], copy: bool, memo: dict[int, Any]) -> None:
        for key, value in mapping.items():
            self._check_key(key)
            if isinstance(value, NodeBase) and not copy:
                pass  # shared as it is
            elif isinstance(value, dict):
                child = self._new_child(key)
                child._fill(value, copy, memo)
                value = child
            elif copy:
                value = _copy.deepcopy(value, memo)
            self._attach(key, value)

    def _as_value(self, key: str, value: Any) -> Any:
        """``value`` as stored at ``key``: a plain dict becomes a CfgNode sharing its values."""
        if isinstance(value, dict) and not isinstance(value, NodeBase):
            child = self._new_child(key)
            child._fill(value, False, {})
            return child
        return value

    # ------------------------------------------------------------------ dict and attributes

    def __setitem__(self, key: str, value: Any) -> None:
        self._check_mutable(key, "set")
        self._check_key(key)
        self._check_new_key(key, self.is_strict())
        self._attach(key, self._as_value(key, value))

    def __delitem__(self, key: str) -> None:
        self._check_mutable(key, "delete")
        if not dict.__contains__(self, key):
            self.__missing__(key)
        dict.__delitem__(self, key)

    def __missing__(self, key: Any) -> Any:
        raise ConfigKeyError(f"no key {self._full(key)!r} in the config.{_did_you_mean(key, self)}")

    def __getattribute__(self, name: str) -> Any:
        # A key first (no failed class lookup and AttributeError on the way); names of the
        # class's own attributes keep their meaning. A name that no CfgNode class has needs
        # one dict lookup; only a key named like some class's attribute asks its own class.
        if name not in _any_class_names:
            value = _dict_get(self, name, _MISSING)
            if value is not _MISSING:
                return value
        elif _dict_contains(self, name) and name not in _class_names(type(self)):
            return _dict_getitem(self, name)
        return _generic_getattribute(self, name)

    def __getattr__(self, name: str) -> Any:
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        if name.startswith("__") and name.endswith("__"):  # copy/pickle/IPython probes
            raise AttributeError(name)
        raise ConfigAttributeError(
            f"{type(self).__name__} has no key {self._full(name)!r}.{_did_you_mean(name, self)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        # Fast path: a new plain value for an existing key of an unfrozen node (strict mode
        # allows it, the key was checked when it was added).
        if (
            (name not in _any_class_names or name not in _class_names(type(self)))
            and _dict_contains(self, name)
            and not isinstance(value, dict)
            and not _generic_getattribute(self, "__dict__").get(_FROZEN, False)
        ):
            _dict_setitem(self, name, value)
            return
        self._check_mutable(name, "set")
        if name in _RESERVED or hasattr(type(self), name):
            raise ConfigAttributeError(
                f"cannot set attribute {self._full(name)!r}: {name!r} is a CfgNode attribute; "
                f"use item access for a key of that name (cfg[{name!r}] = ...)"
            )
        self[name] = value

    def __delattr__(self, name: str) -> None:
        self._check_mutable(name, "delete")
        if not dict.__contains__(self, name):
            raise ConfigAttributeError(
                f"{type(self).__name__} has no key {self._full(name)!r}.{_did_you_mean(name, self)}"
            )
        dict.__delitem__(self, name)

    def __dir__(self) -> Iterable[str]:
        return sorted(set(super().__dir__()) | {k for k in self if isinstance(k, str)})

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Set several keys, as :meth:`dict.update` does (nested dicts become CfgNodes)."""
        self._check_mutable(None, "update")
        items = builtins.dict(*args, **kwargs)
        strict = self.is_strict()
        for key in items:  # check everything before changing anything
            self._check_key(key)
            self._check_new_key(key, strict)
        for key, value in items.items():
            self._attach(key, self._as_value(key, value))

    # ``|=`` updates in place and returns this node, while ``|`` is dict's and returns a plain
    # dict; mypy wants ``__ior__`` to return what ``__or__`` does (typeshed's own dict.__ior__
    # needed an ignore for this too).
    def __ior__(self, other: Any) -> Self:  # type: ignore[override, misc]
        self.update(other)
        return self

    def setdefault(self, key: str, default: Any = None) -> Any:
        """``self[key]``, after setting it to ``default`` if it is missing."""
        self._check_mutable(key, "setdefault")
        if not dict.__contains__(self, key):
            self[key] = default
        return dict.__getitem__(self, key)

    def pop(self, key: str, *default: Any) -> Any:
        """Remove ``key`` and return its value (or ``default`` when missing)."""
        self._check_mutable(key, "pop")
        if dict.__contains__(self, key):
            return dict.pop(self, key)
        if default:
            return default[0]
        return self.__missing__(key)

    def popitem(self) -> tuple[str, Any]:
        """Remove and return the last ``(key, value)`` pair."""
        self._check_mutable(None, "popitem from")
        return dict.popitem(self)

    def clear(self) -> None:
        """Remove every key."""
        self._check_mutable(None, "clear")
        dict.clear(self)

    # ------------------------------------------------------------------ state

    def freeze(self, frozen: bool = True) -> None:
        """freeze or unfreeze the CfgNode and all of its children

        Args:
            frozen (bool): freeze or unfreeze the config
        """
        for node in self._nodes():
            node.__dict__[_FROZEN] = bool(frozen)

    def is_frozen(self) -> bool:
        """get the state of the config.

        Returns:
            bool: whether the config tree is frozen.
        """
        return bool(self.__dict__.get(_FROZEN, False))

    def set_strict(self, strict: bool = True) -> None:
        """Turn strict mode on or off for the CfgNode and all of its children.

        In strict mode, setting a key that does not exist yet (by item, attribute,
        :meth:`update`, :meth:`merge` or :meth:`merge_from_list`) raises
        :class:`ConfigKeyError` with the closest existing key; existing keys can still change.

        Args:
            strict (bool): turn strict mode on or off.
        """
        for node in self._nodes():
            node.__dict__[_STRICT] = bool(strict)

    def is_strict(self) -> bool:
        """Returns:
        bool: whether the config refuses new keys.
        """
        return bool(self.__dict__.get(_STRICT, False))
