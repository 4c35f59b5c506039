"""YAML reading and writing for CfgNode.

Reading is safe unless asked otherwise: :class:`SafeCfgLoader` builds on ``yaml.SafeLoader``,
so a file cannot run code; :class:`UnsafeCfgLoader` (``yaml.UnsafeLoader``) accepts every
``!!python/...`` tag and is used only when the caller passes ``unsafe=True``.

Both loaders read unquoted scalars that YAML leaves as strings as Python literals when they are
ones (``INPUT_SIZE: (224, 224)`` gives a tuple); quoted scalars and mapping keys stay strings.
The writer mirrors that: strings that would read back as literals are quoted, tuples of literals
are written as ``(224, 224)``, other tuples as ``!!python/tuple`` sequences (which the safe
loader accepts), so ``load(dump(cfg)) == cfg``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import yaml

from easycore.common.config.errors import InvalidConfigError, UnsafeYAMLError
from easycore.common.config.literal import _MISSING, is_literal, parse_literal

_STR_TAG = "tag:yaml.org,2002:str"
_TUPLE_TAG = "tag:yaml.org,2002:python/tuple"
_PYTHON_TAG_PREFIX = "tag:yaml.org,2002:python/"


class _CfgConstructorMixin:
    """Literal evaluation of plain scalars, keys excepted, and safe ``!!python/tuple``."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # resolve "<<" merge keys before noting the key nodes
            keys = self.__dict__.setdefault("_cfg_key_nodes", set())
            keys.update(id(key_node) for key_node, _ in node.value)
        return super().construct_mapping(node, deep=deep)

    def construct_cfg_str(self, node: yaml.ScalarNode) -> Any:
        text = self.construct_scalar(node)
        if node.style is None and id(node) not in self.__dict__.get("_cfg_key_nodes", ()):
            value = parse_literal(text)
            if value is not _MISSING:
                return value
        return text

    def construct_cfg_tuple(self, node: yaml.SequenceNode) -> tuple:
        return tuple(self.construct_sequence(node, deep=True))


class SafeCfgLoader(_CfgConstructorMixin, yaml.SafeLoader):
    """The default loader: no tag can run code."""


class UnsafeCfgLoader(_CfgConstructorMixin, yaml.UnsafeLoader):
    """The opt-in loader (``unsafe=True``): ``!!python/object/apply:eval [...]`` and the like."""


for _loader in (SafeCfgLoader, UnsafeCfgLoader):
    _loader.add_constructor(_STR_TAG, _CfgConstructorMixin.construct_cfg_str)
    _loader.add_constructor(_TUPLE_TAG, _CfgConstructorMixin.construct_cfg_tuple)


class CfgDumper(yaml.SafeDumper):
    """Writes CfgNodes as mappings, tuples as ``(a, b)`` where that reads back, and quotes strings
    that would otherwise read back as Python literals."""


def _represent_str(dumper: CfgDumper, data: str) -> yaml.Node:
    if is_literal(data):
        return dumper.represent_scalar(_STR_TAG, data, style="'")
    return dumper.represent_str(data)


def _represent_tuple(dumper: CfgDumper, data: tuple) -> yaml.Node:
    text = repr(data)
    value = parse_literal(text)
    if (
        type(value) is tuple
        and value == data
        and dumper.default_flow_style is False
        and not dumper.canonical
    ):
        analysis = dumper.analyze_scalar(text)
        if analysis.allow_block_plain and not analysis.multiline:
            return dumper.represent_scalar(_STR_TAG, text, style=None)
    return dumper.represent_sequence(_TUPLE_TAG, list(data))


def _represent_mapping(dumper: CfgDumper, data: Mapping) -> yaml.Node:
    return dumper.represent_dict(dict(data))


CfgDumper.add_representer(str, _represent_str)
CfgDumper.add_representer(tuple, _represent_tuple)
# CfgNode is a dict subclass; registering Mapping subclasses here would catch it, but the
# config module registers CfgNode itself to avoid importing it here.


def register_mapping_type(cls: type) -> None:
    """Have :class:`CfgDumper` write instances of ``cls`` (and subclasses) as plain mappings.

    Args:
        cls (type): a Mapping type, e.g. ``CfgNode``.
    """
    CfgDumper.add_multi_representer(cls, _represent_mapping)


def load_yaml(text: str | bytes | IO, unsafe: bool = False, source: str = "<string>") -> Any:
    """Parse one YAML document with the config loaders.

    Args:
        text (str or bytes or file): the YAML text or a stream of it.
        unsafe (bool): accept tags that can run code (``!!python/object/apply:eval``). Only for
            files you trust.
        source (str): what to call the text in error messages (a file name).

    Returns:
        Any: the parsed data.
    """
    loader = UnsafeCfgLoader if unsafe else SafeCfgLoader
    try:
        return yaml.load(text, Loader=loader)
    except yaml.constructor.ConstructorError as exc:
        problem = exc.problem or ""
        if not unsafe and _PYTHON_TAG_PREFIX in problem:
            tag = problem.split("tag", 1)[-1].strip(" '")
            tag = tag.replace(_PYTHON_TAG_PREFIX, "!!python/")
            mark = exc.problem_mark
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise UnsafeYAMLError(
                f"{source}: the YAML tag {tag!r}{where} can run code, so it is refused by "
                "default. If you trust this file, opt in explicitly, e.g. "
                "CfgNode.open(path, unsafe=True) or CfgNode.load(text, unsafe=True)."
            ) from exc
        raise


def dump_yaml(data: Any, stream: IO | None = None, encoding: str | None = None, **kwargs: Any):
    """Write ``data`` as YAML with :class:`CfgDumper`.

    Args:
        data (Any): a CfgNode, dict or other YAML-safe value.
        stream (file or None): where to write; None returns the text.
        encoding (str or None): encode the output (the return value is then bytes).
        **kwargs: options of ``yaml.dump`` (``allow_unicode``, ``sort_keys``, ``indent``...).
            ``sort_keys`` defaults to False (keys keep their order) and ``default_flow_style``
            to False (block style).

    Returns:
        None or str or bytes: the text when ``stream`` is None.
    """
    kwargs.setdefault("sort_keys", False)
    kwargs.setdefault("default_flow_style", False)
    kwargs.pop("Dumper", None)
    try:
        return yaml.dump(data, stream, Dumper=CfgDumper, encoding=encoding, **kwargs)
    except yaml.representer.RepresenterError as exc:
        path = _first_unrepresentable(data, "")
        what = f" at key {path!r}" if path else ""
        value = exc.args[1] if len(exc.args) > 1 else None
        raise InvalidConfigError(
            f"cannot write a value of type {type(value).__name__}{what} as YAML: only None, bool, "
            "int, float, str, bytes, dates, lists, tuples, sets and dicts can be saved"
        ) from exc


def _first_unrepresentable(data: Any, prefix: str) -> str:
    """The dotted key path of the first value in ``data`` that CfgDumper cannot write."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, Mapping | list | tuple | set):
                found = _first_unrepresentable(value, path)
                if found:
                    return found
                continue
            try:
                yaml.dump(value, Dumper=CfgDumper)
            except yaml.YAMLError:
                return path
    elif isinstance(data, list | tuple | set):
        for index, value in enumerate(data):
            try:
                yaml.dump(value, Dumper=CfgDumper)
            except yaml.YAMLError:
                inner = _first_unrepresentable(value, f"{prefix}[{index}]")
                return inner or f"{prefix}[{index}]"
    return ""
