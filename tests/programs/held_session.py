"""A test session that tests/test_session_signals.py stops in its middle. Its one test holds
what a session of the suite starts (a moto server, PostgreSQL databases, temporary folders,
the CLI's fork server), writes where they are to $HELD_STATE (JSON), and waits to be stopped.
Not collected with the suite (no `test_` file name); run by naming it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import artstore
from session_signals import children


def test_holds_what_a_session_starts(
    team_env: dict[str, str], migrated_template: str, request: pytest.FixtureRequest
) -> None:
    assert artstore("--help", env=team_env).returncode == 0  # the fork server is up
    state = {
        "databases": [team_env["ARTSTORE_INDEX"].rsplit("/", 1)[1], migrated_template],
        "processes": children(),
        "endpoint": team_env["AWS_ENDPOINT_URL_S3"],
    }
    path = Path(os.environ["HELD_STATE"])
    path.with_suffix(".new").write_text(json.dumps(state))
    path.with_suffix(".new").rename(path)
    time.sleep(600)
