#!/usr/bin/env bash
# Builds the release set into dist/: one abi3 wheel for CPython 3.11+ on x86_64 Linux with
# glibc 2.17 or later (manylinux2014: Debian 9+, Ubuntu 18.04+, RHEL/CentOS 7+, Amazon Linux
# 2), and the sdist (which pip builds anywhere else, with a Rust toolchain). zig, from the
# ziglang package on PyPI, links the wheel against glibc 2.17, so no manylinux container is
# needed; auditwheel then checks the tag the wheel claims.
#
# The aarch64 wheel (same tag) is cross-built by scripts/aarch64-wheel.sh with Debian's
# Rust packages (rustup's toolchain here has only the x86_64 standard library) and checked
# under qemu; .github/workflows/release.yml builds both natively on GitHub's runners.
#
# Usage: bash scripts/wheels.sh            # x86_64 + aarch64 wheels + sdist into dist/
#        bash scripts/wheels.sh --wheel    # the x86_64 wheel only (what scripts/test.sh checks)
#        EASYCORE_AARCH64=0 bash scripts/wheels.sh   # no aarch64 wheel
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
    if [ "${EASYCORE_AARCH64:-1}" != 0 ]; then
        bash scripts/aarch64-wheel.sh
    fi
    echo "== sdist"
    maturin sdist -o dist
fi
ls -l dist/
