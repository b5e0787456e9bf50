"""Issue 38, point 8: no advice lowers trust in a store another user controls.

Measured before, on a shared host: a store directory (and its SQLite index) another user
made under a shared directory was refused with "set ARTSTORE_READ_ONLY=1 to read another
user's store"; following that advice, the victim's program ran what that user had put
there. Now the refusal names a directory of the victim's own instead, and a read-only
process refuses another user's store the same way unless it loads only entries signed by
keys it trusts (then the files decide nothing). The other user is real (uid 65534,
tests/otheruser.py: root and setpriv, as in CI, where a skip fails the run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TEAM_PUB, TEAM_SIGNING, clean_env, run_program
from otheruser import OTHER_UID, other_user

SLOW = {"ARTSTORE_MIN_COMPILE_SECS": "0.5", "JOB_SLOW_COMPILE_SECS": "0.6"}


@pytest.fixture
def planted() -> Iterator[Path]:
    """A store with an index and both of job.py's entries, owned by the other user, in a
    shared sticky directory (as /tmp): what the attacker made before the victim did."""
    attacker = other_user()
    shared = Path(tempfile.mkdtemp(prefix="artstore-shared-"))
    shared.chmod(0o1777)
    store = shared / "store"
    try:
        wrote = run_program("job.py", clean_env(**SLOW, ARTSTORE_URL=str(store), **TEAM_SIGNING))
        assert wrote["store"]["stored"] == 2
        for path in [store, *store.rglob("*")]:
            os.chown(path, attacker.uid, attacker.uid, follow_symlinks=False)
        yield store
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_read_only_victim_loads_nothing_from_another_users_store(
    planted: Path, tmp_path: Path
) -> None:
    """Slow: three real JAX programs."""
    victim = clean_env(**SLOW, ARTSTORE_URL=str(planted), XDG_CACHE_HOME=str(tmp_path / "c"))
    for extra in ({}, {"ARTSTORE_READ_ONLY": "1"}):  # as configured, then "as advised"
        out = run_program("job.py", {**victim, **extra})
        # Nothing from the planted store (before: 2); the second run may load what the
        # first compiled too quickly to store, from the victim's own tier (quick_loads).
        stats = out["store"]
        assert stats.get("hits", 0) == stats.get("quick_loads", 0), stats
        said = [ln for ln in out["_stderr"].splitlines() if f"owned by uid {OTHER_UID}" in ln]
        assert said, out["_stderr"]  # the defence ran, and said so
        for line in said:  # never advice to trust the directory more
            assert "READ_ONLY" not in line and "REQUIRE_SIGNATURES" not in line
            assert "ARTSTORE_URL to a directory of yours" in line

    # A store another user publishes on purpose: its writer's signatures, required here.
    signed = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_REQUIRE_SIGNATURES": "1"}
    out = run_program("job.py", {**victim, **signed, "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)})
    assert out["store"].get("hits", 0) == 2, out["_stderr"]
