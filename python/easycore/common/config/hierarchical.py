"""HierarchicalCfgNode: YAML configs that build on other YAML configs through ``__BASE__``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, Any

from easycore.common.config.errors import BaseConfigNotFoundError, InvalidConfigError
from easycore.common.config.node import CfgNode

BASE_KEY = "__BASE__"
_MISSING = object()


class HierarchicalCfgNode:
    """Config Node help class for open yaml file that depends on another yaml file.

    You can specify the dependency between yaml files with the ``__BASE__`` tag: a path, or a
    list of paths merged in order. The file's own keys override those of its bases, nested nodes
    merge key by key, and bases may have bases of their own. ``__BASE__`` does not appear in the
    result.

    Example:

        ``example-A.yaml``::

            __BASE__: ./example-B.yaml
            A: in example-A.yaml
            C: in example-A.yaml

        ``example-B.yaml``::

            A: in example-B.yaml
            B: in example-B.yaml

        Now, you can open ``example-A.yaml``::

            >>> from easycore.common.config import HierarchicalCfgNode
            >>> cfg = HierarchicalCfgNode.open("./example-A.yaml")
            >>> print(cfg)
            {'A': 'in example-A.yaml', 'B': 'in example-B.yaml', 'C': 'in example-A.yaml'}

    Note:
        ``__BASE__`` can be an absolute path or a path relative to the yaml file. And it will be
        first considered as a path relative to the yaml file then an absolute path. A relative
        path is never looked up in the working directory, so a config opens the same way from
        anywhere. ``__BASE__`` is a top-level key only: one nested inside a mapping is refused.
    """

    __BASE__: str = BASE_KEY
    """The key that names a file's bases: ``"__BASE__"``."""

    @classmethod
    def open(
        cls,
        file: str | os.PathLike[str] | IO[Any],
        encoding: str = "utf-8",
        *,
        unsafe: bool = False,
    ) -> CfgNode:
        """load a CfgNode from file, resolving ``__BASE__`` recursively.

        Args:
            file (str): path to the yaml file (a file object is accepted too; its bases are
                then looked up next to ``file.name``).
            encoding (str): encoding of the files.
            unsafe (bool): allow tags that can run code, in this file and its bases.

        Returns:
            CfgNode:

        Raises:
            BaseConfigNotFoundError: a ``__BASE__`` file does not exist (relative to the file
                including it, or as an absolute path).
            InvalidConfigError: the ``__BASE__`` references form a cycle, are not paths, or
                ``__BASE__`` is nested inside a mapping.
        """
        return cls._open(file, encoding, unsafe, ())

    @classmethod
    def _open(
        cls,
        file: str | os.PathLike[str] | IO[Any],
        encoding: str,
        unsafe: bool,
        chain: tuple[tuple[str, str], ...],
    ) -> CfgNode:
        if isinstance(file, str | os.PathLike):
            name = os.fspath(file)
            real = os.path.realpath(name)
        else:
            name = str(getattr(file, "name", "<stream>"))
            real = os.path.realpath(name) if os.path.isfile(name) else f"<stream {id(file)}>"
        if any(real == seen for _, seen in chain):
            cycle = " -> ".join([shown for shown, _ in chain] + [name])
            raise InvalidConfigError(f"__BASE__ references form a cycle: {cycle}")
        cfg = CfgNode.open(file, encoding, unsafe=unsafe)
        nested = _nested_base(cfg, "")
        if nested:
            raise InvalidConfigError(
                f"{name}: {BASE_KEY} is only allowed at the top level of a file, found it at "
                f"{nested!r}; move it to the top (it names the files this one builds on)"
            )
        bases = dict.pop(cfg, BASE_KEY, None)
        if bases is None:
            return cfg
        if isinstance(bases, str):
            bases = [bases]
        if not isinstance(bases, list | tuple) or not all(isinstance(b, str) for b in bases):
            raise InvalidConfigError(
                f"{name}: {BASE_KEY} must be a path or a list of paths, got {bases!r}"
            )
        result = CfgNode()
        for base in bases:
            base_path = _resolve_base(base, name)
            result.merge(cls._open(base_path, encoding, unsafe, (*chain, (name, real))))
        result.merge(cfg)
        return result

    @classmethod
    def save(
        cls,
        cfg: CfgNode,
        save_path: str | os.PathLike[str],
        base_cfg_path: str | os.PathLike[str] | None = None,
        base_path_relative: bool = True,
        encoding: str = "utf-8",
    ) -> None:
        """save the CfgNode into a yaml file

        With ``base_cfg_path``, only the keys whose values differ from the base config (opened
        with :meth:`open`) are written, with ``__BASE__`` pointing at it, so that
        ``HierarchicalCfgNode.open(save_path) == cfg``.

        Args:
            cfg (CfgNode):
            save_path (str):
            base_cfg_path (str): if not specified, it behaves like
                ``cfg.save(save_path, encoding)``.
            base_path_relative (bool): whether to set base cfg path to a path relative to the
                ``save_path`` (otherwise it is written as an absolute path).
            encoding (str):

        Raises:
            InvalidConfigError: ``cfg`` lacks keys that the base has (a file cannot remove
                keys of its base).
        """
        if base_cfg_path is None:
            CfgNode.save(cfg, save_path, encoding)
            return
        base = cls.open(base_cfg_path, encoding)
        missing: list[str] = []
        diff = _difference(cfg, base, "", missing)
        if missing:
            raise InvalidConfigError(
                f"cannot save {os.fspath(save_path)!r} over the base {os.fspath(base_cfg_path)!r}: "
                f"the config lacks {', '.join(repr(m) for m in missing)}, which the base has, "
                "and a file cannot remove keys of its base"
            )
        base_abs = os.path.abspath(base_cfg_path)
        reference = base_abs
        if base_path_relative:
            try:
                reference = os.path.relpath(base_abs, os.path.dirname(os.path.abspath(save_path)))
            except ValueError:  # another drive on Windows: keep it absolute
                pass
        out = CfgNode({BASE_KEY: reference})
        out.merge(diff)
        out.save(save_path, encoding)


def _resolve_base(base: str, including: str) -> str:
    """The file a ``__BASE__`` entry of ``including`` names: relative to the including file's
    folder, or an absolute path; never relative to the working directory."""
    base = os.path.expanduser(base)
    if os.path.isabs(base):
        if os.path.isfile(base):
            return base
        raise BaseConfigNotFoundError(f"{including}: {BASE_KEY} {base!r} not found")
    if not os.path.isfile(including):
        raise BaseConfigNotFoundError(
            f"{including}: {BASE_KEY} {base!r} is relative, but the config was not read from a "
            "file, so there is nothing to be relative to: give an absolute path"
        )
    relative = os.path.join(os.path.dirname(os.path.abspath(including)), base)
    if os.path.isfile(relative):
        return relative
    raise BaseConfigNotFoundError(
        f"{including}: {BASE_KEY} {base!r} not found (looked for {relative!r}, relative to the "
        "file; relative bases are not looked up in the working directory)"
    )


def _nested_base(node: Mapping[str, Any], prefix: str) -> str:
    """The dotted path of a ``__BASE__`` key below the top level of ``node``, or ``""``."""
    for key, value in node.items():
        if isinstance(value, Mapping):
            path = f"{prefix}.{key}" if prefix else key
            if BASE_KEY in value:
                return f"{path}.{BASE_KEY}"
            found = _nested_base(value, path)
            if found:
                return found
    return ""


def _difference(
    cfg: Mapping[str, Any], base: Mapping[str, Any], prefix: str, missing: list[str]
) -> dict[str, Any]:
    """The part of ``cfg`` that a file based on ``base`` must hold; keys of ``base`` that
    ``cfg`` lacks are added to ``missing``."""
    missing.extend(f"{prefix}.{k}" if prefix else k for k in base if k not in cfg and k != BASE_KEY)
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if key == BASE_KEY:
            continue
        path = f"{prefix}.{key}" if prefix else key
        theirs = base.get(key, _MISSING)
        if isinstance(value, Mapping) and isinstance(theirs, Mapping):
            sub = _difference(value, theirs, path, missing)
            if sub:
                out[key] = sub
        elif theirs is _MISSING or not _same(value, theirs):
            out[key] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == True`` but they differ here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays, whose == is elementwise
        return False
