#!/usr/bin/env bash
# Creates .venv (if missing), installs requirements-dev.txt and builds easycore's Rust
# extension into it (release build, editable install). Sourced by main.sh, test.sh and
# wheels.sh (which sets EASYCORE_DEVELOP=0: it builds wheels, not the editable install).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($py --version)"
    "$py" -m venv .venv
fi
export VIRTUAL_ENV="$root/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
stamp=.venv/.requirements-installed
if [ ! -f "$stamp" ] || ! cmp -s requirements-dev.txt "$stamp"; then
    echo "== installing requirements-dev.txt (torch is large: the first time takes minutes)"
    # torch's wheels and the CUDA libraries they pull in take about 8 GB installed. pip's cache
    # would hold a second copy of their 3.5 GB of wheels, which a fresh CI machine never reads
    # again, so CI installs without it; torch goes first, on its own, so that its downloaded
    # wheels are gone before the rest arrive (the peak is then about 10 GB, not 15).
    if [ "${CI:-}" = true ]; then
        export PIP_NO_CACHE_DIR=1
    fi
    free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
    if [ "$free_gb" -lt 11 ]; then
        echo "setup-env.sh: warning: $free_gb GB free on $(df -P . | awk 'NR == 2 { print $6 }');" \
             "the install needs about 11 GB while it runs (8 GB after)" >&2
    fi
    python -m pip install -q --upgrade pip
    python -m pip install -q "$(grep -E '^torch==' requirements-dev.txt)"
    python -m pip install -q -r requirements-dev.txt
    cp requirements-dev.txt "$stamp"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo (Rust) is required to build easycore: https://rustup.rs" >&2
    exit 1
fi
if [ "${EASYCORE_DEVELOP:-1}" != 0 ]; then
    echo "== building easycore (Rust extension, release)"
    maturin develop --release -q
fi
