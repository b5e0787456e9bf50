"""`artstore gc --max-size` on a large index: time and peak memory, SQLite and PostgreSQL.

Builds an index of N synthetic entries (default 1,000,000; each "1 MiB", one
object row each, last access a permutation of the ids) once per backend with
bulk core inserts, then for each case copies it (SQLite: file copy;
PostgreSQL: CREATE DATABASE ... TEMPLATE) and runs `gc.collect` in a fresh
subprocess, over a blob store that only counts deletions (its listing yields
the digests still present, in order, so reconciliation runs too). Each case
removes 10% or 90% of the bytes. Reports wall time and peak RSS of the gc
(VmHWM, reset just before it starts), beside the RSS before it started.
Target: <= 60 s and bounded memory (no list of all entries in memory).

    python bench/gc_scale.py [--entries 1000000] [--backends sqlite,postgresql]
                             [--out bench/results/gc_scale.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _results
from sqlalchemy import insert, text

from artifactstore import config, gc
from artifactstore.blobstores.base import BlobInfo
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.index import db
from artifactstore.index.models import Entry, StoredObject
from artifactstore.store import Parts, Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))
import devstack

MiB = 2**20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
STRIDE = 7919  # prime: i -> i * STRIDE % n permutes the access order (n not a multiple)
# PostgreSQL databases per entry count: runs of different sizes may share a server at once.
TEMPLATE_DB = "artstore_bench_gc_tmpl_{n}"
CASE_DB = "artstore_bench_gc_case_{n}"


def digest(i: int) -> str:
    """Object i's digest: spread over the 256 prefixes like sha256 digests, cheap to order."""
    return f"{i % 256:02x}{i // 256:062x}"


def key(i: int) -> str:
    """Entry i's key, spread over the prefixes as sha256 keys are (gc walks one prefix of
    keys at a time: keys all under one prefix would make that walk hold them all)."""
    return f"{(i + 1) % 256:02x}{i // 256:062x}"


class CountingBlobs(LocalBlobStore):
    """Objects 0..n-1 named by digest(i), listed in digest order, with every entry's
    manifest listed; counts what gc deletes.
    Records and the identity are a real local store's in `root` (inherited, so the bench
    keeps up with the BlobStore interface): only the objects are counted, not written."""

    def __init__(self, n: int, root: Path) -> None:
        super().__init__(root, "default")
        self.n = n
        self.gone = bytearray(n)  # one byte per object, not a Python object
        self.deletes = 0
        self.mtime = (T0 - timedelta(days=1)).timestamp()

    def _i(self, digest: str) -> int:
        return int(digest[2:], 16) * 256 + int(digest[:2], 16)

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        return None

    def put(self, digest: str, data: bytes) -> bool:
        raise AssertionError("gc never writes objects")

    def exists(self, digest: str) -> bool:
        i = self._i(digest)
        return i < self.n and not self.gone[i]

    def delete(self, digest: str) -> bool:
        i = self._i(digest)
        if i >= self.n or self.gone[i]:
            return False
        self.gone[i] = 1
        self.deletes += 1
        return True

    def quarantine(self, digest: str) -> None:
        raise AssertionError("gc never quarantines")

    def iter_blobs(self) -> Iterator[BlobInfo]:
        for prefix in range(256):
            for i in range(prefix, self.n, 256):
                if not self.gone[i]:
                    yield BlobInfo(digest(i), MiB, self.mtime)

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        return iter(())

    def iter_manifest_keys(self) -> Iterator[str]:
        """Every entry's manifest, as a store whose writers finished holds them (listed
        in key order): gc publishes none, as on a real store."""
        for prefix in range(256):
            for i in range((prefix - 1) % 256, self.n, 256):
                yield key(i)

    def describe(self) -> str:
        return f"counting blob store ({self.n} objects)"


def build(url: str, n: int, batch: int = 20000) -> float:
    """Create the schema and bulk-insert n entries and object rows; seconds taken."""
    started = time.perf_counter()
    engine = db.open_engine(url)
    db.upgrade(engine)
    fp = "f" * 64
    with engine.begin() as conn:
        for start in range(0, n, batch):
            ids = range(start, min(start + batch, n))
            conn.execute(
                insert(Entry),
                [
                    {
                        "namespace": "default", "key": key(i), "digest": digest(i),
                        "size": MiB, "raw_size": 2 * MiB, "module_name": f"jit_f{i}",
                        "platform": "cpu", "platform_version": "v", "device_kind": "cpu",
                        "device_count": 1, "jax_version": "0.6.0", "jaxlib_version": "0.6.0",
                        "cpu_arch": "x86_64", "fingerprint": fp, "compile_secs": 1.0,
                        "producer_host": "bench", "created_at": T0, "hits": 0,
                        "last_access": T0 + timedelta(seconds=i * STRIDE % n),
                    }
                    for i in ids
                ],
            )  # fmt: skip
            conn.execute(
                insert(StoredObject),
                [
                    {"namespace": "default", "digest": digest(i), "size": MiB,
                     "created_at": T0}
                    for i in ids
                ],
            )  # fmt: skip
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()
    return time.perf_counter() - started


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> int:
    """Current RSS in KiB, after resetting this process's peak to it.

    ru_maxrss would not do: a child inherits its parent's peak across fork and
    exec, and the parent has just built a million rows.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kib("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss() -> int:
    """Peak RSS in KiB since `_reset_peak_rss` (Linux), else since the process began."""
    return _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_case(url: str, n: int, keep_fraction: float) -> dict[str, Any]:
    """In this (fresh) process: gc down to keep_fraction of the bytes; time and memory."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = config.resolve({"url": tmp, "index": url}, environ={})
        engine = db.open_engine(url)
        blobs = CountingBlobs(n, Path(tmp) / "records")
        store = Store(Parts(settings, blobs, engine))
        rss_before = _reset_peak_rss()
        started = time.perf_counter()
        limit = round(n * keep_fraction) * MiB
        report = gc.collect(store, gc.Policy(max_bytes=limit))
        secs = time.perf_counter() - started
        rss_peak = _peak_rss()
        store.close()
    assert report.bytes_after == limit
    assert report.manifests_published == 0, "gc published manifests: not a finished store"
    assert blobs.deletes == report.objects_removed == report.entries_removed
    return {
        "secs": secs,
        "rss_before_mib": rss_before / 1024,
        "rss_peak_mib": rss_peak / 1024,
        "entries_removed": report.entries_removed,
        "objects_removed": report.objects_removed,
        "bytes_after": report.bytes_after,
    }


def case_url(backend: str, template: str, workdir: Path, n: int) -> str:
    """A fresh copy of the template index (of `n` entries) for one case."""
    if backend == "sqlite":
        target = workdir / "case.db"
        for suffix in ("-wal", "-shm", ""):
            Path(str(target) + suffix).unlink(missing_ok=True)
        shutil.copyfile(template.removeprefix("sqlite:///"), target)
        return f"sqlite:///{target}"
    case, template_db = CASE_DB.format(n=n), TEMPLATE_DB.format(n=n)
    devstack.drop_database(case)
    with devstack._admin_connection() as conn:
        conn.execute(f"CREATE DATABASE {case} TEMPLATE {template_db}")
    return devstack.database_url(case)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--out", type=Path, default=Path("bench/results/gc_scale.json"))
    parser.add_argument("--case", nargs=3, metavar=("URL", "N", "KEEP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case[0], int(args.case[1]), float(args.case[2]))))
        return 0

    n = args.entries
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="artstore-gc-bench-") as tmp:
        workdir = Path(tmp)
        for backend in args.backends.split(","):
            if backend == "sqlite":
                template = f"sqlite:///{workdir / 'template.db'}"
            else:
                devstack.ensure_postgres()
                devstack.drop_database(TEMPLATE_DB.format(n=n))
                template = devstack.create_database(TEMPLATE_DB.format(n=n))
            build_secs = build(template, n)
            print(f"{backend}: built {n} entries in {build_secs:.1f} s", file=sys.stderr)
            for removed in (0.1, 0.9):
                url = case_url(backend, template, workdir, n)
                proc = subprocess.run(
                    [sys.executable, __file__, "--case", url, str(n), str(1 - removed)],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append({"backend": backend, "entries": n, "removed_fraction": removed,
                             "build_secs": build_secs, **result})  # fmt: skip
                print(f"  remove {removed:.0%}: {result['secs']:.1f} s", file=sys.stderr)
            if backend == "postgresql":
                devstack.drop_database(CASE_DB.format(n=n))
                devstack.drop_database(TEMPLATE_DB.format(n=n))

    headers = ["backend", "entries", "removed", "gc secs", "RSS before", "peak RSS", "target"]
    lines = [
        [r["backend"], f"{r['entries']:,}",
         f"{r['entries_removed']:,} ({r['removed_fraction']:.0%})", f"{r['secs']:.1f}",
         f"{r['rss_before_mib']:.0f} MiB", f"{r['rss_peak_mib']:.0f} MiB",
         "PASS" if r["secs"] <= 60 else "MISS"]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    table = "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, ["-" * w for w in widths], *lines]
    )
    print(table)
    _results.write(args.out, {**_results.run_info(), "target_secs": 60, "rows": rows}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
