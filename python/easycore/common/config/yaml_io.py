"""YAML reading and writing for CfgNode.

Reading is safe unless asked otherwise: :class:`SafeCfgLoader` builds on ``yaml.SafeLoader``,
so a file cannot run code; :class:`UnsafeCfgLoader` (``yaml.UnsafeLoader``) accepts every
``!!python/...`` tag and is used only when the caller passes ``unsafe=True``.

Both loaders read unquoted scalars that YAML leaves as strings as Python literals when they are
ones (``INPUT_SIZE: (224, 224)`` gives a tuple); quoted scalars and mapping keys stay strings.
The writer mirrors that: strings that would read back as literals are quoted, tuples of literals
are written as ``(224, 224)``, other tuples as ``!!python/tuple`` sequences (which the safe
loader accepts), so ``load(dump(cfg)) == cfg``.

Loading refuses, with an :class:`InvalidConfigError` naming the source and line:

* text that is not valid YAML, or a value YAML cannot build (an integer of more than 4300
  digits, a bad date), or nesting deeper than :data:`MAX_DEPTH`;
* a key given twice in one mapping (YAML merge keys ``<<`` may still be overridden);
* a document whose aliases (``*name``) would expand to more than :data:`MAX_VALUES` values:
  an alias is a copy of its anchor in the config, so a few hundred bytes of nested aliases
  could otherwise ask for billions of values (an "alias bomb"); an alias to a node that holds
  it (a recursive structure) is refused too;
* a ``(a, b)`` tuple split by a flow mapping (``{SIZE: (1, 2)}``). Tuples inside a flow list,
  ``SIZES: [(224, 224), (320, 320)]``, are read as the Python literal the text is.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import IO, TYPE_CHECKING, Any, overload

import yaml

from easycore.common.config.errors import InvalidConfigError, InvalidYAMLError, UnsafeYAMLError
from easycore.common.config.literal import _MISSING, is_literal, parse_literal

MAX_VALUES: int = 1_000_000
"""The most values (mappings, lists and scalars, each alias counted as the copy it stands for)
that one YAML document may hold. Raise it (``easycore.common.config.yaml_io.MAX_VALUES = ...``)
for a config that really is that big."""

MAX_DEPTH: int = 100
"""The deepest nesting of mappings and lists that a YAML document may have."""

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TUPLE_TAG = "tag:yaml.org,2002:python/tuple"
_PYTHON_TAG_PREFIX = "tag:yaml.org,2002:python/"


class _NodeError(Exception):
    """A value YAML could not build (e.g. ``int`` refused 5000 digits), with its node."""

    def __init__(self, node: yaml.Node, error: BaseException) -> None:
        super().__init__(node, error)
        self.node = node
        self.error = error


def _line(mark: yaml.Mark | None) -> str:
    return f"line {mark.line + 1}" if mark is not None else "an unknown line"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_keys(node: yaml.MappingNode) -> None:
    """Refuse a key written twice in ``node`` (merge keys ``<<`` aside)."""
    seen: dict[tuple[str, str], yaml.Mark] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
            continue
        key = (key_node.tag, key_node.value)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key_node.value!r} at {_line(key_node.start_mark)} (first at "
                f"{_line(seen[key])}); a key may appear once in a mapping",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark


def check_document(root: yaml.Node) -> None:
    """Check a composed document before anything is built from it: duplicate keys, nesting
    deeper than :data:`MAX_DEPTH`, aliases that expand past :data:`MAX_VALUES` values or that
    refer to a node holding them.

    The walk visits each node once (aliases share their node), so it costs time proportional
    to the text, not to its expansion.

    Args:
        root (yaml.Node): the document's root node.

    Raises:
        yaml.constructor.ConstructorError: with the offending node's position.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = {id(root)}
    stack: list[tuple[yaml.Node, Any]] = [(root, iter(_children(root)))]
    if isinstance(root, yaml.MappingNode):
        _check_keys(root)
    while stack:
        node, pending = stack[-1]
        child = next(pending, None)
        if child is not None:
            if id(child) in on_path:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "an alias refers to a node that contains it (a recursive structure), "
                    "which a config cannot hold",
                    child.start_mark,
                )
            if id(child) not in size:
                if isinstance(child, yaml.MappingNode):
                    _check_keys(child)
                on_path.add(id(child))
                stack.append((child, iter(_children(child))))
            continue
        stack.pop()
        on_path.discard(id(node))
        kids = _children(node)
        size[id(node)] = 1 + sum(size[id(k)] for k in kids)
        height[id(node)] = 1 + max((height[id(k)] for k in kids), default=0)
        if size[id(node)] > MAX_VALUES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the config would expand to more than {MAX_VALUES:,} values: each alias "
                "(*name) is a full copy of its anchor, and the aliases here multiply. Raise "
                "easycore.common.config.yaml_io.MAX_VALUES if so big a config is intended",
                node.start_mark,
            )
        if height[id(node)] > MAX_DEPTH:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the config is nested more than {MAX_DEPTH} levels deep",
                node.start_mark,
            )


def _unbalanced(node: yaml.Node) -> bool:
    """A plain scalar that holds part of a ``(a, b)`` tuple split by a flow collection."""
    return (
        isinstance(node, yaml.ScalarNode)
        and node.style is None
        and node.tag == _STR_TAG
        and node.value.count("(") != node.value.count(")")
    )


if TYPE_CHECKING:
    # What the mixin is mixed into: both loaders below are SafeLoaders to the stubs' eyes (the
    # unsafe one's constructor derives from SafeConstructor), and ``super()`` reaches them.
    _ConstructorBase = yaml.SafeLoader
else:
    _ConstructorBase = object


class _CfgConstructorMixin(_ConstructorBase):
    """Literal evaluation of plain scalars, keys excepted, and safe ``!!python/tuple``."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_document(node)
        return super().construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError, TypeError) as e:
            if isinstance(e, yaml.YAMLError | InvalidConfigError):
                raise
            raise _NodeError(node, e) from e

    def construct_sequence(self, node: yaml.Node, deep: bool = False) -> list[Any]:
        if isinstance(node, yaml.SequenceNode) and node.flow_style:
            if any(_unbalanced(item) for item in node.value):
                return self._flow_literal(node)
        # The stub asks for a SequenceNode, but a mistagged value (``!!seq {a: 1}``) brings any
        # node here, and pyyaml's own check turns that into a ConstructorError.
        return super().construct_sequence(node, deep=deep)  # type: ignore[arg-type]

    def _flow_literal(self, node: yaml.SequenceNode) -> list[Any]:
        """``[(224, 224), (320, 320)]``: YAML splits the tuples at their commas; read the
        text of the whole flow list as the Python literal it is."""
        start, end = node.start_mark, node.end_mark
        text = start.buffer[start.pointer : end.pointer] if start.buffer is not None else ""
        value = parse_literal(text)
        if not isinstance(value, list):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read the flow list {text or '[...]'!r}: a tuple inside [...] needs the "
                "whole list to be a Python literal, e.g. [(224, 224), (320, 320)] (quote "
                "strings in it), or write the tuples as lists [[224, 224], [320, 320]] or as "
                "block items '- (224, 224)'",
                start,
            )
        return value

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, yaml.MappingNode):
            if node.flow_style and any(_unbalanced(n) for pair in node.value for n in pair):
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "a tuple inside a flow mapping {...} is split at its commas by YAML: write "
                    "the mapping in block style (one 'KEY: (1, 2)' per line) or use a list",
                    node.start_mark,
                )
            self.flatten_mapping(node)  # resolve "<<" merge keys before noting the key nodes
            keys = self.__dict__.setdefault("_cfg_key_nodes", set())
            keys.update(id(key_node) for key_node, _ in node.value)
        # As in construct_sequence: any node can come (``!!map [1]``), and pyyaml refuses it.
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]

    def construct_cfg_str(self, node: yaml.ScalarNode) -> Any:
        text = self.construct_scalar(node)
        if node.style is None and id(node) not in self.__dict__.get("_cfg_key_nodes", ()):
            value = parse_literal(text)
            if value is not _MISSING:
                return value
        return text

    def construct_cfg_tuple(self, node: yaml.SequenceNode) -> tuple[Any, ...]:
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


def _represent_tuple(dumper: CfgDumper, data: tuple[Any, ...]) -> yaml.Node:
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


def _represent_mapping(dumper: CfgDumper, data: Mapping[Any, Any]) -> yaml.Node:
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


def _read(text: str | bytes | IO[str] | IO[bytes], source: str) -> str:
    """The whole YAML text as a str (marks then point into it, for error lines)."""
    if not isinstance(text, str | bytes):
        text = text.read()
    if isinstance(text, bytes):
        try:
            if text.startswith((b"\xff\xfe", b"\xfe\xff")):
                return text.decode("utf-16")
            return text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise InvalidConfigError(f"{source}: not a UTF-8 or UTF-16 text: {e}") from None
    return text


def load_yaml(
    text: str | bytes | IO[str] | IO[bytes], unsafe: bool = False, source: str = "<string>"
) -> Any:
    """Parse one YAML document with the config loaders.

    Args:
        text (str or bytes or file): the YAML text or a stream of it.
        unsafe (bool): accept tags that can run code (``!!python/object/apply:eval``). Only for
            files you trust.
        source (str): what to call the text in error messages (a file name).

    Returns:
        Any: the parsed data.

    Raises:
        UnsafeYAMLError: a tag that can run code, without ``unsafe=True``.
        InvalidConfigError: anything else that stops the text from loading (see the module's
            notes); the message names ``source`` and the line.
    """
    loader_class = UnsafeCfgLoader if unsafe else SafeCfgLoader
    try:
        loader = loader_class(_read(text, source))
    except UnicodeDecodeError as e:
        raise InvalidConfigError(f"{source}: not a UTF-8 text: {e}") from None
    except yaml.YAMLError as e:  # unprintable characters
        raise InvalidYAMLError(f"{source}: {e}") from None
    try:
        return loader.get_single_data()
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
        raise _marked_error(exc, source) from None
    except yaml.MarkedYAMLError as exc:  # scanner, parser and composer errors
        raise _marked_error(exc, source) from None
    except yaml.YAMLError as exc:
        raise InvalidYAMLError(f"{source}: {exc}") from None
    except _NodeError as exc:
        raise InvalidConfigError(
            f"{source}, {_line(exc.node.start_mark)}: cannot read the value "
            f"{_excerpt(exc.node)}: {exc.error}"
        ) from None
    except RecursionError:
        raise InvalidYAMLError(
            f"{source}, near {_line(loader.get_mark())}: the config is nested too deeply "
            f"(at most {MAX_DEPTH} levels)"
        ) from None
    finally:
        loader.dispose()


def _excerpt(node: yaml.Node) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    return repr(value if len(value) <= 40 else value[:37] + "...")


def _marked_error(exc: yaml.MarkedYAMLError, source: str) -> InvalidYAMLError:
    """An :class:`InvalidYAMLError` naming the source, the line and the problem."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}, {_line(mark)}" + (f", column {mark.column + 1}" if mark else "")
    message = f"{where}: {exc.problem or exc.context or 'invalid YAML'}"
    if exc.context and exc.problem:
        context_line = f" at {_line(exc.context_mark)}" if exc.context_mark else ""
        message += f" ({exc.context}{context_line})"
    return InvalidYAMLError(message)


@overload
def dump_yaml(data: Any, stream: None = None, encoding: None = None, **kwargs: Any) -> str: ...
@overload
def dump_yaml(data: Any, stream: None, encoding: str, **kwargs: Any) -> bytes: ...
@overload
def dump_yaml(data: Any, stream: None = None, *, encoding: str, **kwargs: Any) -> bytes: ...
@overload
def dump_yaml(data: Any, stream: IO[Any], encoding: str | None = None, **kwargs: Any) -> None: ...
def dump_yaml(
    data: Any, stream: IO[Any] | None = None, encoding: str | None = None, **kwargs: Any
) -> str | bytes | None:
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
