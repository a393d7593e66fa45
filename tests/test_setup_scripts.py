"""The set-up scripts' guard against a disk too full for the install (pip otherwise fails minutes in, with
"[Errno 28] No space left on device")."""

import subprocess
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "scripts" / "pip_progress.sh"


def _require(tmp_path: Path, gib: int) -> subprocess.CompletedProcess:
    script = f'source "{HELPERS}"; require_free_space "{tmp_path}" {gib} "the test environment (SOME_VAR)"; echo fits'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_an_install_that_fits_goes_on(tmp_path):
    run = _require(tmp_path, 0)
    assert run.returncode == 0 and run.stdout.strip() == "fits"


def test_a_full_disk_stops_with_where_how_much_and_the_fix(tmp_path):
    gib = 10**9  # more than any disk has
    run = _require(tmp_path, gib)
    assert run.returncode == 1 and "fits" not in run.stdout
    assert f"needs about {gib} GiB free at {tmp_path}" in run.stderr
    assert "SOME_VAR" in run.stderr and "Free some space" in run.stderr
