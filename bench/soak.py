"""Soak: writers, readers and gc running together against moto S3 + PostgreSQL, under faults.

Starts a moto S3 server and a fresh PostgreSQL database (`artstore_bench_soak`, dropped at
the end), each behind an `infra/faultproxy.py` proxy, and for `--minutes` runs:

  * writers: `bench/soak_job.py` processes (one per slot, restarted every `--worker-secs`,
    so process start and the exit flush happen under faults too), each with its own local
    tier (a "host"), making jitted calls over 30 shape classes and drifting variants;
  * readers: the same with ARTSTORE_READ_ONLY=1;
  * gc: `artstore gc --max-size SIZE --grace GRACE --json` every `--gc-every` seconds;
  * faults at random moments (seeded): S3 down (connection refused, like a stopped server,
    then restarted), S3 frozen, S3 answering 503, PostgreSQL down, PostgreSQL frozen,
    PostgreSQL connections killed (`pg_terminate_backend`), a writer SIGKILLed.

Workers run with ARTSTORE_TIMEOUT=2, ARTSTORE_MIN_COMPILE_SECS=0, ARTSTORE_BREAKER_COOLDOWN=5,
ARTSTORE_FLUSH_TIMEOUT=10 (see --timeout etc.). Faults start after `--warmup` seconds and stop
`--tail` seconds before the end. Then, faults off and workers gone, it reconciles index and
bucket (directly, not through the proxies): `artstore ls --json`, `artstore verify --json
--grace 0s`, `artstore gc --grace 0s --json` (removes orphans, e.g. a killed writer's), and
`artstore verify` again.

Each call is classified by its [start, end] against the fault windows: `faulted` (overlaps
one), `recovering` (starts within timeout + cool-down + 1 s after one ended: breakers may
still be open) or `clean`. A call's extra time = its time minus the clean p50 of calls of
the same shape class (rows x cols) with the same outcome: `tier` (local tier hit), `store`
(loaded from S3), `compile`, or `bypass` (a breaker was open, so JAX compiled on its own path;
compared with compiles). The report also counts, per class, bypassed calls, calls after which
a breaker was still open, and writer compiles kept in the local tier only (not published).
Keys "reported stored" are those for which a writer's `Store.put` returned True (soak_job.py
wraps it to record them).

Targets (0 each): errors (exceptions in the program, worker crashes or hangs), wrong results
(checked against NumPy), discrepancies at the end (index rows without objects, corrupt or
quarantined objects before the final gc; anything verify reports after it) and entries
reported stored and lost (a put that created an entry whose key is neither in the final
index nor explained by a gc eviction that ended after the put). Orphan objects before the
final gc are reported but are not discrepancies (gc cleans them).

    python bench/soak.py --minutes 10 --writers 2 --readers 2 --seed 1 [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _results

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "infra"))
import devstack  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

JOB = Path(__file__).resolve().parent / "soak_job.py"
BUCKET, DATABASE = "artstore-bench-soak", "artstore_bench_soak"
STRIP_PREFIXES = (
    "ARTSTORE_",
    "JAX_COMPILATION_CACHE",
    "JAX_PERSISTENT_CACHE",
    "JAX_ENABLE_COMPILATION_CACHE",
    "AWS_",
)
# kind -> (weight, min secs, max secs); 0-second kinds are instantaneous.
FAULTS: dict[str, tuple[float, float, float]] = {
    "s3_down": (3, 2, 8),
    "s3_freeze": (3, 2, 8),
    "s3_503": (2, 2, 5),
    "db_down": (2, 2, 8),
    "db_freeze": (1, 2, 8),
    "db_kill": (2, 0, 0),
    "writer_kill": (1, 0, 0),
}
PROXY_MODE = {
    "s3_down": "down",
    "s3_freeze": "freeze",
    "s3_503": "http503",
    "db_down": "down",
    "db_freeze": "freeze",
}
CLI_TIMEOUT = 180  # seconds for one artstore command before it counts as hung


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


@dataclass
class Stack:
    """moto + a fresh database, the proxies in front of them, and the two environments."""

    moto: devstack.MotoServer
    s3p: FaultProxy
    pgp: FaultProxy
    direct: dict[str, str]  # straight to moto and PostgreSQL: setup and the reconcile
    faulty: dict[str, str]  # through the proxies: workers and the gc loop


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(STRIP_PREFIXES)}


def start_stack() -> Stack:
    devstack.ensure_postgres()
    moto = devstack.start_moto()
    try:
        devstack.create_bucket(moto.endpoint, BUCKET)
        url = devstack.create_database(DATABASE)
        s3p = FaultProxy((devstack.HOST, moto.port)).start()
        pgp = FaultProxy((devstack.HOST, devstack.PG_PORT)).start()
    except BaseException:
        moto.stop()
        raise
    common = {
        "ARTSTORE_URL": f"s3://{BUCKET}/cache",
        "JAX_PLATFORMS": "cpu",
        **devstack.FAKE_CREDENTIALS,
    }
    direct = {**clean_env(), **common, "ARTSTORE_INDEX": url, "AWS_ENDPOINT_URL_S3": moto.endpoint}
    proxied_url = url.replace(f":{devstack.PG_PORT}/", f":{pgp.port}/")
    faulty = {
        **clean_env(),
        **common,
        "ARTSTORE_INDEX": proxied_url,
        "AWS_ENDPOINT_URL_S3": s3p.endpoint,
    }
    stack = Stack(moto, s3p, pgp, direct, faulty)
    proc = artstore(stack.direct, "db", "upgrade")
    if proc["rc"] != 0:
        stop_stack(stack)
        sys.exit(f"artstore db upgrade failed: {proc['stderr']}")
    return stack


def stop_stack(stack: Stack) -> None:
    for proxy in (stack.s3p, stack.pgp):
        with contextlib.suppress(Exception):
            proxy.stop()
    with contextlib.suppress(Exception):
        devstack.drop_database(DATABASE)
    stack.moto.stop()


def artstore(env: dict[str, str], *args: str, timeout: float = CLI_TIMEOUT) -> dict[str, Any]:
    """Run `python -m artifactstore ARGS`; rc (None: hung and killed), stdout, stderr tail."""
    t0 = time.time()
    rc: int | None
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "artifactstore", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", f"(killed after {timeout:g} s)"
    return {"t0": t0, "t1": time.time(), "rc": rc, "stdout": out, "stderr": err[-1500:]}


def kill_connections() -> int:
    """pg_terminate_backend every artifactstore connection to the soak's database."""
    import psycopg

    with psycopg.connect(
        host=devstack.HOST,
        port=devstack.PG_PORT,
        user="postgres",
        dbname=devstack.PG_ADMIN_DB,
        autocommit=True,
        connect_timeout=5,
    ) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE 'artifactstore-%%' AND datname = %s",
            (DATABASE,),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


# -- the run --------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    stack: Stack
    dir: Path
    t_start: float
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # slot -> process
    killed: set[int] = field(default_factory=set)  # pids SIGKILLed by a writer_kill fault
    processes: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    gc_runs: list[dict[str, Any]] = field(default_factory=list)

    def worker_env(self, slot: str, role: str, gen: int, records: Path) -> dict[str, str]:
        a = self.args
        env = {
            **self.stack.faulty,
            "ARTSTORE_TIMEOUT": str(a.timeout),
            "ARTSTORE_MIN_COMPILE_SECS": "0",
            "ARTSTORE_BREAKER_COOLDOWN": str(a.cooldown),
            "ARTSTORE_FLUSH_TIMEOUT": str(a.flush_timeout),
            "ARTSTORE_LOCAL_TIER": str(self.dir / f"tier-{slot}")
            if a.tier_size != "off"
            else "off",
            "ARTSTORE_LOCAL_TIER_SIZE": a.tier_size if a.tier_size != "off" else "",
            "SOAK_RECORDS": str(records),
            "SOAK_EPOCH": repr(self.t_start),
            "SOAK_SEED": f"{a.seed}-{slot}-{gen}",
            "SOAK_PAUSE": str(a.pause),
            "SOAK_DRIFT_SECS": str(a.drift_secs),
            "SOAK_VARIANTS": str(a.variants),
            "PYTHONPATH": str(ROOT),
        }
        if role == "reader":
            env["ARTSTORE_READ_ONLY"] = "1"
        return env


def slot_loop(run: Run, slot: str, role: str) -> None:
    """Keep one worker process running in `slot` until the deadline, restarting it."""
    a = run.args
    gen = 0
    while not run.stop.is_set() and run.deadline - time.time() > 15:
        records = run.dir / f"{slot}-{gen}.jsonl"
        wdeadline = min(run.deadline, time.time() + a.worker_secs)
        env = run.worker_env(slot, role, gen, records)
        env["SOAK_DEADLINE"] = repr(wdeadline)
        t0 = time.time()
        with open(run.dir / f"{slot}-{gen}.log", "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(JOB)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        with run.lock:
            run.live[slot] = proc
        hung = False
        try:
            proc.wait(timeout=max(0.0, wdeadline - time.time()) + a.flush_timeout + 60)
        except subprocess.TimeoutExpired:
            hung = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGABRT)  # faulthandler prints every thread's stack
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with run.lock:
            run.live.pop(slot, None)
            fault_killed = proc.pid in run.killed
        run.processes.append(
            {
                "slot": slot,
                "role": role,
                "gen": gen,
                "pid": proc.pid,
                "t0": t0,
                "t_exit": time.time(),
                "rc": proc.returncode,
                "hung": hung,
                "killed_by_fault": fault_killed,
                "records": records.name,
            }
        )
        gen += 1


def gc_loop(run: Run) -> None:
    a = run.args
    while not run.stop.wait(a.gc_every):
        if run.deadline - time.time() < 5:
            return
        res = artstore(
            run.stack.faulty | {"ARTSTORE_TIMEOUT": str(a.timeout)},
            "gc",
            "--max-size",
            a.gc_max_size,
            "--grace",
            a.gc_grace,
            "--json",
        )
        entry = {k: res[k] for k in ("t0", "t1", "rc")}
        entry["removed"], entry["summary"] = [], None
        if res["rc"] == 0:
            try:
                doc = json.loads(res["stdout"])
                entry["removed"], entry["summary"] = doc.get("removed", []), doc.get("summary")
            except ValueError:
                entry["rc"] = "bad-json"
        else:
            entry["stderr"] = res["stderr"].strip().splitlines()[-1:] if res["stderr"] else []
            # gc streams its removals (one JSON object per line) as it commits them: a
            # run that fails part-way (a fault) has still removed those.
            entry["removed"] = partial_removals(res["stdout"])
        run.gc_runs.append(entry)


def partial_removals(stdout: str) -> list[dict[str, Any]]:
    """The removal items of a `gc --json` document cut short by a failure."""
    items = []
    for line in stdout.splitlines():
        text = line.strip().rstrip(",")
        if text.startswith("{") and text.endswith("}"):
            with contextlib.suppress(ValueError):
                item = json.loads(text)
                if "kind" in item:
                    items.append(item)
    return items


def schedule(args: argparse.Namespace, kinds: list[str]) -> list[tuple[float, str, float]]:
    """(offset from start, kind, seconds): faults from --warmup to minutes*60 - --tail."""
    rng = random.Random(args.seed)
    end = args.minutes * 60 - args.tail
    out, t = [], float(args.warmup)
    weights = [FAULTS[k][0] for k in kinds]
    while True:
        kind = rng.choices(kinds, weights)[0]
        _, lo, hi = FAULTS[kind]
        secs = rng.uniform(lo, hi) if hi else 0.0
        if t + secs > end:
            return out
        out.append((t, kind, secs))
        t += secs + rng.uniform(args.gap_min, args.gap_max)


def fault_loop(run: Run, plan: list[tuple[float, str, float]]) -> None:
    s3p, pgp = run.stack.s3p, run.stack.pgp
    rng = random.Random(f"{run.args.seed}-victims")
    try:
        for offset, kind, secs in plan:
            if run.stop.wait(max(0.0, run.t_start + offset - time.time())):
                return
            w: dict[str, Any] = {"kind": kind, "t0": time.time()}
            if kind in PROXY_MODE:
                proxy = s3p if kind.startswith("s3") else pgp
                proxy.set_mode(PROXY_MODE[kind])
                run.stop.wait(secs)
                proxy.set_mode("pass")
            elif kind == "db_kill":
                try:
                    w["killed"] = kill_connections()
                except Exception as exc:
                    w["error"] = str(exc)
            elif kind == "writer_kill":
                with run.lock:
                    writers = sorted(s for s in run.live if s.startswith("writer"))
                    victim = run.live[rng.choice(writers)] if writers else None
                    if victim is not None:
                        run.killed.add(victim.pid)
                        victim.send_signal(signal.SIGKILL)
                        w["pid"] = victim.pid
            w["t1"] = time.time()
            run.windows.append(w)
            log(f"fault {kind} {w['t1'] - w['t0']:.1f} s {w.get('killed', w.get('pid', ''))}")
    finally:
        s3p.set_mode("pass")
        pgp.set_mode("pass")


# -- analysis -------------------------------------------------------------------


def read_records(run: Run) -> list[dict[str, Any]]:
    out = []
    for p in sorted(run.dir.glob("*.jsonl")):
        slot = p.name.rsplit("-", 1)[0]
        for line in p.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append({**json.loads(line), "slot": slot, "file": p.name})
    return out


def classify(calls: list[dict[str, Any]], windows: list[dict[str, Any]], recovery: float) -> None:
    spans = [w for w in windows if w["kind"] != "writer_kill"]
    for c in calls:
        hit = [w for w in spans if w["t0"] <= c["t1"] and c["t0"] <= w["t1"]]
        if hit:
            c["class"], c["fault"] = "faulted", hit[0]["kind"]
        elif any(w["t1"] < c["t0"] <= w["t1"] + recovery for w in spans):
            c["class"], c["fault"] = "recovering", None
        else:
            c["class"], c["fault"] = "clean", None


def extra_times(calls: list[dict[str, Any]]) -> None:
    """`extra`: call time - clean p50 of the same shape class and outcome (a bypass is a
    compile on JAX's own path: compared with compiles); that outcome over all shapes when
    the shape has no clean call of it."""
    by_class: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_outcome: dict[str, list[float]] = defaultdict(list)

    def kind(c: dict[str, Any]) -> str:
        return "compile" if c["outcome"] == "bypass" else str(c["outcome"])

    for c in calls:
        if c["class"] == "clean" and c["ok"]:
            by_class[(c["shape"], kind(c))].append(c["secs"])
            by_outcome[kind(c)].append(c["secs"])
    for c in calls:
        base = by_class.get((c["shape"], kind(c))) or by_outcome.get(kind(c))
        c["extra"] = c["secs"] - statistics.median(base) if base else None


def counters(recs: list[dict[str, Any]]) -> dict[str, int]:
    """Store counters over all worker processes: each one's final process_stats(), or the
    sum of its calls' deltas when it was killed before the end."""
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    ended: dict[str, dict[str, int]] = {}
    for r in recs:
        if r["ev"] == "call":
            per_file[r["file"]].update(r["d"])
        elif r["ev"] == "end":
            ended[r["file"]] = r["stats"]
    total: Counter[str] = Counter()
    for f in set(per_file) | set(ended):
        stats = ended.get(f, per_file[f])
        total.update({k: v for k, v in stats.items() if k != "active"})
    return dict(sorted(total.items()))


def lost_entries(
    stored: list[dict[str, Any]], final_keys: set[str], gc_runs: list[dict[str, Any]]
) -> list[str]:
    """Keys a put reported stored, absent from the final index, and not evicted by a
    gc policy (LRU, age, jaxlib) in a run that ended after the last such put."""
    last: dict[str, float] = {}
    for s in stored:
        last[s["key"]] = max(last.get(s["key"], 0.0), s["t"])
    evicted: dict[str, float] = {}
    for g in gc_runs:
        for r in g["removed"]:
            if r.get("kind") == "entry" and r.get("reason") != "missing-object":
                evicted[r["key"]] = max(evicted.get(r["key"], 0.0), g["t1"])
    return sorted(k for k, t in last.items() if k not in final_keys and evicted.get(k, 0.0) < t)


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs, default=None)}


def fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.3f}{unit}"


def analyze(run: Run, recon: dict[str, Any]) -> tuple[dict[str, Any], str]:
    a = run.args
    recs = read_records(run)
    calls = [r for r in recs if r["ev"] == "call"]
    stored = [r for r in recs if r["ev"] == "stored"]
    ends = {r["file"]: r for r in recs if r["ev"] == "end"}
    readies = {r["file"]: r for r in recs if r["ev"] == "ready"}
    for c in calls:
        c["role"] = "reader" if c["slot"].startswith("reader") else "writer"
    recovery = a.timeout + a.cooldown + 1.0
    classify(calls, run.windows, recovery)
    extra_times(calls)

    errors = [c for c in calls if c["error"]]
    wrong = [c for c in calls if not c["ok"] and not c["error"]]
    crashed = [
        p for p in run.processes if p["rc"] != 0 and not p["killed_by_fault"] and not p["hung"]
    ]
    hung = [p for p in run.processes if p["hung"]]
    no_ready = [
        p for p in run.processes if p["records"] not in readies and not p["killed_by_fault"]
    ]
    # Exit: from the end of the call loop (flush included) to the process's end.
    exits = []
    for p in run.processes:
        e = ends.get(p["records"])
        if e is not None:
            exits.append(p["t_exit"] - e["t_loop_end"])
    flush_bound = a.flush_timeout + 5.0
    bound = a.timeout + 1.0  # one bounded wait per call (the breaker opens on the first)

    cls_counts = Counter(c["class"] for c in calls)
    bypass = Counter(c["class"] for c in calls if c["outcome"] == "bypass")
    # After the call a breaker was still open: the store (index included) is skipped.
    breaker_open = Counter(c["class"] for c in calls if not c.get("active", 1))
    kept = Counter({k: 0 for k in cls_counts})
    for c in calls:
        kept[c["class"]] += c["d"].get("kept_in_tier", 0)
    table_rows = []
    per_group: dict[str, Any] = {}
    for name, sel in [
        ("all", calls),
        ("writers", [c for c in calls if c["role"] == "writer"]),
        ("readers", [c for c in calls if c["role"] == "reader"]),
    ]:
        g: dict[str, Any] = {
            "calls": len(sel),
            "outcomes": dict(Counter(c["outcome"] for c in sel)),
        }
        for k in ("clean", "recovering", "faulted"):
            g[k] = summarize([c["secs"] for c in sel if c["class"] == k])
        fx = [c["extra"] for c in sel if c["class"] == "faulted" and c["extra"] is not None]
        g["extra_faulted"] = summarize(fx)
        g["faulted_over_bound"] = sum(1 for x in fx if x > bound)
        per_group[name] = g
        table_rows.append((name, g))
    per_fault = {}
    for kind in FAULTS:
        fx = [c["extra"] for c in calls if c.get("fault") == kind and c["extra"] is not None]
        n_windows = sum(1 for w in run.windows if w["kind"] == kind)
        if n_windows or fx:
            per_fault[kind] = {
                "windows": n_windows,
                **summarize(fx),
                "over_bound": sum(1 for x in fx if x > bound),
                "outcomes": dict(Counter(c["outcome"] for c in calls if c.get("fault") == kind)),
            }

    gc_ok = [g for g in run.gc_runs if g["rc"] == 0]
    gc_fail_clean = [
        g
        for g in run.gc_runs
        if g["rc"] != 0
        and not any(
            w["t0"] <= g["t1"] and g["t0"] <= w["t1"] + recovery
            for w in run.windows
            if w["kind"] != "writer_kill"
        )
    ]
    gc_dangling = sum(
        1 for g in run.gc_runs for r in g["removed"] if r.get("reason") == "missing-object"
    )
    worker_missing = sum(c["d"].get("missing_object", 0) for c in calls)
    worker_corrupt = sum(c["d"].get("corrupt", 0) for c in calls)
    pre, post = recon["verify_before"], recon["verify_after"]
    final_keys = {e["key"] for e in recon["entries"]}
    lost = lost_entries(stored, final_keys, run.gc_runs)
    stored_keys = {s["key"] for s in stored}
    dangling_stored = sorted(set(pre.get("entries_without_object", [])) & stored_keys)
    lost_all = sorted(set(lost) | set(dangling_stored))
    discrepancies = {
        "entries_without_object_before_gc": len(pre.get("entries_without_object", [])),
        "corrupt_before_gc": len(pre.get("corrupt", [])),
        "quarantined": len(pre.get("quarantined", [])),
        "after_final_gc": sum(
            len(post.get(k, []))
            for k in ("corrupt", "entries_without_object", "objects_without_entry")
        ),
        "verify_failed": int("ok" not in pre or "ok" not in post),
    }
    n_disc = sum(discrepancies.values())
    warnings = Counter()
    for p in run.dir.glob("*.log"):
        for line in p.read_text(errors="replace").splitlines():
            if "artifactstore:" in line:
                warnings[line.split("artifactstore:", 1)[1].strip()[:70]] += 1

    report: dict[str, Any] = {
        **_results.run_info(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "operations": len(calls),
        "errors": len(errors) + len(crashed) + len(hung),
        "call_errors": [c["error"] for c in errors][:20],
        "worker_crashes": crashed,
        "worker_hangs": hung,
        "workers_never_ready": len(no_ready),
        "wrong_results": len(wrong),
        "discrepancies": n_disc,
        "discrepancy_detail": discrepancies,
        "orphans_before_final_gc": len(pre.get("objects_without_entry", [])),
        "stored_and_lost": len(lost_all),
        "stored_and_lost_keys": lost_all[:50],
        "entries_stored": len(stored),
        "distinct_keys_stored": len(stored_keys),
        "final_entries": len(final_keys),
        "transient_missing_object": {
            "worker_misses": worker_missing,
            "gc_dropped_dangling": gc_dangling,
        },
        "worker_corrupt_misses": worker_corrupt,
        "calls_by_class": dict(cls_counts),
        "bypassed_by_class": dict(bypass),
        "breaker_open_after_call_by_class": dict(breaker_open),
        "kept_in_tier_only_by_class": dict(kept),
        "store_counters": counters(recs),
        "groups": per_group,
        "per_fault": per_fault,
        "bound_secs": bound,
        "worker_processes": len(run.processes),
        "exit_secs": summarize(exits),
        "exit_over_bound": sum(1 for x in exits if x > flush_bound),
        "gc": {
            "runs": len(run.gc_runs),
            "ok": len(gc_ok),
            "failed_clean": len(gc_fail_clean),
            "hung": sum(1 for g in run.gc_runs if g["rc"] is None),
            "failed_clean_detail": [g.get("stderr") for g in gc_fail_clean][:5],
            "secs": summarize([g["t1"] - g["t0"] for g in run.gc_runs]),
            "entries_evicted": sum(
                1 for g in gc_ok for r in g["removed"] if r.get("kind") == "entry"
            ),
            "objects_removed": sum(
                1 for g in gc_ok for r in g["removed"] if r.get("kind") == "object"
            ),
        },
        "final_gc": recon["final_gc"],
        "gc_runs": [
            {
                "at": g["t0"] - run.t_start,
                "secs": g["t1"] - g["t0"],
                "rc": g["rc"],
                "removed": dict(
                    Counter(f"{r.get('kind')}:{r.get('reason')}" for r in g["removed"])
                ),
                "stderr": g.get("stderr"),
            }
            for g in run.gc_runs
        ],
        "faults": [{**w, "at": w["t0"] - run.t_start} for w in run.windows],
        "fault_counts": dict(Counter(w["kind"] for w in run.windows)),
        "log_lines": sum(warnings.values()),
        "log_top": warnings.most_common(15),
        "verify_before": pre,
        "verify_after": post,
    }

    lines = [
        f"soak: {a.minutes:g} min, {a.writers} writer(s), {a.readers} reader(s), seed "
        f"{a.seed}; ARTSTORE_TIMEOUT={a.timeout:g} s, cool-down {a.cooldown:g} s, "
        f"flush {a.flush_timeout:g} s; gc every {a.gc_every:g} s --max-size "
        f"{a.gc_max_size} --grace {a.gc_grace}",
        "faults: " + ", ".join(f"{k} x{n}" for k, n in report["fault_counts"].items()),
        "",
        f"{'calls':<9}{'n':>6}{'tier/store/comp/byp':>20}{'clean p50':>11}{'clean p99':>11}"
        f"{'faulted n':>10}{'faulted p50':>12}{'extra p50':>11}{'extra p99':>11}"
        f"{'>bound':>8}",
    ]
    for name, g in table_rows:
        o = g["outcomes"]
        mix = "/".join(str(o.get(k, 0)) for k in ("tier", "store", "compile", "bypass"))
        lines.append(
            f"{name:<9}{g['calls']:>6}{mix:>20}{fmt(g['clean']['p50']):>11}"
            f"{fmt(g['clean']['p99']):>11}{g['faulted']['n']:>10}"
            f"{fmt(g['faulted']['p50']):>12}{fmt(g['extra_faulted']['p50']):>11}"
            f"{fmt(g['extra_faulted']['p99']):>11}{g['faulted_over_bound']:>8}"
        )
    lines += [
        "",
        f"{'fault':<12}{'windows':>8}{'calls':>7}{'extra p50':>11}{'extra p99':>11}"
        f"{'max':>9}{'>bound':>8}  outcomes",
    ]
    for kind, f in per_fault.items():
        lines.append(
            f"{kind:<12}{f['windows']:>8}{f['n']:>7}{fmt(f['p50']):>11}"
            f"{fmt(f['p99']):>11}{fmt(f['max']):>9}{f['over_bound']:>8}  "
            f"{f['outcomes']}"
        )

    def verdict(n: int) -> str:
        return "PASS" if n == 0 else "FAIL"

    lines += [
        "",
        f"operations {len(calls)} (clean {cls_counts['clean']}, recovering "
        f"{cls_counts['recovering']}, faulted {cls_counts['faulted']}) in "
        f"{len(run.processes)} worker processes; {len(stored)} entries stored "
        f"({len(stored_keys)} keys), {len(final_keys)} in the index at the end",
        f"errors {report['errors']} (calls {len(errors)}, crashed {len(crashed)}, hung "
        f"{len(hung)}) [target 0: {verdict(report['errors'])}]",
        f"wrong results {len(wrong)} [target 0: {verdict(len(wrong))}]",
        f"discrepancies {n_disc} {discrepancies} [target 0: {verdict(n_disc)}]",
        f"entries reported stored and lost {len(lost_all)} [target 0: {verdict(len(lost_all))}]",
        f"calls that bypassed the store (a breaker open): faulted {bypass['faulted']}, "
        f"recovering {bypass['recovering']}, clean {bypass['clean']}; calls after which a "
        f"breaker was still open: faulted {breaker_open['faulted']}, recovering "
        f"{breaker_open['recovering']}, clean {breaker_open['clean']}; writer compiles kept "
        f"in the tier only (not published): faulted {kept['faulted']}, recovering "
        f"{kept['recovering']}, clean {kept['clean']}",
        f"orphans before the final gc {report['orphans_before_final_gc']} (removed by it: "
        f"{recon['final_gc'].get('objects_removed')}); transient index rows without object: "
        f"{worker_missing} worker misses, {gc_dangling} dropped by gc",
        f"gc: {len(run.gc_runs)} runs, {len(gc_ok)} ok, {len(gc_fail_clean)} failed outside "
        f"faults, {report['gc']['hung']} killed after {CLI_TIMEOUT} s; evicted "
        f"{report['gc']['entries_evicted']} entries, removed "
        f"{report['gc']['objects_removed']} objects; gc time p50 "
        f"{fmt(report['gc']['secs']['p50'])} max {fmt(report['gc']['secs']['max'])}",
        f"worker exit after its loop (flush included): p50 {fmt(report['exit_secs']['p50'])} "
        f"max {fmt(report['exit_secs']['max'])}; over {flush_bound:g} s: "
        f"{report['exit_over_bound']}",
        f"store log lines: {report['log_lines']}",
        "",
        "extra = call time - clean p50 of the same shape class and outcome; bound = "
        f"ARTSTORE_TIMEOUT + 1 s = {bound:g} s; recovering = starts within "
        f"{recovery:g} s after a fault window.",
    ]
    return report, "\n".join(lines)


def reconcile(stack: Stack) -> dict[str, Any]:
    """Faults off, workers gone: the index and the bucket, compared directly."""

    def doc(res: dict[str, Any]) -> dict[str, Any]:
        try:
            out = json.loads(res["stdout"])
        except ValueError:
            out = {"_error": res["stderr"]}
        if isinstance(out, dict):
            out["_rc"] = res["rc"]
        return out

    env = stack.direct
    ls = artstore(env, "ls", "--json")
    entries = json.loads(ls["stdout"]) if ls["rc"] == 0 else []
    before = doc(artstore(env, "verify", "--json", "--grace", "0s"))
    final = artstore(env, "gc", "--grace", "0s", "--json")
    final_doc = doc(final)
    removed = final_doc.get("removed", [])
    after = doc(artstore(env, "verify", "--json", "--grace", "0s"))
    return {
        "entries": entries,
        "ls_rc": ls["rc"],
        "verify_before": before,
        "verify_after": after,
        "final_gc": {
            "rc": final["rc"],
            "summary": final_doc.get("summary"),
            "objects_removed": sum(1 for r in removed if r.get("kind") == "object"),
            "entries_removed": [r for r in removed if r.get("kind") == "entry"],
            "stderr": final["stderr"][-500:] if final["rc"] else "",
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default bench/results/soak-jax<version>.json)",
    )
    p.add_argument("--faults", default=",".join(FAULTS), help="kinds to inject (comma list)")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the first fault")
    p.add_argument("--tail", type=float, default=15.0, help="fault-free seconds at the end")
    p.add_argument("--gap-min", type=float, default=4.0, help="fault-free seconds between faults")
    p.add_argument("--gap-max", type=float, default=15.0)
    p.add_argument("--worker-secs", type=float, default=90.0, help="restart workers this often")
    p.add_argument("--pause", type=float, default=0.1, help="seconds between a worker's calls")
    p.add_argument("--drift-secs", type=float, default=60.0, help="variants drift this often")
    p.add_argument("--variants", type=int, default=3, help="variants live at once (x30 shapes)")
    p.add_argument("--tier-size", default="150K", help="each worker's local tier, or 'off'")
    p.add_argument("--gc-every", type=float, default=20.0)
    p.add_argument("--gc-max-size", default="300K")
    p.add_argument("--gc-grace", default="30s")
    p.add_argument("--timeout", type=float, default=2.0, help="ARTSTORE_TIMEOUT")
    p.add_argument("--cooldown", type=float, default=5.0, help="ARTSTORE_BREAKER_COOLDOWN")
    p.add_argument("--flush-timeout", type=float, default=10.0, help="ARTSTORE_FLUSH_TIMEOUT")
    p.add_argument("--keep", action="store_true", help="keep the run directory (records, logs)")
    a = p.parse_args(argv)
    kinds = [k.strip() for k in a.faults.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        p.error(f"unknown fault kinds {unknown}: use {', '.join(FAULTS)}")
    if a.writers + a.readers < 1:
        p.error("need at least one writer or reader")
    out = a.out or _results.default_out("soak")

    log("starting moto, PostgreSQL database, proxies")
    stack = start_stack()
    run_dir = Path(tempfile.mkdtemp(prefix="artstore-soak-"))
    try:
        t_start = time.time()
        run = Run(a, stack, run_dir, t_start, t_start + a.minutes * 60)
        plan = schedule(a, kinds) if kinds else []
        log(f"{len(plan)} faults planned; run dir {run_dir}")
        threads = [
            threading.Thread(target=slot_loop, args=(run, f"{role}{i}", role), daemon=True)
            for role, n in (("writer", a.writers), ("reader", a.readers))
            for i in range(n)
        ]
        threads += [
            threading.Thread(target=gc_loop, args=(run,), daemon=True),
            threading.Thread(target=fault_loop, args=(run, plan), daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)
        except KeyboardInterrupt:
            log("interrupted: stopping")
            run.stop.set()
            with run.lock:
                for proc in run.live.values():
                    proc.terminate()
            for t in threads:
                t.join(timeout=30)
        stack.s3p.set_mode("pass")
        stack.pgp.set_mode("pass")
        log("run over; reconciling index and bucket")
        recon = reconcile(stack)
        report, text = analyze(run, recon)
        print("\n" + text)
        _results.write(out, report, text)
        failed = (
            report["errors"]
            or report["wrong_results"]
            or report["discrepancies"]
            or report["stored_and_lost"]
        )
        return 1 if failed else 0
    finally:
        stop_stack(stack)
        if a.keep:
            log(f"kept {run_dir}")
        else:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
