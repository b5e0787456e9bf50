"""Readers at scale: N concurrent read-only processes, manifest path vs database path.

Issue 16: a fleet of readers must not need a database connection each. This bench
starts moto S3 and a fresh PostgreSQL database, fills a team store (S3 + PostgreSQL)
with K synthetic entries via `Store.put`, then for each N forks N reader processes
per read path, interleaved per N:

  new       `Store.open(lazy_index=True)` (as a program's session) with
            ARTSTORE_READ_ONLY=1, then `Store.get` (manifest GET + object GET; never
            connects to the database)
  tier      the same with a warm per-host tier (ARTSTORE_LOCAL_TIER, pre-filled):
            `store.tier.get` first, as the JAX hook does, then `Store.get`
  db        today's database path, as readers before issue 16 did: their own engine
            (`open_engine(read_only=True, pool_size=4)`, schema checked at open),
            `EntryIndex.lookup`, object GET, `codec.decode`; the engine and its pooled
            connection live as long as the process

A fork server fits hundreds of readers on a small machine: this process imports
everything once and forks the readers (copy-on-write), which open their own store,
wait at a barrier, do M lookups each at once, report, and stay alive (as a training
job would) until this process has sampled `pg_stat_activity`, then exit.

    python bench/reader_scale.py [--n 50,200,500] [--lookups 20] [--entries 20] [--runs 1]
                                 [--paths new,tier,db] [--out bench/results/reader_scale.json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _results
import _stack
import boto3.session
import numpy as np
import psycopg
from hit_latency import payload

from artifactstore import config
from artifactstore.blobstores import open_blobstore
from artifactstore.config.host import compute
from artifactstore.errors import one_line
from artifactstore.formats import codec
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.index.repo import EntryIndex
from artifactstore.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))
import devstack

BUCKET, DATABASE, NAMESPACE = "artstore-bench-readers", "artstore_bench_readers", "default"
PATHS = {
    "new": "new: Store.get, read-only",
    "tier": "new + warm tier",
    "db": "database (pre-issue-16)",
}
COUNTING = ("client-side: a botocore `before-send` hook on every S3 client the reader "
            "creates (one per HTTP attempt, retries included)")  # fmt: skip
CHUNK = 25  # readers forked between memory checks (they grow after the fork)
Lookup = Callable[[str], bytes | None]


# -- S3 request counting ---------------------------------------------------------

_requests = 0  # HTTP requests this process sent to S3


def _on_send(**_: Any) -> None:
    global _requests
    _requests += 1  # returns None: the request goes ahead


def count_s3_requests() -> None:
    """Every boto3 client made in this process (and its forks) counts its requests."""
    make = boto3.session.Session.client

    def client(self: boto3.session.Session, *args: Any, **kwargs: Any) -> Any:
        made = make(self, *args, **kwargs)
        made.meta.events.register("before-send", _on_send)
        return made

    boto3.session.Session.client = client  # type: ignore[method-assign]


# -- the stack and its store -----------------------------------------------------


@dataclass(frozen=True)
class Bench:
    endpoint: str
    index_url: str
    keys: list[str]
    fingerprint: str
    tier_dir: Path
    lookups: int
    work: Path  # readers' result files

    def env(self, *, tier: bool = False, read_only: bool = True) -> dict[str, str]:
        """ARTSTORE_* settings as a reader's job would set them."""
        env = {"ARTSTORE_URL": f"s3://{BUCKET}/cache", "ARTSTORE_INDEX": self.index_url,
               "ARTSTORE_S3_ENDPOINT_URL": self.endpoint,
               "ARTSTORE_LOCAL_TIER": str(self.tier_dir) if tier else "off"}  # fmt: skip
        if read_only:
            env["ARTSTORE_READ_ONLY"] = "1"
        return env


@contextlib.contextmanager
def stack() -> Iterator[tuple[str, str]]:
    """Moto S3 + a fresh database with the schema; both gone afterwards."""
    with _stack.team_store(BUCKET, DATABASE) as env:
        os.environ.update(devstack.FAKE_CREDENTIALS)  # inherited by the forks
        yield env["AWS_ENDPOINT_URL_S3"], env["ARTSTORE_INDEX"]


def in_child(fn: Callable[[], dict[str, Any]], work: Path) -> dict[str, Any]:
    """`fn()` in a forked process: this one keeps no connection, socket or thread of
    its own to hand on to the readers forked later."""
    out = work / f"helper-{time.monotonic_ns()}.json"
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            out.write_text(json.dumps(fn()))
        except BaseException as exc:
            out.write_text(json.dumps({"error": one_line(exc)}))
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(out.read_text())
    if "error" in result:
        sys.exit(f"FAIL: {result['error']}")
    return result


def fill(bench: Bench, fp: Any, sizes: int) -> dict[str, Any]:
    store = Store.open(config.resolve(environ=bench.env(read_only=False)))
    try:
        for i, key in enumerate(bench.keys):
            data = payload(sizes, seed=i)
            assert hashlib.sha256(data).hexdigest() == key
            store.put(Put(key, data, fp, "bench", 1.0))
        manifests = sum(store.parts.blobs.get_manifest(k) is not None for k in bench.keys)
        store.flush(30)
    finally:
        store.close()
    return {"entries": len(bench.keys), "manifests": manifests}


def prefill_tier(bench: Bench) -> dict[str, Any]:
    """One reader on this host has loaded every entry: its tier holds them all."""
    store = Store.open(config.resolve(environ=bench.env(tier=True)), lazy_index=True)
    try:
        for key in bench.keys:
            store.get(key, bench.fingerprint)
        assert store.parts.tier is not None, "no local tier opened"
        held = sum(store.parts.tier.lookup(k) is not None for k in bench.keys)
    finally:
        store.close()
    return {"tier_entries": held}


# -- a reader (runs in a forked child) -------------------------------------------


def open_reader(path: str, bench: Bench) -> Lookup:
    fp = bench.fingerprint
    if path == "db":
        settings = config.resolve(environ=bench.env())
        engine = db.open_engine(settings.index_url, read_only=True, pool_size=4)
        db.schema_status(engine).require_current()  # what Store.open did: one pooled conn
        index = EntryIndex(engine, settings.namespace)
        blobs = open_blobstore(settings)
        blobs.check()

        def lookup_db(key: str) -> bytes | None:
            info = index.lookup(key)
            if info is None:
                return None
            data = blobs.get(info.digest, max_bytes=settings.max_object_bytes)
            if data is None:
                return None
            return codec.decode(
                data,
                digest=info.digest,
                fingerprint=fp,
                key=key,
                raw_size=info.raw_size,
                max_raw_size=settings.max_executable_bytes,
                trusted=settings.trusted_keys,
                namespace=settings.namespace,
            )

        return lookup_db  # holds `index`, so the engine and its pool live with the process
    # As a program's session opens it: the index only when something is stored.
    store = Store.open(config.resolve(environ=bench.env(tier=path == "tier")), lazy_index=True)

    def lookup(key: str) -> bytes | None:
        if store.parts.tier is not None:
            hit = store.parts.tier.get(key, fp)
            if hit is not None:
                return hit.payload
        found = store.get(key, fp)
        return None if found is None else found.payload

    return lookup


def private_mb() -> float | None:
    """Memory this process does not share with the fork server (what each reader costs)."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    kb = sum(int(line.split()[1]) for line in text.splitlines()
             if line.startswith(("Private_Clean:", "Private_Dirty:")))  # fmt: skip
    return kb / 1024


class _Warnings(logging.Handler):
    """The store's warnings, counted into the report instead of printed N times."""

    def __init__(self, counts: collections.Counter[str]) -> None:
        super().__init__(logging.WARNING)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.getMessage()[:160]] += 1


def reader(i: int, path: str, bench: Bench, fds: dict[str, int]) -> None:
    """Open, report ready, wait for the start, look up, report, wait for release."""
    global _requests
    _requests = 0  # not the fork server's own (it created the bucket)
    for name in ("start_w", "release_w", "results_r"):
        os.close(fds[name])
    errors: collections.Counter[str] = collections.Counter()
    warnings: collections.Counter[str] = collections.Counter()
    log = logging.getLogger("artifactstore")
    log.handlers[:] = [_Warnings(warnings)]
    log.propagate = False
    res: dict[str, Any] = {"i": i, "open_error": None, "lat": [], "hits": 0, "fails": 0}
    ready = False
    try:
        try:
            lookup: Lookup | None = open_reader(path, bench)
        except Exception as exc:
            lookup, res["open_error"] = None, one_line(exc)[:200]
        res["open_requests"] = opened = _requests
        os.write(fds["results_w"], f"ready {i}\n".encode())
        ready = True
        os.read(fds["start_r"], 1)  # EOF when the parent closes its end: go
        for j in range(bench.lookups):
            key = bench.keys[(i + j) % len(bench.keys)]
            if lookup is None:
                res["fails"] += 1
                continue
            t0 = time.perf_counter()
            try:
                got = lookup(key)
            except Exception as exc:
                res["fails"] += 1
                errors[one_line(exc)[:200]] += 1
                continue
            dt = time.perf_counter() - t0
            if got is None or hashlib.sha256(got).hexdigest() != key:
                res["fails"] += 1
                errors["miss (None or wrong bytes)"] += 1
            else:
                res["hits"] += 1
                res["lat"].append(dt)
        res["requests"] = _requests - opened
    except BaseException as exc:
        errors[f"reader crashed: {one_line(exc)[:200]}"] += 1
        if not ready:
            os.write(fds["results_w"], f"ready {i}\n".encode())
    res.update(errors=dict(errors), warnings=dict(warnings), private_mb=private_mb())
    (bench.work / f"reader-{i}.json").write_text(json.dumps(res))
    os.write(fds["results_w"], f"done {i}\n".encode())
    os.read(fds["release_r"], 1)  # stays alive, connections and all, until released
    os._exit(0)


# -- the fork server -------------------------------------------------------------


class Connections:
    """Peak number of server connections to the bench database (pg_stat_activity)."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(host=devstack.HOST, port=devstack.PG_PORT, user="postgres",
                                    dbname=devstack.PG_ADMIN_DB, autocommit=True)  # fmt: skip
        self.peak = 0
        self.samples = 0

    def poll(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (DATABASE,)
        ).fetchone()
        now = int(row[0]) if row else 0
        self.peak = max(self.peak, now)
        self.samples += 1
        return now

    def reset(self) -> None:
        self.peak, self.samples = 0, 0

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *_: object) -> None:
        self.conn.close()


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


class Messages:
    """'ready I' / 'done I' lines from the readers, read while sampling connections."""

    def __init__(self, fd: int, conns: Connections) -> None:
        self.fd, self.conns, self.buf = fd, conns, b""
        self.seen: dict[str, set[int]] = {"ready": set(), "done": set()}
        self.last_done = 0.0

    def wait(self, kind: str, want: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.seen[kind]) < want and time.monotonic() < deadline:
            readable, _, _ = select.select([self.fd], [], [], 0.05)
            self.conns.poll()
            if not readable:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:  # every reader closed its end: none will say more
                break
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                what, i = line.decode().split()
                self.seen[what].add(int(i))
                if what == "done":
                    self.last_done = time.perf_counter()
        return len(self.seen[kind]) >= want


def reap(pids: list[int], timeout: float) -> int:
    """Wait for the readers to exit; SIGKILL (by pid) any still there after `timeout`.
    Returns how many had to be killed."""
    left, deadline = set(pids), time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            left.discard(pid)
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    pids.clear()
    return len(left)


def run_cell(path: str, n: int, bench: Bench, conns: Connections, a: argparse.Namespace) -> dict:
    """N readers of one path, forked, started together; their results and the peak."""
    for f in bench.work.glob("reader-*.json"):
        f.unlink()
    r_start, w_start = os.pipe()
    r_release, w_release = os.pipe()
    r_results, w_results = os.pipe()
    fds = {"start_r": r_start, "start_w": w_start, "release_r": r_release,
           "release_w": w_release, "results_r": r_results, "results_w": w_results}  # fmt: skip
    msgs = Messages(r_results, conns)
    pids: list[int] = []
    limit: str | None = None
    conns.reset()
    conns.poll()
    killed, secs, forked = 0, None, 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        while len(pids) < n and limit is None:
            free = mem_available_mb()
            if free < a.min_free_mb:
                limit = f"memory: {free:.0f} MB available < --min-free-mb {a.min_free_mb}"
                break
            for _ in range(min(CHUNK, n - len(pids))):
                try:
                    pid = os.fork()
                except OSError as exc:  # EAGAIN (process limit), ENOMEM
                    limit = f"fork failed: {exc}"
                    break
                if pid == 0:
                    reader(len(pids), path, bench, fds)  # never returns
                pids.append(pid)
            # Readers grow after the fork (clients, connections): let this chunk open
            # before checking memory again.
            msgs.wait("ready", len(pids), a.timeout)
        os.close(w_results)
        w_results = -1
        if not msgs.wait("ready", len(pids), a.timeout):
            limit = (limit or "") + f" {len(msgs.seen['ready'])} of {len(pids)} readers ready"
        os.close(w_start)  # go
        w_start = -1
        t0 = time.perf_counter()
        msgs.wait("done", len(msgs.seen["ready"]), a.timeout)
        if msgs.seen["ready"]:
            secs = (msgs.last_done or time.perf_counter()) - t0
        hold = time.monotonic() + a.hold_secs  # all alive, lookups done: sample on
        while time.monotonic() < hold:
            conns.poll()
            time.sleep(0.05)
    finally:
        forked = len(pids)
        for fd in (w_start, w_results, w_release, r_start, r_release):
            if fd >= 0:
                os.close(fd)  # w_release: release the readers
        killed = reap(pids, 30.0)
        os.close(r_results)
    readers = [json.loads(f.read_text()) for f in sorted(bench.work.glob("reader-*.json"))]
    return {"path": path, "n": n, "forked": forked,
            "readers": readers, "secs": secs, "peak_db_conns": conns.peak,
            "db_samples": conns.samples, "limit": limit.strip() if limit else None,
            "killed": killed}  # fmt: skip


def summarize(cells: list[dict[str, Any]], lookups: int) -> dict[str, Any]:
    """One row from the runs of one (path, N): latencies pooled, peaks maxed."""
    lat = [x for c in cells for r in c["readers"] for x in r["lat"]]
    readers = [r for c in cells for r in c["readers"]]
    hits = sum(r["hits"] for r in readers)
    # A reader that never reported failed all its lookups; one never forked is the limit's.
    expected = sum(c["forked"] for c in cells) * lookups
    errors: collections.Counter[str] = collections.Counter()
    for r in readers:
        errors.update(r["errors"])
        if r["open_error"]:
            errors[f"open: {r['open_error']}"] += 1
    mem = [r["private_mb"] for r in readers if r.get("private_mb") is not None]
    rates = [sum(r["hits"] for r in c["readers"]) / c["secs"] for c in cells if c["secs"]]
    return {
        "path": cells[0]["path"], "n": cells[0]["n"], "runs": len(cells),
        "readers_reported": len(readers), "hits": hits, "failures": expected - hits,
        "lookups_per_s": statistics.median(rates) if rates else None,
        "p50_ms": float(np.percentile(lat, 50)) * 1e3 if lat else None,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3 if lat else None,
        "peak_db_conns": max(c["peak_db_conns"] for c in cells),
        "requests_per_hit": sum(r.get("requests", 0) for r in readers) / hits if hits else None,
        "open_requests_per_reader": statistics.median(r.get("open_requests", 0) for r in readers)
        if readers else None,
        "private_mb_median": statistics.median(mem) if mem else None,
        "private_mb_max": max(mem) if mem else None,
        "limit": next((c["limit"] for c in cells if c["limit"]), None),
        "killed": sum(c["killed"] for c in cells),
        "errors": dict(errors.most_common(5)),
        "warnings": dict(sum((collections.Counter(r["warnings"]) for r in readers),
                             collections.Counter()).most_common(5)),
    }  # fmt: skip


def fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "-" if x is None else format(x, spec) + unit


def report_lines(rows: list[dict[str, Any]], flat: float) -> tuple[list[str], list[dict]]:
    """The table, ratios vs each path's smallest N, and the issue's targets."""
    first: dict[str, dict[str, Any]] = {}
    body = []
    for r in rows:
        base = first.setdefault(r["path"], r)
        r["ratios_vs_first_n"] = {
            "lookups_per_s": _results.ratio(r["lookups_per_s"], base["lookups_per_s"]),
            "p99_ms": _results.ratio(r["p99_ms"], base["p99_ms"]),
        }
        rr = r["ratios_vs_first_n"]
        body.append([
            PATHS[r["path"]], str(r["n"]), str(r["readers_reported"]),
            fmt(r["lookups_per_s"], ".0f"), fmt(r["p50_ms"], ".1f"), fmt(r["p99_ms"], ".1f"),
            str(r["peak_db_conns"]), fmt(r["requests_per_hit"], ".2f"),
            fmt(r["open_requests_per_reader"], ".0f"), str(r["failures"]),
            fmt(r["private_mb_median"], ".0f"),
            fmt(rr["lookups_per_s"], ".2f", "x"), fmt(rr["p99_ms"], ".2f", "x"),
        ])  # fmt: skip
    head = ["path", "N", "ran", "lookups/s", "p50 ms", "p99 ms", "peak db conns",
            "S3 req/hit", "open req", "failures", "MB/reader", "rate/N0", "p99/N0"]  # fmt: skip
    lines = _results.grid(head, body)
    targets: list[dict[str, Any]] = []

    def check(what: str, ok: bool | None, got: str) -> None:
        verdict = "n/a" if ok is None else ("PASS" if ok else "MISS")
        targets.append({"target": what, "got": got, "verdict": verdict})

    for path, want_req in (("new", 2.0), ("tier", 0.0)):
        mine = [r for r in rows if r["path"] == path]
        if not mine:
            continue
        name = PATHS[path]
        peaks = [r["peak_db_conns"] for r in mine]
        check(f"{name}: 0 database connections at every N", max(peaks) == 0, str(peaks))
        fails = [r["failures"] for r in mine]
        check(f"{name}: 0 failures at every N", max(fails) == 0, str(fails))
        req = [r["requests_per_hit"] for r in mine]
        ok = None if None in req else all(abs(x - want_req) < 1e-9 for x in req)  # type: ignore[operator]
        check(f"{name}: {want_req:g} S3 requests per hit", ok, str([fmt(x, ".2f") for x in req]))
        p99 = [r["ratios_vs_first_n"]["p99_ms"] for r in mine]
        ok = None if None in p99 or len(mine) < 2 else max(p99) <= flat  # type: ignore[type-var]
        check(f"{name}: p99 flat in N (<= {flat:g}x the smallest N's)", ok,
              str([fmt(x, ".2f") for x in p99]))  # fmt: skip
    lines += [""] + [f"target: {t['target']}: {t['got']} {t['verdict']}" for t in targets]
    return lines, targets


def limit_lines(rows: list[dict[str, Any]], ns: list[int]) -> list[str]:
    hit = [r for r in rows if r["limit"]]
    mem = [r["private_mb_median"] for r in rows if r["private_mb_median"]]
    per = statistics.median(mem) if mem else None
    fit = f"; about {mem_available_mb() / per:.0f} more readers fit in MemAvailable" if per else ""
    if hit:
        r = hit[0]
        return [f"machine limit: {PATHS[r['path']]} N={r['n']}: {r['limit']} "
                f"({r['readers_reported']} readers ran){fit}"]  # fmt: skip
    return [f"machine limit: not reached up to N={max(ns)}"
            f" ({fmt(per, '.0f')} MB private per reader, median){fit}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", default="50,200,500", help="comma-separated reader counts")
    p.add_argument("--lookups", type=int, default=20, help="lookups per reader")
    p.add_argument("--entries", type=int, default=20, help="entries in the store")
    p.add_argument("--payload-kb", type=int, default=100, help="executable size (KB)")
    p.add_argument("--runs", type=int, default=1, help="runs of every (path, N), interleaved")
    p.add_argument("--paths", default="new,tier,db", help=f"subset of {','.join(PATHS)}")
    p.add_argument(
        "--hold-secs",
        type=float,
        default=1.0,
        help="connections sampled this long after the last lookup, readers alive",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each wait (s)")
    p.add_argument(
        "--min-free-mb",
        type=int,
        default=2048,
        help="stop forking below this much available memory (the machine's limit)",
    )
    p.add_argument(
        "--flat",
        type=float,
        default=1.5,
        help="p99 counts as flat in N up to this ratio to the smallest N's",
    )
    p.add_argument("--out", type=Path, default=_results.RESULTS / "reader_scale.json")
    a = p.parse_args(argv)
    ns = [int(s) for s in a.n.split(",") if s.strip()]
    paths = [s.strip() for s in a.paths.split(",") if s.strip()]
    if unknown := [s for s in paths if s not in PATHS]:
        p.error(f"unknown path {unknown[0]!r}: use {', '.join(PATHS)}")

    count_s3_requests()
    fp = compute(platform_name="cpu", platform_version="bench", device_kind="cpu",
                 device_count=1, jax_version="x", jaxlib_version="x")  # fmt: skip
    size = a.payload_kb * 1000
    keys = [hashlib.sha256(payload(size, seed=i)).hexdigest() for i in range(a.entries)]
    work = Path(tempfile.mkdtemp(prefix="artstore-readers-"))
    raw: list[dict[str, Any]] = []
    max_conns: int | None = None
    try:
        with stack() as (endpoint, url):
            bench = Bench(endpoint, url, keys, fp.digest, work / "tier", a.lookups, work)
            print(f"filling the store: {a.entries} entries of {a.payload_kb} KB ...", flush=True)
            filled = in_child(lambda: fill(bench, fp, size), work)
            if filled["manifests"] != a.entries:
                print(f"note: {filled['manifests']} of {a.entries} entries have a manifest")
            if "tier" in paths:
                filled.update(in_child(lambda: prefill_tier(bench), work))
            with Connections() as conns:
                row = conns.conn.execute("SHOW max_connections").fetchone()
                max_conns = int(row[0]) if row else None
                gc.collect()
                gc.freeze()  # the readers' collections leave the shared pages alone
                for run in range(a.runs):
                    for n in ns:
                        for path in paths:
                            cell = run_cell(path, n, bench, conns, a)
                            raw.append(cell)
                            hits = sum(r["hits"] for r in cell["readers"])
                            print(f"run {run + 1}/{a.runs} {PATHS[path]:<26} N={n:<4} "
                                  f"ran {len(cell['readers']):>4}  hits {hits:>6}/"
                                  f"{n * a.lookups:<6} peak db conns {cell['peak_db_conns']:>3}"
                                  + (f"  limit: {cell['limit']}" if cell["limit"] else ""),
                                  flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = [summarize([c for c in raw if (c["path"], c["n"]) == (path, n)], a.lookups)
            for n in ns for path in paths]  # fmt: skip
    lines, targets = report_lines(rows, a.flat)
    lines += [
        "",
        f"{a.entries} entries of {a.payload_kb} KB; {a.lookups} lookups per reader, all "
        f"readers at once after a barrier; {a.runs} run(s); lookups/s = hits / (start to last "
        "reader done), median over runs; p50/p99 over every hit's latency (failures excluded)",
        "peak db conns: max of pg_stat_activity rows for the bench database, sampled every "
        f"~50 ms while readers are alive (held {a.hold_secs:g} s after the last lookup)",
        f"S3 req/hit: requests during lookups / hits, counted {COUNTING}; open req: requests "
        "a reader sent while opening (median)",
        "failures: lookups that raised, missed or returned wrong bytes, plus every lookup of a "
        "reader that could not open; MB/reader: private memory per reader (smaps_rollup)",
        "rate/N0, p99/N0: vs the same path's smallest N",
        *limit_lines(rows, ns),
        f"host: {os.cpu_count()} CPUs shared by the readers, moto and PostgreSQL; the database "
        f"path is bounded by PostgreSQL's max_connections ({max_conns}, shared with its other "
        "clients)",
    ]
    for r in rows:
        if r["errors"]:
            lines.append(f"errors {PATHS[r['path']]} N={r['n']}: {r['errors']}")
    text = "\n".join(lines)
    print("\n" + text)
    report = {
        **_results.run_info(),
        "args": vars(a) | {"out": str(a.out)},
        "store": filled,
        "max_connections": max_conns,
        "s3_request_counting": COUNTING,
        "rows": rows,
        "targets": targets,
        # Per run: its cells, without each reader's record (`rows` summarise them).
        "raw": [{k: v for k, v in c.items() if k != "readers"} for c in raw],
    }
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
