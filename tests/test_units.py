"""Unit tests of the pieces below the JAX adapter: config, sizes, codec, blobs, index, store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import OpenStore

from artifactstore import config
from artifactstore.blobstores import LocalBlobStore, ReadOnlyBlobStore
from artifactstore.config import host
from artifactstore.errors import ConfigError, CorruptObject, ReadOnlyError
from artifactstore.formats import codec, fingerprint, sizes
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.store import Store


def test_config_embedded_default_honours_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    s = config.resolve({}, environ={})
    assert s.embedded and s.blobs.scheme == "file"
    assert s.blobs.path == str(tmp_path / "artifactstore" / "objects")
    assert s.index_url == "sqlite:///" + str(tmp_path / "artifactstore" / "index.db")
    assert s.namespace == "default" and not s.read_only


def test_config_env_and_arguments(tmp_path: Path) -> None:
    env = {"ARTSTORE_URL": f"file://{tmp_path}/a", "ARTSTORE_NAMESPACE": "team-a",
           "ARTSTORE_READ_ONLY": "1", "ARTSTORE_MIN_COMPILE_SECS": "2.5"}  # fmt: skip
    s = config.resolve({}, environ=env)
    assert s.blobs.path == str(tmp_path / "a") and s.namespace == "team-a"
    assert s.read_only and s.min_compile_secs == 2.5
    assert s.index_url.endswith(str(tmp_path / "a" / "index.db"))
    s2 = config.resolve({"url": str(tmp_path / "b"), "read_only": False}, environ=env)
    assert s2.blobs.path == str(tmp_path / "b") and not s2.read_only
    s3 = config.resolve(
        {"url": "s3://team-jax/cache/x", "index": "postgresql://u@h/db"}, environ={}
    )
    assert (s3.blobs.bucket, s3.blobs.path) == ("team-jax", "cache/x")
    assert s3.index_url == "postgresql+psycopg://u@h/db"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"url": "ftp://x/y"}, "unsupported store URL scheme"),
        ({"url": "s3://"}, "invalid S3 bucket name"),
        ({"url": "s3://key:secret@bucket/x", "index": "sqlite:///x"}, "must not carry credentials"),
        ({"url": "/tmp/x", "index": "oracle://u@h/d"}, "unsupported index database"),
        ({"bogus": 1}, "unknown option 'bogus'"),
        ({"namespace": "../etc"}, "invalid namespace"),
        ({"namespace": "team\n"}, "invalid namespace"),  # `$` would match before it
        ({"url": "s3://team-jax\n/x", "index": "sqlite:///x"}, "control characters"),
        ({"min_compile_secs": -1}, "must be >= 0"),
        ({"timeout_secs": "inf"}, "must be >= 0.01 and <= 86400"),
        ({"timeout_secs": "1e12"}, "must be >= 0.01 and <= 86400"),
        ({"flush_secs": "nan"}, "must be >= 0 and <= 86400"),
        ({"url": "/tmp/x", "index": "postgresql://u:pa@ss-secret@h/db"}, "percent-encode"),
        ({"url": "/tmp/x", "index": "postgresql://u:12/secret@h/db"}, "percent-encode"),
        ({"url": "/tmp/x", "index": "postgresql://u:a/secret@h/db"}, "malformed index URL"),
        ({"s3_endpoint_url": "localhost:9000"}, "invalid S3 endpoint"),
    ],
)
def test_config_errors(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        config.resolve(overrides, environ={})
    assert "\n" not in str(info.value) and "secret" not in str(info.value)


def test_backends_check_the_namespace_too(tmp_path: Path) -> None:
    """A namespace is a path component and a key prefix: the backends check it as well,
    whoever built them."""
    from sqlalchemy import create_engine

    from artifactstore.blobstores import LocalBlobStore
    from artifactstore.blobstores.s3 import S3BlobStore
    from artifactstore.index.repo import EntryIndex

    for bad in ("team\n", "../x", "a/b", ""):
        with pytest.raises(ConfigError, match="invalid namespace"):
            LocalBlobStore(tmp_path, bad)
        with pytest.raises(ConfigError, match="invalid namespace"):
            S3BlobStore("bucket", "p", bad, None, 1.0)
        with pytest.raises(ConfigError, match="invalid namespace"):
            EntryIndex(create_engine("sqlite://"), bad)


def test_redact_url() -> None:
    from artifactstore.redact import redact

    assert redact("postgresql+psycopg://u:hunter2@h/db") == "postgresql+psycopg://u:***@h/db"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500G", 500 * 10**9), ("1.5TiB", int(1.5 * 2**40)), ("800MB", 800 * 10**6),
     ("1024", 1024), ("10 KiB", 10240), ("0", 0), ("2t", 2 * 10**12)],
)  # fmt: skip
def test_parse_size(text: str, expected: int) -> None:
    assert sizes.parse_size(text) == expected


@pytest.mark.parametrize("text", ["500Q", "-1G", "", "G", "1.2.3G", "ten"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        sizes.parse_size(text)


def test_format_size() -> None:
    assert sizes.format_size(512) == "512 B"
    assert sizes.format_size(1536) == "1.5 KiB"
    assert sizes.format_size(3 * 2**30) == "3.0 GiB"


FP = "ab" * 32


def test_codec_roundtrip_and_rejections() -> None:
    enc = codec.encode(b"executable bytes" * 100, FP)
    assert codec.decode(enc.data, digest=enc.digest, fingerprint=FP) == (b"executable bytes" * 100)
    flipped = bytearray(enc.data)
    flipped[-3] ^= 1
    with pytest.raises(CorruptObject):
        codec.decode(bytes(flipped), digest=enc.digest, fingerprint=FP)
    with pytest.raises(CorruptObject):
        codec.decode(enc.data[:20], digest=enc.digest, fingerprint=FP)
    with pytest.raises(codec.FingerprintMismatch):
        codec.decode(enc.data, digest=enc.digest, fingerprint="cd" * 32)


def test_local_blobstore(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path, "ns")
    digest = codec.digest_of(b"x")
    assert store.get(digest) is None
    assert store.put(digest, b"x") is True
    assert store.put(digest, b"x") is False
    assert store.get(digest) == b"x" and store.exists(digest)
    assert [b.digest for b in store.iter_blobs()] == [digest]
    assert not list(tmp_path.rglob(".tmp-*"))  # no temporary left behind
    assert list(LocalBlobStore(tmp_path, "other").iter_blobs()) == []
    store.quarantine(digest)
    assert store.get(digest) is None
    assert [b.digest for b in store.iter_quarantined()] == [digest]
    ro = ReadOnlyBlobStore(store)
    with pytest.raises(ReadOnlyError):
        ro.put(digest, b"x")
    with pytest.raises(ReadOnlyError):
        ro.delete(digest)


def test_schema_head_constant_matches_alembic() -> None:
    assert db.head_revision() == db.SCHEMA_HEAD


def test_migrations_concurrent_and_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/index.db"
    errors: list[BaseException] = []

    def migrate() -> None:
        engine = db.open_engine(url)
        try:
            db.upgrade(engine)
        except BaseException as exc:
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = db.open_engine(url)
    try:
        assert db.schema_status(engine).state is db.SchemaState.CURRENT
    finally:
        engine.dispose()


def _fp(**changes: object) -> fingerprint.Fingerprint:
    base = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    return fingerprint.Fingerprint.from_dict({**base.to_dict(), **changes})


def test_fingerprint_fields_name_every_field_once() -> None:
    assert sorted(fingerprint.FIELDS) == sorted(_fp().to_dict())
    assert len(set(fingerprint.FIELDS)) == len(fingerprint.FIELDS)


class CountingBlobs(LocalBlobStore):
    gets = 0

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        CountingBlobs.gets += 1
        return super().get(digest, max_bytes=max_bytes)


def test_store_refuses_forged_fingerprint_without_reading_bytes(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store({}, url=str(tmp_path))
    here, there = _fp(), _fp(cpu_features=("avx512f",))
    assert here.digest != there.digest
    store.put(Put("k" * 64, b"payload", fingerprint=there, module_name="m", compile_secs=1.0))
    store.parts.blobs = CountingBlobs(tmp_path, "default")
    assert store.get("k" * 64, here.digest) is None
    assert CountingBlobs.gets == 0
    assert store.parts.counters.snapshot()["fingerprint_mismatch"] == 1
    hit = store.get("k" * 64, there.digest)
    assert hit is not None and hit.payload == b"payload"


def _snapshot(root: Path) -> tuple[list[str], list[str]]:
    import sqlite3

    con = sqlite3.connect(root / "index.db")
    rows = [repr(r) for t in ("entries", "objects", "counters", "fingerprints")
            for r in con.execute(f"SELECT * FROM {t}")]  # fmt: skip
    con.close()
    return sorted(str(p) for p in (root / "default").rglob("*")), rows


def test_read_only_store_writes_nothing(tmp_path: Path, open_store: OpenStore) -> None:
    rw = Store.open(config.resolve({"url": str(tmp_path)}, environ={}))
    rw.put(Put("a" * 64, b"x", fingerprint=_fp(), module_name="m", compile_secs=1))
    rw.close()
    before = _snapshot(tmp_path)
    ro = open_store({}, url=str(tmp_path), read_only=True)
    assert ro.put(Put("k" * 64, b"x", fingerprint=_fp(), module_name="m", compile_secs=1)) is False
    assert ro.get("k" * 64, _fp().digest) is None
    assert ro.get("a" * 64, _fp().digest) is not None
    ro.flush(1)
    assert _snapshot(tmp_path) == before


def test_missing_object_is_a_counted_miss_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, open_store: OpenStore
) -> None:
    store = open_store({}, url=str(tmp_path))
    store.put(Put("a" * 64, b"x", fingerprint=_fp(), module_name="m", compile_secs=1))
    entry = store.parts.index.lookup("a" * 64)
    assert entry is not None
    for path in (tmp_path / "default" / "objects").rglob(entry.digest):
        path.unlink()
    with caplog.at_level("WARNING", logger="artifactstore"):
        assert store.get("a" * 64, _fp().digest) is None
    assert store.parts.counters.snapshot()["missing_object"] == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "which is gone" in said[0], said


def test_read_only_reader_does_not_claim_to_quarantine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, open_store: OpenStore
) -> None:
    rw = Store.open(config.resolve({"url": str(tmp_path)}, environ={}))
    rw.put(Put("a" * 64, b"payload", fingerprint=_fp(), module_name="m", compile_secs=1))
    rw.close()
    (obj,) = (tmp_path / "default" / "objects").rglob("*/*")
    obj.write_bytes(obj.read_bytes()[:-3] + b"xyz")
    ro = open_store({}, url=str(tmp_path), read_only=True)
    with caplog.at_level("WARNING", logger="artifactstore"):
        assert ro.get("a" * 64, _fp().digest) is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "not quarantined" in said and "ignored and quarantined" not in said
    assert obj.exists()  # a reader moves nothing


def test_breaker_opens_refuses_probes_and_closes(caplog: pytest.LogCaptureFixture) -> None:
    from artifactstore.process.breaker import Breaker

    now = [0.0]
    breaker = Breaker("store", failures=2, cooldown_secs=10, clock=lambda: now[0])
    with caplog.at_level("DEBUG", logger="artifactstore"):
        breaker.failure("first")
        assert breaker.closed and breaker.allow()  # one failure of two
        breaker.failure("second")
        assert not breaker.closed
        assert not breaker.allow() and not breaker.allow()  # cool-down: costs nothing
        now[0] = 10.0
        assert breaker.allow()  # the probe
        assert not breaker.allow()  # only one
        breaker.failure("probe failed")  # open again, for another cool-down
        now[0] = 15.0
        assert not breaker.allow()
        now[0] = 20.5
        assert breaker.allow()
        breaker.success()
        assert breaker.closed and breaker.allow()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings  # one when it opened, one when it closed
    assert "unavailable (second)" in warnings[0] and "answers again" in warnings[1]
    assert (breaker.opened, breaker.refused) == (2, 4)


def test_each_backend_has_its_own_breaker(tmp_path: Path) -> None:
    """A failure counts against the backend the call was using when it failed or hung;
    a success closes only the breakers of the backends it used (a miss never reaches
    the object store, so it cannot vouch for it)."""
    from artifactstore.runtime.session import Session

    session = Session(config.resolve({"url": str(tmp_path / "s"), "local_tier": "off"}, {}))
    session._using("index")
    session._using("object store")
    session.fail(TimeoutError())  # hung while fetching the object
    assert not session.breakers["object store"].closed and session.breakers["index"].closed
    assert session.store() is None and not session.active  # refused, at no cost
    stats = session.stats()
    assert stats["breaker_opened_object_store"] == 1 and "breaker_opened_index" not in stats
    session._used = ["index"]
    session.ok()  # a miss: the index answered
    assert not session.breakers["object store"].closed
    session.close()


def test_a_probe_that_misses_lets_the_next_call_probe(tmp_path: Path) -> None:
    """After the cool-down, a probe that never reaches the index (a hit found by its
    manifest) must not keep the index bypassed for another cool-down (found by
    bench/soak.py, then for the object store)."""
    import time

    from artifactstore.config.host import compute
    from artifactstore.runtime.session import Session

    settings = {"url": str(tmp_path / "s"), "local_tier": "off", "breaker_cooldown_secs": 0.2}
    session = Session(config.resolve(settings, {}))
    store = session.store()
    assert store is not None
    fp = compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    key = "1" * 64
    assert store.put(Put(key, b"x", fingerprint=fp, module_name="m", compile_secs=1))
    session.breakers["index"].failure("no answer within the bound")
    assert session.store() is None  # cooling down
    time.sleep(0.25)
    for _ in range(3):  # each call probes at once: no cool-down between them
        assert session.store() is store
        assert store.get(key, fp.digest) is not None  # by its manifest: the index not asked
        session.ok()
        assert not session.breakers["index"].closed  # no verdict on it yet
    assert session.store() is store
    session._used = ["object store", "index"]
    session.ok()  # a call that asked the index: it answers again
    assert session.active
    session.close()


BREAKER_PROGRAM = """
import json, os, sys, time
import jax, jax.numpy as jnp
import artifactstore
artifactstore.configure(breaker_cooldown_secs=3.0)
x = jnp.ones(3)
jax.jit(lambda v: v * 2 + 1)(x).block_until_ready()  # the store cannot open
jax.jit(lambda v: v * 3 - 1)(x).block_until_ready()  # breaker open: not even tried
os.remove(sys.argv[1])  # the store's directory can be made again: it is back
time.sleep(3.2)
jax.jit(lambda v: v - 5)(x).block_until_ready()  # the probe opens it and stores
artifactstore.flush()
print(json.dumps(artifactstore.process_stats()))
"""


def test_store_breaker_recovers_in_a_running_program(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from conftest import clean_env

    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's directory should be")
    env = clean_env(ARTSTORE_URL=str(blocker / "store"), ARTSTORE_TIMEOUT="5")
    proc = subprocess.run(
        [sys.executable, "-c", BREAKER_PROGRAM, str(blocker)],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    # Opened once, and again after any probe that came before the directory was back.
    assert stats["breaker_opened"] >= 1 and stats["breaker_refused"] >= 1, stats
    assert stats["stored"] >= 1 and stats["active"] == 1, stats
    lines = [line for line in proc.stderr.splitlines() if "artifactstore" in line]
    assert len(lines) == 2, proc.stderr
    assert "index unavailable" in lines[0] and "answers again" in lines[1]  # SQLite: no dir
    assert stats["breaker_opened_index"] == stats["breaker_opened"]
