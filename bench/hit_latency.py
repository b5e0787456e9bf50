"""Hit-path latency: manifest GET (or index lookup) + GET + verify + decompress.

Stores one payload per size with `Store.put`, then times `Store.get` repeatedly
(in-process, public Python API), and the manifest GET alone (its share of a
hit shows what the extra request per lookup costs), for two backends: embedded
(local dir + SQLite in a temp dir) and moto S3 + PostgreSQL (a fresh database,
dropped at the end).
Payloads are random bytes mixed with zero runs, so they compress roughly like
executables. Every hit must round-trip byte-for-byte.

    python bench/hit_latency.py [--sizes-mb 1,100] [--out bench/results/hit_latency.json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _results
import numpy as np

from artifactstore import config
from artifactstore.config import keyfiles
from artifactstore.config.host import compute
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))
import devstack

BUCKET, DATABASE = "artstore-bench-hit", "artstore_bench_hit"
REPS = {1: 50, 100: 10}  # timed gets per payload size (MB); other sizes get 20


def payload(size: int, seed: int) -> bytes:
    """Random bytes with ~half the 4 KiB blocks zeroed: compresses about 2x."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    block = 4096
    nblocks = size // block
    zero = rng.random(nblocks) < 0.5
    view = data[: nblocks * block].reshape(nblocks, block)
    view[zero] = 0
    return data.tobytes()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


@contextlib.contextmanager
def embedded_backend() -> Iterator[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="artstore-hit-") as tmp:
        yield {"url": tmp}


@contextlib.contextmanager
def s3_pg_backend() -> Iterator[dict[str, Any]]:
    """A team store: it requires signatures, so this process signs (and trusts its key)."""
    server = devstack.start_moto()
    keys = tempfile.TemporaryDirectory(prefix="artstore-hit-keys-")
    secret, _ = keyfiles.generate("bench", keys.name)
    settings = {**devstack.FAKE_CREDENTIALS, "ARTSTORE_SIGNING_KEY": str(secret)}
    saved = {k: os.environ.get(k) for k in settings}
    try:
        os.environ.update(settings)
        devstack.create_bucket(server.endpoint, BUCKET)
        url = devstack.create_database(DATABASE)
        try:
            db.upgrade(db.open_engine(url))
            yield {"url": f"s3://{BUCKET}/cache", "index": url, "s3_endpoint_url": server.endpoint}
        finally:
            devstack.drop_database(DATABASE)
    finally:
        server.stop()
        keys.cleanup()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(opts: dict[str, Any], sizes_mb: list[int]) -> list[dict[str, Any]]:
    fp = compute(platform_name="cpu", platform_version="bench", device_kind="cpu",
                 device_count=1, jax_version="x", jaxlib_version="x")  # fmt: skip
    store = Store.open(config.resolve(opts))
    rows = []
    try:
        for i, mb in enumerate(sizes_mb):
            data = payload(mb * 1_000_000, seed=i)
            key = hashlib.sha256(data).hexdigest()
            store.put(Put(key, data, fp, "bench", 1.0))
            stored = store.parts.index.lookup(key)
            hit = store.get(key, fp.digest)  # untimed warm-up (connections, imports)
            assert hit is not None and hit.payload == data, "warm-up get did not round-trip"
            times = []
            for _ in range(REPS.get(mb, 20)):
                t0 = time.perf_counter()
                hit = store.get(key, fp.digest)
                times.append(time.perf_counter() - t0)
                assert hit is not None and hit.payload == data, "payload did not round-trip"
            # The manifest GET alone (issue 16: every lookup's first request), so its share
            # of a hit is visible beside the whole get.
            mtimes = []
            for _ in range(len(times)):
                t0 = time.perf_counter()
                found = store.parts.blobs.get_manifest(key)
                mtimes.append(time.perf_counter() - t0)
                assert found is not None, "entry has no manifest"
            med = statistics.median(times)
            mmed = statistics.median(mtimes)
            rows.append({
                "size_mb": mb, "raw_bytes": len(data),
                "stored_bytes": stored.size if stored is not None else None,
                "n": len(times), "median_ms": med * 1e3, "p99_ms": percentile(times, 99) * 1e3,
                "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3,
                "mb_per_s": len(data) / 1e6 / med, "raw_secs": times,
                "manifest_median_ms": mmed * 1e3, "manifest_p99_ms": percentile(mtimes, 99) * 1e3,
                "manifest_share": mmed / med, "manifest_raw_secs": mtimes,
            })  # fmt: skip
    finally:
        store.flush(10)
        store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", default="1,100", help="comma-separated payload sizes in MB")
    p.add_argument("--out", type=Path, default=Path("bench/results/hit_latency.json"))
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes_mb.split(",") if s.strip()]

    backends = {"embedded (dir + SQLite)": embedded_backend, "moto S3 + PostgreSQL": s3_pg_backend}
    results: dict[str, list[dict[str, Any]]] = {}
    for name, backend in backends.items():
        print(f"measuring: {name} ...", flush=True)
        with backend() as opts:
            results[name] = measure(opts, sizes)

    lines = [f"{'backend':<26}{'payload':>9}{'stored':>10}{'n':>4}{'median ms':>11}"
             f"{'p99 ms':>10}{'MB/s':>9}{'manifest ms':>13}{'share':>7}"]  # fmt: skip
    for name, rows in results.items():
        for r in rows:
            stored = f"{r['stored_bytes'] / 1e6:.1f} MB" if r["stored_bytes"] else "-"
            lines.append(
                f"{name:<26}{r['size_mb']:>6} MB{stored:>10}{r['n']:>4}"
                f"{r['median_ms']:>11.2f}{r['p99_ms']:>10.2f}{r['mb_per_s']:>9.0f}"
                f"{r['manifest_median_ms']:>13.2f}{r['manifest_share']:>7.0%}"
            )
    lines += [
        "",
        "Store.get in-process (manifest GET + object GET + verify + decompress), after one untimed",
        "warm-up get; MB/s = raw payload MB / median; every hit round-tripped byte-for-byte.",
        "manifest ms: `blobs.get_manifest(key)` alone (median, as many calls), the first",
        "request of every lookup; share = its median / the whole get's median.",
    ]
    text = "\n".join(lines)
    print("\n" + text)

    _results.write(a.out, {**_results.run_info(), "results": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
