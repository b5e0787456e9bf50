"""The local tier's directories are checked on every open, from `/` (issue 29, point 5).

Measured on main: the tier accepted an ancestor directory its group could write,
and checked its directories once per process, so a directory renamed away and
replaced (by a link to, or a copy of, an attacker's directory) under a running
process planted an executable. Now every open walks from `/` through directory
descriptors (O_NOFOLLOW, each opened relative to the last, artifactstore/blobstores/safedir.py):
an ancestor writable by its group or by everyone is refused unless it is root's
and sticky (like /tmp); a link or a directory that is not ours is refused at the
next open. A refused tier is off for the process (one line); the program still
gets its results from the store. The swap is done by this (root) test process
standing in for a user who can write the directory above the tier, which the
old code let exist; the second uid is real where ownership matters
(tests/otheruser.py). Patterns from tests/test_tier_security.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env, run_program
from otheruser import OTHER_UID

from artifactstore import config
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.config.host import compute
from artifactstore.errors import UnsafeDirectory
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.process import notices
from artifactstore.store import Store
from artifactstore.store.tier import LocalTier, TierEntry

KEY = "a" * 64


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notices, "_warned", set())  # each test sees its own "warn once"


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another uid (chown)")


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _tier(root: Path) -> LocalTier:
    return LocalTier(
        LocalBlobStore(root, "t", top=root, setting="ARTSTORE_LOCAL_TIER"), owns_objects=True
    )


def _remember(t: LocalTier, data: bytes) -> None:
    t.remember(KEY, TierEntry(hashlib.sha256(data).hexdigest(), "f" * 64, 1.0), data)


def _namespace(store: Path) -> Path:
    """A local store's namespace directory: laid out as a tier (keys/, objects/)."""
    [found] = [d for d in store.iterdir() if (d / "keys").is_dir()]
    return found


def _load(store: Store) -> bytes | None:
    """KEY's executable as the compile hook loads it (Session.tier_get, then the store)."""
    assert store.parts.tier is not None
    hit = store.parts.tier.get(KEY, _fp().digest) or store.get(KEY, _fp().digest)
    return None if hit is None else hit.payload


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "local tier not used" in r.getMessage()]


# -- ancestors -------------------------------------------------------------------
def test_a_group_writable_ancestor_turns_the_tier_off_and_the_program_still_works(
    tmp_path: Path,
) -> None:
    """A cache directory under a group's directory (mode 775, a umask of 002): its
    group could rename the tier away and put theirs in its place. One line, no tier,
    nothing created there, results from the store."""
    store = tmp_path / "store"
    wrote = run_program("job.py", clean_env(ARTSTORE_URL=str(store)))
    assert wrote["xla_compiles"]
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)
    reader = dict(ARTSTORE_URL=str(store), ARTSTORE_READ_ONLY="1", ARTSTORE_MIN_COMPILE_SECS="1")
    out = run_program("job.py", clean_env(XDG_CACHE_HOME=str(team / "cache"), **reader))
    assert out["results"] == wrote["results"] and out["xla_compiles"] == []
    assert out["store"].get("tier_hits", 0) == 0, out["store"]
    said = [line for line in out["_stderr"].splitlines() if "local tier not used" in line]
    assert len(said) == 1, out["_stderr"]
    assert f"{team} is writable by other users" in said[0] and "chmod go-w" in said[0], said
    assert list(team.iterdir()) == []  # no tier made under it


def test_only_a_root_owned_sticky_ancestor_may_be_writable_by_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, as_root: None
) -> None:
    # /tmp itself (root's, sticky, writable by all) is fine: others cannot rename ours.
    under_tmp = Path(tempfile.mkdtemp(dir="/tmp")) / "tiers"
    try:
        _remember(_tier(under_tmp), b"object")
        assert _tier(under_tmp).lookup(KEY) is not None
    finally:
        shutil.rmtree(under_tmp.parent)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    t = _tier(shared / "tiers")
    _remember(t, b"object")
    assert t.lookup(KEY) is not None
    # The same directory given to another user: its owner may rename anything in it.
    os.chown(shared, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert t.lookup(KEY) is None  # the process that checked it before: checked again
        assert _tier(shared / "tiers").lookup(KEY) is None and not t.has_entries()
    [said] = _refusals(caplog)
    assert f"{shared} is writable by other users, and not sticky and owned by root" in said
    # Sticky and only group-writable, another user's: refused the same.
    shared.chmod(0o1770)
    with pytest.raises(UnsafeDirectory, match="writable by other users"):
        _tier(shared / "tiers").check()
    os.chown(shared, 0, 0)
    assert _tier(shared / "tiers").lookup(KEY) is not None  # root's again: fine


# -- swaps under a running process -------------------------------------------------
@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Store]:
    """A reader of a local store (read-only: a private tier under ARTSTORE_LOCAL_TIER)
    whose tier holds KEY, and an attacker's directory laid out as a tier, holding
    their own executable for KEY (a genuine entry of their store: it verifies)."""
    for name, payload in (("store", b"genuine"), ("evil", b"planted")):
        writer = Store.open(config.resolve(environ=clean_env(ARTSTORE_URL=str(tmp_path / name))))
        writer.put(Put(KEY, payload, _fp(), "m", 1))
        writer.close()
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_READ_ONLY="1",
                    ARTSTORE_LOCAL_TIER=str(tmp_path / "tiers"))  # fmt: skip
    store = Store.open(config.resolve(environ=env))
    assert _load(store) == b"genuine"
    assert (
        store.parts.tier is not None and store.parts.tier.get(KEY, _fp().digest) is not None
    )  # a tier hit
    yield store
    store.close()


@pytest.mark.parametrize("swap", ["link", "directory"])
def test_a_tier_swapped_under_a_running_reader_is_refused_at_the_next_open(
    tmp_path: Path, reader: Store, caplog: pytest.LogCaptureFixture, swap: str, as_root: None
) -> None:
    assert reader.parts.tier is not None
    base = reader.parts.tier.base
    evil = _namespace(tmp_path / "evil")
    assert (evil / "keys" / KEY[:2] / KEY).is_file()
    base.rename(tmp_path / "moved-away")
    if swap == "link":
        base.symlink_to(evil)
    else:  # a copy of theirs, theirs
        shutil.copytree(evil, base)
        for path in [base, *base.rglob("*")]:
            os.chown(path, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        for _ in range(2):
            assert _load(reader) == b"genuine"  # from the store, not theirs
    [said] = _refusals(caplog)
    why = "is a symbolic link" if swap == "link" else f"is owned by uid {OTHER_UID}"
    assert f"{base} {why}" in said, said


def test_a_local_store_swapped_under_its_writer_loads_nothing_planted(tmp_path: Path) -> None:
    """A writable local store is its own tier: the store's own reads walk the same way."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = Store.open(config.resolve(environ=env))
    store.put(Put(KEY, b"genuine", _fp(), "m", 1))
    evil = Store.open(config.resolve(environ=clean_env(ARTSTORE_URL=str(tmp_path / "evil"))))
    evil.put(Put(KEY, b"planted", _fp(), "m", 1))
    evil.close()
    assert store.parts.tier is not None
    base = store.parts.tier.base
    base.rename(tmp_path / "moved-away")
    base.symlink_to(_namespace(tmp_path / "evil"))
    refused = ""
    try:
        loaded = _load(store)
    except UnsafeDirectory as exc:  # the compile hook compiles instead (Session.lookup)
        refused, loaded = str(exc), None
    assert loaded is None  # the genuine entry moved away; the planted one is never loaded
    # ... because the walk refused the link, not because nothing was there to load.
    assert "is a symbolic link" in refused or store.parts.tier._off, refused
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        store.put(Put("b" * 64, b"x", _fp(), "m", 1))
    assert not any((tmp_path / "evil").rglob("b" * 64))  # nothing written through it
    store.close()
