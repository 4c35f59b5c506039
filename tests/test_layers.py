"""The package's import graph, read from the source with ``ast`` (nothing is imported): no
import cycle between easycore's modules, and no import from a lower layer to a higher one.

Every ``import`` statement counts: at module level, under ``if TYPE_CHECKING:`` and inside
functions (a lazy import is still an arrow). ``from pkg import mod`` is an arrow to ``pkg`` as
well as to ``pkg.mod``; ``import pkg.mod`` and ``from pkg.mod import x`` only to ``pkg.mod``.
A layer may import its own package and the layers below it. Plug-ins the engine loads by name
at run time (``easycore._engine.backends``) are not arrows, by design: the loaded package
registers itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "python" / "easycore"

# Lowest first. A module's layer is that of the longest prefix of its name listed here.
LAYERS = [
    ("easycore._core",),
    ("easycore.errors",),
    ("easycore._frozen",),
    ("easycore._engine",),
    ("easycore.common",),
    ("easycore.shm",),
    ("easycore.parallel",),
    ("easycore.ray", "easycore.torch"),
    ("easycore.bench",),
    ("easycore",),  # the package's face: it may name anything (lazily)
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The easycore modules that ``path`` (module ``name``) imports anywhere."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod, and reads it from pkg: pkg's
            # ``__init__`` runs first and the name is looked up there, so pkg is an arrow too
            # (a package face that imports such a module back, even lazily, is a loop).
            targets = [base] + [
                f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known
            ]
        else:
            continue
        for t in targets:
            if t == "easycore" or t.startswith("easycore."):
                while t not in known and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t != name:
                    out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods) | {"easycore._core"}
    return {name: _imports(path, name, known) for name, path in mods.items()}


def _layer(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, module
    return rank


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    graph = _graph()
    assert "easycore.common.parallel.engine" in graph
    assert "easycore.errors" in graph["easycore.common.parallel.engine"]


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_no_import_runs_up_the_layers():
    upward = []
    for src, dsts in _graph().items():
        for dst in dsts:
            ls, ld = _layer(src), _layer(dst)
            if ld > ls or (ld == ls and _package(src) != _package(dst) and src != "easycore"):
                upward.append(f"{src} -> {dst}")
    assert sorted(upward) == []


@pytest.mark.parametrize(
    "module",
    ["easycore.common.parallel.engine", "easycore.common.parallel.call"],
)
def test_common_never_imports_ray_or_the_pool(module):
    graph = _graph()
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(graph.get(m, ()))
    assert not {m for m in seen if m.startswith(("easycore.ray", "easycore.parallel"))}


def test_the_checker_sees_a_cycle_and_an_upward_import():
    fake = {"easycore.common.a": {"easycore.common.b"}, "easycore.common.b": {"easycore.common.a"}}
    assert _cycles(fake) == [["easycore.common.a", "easycore.common.b"]]
    assert _layer("easycore.ray._backend") > _layer("easycore.common.parallel.engine")


def _write(root, files):
    """Writes ``{relative path: source}`` under ``root``; returns ``{module name: path}``."""
    mods = {}
    for rel, src in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
        parts = list(Path(rel).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def test_the_checker_sees_a_lazy_loop_through_a_package_face(tmp_path):
    # The package's face imports its command line inside a function; the command line reads
    # a sibling module *from the package* (``from pkg import mod``), which runs the face.
    mods = _write(
        tmp_path,
        {
            "easycore/fake/__init__.py": (
                "def main():\n    from easycore.fake.cli import main as m\n    return m()\n"
            ),
            "easycore/fake/cli.py": "from easycore.fake import helpers\n",
            "easycore/fake/helpers.py": "X = 1\n",
        },
    )
    graph = {name: _imports(path, name, set(mods)) for name, path in mods.items()}
    assert graph["easycore.fake.cli"] == {"easycore.fake", "easycore.fake.helpers"}
    assert _cycles(graph) == [["easycore.fake", "easycore.fake.cli"]]
    # Imported by its full name, the sibling no longer goes through the face: no loop.
    mods["easycore.fake.cli"].write_text("import easycore.fake.helpers as helpers\n")
    graph = {name: _imports(path, name, set(mods)) for name, path in mods.items()}
    assert graph["easycore.fake.cli"] == {"easycore.fake.helpers"}
    assert _cycles(graph) == []
