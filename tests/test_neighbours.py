"""The neighbour model (docs/safety.md): another local user (uid 65534) squats, plants, locks,
deletes and fills names in /dev/shm while easycore works; each scenario ends in a correct
result or a clear error within its deadline, and no code of the other user ever runs.

Each scenario (tests/neighbours.py) runs as root in a private mount namespace with a fresh
tmpfs on /dev/shm (``unshare -m``), so the machine's real /dev/shm is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("neighbours.py")
MARK = "/dev/shm/.private-for-neighbour-tests"
# Mount a fresh tmpfs (world-writable and sticky, like the real one; 256 MiB) on /dev/shm in
# a private mount namespace, mark it, then run the scenario.
WRAP = (
    "mount --make-rprivate / && mount -t tmpfs -o mode=1777,size=256m ec-neighbours /dev/shm "
    f'&& touch {MARK} && exec "$0" "$@"'
)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the neighbour tests need root (to make a mount namespace and another uid)"
    for tool in ("unshare", "setpriv", "mount", "flock", "mkfifo"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    try:
        r = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || exit 3"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"unshare -m failed: {e}"
    if r.returncode != 0:
        return f"cannot make a private mount namespace here (unshare -m: {r.returncode})"
    return None


WHY_NOT = _why_not()
SCENARIOS = [
    "slot_swap_killed",
    "slot_swap_exited",
    "planted_tokens",
    "flocked_token",
    "squatted_slot_names",
    "deleted_token",
    "killed_parties_leave_no_tokens",
    "killed_producers_leave_no_tokens",
    "filled_shm",
]


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_another_user_cannot_hijack_hang_or_forge(scenario: str, tmp_path: Path) -> None:
    marker = tmp_path / "the-other-users-code-ran"
    try:
        r = subprocess.run(
            ["unshare", "-m", "sh", "-c", WRAP, sys.executable, str(HELPER), scenario, str(marker)],
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario} hung (no result within 180 s): {e.stdout!r} {e.stderr!r}")
    assert not marker.exists(), "the other user's pickle ran"
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"{scenario} failed (status {r.returncode}):\n{r.stdout}\n{r.stderr}"
    )
