"""Hit counts reach the index in batches; a bad row must never block the rows after it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from conftest import OpenStore
from sqlalchemy import select

from artifactstore.config.host import compute
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.gc.journals import fold_journals
from artifactstore.index.accesses import ROW_HITS_MAX, fold_accesses
from artifactstore.index.models import Entry
from artifactstore.store import Store

KEY = "c" * 64


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _hits(store: Store) -> tuple[int, datetime]:
    """The entry's hits and last access, once the flushed hits reached it (a database
    server hears of them through hit journals, folded as `artstore fold` does)."""
    if store.parts.backends.journals_hits:
        fold_journals(store.parts)
        fold_accesses(store.parts.engine, store.parts.namespace)
    with store.parts.engine.connect() as conn:
        row = conn.execute(select(Entry.hits, Entry.last_access).where(Entry.key == KEY)).one()
    return int(row[0]), row[1]


def test_bad_journal_rows_are_dropped_and_the_rest_counted(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    assert store.put(Put(KEY, b"x", _fp(), "m", 1))
    before, _ = _hits(store)
    # What a tier journal file can hold (JSON numbers of any size, NaN, long keys).
    journal = json.loads(
        json.dumps({KEY: [2**70, 1e20], "k" * 300: [1, 1.0], "d" * 64: [1, float("nan")]})
    )
    store.parts.accounts.add_accesses({k: (int(n), float(t)) for k, (n, t) in journal.items()})
    store.parts.accounts.flush()
    hits, when = _hits(store)
    assert 0 < hits - before <= 1_000_000
    assert when.replace(tzinfo=UTC) <= datetime.now(UTC)  # not pinned in year 5138


def test_a_row_the_index_refuses_does_not_fail_later_flushes(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    assert store.put(Put(KEY, b"x", _fp(), "m", 1))
    before, _ = _hits(store)
    store.parts.accounts.merge_touches({KEY: (2**70, datetime.now(UTC))})  # past BIGINT: refused
    store.parts.accounts.flush()  # dropped with one warning, not kept for every later flush
    store.parts.accounts.merge_touches({KEY: (1, datetime.now(UTC))})
    store.parts.accounts.flush()
    if store.parts.backends.journals_hits:  # a journal's rows are clamped when folded, not refused
        assert before + 1 < _hits(store)[0] <= before + 1 + ROW_HITS_MAX
    else:
        assert _hits(store)[0] == before + 1
