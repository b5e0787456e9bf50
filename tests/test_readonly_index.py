"""ARTSTORE_READ_ONLY on an index this process could write: one wrapper refuses every
write but the access append, on SQLite (an authorizer) and PostgreSQL (READ ONLY
transactions), with the same one line."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from conftest import OpenStore, artstore
from sqlalchemy import func, select

from artifactstore.blobstores.base import JOURNALS
from artifactstore.config.host import compute
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.gc.journals import fold_journals
from artifactstore.index.models import Access, Entry

KEY = "a" * 64


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def test_reader_setting_refuses_index_writes_but_records_hits(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    writer = open_store(any_env)
    assert writer.put(Put(KEY, b"x", _fp(), "m", 1))
    writer.close()
    assert artstore("quota", "set", "default", "1G", env=any_env).returncode == 0
    reader_env = dict(any_env, ARTSTORE_READ_ONLY="1")
    refused = (
        ["rm", "--all", "--yes"],
        ["rm", KEY[:12]],
        ["quota", "set", "default", "2G"],
        ["quota", "rm", "default"],
    )
    with ThreadPoolExecutor(len(refused)) as pool:  # four CLI processes at once
        procs = list(pool.map(lambda args: artstore(*args, env=reader_env), refused))
    for args, proc in zip(refused, procs, strict=True):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (args, lines)
        assert "read-only" in lines[0] and "unset ARTSTORE_READ_ONLY" in lines[0], lines
    quotas = artstore("quota", "ls", "--json", env=any_env)
    assert '"default"' in quotas.stdout and "2147483648" not in quotas.stdout
    reader = open_store(reader_env, lazy_index=True)
    assert reader.get(KEY, _fp().digest) is not None  # entry and object are still there
    reader.parts.accounts.flush()  # raises if the append were refused
    if reader.parts.settings.index_is_server:
        # A database server hears of readers' hits only through hit journals in the
        # bucket, folded in by a writer; the reader never opened the index.
        assert not reader.parts.backends.index_opened
        assert len(list(reader.parts.blobs.iter_records(JOURNALS))) == 1
        fold_journals(open_store(any_env).parts)
    with reader.parts.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Access)) == 1
        assert conn.scalar(select(func.count()).select_from(Entry)) == 1
