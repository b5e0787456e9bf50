"""Keys too quick to store, published by writers as records beside the manifests
(artifactstore.formats.quick), on both backends: the local directory and moto S3 over HTTP.

What `artstore pull` does with them, end to end with JAX: tests/test_pull.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from conftest import OpenStore, clean_env

from artifactstore import gc
from artifactstore.blobstores.base import QUICK, RecordKind
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.blobstores.readonly import ReadOnlyBlobStore
from artifactstore.config.host import compute
from artifactstore.errors import CorruptObject, ReadOnlyError, StoreUnavailable
from artifactstore.formats import quick
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.store import Store


def _fp(kind: str) -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind=kind,
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


FP_A, FP_B = _fp("cpu-a"), _fp("cpu-b")


def _key(i: int) -> str:
    return f"q{i:063x}"


def _looked_up_then_quick(store: Store, key: str, fp: Fingerprint = FP_A) -> None:
    """As the compile hook: a lookup that finds nothing, then a compile under the threshold."""
    assert store.get(key, fp.digest) is None
    store.compiled_below_threshold(key, fp.digest, 0.02)


def test_quick_record_names_and_bodies() -> None:
    """The name carries fingerprint and key (both checked); anything else is refused, so
    a stray or hostile name never becomes a path, an object key or a tier entry."""
    name = quick.quick_name(FP_A.digest, _key(1))
    assert name == f"{FP_A.digest}.{_key(1)}"
    assert quick.split_quick_name(name) == (FP_A.digest, _key(1))
    assert quick.check_quick_name(name) == name and QUICK.listed(name)
    bad = [
        "",
        _key(1),  # no fingerprint
        f"{FP_A.digest}{_key(1)}",  # no separator
        f"{FP_A.digest}.",  # no key
        f"{FP_A.digest.upper()}.{_key(1)}",  # not a digest as we write them
        f"{FP_A.digest[:-1]}.{_key(1)}",
        f"{FP_A.digest}.short",  # a key is 8-128 letters and digits
        f"{FP_A.digest}.{'k' * 129}",
        f"{FP_A.digest}.{_key(1)}.x",
        f"{FP_A.digest}.../../{_key(1)}",
        f"{FP_A.digest}/{_key(1)}",
    ]
    for wrong in bad:
        with pytest.raises(ValueError, match="not a quick-key record name"):
            quick.check_quick_name(wrong)
    with pytest.raises(ValueError):
        quick.quick_name("", _key(1))
    assert quick.decode(quick.encode(0.0123)) == pytest.approx(0.0123)
    assert quick.decode(quick.encode(float("nan"))) == 0.0
    for body in [b"", b"[]", b'{"v":2,"c":1}', b'{"v":1,"c":-1}', b'{"v":1,"c":true}',
                 b'{"v":1,"c":1}' + b" " * quick.MAX_QUICK_BYTES, b"[" * 100]:  # fmt: skip
        with pytest.raises(CorruptObject):
            quick.decode(body)


def test_quick_records_on_each_backend(any_env: dict[str, str], open_store: OpenStore) -> None:
    """Put, get, list (all, or by a fingerprint's prefix) and delete; a bad name is
    refused before any I/O; a read-only store refuses to put or delete them."""
    store = open_store(any_env)
    names = [quick.quick_name(fp.digest, _key(i)) for fp in (FP_A, FP_B) for i in range(3)]
    for name in names:
        store.parts.blobs.put_record(QUICK, name, quick.encode(0.01))
    assert sorted(store.parts.blobs.iter_records(QUICK)) == sorted(names)
    only_a = sorted(store.parts.blobs.iter_records(QUICK, prefix=FP_A.digest + quick.SEPARATOR))
    assert only_a == sorted(names[:3])
    data = store.parts.blobs.get_record(QUICK, names[0])
    assert data is not None and quick.decode(data) == pytest.approx(0.01)
    assert store.parts.blobs.get_record(QUICK, quick.quick_name(FP_A.digest, _key(9))) is None
    for wrong in (f"{FP_A.digest}.../x", "../identity", f"{FP_A.digest}/{_key(1)}"):
        with pytest.raises(ValueError):
            store.parts.blobs.put_record(QUICK, wrong, b"{}")
        with pytest.raises(ValueError):
            store.parts.blobs.get_record(QUICK, wrong)
    reader = ReadOnlyBlobStore(store.parts.blobs)
    assert sorted(reader.iter_records(QUICK)) == sorted(names)
    with pytest.raises(ReadOnlyError):
        reader.put_record(QUICK, names[0], b"{}")
    with pytest.raises(ReadOnlyError):
        reader.delete_records(QUICK, names)
    store.parts.blobs.delete_records(QUICK, [*names[:2], quick.quick_name(FP_A.digest, _key(9))])
    assert sorted(store.parts.blobs.iter_records(QUICK)) == sorted(names[2:])


def test_writers_publish_quick_keys_and_readers_never(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    """A writer publishes a key it looked up, found nothing for and compiled below the
    threshold (in the background); not one its tier already knew as quick (no lookup),
    nor one it found stored; a read-only process never publishes."""
    writer = open_store(any_env)
    _looked_up_then_quick(writer, _key(1))
    writer.compiled_below_threshold(_key(2), FP_A.digest, 0.02)  # known quick: no lookup
    assert writer.put(
        Put(_key(3), os.urandom(2000), fingerprint=FP_A, module_name="jit_f", compile_secs=2.0)
    )
    assert writer.get(_key(3), FP_A.digest) is not None
    writer.compiled_below_threshold(_key(3), FP_A.digest, 0.02)  # found, so not published
    reader = open_store(any_env, read_only=True, lazy_index=True)
    _looked_up_then_quick(reader, _key(4))
    assert writer.flush(30) and reader.flush(30)
    assert list(writer.parts.blobs.iter_records(QUICK)) == [quick.quick_name(FP_A.digest, _key(1))]
    assert writer.parts.counters.snapshot().get("quick_published") == 1
    assert "quick_published" not in reader.parts.counters.snapshot()
    assert reader.parts.counters.snapshot().get("quick_compiles") == 1  # counted as before


class _QuickRefused(LocalBlobStore):
    """A bucket whose policy predates quick/: putting there is refused."""

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        if kind is QUICK:
            raise StoreUnavailable("access denied for put quick-key record")
        super().put_record(kind, name, data)


def test_a_refused_publication_is_counted_and_said_once(
    tmp_path: Path, open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Publishing is best effort, off the program's thread: refused, it is counted and
    logged once for the process, and nothing else changes."""
    writer = open_store(clean_env(ARTSTORE_URL=str(tmp_path / "store")))
    writer.parts.blobs = _QuickRefused(tmp_path / "store", "default")
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        for i in range(3):
            _looked_up_then_quick(writer, _key(i))
        assert writer.flush(30)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "keys too quick to store not published" in lines[0], lines
    assert "access denied" in lines[0]
    counts = writer.parts.counters.snapshot()
    assert counts.get("quick_unpublished") == 3 and counts.get("quick_compiles") == 3
    assert list(writer.parts.blobs.iter_records(QUICK)) == []


def test_gc_deletes_quick_records_of_keys_stored_since(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    """A key quick on one host and stored by another: gc deletes its record (a dry run
    counts it); the records of keys that are still quick, and strays, stay."""
    writer = open_store(any_env)
    for i in range(3):
        _looked_up_then_quick(writer, _key(i))
    assert writer.flush(30)
    stray = f"{FP_A.digest}.{'x' * 4}"  # listed, but not a record's name: left alone
    if any_env["ARTSTORE_URL"].startswith("/"):
        (writer.parts.blobs.base / QUICK.directory / stray).write_text("{}")  # type: ignore[attr-defined]
    assert writer.put(
        Put(_key(0), os.urandom(2000), fingerprint=FP_A, module_name="jit_f", compile_secs=2.0)
    )
    dry = gc.collect(writer, gc.Policy(dry_run=True))
    assert dry.quick_records_removed == 1 and len(list(writer.parts.blobs.iter_records(QUICK))) >= 3
    report = gc.collect(writer, gc.Policy())
    assert report.quick_records_removed == 1
    left = sorted(n for n in writer.parts.blobs.iter_records(QUICK) if n != stray)
    assert left == sorted(quick.quick_name(FP_A.digest, _key(i)) for i in (1, 2))
    assert json.loads(json.dumps(report.to_json()))["quick_records_removed"] == 1
