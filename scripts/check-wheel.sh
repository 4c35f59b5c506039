#!/usr/bin/env bash
# Installs the wheel for this machine's architecture from dist/ (scripts/wheels.sh builds
# x86_64; the release workflow aarch64 too) into a fresh venv, with no Rust toolchain on PATH
# and binary packages only, then runs the README's quick start there. That venv has neither torch nor numpy, so it also checks that the extras' messages
# (easycore[torch], easycore[bench]) reach a real user. Called by scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
wheel=$(ls dist/easycore-*-manylinux*_"$(uname -m)"*.whl)
venv="$root/.venv-wheel"
py="${PYTHON:-python3}"
rm -rf "$venv"
"$py" -m venv "$venv"
# Only the new venv and the system's own directories: no ~/.cargo/bin, no .venv. pip's own
# settings (index, certificates, proxies) pass through.
clean=(env -i "HOME=$HOME" "PATH=$venv/bin:/usr/local/bin:/usr/bin:/bin" "LANG=C.UTF-8"
       "PIP_DISABLE_PIP_VERSION_CHECK=1")
while IFS= read -r var; do
    clean+=("$var=${!var}")
done < <(compgen -e | grep -E '^(PIP_|SSL_CERT_|REQUESTS_CA_BUNDLE$|(https?|no|all)_proxy$|(HTTPS?|NO|ALL)_PROXY$)' || true)
if "${clean[@]}" sh -c 'command -v cargo || command -v rustc' >/dev/null; then
    echo "check-wheel.sh: a Rust toolchain is on the clean PATH; the check would prove nothing" >&2
    exit 1
fi
echo "== installing $(basename "$wheel") into a fresh venv (no Rust, binaries only)"
"${clean[@]}" python -m pip install -q --only-binary :all: "$wheel"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The README's quick start, exactly as written (the first python block under "Quick start").
"$venv/bin/python" - README.md "$work/quickstart.py" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("## Quick start", 1)[1]
code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
open(sys.argv[2], "w").write(code)
PY
echo "== README quick start, from the installed wheel"
out=$(cd "$work" && "${clean[@]}" timeout 300 python quickstart.py 2>"$work/stderr") || {
    cat "$work/stderr" >&2; exit 1; }
echo "$out" | head -3
first=$(echo "$out" | head -1)
second=$(echo "$out" | sed -n 2p)
if [ "$first" != 328350 ] || [ "$second" != 333332833333500000 ]; then
    echo "check-wheel.sh: the quick start printed $first / $second, not 328350 / 333332833333500000" >&2
    exit 1
fi
echo "== extras' messages (this venv has no torch and no numpy)"
fail() { echo "check-wheel.sh: $1" >&2; exit 1; }
msg=$(cd "$work" && "${clean[@]}" python -c 'import easycore.torch.parallel' 2>&1) &&
    fail "easycore.torch.parallel imported without torch"
grep -q "pip install 'easycore\[torch\]'" <<<"$msg" || { echo "$msg" >&2; exit 1; }
msg=$(cd "$work" && "${clean[@]}" easycore-bench --list 2>&1) &&
    fail "easycore-bench ran without numpy"
grep -q "pip install 'easycore\[bench\]'" <<<"$msg" || { echo "$msg" >&2; exit 1; }
if grep -q Traceback <<<"$msg"; then echo "$msg" >&2; exit 1; fi
echo "check-wheel.sh: the wheel installs without Rust and runs the quick start"
