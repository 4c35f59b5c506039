#!/usr/bin/env bash
# Build everything and run every test: the Rust core's (cargo test), lint, type checks, the
# Python suite and, on a full run, the release wheel installed where no Rust is and on the
# other CPython versions (3.12, 3.13) the machine has.
#   bash scripts/test.sh                  # everything
#   bash scripts/test.sh -q -x tests/X    # focused: pytest arguments; skips the wheel check
#                                         # unless EASYCORE_WHEEL_CHECK=1 (CI=true always runs it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$root"
echo "== cargo test (Rust core)"
cargo test --lib
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy (python/easycore, strict; see [tool.mypy] in pyproject.toml)"
python -m mypy
echo "== stubtest (python/easycore/_core.pyi against the built module)"
python -m mypy.stubtest easycore._core --allowlist scripts/stubtest-allowlist.txt
echo "== pytest"
python -m pytest "$@"
if [ "${CI:-}" = true ] || [ $# -eq 0 ] || [ "${EASYCORE_WHEEL_CHECK:-0}" = 1 ]; then
    echo "== release wheel: build (manylinux2014), install without Rust, quick start"
    bash scripts/wheels.sh --wheel
    bash scripts/check-wheel.sh
    echo "== the same wheel on CPython 3.12 and 3.13: pool, queue and runner suites"
    bash scripts/other-pythons.sh
fi
