"""What a type checker sees of easycore: each documented form of ``Registry.register`` has its
exact type (the decorated class or function keeps its own), and the extension's stubs are
usable on Python 3.11. Runs mypy in-process on small snippets (skipped without mypy)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")


def _mypy(tmp_path: Path, source: str) -> tuple[list[str], list[str]]:
    """Runs ``mypy --strict`` on ``source``; returns (revealed types, error lines)."""
    path = tmp_path / "snippet.py"
    path.write_text(textwrap.dedent(source))
    out, err, _ = mypy_api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--python-version",
            "3.11",
            str(path),
        ]
    )
    assert not err, err
    revealed = re.findall(r'Revealed type is "(.*)"', out)
    errors = [line for line in out.splitlines() if ": error:" in line]
    return revealed, errors


def test_every_register_form_has_its_exact_type(tmp_path: Path) -> None:
    revealed, errors = _mypy(
        tmp_path,
        """
        from easycore.common.registry import Registry

        REG = Registry("MODEL")

        @REG.register()
        class ResNet50:
            depth = 50

        @REG.register("resnet18", override=True)
        class ResNet18:
            depth = 18

        @REG.register
        def build(x: int) -> str:
            return str(x)

        reveal_type(ResNet50().depth)
        reveal_type(ResNet18().depth)
        reveal_type(build)
        reveal_type(REG.register("a", ResNet50))
        reveal_type(REG.register(obj=ResNet50))
        model: ResNet50 = ResNet50()
        """,
    )
    assert errors == []
    assert revealed == ["int", "int", "def (x: int) -> str", "None", "None"]


def test_register_rejects_what_it_rejects_at_run_time(tmp_path: Path) -> None:
    # A non-callable, non-str name is an InvalidArgument at run time: a type error too.
    _, errors = _mypy(
        tmp_path,
        """
        from easycore.common.registry import Registry

        Registry("R").register(3)
        """,
    )
    assert len(errors) == 1 and "No overload variant" in errors[0]


def test_core_stubs_check_on_python_311(tmp_path: Path) -> None:
    revealed, errors = _mypy(
        tmp_path,
        """
        from easycore._core import FileLock, Queue, ReorderBuffer, ShmBuffer

        q = Queue(1 << 20)
        q.put(0, 1, [b"x", memoryview(b"y")])
        reveal_type(q.get(timeout=1.0))
        reveal_type(ReorderBuffer(8).pop_ready())
        with FileLock("/tmp/x", timeout=1.0) as lock:
            reveal_type(lock)

        def view(buf: ShmBuffer) -> memoryview:
            return memoryview(buf)
        """,
    )
    assert errors == []
    assert revealed == [
        "tuple[int, int, list[typing_extensions.Buffer]]",
        "list[object]",
        "easycore._core.FileLock",
    ]
