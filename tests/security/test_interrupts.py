"""Issue 29, point 9: SIGINT and SIGTERM stop every long command cleanly.

Each command runs as a user runs it (`python -m artifactstore ...`, TMPDIR a fresh
empty directory) and is signalled mid-work. Team-store commands go through a proxy in
front of moto that logs each request: readers (verify, export, pull, db rebuild) are
signalled once their first object read arrives, with the proxy frozen so the signal
finds them waiting on S3; writers (import, sign, gc) have their uploads held from the
start, and are signalled while the first one, an entry's manifest (its row already
written or deleted), waits: cut there, the entry would be half-written. The proxy then
lets traffic through again for the cleanup. `warm MODULE:FUNCTION` is signalled once its first
compile is reported, `run`/`warm -- CMD` once CMD says it runs. Then: exit 130 / 143,
stderr exactly one line and no traceback, TMPDIR empty, no partial file, no lease row,
and every entry whole (its row, object and manifest agree; no manifest without a row).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import forks
import pytest
from conftest import PROGRAMS, OpenStore, _team, artstore, clean_env, devstack, without_warm_lines
from faultproxy import FaultProxy
from sqlalchemy import text

from artifactstore.blobstores.base import LEASES
from artifactstore.config.host import compute
from artifactstore.config.keyfiles import generate
from artifactstore.formats import codec
from artifactstore.formats.put import Put
from artifactstore.store import Store

SIGNALS = {
    "SIGINT": (signal.SIGINT, 130, "artstore: interrupted"),
    "SIGTERM": (signal.SIGTERM, 143, "artstore: terminated"),
}
ENTRIES = 12
PAYLOAD = 20_000
FP = compute(platform_name="cpu", platform_version="v", device_kind="cpu-int",
             device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
OBJECT_GET = re.compile(r"^GET /[^ ]*/objects/")
MANIFEST_PUT = re.compile(r"^PUT /[^ ]*/keys/")


class Running:
    """A command started as a user starts it; its output collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        """`artstore ARGS` (forked: tests/forks.py; `artstore run` fresh, as
        conftest.run_program runs it)."""
        pipe = subprocess.PIPE
        self.proc = forks.popen("cli", forks.CLI, args, env, fresh=args[0] == "run",
                                stdout=pipe, stderr=pipe, cwd=cwd)  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 300) -> None:
        """Until `ready()`; fails if the command ends first (it was never mid-work)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {what}:\n{''.join(self.err)}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no {what} within {timeout} s:\n{''.join(self.err)}")
            time.sleep(0.01)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"still running {timeout} s after the signal:\n{''.join(self.err)}")
        for reader in self._readers:
            reader.join(10)
        return code, "".join(self.err)


def assert_stopped(code: int, stderr: str, which: str, tmpdir: Path) -> None:
    _, exit_code, line = SIGNALS[which]
    assert "Traceback" not in stderr, stderr
    assert without_warm_lines(stderr).splitlines() == [line], stderr  # warm: results, then one
    assert code == exit_code, (code, stderr)
    assert sorted(p.name for p in tmpdir.iterdir()) == [], "temporary files left in TMPDIR"


def assert_whole(store: Store, *, every_manifest_has_a_row: bool = True) -> None:
    """Every entry's row, object and manifest agree; no manifest names a missing row."""
    rows = {e.key: e for e in store.parts.index.iter_entries()}
    for key, entry in rows.items():
        assert store.parts.blobs.exists(entry.digest), f"entry {key[:12]} without its object"
        data = store.parts.blobs.get_manifest(key)
        assert data is not None, f"entry {key[:12]} without its manifest"
        assert json.loads(data)["d"] == entry.digest, f"entry {key[:12]}: manifest elsewhere"
    if every_manifest_has_a_row:
        orphans = set(store.parts.blobs.iter_manifest_keys()) - set(rows)
        assert not orphans, f"manifests without entry: {sorted(k[:12] for k in orphans)}"


def lease_rows(store: Store) -> list[tuple[str, str]]:
    with store.parts.engine.connect() as conn:
        return [
            (str(r[0]), str(r[1])) for r in conn.execute(text("SELECT name, holder FROM leases"))
        ]


def fill(store: Store, n: int = ENTRIES, tag: str = "a") -> list[str]:
    keys = []
    for i in range(n):
        key = f"{i:04x}{tag}".ljust(64, "0")
        assert store.put(Put(key, os.urandom(PAYLOAD), FP, f"jit_{tag}{i}", 1.0))
        keys.append(key)
    return keys


# -- team store commands, frozen in S3 when signalled --------------------------------------
@dataclass
class Team:
    env: dict[str, str]  # the command's: through the proxy, a fresh TMPDIR
    direct: dict[str, str]  # the test's: straight to moto
    proxy: FaultProxy
    tmpdir: Path
    work: Path
    keys: list[str]


@pytest.fixture
def team(team_env: dict[str, str], tmp_path: Path, open_store: OpenStore) -> Iterator[Team]:
    """A team store holding ENTRIES entries signed by a trusted key, and a proxy."""
    work = tmp_path / "work"
    tmpdir = tmp_path / "tmp"
    work.mkdir()
    tmpdir.mkdir()
    secret, public = generate("int-a", tmp_path)
    direct = {
        **team_env,
        "ARTSTORE_SIGNING_KEY": str(secret),
        "ARTSTORE_TRUSTED_KEYS": str(public),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "ARTSTORE_TIMEOUT": "30",
    }
    keys = fill(open_store(direct))
    port = int(team_env["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    proxy = FaultProxy(("127.0.0.1", port), log_requests=True).start()
    env = {**direct, "AWS_ENDPOINT_URL_S3": proxy.endpoint, "TMPDIR": str(tmpdir)}
    yield Team(env, direct, proxy, tmpdir, work, keys)
    proxy.stop()


def signal_when(team: Team, running: Running, pattern: re.Pattern[str], which: str) -> None:
    """Once the command sends a request matching `pattern`, freeze S3 (unless its uploads
    are held already: `freeze-writes`, set before it started), signal, then thaw."""
    running.wait_for(
        lambda: any(pattern.search(line) for line in list(team.proxy.requests)),
        f"a request matching {pattern.pattern!r}",
    )
    if team.proxy.mode != "freeze-writes":
        team.proxy.set_mode("freeze")
        time.sleep(0.2)  # its next request waits on the frozen store
    running.proc.send_signal(SIGNALS[which][0])
    time.sleep(0.3)
    team.proxy.set_mode("pass")


@pytest.mark.parametrize("which", SIGNALS)
def test_verify(team: Team, which: str, open_store: OpenStore) -> None:
    running = Running(["verify"], team.env)
    signal_when(team, running, OBJECT_GET, which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    assert_whole(open_store(team.direct))


@pytest.mark.parametrize("which", SIGNALS)
def test_export_leaves_no_partial_bundle(team: Team, which: str) -> None:
    bundle = team.work / "all.tzst"
    running = Running(["export", str(bundle), "--all"], team.env)
    signal_when(team, running, OBJECT_GET, which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    assert sorted(p.name for p in team.work.iterdir()) == [], "a partial bundle was left"


@pytest.mark.parametrize("which", SIGNALS)
def test_import_leaves_whole_entries_and_no_spool(
    team: Team,
    which: str,
    team_env: dict[str, str],
    migrated_template: str,
    open_store: OpenStore,
) -> None:
    bundle = team.work / "all.tzst"
    made = artstore("export", str(bundle), "--all", env=team.direct)
    assert made.returncode == 0, made.stderr
    # Into a second team store (its own bucket and database), through the proxy.
    name = "artstore_t_int_" + os.urandom(6).hex()
    url = devstack.create_database(name, template=migrated_template)
    try:
        other = _team(team_env["AWS_ENDPOINT_URL_S3"], url)
        where = {"ARTSTORE_URL": other["ARTSTORE_URL"], "ARTSTORE_INDEX": url}
        # Its objects are there already (uploaded before, say), so an entry's first
        # upload is its manifest, after its row: held there, an interrupt that landed
        # at once would leave a row without its manifest.
        source, store = open_store(team.direct), open_store({**team.direct, **where})
        fill(store, 1, tag="b")  # a writer used it before: whatever a first writer sets up
        for entry in source.parts.index.iter_entries():
            data = source.parts.blobs.get(entry.digest)
            assert data is not None
            store.parts.blobs.put(entry.digest, data)
        team.proxy.set_mode("freeze-writes")
        running = Running(["import", str(bundle)], {**team.env, **where})
        signal_when(team, running, MANIFEST_PUT, which)
        assert_stopped(*running.finish(), which, team.tmpdir)
        assert_whole(store)
        assert store.parts.index.stats().entries < ENTRIES + 1, "the import was not interrupted"
        store.close()
    finally:
        devstack.drop_database(name)


@pytest.mark.parametrize("which", SIGNALS)
def test_pull_leaves_no_partial_tier_file(team: Team, which: str) -> None:
    running = Running(["pull", "--fingerprint", FP.digest, "-j", "2"], team.env)
    signal_when(team, running, OBJECT_GET, which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    tier = Path(team.env["XDG_CACHE_HOME"])
    partial = [p for p in tier.rglob("*") if p.name.startswith(".tmp-")]
    assert partial == []


@pytest.mark.parametrize("which", SIGNALS)
def test_sign_moves_whole_entries(
    team: Team, which: str, tmp_path: Path, open_store: OpenStore
) -> None:
    secret, public = generate("int-b", tmp_path)
    env = {**team.env, "ARTSTORE_SIGNING_KEY": str(secret),
           "ARTSTORE_TRUSTED_KEYS": f"{team.env['ARTSTORE_TRUSTED_KEYS']},{public}"}  # fmt: skip
    # The signed copies are there already (a sign that stopped before, say), so an
    # entry's first upload is its manifest, after its row was repointed: held there, an
    # interrupt that landed at once would leave the manifest naming the old object.
    store = open_store({**team.direct, "ARTSTORE_SIGNING_KEY": str(secret)})
    signing_key = store.parts.settings.signing_key
    assert signing_key is not None
    for entry in store.parts.index.iter_entries():
        data = store.parts.blobs.get(entry.digest)
        assert data is not None
        signed = codec.sign(data, signing_key, store.parts.namespace)
        store.parts.blobs.put(signed.digest, signed.data)
    team.proxy.set_mode("freeze-writes")
    running = Running(["sign"], env)
    signal_when(team, running, MANIFEST_PUT, which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    store = open_store(team.direct)
    assert_whole(store)
    assert lease_rows(store) == []


@pytest.mark.parametrize("which", SIGNALS)
def test_gc_releases_its_lease_and_withdraws_what_it_removed(
    team: Team, which: str, open_store: OpenStore
) -> None:
    # Its first upload is the withdrawal of the manifests of the rows it deleted: held.
    team.proxy.set_mode("freeze-writes")
    running = Running(["gc", "--max-size", "0", "--grace", "0s"], team.env)
    signal_when(team, running, re.compile(r"^(DELETE [^ ]*/keys/|POST [^ ]*\?delete)"), which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    store = open_store(team.direct)
    assert lease_rows(store) == []
    assert_whole(store)


@pytest.mark.parametrize("which", SIGNALS)
def test_db_rebuild(team: Team, which: str, open_store: OpenStore) -> None:
    store = open_store(team.direct)
    with store.parts.engine.begin() as conn:  # the index lost its entries: rebuild reads them back
        conn.execute(text("DELETE FROM entries"))
    running = Running(["db", "rebuild"], team.env)
    signal_when(team, running, OBJECT_GET, which)
    assert_stopped(*running.finish(), which, team.tmpdir)
    assert_whole(store, every_manifest_has_a_row=False)  # rows restored so far are whole
    assert lease_rows(store) == []


# -- child processes: warm MODULE:FUNCTION, run -- CMD, warm -- CMD ---------------------------
def _local(tmp_path: Path) -> tuple[dict[str, str], Path]:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), TMPDIR=str(tmpdir),
                    XDG_CACHE_HOME=str(tmp_path / "cache"))  # fmt: skip
    return env, tmpdir


@pytest.mark.parametrize("which", SIGNALS)
def test_warm_specs_stops_its_workers_and_their_leases(
    which: str, tmp_path: Path, open_store: OpenStore
) -> None:
    """Measured before: a thread's traceback (`FileNotFoundError ... worker0.log`), exit 1."""
    env, tmpdir = _local(tmp_path)
    running = Running(["warm", "warm_specs:specializations", "-j", "2"], env, PROGRAMS)

    def compiled_one() -> bool:
        return any(line.startswith("warming: 1/") for line in running.err)

    running.wait_for(compiled_one, "a compile")
    running.proc.send_signal(SIGNALS[which][0])
    code, stderr = running.finish()
    # The result lines of the compiles that ended before the signal landed, then one.
    assert_stopped(code, stderr, which, tmpdir)
    store = open_store(env)
    assert lease_rows(store) == []
    assert list(store.parts.blobs.iter_records(LEASES)) == [], "compile lease records left"
    assert_whole(store)


CHILD = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"  # dies of it, quietly
    "print('running', os.getpid(), flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.parametrize("which", SIGNALS)
@pytest.mark.parametrize("verb", ["run", "warm"])
def test_run_passes_the_signal_on_and_exits_as_interrupted(
    verb: str, which: str, tmp_path: Path
) -> None:
    """Before: SIGINT to artstore alone left CMD running (and artstore waiting); SIGTERM
    ended with CMD's code and the summary line."""
    env, tmpdir = _local(tmp_path)
    running = Running([verb, "--", sys.executable, "-c", CHILD], env)

    def said() -> list[str]:  # CMD's line "running PID"
        return [line for line in running.out if line.startswith("running ")]

    running.wait_for(lambda: bool(said()), "CMD running")
    pid = int(said()[0].split()[1])
    running.proc.send_signal(SIGNALS[which][0])
    code, stderr = running.finish(timeout=60)
    with pytest.raises(ProcessLookupError):  # gone (and reaped by artstore): it was stopped
        os.kill(pid, 0)
    assert_stopped(code, stderr, which, tmpdir)
