#!/usr/bin/env bash
# Installs the abi3 wheel from dist/ (scripts/wheels.sh builds it) into a slim venv for each
# other CPython it finds (3.12, 3.13: the wheel's one build serves every CPython from 3.11 on)
# and runs the pool, queue and runner suites there (CPython's own pool suites too, where the
# interpreter ships them), against the installed wheel rather than
# the source tree. The venvs hold the test tools, numpy and the package's own dependencies;
# no torch, no Ray (those tests skip). Called by scripts/test.sh on a full run.
#
# Interpreters: $EASYCORE_PYTHONS (space-separated paths) if set, else python3.12/python3.13
# on PATH, else pyenv's ~/.pyenv/versions/3.12.*/3.13.*. A version that is not found is
# reported and skipped; under CI=true at least one must be found.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
wheel=$(ls dist/easycore-*-manylinux*_"$(uname -m)"*.whl)

find_python() {  # $1 = "3.12"
    local p
    # pyenv's shims are on PATH for versions that are installed but not selected, and fail
    # when run: only an interpreter that runs counts.
    for p in "$(command -v "python$1" 2>/dev/null)" "$HOME"/.pyenv/versions/"$1".*/bin/python; do
        if [ -x "$p" ] && "$p" -c 'import sys' >/dev/null 2>&1; then echo "$p"; return; fi
    done
}

if [ -n "${EASYCORE_PYTHONS:-}" ]; then
    read -r -a pythons <<<"$EASYCORE_PYTHONS"
else
    pythons=()
    for v in 3.12 3.13; do
        p=$(find_python "$v")
        if [ -n "$p" ]; then pythons+=("$p"); else echo "== CPython $v: not found, skipped"; fi
    done
fi
if [ "${#pythons[@]}" -eq 0 ]; then
    if [ "${CI:-}" = true ]; then
        echo "other-pythons.sh: no CPython 3.12 or 3.13 found" >&2
        exit 1
    fi
    exit 0
fi

suites=(tests/test_pool.py tests/test_pool_dropin.py tests/test_pool_forks.py tests/test_pool_queue.py
        tests/test_queue.py tests/test_runner.py tests/test_stdlib_conformance.py
        tests/test_consumer_thread.py tests/test_pool_caller_receives.py)
for py in "${pythons[@]}"; do
    version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    venv="$root/.venv-py$version"
    echo "== CPython $version ($py): the wheel and the pool, queue and runner suites"
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv"
    fi
    [ "${CI:-}" = true ] && export PIP_NO_CACHE_DIR=1
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        pytest pytest-timeout hypothesis numpy pyyaml tqdm cloudpickle fsspec
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall \
        --no-deps "$wheel"
    # From a folder without python/ on sys.path, so the tests import the installed wheel.
    (cd tests && "$venv/bin/python" - <<'PY'
import easycore, os, sys
assert "site-packages" in easycore.__file__, easycore.__file__
print(f"   easycore from {os.path.dirname(easycore.__file__)} on {sys.version.split()[0]}")
PY
    )
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$root" "${suites[@]}"
done
