"""Cross-process behaviour with real JAX compiles: store in one process, load in the next."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import artstore, run_program, start_program


def _objects(store: Path) -> list[Path]:
    return sorted(p for p in (store / "default" / "objects").rglob("*") if p.is_file())


def test_second_process_loads_everything_and_compiles_nothing(any_env: dict[str, str]) -> None:
    store_env = any_env
    a = run_program("job.py", store_env)
    assert a["xla_compiles"], "process A must compile"
    assert a["store"]["stored"] == len(a["xla_compiles"])
    assert a["store"].get("hits", 0) == 0

    b = run_program("job.py", store_env)
    # No XLA compile at all, by JAX's own compile entry point and by its events.
    assert b["xla_compiles"] == []
    assert b["events"]["/jax/compilation_cache/cache_hits"] == len(a["xla_compiles"])
    assert "/jax/compilation_cache/cache_misses" not in b["events"]
    assert b["store"]["hits"] == len(a["xla_compiles"])
    assert b["store"].get("misses", 0) == 0
    assert b["results"] == a["results"]

    stats = json.loads(artstore("stats", "--json", env=store_env).stdout)
    assert stats["entries"] == len(a["xla_compiles"])
    assert stats["hits"] == len(a["xla_compiles"])


def test_corrupt_object_is_recompiled_quarantined_and_reported(
    store_env: dict[str, str],
) -> None:
    store = Path(store_env["ARTSTORE_URL"])
    a = run_program("job.py", store_env)
    objects = _objects(store)
    assert len(objects) >= 2
    flipped, truncated = objects[0], objects[1]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:100])

    before = artstore("verify", "--json", env=store_env)
    assert before.returncode == 1
    report = json.loads(before.stdout)
    assert sorted(report["corrupt"]) == sorted([flipped.name, truncated.name])

    b = run_program("job.py", store_env)
    assert b["results"] == a["results"]
    assert b["store"]["corrupt"] == 2
    assert len(b["xla_compiles"]) == 2  # exactly the two damaged ones
    assert "corrupt object ignored and quarantined" in b["_stderr"]
    assert b["_stderr"].count("corrupt object ignored") == 1  # said once
    quarantined = {p.name for p in (store / "default" / "quarantine").iterdir()}
    assert quarantined == {flipped.name, truncated.name}

    after = json.loads(artstore("verify", "--json", env=store_env).stdout)
    assert after["ok"] is True
    assert sorted(after["quarantined"]) == sorted(quarantined)

    # B stored fresh copies: a third process hits everything again.
    c = run_program("job.py", store_env)
    assert c["xla_compiles"] == []
    assert c["results"] == a["results"]


def test_other_cpu_features_never_load(any_env: dict[str, str]) -> None:
    store_env = any_env
    foreign = dict(store_env, JOB_FAKE_CPU_FEATURES="avx512f,avx512bw,amx_tile,sse2")
    a = run_program("job.py", foreign)
    assert a["store"]["stored"] >= 2

    b = run_program("job.py", store_env)
    assert b["store"].get("hits", 0) == 0
    assert b["store"]["loads"] == 0  # nothing was handed to deserialize_executable
    assert len(b["xla_compiles"]) == len(a["xla_compiles"])
    assert b["results"] == a["results"]
    rows = json.loads(artstore("ls", "--json", env=store_env).stdout)
    assert len(rows) == 2 * len(a["xla_compiles"])
    assert len({r["fingerprint"] for r in rows}) == 2


@pytest.mark.parametrize("processes", [2, 8])
def test_processes_storing_the_same_keys_at_once(any_env: dict[str, str], processes: int) -> None:
    # 8 interpreters importing JAX, boto3 and psycopg at once on a 2-core runner can
    # take longer than the default bound to open the store; racing writers are the point.
    """Slow: eight JAX processes store the same keys at once."""
    store_env = dict(any_env, ARTSTORE_TIMEOUT="60")
    procs = [start_program("job.py", store_env) for _ in range(processes)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr
        assert "could not store" not in stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(o["results"] == outs[0]["results"] for o in outs)
    rows = json.loads(artstore("ls", "--json", env=store_env).stdout)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys))  # one entry per key
    for out in outs:  # every compile request was either loaded or compiled
        assert out["store"].get("hits", 0) + len(out["xla_compiles"]) == len(keys)
    stored = sum(o["store"].get("stored", 0) for o in outs)
    present = sum(o["store"].get("already_present", 0) for o in outs)
    assert stored == len(keys)
    assert stored + present == sum(len(o["xla_compiles"]) for o in outs)
    assert json.loads(artstore("verify", "--json", env=store_env).stdout)["ok"] is True
