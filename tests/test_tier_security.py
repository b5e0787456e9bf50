"""Another local user cannot plant an executable a victim loads (issue 15, item 3).

The tier's name is predictable, so on a shared host another user could make it
first, or find it writable. Directories this process writes must be its own and
writable by no one else (artifactstore/blobstores/safedir.py); files are opened without
following symbolic links. A refused tier is not used, and the program still gets
its results from the store. The second user is real where it matters (uid 65534
through setpriv, tests/otheruser.py); reading a shared read-only store as another
user is tests/test_readonly_sqlite.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, TEAM_PUB, TEAM_SIGNING, clean_env, devstack, run_program
from otheruser import OTHER_UID, other_user

from artifactstore import config
from artifactstore.blobstores import safedir
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.config.host import compute
from artifactstore.errors import CorruptObject, UnsafeDirectory
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.process import notices
from artifactstore.store import Store
from artifactstore.store.tier import LocalTier, TierEntry
from artifactstore.store.tiers import open_tier

KEY, OTHER_KEY = "a" * 64, "b" * 64


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notices, "_warned", set())  # each test sees its own "warn once"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can write, sticky like /tmp (a shared scratch or cache
    directory), where the other user can reach it (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="artstore-shared-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _blobs(root: Path, top: Path) -> LocalBlobStore:
    """A tier's directory as open_tier makes a private one."""
    return LocalBlobStore(root, "t", top=top, setting="ARTSTORE_LOCAL_TIER")


def _tier(root: Path) -> LocalTier:
    return LocalTier(_blobs(root, root), owns_objects=True)


def _remember(t: LocalTier, key: str, data: bytes) -> TierEntry:
    entry = TierEntry(hashlib.sha256(data).hexdigest(), "f" * 64, 1.0)
    t.remember(key, entry, data)
    return entry


def _modes(root: Path) -> set[tuple[str, int]]:
    return {("d" if p.is_dir() else "f", stat.S_IMODE(p.stat().st_mode))
            for p in [root, *root.rglob("*")] if not p.name.startswith("index.db")}  # fmt: skip


def _tree(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*"))


# -- what this process creates is private ---------------------------------------
def test_tier_and_store_directories_are_created_private(tmp_path: Path) -> None:
    t = _tier(tmp_path / "tiers")
    _remember(t, KEY, b"object")
    t.quick.remember("c" * 64, 0.01)
    t.quick.save()
    t.record_access(KEY)
    t.write_journal()
    assert _modes(tmp_path / "tiers") == {("d", 0o700), ("f", 0o600)}

    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    for extra, dirs, files in (
        ({}, 0o700, 0o600),
        ({"ARTSTORE_GROUP_READABLE": "1"}, 0o750, 0o640),
    ):
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
        store = Store.open(config.resolve(environ={**env, **extra}))
        store.put(Put(KEY, b"x", _fp(), "m", 1))
        store.close()
        assert _modes(tmp_path / "store") == {("d", dirs), ("f", files)}, extra


def test_an_existing_store_made_with_old_modes_keeps_working(tmp_path: Path) -> None:
    """0755 directories and 0644 files from before: the owner's, writable by no one else."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = Store.open(config.resolve(environ=env))
    store.put(Put(KEY, b"x", _fp(), "m", 1))
    store.close()
    for path in [tmp_path / "store", *(tmp_path / "store").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    store = Store.open(config.resolve(environ=env))
    assert store.get(KEY, _fp().digest) is not None
    store.put(Put(OTHER_KEY, b"y", _fp(), "m", 1))
    store.close()
    # Group-writable (a umask of 002): refused with the fix, never chmod-ed behind the owner.
    (tmp_path / "store").chmod(0o775)
    with pytest.raises(UnsafeDirectory, match=r"writable by other users.*chmod go-w"):
        Store.open(config.resolve(environ=env))
    assert stat.S_IMODE((tmp_path / "store").stat().st_mode) == 0o775


# -- another user's tier is never read ------------------------------------------
def test_victim_refuses_a_tier_another_user_made_and_still_loads(
    tmp_path: Path, shared: Path
) -> None:
    """The predictable tier directory, made by another user in a shared (sticky) cache
    directory and filled with a tier (a genuine one here: loading it at all is the
    failure), is not read; the program loads its executables from the store."""
    attacker = other_user()
    store = tmp_path / "store"
    wrote = run_program("job.py", clean_env(ARTSTORE_URL=str(store)))
    assert wrote["xla_compiles"]
    # A reader of the store (read-only: a private tier) fills a tier in its own cache...
    own_cache = tmp_path / "own-cache"
    reader = dict(ARTSTORE_URL=str(store), ARTSTORE_READ_ONLY="1", ARTSTORE_MIN_COMPILE_SECS="1")
    first = run_program("job.py", clean_env(XDG_CACHE_HOME=str(own_cache), **reader))
    assert first["xla_compiles"] == [] and first["results"] == wrote["results"]
    # ... which the other user plants in the victim's shared cache directory.
    cache = shared / "cache"
    made = attacker.run(["mkdir", "-p", str(cache)])
    assert made.returncode == 0, made.stderr
    shutil.copytree(own_cache / "artifactstore", cache / "artifactstore")
    for path in [cache, *cache.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    planted = _tree(cache)

    out = run_program("job.py", clean_env(XDG_CACHE_HOME=str(cache), **reader))
    assert out["results"] == wrote["results"]
    assert out["xla_compiles"] == [] and out["store"].get("tier_hits", 0) == 0, out["store"]
    said = [line for line in out["_stderr"].splitlines() if "local tier not used" in line]
    assert len(said) == 1 and f"owned by uid {OTHER_UID}" in said[0], out["_stderr"]
    assert _tree(cache) == planted  # nothing read into, nothing written


def test_a_tier_writable_by_others_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _remember(_tier(tmp_path / "tiers"), KEY, b"object")
    (tmp_path / "tiers" / "t").chmod(0o777)
    t = _tier(tmp_path / "tiers")  # the next process
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert t.lookup(KEY) is None and not t.has_entries()
        _remember(t, OTHER_KEY, b"other")
        assert t.lookup(KEY) is None
    warned = [r.getMessage() for r in caplog.records if "local tier not used" in r.getMessage()]
    assert len(warned) == 1 and "chmod go-w" in warned[0], warned
    assert not (t.keys / OTHER_KEY[:2]).exists()  # nothing written into it either
    # Its root writable by everyone, without the sticky bit: anyone could swap the tier.
    (tmp_path / "tiers" / "t").chmod(0o700)
    (tmp_path / "tiers").chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="writable by other users"):
        _tier(tmp_path / "tiers").check()
    parent = tmp_path / "shared"
    parent.mkdir(mode=0o777)
    parent.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="not sticky"):
        LocalTier(_blobs(parent / "tiers", parent / "tiers"), owns_objects=True).check()
    parent.chmod(0o1777)  # as /tmp: fine, others cannot rename what is ours
    _remember(LocalTier(_blobs(parent / "tiers", parent / "tiers"), owns_objects=True), KEY, b"o")


def test_the_other_user_cannot_write_into_a_tier(tmp_path: Path, shared: Path) -> None:
    t = _tier(shared / "tiers")
    _remember(t, KEY, b"object")
    attacker = other_user()
    for target in (t.keys / KEY[:2] / "planted", t.blobs.objects / "planted", t.base / "x"):
        denied = attacker.run(["touch", str(target)])
        assert denied.returncode != 0 and not target.exists(), target
    moved = attacker.run(["mv", str(shared / "tiers"), str(shared / "gone")])
    assert moved.returncode != 0 and t.lookup(KEY) is not None  # sticky: ours stays ours


def test_the_tier_root_made_by_another_user_is_refused(tmp_path: Path, shared: Path) -> None:
    """`top` must be ours too: its owner could otherwise replace the tier inside it."""
    made = other_user().run(["mkdir", "-m", "755", str(shared / "tiers")])
    assert made.returncode == 0, made.stderr
    env = clean_env(ARTSTORE_URL="s3://bucket/p", ARTSTORE_INDEX="sqlite:////nonexistent/i.db",
                    ARTSTORE_LOCAL_TIER=str(shared / "tiers"))  # fmt: skip
    t = open_tier(config.resolve(environ=env))
    assert t is not None and t.lookup(KEY) is None
    _remember(t, KEY, b"object")
    assert list((shared / "tiers").iterdir()) == []
    with pytest.raises(UnsafeDirectory, match=f"owned by uid {OTHER_UID}.*ARTSTORE_LOCAL_TIER"):
        t.check()


# -- files are never read through a symbolic link --------------------------------
def test_symlinked_tier_files_are_not_followed(tmp_path: Path) -> None:
    t = _tier(tmp_path / "tiers")
    _remember(t, KEY, b"one")
    other = _remember(t, OTHER_KEY, b"two")
    key_file = t.keys / KEY[:2] / KEY
    key_file.unlink()
    key_file.symlink_to(t.keys / OTHER_KEY[:2] / OTHER_KEY)
    assert t.lookup(KEY) is None and not key_file.is_symlink()  # dropped, not followed
    assert t.lookup(OTHER_KEY) == other
    # An object that is a link (to another object, or anywhere) is corrupt, never read.
    blobs = LocalBlobStore(tmp_path / "tiers", "t")
    obj = blobs.objects / other.digest[:2] / other.digest
    target = tmp_path / "elsewhere"
    obj.rename(target)
    obj.symlink_to(target)
    with pytest.raises(CorruptObject, match="not a regular file"):
        blobs.get(other.digest)
    # So is the below-threshold list (a link to a file the victim may not mean to share):
    # the file it points at names "c" * 64 as quick, so following it would answer.
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps({"c" * 64: [0.01, time.time() + 3600]}))
    below = t.base / "below-threshold.json"
    below.symlink_to(listed)
    assert _tier(tmp_path / "tiers").quick.get("c" * 64) is None
    below.unlink()
    below.write_bytes(listed.read_bytes())  # the same list, as a file: read
    assert _tier(tmp_path / "tiers").quick.get("c" * 64) == 0.01


def test_a_symlinked_tier_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _remember(_tier(elsewhere), KEY, b"object")
    (tmp_path / "tiers").mkdir(mode=0o700)
    (tmp_path / "tiers" / "t").symlink_to(elsewhere / "t")
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        _tier(tmp_path / "tiers").check()


# -- another user's store: read only signed, read-only, with keys trusted -------------
def test_another_users_store_is_read_only_with_signatures_required(tmp_path: Path) -> None:
    """ARTSTORE_READ_ONLY=1 alone no longer trusts the directory's owner (issue 38: that
    advice ran an attacker's store); read-only with signatures required and its writer's
    key trusted, the files decide nothing and the store is read."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), **TEAM_SIGNING)
    store = Store.open(config.resolve(environ=env))
    store.put(Put(KEY, b"x", _fp(), "m", 1))
    store.close()
    for path in [tmp_path / "store", *(tmp_path / "store").rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID)
    plain = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    for extra in ({}, {"ARTSTORE_READ_ONLY": "1"}):
        with pytest.raises(UnsafeDirectory, match=f"uid {OTHER_UID}") as err:
            Store.open(config.resolve(environ={**plain, **extra}))
        assert "READ_ONLY" not in str(err.value) and "REQUIRE_SIGNATURES" not in str(err.value)
        assert "ARTSTORE_URL to a directory of yours" in str(err.value)
    signed = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_REQUIRE_SIGNATURES": "1"}
    signed["ARTSTORE_TRUSTED_KEYS"] = str(TEAM_PUB)
    reader = Store.open(config.resolve(environ={**plain, **signed}))
    assert reader.get(KEY, _fp().digest) is not None
    reader.close()


def test_secure_dir_rejects_a_file_and_creates_missing_parents_private(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):  # in the way: an OSError, as for mkdir
        safedir.secure_dir(tmp_path / "file")
    assert not safedir.secure_dir(tmp_path / "a" / "b", create=False)
    assert safedir.secure_dir(tmp_path / "a" / "b" / "c", top=tmp_path / "a" / "b")
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700


# -- item 9: infra/devstack.py and the warm hook ----------------------------------
def test_devstack_refuses_a_state_directory_another_user_made(
    tmp_path: Path,
    shared: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    state = devstack.state_dir()
    attacker = other_user()
    planted = json.dumps({"pid": os.getpid(), "port": 1, "endpoint": "http://evil:1"})
    made = attacker.run(
        ["sh", "-c", f"mkdir -m 755 {state} && echo '{planted}' > {state}/state.json"]
    )
    assert made.returncode == 0, made.stderr
    assert devstack.main(["env"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and f"owned by uid {OTHER_UID}" in err, err
    shutil.rmtree(state)
    state.symlink_to(tmp_path)
    assert devstack.main(["env"]) == 1 and "symbolic link" in capsys.readouterr().err
    state.unlink()
    assert devstack.secure_state_dir(create=True) == state
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_devstack_exports_are_quoted_for_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = "http://127.0.0.1:1/$(touch pwned) `touch pwned2`; x='y'"
    devstack._print_exports(endpoint)
    exports = capsys.readouterr().out
    shown = subprocess.run(
        ["bash", "-c", 'eval "$1"; printf %s "$AWS_ENDPOINT_URL_S3"', "-", exports],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout == endpoint and list(tmp_path.iterdir()) == []


def test_warm_hook_on_the_path_twice_through_a_symlink_runs_once(tmp_path: Path) -> None:
    hook = REPO / "artifactstore" / "startup"
    link = tmp_path / "link"
    link.symlink_to(hook)
    other = tmp_path / "other"  # the next sitecustomize (Debian, conda) still runs, once
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('chained')\n")
    proc = subprocess.run(
        [sys.executable, "-c", "print('main')"],
        env=clean_env(PYTHONPATH=os.pathsep.join([str(hook), str(link), str(other)])),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    assert proc.stdout == "chained\nmain\n"
