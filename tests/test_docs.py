"""The README's and docs' Python snippets run, and say what they do.

Each document's ```python blocks run in order in one namespace, in a temporary directory that
holds the yaml files the document shows (a ```yaml block whose name, in backticks, ends the
text before it). What a snippet claims is checked:

* ``stmt  # SomeError: ...`` must raise an exception of that class (or a subclass);
* ``expr  # <a Python literal>`` must evaluate to that value;
* ``>>> code`` lines followed by output must print (or show) that output, and an output line
  ``SomeError: message`` means that exception with a message that starts that way.

Blocks that need the network, placeholder paths or code the reader writes are skipped by
name below, with the reason; so are single statements that name a remote file system. Each
document runs in its own interpreter (snippets register path handlers, for example). The
README's quick start runs as a script (it starts processes under
``if __name__ == "__main__":``).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [
    "README.md",
    "docs/config.md",
    "docs/paths.md",
    "docs/bench.md",
    "docs/pool.md",
    "docs/shm.md",
    "docs/memory.md",
]

# (document, first words of the block) -> why it does not run here
SKIP = {
    ("docs/config.md", 'cfg = CN.open("trusted.yaml"'): "a file the reader trusts (none here)",
    ("docs/config.md", "import sys"): "reads the command line (sys.argv[1:])",
    ("docs/config.md", "model = MODEL_REGISTRY.get(cfg.MODEL.NAME)"): "a reader's model class",
    ("docs/paths.md", "from easycore.common.path import PathManager\n\n# open"): "placeholder "
    "paths (/path/to/...)",
    ("docs/paths.md", "from easycore.common.path import PathManager\n\nwith"): "network",
    ("docs/paths.md", "from easycore.common.network import download_file"): "network",
    ("docs/paths.md", "from easycore.common.path import PathManager, RedirectPathHandler"): (
        "network"
    ),
    ("docs/paths.md", "from easycore.common.path import PathManager, HTTPURLHandler"): "network",
    ("docs/paths.md", "import os\nfrom easycore.common.path import file_lock"): "placeholder "
    "paths (/path/to/...)",
    ("docs/bench.md", "# mypkg/jobs.py"): "a template for the reader's own runner",
    ("README.md", "from easycore.common.parallel import OrderedRunner\nfrom easycore.parallel"): (
        "starts a Ray instance; the same code runs in docs/ray.md, which tests/test_ray.py "
        "runs on its local cluster"
    ),
}


@dataclass
class Block:
    doc: str
    line: int
    code: str
    lang: str
    name: str | None  # a file name given just before the block (yaml fixtures)


def blocks(doc: str) -> list[Block]:
    text = (REPO / doc).read_text()
    out = []
    for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S):
        before = text[: m.start()].rstrip()
        name = re.search(r"`([\w./-]+\.ya?ml)`\)?:?$", before)
        out.append(
            Block(
                doc,
                text[: m.start()].count("\n") + 1,
                m.group(2),
                m.group(1),
                name.group(1) if name else None,
            )
        )
    return out


def skip_reason(b: Block) -> str | None:
    for (doc, start), why in SKIP.items():
        if b.doc == doc and b.code.startswith(start):
            return why
    return None


_REMOTE = re.compile(r'(?<!memory)://|"s3"')
"""A statement that reaches a remote file system (``memory://`` is local)."""


def _comments(code: str) -> dict[int, str]:
    """Line number (1-based) -> the text of the comment on that line."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string.lstrip("#").strip()
    return found


def _expected_error(comment: str) -> str | None:
    m = re.match(r"(\w+(?:Error|Exception))\b", comment)
    return m.group(1) if m else None


def _raised_as(exc: BaseException, name: str) -> bool:
    return any(c.__name__ == name for c in type(exc).__mro__)


def run_statements(code: str, ns: dict[str, Any], where: str) -> int:
    """Runs ``code`` one top-level statement at a time, checking the claims in its comments;
    returns how many claims were checked."""
    tree = ast.parse(code)
    comments = _comments(code)
    checked = 0
    for stmt in tree.body:
        if _REMOTE.search(ast.get_source_segment(code, stmt) or ""):
            continue
        lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        claim = next((comments[n] for n in lines if n in comments), None)
        error = _expected_error(claim) if claim else None
        literal: Any = None
        has_literal = False
        if claim and isinstance(stmt, ast.Expr) and error is None:
            with contextlib.suppress(ValueError, SyntaxError):
                literal, has_literal = ast.literal_eval(claim), True
        module = ast.Module(body=[stmt], type_ignores=[])
        if error:
            with pytest.raises(Exception) as info:  # noqa: PT011 - the class is checked below
                exec(compile(module, where, "exec"), ns)
            assert _raised_as(info.value, error), f"{where}:{stmt.lineno}: {info.value!r}"
            checked += 1
        elif has_literal:
            assert isinstance(stmt, ast.Expr)
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), ns)
            assert value == literal, f"{where}:{stmt.lineno}: {value!r} != {literal!r}"
            checked += 1
        else:
            exec(compile(module, where, "exec"), ns)
    return checked


def run_session(code: str, ns: dict[str, Any], where: str) -> int:
    """Runs a ``>>>`` session, checking each shown output."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith(">>> "):
            steps.append((line[4:], []))
        elif line.startswith("... ") and steps:
            steps[-1] = (steps[-1][0] + "\n" + line[4:], steps[-1][1])
        elif steps and line.strip():
            steps[-1][1].append(line)
    checked = 0
    for source, expected in steps:
        error = re.match(r"(\w+(?:Error|Exception)): (.*)", expected[0]) if expected else None
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                try:
                    value = eval(compile(source, where, "eval"), ns)
                except SyntaxError:
                    exec(compile(source, where, "exec"), ns)
                    value = None
                if value is not None:
                    print(repr(value))
        except Exception as e:
            assert error, f"{where}: {source!r} raised {e!r}"
            assert _raised_as(e, error.group(1)), f"{where}: {source!r} raised {e!r}"
            message = " ".join([error.group(2), *expected[1:]])
            assert " ".join(str(e).split()).startswith(message), f"{e} != {message}"
            checked += 1
            continue
        assert not error, f"{where}: {source!r} did not raise {error.group(1)}"
        if expected:
            assert out.getvalue().strip() == "\n".join(expected), (out.getvalue(), expected)
            checked += 1
    return checked


def run_doc(doc: str, workdir: Path) -> tuple[int, int, int]:
    """Runs ``doc``'s snippets in ``workdir``; returns (blocks run, skipped, claims checked)."""
    os.chdir(workdir)
    os.environ["EASYCORE_CACHE"] = str(workdir / "cache")
    ns: dict[str, Any] = {"__name__": "__doc_snippets__"}
    ran = skipped = checked = 0
    for b in blocks(doc):
        if b.lang in ("yaml", "yml") and b.name:
            (workdir / b.name).write_text(b.code)
            continue
        if b.lang != "python":
            continue
        if skip_reason(b):
            skipped += 1
            continue
        where = f"{doc}:{b.line}"
        if b.code.lstrip().startswith(">>>"):
            checked += run_session(b.code, ns, where)
        else:
            checked += run_statements(b.code, ns, where)
        ran += 1
    return ran, skipped, checked


@pytest.mark.parametrize("doc", [d for d in DOCS if d != "README.md"])
def test_doc_snippets_run(doc: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, __file__, doc, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran, skipped, checked = map(int, proc.stdout.split()[-3:])
    assert ran + skipped > 0
    if doc == "docs/config.md":  # most of its snippets run, and their claims hold
        assert ran >= 18 and checked >= 7, (ran, checked)
    if doc == "docs/paths.md":  # the fsspec memory:// example, and what listdir shows
        assert ran >= 1 and checked >= 1, (ran, checked)


def test_skip_list_names_real_blocks() -> None:
    """Every skip entry matches a block, so a renamed snippet is not silently untested."""
    for doc, start in SKIP:
        assert any(b.code.startswith(start) for b in blocks(doc)), (doc, start)


def test_doc_references_name_real_files() -> None:
    """Every relative Markdown link, and every document named in backticks (`docs/pool.md`,
    or `pool.md` from another doc), in the README and the docs names a file that exists."""
    missing = []
    docs = sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("docs/*.md"))
    for doc in ["README.md", *docs]:
        text = (REPO / doc).read_text()
        here = (REPO / doc).parent
        refs = [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)]
        refs = [r for r in refs if r and "://" not in r and not r.startswith("mailto:")]
        named = re.findall(r"`((?:docs/)?[\w-]+\.md)`", text)
        for ref in refs + named:
            base = REPO if ref.startswith("docs/") else here
            if not (base / ref).exists():
                missing.append(f"{doc}: {ref}")
    assert not missing, missing


def test_readme_quick_start(tmp_path: Path) -> None:
    (quick,) = [b for b in blocks("README.md") if b.lang == "python"][:1]
    script = tmp_path / "quickstart.py"
    script.write_text(quick.code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "328350"  # what the snippet's comment says
    assert lines[1] == str(sum(i * i for i in range(10**6)))
    # An UnorderedRunner's imap yields in completion order (a call's first batch is one
    # item, and the rest may come back first).
    assert sorted(lines[2:12], key=int) == [str(i * i) for i in range(10)]
    assert lines[12] == "328350"
    verdicts = ("producers", "the consumer", "the input", "sending", "per-item", "balanced")
    assert len(lines) == 14 and lines[13].startswith(verdicts)  # stats.bottleneck()


def _printed_claims(code: str) -> list[str]:
    """What the ``print(...)  # <a Python literal>`` lines of ``code`` claim to print."""
    claims = []
    for n, comment in _comments(code).items():
        if "print(" not in code.splitlines()[n - 1]:
            continue
        with contextlib.suppress(ValueError, SyntaxError):
            claims.append(str(ast.literal_eval(comment)))
    return claims


@pytest.mark.timeout(900)
def test_readme_examples_run_as_scripts(tmp_path: Path) -> None:
    """The README's other examples (pool, queue, shm, config...) run as the scripts they are
    (they start processes under ``if __name__ == "__main__":``), and print what they say."""
    ran = checked = 0
    for b in [b for b in blocks("README.md") if b.lang == "python"][1:]:
        if skip_reason(b):
            continue
        script = tmp_path / f"readme_{b.line}.py"
        script.write_text(b.code)
        proc = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, f"README.md:{b.line}: {proc.stderr}"
        lines = proc.stdout.splitlines()
        for claim in _printed_claims(b.code):
            assert claim in lines, f"README.md:{b.line}: {claim!r} not in {lines!r}"
            checked += 1
        ran += 1
    assert ran >= 4 and checked >= 3, (ran, checked)


if __name__ == "__main__":
    print(*run_doc(sys.argv[1], Path(sys.argv[2])))
