#!/usr/bin/env bash
# Cross-builds the aarch64 manylinux2014 (glibc 2.17) abi3 wheel into dist/ on an x86_64
# Debian 12 machine, checks its tag with auditwheel, and runs the README's quick start with it
# on an aarch64 CPython under qemu user-mode emulation. Called by scripts/wheels.sh.
#
# rustup's toolchain here has only the x86_64 standard library and cannot fetch another, so
# the compiler comes from Debian's packages instead: rustc-web (a current Rust) and its
# standard library for amd64 (build scripts, proc macros) and arm64 (the wheel). zig links,
# as for x86_64. qemu-user-static and Debian's arm64 python3.11 run the check. Everything is
# downloaded with `apt-get download` against a private package index and unpacked under
# .venv-aarch64/ (git-ignored): nothing is installed on the system, no root needed beyond
# what apt-get download needs. Takes about 3 minutes the first time (~400 MB of packages).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tc="$root/.venv-aarch64"
apt_opts=(-o "Dir::State::Lists=$tc/apt/lists" -o "Dir::Cache=$tc/apt/cache"
          -o "APT::Architectures::=amd64" -o "APT::Architectures::=arm64" -o "Debug::NoLocking=1")
sysroot="$tc/rust"  # Debian's rustc with both standard libraries: its own sysroot
armroot="$tc/arm64"  # qemu-aarch64-static and an arm64 CPython 3.11

fetch() {  # fetch DIR PACKAGE... : download and unpack into DIR
    local dest=$1
    shift
    mkdir -p "$tc/debs" "$dest"
    (cd "$tc/debs" && rm -f ./*.deb && apt-get "${apt_opts[@]}" download "$@" >/dev/null)
    for deb in "$tc"/debs/*.deb; do dpkg -x "$deb" "$dest"; done
    rm -f "$tc"/debs/*.deb
}

if [ ! -x "$tc/rustc" ]; then
    echo "== aarch64: fetching Debian's rustc-web and its arm64 standard library"
    rm -rf "$tc"
    mkdir -p "$tc/apt/lists/partial" "$tc/apt/cache/archives/partial"
    apt-get "${apt_opts[@]}" update -qq
    version=$(apt-cache "${apt_opts[@]}" show rustc-web | sed -n 's/^Version: //p' | head -1)
    minor=$(sed -E 's/^([0-9]+\.[0-9]+).*/\1/' <<<"$version")
    llvm=$(apt-cache "${apt_opts[@]}" show "libstd-rust-web-$minor=$version" |
        grep -m1 '^Depends:' | grep -o 'libllvm[0-9]*' | head -1)
    fetch "$sysroot" "rustc-web=$version" "libstd-rust-web-$minor:amd64=$version" \
        "libstd-rust-web-dev:amd64=$version" "libstd-rust-web-dev:arm64=$version" "$llvm:amd64"
    cat >"$tc/rustc" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$sysroot/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
    exec "$sysroot/usr/bin/rustc" "\$@"
EOF
    chmod +x "$tc/rustc"
    echo "== aarch64: fetching qemu-user-static and Debian's arm64 python3.11"
    fetch "$armroot" qemu-user-static:amd64 python3.11-minimal:arm64 \
        libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 libc6:arm64 libexpat1:arm64 \
        zlib1g:arm64 libffi8:arm64 libssl3:arm64 libgcc-s1:arm64 libbz2-1.0:arm64 \
        liblzma5:arm64 libuuid1:arm64 libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 \
        libcrypt1:arm64 libnsl2:arm64 libtirpc3:arm64 libdb5.3:arm64
fi
"$tc/rustc" --version

echo "== wheel: manylinux2014 aarch64-unknown-linux-gnu (Debian's rustc, maturin --zig)"
rm -f dist/easycore-*_aarch64.whl
# Its own target dir: another compiler's artifacts must not mix with rustup's.
RUSTC="$tc/rustc" CARGO_TARGET_DIR="$root/target/aarch64-debian" \
    maturin build --release --zig --compatibility manylinux2014 \
    --target aarch64-unknown-linux-gnu -o dist
wheel=$(ls dist/easycore-*-manylinux*_aarch64.whl)
report=$(auditwheel show "$wheel")
echo "$report"
if ! grep -q '"manylinux_2_17_aarch64"' <<<"$report"; then
    echo "aarch64-wheel.sh: $wheel is not manylinux_2_17 (glibc 2.17) compatible" >&2
    exit 1
fi

echo "== aarch64: the README quick start on aarch64 CPython (qemu user mode)"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python -m pip download -q --only-binary :all: --platform manylinux2014_aarch64 \
    --python-version 3.11 --implementation cp -d "$site/dl" pyyaml tqdm
for w in "$wheel" "$site"/dl/*.whl; do python -m zipfile -e "$w" "$site/lib"; done
python - README.md "$site/quickstart.py" <<'PY'
import re, sys
section = open(sys.argv[1]).read().split("## Quick start", 1)[1]
open(sys.argv[2], "w").write(re.search(r"```python\n(.*?)```", section, re.S).group(1))
PY
arm_python=("$armroot/usr/bin/qemu-aarch64-static" -L "$armroot" "$armroot/usr/bin/python3.11")
machine=$("${arm_python[@]}" -c 'import platform; print(platform.machine())')
out=$(cd "$site" && PYTHONPATH="$site/lib" timeout 600 "${arm_python[@]}" quickstart.py \
    2>"$site/stderr") || { cat "$site/stderr" >&2; exit 1; }
echo "$machine"
echo "$out" | head -2
if [ "$machine" != aarch64 ] || [ "$(sed -n 1p <<<"$out")" != 328350 ]; then
    echo "aarch64-wheel.sh: the quick start did not print 328350 on aarch64" >&2
    exit 1
fi
echo "aarch64-wheel.sh: $(basename "$wheel") runs the quick start on aarch64"
