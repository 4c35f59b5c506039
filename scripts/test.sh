#!/usr/bin/env bash
# Build everything and run every test: the Rust core's (cargo test) and the Python suite.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$root"
echo "== cargo test (Rust core)"
cargo test --lib
echo "== ruff"
ruff check .
echo "== pytest"
python -m pytest "$@"
