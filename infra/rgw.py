"""Ceph's RADOS Gateway on loopback: a real S3 server beside moto (issue 49).

A one-node Ceph cluster as an ordinary process tree in a private directory (no systemd, no
/etc/ceph, no /var/lib/ceph): one monitor, one OSD on memstore (its data lives in the OSD's
memory), and radosgw on 127.0.0.1, with one S3 user whose keys the caller chooses::

    server = start_rgw(access_key="testing", secret_key="testing")
    ...                     # server.endpoint: http://127.0.0.1:PORT
    server.stop()           # stops the three daemons and removes their directory

`infra/devstack.py up --s3 rgw` starts one for a shell (detached, its pids in the state
file); the tests start one per session (tests/s3servers.py). Installing Ceph is the
operator's step: `missing_packages()` says which Debian packages are absent and
`install_line()` the one command that installs them. Measured on a loaded 2-core machine:
up in 12-20 s, most of it radosgw creating its pools.

Nothing here is fit for a shared deployment: cephx is off (anyone on this host may talk to
the monitor, as anyone may to moto), and the OSD keeps its data in memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
# Program -> the Debian package that installs it (Ceph 16.2 on Debian 12).
PROGRAMS = {
    "ceph-mon": "ceph-mon",
    "ceph-osd": "ceph-osd",
    "radosgw": "radosgw",
    "radosgw-admin": "radosgw",
    "monmaptool": "ceph-common",
    "ceph": "ceph-common",
}
PACKAGES = ("ceph-mon", "ceph-osd", "radosgw")  # ceph-common comes with them
# The storage class an archived object gets on AWS; here only a second placement target
# (RGW 16.2 moves nothing to an archive: an object of this class is served as any other).
ARCHIVE_CLASS = "GLACIER"
DAEMONS = ("radosgw", "ceph-osd", "ceph-mon")  # the order they are stopped in
MEMSTORE_BYTES = 2 * 1024**3  # the OSD's capacity (memory used only as objects arrive)


def missing_packages() -> list[str]:
    """The Debian packages whose programs are not on PATH, in install order."""
    absent = {PROGRAMS[name] for name in PROGRAMS if shutil.which(name) is None}
    return [p for p in (*PACKAGES, "ceph-common") if p in absent]


def install_line(packages: list[str] | None = None) -> str:
    """The one command that installs Ceph's RADOS Gateway here (as root)."""
    wanted = packages or list(PACKAGES)
    return "apt-get install --no-install-recommends " + " ".join(wanted)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class RgwServer:
    """A running one-node Ceph with radosgw: its directory, ports and daemons' pids."""

    directory: Path
    port: int
    mon_port: int
    tls_port: int
    pids: dict[str, int] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def tls_endpoint(self) -> str:
        """The same server over HTTPS (boto3 sends other requests there: issue 49)."""
        return f"https://{HOST}:{self.tls_port}"

    @property
    def certificate(self) -> Path:
        """The HTTPS endpoint's self-signed certificate (for AWS_CA_BUNDLE)."""
        return self.directory / "tls.crt"

    @property
    def conf(self) -> Path:
        return self.directory / "ceph.conf"

    def stop(self) -> None:
        """Stop the daemons (radosgw first) and remove the directory (idempotent)."""
        stop_daemons(self.pids, self.children)
        shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self) -> str:
        return log_tail(self.directory)

    def admin(self, *args: str) -> str:
        """`radosgw-admin ARGS` on this cluster; its stdout (RuntimeError with its
        output if it fails)."""
        return run_tool(self.conf, "radosgw-admin", *args)

    def add_user(self, uid: str, access_key: str, secret_key: str) -> None:
        """An S3 user with these keys (a second user: refused and shared objects)."""
        self.admin(
            "user", "create", f"--uid={uid}", f"--display-name={uid}",
            f"--access-key={access_key}", f"--secret={secret_key}",
        )  # fmt: skip


def start_rgw(
    access_key: str,
    secret_key: str,
    *,
    directory: Path | None = None,
    port: int | None = None,
    detach: bool = False,
    timeout: float = 90.0,
) -> RgwServer:
    """Start a one-node Ceph and radosgw on 127.0.0.1 (`port`, else a free one) with
    one S3 user holding these keys; wait until radosgw answers.

    `directory` (made; emptied first) holds the configuration, the monitor's store, the
    logs and sockets; a temporary one otherwise. `detach`: the daemons get a session of
    their own and outlive this process (devstack's `up`). The same server answers HTTPS
    on `tls_port`, with a self-signed certificate for 127.0.0.1 (`certificate`): boto3
    uploads differently there. RuntimeError naming the log's
    last lines (or the packages to install) when it does not come up."""
    missing = missing_packages()
    if missing:
        raise RuntimeError(
            f"Ceph's RADOS Gateway is not installed (no {', '.join(missing)}): "
            f"install it with `{install_line(missing)}`"
        )
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="artstore-rgw-"))
    else:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
    server = RgwServer(directory, port or free_port(), free_port(), free_port())
    try:
        _bring_up(server, access_key, secret_key, detach=detach, timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _bring_up(
    server: RgwServer, access_key: str, secret_key: str, *, detach: bool, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    for name in ("mon", "osd", "run", "log"):
        (server.directory / name).mkdir()
    _make_certificate(server)
    write_conf(server)
    _spawn(server, "ceph-mon", _make_mon(server), detach)
    _spawn(server, "ceph-osd", _make_osd(server), detach)
    server.add_user("artstore", access_key, secret_key)  # also makes the default zone
    _add_archive_class(server)  # before radosgw starts: it reads the placement once
    _spawn(server, "radosgw", ["radosgw", "-f", "-n", "client.rgw"], detach)
    _wait_until_answers(server, deadline)


def write_conf(server: RgwServer) -> None:
    """The cluster's one configuration file: loopback only, no cephx, one replica,
    few placement groups (radosgw creates 6-8 pools), everything under the directory."""
    d = server.directory
    listen = (f"endpoint={HOST}:{server.port} ssl_endpoint={HOST}:{server.tls_port} "
              f"ssl_certificate={server.certificate} ssl_private_key={d / 'tls.key'}")  # fmt: skip
    server.conf.write_text(
        f"""[global]
fsid = {uuid.uuid4()}
mon host = v2:{HOST}:{server.mon_port}
public addr = {HOST}
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = /dev/null
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
mon data = {d}/mon
osd data = {d}/osd
osd objectstore = memstore
memstore device bytes = {MEMSTORE_BYTES}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 0
mon data avail warn = 0
osd op num shards = 2
osd op num threads per shard = 1

[client.rgw]
rgw frontends = beast {listen}
rgw dns name = {HOST}
# radosgw asks for a secure connection to the monitor, which needs cephx (off here).
ms mon client mode = crc
"""
    )


def run_tool(conf: Path, *argv: str, timeout: float = 60.0) -> str:
    """Run a Ceph command-line tool on the cluster of `conf`; its stdout."""
    env = {**os.environ, "CEPH_CONF": str(conf)}
    done = subprocess.run(
        [*argv, "--conf", str(conf)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        said = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"`{' '.join(argv[:3])}` failed ({done.returncode}): {said}")
    return done.stdout


def _make_certificate(server: RgwServer) -> None:
    """A self-signed certificate for 127.0.0.1, valid two days."""
    key = server.directory / "tls.key"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
            "-out", str(server.certificate), "-days", "2", "-subj", f"/CN={HOST}",
            "-addext", f"subjectAltName=IP:{HOST}"]  # fmt: skip
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=60)


def _make_mon(server: RgwServer) -> list[str]:
    """The monitor's store (a monmap of one monitor, `a`); its command line."""
    monmap = server.directory / "monmap"
    fsid = _conf_value(server.conf, "fsid")
    addr = f"[v2:{HOST}:{server.mon_port}]"
    run_tool(server.conf, "monmaptool", "--create", "--fsid", fsid, "--addv", "a", addr,
             str(monmap))  # fmt: skip
    run_tool(server.conf, "ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
    return ["ceph-mon", "-f", "-i", "a"]


def _make_osd(server: RgwServer) -> list[str]:
    """OSD 0 registered with the (running) monitor, its store made; its command line."""
    osd_id = run_tool(server.conf, "ceph", "osd", "create").strip()
    if osd_id != "0":
        raise RuntimeError(f"the new cluster's first OSD is osd.{osd_id}, not osd.0")
    run_tool(server.conf, "ceph-osd", "--mkfs", "-i", "0")
    return ["ceph-osd", "-f", "-i", "0"]


def _add_archive_class(server: RgwServer) -> None:
    """A storage class named as AWS's archive (STANDARD alone is accepted otherwise)."""
    klass = f"--storage-class={ARCHIVE_CLASS}"
    server.admin("zonegroup", "placement", "add", "--rgw-zonegroup=default",
                 "--placement-id=default-placement", klass)  # fmt: skip
    server.admin("zone", "placement", "add", "--rgw-zone=default",
                 "--placement-id=default-placement", klass,
                 "--data-pool=default.rgw.archive.data")  # fmt: skip


def _conf_value(conf: Path, name: str) -> str:
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    raise KeyError(name)


def _spawn(server: RgwServer, name: str, argv: list[str], detach: bool) -> None:
    """Start a daemon in the foreground (-f: its pid is the daemon's), output to a file."""
    out = server.directory / "log" / f"{name}.out"
    with open(out, "ab") as handle:
        child = subprocess.Popen(
            [*argv, "--conf", str(server.conf)],
            env={**os.environ, "CEPH_CONF": str(server.conf)},
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=detach,
        )
    server.pids[name] = child.pid
    server.children.append(child)


def _wait_until_answers(server: RgwServer, deadline: float) -> None:
    context = ssl.create_default_context(cafile=str(server.certificate))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    waiting = [server.endpoint, server.tls_endpoint]
    while time.monotonic() < deadline:
        for name, pid in server.pids.items():
            if not alive(pid):
                raise RuntimeError(f"{name} exited during start-up: {server.log_tail()}")
        try:
            with opener.open(waiting[0], timeout=1.0):
                pass
        except urllib.error.HTTPError:
            pass  # an S3 error document: it answers
        except OSError:
            time.sleep(0.2)
            continue
        waiting.pop(0)
        if not waiting:
            return
    raise RuntimeError(f"radosgw did not answer on {server.endpoint}: {server.log_tail()}")


def log_tail(directory: Path) -> str:
    """The last lines of the daemons' logs, for an error message."""
    lines: list[str] = []
    for path in sorted((directory / "log").glob("*")):
        with contextlib.suppress(OSError):
            tail = path.read_bytes()[-600:].decode(errors="replace").splitlines()[-2:]
            lines += [f"{path.name}: {line.strip()}" for line in tail if line.strip()]
    return " | ".join(lines)[-1200:] or "(no output)"


def is_ceph_daemon(pid: int) -> bool:
    """Whether `pid` runs one of our daemons (a stale pid may belong to another program)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return os.path.basename(argv0.decode(errors="replace")) in DAEMONS


def alive(pid: int) -> bool:
    """Running, and not a zombie (a daemon that exited and was not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_daemons(
    pids: dict[str, int], children: list[subprocess.Popen[bytes]] | None = None
) -> None:
    """SIGTERM each daemon that is still ours (radosgw, then the OSD, then the monitor),
    SIGKILL after 10 s; children of this process are reaped."""
    for name in DAEMONS:
        pid = pids.get(name)
        if pid is None or not is_ceph_daemon(pid):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while alive(pid) and time.monotonic() < deadline:
            _reap(children or [])
            time.sleep(0.05)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for child in children or []:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def _reap(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        child.poll()
