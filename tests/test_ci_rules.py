"""In CI (CI=true) no test may skip for want of a second OS user, or of Ceph's RADOS
Gateway, wherever it is.

A test that needs another uid (tests/otheruser.py) skips where the tests do not run as
root; in CI that skip fails it (tests/security/ci_rules.py), so a cross-user check cannot
leave CI green without running. Here a test outside tests/security/ loses root (its
geteuid says 1000) and asks for a second user, in a pytest of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

NEEDS_ANOTHER_USER = """
import os
import otheruser

def test_needs_another_user(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    otheruser.python_user()
"""


@pytest.mark.parametrize("ci", ["true", ""], ids=["CI", "not-CI"])
def test_a_cross_user_skip_fails_in_ci_only(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makepyfile(test_outside=NEEDS_ANOTHER_USER)
    result = pytester.runpytest_subprocess("-p", "security.ci_rules", "-p", "no:cacheprovider")
    if ci:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*skipped in CI, where this test must run*second user*"])
    else:
        result.assert_outcomes(skipped=1)


NEEDS_RGW = """
import pytest
from security.ci_rules import NO_RGW

def test_on_rgw():
    pytest.skip(f"{NO_RGW} (no radosgw): apt-get install --no-install-recommends radosgw")
"""


@pytest.mark.parametrize("ci", ["true", ""], ids=["CI", "not-CI"])
def test_a_skip_for_want_of_rgw_fails_in_ci_only(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    """.ci/run installs Ceph's RADOS Gateway: an S3 contract test skipped on it in CI would
    leave CI green on moto alone (tests/s3servers.py)."""
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makepyfile(test_outside=NEEDS_RGW)
    result = pytester.runpytest_subprocess("-p", "security.ci_rules", "-p", "no:cacheprovider")
    if ci:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*skipped in CI, where this test must run*RADOS Gateway*"])
    else:
        result.assert_outcomes(skipped=1)
