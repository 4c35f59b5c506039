"""CfgNode: a dict with attribute access, freezing, merging and YAML files.

The node is built in layers, one module each: :mod:`~easycore.common.config.node_base` (keys,
attributes, freezing, strict mode), :mod:`~easycore.common.config.node_merge` (merges and
command-line overrides) and this module (copies and pickling, YAML files, conversions).
"""

from __future__ import annotations

import builtins
import copy as _copy
import functools
import io
import os
import pprint
import types
from collections.abc import Callable, Mapping
from typing import IO, Any

from easycore.common.config.errors import InvalidConfigError
from easycore.common.config.node_base import _class_names
from easycore.common.config.node_merge import MergingNode
from easycore.common.config.yaml_io import dump_yaml, load_yaml, register_mapping_type


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


class CfgNode(MergingNode):
    """Config Node.

    A ``dict`` whose keys are also attributes (``cfg.MODEL.NUM_CLASSES``). Nested dicts become
    CfgNodes; any other value (a list, a tuple, a model object) is kept as it is.

    Keys must be valid Python identifiers. Names of CfgNode methods (``copy``, ``items``...)
    can be keys, but only through item access (``cfg["copy"]``).

    A frozen node (:meth:`freeze`) refuses every change; a node in strict mode
    (:meth:`set_strict`) refuses new keys, so that a misspelt override is an error. Errors name
    the full key path, e.g. ``MODEL.NUM_CLASSES``.
    """

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


def _is_binary(stream: Any) -> bool:
    if isinstance(stream, io.RawIOBase | io.BufferedIOBase):
        return True
    return "b" in str(getattr(stream, "mode", ""))


_class_names(CfgNode)
register_mapping_type(CfgNode)
