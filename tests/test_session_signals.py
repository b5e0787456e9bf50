"""SIGTERM (a CI job's timeout, `kill`) cleans up as Ctrl-C does: tests/session_signals.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import devstack
import pytest
from conftest import PROGRAMS, REPO
from session_signals import running


@pytest.mark.parametrize("workers", ["0", "1"])
def test_sigterm_leaves_no_server_database_or_folder_behind(tmp_path: Path, workers: str) -> None:
    """A session (tests/programs/held_session.py; directly, and under one xdist worker)
    holding a moto server, two databases, its temporary folders and a fork server is sent
    SIGTERM in its test, its process alone: it exits as interrupted, and none is left.
    Slow: the session starts moto, migrates a database and starts a fork server."""
    temp, state = tmp_path / "tmp", tmp_path / "state.json"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not ours
    env.update(TMPDIR=str(temp), HELD_STATE=str(state))
    cmd = [sys.executable, "-m", "pytest", str(PROGRAMS / "held_session.py"), "-q", "-n", workers,
           "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'basetemp'}"]  # fmt: skip
    session = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not state.exists() and session.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.exists(), f"the session never held them: {session.communicate()[0][-3000:]}"
        session.send_signal(signal.SIGTERM)
        output = session.communicate(timeout=120)[0]
    finally:
        session.kill()
        session.wait()
    held = json.loads(state.read_text())
    assert session.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert held["processes"], "the session started no process"  # moto and the fork server
    assert [pid for pid in held["processes"] if running(pid)] == [], output[-3000:]
    assert not devstack._answers(held["endpoint"])
    for name in held["databases"]:
        with devstack._admin_connection() as conn:
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert row is None, f"database {name} left behind"
    assert sorted(os.listdir(temp)) == [], output[-3000:]
