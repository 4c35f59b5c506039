"""Optional dependencies (extras): without them, easycore says which extra to install."""

from __future__ import annotations

import subprocess
import sys


def _run_without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter in which ``module`` cannot be imported."""
    prelude = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120
    )


def test_torch_runners_without_torch_name_the_extra() -> None:
    proc = _run_without(
        "torch",
        "try:\n"
        "    import easycore.torch.parallel\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n",
    )
    assert proc.returncode == 0, proc.stderr
    name, _, message = proc.stdout.partition(" | ")
    assert name == "torch"  # code that checks e.name keeps working
    assert "pip install 'easycore[torch]'" in message


def test_core_imports_without_torch_or_numpy() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import easycore, easycore.common.parallel, easycore.common.config, "
        "easycore.common.registry, easycore.common.path\n"
        "print('ok')\n"
    )
    proc = _run_without("torch", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
