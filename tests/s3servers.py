"""The S3 servers the tests run against: moto (an emulator, every test) and Ceph's RADOS
Gateway (a real server on loopback, issue 49), each with what it was measured to do.

`s3_server` is parametrized over both (the rgw case marked `rgw`: CI runs those in a phase
of their own, .ci/run); `rgw_server` is one RGW per test session, started as an operator
does, by `infra/devstack.py up --s3 rgw` (in a private XDG_RUNTIME_DIR), and stopped by
`down`, which must leave no daemon and no data behind. Where Ceph is not installed the rgw
tests skip saying NO_RGW and what to install; under CI=true that skip is a failure
(tests/security/ci_rules.py), as is a server that does not start (conftest._unavailable).
Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from security.ci_rules import NO_RGW

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "infra"))
import rgw  # noqa: E402

DEVSTACK = REPO / "infra" / "devstack.py"
STARTED: dict[str, float] = {}  # server -> seconds its start took, for the summary


@dataclass(frozen=True)
class S3Server:
    """One S3 server and what it does where servers differ (docs/operations.md's table)."""

    name: str
    endpoint: str
    access_key: str
    secret_key: str
    # An object of storage class GLACIER is refused (InvalidObjectState) until restored;
    # RGW 16.2 has storage classes as placement targets only: it serves them.
    archives: bool
    # A request signed with a wrong secret is refused (moto accepts any credentials);
    # so is one signed 20 minutes off the server's clock (AWS and RGW allow 15).
    checks_credentials: bool
    # A PutObject whose Content-MD5 is wrong is refused (BadDigest; moto stores it).
    verifies_md5: bool
    # ... whose x-amz-checksum-crc32 is wrong (moto and RGW 16.2 store it; RGW 16.2
    # neither keeps nor returns those checksums).
    verifies_checksums: bool
    # boto3 (1.36+) streams a checksum trailer with uploads over HTTPS (aws-chunked): RGW
    # 16.2 refuses those with MissingContentLength; over HTTP boto3 sends it as a header.
    takes_streamed_checksums: bool = True
    certificate: str | None = None  # a self-signed HTTPS endpoint's
    extra: dict[str, str] = field(default_factory=dict)

    def client(self, *, plain: bool = False, **overrides: str) -> Any:
        """boto3's S3 client on this server as its user (path-style, as the store is);
        `plain`: checksums only where required, none streamed."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=overrides.get("access_key", self.access_key),
            aws_secret_access_key=overrides.get("secret_key", self.secret_key),
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                **({"request_checksum_calculation": "when_required"} if plain else {}),
            ),
            verify=self.certificate,
        )

    def aws_env(self) -> dict[str, str]:
        """The AWS settings a store's boto3 reads for this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "NO_PROXY": "127.0.0.1,localhost",
            **({"AWS_CA_BUNDLE": self.certificate} if self.certificate else {}),
        }

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "rgw: runs against Ceph's RADOS Gateway (one per session; tests/s3servers.py): CI's "
        "'RGW tests' phase; elsewhere skipped where Ceph is not installed",
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if "rgw" in STARTED:
        terminalreporter.line(f"RGW: `devstack up --s3 rgw` took {STARTED['rgw']:.1f} s")


@pytest.fixture(scope="session")
def moto_server(moto_endpoint: str) -> S3Server:
    return S3Server("moto", moto_endpoint, "testing", "testing", archives=True,
                    checks_credentials=False,
                    verifies_md5=False, verifies_checksums=False)  # fmt: skip


def _devstack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEVSTACK), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="session")
def rgw_server(postgres: None) -> Iterator[S3Server]:
    """One RGW for the session, by `devstack up --s3 rgw`; `down` checked at the end."""
    from conftest import _unavailable

    missing = rgw.missing_packages()
    if missing:
        pytest.skip(f"{NO_RGW} (no {', '.join(missing)}): {rgw.install_line(missing)}")
    runtime = Path(tempfile.mkdtemp(prefix="artstore-rgw-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ARTSTORE_"))}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    database = "artstore_rgw_" + uuid.uuid4().hex[:12]
    started = time.monotonic()
    up = _devstack(env, "up", "--s3", "rgw", "--database", database)
    if up.returncode != 0:
        shutil.rmtree(runtime, ignore_errors=True)
        _unavailable("Ceph's RADOS Gateway (devstack up --s3 rgw)", RuntimeError(up.stderr))
    STARTED["rgw"] = time.monotonic() - started
    exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
    state_dir = runtime / f"artifactstore-devstack-{os.getuid()}"
    state = json.loads((state_dir / "state.json").read_text())
    try:
        yield S3Server("rgw", exports["AWS_ENDPOINT_URL_S3"], exports["AWS_ACCESS_KEY_ID"],
                       exports["AWS_SECRET_ACCESS_KEY"], archives=False,
                       checks_credentials=True,
                       verifies_md5=True, verifies_checksums=False,
                       extra={"conf": str(Path(state["directory"]) / "ceph.conf"),
                              "tls": state["tls_endpoint"],
                              "certificate": state["certificate"]})  # fmt: skip
    finally:
        down = _devstack(env, "down", "--drop-database")
        left = [name for name, pid in state["pids"].items() if rgw.alive(pid)]
        kept = Path(state["directory"]).exists()
        shutil.rmtree(runtime, ignore_errors=True)
        assert down.returncode == 0 and not left and not kept, (down.stderr, left, kept)


@pytest.fixture(scope="session")
def rgw_tls_server(rgw_server: S3Server) -> S3Server:
    """The session's RGW over HTTPS (its self-signed certificate trusted)."""
    return dataclasses.replace(rgw_server, name="rgw-tls", endpoint=rgw_server.extra["tls"],
                               certificate=rgw_server.extra["certificate"],
                               takes_streamed_checksums=False)  # fmt: skip


@pytest.fixture(
    params=[
        "moto",
        pytest.param("rgw", marks=pytest.mark.rgw),
        pytest.param("rgw-tls", marks=pytest.mark.rgw),
    ]
)
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn: moto, then Ceph's RADOS Gateway over HTTP and over HTTPS."""
    server: S3Server = request.getfixturevalue(f"{request.param.replace('-', '_')}_server")
    return server


@pytest.fixture
def rgw_team_env(rgw_tls_server: S3Server, migrated_template: str) -> Iterator[dict[str, str]]:
    """A team store on RGW over HTTPS, as a team runs one (boto3 uploads differently there
    than over HTTP: the contract covers both): a fresh bucket, a fresh database at the
    newest schema."""
    rgw_server = rgw_tls_server
    from conftest import TEAM_SIGNING, clean_env, devstack, drop_later

    name = "artstore_t_" + uuid.uuid4().hex[:12]
    url = devstack.create_database(name, template=migrated_template)
    try:
        yield clean_env(
            ARTSTORE_URL=f"s3://{rgw_server.new_bucket()}/cache",
            ARTSTORE_INDEX=url,
            **rgw_server.aws_env(),
            **TEAM_SIGNING,
        )
    finally:
        drop_later(name)
