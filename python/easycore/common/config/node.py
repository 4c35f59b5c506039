"""CfgNode: a dict with attribute access, freezing, merging and YAML files."""

from __future__ import annotations

import builtins
import copy as _copy
import difflib
import functools
import io
import os
import pprint
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, cast

from easycore.common.config.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    FrozenConfigError,
    InvalidConfigError,
)
from easycore.common.config.literal import decode_value
from easycore.common.config.yaml_io import dump_yaml, load_yaml, register_mapping_type
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


def _new_node(cls: type[CfgNode]) -> CfgNode:
    """An empty node of ``cls`` without calling ``__init__`` (used by pickle)."""
    node = cls.__new__(cls)
    node._init_state()
    return node


class _HybridMethod:
    """A classmethod that, looked up on an instance, passes the instance as its first argument:
    ``CfgNode.dump(cfg)`` and ``cfg.dump()`` are the same call."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        # The stub wants a callable to copy the name and docstring onto; a descriptor takes
        # them just as well.
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: Any, objtype: type | None = None) -> Callable[..., Any]:
        if obj is None:
            return types.MethodType(self.func, objtype)
        return functools.partial(self.func, type(obj), obj)


class CfgNode(dict[str, Any]):
    """Config Node.

    A ``dict`` whose keys are also attributes (``cfg.MODEL.NUM_CLASSES``). Nested dicts become
    CfgNodes; any other value (a list, a tuple, a model object) is kept as it is.

    Keys must be valid Python identifiers. Names of CfgNode methods (``copy``, ``items``...)
    can be keys, but only through item access (``cfg["copy"]``).

    A frozen node (:meth:`freeze`) refuses every change; a node in strict mode
    (:meth:`set_strict`) refuses new keys, so that a misspelt override is an error. Errors name
    the full key path, e.g. ``MODEL.NUM_CLASSES``.
    """

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

    def _nodes(self) -> Iterator[CfgNode]:
        """This node and every CfgNode below it, once each."""
        seen: set[int] = set()
        stack: list[CfgNode] = [self]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            yield node
            stack.extend(v for v in dict.values(node) if isinstance(v, CfgNode))

    def _set_path(self, path: str, seen: set[int] | None = None) -> None:
        seen = set() if seen is None else seen
        if id(self) in seen:
            return
        seen.add(id(self))
        self.__dict__[_PATH] = path
        for key, value in dict.items(self):
            if isinstance(value, CfgNode):
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

    def _new_child(self, key: str) -> CfgNode:
        """An empty node to hold at ``key``; it inherits this node's strict mode."""
        child = _new_node(type(self))
        child.__dict__[_PATH] = self._full(key)
        child.__dict__[_STRICT] = self.__dict__.get(_STRICT, False)
        return child

    def _attach(self, key: str, value: Any) -> None:
        if isinstance(value, CfgNode):
            value._set_path(self._full(key))
        dict.__setitem__(self, key, value)

    def _fill(self, mapping: Mapping[Any, Any], copy: bool, memo: dict[int, Any]) -> None:
        for key, value in mapping.items():
            self._check_key(key)
            if isinstance(value, CfgNode) and not copy:
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
        if isinstance(value, dict) and not isinstance(value, CfgNode):
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
    def __ior__(self, other: Any) -> CfgNode:  # type: ignore[override, misc]
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

    # ------------------------------------------------------------------ copies and pickling

    def copy(self) -> CfgNode:
        """deepcopy this CfgNode (frozen and strict states included)

        Returns:
            CfgNode:
        """
        return _copy.deepcopy(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> CfgNode:
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        new.__dict__.update(_copy.deepcopy(self.__dict__, memo))
        for key, value in dict.items(self):
            dict.__setitem__(new, key, _copy.deepcopy(value, memo))
        return new

    def __copy__(self) -> CfgNode:
        cls = type(self)
        new = cls.__new__(cls)
        new.__dict__.update(self.__dict__)
        dict.update(new, self)
        return new

    def __reduce__(self) -> tuple[Any, ...]:
        # Items are set before the state is restored, so a frozen node unpickles.
        return (_new_node, (type(self),), builtins.dict(self.__dict__), None, iter(self.items()))

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self._set_path(self._path())

    # ------------------------------------------------------------------ merging

    def merge(self, cfg: Mapping[str, Any], *, strict: bool | None = None) -> None:
        """merge another CfgNode into this CfgNode, the another CfgNode will override this
        CfgNode.

        Nested CfgNodes merge key by key; any other value replaces this node's value (as a deep
        copy, so the two configs stay independent). Nothing changes if the merge is refused.

        Args:
            cfg (CfgNode): the overriding config (a plain dict is accepted).
            strict (bool, optional): refuse keys that this config does not have. Defaults to
                this node's strict mode (:meth:`set_strict`).
        """
        if not isinstance(cfg, Mapping):
            raise InvalidArgument(f"merge() needs a CfgNode or a dict, got {type(cfg).__name__}")
        other = cfg if isinstance(cfg, CfgNode) else CfgNode(cfg, copy=False)
        strict = self.is_strict() if strict is None else strict
        self._check_merge(other, strict)
        self._apply_merge(other, {})

    def _check_merge(self, other: CfgNode, strict: bool) -> None:
        self._check_mutable(None, "merge into")
        for key, value in other.items():
            self._check_new_key(key, strict)
            mine = dict.get(self, key, _MISSING)
            if isinstance(value, CfgNode) and isinstance(mine, CfgNode) and mine is not value:
                mine._check_merge(value, strict)

    def _apply_merge(self, other: CfgNode, memo: dict[int, Any]) -> None:
        for key, value in other.items():
            mine = dict.get(self, key, _MISSING)
            if isinstance(value, CfgNode):
                if mine is value:
                    continue
                if isinstance(mine, CfgNode):
                    mine._apply_merge(value, memo)
                    continue
                child = self._new_child(key)
                child._fill(value, True, memo)
                value = child
            else:
                value = _copy.deepcopy(value, memo)
            self._attach(key, value)

    def merge_from_list(self, opts: Iterable[Any], *, strict: bool | None = None) -> None:
        """Merge overrides given as a flat list of dotted keys and values, e.g. from the command
        line: ``["MODEL.NUM_CLASSES", "10", "SOLVER.LR", "1e-3"]``.

        String values are read as Python literals when they are ones (``"10"`` is 10,
        ``"(224, 224)"`` a tuple, ``"None"`` None); other strings stay strings. Where the key
        exists, the value must fit its old value's type, as in yacs: a str key keeps the text
        (``"123"``), an int key needs an int, a float key takes an int or float (``"1"`` is
        1.0, ``"nan"`` and ``"inf"`` too), a bool key ``True``/``False`` (or true/false,
        yes/no, on/off), a tuple or list key either kind of sequence (converted), a sub-node
        only a dict. ``None`` fits every key, and a key holding None takes any value. Python
        values (not str) are checked the same way. Missing intermediate nodes are created
        (unless strict). Nothing changes if any override is refused.

        Args:
            opts (list): ``[key1, value1, key2, value2, ...]``.
            strict (bool, optional): refuse keys that do not exist, suggesting the closest one.
                Defaults to this node's strict mode (:meth:`set_strict`).

        Raises:
            InvalidConfigError: a value that does not fit its key's type, a sub-node given a
                non-dict value, a malformed key or an odd number of items; the message names
                the full key.
        """
        if isinstance(opts, str | bytes):
            raise InvalidArgument("merge_from_list() needs a list [key, value, ...], not a str")
        items = list(opts)
        if len(items) % 2:
            raise InvalidConfigError(
                f"merge_from_list() needs key/value pairs, got an odd number of items "
                f"({len(items)}): {items!r}"
            )
        self._merge_pairs(list(zip(items[0::2], items[1::2], strict=True)), strict)

    def merge_from_dotlist(self, dotlist: Iterable[str], *, strict: bool | None = None) -> None:
        """Merge overrides written as ``key=value``, e.g. ``["MODEL.NUM_CLASSES=10"]``.

        Values are read as in :meth:`merge_from_list`.

        Args:
            dotlist (list[str]): the overrides.
            strict (bool, optional): refuse keys that do not exist, suggesting the closest one.
                Defaults to this node's strict mode (:meth:`set_strict`).
        """
        if isinstance(dotlist, str | bytes):
            raise InvalidArgument("merge_from_dotlist() needs a list of 'key=value' strings")
        pairs = []
        for item in dotlist:
            if not isinstance(item, str) or "=" not in item:
                raise InvalidConfigError(f"override {item!r} is not of the form 'key=value'")
            key, _, value = item.partition("=")
            pairs.append((key.strip(), value.strip()))
        self._merge_pairs(pairs, strict)

    def _merge_pairs(self, pairs: list[tuple[Any, Any]], strict: bool | None) -> None:
        strict = self.is_strict() if strict is None else strict
        plan = []
        for full_key, raw in pairs:  # check every override before applying any
            if not isinstance(full_key, str) or not full_key:
                raise InvalidConfigError(f"override key {full_key!r} is not a dotted key string")
            parts = full_key.split(".")
            for part in parts:
                if not part.isidentifier() or part in _RESERVED:
                    raise InvalidConfigError(
                        f"invalid override key {_join(self._path(), full_key)!r}: {part!r} is "
                        "not a valid config key"
                    )
            # Walk down to the deepest existing node; parts[depth] is the first key set under it.
            node: CfgNode = self
            depth = 0
            while depth < len(parts) - 1:
                child = dict.get(node, parts[depth], _MISSING)
                if child is _MISSING:
                    break
                if not isinstance(child, CfgNode):
                    raise InvalidConfigError(
                        f"cannot set {node._full('.'.join(parts[depth:]))!r}: "
                        f"{node._full(parts[depth])!r} holds a {type(child).__name__}, "
                        "not a CfgNode"
                    )
                node = child
                depth += 1
            node._check_new_key(parts[depth], strict)
            node._check_mutable(".".join(parts[depth:]), "set")
            old = dict.get(node, parts[-1], _MISSING) if depth == len(parts) - 1 else _MISSING
            plan.append((parts, _override_value(old, raw, node._full(parts[-1]))))
        for parts, value in plan:
            node = self
            for part in parts[:-1]:
                child = dict.get(node, part, _MISSING)
                if not isinstance(child, CfgNode):
                    child = node._new_child(part)
                    node._attach(part, child)
                node = child
            node._attach(parts[-1], node._as_value(parts[-1], value))

    # ------------------------------------------------------------------ YAML

    def save(self, save_path: str | os.PathLike[str] | IO[Any], encoding: str = "utf-8") -> None:
        """save the CfgNode into a yaml file

        Args:
            save_path (str or io.IOBase): path of the yaml file, or a file object open for
                writing (text or binary).
            encoding (str): encoding of the file.
        """
        if isinstance(save_path, str | os.PathLike):
            text = dump_yaml(self)  # fails before the file is touched
            with builtins.open(save_path, "w", encoding=encoding) as f:
                f.write(text)
        else:
            dump_yaml(self, save_path, encoding=encoding if _is_binary(save_path) else None)

    @classmethod
    def open(
        cls,
        file: str | os.PathLike[str] | IO[Any],
        encoding: str = "utf-8",
        *,
        unsafe: bool = False,
    ) -> CfgNode:
        """load a CfgNode from file.

        Loading is safe: tags that could run code (``!!python/object/apply:eval [...]``) are
        refused with :class:`UnsafeYAMLError` unless ``unsafe=True``.

        Args:
            file (io.IOBase or str): file object or path to the yaml file.
            encoding (str): encoding of the file (for a path).
            unsafe (bool): allow every ``!!python/...`` tag. Only for files you trust.

        Returns:
            CfgNode:
        """
        if isinstance(file, str | os.PathLike):
            source = os.fspath(file)
            with builtins.open(file, encoding=encoding) as f:
                data = load_yaml(f, unsafe=unsafe, source=source)
        else:
            source = str(getattr(file, "name", "<stream>"))
            data = load_yaml(file, unsafe=unsafe, source=source)
        return cls._from_data(data, source)

    @classmethod
    def load(cls, yaml_str: str, *, unsafe: bool = False) -> CfgNode:
        """load a CfgNode from a string of yaml format

        Args:
            yaml_str (str): the YAML text.
            unsafe (bool): allow every ``!!python/...`` tag. Only for text you trust.

        Returns:
            CfgNode:
        """
        return cls._from_data(load_yaml(yaml_str, unsafe=unsafe), "<string>")

    @classmethod
    def _from_data(cls, data: Any, source: str) -> CfgNode:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise InvalidConfigError(
                f"{source}: the top level of a config must be a mapping, got {type(data).__name__}"
            )
        try:
            return cls(data, copy=False)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{source}: {exc}") from None

    @_HybridMethod
    def dump(
        cls,
        cfg: Mapping[str, Any],
        stream: IO[Any] | None = None,
        encoding: str | None = None,
        **kwargs: Any,
    ) -> str | bytes | None:
        """dump CfgNode into yaml str or yaml file

        Note: if ``stream`` is a file object, the CfgNode is dumped into it and None is
        returned; if ``stream`` is None, the YAML text is returned instead. Called on an
        instance (``cfg.dump()``), the instance is ``cfg``.

        Args:
            cfg (CfgNode):
            stream (io.IOBase or None): if set to a file object, the CfgNode will be dumped into
                stream and return None, if set to None, return a string instead.
            encoding (str or None): encode the output; with no stream, bytes are returned.
            **kwargs: options of the yaml dumper, e.g. ``allow_unicode``, ``line_break``,
                ``explicit_start``, ``explicit_end``, ``version``, ``tags``, ``indent``,
                ``sort_keys`` (default False: keys keep their order).

        Returns:
            None or str:
        """
        return dump_yaml(cfg, stream, encoding=encoding, **kwargs)

    # ------------------------------------------------------------------ conversions

    def dict(self) -> builtins.dict[str, Any]:
        """convert to a dict

        Nested CfgNodes become plain dicts; other values are the same objects.

        Returns:
            dict:
        """
        return {k: (v.dict() if isinstance(v, CfgNode) else v) for k, v in self.items()}

    def __str__(self) -> str:
        """Returns:
        str: a str of dict format
        """
        return pprint.pformat(self.dict(), width=100, sort_dicts=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


_TRUE_WORDS = frozenset({"true", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "no", "off"})


def _override_value(old: Any, raw: Any, full_key: str) -> Any:
    """The value an override ``raw`` (from a command line) sets over ``old``, coerced to the
    type of ``old`` as yacs does, or :class:`InvalidConfigError` naming ``full_key``.

    ``None`` is accepted for every key and every value is accepted over ``None`` or a new
    key; a str key keeps the text; int widens to float; lists and tuples convert to each
    other; a sub-node can only be replaced by a dict.
    """
    value = decode_value(raw) if isinstance(raw, str) else raw
    if old is _MISSING or old is None or value is None:
        return value
    if isinstance(old, Mapping):
        if isinstance(value, Mapping):
            return value
        example = f"{full_key}.{next(iter(old), 'KEY')}"
        raise InvalidConfigError(
            f"cannot set {full_key!r} to {raw!r}: {full_key!r} is a config node, which only a "
            f"dict can replace; set one of its keys instead, e.g. {example}"
        )
    if isinstance(old, str):
        if isinstance(value, str):
            return value  # "'None'" gives the text None
        return raw if isinstance(raw, str) else _mismatch(old, raw, value, full_key)
    if isinstance(old, bool):
        if isinstance(value, bool):
            return value
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(raw, str):
            try:
                return float(raw)  # "nan", "inf", "-inf"
            except ValueError:
                pass
        return _mismatch(old, raw, value, full_key)
    if isinstance(old, tuple | list):
        if isinstance(value, tuple | list):
            return type(old)(value) if type(old) in (tuple, list) else value
        return _mismatch(old, raw, value, full_key)
    if isinstance(value, type(old)):
        return value
    return _mismatch(old, raw, value, full_key)


def _mismatch(old: Any, raw: Any, value: Any, full_key: str) -> Any:
    shown = repr(old) if len(repr(old)) <= 60 else repr(old)[:57] + "..."
    verb = "reads as" if isinstance(raw, str) else "is"
    want, got = _a(type(old).__name__), _a(type(value).__name__)
    raise InvalidConfigError(
        f"cannot set {full_key!r} to {raw!r}: the key holds {want} ({shown}) and {raw!r} "
        f"{verb} {got}. Give {want} (or None)"
    )


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _is_binary(stream: Any) -> bool:
    if isinstance(stream, io.RawIOBase | io.BufferedIOBase):
        return True
    return "b" in str(getattr(stream, "mode", ""))


_class_names(CfgNode)
register_mapping_type(CfgNode)
