"""Limits (issue 15 item 7): decompression bombs and oversized objects are misses.

A reader loads at most ARTSTORE_MAX_OBJECT_SIZE of stored object and inflates at most
ARTSTORE_MAX_EXECUTABLE_SIZE of executable; the size a payload frame declares must
equal the size its metadata and its index entry recorded. Over a limit: a miss, counted
`over_limit`, one log line, the object left alone (another reader may allow it). A size
that lies: a miss, counted `corrupt`, the object quarantined. Never an exception out of
`Store.get`, never the memory the bomb asks for.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import resource
import uuid
from pathlib import Path

import pytest
import tamper
import zstandard
from conftest import clean_env, run_program

from artifactstore import config
from artifactstore.blobstores import LocalBlobStore
from artifactstore.config import host
from artifactstore.errors import ConfigError, CorruptObject, OverLimit
from artifactstore.formats import codec, fingerprint, frames
from artifactstore.formats.put import Put
from artifactstore.store import Store
from artifactstore.store.tiers import open_tier

GiB = 1 << 30
BOMB_SIZE = 2 * GiB
KEY = "b0" * 32


def _fp() -> fingerprint.Fingerprint:
    return host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def open_store(tmp_path: Path, **env: str) -> Store:
    return Store.open(config.resolve({"url": str(tmp_path / "s")}, env))


@functools.cache
def bomb_frame() -> bytes:
    """A zstd frame declaring and holding 2 GiB of zeros: ~64 KiB, built in ~1 s from a
    1 MiB buffer (never 2 GiB in memory)."""
    comp = zstandard.ZstdCompressor(level=1).compressobj(size=BOMB_SIZE)
    chunk = bytes(1 << 20)
    parts = [comp.compress(chunk) for _ in range(BOMB_SIZE // len(chunk))]
    frame = b"".join(parts) + comp.flush()
    assert zstandard.frame_content_size(frame) == BOMB_SIZE and len(frame) < 1 << 20
    return frame


def lying_frame(declared: int) -> bytes:
    """The bomb with its header's content size rewritten: it declares `declared` bytes
    and still holds 2 GiB."""
    frame = bomb_frame()
    at = frame.index(BOMB_SIZE.to_bytes(4, "little"), 0, 18)  # Frame_Content_Size
    forged = frame[:at] + declared.to_bytes(4, "little") + frame[at + 4 :]
    assert zstandard.frame_content_size(forged) == declared
    return forged


def envelope(frame: bytes, fp: fingerprint.Fingerprint, *, key: str, raw_size: int) -> bytes:
    """An object exactly as `codec.encode` writes one, with `frame` as its payload."""
    meta = codec.ObjectMeta(
        key=key,
        module_name="jit_bomb",
        compile_secs=1.0,
        raw_size=raw_size,
        producer_host="h",
        fingerprint=fp.to_dict(),
    )
    empty = codec.encode(b"", fp.digest).data
    head, empty_frame = empty[: frames.HEADER_LEN], empty[frames.HEADER_LEN :]
    with_meta = codec.encode(b"", fp.digest, meta).data
    return head + frame + with_meta[len(head) + len(empty_frame) :]


def point_entry_at(store: Store, key: str, data: bytes, *, raw_size: int) -> str:
    """Forge the entry: `key` now names the object `data` (stored under its digest)."""
    digest = codec.digest_of(data)
    store.parts.blobs.put(digest, data)
    tamper.point(store, key, digest, size=len(data), raw_size=raw_size)
    return digest


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- settings -----------------------------------------------------------------
def test_limits_have_defaults_and_parse_sizes() -> None:
    s = config.resolve({"url": "/tmp/x"}, {})
    assert s.max_object_bytes == config.defaults.DEFAULT_MAX_OBJECT_BYTES == 4 * GiB
    assert s.max_executable_bytes == config.defaults.DEFAULT_MAX_EXECUTABLE_BYTES == 8 * GiB
    env = {"ARTSTORE_MAX_OBJECT_SIZE": "500M", "ARTSTORE_MAX_EXECUTABLE_SIZE": "4GiB"}
    s = config.resolve({"url": "/tmp/x"}, env)
    assert (s.max_object_bytes, s.max_executable_bytes) == (500 * 1000**2, 4 * GiB)
    s = config.resolve({"url": "/tmp/x", "max_executable_size": 1234}, env)  # option wins
    assert s.max_executable_bytes == 1234


@pytest.mark.parametrize("value", ["lots", "-1", "4 parsecs", "0"])
@pytest.mark.parametrize("name", ["MAX_OBJECT_SIZE", "MAX_EXECUTABLE_SIZE"])
def test_bad_limits_are_one_line_config_errors(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.resolve({"url": "/tmp/x"}, {f"ARTSTORE_{name}": value})
    message = str(err.value)
    assert f"ARTSTORE_{name}" in message and "\n" not in message


# -- the codec ------------------------------------------------------------------
def _decode(data: bytes, **kw: object) -> bytes:
    digest, fp = codec.digest_of(data), _fp().digest
    return codec.decode(data, digest=digest, fingerprint=fp, key=KEY, **kw)  # type: ignore[arg-type]


def test_codec_checks_declared_size_before_inflating() -> None:
    fp = _fp()
    payload = os.urandom(3000)
    meta = codec.ObjectMeta(key=KEY, module_name="m", compile_secs=1.0, raw_size=3000,
                            producer_host="h", fingerprint=fp.to_dict())  # fmt: skip
    good = codec.encode(payload, fp.digest, meta).data
    assert _decode(good, raw_size=3000, max_raw_size=3000) == payload
    with pytest.raises(OverLimit, match="ARTSTORE_MAX_EXECUTABLE_SIZE"):
        _decode(good, max_raw_size=2999)
    with pytest.raises(CorruptObject, match="its entry says 2000") as err:
        _decode(good, raw_size=2000)  # the index row disagrees
    assert not isinstance(err.value, OverLimit)
    lying_meta = codec.encode(payload, fp.digest, dataclasses.replace(meta, raw_size=7))
    with pytest.raises(CorruptObject, match="its metadata says 7"):
        _decode(lying_meta.data)
    # A frame that does not declare its size is never inflated blind.
    blind = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    with pytest.raises(CorruptObject, match="does not declare"):
        _decode(envelope(blind, fp, key=KEY, raw_size=3000))
    # A header declaring less than the frame holds cannot inflate past what it declared.
    with pytest.raises(CorruptObject, match="does not decompress"):
        _decode(envelope(lying_frame(1 << 20), fp, key=KEY, raw_size=1 << 20), max_raw_size=GiB)


# -- the store: bombs and oversized objects are misses --------------------------
@pytest.mark.parametrize(
    "case",
    [
        "object-replaced",  # the file overwritten in place: its digest no longer matches
        "entry-disagrees",  # a forged row and object: 2 GiB declared, the entry says 700 B
        "header-lies",  # declares 1 MiB everywhere, holds 2 GiB
        "over-limit",  # honest 2 GiB everywhere, over this reader's 1 GiB
    ],
)
def test_decompression_bomb_is_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    env = {"ARTSTORE_MAX_EXECUTABLE_SIZE": "1GiB"} if case == "over-limit" else {}
    store = open_store(tmp_path, **env)
    fp = _fp()
    store.put(Put(KEY, b"genuine" * 100, fingerprint=fp, module_name="m", compile_secs=1.0))
    genuine = store.parts.index.lookup(KEY)
    assert genuine is not None and genuine.raw_size == 700
    bomb = envelope(bomb_frame(), fp, key=KEY, raw_size=BOMB_SIZE)
    if case == "object-replaced":
        path = store.parts.blobs._path(genuine.digest)  # type: ignore[attr-defined]
        path.write_bytes(bomb)
        digest = genuine.digest
    elif case == "entry-disagrees":
        digest = point_entry_at(store, KEY, bomb, raw_size=700)
    elif case == "header-lies":
        liar = envelope(lying_frame(1 << 20), fp, key=KEY, raw_size=1 << 20)
        digest = point_entry_at(store, KEY, liar, raw_size=1 << 20)
    else:
        digest = point_entry_at(store, KEY, bomb, raw_size=BOMB_SIZE)

    before = peak_rss()
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert store.get(KEY, fp.digest) is None
        assert store.get(KEY, fp.digest) is None  # and again: still one log line
    assert peak_rss() - before < 256 << 20, "the bomb was inflated"
    counts = store.parts.counters.snapshot()
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    if case == "over-limit":
        # Bigger than this reader allows, but nothing says it is damaged: left in place.
        assert counts["over_limit"] == 2 and "corrupt" not in counts
        assert "over this reader's limit" in lines[0] and "2.0 GiB" in lines[0]
        assert store.parts.blobs.exists(digest) and store.parts.index.lookup(KEY) is not None
    else:
        # Its sizes (or digest) lie: quarantined, the entry dropped so a compile stores anew.
        assert counts["corrupt"] == 1 and "over_limit" not in counts
        assert "quarantined" in lines[0]
        assert not store.parts.blobs.exists(digest) and store.parts.index.lookup(KEY) is None
        assert digest in {b.digest for b in store.parts.blobs.iter_quarantined()}
    assert counts["lookups_missed"] == 2
    store.close()


def test_oversized_object_is_a_miss_before_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fp = _fp()
    writer = open_store(tmp_path)
    payload = os.urandom(5000)  # incompressible: the object is over 5 KB
    writer.put(Put(KEY, payload, fingerprint=fp, module_name="m", compile_secs=1.0))
    entry = writer.parts.index.lookup(KEY)
    assert entry is not None and entry.size > 5000

    small = open_store(tmp_path, ARTSTORE_MAX_OBJECT_SIZE="1K")
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert small.get(KEY, fp.digest) is None
    counted = {name: n for name, n in small.parts.counters.snapshot().items() if n}
    assert counted == {"lookups_missed": 1, "over_limit": 1}
    lines = warnings_of(caplog)
    assert len(lines) == 1 and "ARTSTORE_MAX_OBJECT_SIZE" in lines[0], lines
    # Not quarantined: a reader with a higher limit (the default) still loads it.
    hit = writer.get(KEY, fp.digest)
    assert hit is not None and hit.payload == payload

    blobs = LocalBlobStore(tmp_path / "s", "default")
    with pytest.raises(OverLimit):
        blobs.get(entry.digest, max_bytes=entry.size - 1)
    assert blobs.get(entry.digest, max_bytes=entry.size) == blobs.get(entry.digest)
    writer.close()
    small.close()


def test_declared_size_must_equal_the_entrys_raw_size(tmp_path: Path) -> None:
    """A genuine object whose entry records another size is refused and quarantined."""
    fp = _fp()
    store = open_store(tmp_path)
    store.put(Put(KEY, b"x" * 4096, fingerprint=fp, module_name="m", compile_secs=1.0))
    entry = store.parts.index.lookup(KEY)
    assert entry is not None
    tamper.point(store, KEY, entry.digest, raw_size=4095)  # its row and its manifest
    assert store.get(KEY, fp.digest) is None
    assert store.parts.counters.snapshot()["corrupt"] == 1
    assert not store.parts.blobs.exists(entry.digest)
    store.close()


def test_tier_leaves_an_over_limit_copy_for_the_store_to_report(tmp_path: Path) -> None:
    fp = _fp()
    store = open_store(tmp_path)
    payload = os.urandom(5000)
    store.put(Put(KEY, payload, fingerprint=fp, module_name="m", compile_secs=1.0))
    url = {"url": str(tmp_path / "s")}
    for option in ("max_object_size", "max_executable_size"):
        tier = open_tier(config.resolve({**url, option: "1K"}, {}))
        assert tier is not None
        assert tier.get(KEY, fp.digest) is None
        assert tier.lookup(KEY) is not None  # not forgotten: it is not damaged
    tier = open_tier(config.resolve(url, {}))
    assert tier is not None
    hit = tier.get(KEY, fp.digest)
    assert hit is not None and hit.payload == payload
    store.close()


def test_s3_refuses_an_oversized_object_before_downloading_it(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import devstack
    from conftest import FAKE_AWS

    from artifactstore.blobstores.s3 import S3BlobStore

    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    blobs = S3BlobStore(bucket, "p", "default", moto_endpoint, 5.0)
    data = os.urandom(5000)
    digest = codec.digest_of(data)
    blobs.put(digest, data)
    reads: list[str] = []
    blobs.client.meta.events.register("before-call.s3.GetObject", lambda **kw: reads.append("get"))
    with pytest.raises(OverLimit, match="ARTSTORE_MAX_OBJECT_SIZE"):
        blobs.get(digest, max_bytes=4999)
    assert blobs.get(digest, max_bytes=5000) == data
    assert blobs.get(digest) == data
    assert reads == ["get", "get", "get"]


# -- a real program --------------------------------------------------------------
def test_program_over_the_executable_limit_recompiles_with_one_log_line(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    a = run_program("job.py", env)
    assert a["store"]["stored"] == len(a["xla_compiles"]) >= 2
    b = run_program("job.py", {**env, "ARTSTORE_MAX_EXECUTABLE_SIZE": "1K"})
    assert b["results"] == a["results"]
    assert sorted(b["xla_compiles"]) == sorted(a["xla_compiles"])  # every one recompiled
    assert b["store"].get("hits", 0) == 0
    assert b["store"]["over_limit"] == len(a["xla_compiles"])
    assert "corrupt" not in b["store"]
    lines = [line for line in b["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "ARTSTORE_MAX_EXECUTABLE_SIZE" in lines[0], lines
    c = run_program("job.py", env)  # nothing was quarantined: the default limit loads all
    assert c["xla_compiles"] == [] and c["results"] == a["results"]
