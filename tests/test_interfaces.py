"""The pool's modules talk to each other through methods: no module of
``easycore/parallel/`` reads or writes a private attribute (``obj._name``, not a dunder) of
any object but its own ``self``/``cls`` (or ``super()``). Read from the source with ``ast``.

The few accesses that remain are listed below, each with its reason: private members of the
engine's runner and stream that the engine offers no public form of, and the two that
:class:`~easycore.parallel.PoolExecutor` needs of the pool it wraps.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "python" / "easycore"
PARALLEL = ROOT / "parallel"

# (module, attribute): why the access is unavoidable here.
ALLOWED = {
    ("executor.py", "_for_executor"): "PoolExecutor makes its own pool behave as the stdlib's "
    "executor (no ResourceWarning, concurrent.futures' RemoteTraceback), which no public "
    "Pool argument offers",
    ("executor.py", "_register_atexit"): "concurrent.futures finishes pending work from "
    "threading's private exit hook; PoolExecutor must run in the same place to do as it does",
    ("executor.py", "_cancel_queued"): "PoolExecutor.shutdown(cancel_futures=True) cancels "
    "its pool's queued tasks, which multiprocessing.Pool's API (Pool's) has no call for",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(value: ast.expr) -> bool:
    """Whether ``value`` is the object itself: ``self``, ``cls`` or ``super()``."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def _foreign_private(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, attribute)`` of every private attribute reached on something other than
    ``self``, ``cls`` or ``super()``: ``obj._name``, or ``getattr(obj, "_name")`` and its
    kin (``hasattr``, ``setattr``, ``delattr``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private(node.attr) and not _own(node.value):
                out.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _own(node.args[0])
        ):
            out.append((node.lineno, node.args[1].value))
    return out


def _offences() -> list[str]:
    found = []
    for path in sorted(PARALLEL.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for line, attr in _foreign_private(tree):
            if (path.name, attr) not in ALLOWED:
                found.append(f"{path.name}:{line}: .{attr}")
    return found


def test_no_parallel_module_reaches_into_another_objects_private_parts():
    assert _offences() == []


def test_every_allowance_is_used_and_has_a_reason():
    used = set()
    for path in sorted(PARALLEL.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        used |= {(path.name, attr) for _line, attr in _foreign_private(tree)}
    assert set(ALLOWED) <= used, set(ALLOWED) - used
    assert all(len(reason) > 20 for reason in ALLOWED.values())


def test_the_check_sees_a_foreign_private_attribute():
    code = (
        "class A:\n"
        "    def f(self, pool):\n"
        "        self._mine = pool._theirs\n"
        "        self.x._y = super()._z + cls._w + type(self).__name__\n"
        "        return mod._private, getattr(pool, '_door', None), getattr(self, '_ok')\n"
    )
    found = sorted(attr for _line, attr in _foreign_private(ast.parse(code)))
    assert found == ["_door", "_private", "_theirs", "_y"]
