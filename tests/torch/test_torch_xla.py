"""torch-xla's persistent cache served by a team store: fresh processes on the CPU.

A writer (`artstore run`, no code: importing torch_xla turns the adapter on) compiles three
graphs and stores torch-xla's files as entries; a read-only worker on a fresh host
(`artifactstore.torch_xla.enable(read_only=True)`) finds all three in its cache directory
before its first compile, as torch-xla's own counters show: no PersistentCacheMiss. On
the CPU, torch-xla's PJRT client cannot deserialize executables ("Deserializing
serialized executable not supported"), so each file found counts
PersistentCacheDeserializeFailure and compiles again: a miss, not a hit (said once); on
TPU and GPU a file found is a load and a hit. Then, in this process (no torch): a
fill for another fingerprint places nothing, a tampered object is never placed, and gc
evicts these entries by LRU like any other. Skipped where torch_xla does not import; in
CI's torch phase (ARTSTORE_TORCH_CI=1) a skip fails (tests/security/ci_rules.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenStore, artstore, run_program, skip_unless_importable

from artifactstore import config
from artifactstore.formats import codec, torchxla
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.runtime.session import Session
from artifactstore.torch_xla.cachedir import CacheDir
from artifactstore.torch_xla.fill import fill

pytestmark = [pytest.mark.torch, pytest.mark.slow]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CPU = {"PJRT_DEVICE": "CPU"}


@pytest.fixture(scope="module", autouse=True)
def torch_xla_imports() -> None:
    """Skip unless torch_xla imports here (one probe process per module)."""
    skip_unless_importable(["torch_xla"], "pip install 'artifactstore[torch-xla]'", CPU)


def _job(env: dict[str, str], *, run: bool = False, **extra: str) -> dict[str, Any]:
    """tests/programs/torch_xla_job.py in a fresh process (under `artstore run` if `run`)."""
    out = run_program("torch_xla_job.py", {**env, **CPU, **extra}, timeout=600, under_run=run)
    assert "Traceback" not in out["_stderr"], out["_stderr"][-3000:]
    return out


def _entries(env: dict[str, str]) -> list[dict[str, Any]]:
    listed = artstore("ls", "--platform", torchxla.PLATFORM, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    entries: list[dict[str, Any]] = json.loads(listed.stdout)
    return entries


def _gc(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("gc", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _fill(env: dict[str, str], fingerprint: str, where: Path, **overrides: Any) -> set[str]:
    """A torch-free fill in this process, through a fresh tier: the names it placed."""
    settings = config.resolve({"local_tier": str(where), "read_only": True, **overrides}, env)
    session = Session(settings)
    try:
        directory = CacheDir.make(settings, fingerprint)
        counts, placed = fill(session, fingerprint, directory)
        assert set(os.listdir(directory.path)) == set(placed)
        assert counts["placed"] == len(placed)
        return set(placed)
    finally:
        session.close()


def test_team_store_serves_torch_xla_files(
    team_env: dict[str, str],
    tmp_path: Path,
    open_store: OpenStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slow: two torch-xla processes (torch's import alone is seconds), then gc runs."""
    # The writer: no code, `artstore run` turns the store on when torch_xla is imported.
    writer_env = {k: v for k, v in team_env.items() if k != "ARTSTORE_ACTIVATE"}
    a = _job(writer_env, run=True, XDG_CACHE_HOME=str(tmp_path / "host-a"))
    assert a["counters"] == {"PersistentCacheMiss": 3}
    assert len(a["files"]) == 3 and a["stats"].get("torch_xla_placed", 0) == 0
    assert "hits 0, misses 3" in a["_stderr"]  # artstore run's summary counts torch-xla
    entries = _entries(team_env)
    assert {e["module_name"] for e in entries} == {torchxla.module_name(f) for f in a["files"]}
    (fingerprint,) = {e["fingerprint"] for e in entries}
    assert all(e["key"] == torchxla.entry_key(fingerprint, e["module_name"][10:]) for e in entries)
    assert all(e["signer"] == "team-tests" for e in entries)  # signed, as the team store needs

    # `artstore pull --torch-xla` fills a node's tier with this fingerprint's entries.
    pulled = artstore(
        "pull",
        "--torch-xla",
        "--json",
        env={**team_env, "PJRT_DEVICE": "CPU", "XDG_CACHE_HOME": str(tmp_path / "host-c")},
    )
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert (report["fingerprint"], report["fetched"]) == (fingerprint, 3)

    # A read-only worker on a fresh host: every graph is in its cache before it compiles.
    b = _job(
        team_env,
        TORCH_XLA_JOB_ENABLE="1",
        TORCH_XLA_JOB_READ_ONLY="1",
        XDG_CACHE_HOME=str(tmp_path / "host-b"),
    )
    assert b["stats"]["torch_xla_placed"] == 3
    assert set(b["files"]) == set(a["files"])  # placed under torch-xla's own names
    # torch-xla found each file (no miss); its CPU client cannot deserialize, so it compiled.
    assert b["counters"] == {"PersistentCacheDeserializeFailure": 3}
    # Found but not loaded: misses, no hit and no time saved; said in one line.
    assert b["stats"].get("hits", 0) == b["stats"]["loads"] == b["stats"]["compile_ms_saved"] == 0
    assert b["stats"]["misses"] == 3
    assert b["_stderr"].count("cannot deserialize") == 1, b["_stderr"]
    assert b["results"] == a["results"]
    assert _entries(team_env) == entries  # a reader stores nothing
    assert _gc(team_env)["summary"]["accesses_folded"] == 0  # nothing it loaded
    assert all(e["hits"] == 0 for e in _entries(team_env))

    for name, value in team_env.items():  # boto3 in this process: the moto server
        if name.startswith("AWS_") or name == "NO_PROXY":
            monkeypatch.setenv(name, value)
    # Another platform's fingerprint (one more device) is never served.
    store = open_store(team_env)
    first = sorted(entries, key=lambda e: e["key"])
    bad = first[0]
    data = store.parts.blobs.get(bad["digest"])
    meta = codec.read_meta(data or b"")
    assert meta is not None and meta.fingerprint is not None
    ours = Fingerprint.from_dict(meta.fingerprint)
    assert ours.digest == fingerprint and ours.platform == torchxla.PLATFORM
    other = dataclasses.replace(ours, device_count=ours.device_count + 1)
    assert _fill(team_env, other.digest, tmp_path / "other") == set()

    # A tampered object is never placed; the others are.
    assert data is not None
    store.parts.blobs.delete(bad["digest"])
    store.parts.blobs.put(bad["digest"], data[:-64] + bytes(64))
    names = {e["module_name"][len(torchxla.MODULE_PREFIX) :] for e in first}
    placed = _fill(team_env, fingerprint, tmp_path / "tampered")
    assert placed == names - {bad["module_name"][len(torchxla.MODULE_PREFIX) :]}

    # gc evicts them by LRU, like any entry: the two least recently used go first (once
    # the hits above are folded, the access times are set, oldest first).
    _gc(team_env)
    order = [e["key"] for e in first]
    store.parts.index.record_access(
        {k: (0, T0 + timedelta(minutes=i)) for i, k in enumerate(order)}
    )
    keep = next(e for e in entries if e["key"] == order[2])
    out = _gc(team_env, "--max-size", str(keep["size"]), "--grace", "0")
    removed = {r["key"] for r in out["removed"] if r["kind"] == "entry"}
    assert removed == set(order[:2])
    assert [e["key"] for e in _entries(team_env)] == [order[2]]
    kept = _fill(team_env, fingerprint, tmp_path / "after-gc")
    assert kept == {keep["module_name"][len(torchxla.MODULE_PREFIX) :]}


def test_the_example_runs_as_the_page_says(store_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: docs/pytorch.md's torch-xla example, twice, with `--store` on an embedded store:
    the first process compiles its graphs (stored at its exit); the second, on a fresh
    host, has each placed and
    (on the CPU, whose client cannot deserialize) compiles it again, counted as a miss,
    with the same losses."""

    def example(host: str) -> dict[str, Any]:
        env = {**store_env, **CPU, "XDG_CACHE_HOME": str(tmp_path / host)}
        proc = subprocess.run(
            [sys.executable, "-m", "artifactstore.examples.torch_xla_mlp", "--store"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return out

    a = example("host-a")
    graphs = a["cache"]["PersistentCacheMiss"]
    assert graphs and a["store"]["torch_xla_cache_misses"] == graphs  # stored at its exit
    b = example("host-b")
    assert b["store"]["torch_xla_placed"] == graphs
    assert b["cache"] == {"PersistentCacheDeserializeFailure": graphs}
    assert b["store"].get("hits", 0) == 0 and b["store"]["misses"] == graphs
    assert b["losses"] == a["losses"] and len(set(a["losses"])) == len(a["losses"])
