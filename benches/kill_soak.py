"""Long soaks under kills: a CI torture from tests/ for as many rounds as you like.

* ``pool`` (tests/pool_kill_torture.py): three threads call one Pool while a worker is killed
  at a random instant; every call must return the right results or raise WorkerDiedError,
  nothing may hang, and a call made once the victim is dead must succeed.
* ``objqueue`` (tests/objqueue_torture.py): three writers and two readers share one small
  object Queue while one of them is killed at a random point of its stream; every object
  must arrive whole and in order, nothing else may be lost or hang, and nothing may be left
  in /dev/shm.

    .venv/bin/python benches/kill_soak.py pool --rounds 500 [--start-method spawn]
    .venv/bin/python benches/kill_soak.py objqueue --rounds 500 [--seed 3]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

TORTURES = {"pool": "pool_kill_torture", "objqueue": "objqueue_torture"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=sorted(TORTURES))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--maxtasksperchild", type=int, help="pool only: workers recycled after this many tasks"
    )
    args = ap.parse_args()
    torture = importlib.import_module(TORTURES[args.what])
    extra = {} if args.maxtasksperchild is None else {"maxtasksperchild": args.maxtasksperchild}
    if extra and args.what != "pool":
        ap.error("--maxtasksperchild is the pool's")
    out = torture.run(args.rounds, start_method=args.start_method, seed=args.seed, **extra)
    for p in out.problems:
        print("PROBLEM", p)
    print(f"{args.what}, {args.start_method}: {out.summary()}")
    return 1 if out.problems else 0


if __name__ == "__main__":
    sys.exit(main())
