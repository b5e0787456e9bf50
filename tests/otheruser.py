"""Running a command as a second user, for tests of what the file system lets another user do.

Tests run as root (here and in CI: .ci/run checks it), so `setpriv` can switch to another
uid; where they cannot, a test that needs one skips, and in CI that skip is a failure
(tests/security/ci_rules.py). That uid cannot always run this interpreter (a venv under a
mode-700 /root is out of its reach): `python_user()` then falls back to root without
capabilities, which obeys file permissions just the same but shares root's uid (fine for
reading, not for owning). `other_user()` is always the other uid, for plain commands
(mkdir, touch, ln) an attacker needs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
from security.ci_rules import CROSS_USER

OTHER_UID = 65534  # nobody


@dataclass(frozen=True)
class OtherUser:
    prefix: list[str]  # runs a command as this user
    uid: int

    def run(
        self, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *args], env=env, capture_output=True, text=True, timeout=300
        )


def _setpriv() -> str:
    import os

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        # In CI (CI=true) this skip fails the test, wherever it is (security/ci_rules.py).
        pytest.skip(f"needs root and setpriv (util-linux) {CROSS_USER}")
    return setpriv


def other_user() -> OtherUser:
    """uid 65534, with no groups: for commands that need no Python of ours."""
    setpriv = _setpriv()
    args = [f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "--"]
    return OtherUser([setpriv, *args], OTHER_UID)


def python_user() -> OtherUser:
    """A user the file system binds who can run this interpreter with JAX and artifactstore."""
    other = other_user()
    probe = [sys.executable, "-c", "import artifactstore, jax"]
    if other.run(probe).returncode == 0:
        return other
    powerless = [_setpriv(), "--inh-caps=-all", "--bounding-set=-all", "--"]
    return OtherUser(powerless, 0)
