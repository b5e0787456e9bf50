"""Security tests in CI: a skip is a failure, and hostile-record tests say which kind they cover.

Why: a security test that skips where it cannot run (no second OS user, no server) leaves
CI green while the defence goes untested (issue 38 measured 4 tier-security tests skipped
with CI=true, exit 0). Under CI=true any skip of a test under tests/security/ or of
tests/test_tier_security.py becomes a failure carrying the skip's reason. So does a skip
of a PyTorch test (tests/torch/) in the phase of .ci/run that installs torch and torchax
for them (ARTSTORE_TORCH_CI=1): elsewhere they skip, since torch is an optional extra;
and of a benchmark at smoke size (tests/test_bench_smoke.py) in the phase that installs
the bench extra for them (ARTSTORE_BENCH_CI=1).
And so does, wherever the test is, a skip for want of a second OS user (tests/otheruser.py
skips with CROSS_USER in its reason): CI runs as root with setpriv, so such a test can run
there, and one that skips instead checks nothing while CI stays green. Likewise a skip for
want of Ceph's RADOS Gateway (tests/s3servers.py skips with NO_RGW in its reason): .ci/run
installs it, so an S3 contract test that skips on RGW would leave CI green on moto alone.

The `hostile_record(kind)` marker declares that a Hypothesis test drives hostile records of
`kind` (a name in artifactstore.blobstores.base.UNTRUSTED_KINDS) through a real path;
tests/security/test_record_kinds.py fails for a registered kind no test declares.
Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# Tests that may not skip in CI: paths relative to tests/.
NO_SKIP_IN_CI = ("security/", "test_tier_security.py")
# ... and, where ARTSTORE_TORCH_CI=1 (the torch phase), these.
NO_SKIP_IN_TORCH_CI = ("torch/",)
# ... and, where ARTSTORE_BENCH_CI=1 (the benchmarks' phase), these.
NO_SKIP_IN_BENCH_CI = ("test_bench_smoke.py",)
# In the reason of every skip for want of a second OS user (tests/otheruser.py): never
# allowed in CI, whichever file the test is in.
CROSS_USER = "to act as a second user"
# ... and of every skip for want of Ceph's RADOS Gateway (tests/s3servers.py).
NO_RGW = "Ceph's RADOS Gateway is not installed"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hostile_record(*kinds): a Hypothesis test of hostile records of these kinds "
        "(artifactstore.blobstores.base.UNTRUSTED_KINDS) through a real path",
    )


def must_run(path: Path) -> bool:
    """Whether the test file at `path` may not skip in CI."""
    try:
        rel = path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return False
    if rel.startswith(NO_SKIP_IN_CI):
        return True
    if rel.startswith(NO_SKIP_IN_TORCH_CI) and os.environ.get("ARTSTORE_TORCH_CI") == "1":
        return True
    return rel.startswith(NO_SKIP_IN_BENCH_CI) and os.environ.get("ARTSTORE_BENCH_CI") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not (must_run(item.path) or CROSS_USER in reason or NO_RGW in reason):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, where this test must run: {reason}"
