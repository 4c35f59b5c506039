"""Long soak of the queue's crash model: the CI torture (tests/crash_torture.py), for as many
rounds and kills as you like. Each round kills writers and readers at random instants (a
fifth SIGSTOPped first) and checks that nothing acknowledged is lost (beyond what killed
readers held), nothing is duplicated or corrupt, nothing hangs, and the counters match the
ring.

    .venv/bin/python benches/crash_soak.py --rounds 20 --kills 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import crash_torture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--kills", type=int, default=2000, help="kills per round")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--readers", type=int, default=2)
    args = ap.parse_args()
    bad = 0
    total_kills = 0
    for rnd in range(args.rounds):
        victims = ("any", "writers", "readers")[rnd % 3]
        t = time.monotonic()
        out = crash_torture.run(
            args.kills, writers=args.writers, readers=args.readers, seed=rnd, victims=victims
        )
        total_kills += out.kills
        allowed = 0 if victims == "writers" else crash_torture.READ_BATCH * out.reader_kills
        problems = []
        if out.hung:
            problems.append(f"hung {out.hung}")
        if out.corrupt:
            problems.append(f"{len(out.corrupt)} corrupt")
        if out.duplicates:
            problems.append(f"{out.duplicates} duplicated")
        if len(out.missing) > allowed:
            problems.append(f"{len(out.missing)} lost (allowed {allowed})")
        if out.audit_error:
            problems.append(f"audit: {out.audit_error}")
        bad += bool(problems)
        print(
            f"round {rnd:3d} victims={victims:7s} kills={out.kills} stops={out.stops} "
            f"acked={len(out.acked)} received={len(out.received)} missing={len(out.missing)} "
            f"{time.monotonic() - t:.1f}s {'; '.join(problems) or 'ok'}",
            flush=True,
        )
    print(f"{args.rounds} rounds, {total_kills} kills, {bad} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
