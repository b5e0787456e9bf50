"""torch-xla's files are entries like any other, and counted with the process's other work.

Written through the adapter with the stand-in torch_xla (tests/programs/stand_in: three
graphs of synthetic bytes, no torch), by a process that also compiles with JAX, under
`artstore run`, against a team store (moto S3 + PostgreSQL): one writer run for the
module. Then `ls`, `stats`, the metrics its process wrote, `export`/`import` to another
team store (a tampered bundle refused whole) and a reader there, quotas and gc read what
it left. torch-xla compiling for real: tests/torch/test_torch_xla.py.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import PROGRAMS, OpenStore, _team, artstore, devstack, drop_later, run_program
from prometheus_client.parser import text_string_to_metric_families

from artifactstore.formats import torchxla

STAND_IN = PROGRAMS / "stand_in"
SUMMARY = re.compile(r"artstore run: hits (\d+), misses (\d+) \((\d+) stored\).*?(\d+) process")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@contextmanager
def _team_store(moto_endpoint: str, template: str) -> Iterator[dict[str, str]]:
    """A fresh bucket and database (as conftest's team_env), activated on import."""
    name = "artstore_t_" + uuid.uuid4().hex[:12]
    env = _team(moto_endpoint, devstack.create_database(name, template=template))
    env.pop("ARTSTORE_ACTIVATE")
    try:
        yield env
    finally:
        drop_later(name)


def _job(env: dict[str, str], where: Path, *, run: bool = False, **extra: str) -> dict[str, Any]:
    """tests/programs/torch_xla_stand_in_job.py on a fresh host `where` (under `artstore
    run` if `run`): its JSON line, its stderr."""
    env = {**env, "PYTHONPATH": str(STAND_IN), "XDG_CACHE_HOME": str(where), **extra}
    out = run_program("torch_xla_stand_in_job.py", env, under_run=run)
    assert "Traceback" not in out["_stderr"], out["_stderr"][-3000:]
    return out


def _json(env: dict[str, str], *args: str) -> Any:
    proc = artstore(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def writer(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, migrated_template: str
) -> Iterator[dict[str, Any]]:
    """The writer's run: torch-xla's three graphs and a JAX jit, in one process."""
    root = tmp_path_factory.mktemp("torch-xla-entries")
    (root / "prom").mkdir()
    with _team_store(moto_endpoint, migrated_template) as env:
        prom = str(root / "prom")
        out = _job(env, root / "host-a", run=True, JOB_JAX="1", PROMETHEUS_MULTIPROC_DIR=prom)
        yield {"env": env, "root": root, "out": out, "entries": _json(env, "ls")}


def test_one_session_counts_torch_xla_beside_jax(writer: dict[str, Any]) -> None:
    """The JAX hook and the adapter share the process's session: one counting object, so
    process_stats(), the run's one record and the metrics have both frameworks' work."""
    out, entries = writer["out"], writer["entries"]
    stats = out["stats"]
    assert out["one_session"] and out["counters"] == {"PersistentCacheMiss": 3}
    jax_entries = [e for e in entries if e["platform"] != torchxla.PLATFORM]
    assert jax_entries and len(entries) == len(jax_entries) + 3
    assert stats["torch_xla_cache_misses"] == 3
    assert stats["misses"] == stats["compiles"] == 3 + len(jax_entries)
    assert stats["compile_ms"] >= 3 * 250  # the stand-in's compiles take 0.25 s each
    found = SUMMARY.search(out["_stderr"])
    assert found, out["_stderr"]
    assert [int(n) for n in found.groups()] == [0, stats["misses"], len(entries), 1]
    proc = artstore(
        "metrics", "--multiprocess-dir", str(writer["root"] / "prom"), env=writer["env"]
    )
    assert proc.returncode == 0, proc.stderr
    totals = {
        sample.name: sample.value
        for family in text_string_to_metric_families(proc.stdout)
        for sample in family.samples
        if "namespace" in sample.labels and len(sample.labels) == 1
    }
    assert totals["artstore_misses_total"] == totals["artstore_compiles_total"] == stats["misses"]
    assert totals["artstore_stored_total"] == len(entries)


def test_ls_and_stats_show_them(writer: dict[str, Any]) -> None:
    env, entries = writer["env"], writer["entries"]
    files = writer["out"]["files"]
    ours = _json(env, "ls", "--platform", torchxla.PLATFORM)
    assert sorted(e["module_name"] for e in ours) == sorted(map(torchxla.module_name, files))
    # The table: their platform, their module names, and keys told apart (the first 16
    # digits of each are their platform's), each a prefix `artstore rm` takes.
    proc = artstore("ls", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    torch_rows = [r for r in rows if r[2] == torchxla.PLATFORM]
    assert len(torch_rows) == 3 and all(r[1].startswith(torchxla.MODULE_PREFIX) for r in torch_rows)
    shown = [r[0] for r in torch_rows]
    assert len(set(shown)) == 3
    assert all(any(e["key"].startswith(s) for e in ours) for s in shown)
    stats = _json(env, "stats")
    assert stats["entries"] == len(entries)
    assert stats["bytes"] == sum(e["size"] for e in entries)
    assert stats["misses"] == writer["out"]["stats"]["misses"]  # torch-xla's told the index


def test_bundles_carry_them_verified_to_a_fresh_host(
    writer: dict[str, Any], moto_endpoint: str, migrated_template: str
) -> None:
    """Slow: a reader process on the imported store; two team stores. A bundle of them
    imports into another store after verification (a tampered one is refused whole),
    and a read-only worker there finds each graph in its cache: loads, no compile."""
    env, root = writer["env"], writer["root"]
    bundle = root / "torch-xla.tzst"
    exported = _json(env, "export", "--module", "torch-xla:*", str(bundle))
    assert exported["entries"] == 3
    with _team_store(moto_endpoint, migrated_template) as other:
        _import_and_read(writer, bundle, other)


def _import_and_read(writer: dict[str, Any], bundle: Path, other: dict[str, str]) -> None:
    root = writer["root"]
    tampered = root / "tampered.tzst"
    tampered.write_bytes(_altered(bundle.read_bytes()))
    refused = artstore("import", str(tampered), env=other)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "damaged or altered" in refused.stderr
    assert _json(other, "ls") == []  # nothing of it written

    assert _json(other, "import", str(bundle))["imported"] == 3
    reader = _job(other, root / "host-b", ARTSTORE_READ_ONLY="1")
    assert reader["counters"] == {"PersistentCacheHit": 3}
    assert reader["files"] == writer["out"]["files"]
    stats = reader["stats"]
    assert stats["torch_xla_placed"] == stats["loads"] == stats["hits"] == 3
    assert stats["misses"] == stats["compiles"] == 0


def _altered(bundle: bytes) -> bytes:
    """`bundle` with the last bytes of its first object zeroed (sizes and names kept)."""
    members = []
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bundle)).read()
    with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
        for info in tar:
            data = tar.extractfile(info).read()  # type: ignore[union-attr]
            members.append((info, data))
    info, data = next(m for m in members if m[0].name.startswith("objects/"))
    members[members.index((info, data))] = (info, data[:-32] + bytes(32))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def test_a_file_torch_xla_cannot_load_is_a_miss(writer: dict[str, Any]) -> None:
    """Slow: a process whose client cannot deserialize (torch-xla's CPU client; the
    stand-in with FAKE_TORCH_XLA_NO_DESERIALIZE) has every file placed, finds each, loads
    none and compiles each again (erasing it, then writing its own: stored already, so
    not stored again): misses and no time saved, in its stats, the run summary, the
    metrics and the index's `stats` (its hit journal folded); said in one line."""
    env, root = writer["env"], writer["root"]
    before = _json(env, "stats")
    prom = root / "prom-cpu"
    prom.mkdir()
    reader = _job(
        env,
        root / "host-cpu",
        run=True,
        FAKE_TORCH_XLA_NO_DESERIALIZE="1",
        PROMETHEUS_MULTIPROC_DIR=str(prom),
        ARTSTORE_TIMEOUT="60",  # a loaded machine's moto: the fill must reach the store
    )
    assert reader["counters"] == {"PersistentCacheDeserializeFailure": 3}, reader["_stderr"]
    stats = reader["stats"]
    assert stats["torch_xla_placed"] == 3
    assert stats.get("hits", 0) == stats["loads"] == stats["compile_ms_saved"] == 0
    assert stats["misses"] == stats["compiles"] == stats["lookups_missed"] == 3
    assert stats.get("stored", 0) == 0
    found = SUMMARY.search(reader["_stderr"])
    assert found, reader["_stderr"]
    assert [int(n) for n in found.groups()[:2]] == [0, 3]
    assert reader["_stderr"].count("cannot deserialize") == 1, reader["_stderr"]
    proc = artstore("metrics", "--multiprocess-dir", str(prom), env=env)
    assert proc.returncode == 0, proc.stderr
    totals = {
        sample.name: sample.value
        for family in text_string_to_metric_families(proc.stdout)
        for sample in family.samples
        if sample.name in ("artstore_hits_total", "artstore_misses_total")
    }
    assert totals.get("artstore_hits_total", 0) == 0 and totals["artstore_misses_total"] == 3
    assert artstore("fold", env=env).returncode == 0  # its hit journal, into the index
    after = _json(env, "stats")
    assert after["hits"] == before["hits"]
    assert after["compile_secs_saved"] == before["compile_secs_saved"]
    assert after["misses"] == before["misses"] + 3


def test_quotas_and_gc_evict_them_by_lru(writer: dict[str, Any], open_store: OpenStore) -> None:
    """A quota counts their bytes; gc evicts the least recently used entry to meet it,
    a torch-xla one as a JAX one (last: it changes the writer's store)."""
    env, entries = writer["env"], writer["entries"]
    used = sum(e["size"] for e in entries)
    oldest = next(e for e in entries if e["platform"] == torchxla.PLATFORM)
    order = [oldest["key"], *(e["key"] for e in entries if e is not oldest)]
    open_store(env).parts.index.record_access(
        {k: (0, T0 + timedelta(minutes=i)) for i, k in enumerate(order)}
    )
    assert artstore("quota", "set", "default", str(used - 1), env=env).returncode == 0
    assert _json(env, "quota", "ls")[0]["bytes"] == used
    out = _json(env, "gc", "--grace", "0")
    assert [r["key"] for r in out["removed"] if r["kind"] == "entry"] == [oldest["key"]]
    assert {e["key"] for e in _json(env, "ls")} == set(order[1:])
