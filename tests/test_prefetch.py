"""Issue 31 item 2: a program's working set is loaded ahead on its next run.

Real JAX in fresh processes (tests/programs/job.py): the second run of a program
deserializes what the first loaded before JAX asks, and uses it only where the request
matches; a forged, damaged or oversized record costs nothing but the prediction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PROGRAMS, clean_env, run_program

from artifactstore.errors import CorruptObject
from artifactstore.formats.workingset import (
    MAX_WORKING_SET_BYTES,
    MAX_WORKING_SET_KEYS,
    Hint,
    WorkingEntry,
    WorkingSet,
    hint_id,
    program_id,
)
from artifactstore.jaxhook import ahead

FP = "ab" * 32


def _records(store: Path) -> list[Path]:
    """The working sets in the store's tier (not the hints beside them)."""
    hints = {hint_id(str(PROGRAMS / p)) for p in ("job.py", "named_job.py")}
    return sorted(p for p in _folder(store).glob("*") if p.name not in hints)


def _folder(store: Path) -> Path:
    return store / "default" / "workingsets"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Prefetch on: the default (`auto`) turns it off on the CPU these tests run on."""
    return clean_env(**{"ARTSTORE_URL": str(tmp_path / "store"), "ARTSTORE_PREFETCH": "1", **extra})


def _warm(env: dict[str, str], **extra: str) -> dict[str, Any]:
    """A second run that waits (bounded) until the working set is loaded ahead."""
    return run_program("job.py", {**env, "JOB_WAIT_PREFETCH": "12", **extra})


def test_second_run_loads_its_working_set_ahead(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = run_program("job.py", env)
    assert first["store"]["stored"] == 12 and "prefetched" not in first["store"]
    assert len(_records(tmp_path / "store")) == 1
    second = _warm(env)
    stats = second["store"]
    assert second["xla_compiles"] == [] and second["results"] == first["results"]
    assert stats["prefetched"] == stats["prefetch_used"] == 12
    # Counted as the tier hits they are, as on the path without the prefetch.
    assert stats["hits"] == stats["tier_hits"] == stats["loads"] == 12
    assert stats["misses"] == 0 and "prefetch_refused" not in stats
    assert second["events"]["/jax/compilation_cache/cache_hits"] == 12
    assert "WARNING" not in second["_stderr"]


def test_fetched_while_jax_initializes(tmp_path: Path) -> None:
    """With the platform of the program's last run on this host (its hint), the working
    set is fetched and verified before JAX has a backend; deserialized once it has."""
    env = _env(tmp_path)
    first = run_program("job.py", env)
    hint = Hint.decode(
        (_folder(tmp_path / "store") / hint_id(str(PROGRAMS / "job.py"))).read_bytes()
    )
    assert hint.platform == "cpu"
    second = _warm(env, JOB_WAIT_EARLY="12")
    assert second["early"] == {"fetched": 12, "had_backend": False}
    stats = second["store"]
    assert stats["prefetch_early"] == stats["prefetched"] == stats["prefetch_used"] == 12
    assert second["xla_compiles"] == [] and second["results"] == first["results"]


def test_a_wrong_hint_costs_only_the_prediction(tmp_path: Path) -> None:
    """A hint naming another platform (the last run used another backend): nothing is
    fetched for it, the real fingerprint's set is loaded, and the hint is corrected."""
    env = _env(tmp_path)
    first = run_program("job.py", env)
    path = _folder(tmp_path / "store") / hint_id(str(PROGRAMS / "job.py"))
    real = Hint.decode(path.read_bytes())
    path.write_bytes(Hint(FP, "tpu").encode())
    second = _warm(env)
    stats = second["store"]
    assert "prefetch_early" not in stats
    assert stats["prefetched"] == stats["prefetch_used"] == 12
    assert second["xla_compiles"] == [] and second["results"] == first["results"]
    assert Hint.decode(path.read_bytes()) == real


def test_named_executables_are_loaded_ahead(tmp_path: Path) -> None:
    """A program that loaded a named executable finds it deserialized on its next run,
    counted as the tier hit it is; the call gives what the built one gave."""
    env = _env(tmp_path)
    built = run_program("named_job.py", {**env, "NAMED_MODE": "compiled"})
    (record,) = _records(tmp_path / "store")
    found = WorkingSet.decode(record.read_bytes(), record.name)
    assert [e.kind for e in found.entries].count("named") == 1
    loaded = run_program(
        "named_job.py", {**env, "NAMED_MODE": "compiled", "NAMED_WAIT_PREFETCH": "1"}
    )
    stats = loaded["stats"]
    assert loaded["source"] == "store" and loaded["digest"] == built["digest"]
    assert loaded["calls"] == 0 and stats["compiles"] == 0
    assert stats["prefetched"] >= 1 and stats["prefetch_used"] >= 1
    assert stats["tier_hits"] == stats["loads"] >= 1 and "prefetch_refused" not in stats


@pytest.mark.parametrize("setting", ["0", "auto"])
def test_prefetch_off_records_and_loads_nothing(tmp_path: Path, setting: str) -> None:
    """`0`, and `auto` on the CPU (where loading ahead would take the cores the program
    traces on), record no working set and load nothing ahead."""
    env = _env(tmp_path, ARTSTORE_PREFETCH=setting)
    first = run_program("job.py", env)
    assert _records(tmp_path / "store") == []
    second = run_program("job.py", env)
    assert "prefetched" not in second["store"] and second["xla_compiles"] == []
    assert second["results"] == first["results"]


def test_entries_with_other_options_are_not_used(tmp_path: Path) -> None:
    """A forged working set: the right keys with other compile options. Loaded ahead
    (or not), never used: every request loads as without a working set."""
    env = _env(tmp_path)
    first = run_program("job.py", env)
    (record,) = _records(tmp_path / "store")
    found = WorkingSet.decode(record.read_bytes(), record.name)
    other = _default_options()
    assert all(e.options != other for e in found.entries)
    forged = [WorkingEntry(e.key, other, e.devices, e.callbacks) for e in found.entries]
    record.write_bytes(WorkingSet(found.program, found.fingerprint, tuple(forged)).encode())
    second = _warm(env)
    stats = second["store"]
    assert second["xla_compiles"] == [] and second["results"] == first["results"]
    assert "prefetch_used" not in stats
    assert stats.get("prefetch_refused", 0) == stats.get("prefetched", 0)
    assert stats["tier_hits"] == 12


def _default_options() -> bytes:
    out = run_program_inline(
        "from jax._src.lib import xla_client as xc; import sys; "
        "sys.stdout.buffer.write(xc.CompileOptions().SerializeAsString().hex().encode())"
    )
    return bytes.fromhex(out)


def run_program_inline(code: str) -> str:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                          check=True, timeout=120)  # fmt: skip
    return proc.stdout.decode()


@pytest.mark.parametrize("damage", ["garbage", "oversized", "other_program", "deep"])
def test_a_damaged_working_set_is_ignored_quietly(tmp_path: Path, damage: str) -> None:
    env = _env(tmp_path)
    first = run_program("job.py", env)
    (record,) = _records(tmp_path / "store")
    found = WorkingSet.decode(record.read_bytes(), record.name)
    record.write_bytes(
        {
            "garbage": b"\xff{not json",
            "oversized": b" " * (MAX_WORKING_SET_BYTES + 10),
            "other_program": WorkingSet("0" * 40, found.fingerprint, found.entries).encode(),
            "deep": b"[" * 5000 + b"]" * 5000,
        }[damage]
    )
    second = run_program("job.py", env)
    assert second["xla_compiles"] == [] and second["results"] == first["results"]
    assert "prefetched" not in second["store"]
    assert "artifactstore" not in second["_stderr"]  # no warning, no error line


def test_memory_bound(tmp_path: Path) -> None:
    env = _env(tmp_path)
    run_program("job.py", env)
    second = run_program("job.py", {**env, "ARTSTORE_PREFETCH_MAX_SIZE": "1"})
    stats = second["store"]
    assert "prefetched" not in stats and stats["prefetch_over_bound"] >= 1
    assert second["xla_compiles"] == [] and stats["tier_hits"] == 12


def test_prefetch_never_initializes_the_backend(tmp_path: Path) -> None:
    """The program configures the store, then chooses its platform: still its choice."""
    env = _env(tmp_path)
    run_program("job.py", env)
    out = run_program("job.py", {**env, "JOB_LATE_PLATFORM": "1"})
    assert out["backends_before_platform"] is False
    assert out["xla_compiles"] == [] and out["store"]["tier_hits"] == 12


def test_a_new_host_predicts_from_the_team_store(team_env: dict[str, str], tmp_path: Path) -> None:
    """A host with an empty tier reads the writers' working set from the bucket, and its
    loads ahead are counted as the store hits they are."""
    team_env = {**team_env, "ARTSTORE_PREFETCH": "1"}
    first = run_program("job.py", team_env)
    fresh = {**team_env, "XDG_CACHE_HOME": str(tmp_path / "other-host")}
    second = _warm(fresh)
    stats = second["store"]
    assert second["xla_compiles"] == [] and second["results"] == first["results"]
    assert stats["prefetched"] == stats["prefetch_used"] == 12
    assert stats["hits"] == 12 and "tier_hits" not in stats


# -- the record itself ------------------------------------------------------------------
def test_record_round_trip_and_bounds() -> None:
    name = program_id("/srv/train.py", FP)
    entries = tuple(
        WorkingEntry(f"key{i:08d}", b"\x01" * 100, (0, 1), i % 2)
        for i in range(MAX_WORKING_SET_KEYS + 10)
    )
    data = WorkingSet(name, FP, entries).encode()
    back = WorkingSet.decode(data, name)
    assert back.entries == entries[:MAX_WORKING_SET_KEYS]
    big = tuple(WorkingEntry(f"key{i:08d}", b"\x02" * 60000, (0,)) for i in range(40))
    data = WorkingSet(name, FP, big).encode()
    assert len(data) <= MAX_WORKING_SET_BYTES
    assert WorkingSet.decode(data, name).entries == big[: len(WorkingSet.decode(data, name).keys)]
    with pytest.raises(CorruptObject):
        WorkingSet.decode(data, program_id("/srv/other.py", FP))


@pytest.mark.parametrize(
    "entry",
    [
        ["key00000001", "!!", [0], 0],
        ["../../etc", "", [0], 0],
        ["key00000001", "", [-1], 0],
        ["key00000001", "", [True], 0],
        ["key00000001", "", [0], -1],
        ["key00000001", "", [0]],
        {"k": 1},
    ],
)
def test_record_refuses_bad_entries(entry: Any) -> None:
    name = program_id("p", FP)
    data = json.dumps({"v": 1, "p": name, "f": FP, "e": [entry]}).encode()
    with pytest.raises(CorruptObject):
        WorkingSet.decode(data, name)


def test_record_versions() -> None:
    """A set of jitted entries only is written as version 1, which clients from before
    named entries read; one with a named entry as version 2, which they refuse whole."""
    name = program_id("p", FP)
    jit = WorkingEntry("key00000001", b"\x01", (0,))
    named = WorkingEntry("key00000002", b"", (0, 1), 0, "named")
    assert json.loads(WorkingSet(name, FP, (jit,)).encode())["v"] == 1
    data = WorkingSet(name, FP, (jit, named)).encode()
    assert json.loads(data)["v"] == 2
    assert WorkingSet.decode(data, name).entries == (jit, named)
    row = ["key00000001", "", [0], 0]
    for version, bad_row in [(2, [*row, "exec"]), (2, row), (1, [*row, "jit"]), (3, [*row, "jit"])]:
        bad = json.dumps({"v": version, "p": name, "f": FP, "e": [bad_row]}).encode()
        with pytest.raises(CorruptObject):
            WorkingSet.decode(bad, name)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"v": 1, "f": "ab", "pl": "cpu"}',
        b'{"v": 1, "f": "' + b"ab" * 32 + b'", "pl": "../x"}',
    ],
)
def test_hint_refuses_bad_records(data: bytes) -> None:
    with pytest.raises(CorruptObject):
        Hint.decode(data)
    assert Hint.decode(Hint(FP, "tpu").encode()) == Hint(FP, "tpu")


def test_entries_with_callbacks_are_never_loaded_ahead() -> None:
    entries = [WorkingEntry("key00000001", b"", (0,), 0), WorkingEntry("key00000002", b"", (0,), 1)]
    assert [e.key for e in ahead.loadable(entries)] == ["key00000001"]


def test_load_many_loads_named_executables_in_parallel(tmp_path: Path) -> None:
    env = _env(tmp_path)
    built = run_program("named_job.py", {**env, "NAMED_MODE": "compiled"})
    assert built["_returncode"] == 0
    code = (
        "import json, artifactstore\n"
        "a, b = artifactstore.load_many([('mlp', '1'), ('mlp', '1')])\n"
        "try:\n"
        "    artifactstore.load_many([('mlp', '1'), ('nope', '1')])\n"
        "    missing = None\n"
        "except artifactstore.NamedNotFound as exc:\n"
        "    missing = str(exc)\n"
        "print(json.dumps({'types': [type(a).__name__, type(b).__name__], 'missing': missing,"
        " 'stats': artifactstore.process_stats()}))\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=300)  # fmt: skip
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["types"] == ["NamedExecutable", "NamedExecutable"]
    assert out["missing"] and "nope" in out["missing"]
    assert out["stats"]["compiles"] == 0
