#!/usr/bin/env bash
# The main job: build everything, run the manual's examples, then a short benchmark table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$root"
echo "== running the examples"
for ex in examples/*.py; do
    case "$ex" in */network.py) continue ;; esac
    echo "-- $ex"
    (cd examples && python "$(basename "$ex")")
done
echo "== queue benchmark (quick)"
python benches/queue_bench.py --quick
echo "== runner benchmark (quick)"
python -m easycore.bench --quick
