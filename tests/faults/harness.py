"""The fault tests' harness: a team store behind two fault proxies, programs paused between
phases, the faults themselves, and the checks every cell of the matrix makes.

The settings every cell runs under, and the bounds derived from them:

    ARTSTORE_TIMEOUT=T         one store call (connect + read, retries included) gives up after T
    ARTSTORE_FLUSH_TIMEOUT=F   the exit flush gives up after F
    ARTSTORE_BREAKER_COOLDOWN  60 s (the default): longer than any program here, so one
                               failure opens a backend's breaker for the rest of the program

A program pays a failing backend at most once (its breaker opens, later calls cost nothing),
so a faulted read costs at most T more than the same run without the fault; uploads run in
the background and are bounded by F at exit. SLACK is process start-up and scheduling noise
on a loaded 2-core CI machine: every bound is "derived + SLACK", never a race.

How each fault is made: S3 and PostgreSQL are reached through `infra/faultproxy.py`
(down = connection refused, freeze = accepts and never answers, http500/503); objects are
damaged in moto directly; connections are killed with `pg_terminate_backend`; a table is
held with `LOCK TABLE ... IN ACCESS EXCLUSIVE MODE` from the test's own connection; a
writer is SIGKILLed while its upload hangs or its commit waits on a lock; the local tier's
"full file system" is a 1 MiB tmpfs filled to the last byte where `mount` works (root in
the CI container), else a directory made immutable with `chattr +i` (root ignores
permission bits), else a file where the tier's directory should be (`full_filesystem`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import FAKE_AWS, TEAM_SIGNING, artstore, clean_env, s3_client, start_program
from faultproxy import FaultProxy
from forks import Process

from artifactstore import config
from artifactstore.formats.sizes import parse_duration
from artifactstore.gc.verify import verify
from artifactstore.store import Store

T = 2.0  # ARTSTORE_TIMEOUT
F = 6.0  # ARTSTORE_FLUSH_TIMEOUT
SLACK = 6.0  # start-up, imports and scheduling noise: never part of a derived bound
PG_CONNECT = max(2.0, T)  # psycopg's connect_timeout has a floor of 2 s
N_JITS = 12  # compiles of one job.py run (tests/programs/job.py), all stored (threshold 0)
MLP = "jit_mlp"  # the entry the object faults damage

S3_FAULTS = ("s3-down", "s3-frozen", "s3-http500", "s3-http503")
DB_FAULTS = ("db-down", "db-frozen", "db-killed", "db-locked")
OBJECT_FAULTS = ("object-corrupt", "object-truncated", "object-deleted")
FAULTS = (*S3_FAULTS, *OBJECT_FAULTS, *DB_FAULTS, "writer-killed", "tier-full")
PROXY_MODES = {
    "s3-down": ("s3", "down"),
    "s3-frozen": ("s3", "freeze"),
    "s3-http500": ("s3", "http500"),
    "s3-http503": ("s3", "http503"),
    "db-down": ("pg", "down"),
    "db-frozen": ("pg", "freeze"),
}


def store_lines(stderr: str) -> list[str]:
    """The artifactstore log lines of a program or CLI run (one per incident)."""
    return [line for line in stderr.splitlines() if "artifactstore" in line or "artstore" in line]


def psycopg_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


@dataclass
class Stack:
    """One bucket and one database, reached through fault proxies; a namespace per cell."""

    moto_endpoint: str
    s3_proxy: FaultProxy
    pg_proxy: FaultProxy
    bucket: str
    db_name: str
    db_url: str  # direct, for the test's own connections
    proxied_db_url: str
    tmp: Path
    locks: list[Any] = field(default_factory=list)
    killed: int = 0  # connections the last db-killed fault terminated
    killers: list[threading.Event] = field(default_factory=list)

    # -- environments --------------------------------------------------------
    def env(self, namespace: str, **extra: str) -> dict[str, str]:
        """A process of namespace `namespace`, with a tier of its own (never warm by accident)."""
        settings = {
            "ARTSTORE_URL": f"s3://{self.bucket}/cache",
            "ARTSTORE_INDEX": self.proxied_db_url,
            "AWS_ENDPOINT_URL_S3": self.s3_proxy.endpoint,
            "ARTSTORE_NAMESPACE": namespace,
            "ARTSTORE_TIMEOUT": f"{T:g}",
            "ARTSTORE_FLUSH_TIMEOUT": f"{F:g}",
            "ARTSTORE_LOCAL_TIER": str(self.tmp / f"tier-{uuid.uuid4().hex[:8]}"),
            **FAKE_AWS,
            **TEAM_SIGNING,
        }
        return clean_env(**{**settings, **extra})

    def cli(self, namespace: str, *args: str, **extra: str) -> Timed:
        started = time.monotonic()
        proc = artstore(*args, env=self.env(namespace, **extra))
        return Timed(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    # -- what the store holds (read around the proxies) -----------------------
    def ls(self, namespace: str) -> dict[str, dict[str, Any]]:
        """The namespace's entries, as `artstore ls --json` lists them (read straight from
        the index: the `warm_keys` fixture checks that both agree, and this is 0.7 s
        faster per cell than starting the CLI)."""
        with psycopg.connect(psycopg_url(self.db_url)) as conn:
            rows = conn.execute(
                "SELECT key, digest, module_name FROM entries WHERE namespace = %s",
                (namespace,),
            ).fetchall()
        return {k: {"key": k, "digest": d, "module_name": m} for k, d, m in rows}

    def cli_ls(self, namespace: str) -> dict[str, dict[str, Any]]:
        proc = artstore("ls", "--json", env=self._direct_env(namespace))
        assert proc.returncode == 0, proc.stderr
        return {e["key"]: e for e in json.loads(proc.stdout)}

    def verify(self, namespace: str, *, grace: str = "1h") -> dict[str, Any]:
        """`artstore verify --json --grace GRACE`'s report, made in this process by the
        function the command calls (the `warm_keys` fixture checks that both agree; a
        second faster per cell than starting the CLI, in a phase that runs alone)."""
        env = self._direct_env(namespace)
        with pytest.MonkeyPatch.context() as patch:
            for name in (n for n in env if n.startswith("AWS_") or n == "NO_PROXY"):
                patch.setenv(name, env[name])  # boto3 reads the endpoint and keys from there
            store = Store.open(config.resolve({}, environ=env))
            try:
                return verify(store, grace_secs=parse_duration(grace)).to_json()
            finally:
                store.close()

    def _direct_env(self, namespace: str) -> dict[str, str]:
        return dict(
            self.env(namespace, ARTSTORE_LOCAL_TIER="off", ARTSTORE_TIMEOUT="30"),
            AWS_ENDPOINT_URL_S3=self.moto_endpoint,
            ARTSTORE_INDEX=self.db_url,
        )

    @property
    def s3(self) -> Any:
        return s3_client({"AWS_ENDPOINT_URL_S3": self.moto_endpoint})

    def object_key(self, namespace: str, digest: str) -> str:
        return f"cache/{namespace}/objects/{digest[:2]}/{digest}"

    def objects(self, namespace: str) -> list[str]:
        """Digests of the namespace's objects in the bucket."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"cache/{namespace}/objects/"
        )
        return sorted(o["Key"].rsplit("/", 1)[-1] for p in pages for o in p.get("Contents", []))

    # -- faults ----------------------------------------------------------------
    def proxy(self, which: str) -> FaultProxy:
        return self.s3_proxy if which == "s3" else self.pg_proxy

    def damage(self, namespace: str, fault: str) -> Damage:
        """Corrupt, truncate or delete the object of the namespace's `jit_mlp` entry."""
        (entry,) = [e for e in self.ls(namespace).values() if e["module_name"] == MLP]
        key = self.object_key(namespace, entry["digest"])
        s3 = self.s3
        original = s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        damage = Damage(entry["key"], entry["digest"], original)
        if fault == "object-deleted":
            s3.delete_object(Bucket=self.bucket, Key=key)
            return damage
        data = bytearray(original)
        if fault == "object-corrupt":
            data[len(data) // 2] ^= 0xFF
        else:
            data = data[: len(data) // 2]
        s3.put_object(Bucket=self.bucket, Key=key, Body=bytes(data))
        return damage

    def restore(self, namespace: str, damage: Damage) -> None:
        """Put the damaged object's bytes back, as they were."""
        key = self.object_key(namespace, damage.digest)
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=damage.original)

    def terminate_backends(self) -> int:
        """pg_terminate_backend of every artifactstore connection to this database."""
        with psycopg.connect(psycopg_url(self.db_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'artifactstore-%%' AND datname = %s",
                (self.db_name,),
            ).fetchall()
        return len(rows)

    def lock_table(self, table: str) -> None:
        """LOCK TABLE ... IN ACCESS EXCLUSIVE MODE, held until `clear()`."""
        conn = psycopg.connect(psycopg_url(self.db_url), application_name="fault-test-lock")
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        self.locks.append(conn)

    def keep_terminating(self) -> None:
        """Terminate artifactstore's connections every 20 ms until `clear()`."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(0.02):
                with contextlib.suppress(psycopg.Error):
                    self.terminate_backends()

        threading.Thread(target=loop, daemon=True).start()
        self.killers.append(stop)

    def inject(self, fault: str) -> None:
        """Start a network or database fault (object faults: `damage`)."""
        if fault in PROXY_MODES:
            which, mode = PROXY_MODES[fault]
            self.proxy(which).set_mode(mode)
        elif fault == "db-killed":
            # Those open now: none for a reader, nor for a writer before its first store.
            self.killed = self.terminate_backends()
        elif fault == "db-locked":
            self.lock_table("entries")
        else:
            raise AssertionError(f"inject({fault!r}): not a network or database fault")

    def clear(self) -> None:
        for stop in self.killers:
            stop.set()
        self.killers.clear()
        self.s3_proxy.set_mode("pass")
        self.pg_proxy.set_mode("pass")
        for conn in self.locks:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
                conn.close()
        self.locks.clear()

    # -- warm namespaces --------------------------------------------------------
    def warm(self, namespace: str | None = None) -> str:
        """A namespace filled by one writer run (all of job.py's entries)."""
        namespace = namespace or "w-" + uuid.uuid4().hex[:10]
        job = Job(self.env(namespace)).run()
        assert job.out["store"]["stored"] == N_JITS, job.out["store"]
        assert not store_lines(job.stderr), job.stderr
        return namespace


@dataclass(frozen=True)
class Damage:
    key: str  # the entry
    digest: str  # its object
    original: bytes


RUNNING: list[Job] = []  # every Job started: the autouse fixture stops leftovers


@dataclass
class Timed:
    returncode: int
    stdout: str
    stderr: str
    secs: float


class Job:
    """tests/programs/job.py in a process of its own (forked: conftest.start_program), paused
    where JOB_PAUSE says."""

    def stop(self) -> None:
        """Kill it if it is still running (a test that failed before its end)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: Process | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self.go_at = 0.0
        self.secs = 0.0  # from go (or start) to exit
        self.out: dict[str, Any] = {}
        self.stderr = ""

    def start(self) -> Job:
        RUNNING.append(self)
        self.proc = start_program("job.py", self.env, stdin=subprocess.PIPE)
        self.go_at = time.monotonic()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        return self

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._stdout.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def line(self, timeout: float = 120) -> dict[str, Any]:
        """The program's next JSON line on stdout."""
        text = self._lines.get(timeout=timeout)
        if text is None:
            raise AssertionError(f"job.py ended early:\n{''.join(self._stderr)[-3000:]}")
        parsed: dict[str, Any] = json.loads(text)
        return parsed

    def paused(self, point: str) -> dict[str, Any]:
        said = self.line()
        assert said.get("paused") == point, said
        return said

    def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.go_at = time.monotonic()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 180) -> Job:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.secs = time.monotonic() - self.go_at
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.05)  # the reader threads see EOF
        self.stderr = "".join(self._stderr)
        results = [json.loads(x) for x in self._stdout if x.startswith("{")]
        results = [r for r in results if "results" in r]
        self.out = results[-1] if results else {}
        return self

    @property
    def stdout_lines(self) -> list[str]:
        return list(self._stdout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.wait()

    def run(self) -> Job:
        """Run to the end without pauses."""
        self.start()
        self.wait()
        assert self.proc is not None
        assert self.proc.returncode == 0, self.stderr[-3000:]
        return self


@contextlib.contextmanager
def full_filesystem(tmp: Path) -> Iterator[tuple[Path, str]]:
    """A directory on a full file system, and how it was made.

    A 1 MiB tmpfs filled to the last byte where the machine lets us mount one (root in
    the CI container); otherwise a directory made immutable (`chattr +i`: root ignores
    permission bits, not that flag), so that every write in it fails as on a full disk.
    """
    mount = tmp / "full-fs"
    mount.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        if mounted:
            (mount / "tier").mkdir()
            with contextlib.suppress(OSError), open(mount / "filler", "wb") as handle:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
            yield mount / "tier", "a full 1 MiB tmpfs"
            return
        (mount / "tier").mkdir()
        made = subprocess.run(["chattr", "+i", str(mount / "tier")], capture_output=True)
        if made.returncode == 0:
            try:
                yield mount / "tier", "an immutable directory (chattr +i)"
            finally:
                subprocess.run(["chattr", "-i", str(mount / "tier")], check=False)
            return
        (mount / "tier").rmdir()
        (mount / "tier").write_text("a file where the tier's directory should be")
        yield mount / "tier", "a file where the tier directory should be"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def wait_until(check: Any, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or check}")


def killed_writer(stack: Stack, namespace: str, *, during: str) -> Job:
    """A writer SIGKILLed in the middle of storing.

    `during="upload"`: on an empty namespace, S3's uploads frozen (lookups answer), so
    its first upload hangs.
    `during="commit"`: a writer of a new program version (JOB_VARIANT=1: one new key) on a
    warm namespace, its object uploaded and its index commit blocked by a lock on the
    `objects` table (add_entry upserts the object row before the entry).
    """
    variant = "0" if during == "upload" else "1"
    # A long bound: the upload (or the lock wait) must still hang when the kill comes.
    env = stack.env(namespace, JOB_PAUSE="open", JOB_SKIP_FLUSH="1", JOB_VARIANT=variant,
                    ARTSTORE_TIMEOUT="30")  # fmt: skip
    job = Job(env).start()
    job.paused("open")
    if during == "upload":
        stack.s3_proxy.set_mode("freeze-writes")
        job.go()
        job.line()  # results printed: the uploads were queued as it compiled, and hang
        time.sleep(0.5)
    else:
        before = len(stack.objects(namespace))
        stack.lock_table("objects")
        job.go()
        wait_until(lambda: len(stack.objects(namespace)) > before, what="the upload")
    job.kill()
    stack.clear()
    assert job.proc is not None and job.proc.returncode == -signal.SIGKILL, job.stderr
    return job


def reference_results(cache: dict[str, list[str]], variant: str = "0") -> list[str]:
    if variant not in cache:
        job = Job(clean_env(JOB_NO_STORE="1", JOB_VARIANT=variant)).run()
        cache[variant] = job.out["results"]
    return cache[variant]


@dataclass(frozen=True)
class Expect:
    """What a program run in a cell must report."""

    hits: int
    compiles: int  # XLA compiles (job.py counts them at JAX's compile entry point)
    lines: tuple[str, ...] = ()  # one expected substring per artifactstore log line
    stats: dict[str, int] = field(default_factory=dict)  # exact process counters
    extra: float = 0.0  # derived bound on the seconds beyond the same run without the fault


def check_job(fault: str, job: Job, expect: Expect, reference: list[str], baseline: float) -> None:
    """The program's own view: right results, expected counts, one line per incident,
    extra time within the derived bound (+ SLACK)."""
    assert job.proc is not None and job.proc.returncode == 0, job.stderr[-3000:]
    store = job.out["store"]
    extra = job.secs - baseline
    print(f"{fault}: {job.secs:.2f} s ({extra:+.2f} s); {store}; {store_lines(job.stderr)}")
    assert job.out["results"] == reference
    assert store.get("hits", 0) == expect.hits, store
    assert len(job.out["xla_compiles"]) == expect.compiles, job.out["xla_compiles"]
    for name, value in expect.stats.items():
        assert store.get(name, 0) == value, (name, store)
    lines = store_lines(job.stderr)
    assert len(lines) == len(expect.lines), job.stderr
    for line, needle in zip(lines, expect.lines, strict=True):
        assert needle in line, (needle, line)
    assert "Traceback" not in job.stderr
    assert extra <= expect.extra + SLACK, (extra, expect.extra)
