"""`infra/devstack.py up --s3 rgw` where Ceph is not installed: one line saying what to
install, nothing started or left behind (issue 49). Its working case is every RGW test's
session server (tests/s3servers.py), whose `down` is checked there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_up_without_ceph_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "bin"  # a PATH with Python and no Ceph program
    bare.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ARTSTORE_"))}
    env.update(PATH=str(bare), XDG_RUNTIME_DIR=str(tmp_path))
    up = subprocess.run(
        [sys.executable, str(REPO / "infra" / "devstack.py"), "up", "--s3", "rgw"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 1 and up.stdout == "", up.stdout + up.stderr
    assert up.stderr.count("\n") == 1, up.stderr
    assert "Ceph's RADOS Gateway is not installed" in up.stderr
    assert "apt-get install --no-install-recommends ceph-mon ceph-osd radosgw" in up.stderr
    state = tmp_path / f"artifactstore-devstack-{os.getuid()}"
    assert not (state / "state.json").exists() and not (state / "rgw").exists()
