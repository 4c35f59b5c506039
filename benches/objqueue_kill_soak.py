"""Long soak of the object queue (easycore.parallel.Queue) under kills: the CI torture
(tests/objqueue_torture.py) for as many rounds as you like. Each round runs three writer and
two reader processes on one small queue, kills one of them at a random point of its stream
and checks that every object arrived whole and in order, that nothing else was lost, that
nothing hung and that nothing was left in /dev/shm.

    .venv/bin/python benches/objqueue_kill_soak.py --rounds 500 [--start-method spawn]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import objqueue_torture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = objqueue_torture.run(args.rounds, start_method=args.start_method, seed=args.seed)
    for p in out.problems:
        print("PROBLEM", p)
    print(
        f"{args.start_method}: {out.rounds} rounds, {len(out.problems)} problems, "
        f"{out.writers_killed} writers and {out.readers_killed} readers killed"
        f"{' (HUNG)' if out.hung else ''}"
    )
    return 1 if out.problems else 0


if __name__ == "__main__":
    sys.exit(main())
