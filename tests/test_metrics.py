"""Prometheus metrics (issue 17): a scrape after a known workload shows the expected counts.

Real JAX programs in fresh processes (tests/programs/metrics_job.py) scraped over HTTP on
their opt-in port, the multiprocess directory added up by `artstore metrics`, the index
gauges of `artstore metrics` on both deployments, and the Grafana dashboard's queries.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import IN_CI, REPO, clean_env, run_program, start_program

from artifactstore import config, metrics
from artifactstore.formats.counters import NAMES
from artifactstore.process.counters import Counters

try:  # the test extra installs it: CI must run these tests, never skip them
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    if IN_CI:
        raise
    pytest.skip("prometheus-client missing: pip install -e '.[test]'", allow_module_level=True)

N = 3  # functions the workload compiles, then loads
NS = {"namespace": "default"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
Cli = Callable[..., subprocess.CompletedProcess[str]]


def parse(text: str) -> Samples:
    """Every sample of an exposition text: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 where the series does not exist (a counter never incremented)."""
    return samples.get((name, frozenset({**NS, **labels}.items())), 0.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def workload(env: dict[str, str], **extra: str) -> dict[str, Any]:
    """Run the workload to the end; its JSON line (process_stats as "store")."""
    out = run_program("metrics_job.py", {**env, "METRICS_N": str(N), **extra})
    assert out["_returncode"] == 0, out["_stderr"]
    return out


def scrape_while_running(env: dict[str, str], port: int, **extra: str) -> tuple[Samples, dict]:
    """Run the workload with its metrics port, scrape it once its JSON line is out (the
    program then waits), let it exit; the samples and its JSON line."""
    env = {**env, "METRICS_N": str(N), "METRICS_WAIT": "1",
           "ARTSTORE_METRICS_PORT": str(port), **extra}  # fmt: skip
    proc = start_program("metrics_job.py", env, stdin=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        _, err = proc.communicate("\n", timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return parse(text), json.loads(line)


def artstore_metrics(cli: Cli, env: dict[str, str], *args: str) -> Samples:
    out = cli(*args, "metrics", env=env) if args[:1] == ("-n",) else cli("metrics", *args, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return parse(out.stdout)


# -- a process's metrics, scraped on its port ----------------------------------------
def test_scrape_after_known_workload_shows_expected_counts(tmp_path: Path, cli: Cli) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    # Cold: N misses, compiled and stored; then, caches cleared, N loads from this host.
    cold, out = scrape_while_running(env, free_port())
    cold_results, stats = out["results"], out["store"]
    assert out["prometheus_imported"]
    assert stats["misses"] == stats["compiles"] == stats["stored"] == stats["tier_hits"] == N
    assert value(cold, "artstore_misses_total") == N
    assert value(cold, "artstore_compiles_total") == N
    assert value(cold, "artstore_compile_seconds_count") == N
    assert value(cold, "artstore_stored_total") == N
    assert value(cold, "artstore_hits_total", tier="local") == N
    assert value(cold, "artstore_hits_total", tier="store") == 0
    assert value(cold, "artstore_load_seconds_count") == N
    assert value(cold, "artstore_load_seconds_bucket", le="+Inf") == N
    assert 0 < value(cold, "artstore_load_seconds_sum") < 60
    assert value(cold, "artstore_bytes_uploaded_total") == stats["bytes_uploaded"] > 0
    assert value(cold, "artstore_bytes_fetched_total") == 0
    assert not [k for k in cold if k[0] == "artstore_errors_total"]

    # Warm, without a local tier: N loads from the store, each object fetched once.
    warm, out = scrape_while_running(
        env, free_port(), METRICS_PHASES="hit", ARTSTORE_LOCAL_TIER="off"
    )
    listed = json.loads(cli("ls", "--json", env=env).stdout)
    assert len(listed) == N
    assert out["store"]["hits"] == N and out["store"]["compiles"] == 0
    assert value(warm, "artstore_hits_total", tier="store") == N
    assert value(warm, "artstore_hits_total", tier="local") == 0
    assert value(warm, "artstore_misses_total") == 0
    assert value(warm, "artstore_compiles_total") == 0
    assert value(warm, "artstore_load_seconds_count") == N
    assert value(warm, "artstore_bytes_fetched_total") == sum(e["size"] for e in listed)
    assert out["results"] == cold_results[:1]  # the loaded executables compute the same


def test_program_runs_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = workload(
            clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_METRICS_PORT=str(port)),
            METRICS_PHASES="compile",
        )
    assert out["store"]["compiles"] == out["store"]["stored"] == N
    lines = [line for line in out["_stderr"].splitlines() if "metrics" in line]
    assert len(lines) == 1, out["_stderr"]
    assert f"metrics not served on 127.0.0.1:{port}" in lines[0]
    assert "ARTSTORE_METRICS_PORT" in lines[0]


def test_without_prometheus_client_one_line_and_the_program_runs(tmp_path: Path, cli: Cli) -> None:
    """The extra not installed (a package on PYTHONPATH that fails to import, as a missing
    one does): a program asking for a port runs as before after one line; `artstore
    metrics` fails with one line naming the install."""
    shadow = tmp_path / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named prometheus_client')\n")
    env = clean_env(
        ARTSTORE_URL=str(tmp_path / "store"),
        PYTHONPATH=f"{shadow.parent}:{REPO}",
    )
    out = workload({**env, "ARTSTORE_METRICS_PORT": str(free_port())}, METRICS_PHASES="compile")
    assert out["store"]["compiles"] == out["store"]["stored"] == N
    lines = [line for line in out["_stderr"].splitlines() if "metrics" in line]
    assert lines == [
        "artifactstore: metrics off: prometheus-client is not installed "
        "(pip install 'artifactstore[metrics]')"
    ], out["_stderr"]
    run = cli("metrics", env=env)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "artstore: error: artstore metrics needs prometheus-client: "
        "pip install 'artifactstore[metrics]'"
    ]


# -- the multiprocess directory ------------------------------------------------------
def test_multiprocess_dir_adds_up_short_processes(tmp_path: Path, cli: Cli) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), PROMETHEUS_MULTIPROC_DIR=str(prom_dir))
    cold = workload(env, METRICS_PHASES="compile")  # no port: only the directory
    warm = workload(env, METRICS_PHASES="hit", ARTSTORE_LOCAL_TIER="off")
    assert cold["prometheus_imported"] and cold["store"]["misses"] == N
    assert warm["store"]["hits"] == N and warm["store"]["compiles"] == 0

    total = artstore_metrics(cli, env, "--multiprocess-dir", str(prom_dir))
    assert value(total, "artstore_misses_total") == N
    assert value(total, "artstore_compiles_total") == N
    assert value(total, "artstore_compile_seconds_count") == N
    assert value(total, "artstore_stored_total") == N
    assert value(total, "artstore_hits_total", tier="store") == N
    assert value(total, "artstore_load_seconds_count") == N
    assert value(total, "artstore_index_entries") == N  # and the index's own gauges

    # A long-running process with a port serves the sum of every process in the directory;
    # one object damaged first: a miss, an error of kind corrupt and a compile, counted.
    objects = sorted(p for p in (tmp_path / "store" / "default" / "objects").rglob("*")
                     if p.is_file())  # fmt: skip
    assert len(objects) == N
    data = bytearray(objects[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    objects[0].write_bytes(bytes(data))
    served, out = scrape_while_running(
        env, free_port(), METRICS_PHASES="hit", ARTSTORE_LOCAL_TIER="off"
    )
    counts = out["store"]
    assert (counts["hits"], counts["corrupt"], counts["compiles"]) == (N - 1, 1, 1), counts
    assert value(served, "artstore_hits_total", tier="store") == 2 * N - 1
    assert value(served, "artstore_misses_total") == N + 1
    assert value(served, "artstore_errors_total", kind="corrupt") == 1
    assert value(served, "artstore_compiles_total") == N + 1
    assert value(served, "artstore_load_seconds_count") == 2 * N - 1


# -- `artstore metrics`: the index's gauges -------------------------------------------
def test_artstore_metrics_after_known_workload(any_env: dict[str, str], cli: Cli) -> None:
    """`artstore metrics` after a known workload: each gauge and counter has its value.

    Slow: 10-20 s on 2 busy cores; a JAX workload process, then about ten CLI processes
    (fold, quota, stats, metrics in three namespaces), each a fresh interpreter.
    """
    out = workload(any_env, METRICS_PHASES="compile")
    assert not out["prometheus_imported"]  # a process that does not opt in never imports it
    assert out["store"]["stored"] == N
    if any_env["ARTSTORE_URL"].startswith("s3://"):  # readers' journals, if any
        assert cli("fold", env=any_env).returncode == 0
    assert cli("quota", "set", "default", "1MB", env=any_env).returncode == 0
    stats = json.loads(cli("stats", "--json", env=any_env).stdout)

    got = artstore_metrics(cli, any_env)
    assert value(got, "artstore_index_entries") == N
    assert value(got, "artstore_index_entry_bytes") == stats["bytes"] > 0
    assert value(got, "artstore_index_objects") == N
    assert value(got, "artstore_index_object_bytes") == stats["object_bytes"]
    assert value(got, "artstore_index_entry_hits") == 0
    assert value(got, "artstore_quota_bytes") == 1_000_000
    assert value(got, "artstore_quota_used_bytes") == stats["bytes"]
    assert value(got, "artstore_quota_use_ratio") == pytest.approx(stats["bytes"] / 1e6)
    assert 0 <= value(got, "artstore_index_oldest_access_age_seconds") < 600
    assert value(got, "artstore_index_events_total", event="misses") == N
    assert {name for name, _ in got} <= metrics.exported_names()

    # Another namespace: listed with zeros; --all-namespaces: each one with anything.
    other = artstore_metrics(cli, any_env, "-n", "other")
    assert other[("artstore_index_entries", frozenset({"namespace": "other"}.items()))] == 0
    assert cli("quota", "set", "team-b", "2GB", env=any_env).returncode == 0
    every = artstore_metrics(cli, any_env, "--all-namespaces")
    spaces = Counter(dict(labels)["namespace"] for name, labels in every
                     if name == "artstore_quota_bytes")  # fmt: skip
    assert spaces == {"default": 1, "team-b": 1}
    assert value(every, "artstore_index_entries") == N


# -- cheap checks ------------------------------------------------------------------------
def test_dashboard_queries_use_only_exported_metrics() -> None:
    board = json.loads((REPO / "infra" / "grafana" / "artifactstore.json").read_text())
    exprs = [e for e in _walk(board, "expr") if isinstance(e, str)]
    assert exprs
    used = set(re.findall(r"\bartstore_[a-z_]+\b", " ".join(exprs)))
    assert used <= metrics.exported_names(), used - metrics.exported_names()
    for wanted in ("artstore_hits_total", "artstore_misses_total", "artstore_errors_total",
                   "artstore_load_seconds_bucket", "artstore_compile_seconds_bucket",
                   "artstore_bytes_fetched_total", "artstore_lease_waits_total",
                   "artstore_lease_takeovers_total", "artstore_index_entries",
                   "artstore_index_entry_bytes", "artstore_quota_use_ratio"):  # fmt: skip
        assert wanted in used, wanted
    variables = board["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)
    uids = {p["datasource"]["uid"] for p in board["panels"] if "datasource" in p}
    assert uids == {"${datasource}"}


def _walk(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == key] + [
            x for v in node.values() for x in _walk(v, key)
        ]
    if isinstance(node, list):
        return [x for v in node for x in _walk(v, key)]
    return []


def test_counters_reach_their_metrics() -> None:
    """Each name the process counts lands on the metric formats.counters names for it,
    through the one counting object as a session wires it; other names are left out."""
    import prometheus_client

    registry = CollectorRegistry()
    rec = metrics.Recorder(metrics._Metrics(prometheus_client, registry), "team-a")
    counters = Counters()
    counters.add("tier_unsigned", 2)  # counted before metrics were wired: not replayed
    counters.observe(rec.counted)
    for name in (
        "store_hits",
        "tier_hits",
        "compiles",
        "compiles",
        "misses",
        "quick_compiles",
        "lookups_missed",
        "lookups_missed",
        "corrupt",
        "put_errors",
        "load_errors",
        "unsigned",
        "bad_manifest",
        "lease_waits",
        "lease_takeovers",
        "already_present",
        "skipped_read_only",
        "breaker_opened_object_store",
        "tier_unsigned",
        "tier_wrong_entry",
    ):
        counters.add(name)
    counters.add("bytes_fetched", 1234)
    counters.add("lookups_missed", -1)  # a miss taken back (see Accounts.served)
    rec.loaded(0.02)
    rec.compiled(1.5)
    rec.compiled(0.01)

    def got(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"namespace": "team-a", **labels})

    assert got("artstore_hits_total", tier="store") == 1
    assert got("artstore_hits_total", tier="local") == 1
    assert got("artstore_misses_total") == 1  # compiles, not lookups (lookups_missed)
    assert got("artstore_quick_compiles_total") == 1
    assert got("artstore_bytes_fetched_total") == 1234
    assert got("artstore_lease_waits_total") == got("artstore_lease_takeovers_total") == 1
    assert got("artstore_compiles_total") == 2
    assert got("artstore_compile_seconds_bucket", le="2.5") == 2
    assert got("artstore_load_seconds_count") == 1
    errors = {
        s.labels["kind"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "artstore_errors_total"
    }
    assert errors == {
        "corrupt": 1, "put": 1, "load": 1, "unsigned": 1, "bad_manifest": 1,
        "breaker_open_object_store": 1, "tier_unsigned": 1, "tier_wrong_entry": 1,
    }  # fmt: skip
    snapshot = counters.snapshot()  # the counts are the process's, the metrics a view
    assert (snapshot["tier_unsigned"], snapshot["hits"], snapshot["lookups_missed"]) == (3, 2, 1)


def test_every_process_metric_is_fed_by_a_declared_counter() -> None:
    """The process's metrics derive from the one table of counter names: each name's
    metric exists with the labels it gives, and each counter metric has a name."""
    fed = {entry.metric for entry in NAMES.values() if entry.metric is not None}
    assert fed == set(metrics.COUNTERS) == {metric for metric, _ in metrics.FEEDS.values()}
    for name, (metric, label) in metrics.FEEDS.items():
        assert len(metrics.COUNTERS[metric]) == (1 if label is None else 2), name
    assert metrics.ERROR_KINDS["load_errors"] == "load"
    assert metrics.ERROR_KINDS["tier_wrong_entry"] == "tier_wrong_entry"


def test_metrics_settings() -> None:
    assert config.resolve({}, environ={}).metrics_port is None
    got = config.resolve({}, environ={"ARTSTORE_METRICS_PORT": "9464"})
    assert (got.metrics_port, got.metrics_addr) == (9464, "127.0.0.1")
    got = config.resolve({"metrics_port": 0, "metrics_addr": "0.0.0.0"}, environ={})
    assert (got.metrics_port, got.metrics_addr) == (None, "0.0.0.0")
    # A bad metrics setting turns off metrics alone (issue 32): the store still opens.
    for bad in ("x", "70000", "-1", "9464.5"):
        got = config.resolve({"metrics_port": bad}, environ={})
        assert got.metrics_port is None and "ARTSTORE_METRICS_PORT" in str(got.metrics_error)
    got = config.resolve({}, environ={"ARTSTORE_METRICS_ADDR": "a b", "ARTSTORE_METRICS_PORT": "1"})
    assert got.metrics_port is None and "ARTSTORE_METRICS_ADDR" in str(got.metrics_error)


def test_a_typo_in_the_metrics_port_turns_off_metrics_not_the_store(tmp_path: Path) -> None:
    out = workload(
        clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_METRICS_PORT="9464x"),
        METRICS_PHASES="compile",
    )
    assert out["store"]["compiles"] == out["store"]["stored"] == N
    lines = [line for line in out["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "metrics off" in lines[0] and "9464x" in lines[0], lines
