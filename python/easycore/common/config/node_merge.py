"""Merging into a config: another config or dict (:meth:`merge`) and command-line overrides
(:meth:`merge_from_list`, :meth:`merge_from_dotlist`), each checked whole before anything
changes."""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterable, Mapping
from typing import Any

from easycore.common.config.errors import InvalidConfigError
from easycore.common.config.node_base import _MISSING, _RESERVED, NodeBase, _join
from easycore.common.config.overrides import _override_value
from easycore.errors import InvalidArgument


class MergingNode(NodeBase):
    """:class:`NodeBase` with the merges of :class:`~easycore.common.config.CfgNode`."""

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
        other = cfg if isinstance(cfg, NodeBase) else NodeBase(cfg, copy=False)
        strict = self.is_strict() if strict is None else strict
        self._check_merge(other, strict)
        self._apply_merge(other, {})

    def _check_merge(self, other: NodeBase, strict: bool) -> None:
        self._check_mutable(None, "merge into")
        for key, value in other.items():
            self._check_new_key(key, strict)
            mine = dict.get(self, key, _MISSING)
            if isinstance(value, NodeBase) and isinstance(mine, NodeBase) and mine is not value:
                mine._check_merge(value, strict)

    def _apply_merge(self, other: NodeBase, memo: dict[int, Any]) -> None:
        for key, value in other.items():
            mine = dict.get(self, key, _MISSING)
            if isinstance(value, NodeBase):
                if mine is value:
                    continue
                if isinstance(mine, NodeBase):
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
            node: NodeBase = self
            depth = 0
            while depth < len(parts) - 1:
                child = dict.get(node, parts[depth], _MISSING)
                if child is _MISSING:
                    break
                if not isinstance(child, NodeBase):
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
                if not isinstance(child, NodeBase):
                    child = node._new_child(part)
                    node._attach(part, child)
                node = child
            node._attach(parts[-1], node._as_value(parts[-1], value))
