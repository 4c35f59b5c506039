"""Long soak of the pool under worker kills: the CI torture (tests/pool_kill_torture.py) for
as many rounds as you like. Each round runs three calls from three threads, kills a worker at
a random instant and checks that every call returned the right results or raised
WorkerDiedError, that nothing hung, and that a call made once the victim is dead succeeds.

    .venv/bin/python benches/pool_kill_soak.py --rounds 500 [--start-method spawn]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import pool_kill_torture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = pool_kill_torture.run(args.rounds, start_method=args.start_method, seed=args.seed)
    for p in out.problems:
        print("PROBLEM", p)
    print(
        f"{args.start_method}: {out.rounds} rounds, {len(out.problems)} problems, "
        f"{out.ok} calls ok, {out.died} failed with WorkerDiedError{' (HUNG)' if out.hung else ''}"
    )
    return 1 if out.problems else 0


if __name__ == "__main__":
    sys.exit(main())
