#!/usr/bin/env bash
# Builds the release set into dist/: one abi3 wheel for CPython 3.11+ on x86_64 Linux with
# glibc 2.17 or later (manylinux2014: Debian 9+, Ubuntu 18.04+, RHEL/CentOS 7+, Amazon Linux
# 2), and the sdist (which pip builds anywhere else, with a Rust toolchain). zig, from the
# ziglang package on PyPI, links the wheel against glibc 2.17, so no manylinux container is
# needed; auditwheel then checks the tag the wheel claims.
#
# aarch64 wheels are built by .github/workflows/release.yml on a runner that can (this
# machine's Rust toolchain has only the x86_64 standard library).
#
# Usage: bash scripts/wheels.sh            # wheel + sdist into dist/
#        bash scripts/wheels.sh --wheel    # the wheel only (what scripts/test.sh checks)
set -euo pipefail
EASYCORE_DEVELOP=0
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$root"
target=x86_64-unknown-linux-gnu
rm -f dist/easycore-*
echo "== wheel: manylinux2014 $target (maturin --zig)"
maturin build --release --zig --compatibility manylinux2014 --target "$target" -o dist
wheel=$(ls dist/easycore-*-manylinux*_x86_64*.whl)
echo "== auditwheel show $(basename "$wheel")"
report=$(auditwheel show "$wheel")
echo "$report"
if ! grep -q '"manylinux_2_17_x86_64"' <<<"$report"; then
    echo "wheels.sh: $wheel is not manylinux_2_17 (glibc 2.17) compatible" >&2
    exit 1
fi
if [ "${1:-}" != "--wheel" ]; then
    echo "== sdist"
    maturin sdist -o dist
fi
ls -l dist/
