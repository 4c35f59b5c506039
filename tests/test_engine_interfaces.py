"""The engine's packages talk through their interfaces only: no module of ``easycore._engine``,
``easycore.common.parallel`` or ``easycore.ray`` reads, writes or calls a private member
(``_name``) of an object other than ``self`` or ``cls``.

A module of the same package, imported explicitly, may be reached through its private
names (``from easycore._engine import producer as _producer``, then ``_producer.X`` or
``producer._X``): a package's private parts are private to the package. ``ALLOWED`` lists
the few other exceptions, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "python" / "easycore"
CHECKED = ("_engine", "common/parallel", "ray")

# (module, attribute): why it is allowed. Kept short on purpose.
ALLOWED = {
    ("_engine/local.py", "os._exit"): "the standard library's documented exit without clean-up",
    ("_engine/zygote.py", "os._exit"): "the standard library's documented exit without clean-up",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package(module: str) -> str:
    """``"_engine/stream.py"`` -> ``"easycore._engine"``."""
    return ".".join(["easycore", *module.split("/")[:-1]])


def _same_package_modules(tree: ast.AST, package: str) -> set[str]:
    """The names a module binds to modules of its own package by an import statement."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.rpartition(".")[0] == package:
                    names.add(alias.asname)
    return names


def private_accesses(source: str, module: str) -> list[str]:
    """Each ``x._name`` in ``source`` (``module``: its path under ``easycore/``) where ``x``
    is not ``self``, ``cls`` or a module of the same package, as ``"line: expression"``."""
    tree = ast.parse(source)
    own = _same_package_modules(tree, _package(module))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        value = node.value
        if isinstance(value, ast.Name) and (value.id in ("self", "cls") or value.id in own):
            continue
        text = ast.unparse(node)
        if (module, text) in ALLOWED:
            continue
        found.append((node.lineno, f"{node.lineno}: {text}"))
    return [text for _, text in sorted(found)]


def _modules() -> list[Path]:
    paths = []
    for package in CHECKED:
        paths.extend(sorted((ROOT / package).rglob("*.py")))
    return paths


def test_the_modules_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"_engine/stream.py", "common/parallel/engine.py", "ray/_workers.py"} <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_private_member_of_another_object(path):
    module = path.relative_to(ROOT).as_posix()
    found = private_accesses(path.read_text(), module)
    assert not found, f"{module} uses private members of other objects: {found}"


def test_the_checker_sees_a_private_member_of_another_object():
    source = (
        "import os\n"
        "from easycore._engine import producer as _producer\n"
        "from easycore.parallel import tasks\n"
        "def f(self, runner):\n"
        "    self._mine = _producer._helper\n"
        "    os._exit(0)\n"
        "    tasks._TaskHooks\n"
        "    return runner._settings\n"
    )
    assert private_accesses(source, "_engine/x.py") == [
        "6: os._exit",
        "7: tasks._TaskHooks",
        "8: runner._settings",
    ]
