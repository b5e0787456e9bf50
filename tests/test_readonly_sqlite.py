"""An embedded store (directory + SQLite) this process may not write: read it, write nothing.

A writer fills a store made readable by its group (ARTSTORE_GROUP_READABLE, the
documented way to share one: new files are private otherwise), the tree is given to
the readers' group and made read-only, and readers run as a user the file system
binds (tests/otheruser.py): another uid in that group where it can reach this
interpreter and checkout, else root without capabilities (which obeys file
permissions just the same; a venv under a mode-700 /root is out of another uid's reach).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PROGRAMS, artstore, clean_env, run_program
from otheruser import OtherUser, python_user

Reader = OtherUser


@dataclass(frozen=True)
class ReadOnlyStore:
    base: Path
    store: Path
    results: list[str]
    keys: list[str]
    reader: Reader

    def env(self, **extra: str) -> dict[str, str]:
        """The reader's environment, with a cache directory of its own (the tier may go there)."""
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=self.base))
        cache.chmod(0o755)
        os.chown(cache, self.reader.uid, self.reader.uid)
        return clean_env(
            ARTSTORE_URL=str(self.store),
            XDG_CACHE_HOME=str(cache),
            HOME=str(cache),
            PYTHONDONTWRITEBYTECODE="1",
            **extra,
        )


def _snapshot(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


def _share_with_group(root: Path, gid: int) -> None:
    """What an owner does to share a group-readable store: give it to the readers' group.
    Nothing the writer made may be readable by users outside that group."""
    for path in [root, *root.rglob("*")]:
        if path.name.startswith("index.db"):
            continue  # SQLite's own mode (0644 less the umask), inside a 0750 directory
        mode = path.stat().st_mode
        assert not mode & stat.S_IRWXO, (path, oct(mode))
        assert mode & stat.S_IRGRP and not mode & stat.S_IWGRP, (path, oct(mode))
        os.chown(path, -1, gid)


@dataclass(frozen=True)
class Filled:
    base: Path
    stores: dict[str, Path]
    results: list[str]
    keys: list[str]
    reader: Reader


@pytest.fixture(scope="module")
def filled() -> Iterator[Filled]:
    """One writer's store, in the two states a writer leaves SQLite in, made read-only."""
    reader = python_user()
    base = Path(tempfile.mkdtemp(prefix="artstore-ro-"))
    base.chmod(0o755)  # pytest's tmp_path is under a mode-700 directory
    stores = {"wal-left": base / "wal-left", "checkpointed": base / "checkpointed"}
    try:
        env = clean_env(ARTSTORE_URL=str(stores["checkpointed"]), ARTSTORE_GROUP_READABLE="1")
        wrote = run_program("job.py", env)
        assert wrote["xla_compiles"], "the writer compiled nothing"
        # As the writer's process left it (its -wal and -shm beside the index)...
        shutil.copytree(stores["checkpointed"], stores["wal-left"])
        assert (stores["wal-left"] / "index.db-shm").exists()
        # ... and as a clean close leaves it: all in index.db, no -shm to share.
        listed = artstore("ls", "--json", env=env)
        keys = [e["key"] for e in json.loads(listed.stdout)]
        assert keys, listed.stderr
        with contextlib.closing(sqlite3.connect(stores["checkpointed"] / "index.db")) as conn:
            conn.execute("SELECT count(*) FROM entries").fetchone()
        assert not (stores["checkpointed"] / "index.db-shm").exists()
        for store in stores.values():
            _share_with_group(store, reader.uid)
            _chmod_tree(store, writable=False)
        denied = reader.run(["touch", str(base / "checkpointed" / "probe")], clean_env())
        assert denied.returncode != 0, "the reader can write the read-only store"
        yield Filled(base, stores, wrote["results"], keys, reader)
    finally:
        for store in stores.values():
            if store.exists():
                _chmod_tree(store, writable=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["checkpointed", "wal-left"])
def ro_store(filled: Filled, request: pytest.FixtureRequest) -> ReadOnlyStore:
    store = filled.stores[request.param]
    return ReadOnlyStore(filled.base, store, filled.results, filled.keys, filled.reader)


@pytest.mark.parametrize(
    "extra",
    [
        {"ARTSTORE_READ_ONLY": "1"},  # a private tier under the reader's cache
        {"ARTSTORE_LOCAL_TIER": "off"},  # detected: every load through the index
        {},  # detected; the store's own tier (its key map) serves
    ],
    ids=["read-only-setting", "detected-no-tier", "detected"],
)
def test_reader_loads_everything_and_writes_nothing(
    ro_store: ReadOnlyStore, extra: dict[str, str]
) -> None:
    before = _snapshot(ro_store.store)
    env = ro_store.env(**extra)
    proc = ro_store.reader.run([sys.executable, str(PROGRAMS / "job.py")], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["xla_compiles"] == []
    assert out["results"] == ro_store.results
    assert out["store"]["loads"] >= 2 and out["store"].get("compiles", 0) == 0, out["store"]
    said = [line for line in proc.stderr.splitlines() if line.startswith("artifactstore:")]
    assert len(said) <= 1, said  # at most: hits not recorded for LRU
    assert _snapshot(ro_store.store) == before


@pytest.mark.parametrize("extra", [{"ARTSTORE_READ_ONLY": "1"}, {}], ids=["setting", "detected"])
def test_index_writes_are_refused_in_one_line(
    ro_store: ReadOnlyStore, extra: dict[str, str]
) -> None:
    before = _snapshot(ro_store.store)
    env = ro_store.env(**extra)
    for args in (
        ["rm", ro_store.keys[0][:12]],
        ["rm", "--all", "--yes"],
        ["quota", "set", "default", "1G"],
        ["gc"],
    ):
        proc = ro_store.reader.run([sys.executable, "-m", "artifactstore", *args], env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0, (args, proc.stdout)
        assert len(lines) == 1 and lines[0].startswith("artstore: error: "), (args, lines)
        assert "read-only" in lines[0] or "READ_ONLY" in lines[0], (args, lines)
    assert _snapshot(ro_store.store) == before


@pytest.mark.parametrize("extra", [{"ARTSTORE_READ_ONLY": "1"}, {}], ids=["setting", "detected"])
def test_ls_stats_and_db_check_work(ro_store: ReadOnlyStore, extra: dict[str, str]) -> None:
    env = ro_store.env(**extra)
    listed = ro_store.reader.run([sys.executable, "-m", "artifactstore", "ls", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(e["key"] for e in json.loads(listed.stdout)) == sorted(ro_store.keys)
    stats = ro_store.reader.run([sys.executable, "-m", "artifactstore", "stats"], env)
    assert stats.returncode == 0 and stats.stderr == "", stats.stderr
    assert str(len(ro_store.keys)) in stats.stdout
    checked = ro_store.reader.run([sys.executable, "-m", "artifactstore", "db", "check"], env)
    assert checked.returncode == 0 and "state:   ok" in checked.stdout, (
        checked.stdout + checked.stderr
    )


def test_no_migration_is_attempted_on_a_read_only_index(filled: Filled) -> None:
    store = filled.base / "old-schema"
    made = artstore(
        "db", "upgrade", "0001", env=clean_env(ARTSTORE_URL=str(store), ARTSTORE_GROUP_READABLE="1")
    )
    assert made.returncode == 0, made.stderr
    _share_with_group(store, filled.reader.uid)
    _chmod_tree(store, writable=False)
    before = _snapshot(store)
    env = clean_env(ARTSTORE_URL=str(store), ARTSTORE_LOCAL_TIER="off")
    for args, needle in (
        (["ls"], "run `artstore db upgrade`"),
        (["db", "upgrade"], "cannot migrate"),
    ):
        proc = filled.reader.run([sys.executable, "-m", "artifactstore", *args], env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and needle in lines[0], (args, lines)
    assert _snapshot(store) == before  # not even a migration lock file


# -- ARTSTORE_READ_ONLY on a store this process could write (also test_readonly_index)
def test_reader_setting_creates_no_index(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_READ_ONLY="1")
    proc = artstore("ls", env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "no index at" in lines[0], lines
    assert not (tmp_path / "store" / "index.db").exists()
