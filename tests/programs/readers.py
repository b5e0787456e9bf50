"""N lightweight reader processes (no JAX), forked from one that imported the library once.

Usage: readers.py N KEYS_FILE. Settings come from the environment (ARTSTORE_*). Each
child opens its own Store as a program's session does (index opened lazily), looks
up every key in KEYS_FILE (lines: key fingerprint-digest), reports one JSON line and
stays alive, as a training job would, until this process's stdin closes; then the
children flush (their hit journals) and exit. The parent prints
{"ready": n, "failures": [...], "hits": total} once every child reported, then waits.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from artifactstore import config
from artifactstore.store import Store

FLUSH_SECS = 120.0


def child(keys: list[tuple[str, str]], out: int, release: int) -> None:
    try:
        store = Store.open(config.resolve({}), lazy_index=True)
        hits = sum(store.get(key, fp) is not None for key, fp in keys)
        report = {"hits": hits, "index_opened": store.parts.backends.index_opened, "error": None}
    except Exception as exc:  # reported, not raised: the parent counts failures
        report = {"hits": 0, "index_opened": None, "error": f"{type(exc).__name__}: {exc}"}
    os.write(out, (json.dumps(report) + "\n").encode())
    os.read(release, 1)  # blocks until the parent closes its end: "stay alive"
    # N journals written at once to one moto process on two cores: the bound is for an
    # outage, not for this; a journal not written in it is an exit code, not a lost hit.
    flushed = report["error"] is not None or store.flush(FLUSH_SECS)
    os._exit(0 if flushed else 3)


def main() -> None:
    n, keys_file = int(sys.argv[1]), sys.argv[2]
    with open(keys_file) as handle:
        keys = [(k, fp) for k, fp in (line.split() for line in handle if line.strip())]
    reports_r, reports_w = os.pipe()
    release_r, release_w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(reports_r)
            os.close(release_w)
            child(keys, reports_w, release_r)
        pids.append(pid)
    os.close(reports_w)
    os.close(release_r)
    reports = []
    with os.fdopen(reports_r) as lines:
        for line in lines:
            reports.append(json.loads(line))
            if len(reports) == n:
                break
    failures = [r["error"] or f"{r['hits']} hits" for r in reports
                if r["error"] or r["hits"] != len(keys)]  # fmt: skip
    summary = {
        "ready": len(reports),
        "failures": failures,
        "hits": sum(r["hits"] for r in reports),
        "index_opened": sum(bool(r["index_opened"]) for r in reports),
    }
    print(json.dumps(summary), flush=True)
    sys.stdin.readline()  # the test has looked at the server: let the children go
    os.close(release_w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    summary = {"exited": codes.count(0), "codes": sorted(set(codes))}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
