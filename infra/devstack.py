"""A local development stack on loopback: an S3 server + a PostgreSQL database.

Usage (prints shell `export` lines on stdout, progress on stderr)::

    eval "$(python infra/devstack.py up)"    # start moto, create bucket + database
    eval "$(python infra/devstack.py up --s3 rgw)"   # Ceph's RADOS Gateway instead of moto
    python infra/devstack.py env             # print the exports again
    python infra/devstack.py down            # stop the S3 server (--drop-database to also drop it)

moto (the default) is an emulator of AWS; `--s3 rgw` starts a real S3 server, a one-node
Ceph (monitor, OSD on memstore, radosgw) in the private state directory (infra/rgw.py; the
packages are the operator's to install: `apt-get install --no-install-recommends ceph-mon
ceph-osd radosgw`), with a user holding the same keys; `down` stops it and removes its data.

The database is `artstore_dev` unless `up --database NAME` (or DEVSTACK_DATABASE) names
another, e.g. one per checkout or per experiment; `env` and `down` use the one `up` made.

Importable too: the S3 tests start their own moto server with `start_moto()`.
Everything binds to 127.0.0.1 and the AWS credentials are moto's fake ones;
nothing here is fit for a shared or production deployment (see
infra/docker-compose.yml and infra/README.md for that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rgw

HOST = "127.0.0.1"
PG_PORT = 5432
PG_ADMIN_DB = "test"
DEV_BUCKET = "artstore-dev"
DEV_PREFIX = "cache"
DEV_DATABASE = "artstore_dev"  # the default; `up --database` / DEVSTACK_DATABASE choose
DATABASE_ENV = "DEVSTACK_DATABASE"
DEV_KEY = "devstack"
# moto accepts any credentials; these only satisfy boto3's credential chain.
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_DB_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass
class MotoServer:
    """A moto S3 server subprocess on loopback."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    owned_log: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """Terminate the server and reap it (idempotent)."""
        _terminate(self.process.pid, self.process)
        if self.owned_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def log_tail(self) -> str:
        return _tail(self.log_path)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_moto(
    port: int | None = None,
    *,
    timeout: float = 30.0,
    log_path: Path | None = None,
    detach: bool = False,
) -> MotoServer:
    """Start `python -m moto.server` on 127.0.0.1 and wait until it answers.

    `detach` puts it in its own session so it outlives this process (for `up`).
    Raises RuntimeError (with the server's last output) if it does not come up.
    """
    chosen = port if port is not None else free_port()
    # Log to a file, never a pipe: moto logs every request and would block once
    # an unread pipe filled up.
    owned_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="artstore-moto-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(chosen)],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=detach,
        )
    server = MotoServer(process, chosen, log_path, owned_log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = _tail(log_path)
            server.stop()
            raise RuntimeError(
                f"moto server exited with code {process.returncode} before answering on "
                f"{server.endpoint}: {output} (install with: pip install 'moto[server]')"
            )
        if _answers(server.endpoint):
            return server
        time.sleep(0.1)
    output = _tail(log_path)
    server.stop()
    raise RuntimeError(
        f"moto server did not answer on {server.endpoint} within {timeout:g}s: {output}"
    )


def _answers(endpoint: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(endpoint + "/moto-api/", timeout=1.0) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except OSError:
        return False


def _tail(log_path: Path) -> str:
    try:
        data = log_path.read_bytes()[-2000:]
    except OSError:
        data = b""
    text = " | ".join(line for line in data.decode(errors="replace").splitlines() if line)
    return text[-600:] or "(no output)"


def _terminate(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                break
        elif not _alive(pid):
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if process is not None:
            process.wait(timeout=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def _is_moto(pid: int) -> bool:
    """Guard against killing an unrelated process that reused a stale pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)
    return b"moto" in cmdline


def create_bucket(endpoint: str, name: str) -> None:
    """Create `name` on the S3 endpoint (fine if it already exists)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


# -- PostgreSQL -----------------------------------------------------------------


def _pg_answers(timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, PG_PORT), timeout=timeout):
            return True
    except OSError:
        return False


def ensure_postgres(timeout: float = 30.0) -> None:
    """Start the local cluster with pg_ctlcluster if 127.0.0.1:5432 does not answer."""
    if _pg_answers():
        return
    versions = sorted(
        (p.name for p in Path("/etc/postgresql").glob("*") if p.is_dir()),
        key=lambda v: [int(x) for x in re.findall(r"\d+", v)] or [0],
    )
    if not versions:
        raise RuntimeError(
            f"PostgreSQL is not answering on {HOST}:{PG_PORT} and no cluster is "
            "configured under /etc/postgresql: install postgresql or start one"
        )
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
        check=False,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _pg_answers():
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"PostgreSQL did not start on {HOST}:{PG_PORT} within {timeout:g}s: "
        f"check `pg_ctlcluster {versions[-1]} main status` and its log"
    )


def _admin_connection() -> Any:
    import psycopg

    return psycopg.connect(
        host=HOST, port=PG_PORT, user="postgres", dbname=PG_ADMIN_DB, autocommit=True
    )


_DROP_SQL = "DROP DATABASE IF EXISTS {} WITH (FORCE)"  # FORCE: PostgreSQL 13+


def _check_db_name(name: str) -> str:
    if not _DB_NAME_RE.match(name) or name in ("postgres", PG_ADMIN_DB):
        raise ValueError(f"refusing database name {name!r}: use lowercase letters, digits, _")
    return name


def database_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@{HOST}:{PG_PORT}/{_check_db_name(name)}"


def create_database(name: str, *, template: str | None = None) -> str:
    """A fresh database (an existing one is dropped first), empty or a copy of
    `template` (which nobody may be connected to); returns its URL."""
    from psycopg import sql

    drop_database(name)
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(_check_db_name(template)))
    with _admin_connection() as conn:
        conn.execute(statement)
    return database_url(name)


def drop_database(name: str) -> None:
    from psycopg import sql

    _check_db_name(name)
    ensure_postgres()
    with _admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def drop_roles(*names: str) -> None:
    """Drop the roles a test made (a login, a namespace's group role), where they exist;
    best effort, as a teardown is: a role the server will not drop yet is left."""
    import psycopg
    from psycopg import sql

    ensure_postgres()
    with _admin_connection() as conn:
        for name in names:
            try:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
            except psycopg.Error:
                pass


# -- CLI ------------------------------------------------------------------------


def state_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path("/tmp")
    return base / f"artifactstore-devstack-{os.getuid()}"


def secure_state_dir(*, create: bool) -> Path | None:
    """The state directory, if it is ours: its name is predictable (under /tmp without
    XDG_RUNTIME_DIR), and its state.json chooses the endpoint that `up` and `env` print
    for `eval`, so one another user made first (or can write) is refused, never used.
    None when it does not exist and `create` is false."""
    directory = state_dir()
    try:
        if create:
            directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):  # also a symbolic link
        problem = "is not a directory (a symbolic link?)"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by you"
    elif st.st_mode & 0o077:
        problem = "is open to other users"
    else:
        return directory
    raise RuntimeError(f"state directory {directory} {problem}: remove it and run `up` again")


def _state_file() -> Path | None:
    directory = secure_state_dir(create=False)
    return None if directory is None else directory / "state.json"


def _read_state(*, running: bool = True) -> dict[str, Any] | None:
    """The state `up` wrote; None where there is none or (`running`) its server is gone."""
    path = _state_file()
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as handle:
            state = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    if running and not _alive(int(state.get("pid", 0))):
        return None
    return state


def dev_keys(directory: Path) -> tuple[Path, Path]:
    """The dev stack's writer key pair (made once, in the private state directory): team
    stores require signatures, so the exported shell signs what it stores and trusts it."""
    key, pub = directory / f"{DEV_KEY}.key", directory / f"{DEV_KEY}.pub"
    if not key.exists():
        from artifactstore.config.keyfiles import generate

        generate(DEV_KEY, directory)
    return key, pub


def dev_env(endpoint: str, database: str = DEV_DATABASE) -> dict[str, str]:
    env = {
        "ARTSTORE_URL": f"s3://{DEV_BUCKET}/{DEV_PREFIX}",
        "ARTSTORE_INDEX": database_url(database),
        "AWS_ENDPOINT_URL_S3": endpoint,
        **FAKE_CREDENTIALS,
    }
    directory = secure_state_dir(create=False)
    if directory is not None and (directory / f"{DEV_KEY}.key").exists():
        key, pub = dev_keys(directory)
        env |= {"ARTSTORE_SIGNING_KEY": str(key), "ARTSTORE_TRUSTED_KEYS": str(pub)}
    return env


def _print_exports(endpoint: str, database: str = DEV_DATABASE) -> None:
    for name, value in dev_env(endpoint, database).items():
        # Quoted: the output is run by `eval`, and values come from a state file.
        print(f"export {name}={shlex.quote(value)}")


def _state_database(state: dict[str, Any]) -> str:
    """The database `up` made (state files of older versions name none: the default)."""
    return _check_db_name(str(state.get("database") or DEV_DATABASE))


def _log(message: str) -> None:
    print(f"devstack: {message}", file=sys.stderr)


def cmd_up(port: int | None, database: str = DEV_DATABASE, s3: str = "moto") -> int:
    _check_db_name(database)
    state = _read_state()
    if state is not None:
        running, server = _state_database(state), state.get("s3", "moto")
        if running != database or server != s3:
            raise RuntimeError(
                f"already running (pid {state['pid']}) with {server} and database {running}: "
                f"run `down` first to use {s3} and {database}"
            )
        _log(f"already running (pid {state['pid']}) at {state['endpoint']}")
        _print_exports(str(state["endpoint"]), _state_database(state))
        return 0
    directory = secure_state_dir(create=True)
    assert directory is not None
    started = time.monotonic()
    server = _start_s3(s3, port, directory)
    try:
        dev_keys(directory)
        create_bucket(server["endpoint"], DEV_BUCKET)
        # A fresh S3 server has no objects, so start the index fresh too: an index
        # pointing at missing objects would only produce misses.
        create_database(database)
    except BaseException:
        _stop_s3(server)
        raise
    state = {**server, "database": database}
    (directory / "state.json").write_text(json.dumps(state))
    _log(f"{s3} S3 at {server['endpoint']} (pid {server['pid']}, log {server['log']}), "
         f"up in {time.monotonic() - started:.1f} s")  # fmt: skip
    if "tls_endpoint" in server:
        _log(f"also HTTPS: AWS_ENDPOINT_URL_S3={server['tls_endpoint']} "
             f"AWS_CA_BUNDLE={server['certificate']}")  # fmt: skip
    _log(f"bucket {DEV_BUCKET}, database {database}; next: artstore db upgrade")
    _print_exports(str(state["endpoint"]), _state_database(state))
    return 0


def _start_s3(s3: str, port: int | None, directory: Path) -> dict[str, Any]:
    """Start the S3 server `up` was asked for; what the state file keeps of it."""
    if s3 == "rgw":
        keys = (FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"], FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        ceph = rgw.start_rgw(*keys, directory=directory / "rgw", port=port, detach=True)
        log = ceph.directory / "log"
        return {"s3": "rgw", "pid": ceph.pids["radosgw"], "pids": ceph.pids,
                "directory": str(ceph.directory), "port": ceph.port,
                "endpoint": ceph.endpoint, "log": str(log),
                "tls_endpoint": ceph.tls_endpoint,
                "certificate": str(ceph.certificate)}  # fmt: skip
    moto = start_moto(port, log_path=directory / "moto.log", detach=True)
    return {"s3": "moto", "pid": moto.pid, "port": moto.port, "endpoint": moto.endpoint,
            "log": str(moto.log_path)}  # fmt: skip


def _stop_s3(state: dict[str, Any]) -> None:
    """Stop the S3 server of `state` (what is still ours of it); an RGW's data is removed."""
    pid = int(state["pid"])
    if state.get("s3") == "rgw":
        rgw.stop_daemons({str(k): int(v) for k, v in dict(state.get("pids") or {}).items()})
        shutil.rmtree(str(state["directory"]), ignore_errors=True)
        _log(f"stopped Ceph's RADOS Gateway (pid {pid}) and removed its data")
    elif _is_moto(pid):
        _terminate(pid)
        _log(f"stopped moto (pid {pid})")
    else:
        _log(f"pid {pid} is not a moto server any more; leaving it alone")


def cmd_down(drop: bool, database: str | None = None) -> int:
    # Also a state whose radosgw died: its monitor and OSD are still to be stopped.
    state = _read_state(running=False)
    if state is not None and state.get("s3") != "rgw" and not _alive(int(state.get("pid", 0))):
        state = None  # a moto that is gone: nothing to stop
    if database is None:  # the one `up` made, else the default
        database = _state_database(state) if state is not None else DEV_DATABASE
    if state is None:
        _log("not running")
    else:
        _stop_s3(state)
    path = _state_file()
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if drop:
        drop_database(database)
        _log(f"dropped database {database}")
    return 0


def cmd_env() -> int:
    state = _read_state()
    if state is None:
        _log("not running: run `python infra/devstack.py up`")
        return 1
    _print_exports(str(state["endpoint"]), _state_database(state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start S3, create bucket and database, print exports")
    up.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    up.add_argument(
        "--s3",
        choices=("moto", "rgw"),
        default="moto",
        help="the S3 server: moto (an emulator, the default) or rgw (Ceph's RADOS Gateway)",
    )
    named = os.environ.get(DATABASE_ENV) or None
    up.add_argument(
        "--database",
        default=named or DEV_DATABASE,
        help=f"the database to create (made afresh) [env {DATABASE_ENV}; default {DEV_DATABASE}]",
    )
    down = sub.add_parser("down", help="stop the S3 server (an RGW's data is removed)")
    down.add_argument(
        "--drop-database", action="store_true", help="also drop the database `up` made"
    )
    down.add_argument(
        "--database",
        default=named,
        help=f"the database to drop [env {DATABASE_ENV}; default: the one `up` made]",
    )
    sub.add_parser("env", help="print the export lines again")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up(args.port, args.database, args.s3)
        if args.command == "down":
            return cmd_down(args.drop_database, args.database)
        return cmd_env()
    except (RuntimeError, OSError, ValueError) as exc:
        _log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
